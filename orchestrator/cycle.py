"""The draft-verify cycle loop: a plain async class with injected clients, store and policy,
testable without Ray. One `Session` runs cycles until EOS or max_tokens; each cycle's tokens
are committed to Redis before they are yielded."""

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from orchestrator.clients import DraftClient, Reply, VerifierClient
from orchestrator.policy import CycleCosts, GammaPolicy
from orchestrator.store import SessionStore
from tandem.codec import CycleStats, Stats
from tandem.rng import Purpose, uniforms
from tandem.sampling import SamplingParams, count_accepted, output_tokens


@dataclass
class Session:
    """A session's live state, mirrored to Redis after every cycle."""

    session_id: str
    params: SamplingParams
    tokens: list[int]  # committed sequence, prompt first
    prompt_len: int
    max_tokens: int
    policy: GammaPolicy
    fixed_gamma: int | None = None  # None: adaptive
    cycle: int = 0
    draft_cache_len: int = 0  # committed tokens each worker is believed to hold
    target_cache_len: int = 0
    finish_reason: str = ""
    started: float = 0.0  # perf_counter() when the generation began
    stats: Stats = field(default_factory=Stats)

    @property
    def generated(self) -> int:
        return len(self.tokens) - self.prompt_len


@dataclass
class CycleOutput:
    tokens: list[int]
    finished: bool


class SpeculativeLoop:
    def __init__(
        self, draft: DraftClient, target: VerifierClient, store: SessionStore,
        eos_token_ids: tuple[int, ...],
    ) -> None:
        self.draft = draft
        self.target = target
        self.store = store
        self.eos = set(eos_token_ids)

    async def run(self, s: Session) -> AsyncIterator[CycleOutput]:
        s.started = time.perf_counter()
        while not s.finish_reason:
            out = await self.cycle(s)
            if s.stats.ttft_s == 0.0:
                s.stats.ttft_s = time.perf_counter() - s.started
            s.stats.elapsed_s = time.perf_counter() - s.started
            yield out

    async def cycle(self, s: Session) -> CycleOutput:
        began = time.perf_counter()
        remaining = s.max_tokens - s.generated
        # 1. Choose γ: never draft past what the request still wants.
        wanted = s.fixed_gamma if s.fixed_gamma is not None else s.policy.choose()
        gamma = max(0, min(wanted, remaining - 1))
        # 2. Draft γ tokens, sending the draft worker the committed tokens it has not seen.
        draft = await self._propose(s, gamma) if gamma else None
        proposal = draft.answer if draft else None
        # 3. Verify the block in one target pass.
        verify = await self._verify(s, proposal)
        verdict = verify.answer
        # 4. Accept/reject with counter-based uniforms keyed by absolute position.
        position = len(s.tokens)
        accepted = 0
        drafted = proposal.draft_tokens if proposal else []
        if proposal:
            u = uniforms(s.params.seed, position, gamma, Purpose.ACCEPT)
            accepted = count_accepted(proposal.draft_token_probs, verdict.target_token_probs, u)
        new = output_tokens(drafted, accepted, verdict.recovered_tokens, verdict.bonus_token)
        new = self._truncate(s, new, remaining)
        s.draft_cache_len = position + min(accepted, gamma - 1) if gamma else s.draft_cache_len
        s.target_cache_len = position + accepted
        s.tokens.extend(new)
        s.cycle += 1
        # 5. Commit to Redis before the client sees the tokens.
        redis_start = time.perf_counter()
        await self.store.commit(
            s.session_id, new, s.cycle, s.policy.to_dict(),
            {"draft": s.draft_cache_len, "target": s.target_cache_len}, s.finish_reason or "running",
        )
        redis_ms = (time.perf_counter() - redis_start) * 1e3
        # 6. Account the cycle and teach the policy what it measured.
        record = _measure(s, began, gamma, accepted, len(new), draft, verify, redis_ms)
        s.policy.observe(_costs(record, draft, verify))
        _count(s.stats, record)
        return CycleOutput(new, bool(s.finish_reason))

    async def _propose(self, s: Session, gamma: int) -> Reply:
        reply = await self.draft.propose(
            s.session_id, s.draft_cache_len, s.tokens[s.draft_cache_len :], gamma, s.params
        )
        if reply.answer is None:  # the worker lost the session: re-prefill the whole sequence
            s.draft_cache_len = 0
            reply = _then(reply, await self.draft.propose(s.session_id, 0, s.tokens, gamma, s.params))
        return reply

    async def _verify(self, s: Session, proposal) -> Reply:
        reply = await self.target.verify(
            s.session_id, s.target_cache_len, s.tokens[s.target_cache_len :], proposal, s.params
        )
        if reply.answer is None:
            s.target_cache_len = 0
            reply = _then(reply, await self.target.verify(s.session_id, 0, s.tokens, proposal, s.params))
        return reply

    def _truncate(self, s: Session, new: list[int], remaining: int) -> list[int]:
        for i, token in enumerate(new):
            if token in self.eos:
                s.finish_reason = "stop"
                return new[: i + 1]
        if len(new) >= remaining:
            s.finish_reason = "length"
        return new[:remaining]


def _then(miss: Reply, retry: Reply) -> Reply:
    """A cache miss and its re-prefill, counted as one call."""
    return Reply(retry.answer, miss.wall_ms + retry.wall_ms, miss.wire_bytes + retry.wire_bytes)


def _measure(s: Session, began: float, gamma: int, accepted: int, output: int, draft: Reply | None,
             verify: Reply, redis_ms: float) -> CycleStats:
    now = time.perf_counter()
    draft_compute = draft.answer.compute_ms if draft else 0.0
    draft_wall = draft.wall_ms if draft else 0.0
    verify_compute = verify.answer.compute_ms
    total = (now - began) * 1e3
    return CycleStats(
        gamma=gamma, accepted=accepted, output_tokens=output, start_ms=(began - s.started) * 1e3,
        draft_ms=draft_compute, verify_ms=verify_compute,
        transport_ms=max(0.0, draft_wall - draft_compute) + max(0.0, verify.wall_ms - verify_compute),
        redis_ms=redis_ms,
        orchestration_ms=max(0.0, total - draft_wall - verify.wall_ms - redis_ms),
        wire_bytes=(draft.wire_bytes if draft else 0) + verify.wire_bytes,
    )


def _costs(c: CycleStats, draft: Reply | None, verify: Reply) -> CycleCosts:
    """What the γ policy learns from a cycle: transports per worker, overhead together."""
    return CycleCosts(
        gamma=c.gamma, accepted=c.accepted,
        draft_compute_ms=c.draft_ms,
        draft_transport_ms=max(0.0, draft.wall_ms - c.draft_ms) if draft else 0.0,
        verify_compute_ms=c.verify_ms,
        verify_transport_ms=max(0.0, verify.wall_ms - c.verify_ms),
        overhead_ms=c.redis_ms + c.orchestration_ms,
    )


def _count(stats: Stats, c: CycleStats) -> None:
    stats.cycles += 1
    stats.drafted_tokens += c.gamma
    stats.accepted_tokens += c.accepted
    stats.verified_tokens += min(c.accepted + 1, c.gamma)
    stats.draft_ms += c.draft_ms
    stats.verify_ms += c.verify_ms
    stats.transport_ms += c.transport_ms
    stats.redis_ms += c.redis_ms
    stats.orchestration_ms += c.orchestration_ms
    stats.per_cycle.append(c)

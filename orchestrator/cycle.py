"""The draft-verify cycle loop: a plain async class with injected clients, store and policy,
testable without Ray. One `Session` runs cycles until EOS or max_tokens; each cycle's tokens
are committed to Redis before they are yielded."""

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from orchestrator.clients import DraftClient, VerifierClient
from orchestrator.policy import CycleCosts, GammaPolicy
from orchestrator.store import SessionStore
from tandem.codec import Stats
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
        start = time.perf_counter()
        while not s.finish_reason:
            out = await self.cycle(s)
            if s.stats.ttft_s == 0.0:
                s.stats.ttft_s = time.perf_counter() - start
            s.stats.elapsed_s = time.perf_counter() - start
            yield out

    async def cycle(self, s: Session) -> CycleOutput:
        began = time.perf_counter()
        remaining = s.max_tokens - s.generated
        # 1. Choose γ: never draft past what the request still wants.
        wanted = s.fixed_gamma if s.fixed_gamma is not None else s.policy.choose()
        gamma = max(0, min(wanted, remaining - 1))
        # 2. Draft γ tokens, sending the draft worker the committed tokens it has not seen.
        proposal, draft_wall = None, 0.0
        if gamma:
            proposal, draft_wall = await self._propose(s, gamma)
        # 3. Verify the block in one target pass.
        verdict, verify_wall = await self._verify(s, proposal)
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
        costs = self._costs(proposal, verdict, gamma, accepted, draft_wall, verify_wall, redis_ms, began)
        s.policy.observe(costs)
        self._count(s.stats, costs, gamma, accepted, redis_ms)
        return CycleOutput(new, bool(s.finish_reason))

    async def _propose(self, s: Session, gamma: int):
        proposal, wall = await self.draft.propose(
            s.session_id, s.draft_cache_len, s.tokens[s.draft_cache_len :], gamma, s.params
        )
        if proposal is None:  # the worker lost the session: re-prefill the whole sequence
            s.draft_cache_len = 0
            proposal, wall = await self.draft.propose(s.session_id, 0, s.tokens, gamma, s.params)
        return proposal, wall

    async def _verify(self, s: Session, proposal):
        verdict, wall = await self.target.verify(
            s.session_id, s.target_cache_len, s.tokens[s.target_cache_len :], proposal, s.params
        )
        if verdict is None:
            s.target_cache_len = 0
            verdict, wall = await self.target.verify(s.session_id, 0, s.tokens, proposal, s.params)
        return verdict, wall

    def _truncate(self, s: Session, new: list[int], remaining: int) -> list[int]:
        for i, token in enumerate(new):
            if token in self.eos:
                s.finish_reason = "stop"
                return new[: i + 1]
        if len(new) >= remaining:
            s.finish_reason = "length"
        return new[:remaining]

    @staticmethod
    def _costs(proposal, verdict, gamma, accepted, draft_wall, verify_wall, redis_ms, began):
        draft_compute = proposal.compute_ms if proposal else 0.0
        total = (time.perf_counter() - began) * 1e3
        return CycleCosts(
            gamma=gamma, accepted=accepted,
            draft_compute_ms=draft_compute,
            draft_transport_ms=max(0.0, draft_wall - draft_compute),
            verify_compute_ms=verdict.compute_ms,
            verify_transport_ms=max(0.0, verify_wall - verdict.compute_ms),
            overhead_ms=max(0.0, total - draft_wall - verify_wall),
        )

    @staticmethod
    def _count(stats: Stats, c: CycleCosts, gamma: int, accepted: int, redis_ms: float) -> None:
        stats.cycles += 1
        stats.gammas.append(gamma)
        stats.drafted_tokens += gamma
        stats.accepted_tokens += accepted
        stats.verified_tokens += min(accepted + 1, gamma)
        stats.draft_ms += c.draft_compute_ms
        stats.verify_ms += c.verify_compute_ms
        stats.transport_ms += c.draft_transport_ms + c.verify_transport_ms
        stats.redis_ms += redis_ms
        stats.orchestration_ms += c.overhead_ms - redis_ms

"""The draft-verify cycle loop: a plain async class with injected clients, store and policy,
testable without Ray. One `Session` runs cycles until EOS or max_tokens; each cycle's tokens
are committed to Redis before they are yielded. The next cycle's first worker call needs only
the committed sequence, so it is sent before the commit and the two overlap: Redis is off the
per-cycle critical path (worker caches are soft state, so a commit that fails after the call
costs nothing but the call)."""

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import NamedTuple

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind

from orchestrator.clients import DraftClient, Reply, VerifierClient
from orchestrator.policy import CycleCosts, GammaPolicy
from orchestrator.store import SessionStore
from tandem import tracing
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


class _FirstCall(NamedTuple):
    """A cycle's first worker call, started before the cycle (while the last one committed)."""

    gamma: int
    began: float  # perf_counter() at its start: the cycle's start
    task: asyncio.Future  # → Reply
    span: trace.Span  # the cycle's span, ended after its commit


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

    async def run(self, s: Session, parent: Context | None = None) -> AsyncIterator[CycleOutput]:
        """Cycles until EOS or max_tokens; each cycle's span is a child of `parent`."""
        s.started = time.perf_counter()
        call = self._launch(s, parent)
        try:
            while call is not None:
                out, call = await self.cycle(s, call, parent)
                if s.stats.ttft_s == 0.0:
                    s.stats.ttft_s = time.perf_counter() - s.started
                s.stats.elapsed_s = time.perf_counter() - s.started
                yield out
        finally:
            if call is not None:  # the client went away mid-generation
                call.task.cancel()
                call.span.end()

    def _launch(self, s: Session, parent: Context | None) -> "_FirstCall":
        """1. Choose γ, never drafting past what the request still wants, open the cycle's span
        and start its first worker call: the draft, or the verify when γ = 0."""
        wanted = s.fixed_gamma if s.fixed_gamma is not None else s.policy.choose()
        gamma = max(0, min(wanted, s.max_tokens - s.generated - 1))
        span = tracing.start_span("cycle", parent,
                                  attributes={"tandem.cycle.index": s.cycle, "tandem.cycle.gamma": gamma})
        here = trace.set_span_in_context(span, parent)
        call = self._propose(s, gamma, here) if gamma else self._verify(s, None, here)
        return _FirstCall(gamma, time.perf_counter(), asyncio.ensure_future(call), span)

    async def cycle(self, s: Session, call: "_FirstCall", parent: Context | None = None,
                    ) -> tuple[CycleOutput, "_FirstCall | None"]:
        """One cycle whose first call is under way; returns its output and the next cycle's call."""
        gamma, began = call.gamma, call.began
        here = trace.set_span_in_context(call.span, parent)
        # 2. Draft γ tokens (the call sent the draft worker the committed tokens it had not seen).
        draft = await call.task if gamma else None
        proposal = draft.answer if draft else None
        # 3. Verify the block in one target pass.
        verify = await self._verify(s, proposal, here) if gamma else await call.task
        verdict = verify.answer
        # 4. Accept/reject with counter-based uniforms keyed by absolute position.
        position = len(s.tokens)
        accepted = 0
        drafted = proposal.draft_tokens if proposal else []
        if proposal:
            u = uniforms(s.params.seed, position, gamma, Purpose.ACCEPT)
            accepted = count_accepted(proposal.draft_token_probs, verdict.target_token_probs, u)
        new = output_tokens(drafted, accepted, verdict.recovered_tokens, verdict.bonus_token)
        new = self._truncate(s, new, remaining=s.max_tokens - s.generated)
        s.draft_cache_len = position + min(accepted, gamma - 1) if gamma else s.draft_cache_len
        s.target_cache_len = position + accepted
        s.tokens.extend(new)
        s.cycle += 1
        # 5. Teach the policy what the cycle measured, and start the next cycle's first call:
        #    it needs only the committed sequence, so it overlaps the Redis commit.
        record = _measure(s, began, gamma, accepted, len(new), draft, verify)
        s.policy.observe(_costs(record, draft, verify))
        following = None if s.finish_reason else self._launch(s, parent)
        call.span.set_attributes({
            "tandem.cycle.accepted": accepted, "tandem.cycle.output_tokens": len(new),
            "tandem.cycle.ended_with": "bonus" if accepted == gamma else "recovered",
            "tandem.cycle.alpha_estimate": s.policy.alpha,
        })
        # 6. Commit to Redis before the client sees the tokens.
        try:
            record.redis_ms = await self._commit(s, new, here)
        except BaseException:
            if following is not None:
                following.task.cancel()
                following.span.end()
            raise
        finally:
            call.span.end()
        s.stats.per_cycle.append(record)
        return CycleOutput(new, bool(s.finish_reason)), following

    async def _commit(self, s: Session, new: list[int], parent: Context) -> float:
        """Append the cycle's tokens and the session's state in one transaction → milliseconds."""
        start = time.perf_counter()
        with tracing.span("redis commit", parent, kind=SpanKind.CLIENT,
                          attributes={"db.system": "redis", "db.operation.name": "MULTI"}):
            await self.store.commit(
                s.session_id, new, s.cycle, s.policy.to_dict(),
                {"draft": s.draft_cache_len, "target": s.target_cache_len}, s.finish_reason or "running",
            )
        return (time.perf_counter() - start) * 1e3

    async def _propose(self, s: Session, gamma: int, parent: Context) -> Reply:
        reply = await self.draft.propose(
            s.session_id, s.draft_cache_len, s.tokens[s.draft_cache_len :], gamma, s.params, parent
        )
        if reply.answer is None:  # the worker lost the session: re-prefill the whole sequence
            s.draft_cache_len = 0
            reply = _then(reply, await self.draft.propose(s.session_id, 0, s.tokens, gamma, s.params, parent))
        return reply

    async def _verify(self, s: Session, proposal, parent: Context) -> Reply:
        reply = await self.target.verify(
            s.session_id, s.target_cache_len, s.tokens[s.target_cache_len :], proposal, s.params, parent
        )
        if reply.answer is None:
            s.target_cache_len = 0
            reply = _then(reply, await self.target.verify(s.session_id, 0, s.tokens, proposal, s.params, parent))
        return reply

    def _truncate(self, s: Session, new: list[int], remaining: int) -> list[int]:
        """Cut the cycle's tokens at the first EOS or at max_tokens, setting finish_reason."""
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
             verify: Reply) -> CycleStats:
    """The cycle's counts and time split up to its commit (redis_ms is filled in after it)."""
    draft_compute = draft.answer.compute_ms if draft else 0.0
    draft_wall = draft.wall_ms if draft else 0.0
    verify_compute = verify.answer.compute_ms
    total = (time.perf_counter() - began) * 1e3
    return CycleStats(
        gamma=gamma, accepted=accepted, output_tokens=output, start_ms=(began - s.started) * 1e3,
        draft_ms=draft_compute, verify_ms=verify_compute,
        transport_ms=max(0.0, draft_wall - draft_compute) + max(0.0, verify.wall_ms - verify_compute),
        orchestration_ms=max(0.0, total - draft_wall - verify.wall_ms),
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
        overhead_ms=c.orchestration_ms,  # the Redis commit overlaps the next cycle's first call
    )

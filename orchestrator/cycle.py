"""The draft-verify cycle loop: a plain async class with injected clients, store and policy,
testable without Ray. One `Session` runs cycles until EOS or max_tokens; each cycle's tokens
are committed to Redis before they are yielded. The next cycle's first worker call needs only
the committed sequence, so it is sent before the commit and the two overlap: Redis is off the
per-cycle critical path (worker caches are soft state, so a commit that fails after the call
costs nothing but the call).

While the target verifies a block, the draft worker is idle: the loop has it draft past the
block for the verify's likeliest outcomes ("drafting ahead"): the whole block accepted and the
bonus token one of the draft's most likely next tokens, and with `ahead_rejections`, the block
rejected at one of its first positions and the recovered token the draft's next choice there.
When the outcome is one it guessed, the next cycle's block is ready and the cycle goes straight
to verify (a chain's: a token tree's cycle does not draft ahead). Exactness does not depend on
the guesses: the block is what a fresh draft call would have proposed after the same committed
sequence (its draws keyed as that call's would be: ProposeRequest.ahead), so the accept/reject
step sees the same proposal either way.
Most guesses miss, so the loop drafts ahead only while its session is the only one in flight:
with others, the draft worker is not idle, and wasted drafts would delay their blocks (measured:
8 sessions in flight, 139 → 105 tokens/s). But for an adaptive session's first cycle, the
target's prefill alone (γ = 0, for its first token): there the draft worker, which would
otherwise prefill and draft the first block in a cycle of its own, does so meanwhile, once a
stream. At 8 in flight on the test bed (48 streams of 64 tokens) that cycle had cost adaptive a
round trip a stream: 0.93× fixed γ = 8's tokens/s across 20 ms; drafting ahead there, 1.00× in
quick runs and 0.95× over a whole sweep (benchmarks/README.md).

Each session sticks to one worker of each pool (`WorkerPool.route`). A worker call that fails
(UNAVAILABLE, a deadline, a reset stream) moves the session to another worker of that pool,
which re-prefills from the committed tokens, and the call is made again: exact, because worker
calls are idempotent and randomness is keyed by position and cycle (tandem.math.rng). With no draft worker available a
cycle runs at γ = 0 (the target alone); with no verifier, the loop waits up to
`verifier_wait_s` for one and then raises `NoWorker`. Commits are fenced (`store.Fenced`): a
writer that another stream has taken over stops. So are its worker calls: each carries the
session's writer epoch, and a worker that has run a later writer's call refuses it (ABORTED,
tandem.services.fencing), which stops this writer as a fenced commit would.

A session's draft shape says what its cycles draft: a chain, a token tree γ deep (the session's
tree widths per depth, then 1), or either, cycle by cycle, as the policy measures them ("auto").
A block is accepted by its rule (tandem.rules): the session's verification for a chain, the tree
rule for a token tree, whose verdict comes back per node and is walked with the loop's own
counter-based uniforms. The verifier keeps the path it walked with the same uniforms; the draft
worker keeps the committed tokens and is fed the path by its next call."""

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import NamedTuple

import grpc
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind

from tandem import rules, tracing
from tandem.cpu import CpuMeter
from tandem.math import tree
from tandem.orchestrator import metrics
from tandem.orchestrator.clients import Reply
from tandem.orchestrator.config import MAX_TREE_NODES
from tandem.orchestrator.policy import CycleCosts
from tandem.orchestrator.pool import Worker, WorkerPool
from tandem.orchestrator.session import Session
from tandem.orchestrator.store import Fenced, SessionStore
from tandem.wire.generation import CycleStats
from tandem.wire.worker import Proposal

# A worker call failing with these moves the session to another worker of the pool.
FAILOVER_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED)


class NoWorker(Exception):
    """No worker of a pool was available within the wait bound; the session stays resumable."""

    def __init__(self, kind: str, waited_s: float) -> None:
        super().__init__(f"no {kind} worker available after {waited_s:.0f} s")
        self.kind, self.waited_s = kind, waited_s

    def __reduce__(self):  # picklable, so it crosses Ray's process boundary intact
        return NoWorker, (self.kind, self.waited_s)


class _FirstCall(NamedTuple):
    """A cycle's first worker call, started before the cycle (while the last one committed)."""

    gamma: int
    began: float  # perf_counter() at its start: the cycle's start
    task: asyncio.Future  # → Reply
    span: trace.Span  # the cycle's span, ended after its commit
    drafted_ahead: bool = False  # the block came from the last cycle's draft-ahead: no draft call
    holds_block: bool = True  # the draft cache holds the block's tokens but its last (not so for a guess's branch)


@dataclass
class CycleOutput:
    tokens: list[int]
    finished: bool


class SpeculativeLoop:
    def __init__(
        self, drafts: WorkerPool, targets: WorkerPool, store: SessionStore,
        eos_token_ids: tuple[int, ...], draft_ahead: bool = True, verifier_wait_s: float = 30.0,
        verifier_drafts: bool = False, ahead_guesses: int = 1, ahead_rejections: int = 0,
    ) -> None:
        """verifier_drafts: the verifiers draft (ModelInfo.drafter): each verify call also drafts
        the next cycle's block, and the draft pool is not used. ahead_guesses: how many guesses
        of a block's bonus token drafting ahead drafts past (ProposeRequest.ahead_guesses);
        ahead_rejections: at how many of a block's first positions it drafts past a rejection
        too (ProposeRequest.ahead_rejections)."""
        self.drafts = drafts
        self.targets = targets
        self.store = store
        self.eos = set(eos_token_ids)
        self.draft_ahead = draft_ahead and not verifier_drafts
        self.ahead_guesses, self.ahead_rejections = ahead_guesses, ahead_rejections
        self.verifier_drafts = verifier_drafts
        self.verifier_wait_s = verifier_wait_s
        self.in_flight = 0  # sessions running in this loop
        self.cpu = CpuMeter()

    async def run(self, s: Session, parent: Context | None = None) -> AsyncIterator[CycleOutput]:
        """Cycles until EOS or max_tokens; each cycle's span is a child of `parent`."""
        s.started = s.started or time.perf_counter()  # a resumed session began earlier
        self.in_flight += 1
        call = None
        try:
            call = self._launch(s, parent)
            while call is not None:
                current, call = call, None  # the cycle owns its call from here, however it ends
                out, call = await self.cycle(s, current, parent)
                if s.stats.ttft_s == 0.0:
                    s.stats.ttft_s = time.perf_counter() - s.started
                s.stats.elapsed_s = time.perf_counter() - s.started
                yield out
            await self._amend_last(s)
        finally:
            self.in_flight -= 1
            if call is not None:  # the client went away between two cycles
                call.task.cancel()
                call.span.end()

    async def _amend_last(self, s: Session) -> None:
        """Store the last cycle's Redis time (each other cycle's went with the next commit)."""
        if s.stats.per_cycle:
            await self.store.amend_redis_ms(s.session_id, s.cycle, s.stats.per_cycle[-1].redis_ms)

    def _launch(self, s: Session, parent: Context | None, block: Reply | None = None,
                holds_block: bool = True) -> "_FirstCall":
        """1. Open the cycle's span and start its first worker call: the draft, or the verify
        when γ = 0. A block drafted ahead (or by the verifier) stands in for the draft call, with
        its γ; where the verifiers draft, a cycle without one verifies no block and asks for one."""
        gamma = len(block.answer.draft_tokens) if block else 0 if self.verifier_drafts else self._gamma(s, s.generated)
        widths = self._tree_widths(s, gamma) if gamma and not block else ()
        ahead = bool(block) and not self.verifier_drafts
        span = tracing.start_span("cycle", parent, attributes={
            "tandem.cycle.index": s.cycle, "tandem.cycle.gamma": gamma, "tandem.cycle.drafted_ahead": ahead,
            "tandem.cycle.draft_shape": "tree" if widths else "chain"})
        if s.request.gamma is None and s.policy.rates_seen:  # why the policy chose this γ
            span.set_attribute("tandem.cycle.tokens_per_ms", s.policy.rates_seen)
        here = trace.set_span_in_context(span, parent)
        if block:
            task = asyncio.get_running_loop().create_future()
            task.set_result(block)
        else:
            task = asyncio.ensure_future(self._propose(s, gamma, here, widths) if gamma
                                         else self._verify(s, None, here, *self._next_shape(s)))
        return _FirstCall(gamma, time.perf_counter(), task, span, ahead, holds_block)

    @staticmethod
    def _tree_widths(s: Session, gamma: int) -> tuple[int, ...]:
        """The tree a drafting cycle of depth γ drafts, or () for a chain."""
        if s.request.draft_shape == "chain" or (s.request.draft_shape == "auto" and not s.policy.choose_tree()):
            return ()
        return tree.widths_at(s.request.tree_widths, gamma)

    def _ahead(self) -> bool:
        """Whether the loop drafts ahead during a session's verify of a chain: while it is alone."""
        return self.draft_ahead and self.in_flight == 1

    def _drafts_ahead(self, s: Session, call: "_FirstCall", branched: bool) -> bool:
        """Whether this cycle drafts ahead during its verify: a chain's while the session is alone,
        and a γ-0 first cycle (an adaptive session's prefill) at any load: there the draft worker
        prefills and drafts the first block meanwhile, where it would otherwise do so in a cycle
        of its own after the first token (the module's docstring)."""
        if branched:
            return False
        return self._ahead() or (self.draft_ahead and not call.gamma and s.generated == 0)

    def _gamma(self, s: Session, generated: int) -> int:
        """γ for a cycle that starts after `generated` tokens: never drafting past what the
        request still wants, and 0 while no draft worker is available. An adaptive session's
        first token comes from the target's prefill alone: a block drafted before it would make
        the caller wait for the draft's prefill and γ steps too (queued behind every other
        session's at load). The draft prefills meanwhile, drafting ahead (`_drafts_ahead`)."""
        if not (self.verifier_drafts or self.drafts.available()) or (s.request.gamma is None and generated == 0):
            return 0
        wanted = s.request.gamma
        if wanted is None:
            wanted = s.policy.choose(ahead=self._ahead(), sessions=self.in_flight)
        return max(0, min(wanted, s.request.max_tokens - generated - 1))

    async def cycle(self, s: Session, call: "_FirstCall", parent: Context | None = None,
                    ) -> tuple[CycleOutput, "_FirstCall | None"]:
        """One cycle whose first call is under way; returns its output and the next cycle's call.
        The cycle's span ends with it, however it ends."""
        try:
            return await self._cycle(s, call, parent)
        finally:
            call.span.end()

    async def _cycle(self, s: Session, call: "_FirstCall", parent: Context | None,
                     ) -> tuple[CycleOutput, "_FirstCall | None"]:
        began = call.began
        here = trace.set_span_in_context(call.span, parent)
        # 2. Draft γ tokens (the call sent the draft worker the committed tokens it had not seen);
        #    no draft worker left makes it a γ-0 cycle.
        draft = await call.task if call.gamma else None
        proposal = draft.answer if draft else None
        gamma = len(proposal.draft_tokens) if proposal else 0  # drafted tokens: a tree's nodes
        branched = bool(proposal and proposal.parents)  # a token tree (the drafter may answer a chain)
        # 3. Verify the block in one target pass; meanwhile the draft worker drafts ahead.
        # (alone: the draft worker would otherwise idle through the verify)
        ahead = self._draft_ahead(s, proposal, here, call.holds_block) if self._drafts_ahead(s, call, branched) else None
        try:
            verify = await self._verify(s, proposal, here, *self._next_shape(s)) if call.gamma else await call.task
        except BaseException:
            if ahead:
                ahead.cancel()
            raise
        verdict = verify.answer
        if verdict.dropped_block:  # the verifier no longer kept the block's distributions: it verified none
            metrics.dropped_blocks.inc()
            draft = proposal = None
            gamma, branched = 0, False
        # 4. Accept/reject by the block's rule (tandem.rules: the session's for a chain, a token
        #    tree's own), with counter-based uniforms keyed by this cycle (tandem.math.rng).
        position = len(s.tokens)
        if proposal:
            rule = rules.of(s.request.verification, branched)
            accepted, new, kept = rule.accept(proposal, verdict, s.params.seed, position)
        else:  # γ = 0: the target's next token
            accepted, new, kept = 0, [verdict.bonus_token], 0
        new = self._truncate(s, new, remaining=s.request.max_tokens - s.generated)
        s.cache_lens["target"] = position + kept
        s.tokens.extend(new)
        s.cycle += 1
        # 5. Settle the draft-ahead call (a session has one draft call in flight at a time): the
        #    next block if a guess came true. The draft cache holds the block's first γ−1 tokens,
        #    all γ once a draft-ahead call fed the last, and the guess too on a hit of a chain (a
        #    hit among several guesses leaves it in a tree's layout: the next call feeds it).
        settling = time.perf_counter()
        ahead_reply, block = await self._settle(s, ahead, gamma, accepted) if ahead else (None, None)
        ahead_wait = (time.perf_counter() - settling) * 1e3 if ahead_reply else -1.0
        laid_out = bool(block) and ahead_reply.answer.parents.count(-1) > 1
        if self.verifier_drafts:
            block = self._next_block(s, verify, accepted, new)
        if block:
            s.cache_lens["draft"] = len(s.tokens) - laid_out
        elif ahead_reply:
            s.cache_lens["draft"] = position + accepted
        elif not call.holds_block:  # a guess's branch, which the cache does not hold: as it was
            pass
        elif gamma and not branched:
            s.cache_lens["draft"] = position + min(accepted, gamma - 1)
        elif proposal:  # a tree, or a drafter that proposed nothing (no n-gram match): the committed tokens
            s.cache_lens["draft"] = position
        # 6. Teach the policy what the cycle measured, and start the next cycle's first call:
        #    it needs only the committed sequence, so it overlaps the Redis commit.
        record = _measure(s, began, call, gamma, accepted, len(new), draft, verify, ahead_reply)
        depth = max(tree.depths(proposal.parents)) if branched else 0  # a tree's γ; 0: a chain
        # The orchestrator's CPU goes mostly to its calls: the meter counts each worker call and the
        # rest of the cycle (its commit, its stream) as one event, and a drafting cycle pays one more.
        per_event = self.cpu.count(2 + bool(call.gamma and not call.drafted_ahead) + bool(ahead))
        # A draft call answered with no block (an n-gram lookup without a match) teaches the policy
        # a block of the γ asked, rejected at its first token (the policy's docstring).
        costs = _costs(record, draft, verify, per_event, depth, asked=call.gamma if proposal and not gamma else 0,
                       ahead_wait=ahead_wait)
        costs.guessed, costs.recovered = _guesses(ahead_reply, block, gamma, accepted, self.ahead_rejections)
        s.policy.observe(costs, len(new), ahead=self._ahead(), sessions=self.in_flight)
        following = None if s.finish_reason else self._launch(s, parent, block, holds_block=not laid_out)
        call.span.set_attributes({
            "tandem.cycle.accepted": accepted, "tandem.cycle.output_tokens": len(new),
            "tandem.cycle.ended_with": "bonus" if accepted == gamma else "recovered",
            "tandem.cycle.alpha_estimate": s.policy.pair_alpha,
        })
        # 7. Commit to Redis before the client sees the tokens.
        try:
            record.redis_ms = await self._commit(s, new, record, here)
        except BaseException:
            if following is not None:
                following.task.cancel()
                following.span.end()
            raise
        s.stats.per_cycle.append(record)
        return CycleOutput(new, bool(s.finish_reason)), following

    def _next_shape(self, s: Session) -> tuple[int, tuple[int, ...]]:
        """Where the verifiers draft: the γ and tree widths (() for a chain) of the block a verify
        asks for (the next cycle's, chosen now; the tokens this cycle outputs are not known yet, so
        `_next_block` trims the block to what is still wanted). (0, ()) elsewhere."""
        if not self.verifier_drafts:
            return 0, ()
        gamma = self._gamma(s, s.generated + 1)
        return gamma, self._tree_widths(s, gamma) if gamma else ()

    def _next_block(self, s: Session, verify: Reply, accepted: int, new: list[int]) -> Reply | None:
        """The block the verifier drafted for the next cycle, when it drafted after this cycle's
        outcome (its walk is the loop's, with the same uniforms) and a next cycle wants tokens:
        its first tokens, as many as are still wanted (a prefix of a chain is what a shorter call
        would have drafted, draws and all). A Reply whose cost is the drafting's."""
        verdict = verify.answer
        block = verdict.next_block
        if s.finish_reason or block is None or (verdict.next_accepted, verdict.next_token) != (accepted, new[-1]):
            return None
        depth = s.request.max_tokens - s.generated - 1  # the most a next cycle's block may be deep
        if depth < 1:
            return None
        keep = tree.within(block.parents, depth) if block.parents else min(len(block.draft_tokens), depth)
        parents = block.parents[:keep]
        rows = len(tree.expanded(tuple(parents))) if parents else keep  # draft distributions: a tree's per parent
        trimmed = Proposal(block.draft_tokens[:keep], block.draft_token_probs[:keep], block.draft_distributions[:rows],
                           block.compute_ms, block.batching, parents, held=block.held)
        return Reply(trimmed, 0.0, 0, verify.fed)

    def _draft_ahead(self, s: Session, proposal: Proposal | None, parent: Context,
                     holds_block: bool) -> asyncio.Future | None:
        """Start drafting past the block [d_1 … d_γ] for its likeliest outcomes: feed d_γ (the
        draft cache holds d_1 … d_γ−1, or when it does not, what it lacks; past rejections, the
        whole block and the token before it, whose rows guess them), draft guesses of the bonus
        token and of the recovered tokens, then the next cycle's γ tokens after each. None when
        the next cycle would not draft. A γ-0 cycle's verify (the first one, the prompt's
        prefill) has no block: the bonus is the target's next token, and the draft worker
        prefills or catches up meanwhile instead of in the next cycle's draft call."""
        block = list(proposal.draft_tokens) if proposal else []
        gamma = len(block)
        after = s.generated + gamma + 1  # tokens generated should the whole block and a bonus land
        next_gamma = self._gamma(s, after) if after < s.request.max_tokens else 0
        worker = self._draft_worker(s, parent) if next_gamma else None
        if worker is None:
            return None
        room = MAX_TREE_NODES // (next_gamma + 1)  # guesses the tree has nodes for
        guesses = max(1, min(self.ahead_guesses, room))
        rejections = min(self.ahead_rejections, gamma, room - guesses)
        cache_len = len(s.tokens) + gamma - 1 if gamma and holds_block else s.cache_lens["draft"]
        if rejections or not gamma:  # the rows guess from the token before the block; no block: the bonus
            cache_len = min(cache_len, len(s.tokens) - 1)
        fed = (s.tokens + block)[cache_len:]
        return asyncio.ensure_future(worker.client.propose(
            s.session_id, cache_len, fed, next_gamma + 1, s.params, parent, ahead=True, epoch=s.epoch,
            guesses=guesses, block=gamma if rejections else 0, rejections=rejections))

    def _draft_worker(self, s: Session, parent: Context) -> Worker | None:
        """The session's draft worker, routed here when it has none yet (its first cycle); None
        when it is not available (drafting ahead does not fail over: the next draft call does)."""
        if s.workers["draft"] is None and (worker := self.drafts.route()) is not None:
            self._move(s, "draft", worker.address, "", parent)
        return self.drafts.get(s.workers["draft"])

    async def _settle(self, s: Session, ahead: asyncio.Future, gamma: int, accepted: int,
                      ) -> tuple[Reply | None, Reply | None]:
        """Wait for the draft-ahead call → (its reply, the next block if the cycle's outcome, its
        `accepted` tokens of γ and the token after them, was one it guessed). The reply is None
        when the call missed the cache or failed, or the generation is over (the call is then
        cancelled)."""
        if s.finish_reason:
            ahead.cancel()
            return None, None
        try:
            reply = await ahead
        except grpc.aio.AioRpcError:  # a lost guess: the next cycle drafts as usual
            return None, None
        if not reply.answer:
            return None, None
        block = _branch(reply.answer, gamma, accepted, s.tokens[-1])
        return reply, Reply(block, 0.0, 0) if block else None

    async def _commit(self, s: Session, new: list[int], record: CycleStats, parent: Context) -> float:
        """Append the cycle's tokens, its stats and the session's state in one atomic, fenced
        script → milliseconds."""
        start = time.perf_counter()
        with tracing.span("redis commit", parent, kind=SpanKind.CLIENT,
                          attributes={"db.system": "redis", "db.operation.name": "EVALSHA"}):
            previous = s.stats.per_cycle[-1].redis_ms if s.stats.per_cycle else 0.0
            await self.store.commit(s.session_id, s.owner, s.cycle, new, record, s.changes(), previous)
        return (time.perf_counter() - start) * 1e3

    async def _propose(self, s: Session, gamma: int, parent: Context,
                       tree_widths: tuple[int, ...] = ()) -> Reply | None:
        """Draft γ tokens (a tree γ deep of these widths); None when no draft worker is available
        or none drafted the block (the cycle runs at γ = 0)."""

        def call(client, cache_len: int, tokens: list[int]):
            return client.propose(s.session_id, cache_len, tokens, gamma, s.params, parent, epoch=s.epoch,
                                  tree_widths=tree_widths, tree_rule=s.request.tree_rule)

        reply = await self._on_worker(s, self.drafts, call, parent)
        if reply is not None and reply.answer is None:
            # Even the re-prefill missed: the session was released between two of its block's
            # draft steps (another writer took it over, or the caller's release crossed the call).
            reply = None
        if reply is None:
            metrics.undrafted_cycles.inc()
        return reply

    async def _verify(self, s: Session, proposal, parent: Context, next_gamma: int = 0,
                      next_widths: tuple[int, ...] = ()) -> Reply:
        """Verify the block (and where the verifiers draft, draft the next one, next_gamma deep:
        a chain, or a tree of next_widths), waiting up to verifier_wait_s for a verifier when none
        is available."""

        def call(client, cache_len: int, tokens: list[int]):
            return client.verify(s.session_id, cache_len, tokens, proposal, s.params, parent, epoch=s.epoch,
                                 verification=s.request.verification, next_gamma=next_gamma,
                                 next_tree_widths=next_widths, tree_rule=s.request.tree_rule,
                                 keep_next_distributions=bool(next_gamma) and not s.params.greedy)

        deadline = time.monotonic() + self.verifier_wait_s
        while (reply := await self._on_worker(s, self.targets, call, parent)) is None:
            if not await self.targets.wait_available(deadline - time.monotonic()):
                raise NoWorker("target", self.verifier_wait_s)
        return reply

    async def _on_worker(self, s: Session, pool: WorkerPool, call, parent: Context) -> Reply | None:
        """call(client, cache_len, tokens) on the session's worker of `pool`, re-sending the whole
        sequence when the worker lost the session; when the call fails, the same on another worker,
        which re-prefills. None when no worker of the pool is available."""
        kind, reason = pool.kind, "down"  # why the session would leave its worker
        while (worker := pool.route(s.workers[kind])) is not None:
            moved = worker.address != s.workers[kind]
            failover = self._move(s, kind, worker.address, reason, parent) if moved else None
            # A call feeds at least the last committed token: a record can say a worker holds them
            # all (after a drafted-ahead hit), and a resumed session has no block in hand.
            cache_len = min(s.cache_lens[kind], len(s.tokens) - 1)
            try:
                reply = await call(worker.client, cache_len, s.tokens[cache_len:])
                if reply.answer is None:  # the worker lost the session: re-prefill
                    metrics.reprefills.labels(pool=kind, reason="cache_miss").inc()
                    s.cache_lens[kind] = 0
                    reply = _then(reply, await call(worker.client, 0, s.tokens))
                return reply
            except grpc.aio.AioRpcError as e:
                if e.code() == grpc.StatusCode.ABORTED:  # a later writer's call ran there first
                    raise Fenced(s.session_id, "taken over") from None
                if e.code() not in FAILOVER_CODES:
                    raise
                pool.failed(worker, e.code().name)
                reason = e.code().name
            finally:
                if failover is not None:
                    failover.end()
        return None

    @staticmethod
    def _move(s: Session, kind: str, address: str, reason: str, parent: Context) -> trace.Span | None:
        """The session's calls go to the worker at `address` from now on, re-prefilling there.
        When it leaves another worker (a failover), a span over its first call there."""
        previous = s.workers[kind]
        s.workers[kind], s.cache_lens[kind] = address, 0
        s.used.add((kind, address))
        if previous is None:  # the session's first call
            return None
        metrics.failovers.labels(pool=kind).inc()
        metrics.reprefills.labels(pool=kind, reason="failover").inc()
        return tracing.start_span("failover", parent, attributes={
            "tandem.pool": kind, "tandem.from": previous, "tandem.to": address, "tandem.reason": reason})

    def _truncate(self, s: Session, new: list[int], remaining: int) -> list[int]:
        """Cut the cycle's tokens at the first EOS (unless the request ignores it) or at
        max_tokens, setting finish_reason."""
        for i, token in enumerate(new):
            if token in self.eos and not s.request.ignore_eos:
                s.finish_reason = "stop"
                return new[: i + 1]
        if len(new) >= remaining:
            s.finish_reason = "length"
        return new[:remaining]


def _guesses(reply: Reply | None, block: Reply | None, gamma: int, accepted: int, rejections: int,
             ) -> tuple[bool | None, bool | None]:
    """Whether drafting ahead guessed the cycle's outcome, as the γ policy prices it (its rates
    g and h: tandem.orchestrator.policy) → (after the block accepted whole: the bonus guessed;
    after a rejection at one of its first `rejections` positions: the recovered token guessed),
    None where there was no such outcome or no draft-ahead reply. A reply that drafted no guess
    past the rejection missed it: an n-gram lookup drafts past the whole block only, and counted
    apart, the hybrid drafter's rate h stood at 0.45 where 0.26 of its rejections were followed
    by a block drafted ahead (a lone session across 20 ms, γ = 6)."""
    if reply is None:
        return None, None
    if accepted == gamma:
        return block is not None, None
    return None, (block is not None) if accepted < rejections else None


def _branch(ahead: Proposal, gamma: int, accepted: int, token: int) -> Proposal | None:
    """The block drafted ahead for the outcome that accepts `accepted` of the block's γ tokens and
    ends with `token`: the chain under the guess of that token anchored there (ProposeResponse:
    a tree whose root's children are the guesses, anchored where not after the whole block; a
    chain guesses the bonus with its first token), each token's distribution its parent's row.
    None when no guess was that outcome or nothing follows it (a drafter may propose fewer than
    asked: an n-gram lookup proposes what it matched, possibly nothing)."""
    parents = ahead.parents or tuple(range(-1, len(ahead.draft_tokens) - 1))
    roots = [n for n, up in enumerate(parents) if up == -1]
    anchors = ahead.anchors or [gamma] * len(roots)
    guess = next((n for n, anchor in zip(roots, anchors) if anchor == accepted and ahead.draft_tokens[n] == token),
                 None)
    child = {up: n for n, up in enumerate(parents) if up >= 0}  # one child per node below the guesses
    nodes = []
    while guess is not None and (guess := child.get(guess)) is not None:
        nodes.append(guess)
    if not nodes:
        return None
    # Whose distribution each row is: a chain's, its tokens' parents; a tree drafted ahead has none for the root.
    rows = [n for n in tree.expanded(tuple(parents)) if n >= 0] if ahead.parents else parents
    row = {node: r for r, node in enumerate(rows)}
    dists = [ahead.draft_distributions[row[parents[n]]] for n in nodes] if ahead.draft_distributions else []
    return Proposal([ahead.draft_tokens[n] for n in nodes], [ahead.draft_token_probs[n] for n in nodes], dists, 0.0)


def _then(miss: Reply, retry: Reply) -> Reply:
    """A cache miss and its re-prefill, counted as one call."""
    return Reply(retry.answer, miss.wall_ms + retry.wall_ms, miss.wire_bytes + retry.wire_bytes, retry.fed)


def _transport(reply: Reply | None) -> float:
    """A worker call's wall time less its compute and its wait (a verify's next block's too):
    serialization, gRPC, scheduling."""
    if not reply:
        return 0.0
    block = getattr(reply.answer, "next_block", None)
    drafting = block.compute_ms + block.batching.wait_ms if block else 0.0
    return max(0.0, reply.wall_ms - reply.answer.compute_ms - _wait(reply) - drafting)


def _wait(reply: Reply | None) -> float:
    """How long a worker call waited while its worker ran other sessions' work."""
    return reply.answer.batching.wait_ms if reply else 0.0


def _measure(s: Session, began: float, call: "_FirstCall", gamma: int, accepted: int, output: int,
             draft: Reply | None, verify: Reply, ahead: Reply | None) -> CycleStats:
    """The cycle's counts and time split up to its commit (redis_ms is filled in after it)."""
    draft_wall = draft.wall_ms if draft else 0.0
    total = (time.perf_counter() - began) * 1e3
    return CycleStats(
        gamma=gamma, accepted=accepted, output_tokens=output, start_ms=(began - s.started) * 1e3,
        draft_ms=draft.answer.compute_ms if draft else 0.0, verify_ms=verify.answer.compute_ms,
        transport_ms=_transport(draft) + _transport(verify),
        wait_ms=_wait(draft) + _wait(verify),
        orchestration_ms=max(0.0, total - draft_wall - verify.wall_ms),
        wire_bytes=(draft.wire_bytes if draft else 0) + verify.wire_bytes + (ahead.wire_bytes if ahead else 0),
        drafted_ahead=call.drafted_ahead,
        ahead_ms=ahead.answer.compute_ms if ahead and ahead.answer else 0.0,
    )


def _costs(c: CycleStats, draft: Reply | None, verify: Reply, per_event_ms: float, depth: int = 0,
           asked: int = 0, ahead_wait: float = -1.0) -> CycleCosts:
    """What the γ policy learns from a cycle: what each call's work cost its worker (a worker that
    does not measure it: its compute time, and the call's transport), the orchestrator's CPU (per
    event, the verify call and the rest of a cycle being two, a draft call one; until that is
    measured, the cycle's orchestration time), the wait for its draft-ahead call after the
    verdict (ahead_wait, -1: none answered), and the latency beyond them. depth: a token tree's
    (its γ), 0 for a chain; asked: the γ of a draft call that drafted nothing (else 0)."""
    draft_call, verify_call = _call(draft), _call(verify)
    measured = per_event_ms >= 0
    overhead = 2 * per_event_ms if measured else c.orchestration_ms
    draft_overhead = per_event_ms if measured and c.gamma else 0.0
    return CycleCosts(
        gamma=depth or c.gamma or asked, accepted=c.accepted, tree=bool(depth),
        wall_ms=c.draft_ms + c.verify_ms + c.transport_ms + c.wait_ms + c.orchestration_ms,
        draft_cost_ms=_cost(draft), draft_call_ms=draft_call,
        verify_cost_ms=_cost(verify), verify_call_ms=verify_call,
        overhead_ms=overhead, draft_overhead_ms=draft_overhead,
        draft_latency_ms=max(0.0, _transport(draft) - draft_call),
        latency_ms=(max(0.0, _transport(verify) - verify_call)
                    + max(0.0, c.orchestration_ms - overhead - draft_overhead - max(ahead_wait, 0.0))),
        ahead_wait_ms=ahead_wait,
        drafted_ahead=c.drafted_ahead,
        draft_fed=draft.fed if draft else 0,
        verify_fed=verify.fed,
        draft_batching=draft.answer.batching if draft else None,
        verify_batching=verify.answer.batching,
    )


def _cost(reply: Reply | None) -> float:
    if not reply:
        return 0.0
    return reply.answer.batching.cost_ms or reply.answer.compute_ms


def _call(reply: Reply | None) -> float:
    if not reply:
        return 0.0
    return reply.answer.batching.handling_ms if reply.answer.batching.cost_ms else _transport(reply)

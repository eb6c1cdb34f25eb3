"""Continuous batching: one thread owns the model and runs the work of all sessions in shared
forward passes.

A job is a generator. It yields a `Step` (tokens of its session to run), receives what the
step's ask computes from its logits (tandem.services.sampler; the logits themselves for a step
without one), or has the step's CacheMiss thrown into it, and returns its answer: a verify is one
step, drafting γ tokens is γ steps. Each round, the model thread takes the jobs waiting for a
step, in arrival order, one per session, up to a budget of tokens (the first always, however
long), runs their steps in one pass (`ModelRuntime.extend_batch`; one per kind of step where a
verifier drafts too: the target's pass and its head's, whose steps wait for a round or two while
verifies do, so that every session's drafting runs in the same passes), answers each pass's asks
together (`sampler.answer`: one warp, one argmax, one draw per kind for the whole pass), and hands
each job its answer. A step whose session a later writer has stepped meanwhile is not
run: its job ends with `Superseded` (tandem.services.fencing). The `KeepPath`s the jobs then
yield (after a token tree's step) are applied together, before any other pass. A job with more
steps waits for the next round; a job that arrived meanwhile joins it. Nothing waits for a
batch to fill: an idle thread runs a lone job at once. Only sessions the thread answered a
moment ago and expects back are waited for, briefly (tandem.services.holding), so that cohorts
of sessions share passes.

Each job's answer says what its work cost (Batching.cost_ms): the passes it took part in, whole,
in the device's scarce time: CPU time on a CPU, which the machine's other processes share (a
pass's wall time there counts the time it waited for a core), wall time on an accelerator,
which the worker owns.

Batching changes which rows share a matrix product, nothing else: every job keeps its own
cache, positions and random numbers, so the answers are those of the job run alone up to the
floating-point rounding of a larger product (docs/exactness.md, "Batch invariance").
"""

import collections
import concurrent.futures
import inspect
import logging
import queue
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

import torch

from tandem.math.fit import LinearFit
from tandem.services import metrics, sampler
from tandem.services.fencing import Superseded, WriterEpochs
from tandem.services.holding import FIT_STEP_TOKENS, HOLD_SHARE, PASS_DECAY, Returns, fixed_s
from tandem.services.runtime import KeepPath, ModelRuntime, Step
from tandem.wire.worker import Batching

log = logging.getLogger("tandem.worker")

# Tokens per pass: a round takes waiting steps until the next would pass this. A decode round
# of 64 sessions drafting, or 32 verifying γ = 8 blocks, fits; a long prefill runs with few others.
DEFAULT_BATCH_TOKENS = 512
# Rounds in a row a verifier's drafting steps may wait while verifies run (Batcher._kinds).
MAX_DEFERRALS = 2

Job = Generator[Step, Any, Any]


@dataclass
class _Running:
    job: Job
    future: concurrent.futures.Future
    submitted: float  # time.perf_counter() at submit
    epoch: int = 0  # its session's writer epoch (0: not fenced)
    session_id: str = ""  # its steps' session, once it has one
    step: Step | None = None
    compute_ms: float = 0.0  # the passes it took part in, and its own work between them
    cost_ms: float = 0.0  # the same work in the device's time (the module's docstring)
    batching: Batching = field(default_factory=Batching)  # those passes, every session's tokens in them
    deferred: int = 0  # rounds in a row its drafting step waited for verifies (Batcher._kinds)


class Batcher:
    """Runs jobs on its own thread (the only one that touches the model), batching their steps."""

    def __init__(self, runtime: ModelRuntime, max_batch_tokens: int = DEFAULT_BATCH_TOKENS) -> None:
        if max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be at least 1, got {max_batch_tokens}")
        self.runtime = runtime
        self.max_batch_tokens = max_batch_tokens
        # The model thread's CPU clock: its own, unless torch's intra-op threads share its work (the
        # process's then, which also counts the event loop's work meanwhile: an overestimate).
        device = getattr(runtime, "device", None)  # None: no model (the n-gram drafter)
        on_cpu = device is None or device.type == "cpu"
        shared = device is not None and on_cpu and torch.get_num_threads() > 1
        self._cpu = time.process_time if shared else time.thread_time
        self._cost_is_wall = not on_cpu
        # A verifier's drafting step (its head's, its exit layers'), which waits for verifies (_kinds).
        self._drafting = getattr(runtime, "draft_step", None)  # None: no drafting, or no model
        self.writers = WriterEpochs()
        self.returns = Returns()  # when sessions went back, and how long they take to return
        # Per kind of step, what its pass costs (wall seconds) against its tokens.
        self.passes: collections.defaultdict[type, LinearFit] = collections.defaultdict(LinearFit)
        self._incoming: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="model", daemon=True)
        self._thread.start()

    def submit(self, job: Job | Callable[[], Any]) -> concurrent.futures.Future:
        """Queue a job (or a plain function, run alone between two passes) → a future of its
        answer. A job's answer that has a compute_ms gets the time of the passes it took part in
        and of its own work between them, and its batching those passes."""
        return self.submit_all([job])[0]

    def submit_all(self, jobs: list[Job | Callable[[], Any]],
                   epochs: list[int] | None = None) -> list[concurrent.futures.Future]:
        """Queue jobs at once → their futures: the model thread admits them together, so that they
        share its passes from their first step (a batched call's rows). epochs: each job's
        writer epoch (tandem.services.fencing; none: not fenced)."""
        now = time.perf_counter()
        queued = [(job, concurrent.futures.Future(), now, epoch) for job, epoch in zip(jobs, epochs or [0] * len(jobs))]
        self._incoming.put(queued)
        return [future for _, future, _, _ in queued]

    # --- the model thread ------------------------------------------------------------------

    def _run(self) -> None:
        waiting: list[_Running] = []  # jobs with a step to run, in arrival order
        while True:
            try:
                self._admit(waiting, block=not waiting)
                if waiting:
                    self._hold(waiting)
                    self._round(waiting)
            except BaseException:  # never lose the thread: every job would hang
                log.exception("batching round failed")

    def _admit(self, waiting: list[_Running], block: bool, timeout: float | None = None) -> None:
        """Start what was submitted (waiting for it up to `timeout` when blocking): a job runs to
        its first step; a plain function runs now."""
        while True:
            try:
                queued = self._incoming.get(block=block, timeout=timeout)
            except queue.Empty:
                return
            block = False
            for job, future, submitted, epoch in queued:
                if future.set_running_or_notify_cancel():
                    self._start_job(waiting, _Running(job, future, submitted, epoch=epoch))

    def _start_job(self, waiting: list[_Running], running: _Running) -> None:
        """A job to its first step (then it waits for a round), or a plain function run now."""
        job, future = running.job, running.future
        if inspect.isgenerator(job):
            if self._advance(running, None):
                running.session_id = running.step.session_id
                self.returns.arrived(running.session_id, running.submitted)
                waiting.append(running)
            return
        try:
            future.set_result(job())
        except BaseException as e:
            future.set_exception(e)

    def _hold(self, waiting: list[_Running]) -> None:
        """Wait, admitting what comes meanwhile, for the sessions due back within a share of a
        pass's fixed cost (tandem.services.holding), unless the round is full already. The
        dearest kind's pass: a verifier's target pass (its head's costs a quarter), a hybrid
        drafter's model pass (its lookups' cost nothing), which the rows due back would join."""
        fixed = max((fixed_s(line) for line in self.passes.values()), default=0.0)
        budget, now = HOLD_SHARE * fixed, time.perf_counter()
        if budget <= 0 or sum(len(r.step.tokens) for r in waiting) >= self.max_batch_tokens:
            return
        until, due = now + budget, self.returns.due(now, budget)
        while due:
            for running in waiting:
                due.pop(running.session_id, None)
            left = until - time.perf_counter()
            if not due or left <= 0:
                return
            self._admit(waiting, block=True, timeout=left)

    def _round(self, waiting: list[_Running]) -> None:
        picked = self._pick(waiting)
        batch = self._fenced(picked)
        if len(batch) < len(picked):
            waiting[:] = [r for r in waiting if not r.future.done()]
        if not batch:
            return
        ready = []
        for jobs in self._kinds(batch):  # grouped first: a pass advances its jobs to their next steps
            ready += self._pass(jobs, waiting)
        waiting += ready  # their next steps join the next round, behind older jobs

    def _kinds(self, batch: list[_Running]) -> list[list[_Running]]:
        """The round's passes: its steps grouped by kind, the target's and a verifier's drafting
        steps (its head's or its exit layers': tandem.services.head_runtime, self_draft), whose
        pass is another. Drafting steps wait while verifies do, MAX_DEFERRALS rounds at most: a
        verify's job drafts next, so the sessions behind catch up and the cohorts' drafting steps
        share passes. Run side by side, two cohorts kept the verifier's passes at 4 sessions of 8."""
        kinds: dict[type, list[_Running]] = {}
        for running in batch:
            kinds.setdefault(type(running.step), []).append(running)
        drafting = kinds.get(self._drafting, []) if len(kinds) > 1 else []
        waits = bool(drafting) and all(r.deferred < MAX_DEFERRALS for r in drafting)
        for running in drafting:
            running.deferred = running.deferred + 1 if waits else 0
        return [jobs for kind, jobs in kinds.items() if not (waits and kind is self._drafting)]

    def _pass(self, batch: list[_Running], waiting: list[_Running]) -> list[_Running]:
        """Run one pass of the round (its steps of one kind), charge it to the jobs in it, and
        advance them → those with a step to run. Charged the whole round, a head's step paid the
        target's pass of the other sessions' verifies and they its pass, and the policy's fits of
        the two passes' costs mixed both."""
        tokens = sum(len(r.step.tokens) for r in batch)
        start = self._start()
        steps = [r.step for r in batch]
        try:
            results = self._answer(steps, self.runtime.extend_batch(steps))
        except BaseException as e:  # the pass itself failed: every job in it fails, no other
            results = [e] * len(batch)
        elapsed, cost = self._since(start)
        metrics.batch_sessions.observe(len(batch))
        metrics.batch_tokens.observe(tokens)
        advanced = []
        for running, result in zip(batch, results):
            running.compute_ms += elapsed
            running.cost_ms += cost
            b = running.batching
            b.passes, b.tokens, b.sessions = b.passes + 1, b.tokens + tokens, b.sessions + len(batch)
            waiting.remove(running)
            if self._advance(running, result):
                advanced.append(running)
        if max(len(step.tokens) for step in steps) <= FIT_STEP_TOKENS:  # for holds (_hold)
            self.passes[type(steps[0])].add(tokens, elapsed / 1e3, PASS_DECAY)
        return self._keep_paths(advanced)

    @staticmethod
    def _answer(steps: list[Step], results: list) -> list:
        """The pass's results with each ask's logits replaced by its answer, all asks at once."""
        asked = [i for i, (step, result) in enumerate(zip(steps, results))
                 if step.ask is not None and isinstance(result, torch.Tensor)]
        if asked:
            for i, answer in zip(asked, sampler.answer([steps[i].ask for i in asked], [results[i] for i in asked])):
                results[i] = answer
        return results

    def _fenced(self, jobs: list[_Running]) -> list[_Running]:
        """The jobs whose writer still writes their session, their steps admitted now, just
        before they run; each of the others ends with Superseded (its future done)."""
        admitted = []
        for running in jobs:
            try:
                self.writers.admit(running.step.session_id, running.epoch)
                admitted.append(running)
            except Superseded as e:
                running.job.close()
                running.future.set_exception(e)
                self._answered(running)
        return admitted

    def _keep_paths(self, advanced: list[_Running]) -> list[_Running]:
        """Apply the KeepPaths the jobs yielded, all at once, and advance those jobs → the jobs
        with a step to run. (No other pass runs between a step and its KeepPath: the step's
        admission covers both.)"""
        ready = [r for r in advanced if not isinstance(r.step, KeepPath)]
        keeping = [r for r in advanced if isinstance(r.step, KeepPath)]
        while keeping:
            held = self.runtime.keep_paths([r.step for r in keeping])
            advanced = [r for r, kept in zip(keeping, held) if self._advance(r, kept)]
            ready += [r for r in advanced if not isinstance(r.step, KeepPath)]
            keeping = [r for r in advanced if isinstance(r.step, KeepPath)]
        return ready

    def _pick(self, waiting: list[_Running]) -> list[_Running]:
        """The oldest waiting jobs, one per session, within the token budget (the oldest always)."""
        batch, sessions, tokens = [], set(), 0
        for running in waiting:
            n = len(running.step.tokens)
            if running.step.session_id in sessions or (batch and tokens + n > self.max_batch_tokens):
                continue
            batch.append(running)
            sessions.add(running.step.session_id)
            tokens += n
        return batch

    def _start(self) -> tuple[float, float]:
        return time.perf_counter(), self._cpu()

    def _since(self, start: tuple[float, float]) -> tuple[float, float]:
        """(wall ms, cost ms) of the model thread's work since start."""
        wall, cpu = (time.perf_counter() - start[0]) * 1e3, (self._cpu() - start[1]) * 1e3
        return wall, wall if self._cost_is_wall else cpu

    def _answered(self, running: _Running) -> None:
        if running.session_id:
            self.returns.answered(running.session_id, time.perf_counter())

    def _advance(self, running: _Running, result) -> bool:
        """Give the job its step's result (None to start it) → True when it has another step;
        False once its answer (or its exception) is on its future."""
        start = self._start()
        try:
            if isinstance(result, BaseException):
                running.step = running.job.throw(result)
            else:
                running.step = running.job.send(result)
        except StopIteration as done:
            answer = done.value
            elapsed, cost = self._since(start)
            if hasattr(answer, "compute_ms"):
                answer.compute_ms = running.compute_ms + elapsed
                b = running.batching
                b.wait_ms = max(0.0, (time.perf_counter() - running.submitted) * 1e3 - answer.compute_ms)
                b.cost_ms = running.cost_ms + cost
                answer.batching = b
            running.future.set_result(answer)
            self._answered(running)
            return False
        except BaseException as e:
            running.future.set_exception(e)
            self._answered(running)
            return False
        elapsed, cost = self._since(start)
        running.compute_ms += elapsed
        running.cost_ms += cost
        return True

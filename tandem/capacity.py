"""Capacity planning for a tandem cluster: a discrete-event simulation of every session's
draft → verify cycle over shared workers, and a planner that searches drafters per verifier and
γ with it (`tandem plan --cluster`).

The model. S sessions run at once, closed loop: when one has its `tokens_per_session` tokens a
new one takes its slot at once. Slot i uses drafter i mod N, verifier i mod M and orchestrator
replica i mod R. A cycle of a session:

  1. (γ > 0) a draft call: rtt/2 to its drafter, γ steps of 1 token there, call_ms +
     γ · draft_token_ms of CPU and rtt/2 back;
  2. a verify call: rtt/2 to its verifier, one step of γ + 1 tokens (a new session's first cycle
     is its prefill: prompt_tokens, and no draft), call_ms + γ · wire_token_ms of CPU and rtt/2
     back;
  3. orchestrator_ms on its replica's CPU, and orchestrator_draft_call_ms more per call it made
     to a drafter (the draft call, a draft-ahead call; a batched call's rows share one);
     background_ms on a host's shared cores.

Calls go as tandem's control plane sends them (tandem.orchestrator.turns): the calls a replica
makes in one turn of its event loop travel to each worker as one batched call, whose rows run
together and are answered together once the last has run, paying one round trip and one call_ms
(and a draft_token_ms per drafted token of every row). A replica runs the cycles of the answers
that reached it in one turn (orchestrator_ms each, one after another), those that came meanwhile
in the next, and sends each turn's next calls together: sessions answered together move on
together, as cohorts.

Drafting ahead (Cluster.draft_ahead), as tandem.orchestrator.cycle does it for a session alone in
its replica: with a drafted block's verify goes a draft-ahead call to its drafter, γ + 1 steps of
1 + min(γ, ahead_rejections) chains (one under a guess of the bonus token and one under a guess
of the recovered token at each of the block's first positions) in one job, each step one pass of
them and Costs.ahead_step_ms of CPU, and the cycle ends once both have answered. When the verify
ends as a guess did (the block accepted whole and the bonus guessed, Costs.bonus_guess of the
time; or rejected at a position drafted past and the recovered token guessed,
Costs.recovered_guess), the next cycle's block is ready: its verify goes at once.

A worker batches continuously, as tandem.services.batching does: while steps wait it runs passes
back to back; a pass takes the next step of the waiting jobs in arrival order, whole, while they
fit in max_batch_tokens (the first always, however long), and costs intercept + slope · (its
tokens), or what a table of measured passes says (pass_ms), plus a row's cost (Costs.*_row_ms) for
each of its jobs past the first, and the handling of the rows it runs the first step of
(Costs.handling_ms, and handling_call_ms for each call whose first row it runs: on a CPU the
worker's process runs it between passes), and more when the worker idled before it
(Costs.*_cold_ms: caches and clocks gone cold). A γ-token draft takes part in γ
passes; a job that arrives during a pass waits for the next. Before a pass, a worker holds it for
the sessions due back (answered earlier, their last way round ending within HOLD_SHARE of its fixed
cost from now) until they come or that time is up, as tandem.services.holding does, so that cohorts
meet. call_ms is the worker's CPU outside passes, taken to run beside the device (it delays the
call, not the passes). Each worker and replica has a processor of its own, unless the cluster
shares a host's cores (Cluster.host_cores, as the test bed's processes share 2): then passes,
calls, the orchestrator's cycles and the background work all run on those cores, shared as an OS
shares them (_Cores); background_ms counts only there. A drafting cycle accepts k tokens, drawn by
block position (the j-th drafted token accepted with probability a_j once the ones before it were,
until the first rejection, k ≤ γ: Costs.acceptance_by_position, or α at every position), and
outputs k + 1 (a prefill: 1); the last cycle of a session outputs only what the session still
lacks.

Measuring. Slots start mid-session at uniformly drawn points, their first cycles spread over
a lone cycle (as a cluster in its steady state has them), and the first thousand cycles (eight
per session, where that is more) are thrown away. The window then runs in blocks of cycles
until tokens/s is known to a relative standard error of 0.4 % (batch means: `simulate`). Each
drafting cycle counts the *expected* output given its γ and what its session still lacks,
E[min(k + 1, left)], not the drawn k + 1: the draws still decide when sessions end (so prefills
come as often as they do), but the throughput carries none of their noise (its average is the
same; Rao-Blackwell). With one session that never ends every cycle is alike, and the result is
the renewal-reward closed form exactly (`closed_form_tokens_per_s`). Deterministic for a seed.

A finite load (load_tokens_per_s) runs a given number of sessions instead, the first ones
started together, as a benchmark's client runs them: its tokens/s counts its start and its end.

What it leaves out: KV-cache memory (no session is refused or evicted, however many), the draft's
prefill of the prompt and its catch-up on a session's first draft call, adaptive γ (γ is fixed per
run; the last cycle does not shorten its draft to what the session lacks), token trees, a call's
CPU per row beside the passes (call_ms is per call), network jitter and bandwidth, and failures.
Costs are taken as measured (the fits that tandem's γ policy keeps per worker:
orchestrator/policy.py).
"""

from __future__ import annotations

import heapq
import itertools
import math
import operator
import random
import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields, replace


MAX_GAMMA = 16
# The window (simulate's docstring): cycles thrown away first, and blocks of cycles measured
# until tokens/s is known to PRECISION (relative standard error), or MAX_CYCLES were measured.
WARMUP_CYCLES, WARMUP_PER_SESSION = 1000, 8
BLOCK_CYCLES, BLOCK_PER_SESSION = 500, 4
MIN_BLOCKS = 10
PRECISION = 0.004
MAX_CYCLES = 30_000
MAX_COLD_STEPS = 200  # lone_cycle_ms's fixed point: each step shrinks the error cold_ms / cold_after_ms-fold
# Drafters per verifier the planner tries (up to its maximum, and the maximum itself).
RATIOS = (0.0, 0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)


class InvalidInput(ValueError):
    """A cost or topology out of its range; `field` names it (the CLI names its flag)."""

    def __init__(self, field: str, requirement: str) -> None:
        super().__init__(f"{field} {requirement}")
        self.field, self.requirement = field, requirement


def _require(ok: bool, field: str, requirement: str) -> None:
    if not ok:  # written as a positive test, so NaN fails it
        raise InvalidInput(field, requirement)


@dataclass(frozen=True, kw_only=True)
class Costs:
    """What the work costs, in ms, as measured. A pass is (intercept, slope): intercept + slope ·
    its tokens; or a table of measured passes, ((tokens, ms), …) by tokens, read between its
    points on the line through them (pass_ms): a pass on a CPU is not a line (its matrix kernels
    change with the rows)."""

    draft_pass: tuple
    target_pass: tuple
    alpha: float  # the chance that a drafted token is accepted, i.i.d. (unless acceptance_by_position)
    rtt_ms: float = 0.0  # orchestrator ↔ worker round trip, once per call
    orchestrator_ms: float = 0.0  # orchestrator CPU per cycle, one cycle at a time per replica
    # and per call the cycle made to a drafter (a draft or a draft-ahead call): sending it, taking
    # in its tokens and, sampled, their distributions. Measured on the test bed, alone at 0 ms:
    # 0.15 ms a γ-0 cycle, 0.7–1.0 a drafting one (two calls to the drafter where not drafted
    # ahead); at T = 1, 3.2 at γ = 6 and 5.3 at γ = 8.
    orchestrator_draft_call_ms: float = 0.0
    call_ms: float = 0.0  # a worker's CPU per call outside its passes, beside them
    # A worker's CPU per row of a call that its passes wait for: a CPU worker is one Python process,
    # whose gRPC handling and model thread take turns at the interpreter lock. It is counted in the
    # pass that runs the row's first step; and handling_call_ms more once per call, in the pass that
    # runs its first row's (decoding the request, answering it). Timed on a target worker on the
    # test bed's host, γ = 0 calls of one token a row: 1.4 ms beyond the passes for a call of one
    # row, 2.5 for a call of eight, so a call costs most of it and a row 0.16.
    handling_ms: float = 0.0
    handling_call_ms: float = 0.0
    draft_token_ms: float = 0.0  # and a draft call's per drafted token (its sampling, its distribution)
    # A drafted token's transport, charged at its verify call's end: its distribution's bytes
    # encoded, relayed and decoded from the drafter through the orchestrator to the verifier. On
    # the test bed at T = 1 (a vocabulary's probabilities a token), 0.19 ms; greedy, 0.02.
    wire_token_ms: float = 0.0
    # a_1, a_2, …: the chance that a block's j-th drafted token is accepted, the ones before it
    # accepted (past the last, the last), as tandem's γ policy learns it; None: α at every position.
    # Acceptance is bursty: a block that got far is in text the draft follows.
    acceptance_by_position: tuple[float, ...] | None = None
    # A draft-ahead call's CPU per step besides its pass (None: draft_token_ms). Its chains are one
    # job whose steps are one pass each, whatever the chains: measured, its steps take as long at 2
    # chains as at 9, and at T = 1 longer than a plain draft call's (the guesses' distributions).
    ahead_step_ms: float | None = None
    # CPU per cycle that no call waits for: its tokens streamed to the client (the replica, the
    # ingress's proxy, the client), its commit in Redis's server. It only loads a host's shared cores.
    background_ms: float = 0.0
    # A pass's cost per row past its first (a row: one session's job), beyond its tokens': each row
    # attends over its own cache. Measured on the shipped target, 0.13 ms at a 50-token context and
    # 0.39 at 190: at the test bed's contexts a pass of 8 sessions' tokens cost 1.3× one session's.
    draft_row_ms: float = 0.0
    target_row_ms: float = 0.0
    # What a pass costs more when its worker has been idle: the most (after a long idle), reached
    # as 1 − e^(−idle / cold_after_ms). Timed on the test bed's host (a VM), a one-token pass after
    # 20 ms asleep took 0.8 ms more on the draft model (1.8× its pass) and 1.3 ms more on the
    # target; back to back, nothing more. A lone session's worker idles every cycle, one under
    # load hardly ever.
    draft_cold_ms: float = 0.0
    target_cold_ms: float = 0.0
    cold_after_ms: float = 10.0
    prompt_tokens: int = 128  # a new session's prefill
    max_batch_tokens: int = 512  # the most tokens one pass takes
    # Drafting ahead: how often the draft's guess is the verify's last token, after a full accept
    # (the bonus) and after a rejection it drafted past (the recovered token). None: the γ
    # policy's priors, α and α / 2 (tandem.orchestrator.policy).
    bonus_guess: float | None = None
    recovered_guess: float | None = None

    def __post_init__(self) -> None:
        for name in ("draft_pass", "target_pass"):
            _check_pass(name, getattr(self, name))
        _require(pass_ms(self.target_pass, 1) > 0, "target_pass", "must cost > 0 (intercept + slope)")
        _require(self.ahead_step_ms is None or 0 <= self.ahead_step_ms < math.inf, "ahead_step_ms", "must be >= 0")
        _require(self.acceptance_by_position is None or len(self.acceptance_by_position) >= 1
                 and all(0 <= a <= 1 for a in self.acceptance_by_position), "acceptance_by_position",
                 "must be one or more numbers in [0, 1]")
        for name in ("alpha", "bonus_guess", "recovered_guess"):
            value = getattr(self, name)
            _require(value is None and name != "alpha" or value is not None and 0 <= value <= 1, name,
                     "must be in [0, 1]")
        for name in ("rtt_ms", "orchestrator_ms", "orchestrator_draft_call_ms", "call_ms", "handling_ms",
                     "handling_call_ms", "draft_token_ms", "wire_token_ms", "background_ms", "draft_row_ms",
                     "target_row_ms", "draft_cold_ms", "target_cold_ms"):
            _require(0 <= getattr(self, name) < math.inf, name, "must be >= 0")
        _require(0 < self.cold_after_ms < math.inf, "cold_after_ms", "must be > 0")
        for name in ("prompt_tokens", "max_batch_tokens"):
            value = getattr(self, name)
            _require(isinstance(value, int) and value >= 1, name, "must be an integer >= 1")

    def survival(self, gamma: int) -> list[float]:
        """P(a block's first i drafted tokens are accepted), i = 0 … γ: the products of the
        positions' acceptance (past the last given, the last), or of α at every position."""
        rates = self.acceptance_by_position
        each = (rates[min(j, len(rates) - 1)] if rates else self.alpha for j in range(gamma))
        return list(itertools.accumulate(each, operator.mul, initial=1.0))

    def expected_tokens(self, gamma: int) -> float:
        """E[tokens a cycle outputs | γ]: the accepted ones and the bonus or recovered one."""
        return sum(self.survival(gamma))

    def slowed(self, factor: float) -> Costs:
        """These costs on a processor `factor` times slower: every CPU cost (the passes, the calls'
        handling, the orchestrator's, the background) times it; the round trip, acceptance and
        sizes as they are. A host's speed moves: on the test bed's VM a fixed unit of Python took
        up to 30 % longer from minute to minute (tandem.bench.speed)."""
        _require(0 < factor < math.inf, "factor", "must be > 0")
        scaled = {name: getattr(self, name) * factor for name in _CPU_MS if getattr(self, name) is not None}
        return replace(self, draft_pass=_scaled_pass(self.draft_pass, factor),
                       target_pass=_scaled_pass(self.target_pass, factor), **scaled)

    @classmethod
    def from_fields(cls, values: dict) -> Costs:
        """From a mapping of field names to values, as a JSON object holds them (lists for the
        pass lines); a name that is no field, a missing one or a value of the wrong kind is an
        InvalidInput that names it."""
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise InvalidInput(unknown[0], f"is not a cost (they are {', '.join(known)})")
        missing = [n for n in ("draft_pass", "target_pass", "alpha") if n not in values]
        if missing:
            raise InvalidInput(missing[0], "is missing")
        return cls(**{name: _kind(name, known[name].type, value) for name, value in values.items()})


def _kind(name: str, kind: str, value):
    """A value as its field's type (the dataclass's annotation, a string here): a pass is two
    numbers or pairs of them, a float a number, an int an integer; bools are neither."""
    def number(x) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool)

    if value is None and "None" in kind:
        return None
    if kind.startswith("tuple[float"):
        _require(isinstance(value, (list, tuple)) and all(map(number, value)), name, "must be a list of numbers")
        return tuple(float(x) for x in value)
    if kind == "tuple":
        _require(isinstance(value, (list, tuple)) and value and (
            len(value) == 2 and all(map(number, value))
            or all(isinstance(p, (list, tuple)) and len(p) == 2 and all(map(number, p)) for p in value)), name,
            "must be (intercept, slope), two numbers, or ((tokens, ms), ...), a table")
        if number(value[0]):
            return float(value[0]), float(value[1])
        return tuple((p[0], float(p[1])) for p in value)
    if kind == "int":
        _require(number(value) and math.isfinite(value) and value == int(value), name, "must be an integer")
        return int(value)
    _require(number(value), name, "must be a number")
    return float(value)


def _check_pass(name: str, spec: tuple) -> None:
    if spec and not isinstance(spec[0], (tuple, list)):
        _require(len(spec) == 2 and all(0 <= x < math.inf for x in spec), name, "must be (intercept, slope), both >= 0")
        return
    tokens = [p[0] for p in spec]
    _require(len(spec) >= 2 and all(isinstance(n, int) and n >= 1 for n in tokens)
             and tokens == sorted(set(tokens)) and all(0 <= p[1] < math.inf for p in spec), name,
             "must be a table of two or more (tokens, ms): tokens integers >= 1, ascending, ms >= 0")


# Costs' fields that are CPU time besides the passes (Costs.slowed).
_CPU_MS = ("orchestrator_ms", "orchestrator_draft_call_ms", "call_ms", "handling_ms", "handling_call_ms",
           "draft_token_ms", "wire_token_ms", "ahead_step_ms", "background_ms", "draft_row_ms", "target_row_ms",
           "draft_cold_ms", "target_cold_ms")


def _scaled_pass(spec: tuple, factor: float) -> tuple:
    """A pass's line or table with every ms times `factor`."""
    if not isinstance(spec[0], (tuple, list)):
        return spec[0] * factor, spec[1] * factor
    return tuple((tokens, ms * factor) for tokens, ms in spec)


def pass_ms(spec: tuple, tokens: int) -> float:
    """A pass of this many tokens: on the line (intercept, slope), or on a table's line through
    the measured points on either side of it (past its ends, through its two last or first
    points), never below 0."""
    if not isinstance(spec[0], (tuple, list)):
        return spec[0] + spec[1] * tokens
    i = next((i for i in range(1, len(spec) - 1) if tokens <= spec[i][0]), len(spec) - 1)
    (n0, t0), (n1, t1) = spec[i - 1], spec[i]
    return max(0.0, t0 + (t1 - t0) * (tokens - n0) / (n1 - n0))


def _guess_rates(costs: Costs) -> tuple[float, float]:
    """(bonus_guess, recovered_guess), the policy's priors where not given."""
    return (costs.alpha if costs.bonus_guess is None else costs.bonus_guess,
            costs.alpha / 2 if costs.recovered_guess is None else costs.recovered_guess)


@dataclass(frozen=True)
class Cluster:
    """The topology: workers, orchestrator replicas, and sessions in flight (closed loop)."""

    drafters: int
    verifiers: int
    sessions: int
    replicas: int = 1
    tokens_per_session: int = 256
    # 0: every worker and replica has a processor of its own. n: all of them, passes included,
    # share n cores of one host (a test bed, or CPU workers on one node): _Cores.
    host_cores: int = 0
    draft_ahead: bool = False  # a session alone in its replica drafts ahead (the module's docstring)
    ahead_rejections: int = 0  # … past a rejection at each of a block's first positions too

    def __post_init__(self) -> None:
        for name in ("drafters", "host_cores", "ahead_rejections"):
            value = getattr(self, name)
            _require(isinstance(value, int) and value >= 0, name, "must be an integer >= 0")
        for name in ("verifiers", "sessions", "replicas", "tokens_per_session"):
            value = getattr(self, name)
            _require(isinstance(value, int) and value >= 1, name, "must be an integer >= 1")


@dataclass(frozen=True)
class Prediction:
    """What a cluster does in its steady state, over the measured window."""

    tokens_per_s: float  # all sessions' output
    tokens_per_s_se: float  # its standard error (batch means: simulate's docstring)
    per_session_tokens_per_s: float  # a slot's, prefills included
    ttft_ms: float | None  # mean time to first token (None: no session started in the window)
    ttft_p50_ms: float | None
    ttft_p90_ms: float | None
    cycle_ms: float | None  # mean wall time of a decoding cycle, prefills aside
    drafter_utilization: float | None  # busy fraction, averaged over drafters (None: no drafters)
    verifier_utilization: float
    tokens_per_verify_pass: float
    drafted_ahead_share: float | None  # drafting cycles whose block was drafted ahead (None: none drafted)
    cycles: int  # measured
    window_ms: float


@dataclass(frozen=True)
class Window:
    """How long a run is: warmup_cycles thrown away, then blocks of block_cycles measured until
    tokens/s has a relative standard error within precision or max_cycles were measured."""

    warmup_cycles: int
    block_cycles: int
    precision: float = PRECISION
    max_cycles: int = MAX_CYCLES

    @classmethod
    def for_cluster(cls, cluster: Cluster, precision: float = PRECISION) -> Window:
        """The default: a few cycles per session at least, so that every slot has moved on."""
        return cls(max(WARMUP_CYCLES, WARMUP_PER_SESSION * cluster.sessions),
                   max(BLOCK_CYCLES, BLOCK_PER_SESSION * cluster.sessions), precision)

    def __post_init__(self) -> None:
        _require(self.warmup_cycles >= 0, "warmup_cycles", "must be >= 0")
        _require(self.block_cycles >= 1, "block_cycles", "must be >= 1")
        _require(self.precision >= 0, "precision", "must be >= 0")
        _require(self.max_cycles >= self.block_cycles, "max_cycles", "must be >= block_cycles")


def lone_cycle_ms(costs: Costs, gamma: int) -> float:
    """A decoding cycle's wall time with nothing else in the cluster: γ one-token draft passes,
    a verify pass of γ + 1 tokens, a round trip, a call and its handling per worker call, the
    orchestrator's CPU (and its draft call's); and each worker's first pass of the cycle colder
    for the rest of the cycle, which it idled (cold_ms; the fixed point: each worker idles for the
    other's work, its coldness included)."""
    handling = costs.handling_ms + costs.handling_call_ms  # a call of one row's
    drafter = gamma * pass_ms(costs.draft_pass, 1) + handling if gamma else 0.0  # its passes' work
    verifier = pass_ms(costs.target_pass, gamma + 1) + handling
    warm = (drafter + verifier + gamma * (costs.draft_token_ms + costs.wire_token_ms)
            + (2 if gamma else 1) * (costs.rtt_ms + costs.call_ms)
            + costs.orchestrator_ms + (costs.orchestrator_draft_call_ms if gamma else 0.0))
    # Each worker idles for all of the cycle but its own work: the rest, and the other's coldness.
    draft_cold = target_cold = 0.0
    for _ in range(MAX_COLD_STEPS):  # a contraction: a ms more of idle adds < cold_ms / cold_after_ms
        draft_cold = cold_ms(costs.draft_cold_ms, warm - drafter + target_cold, costs.cold_after_ms) if gamma else 0.0
        colder = cold_ms(costs.target_cold_ms, warm - verifier + draft_cold, costs.cold_after_ms)
        done = abs(colder - target_cold) < 1e-13 * warm
        target_cold = colder
        if done:
            break
    return warm + draft_cold + target_cold


def cold_ms(most_ms: float, idle_ms: float, after_ms: float) -> float:
    """What a pass costs more after its worker idled idle_ms: most_ms · (1 − e^(−idle / after_ms))
    (Costs.draft_cold_ms or target_cold_ms, and cold_after_ms)."""
    return most_ms * -math.expm1(-max(idle_ms, 0.0) / after_ms)


def closed_form_tokens_per_s(costs: Costs, gamma: int) -> float:
    """One session alone on its drafter, verifier and replica, never ending: each cycle takes
    lone_cycle_ms and yields Costs.expected_tokens(γ) on average, so (renewal-reward) tokens/s is
    their ratio."""
    return 1e3 * costs.expected_tokens(gamma) / lone_cycle_ms(costs, gamma)


def _accepted(rng: random.Random, costs: Costs, survival: list[float]) -> int:
    """k, the drafted tokens accepted: P(k >= j) = survival[j], the block's first j accepted, for
    j <= γ (survival: Costs.survival(γ)), by one uniform draw, inverted (i.i.d.: in closed form)."""
    gamma = len(survival) - 1
    if costs.acceptance_by_position is not None:
        u = rng.random()
        return sum(1 for p in survival[1:] if u < p)
    alpha = costs.alpha
    if alpha <= 0.0 or gamma == 0:
        return 0
    if alpha >= 1.0:
        return gamma
    return min(gamma, int(math.log(1.0 - rng.random()) / math.log(alpha)))


# --- the simulation --------------------------------------------------------------------------

_ARRIVE, _PASS_END, _CYCLE_END, _START, _CALL_END, _FORWARD, _REPLY, _BACKGROUND, _HOLD_END, _CORES = range(10)
HOLD_SHARE = 0.5  # a worker holds a pass at most this share of its fixed cost (tandem.services.holding)
_DRAFT, _VERIFY, _AHEAD = range(3)  # what a call is


class _Cores:
    """The CPU that work runs on. With no host (cores == 0) a task has a processor of its own
    and ends `work` ms after it starts. On a host of n cores, all tasks share them as an OS's
    scheduler shares its cores among runnable threads: while k run, each advances at
    min(1, n / k) ms of work per ms (processor sharing), so a pass slows while the other
    worker's pass or the orchestrator's CPU runs beside it. One pending event, stamped with a
    version, stands for the next task to end; a task that starts or ends re-stamps it."""

    __slots__ = ("run", "cores", "tasks", "since", "version")

    def __init__(self, run: _Run, cores: int) -> None:
        self.run, self.cores = run, cores
        self.tasks: list[list] = []  # [work left (ms), event kind, what]
        self.since = 0.0  # when the tasks' work left was last brought up to date
        self.version = 0

    def start(self, work: float, kind: int, what) -> None:
        if not self.cores:
            self.run.at(self.run.now + work, kind, what)
            return
        self.advance()
        self.tasks.append([work, kind, what])
        self.stamp()

    def rate(self) -> float:
        return min(1.0, self.cores / len(self.tasks)) if self.tasks else 1.0

    def advance(self) -> None:
        done = (self.run.now - self.since) * self.rate()
        for task in self.tasks:
            task[0] -= done
        self.since = self.run.now

    def stamp(self) -> None:
        self.version += 1
        if self.tasks:
            soonest = min(task[0] for task in self.tasks)
            self.run.at(self.run.now + max(soonest, 0.0) / self.rate(), _CORES, self.version)

    def ended(self, version: int) -> list[list]:
        """The tasks that end now ([] for a stale stamp), taken off the cores."""
        if version != self.version:
            return []
        self.advance()
        done = [t for t in self.tasks if t[0] <= 1e-9]
        self.tasks = [t for t in self.tasks if t[0] > 1e-9]
        self.stamp()
        return done


class _Call:
    """One batched call: the rows a replica sends a worker in one turn, answered together once
    every row has run (tandem.orchestrator.turns, ProposeBatch and VerifyBatch)."""

    __slots__ = ("worker", "kind", "rows", "left", "handled")

    def __init__(self, worker: _Worker, kind: int, rows: list[tuple[int, int, int]]) -> None:
        self.worker, self.kind = worker, kind  # _DRAFT, _VERIFY or _AHEAD
        self.rows = rows  # (slot, steps, tokens a step)
        self.left = len(rows)  # rows still running
        self.handled = False  # whether a pass has charged its handling_call_ms


class _Worker:
    """A drafter or a verifier: its waiting jobs ([arrival seq, slot, steps left, tokens a step,
    its call, not yet handled]), the pass it runs, and what it did in the window."""

    __slots__ = ("drafts", "cost", "row_ms", "cold_ms", "handling_ms", "handling_call_ms", "cap", "hold_ms",
                 "waiting", "batch", "pass_start", "pass_end", "busy_ms", "passes", "tokens", "answered", "way_round",
                 "holding", "hold_stamp")

    def __init__(self, drafts: bool, costs: Costs) -> None:
        self.drafts = drafts
        self.cost = costs.draft_pass if drafts else costs.target_pass  # a pass's
        self.row_ms = costs.draft_row_ms if drafts else costs.target_row_ms  # and per row past its first
        self.cold_ms = costs.draft_cold_ms if drafts else costs.target_cold_ms  # and at most after an idle
        self.handling_ms = costs.handling_ms  # and per row at its first step
        self.handling_call_ms = costs.handling_call_ms  # and per call at its first row's
        self.cap = costs.max_batch_tokens
        self.hold_ms = HOLD_SHARE * pass_ms(self.cost, 0)  # a share of the pass's fixed cost
        self.waiting: list[list] = []
        self.batch: list[list] | None = None  # None: idle
        self.pass_start = 0.0
        self.pass_end = -math.inf  # when its last pass ended: it starts cold
        self.busy_ms, self.passes, self.tokens = 0.0, 0, 0
        self.answered: dict[int, float] = {}  # slot → when its last row was answered
        self.way_round: dict[int, float] = {}  # slot → how long its last way round took
        self.holding: set[int] | None = None  # the slots a held pass waits for (None: not holding)
        self.hold_stamp = 0  # which hold the pending _HOLD_END ends

    def pick(self) -> int:
        """Move the next pass's jobs from waiting to batch, as tandem.services.batching picks
        them (arrival order, whole steps within the budget, the first always) → its tokens."""
        batch, rest, tokens = [], [], 0
        for job in self.waiting:
            if not batch or tokens + job[3] <= self.cap:
                batch.append(job)
                tokens += job[3]
            else:
                rest.append(job)
        self.batch, self.waiting = batch, rest
        return tokens


class _Run:
    """One simulation: a heap of (time, seq, kind, what) events, handled in time order."""

    def __init__(self, costs: Costs, cluster: Cluster, gamma: int, seed: int) -> None:
        self.costs, self.cluster, self.gamma = costs, cluster, gamma
        self.rng = random.Random(seed)
        self.drafters = [_Worker(True, costs) for _ in range(cluster.drafters)]
        self.verifiers = [_Worker(False, costs) for _ in range(cluster.verifiers)]
        self.replica_busy = [False] * cluster.replicas
        self.replica_queue: list[list[int]] = [[] for _ in range(cluster.replicas)]  # answered slots, in order
        self.cores = _Cores(self, cluster.host_cores)
        self.half_rtt = costs.rtt_ms / 2
        self.survival = costs.survival(gamma)  # P(a block's first i tokens accepted), i = 0 … γ
        # E[min(k + 1, left)] = Σ_{i < left} survival[i] while left <= γ + 1 (the module's docstring).
        self.expected = [0.0, *itertools.accumulate(self.survival)]
        self.heap: list = []
        self.tick = itertools.count().__next__  # ties in time go in the order they were made
        self.now = 0.0
        s = cluster.sessions
        self.left = [0] * s  # tokens the slot's session still lacks
        self.prefill = [False] * s  # whether its next cycle is its prefill
        self.started = [0.0] * s  # when its session began
        self.cycle_start = [0.0] * s
        self.measuring, self.t0 = False, 0.0
        self.cycles, self.output = 0, 0.0
        self.blocks: list[tuple[float, float]] = []  # (output, ms) of each block of the window
        self.block_start = (0.0, 0.0)  # (time, output) where the current block began
        self.ttfts: list[float] = []
        self.cycle_ms_sum, self.steady_cycles = 0.0, 0
        self.to_start: int | None = None  # a finite load's sessions not started yet (None: no end)
        self.ended_at = 0.0  # when a session last ended
        # Drafting ahead: the replicas' sessions in flight, each slot's replies still awaited,
        # whether its cycle drafts ahead and whether its next block is ready.
        self.in_replica = [len(range(r, s, cluster.replicas)) for r in range(cluster.replicas)]
        self.awaiting = [0] * s
        self.ahead = [False] * s
        self.draft_calls = [0.0] * s  # the calls its cycle made to its drafter, each its share of one
        self.ready = [False] * s
        self.guess_rates = _guess_rates(costs)
        self.drafting_cycles, self.ready_cycles = 0, 0

    def at(self, t: float, kind: int, what) -> None:
        heapq.heappush(self.heap, (t, self.tick(), kind, what))

    # -- sessions' cycles

    def send(self, calls: dict[tuple[_Worker, int], list[tuple[int, int, int]]]) -> None:
        """A turn's rows, one batched call per worker and kind, each on its way (half a round trip).
        A call to a drafter costs the replica orchestrator_draft_call_ms once, shared by its rows."""
        for (worker, kind), rows in calls.items():
            self.at(self.now + self.half_rtt, _ARRIVE, _Call(worker, kind, rows))
            if kind != _VERIFY:
                for slot, _, _ in rows:
                    self.draft_calls[slot] += 1 / len(rows)

    def start_cycles(self, slots: list[int]) -> None:
        """The slots' next calls, made in one turn of their replica: a prefill's, γ = 0's or a
        block drafted ahead's verify, else a draft."""
        calls: dict[tuple[_Worker, int], list[tuple[int, int, int]]] = {}
        for slot in slots:
            self.cycle_start[slot] = self.now
            self.draft_calls[slot] = 0.0
            if self.prefill[slot]:
                self.verify(calls, slot, self.costs.prompt_tokens)
            elif self.ready[slot]:
                self.verify(calls, slot, self.gamma + 1, drafted=True)
            elif self.gamma > 0:
                calls.setdefault((self.drafters[slot % len(self.drafters)], _DRAFT), []).append((slot, self.gamma, 1))
            else:
                self.verify(calls, slot, 1)
        self.send(calls)

    def verify(self, calls: dict, slot: int, tokens: int, drafted: bool = False) -> None:
        """A slot's verify row, and with a drafted block, its draft-ahead row when it drafts ahead."""
        calls.setdefault((self.verifiers[slot % len(self.verifiers)], _VERIFY), []).append((slot, 1, tokens))
        self.ahead[slot] = drafted and self.cluster.draft_ahead and self.in_replica[slot % self.cluster.replicas] == 1
        self.awaiting[slot] = 1 + self.ahead[slot]
        if self.ahead[slot]:
            rows = 1 + min(self.gamma, self.cluster.ahead_rejections)  # the bonus's guess, the rejections'
            calls.setdefault((self.drafters[slot % len(self.drafters)], _AHEAD), []).append(
                (slot, self.gamma + 1, rows))

    def row_done(self, call: _Call) -> None:
        """A row's last step ran; once the call's last has, the worker's CPU answers the call."""
        call.left -= 1
        if call.left == 0:
            self.cores.start(self.costs.call_ms + self.drafting_ms(call), _CALL_END, call)

    def drafting_ms(self, call: _Call) -> float:
        """A draft call's CPU besides its passes, per step of each row (a session's job):
        draft_token_ms, or a draft-ahead call's ahead_step_ms; a verify call's, its drafted
        tokens' transport (wire_token_ms each)."""
        if call.kind == _VERIFY:
            return self.costs.wire_token_ms * self.gamma * sum(not self.prefill[slot] for slot, _, _ in call.rows)
        per_step = self.costs.draft_token_ms
        if call.kind == _AHEAD and self.costs.ahead_step_ms is not None:
            per_step = self.costs.ahead_step_ms
        return per_step * sum(steps for _, steps, _ in call.rows)

    def call_end(self, call: _Call) -> None:
        slots = [row[0] for row in call.rows]
        # The replica sends drafted blocks on to their verifiers as soon as it has them, in one turn.
        self.at(self.now + self.half_rtt, _FORWARD if call.kind == _DRAFT else _REPLY, slots)

    def forward(self, slots: list[int]) -> None:
        calls: dict[tuple[_Worker, int], list[tuple[int, int, int]]] = {}
        for slot in slots:
            self.verify(calls, slot, self.gamma + 1, drafted=True)
        self.send(calls)

    def reply(self, slots: list[int]) -> None:
        """Answers reach their replica, whose CPU runs each cycle (turn_ms) once it has all its
        answers (its verify's, and its draft-ahead's): those whose answers came while it was
        busy all at once, next (one turn of its event loop)."""
        done = []
        for slot in slots:
            self.awaiting[slot] -= 1
            if not self.awaiting[slot]:
                done.append(slot)
        if not done:
            return
        replica = done[0] % len(self.replica_busy)
        if self.replica_busy[replica]:
            self.replica_queue[replica].extend(done)
        else:
            self.replica_busy[replica] = True
            self.cores.start(self.turn_ms(done), _CYCLE_END, done)

    def turn_ms(self, slots: list[int]) -> float:
        """The replica's CPU for these cycles: orchestrator_ms each, and orchestrator_draft_call_ms
        per call they made to a drafter (a batched call's rows share it)."""
        costs = self.costs
        return sum(costs.orchestrator_ms + costs.orchestrator_draft_call_ms * self.draft_calls[slot] for slot in slots)

    def end_cycles(self, slots: list[int], window: Window | None) -> bool:
        """The turn's cycles end, and their next calls go out together → whether the window is
        measured (never, with no window: a finite load runs until its last session ends)."""
        replica = slots[0] % len(self.replica_busy)
        if queued := self.replica_queue[replica]:
            self.replica_queue[replica] = []
            self.cores.start(self.turn_ms(queued), _CYCLE_END, queued)
        else:
            self.replica_busy[replica] = False
        if self.costs.background_ms and self.cluster.host_cores:
            self.cores.start(len(slots) * self.costs.background_ms, _BACKGROUND, None)
        going_on = []
        for slot in slots:
            if self.end_cycle(slot):
                going_on.append(slot)
            if window and self.counted(window):
                return True
        self.start_cycles(going_on)
        return False

    def end_cycle(self, slot: int) -> bool:
        """A cycle's output, and a new session where its session has all it wanted → whether
        the slot runs another cycle (not once a finite load has started all its sessions)."""
        self.cycles += 1
        if self.prefill[slot]:
            self.prefill[slot] = False
            self.left[slot] -= 1
            if self.measuring:
                self.output += 1.0
                self.ttfts.append(self.now - self.started[slot])
        else:
            left = self.left[slot]
            if self.measuring:
                self.output += self.expected[min(left, self.gamma + 1)]
                self.cycle_ms_sum += self.now - self.cycle_start[slot]
                self.steady_cycles += 1
                self.drafting_cycles += self.gamma > 0
                self.ready_cycles += self.ready[slot]
            accepted = _accepted(self.rng, self.costs, self.survival)
            self.left[slot] = left - min(left, accepted + 1)
            self.ready[slot] = self.ahead[slot] and self.guessed(accepted)
        if self.left[slot]:
            return True
        self.ended_at = self.now
        self.ready[slot] = False
        if self.to_start == 0:
            self.in_replica[slot % self.cluster.replicas] -= 1
            return False
        if self.to_start is not None:
            self.to_start -= 1
        self.left[slot] = self.cluster.tokens_per_session  # the next session takes the slot at once
        self.prefill[slot] = True
        self.started[slot] = self.now
        return True

    def guessed(self, accepted: int) -> bool:
        """Whether a draft-ahead call guessed the outcome that accepted this many of γ."""
        bonus, recovered = self.guess_rates
        if accepted == self.gamma:
            return self.rng.random() < bonus
        return accepted < self.cluster.ahead_rejections and self.rng.random() < recovered

    def counted(self, window: Window) -> bool:
        """A cycle ended: the window begins after the warmup, or a block of it ends → whether
        the window is measured."""
        if not self.measuring:
            if self.cycles >= window.warmup_cycles:
                self.begin_window()
        elif self.cycles % window.block_cycles == 0:
            self.end_block()
            return self.precise(window.precision) or self.cycles >= window.max_cycles
        return False

    # -- a worker's passes

    def arrive(self, call: _Call) -> None:
        worker = call.worker
        for slot, steps, tokens in call.rows:
            worker.waiting.append([self.tick(), slot, steps, tokens, call, True])
            if slot in worker.answered:
                worker.way_round[slot] = self.now - worker.answered.pop(slot)
            if worker.holding is not None:
                worker.holding.discard(slot)
        if worker.holding == set():  # every session held for has come
            worker.holding = None
            self.start_pass(worker)
        elif worker.batch is None and worker.holding is None:
            self.dispatch(worker)

    def dispatch(self, worker: _Worker) -> None:
        """The worker's next pass, or first a hold for the sessions due back within a share of a
        pass's fixed cost, as tandem.services.holding holds one (so that cohorts meet)."""
        due = set()
        if worker.hold_ms > 0 and sum(job[3] for job in worker.waiting) < worker.cap:
            here = {job[1] for job in worker.waiting}
            due = {slot for slot, at in worker.answered.items() if slot not in here and slot in worker.way_round
                   and abs(at + worker.way_round[slot] - self.now) <= worker.hold_ms}
        if due:
            worker.holding, worker.hold_stamp = due, self.tick()
            self.at(self.now + worker.hold_ms, _HOLD_END, (worker, worker.hold_stamp))
        else:
            self.start_pass(worker)

    def hold_end(self, worker: _Worker, stamp: int) -> None:
        if worker.holding is not None and worker.hold_stamp == stamp:  # still waiting for some
            worker.holding = None
            self.start_pass(worker)

    def start_pass(self, worker: _Worker) -> None:
        tokens = worker.pick()
        worker.pass_start = self.now
        if self.measuring:
            worker.passes += 1
            worker.tokens += tokens
        fresh = [job for job in worker.batch if job[5]]  # rows at their first step
        calls = {job[4] for job in fresh if not job[4].handled}  # and calls at their first row's
        for job in fresh:
            job[5] = False
        for call in calls:
            call.handled = True
        work = (pass_ms(worker.cost, tokens) + worker.row_ms * (len(worker.batch) - 1)
                + worker.handling_ms * len(fresh) + worker.handling_call_ms * len(calls)
                + cold_ms(worker.cold_ms, self.now - worker.pass_end, self.costs.cold_after_ms))
        self.cores.start(work, _PASS_END, worker)

    def end_pass(self, worker: _Worker) -> None:
        worker.pass_end = self.now
        if self.measuring:
            worker.busy_ms += self.now - max(worker.pass_start, self.t0)
        going_on = []
        for job in worker.batch:
            job[2] -= 1
            if job[2]:
                going_on.append(job)
            else:
                worker.answered[job[1]] = self.now
                self.row_done(job[4])
        worker.batch = None
        if going_on:  # back among the waiting in arrival order (most often all older than them)
            waiting = worker.waiting
            worker.waiting = going_on + waiting if not waiting or going_on[-1][0] < waiting[0][0] else sorted(
                going_on + waiting, key=lambda job: job[0])
        if worker.waiting:
            self.dispatch(worker)

    # -- the run

    def seed_slots(self) -> None:
        """Every slot mid-session at a uniformly drawn point (a fresh session where it draws 0),
        its first cycle starting at a uniformly drawn time within a lone cycle: slots that all
        started at once would move as one cohort for thousands of cycles."""
        tokens = self.cluster.tokens_per_session
        spread = lone_cycle_ms(self.costs, self.gamma)
        for slot in range(self.cluster.sessions):
            done = self.rng.randrange(tokens)
            self.left[slot] = tokens - done
            self.prefill[slot] = done == 0
            self.started[slot] = self.rng.random() * spread
            self.at(self.started[slot], _START, slot)

    def begin_window(self) -> None:
        self.measuring, self.t0 = True, self.now
        self.cycles = 0
        self.block_start = (self.now, 0.0)

    def end_block(self) -> None:
        t, output = self.block_start
        self.blocks.append((self.output - output, self.now - t))
        self.block_start = (self.now, self.output)

    def precise(self, precision: float) -> bool:
        """Whether the window's tokens/s has a relative standard error within precision."""
        return (len(self.blocks) >= MIN_BLOCKS
                and self.standard_error() <= precision * self.output / (self.now - self.t0))

    def standard_error(self) -> float:
        """Of the window's tokens per ms, by batch means: the blocks joined into MIN_BLOCKS
        batches of consecutive blocks (longer as the window grows, so that batches outlast the
        cohorts' patterns), whose rates are taken as independent."""
        n = len(self.blocks)
        if n < 2:
            return 0.0
        size = max(1, n // MIN_BLOCKS)
        batches = [self.blocks[i:i + size] for i in range(0, n - n % size, size)]
        rates = [sum(o for o, _ in b) / sum(t for _, t in b) for b in batches]
        return statistics.stdev(rates) / math.sqrt(len(rates))

    def run(self, window: Window) -> Prediction:
        self.seed_slots()
        if window.warmup_cycles == 0:
            self.begin_window()
        self.events(window)
        return self.prediction()

    def run_load(self, sessions: int) -> float:
        """A finite load: the first sessions all fresh and started in one turn → when the last
        of `sessions` ends."""
        slots = self.cluster.sessions
        self.to_start = sessions - slots
        self.left = [self.cluster.tokens_per_session] * slots
        self.prefill = [True] * slots
        self.start_cycles(list(range(slots)))
        self.events(None)
        return self.ended_at

    def events(self, window: Window | None) -> None:
        """Handle events in time order until the window is measured, or (no window) none are left."""
        heap, pop = self.heap, heapq.heappop
        while heap:
            self.now, _, kind, what = pop(heap)
            if kind != _CORES:
                if self.handle(kind, what, window):
                    return
                continue
            for _, kind, what in self.cores.ended(what):  # the tasks that ended now, on shared cores
                if self.handle(kind, what, window):
                    return

    def handle(self, kind: int, what, window: Window | None) -> bool:
        """One event → whether the window is measured."""
        if kind == _ARRIVE:
            self.arrive(what)
        elif kind == _PASS_END:
            self.end_pass(what)
        elif kind == _CALL_END:
            self.call_end(what)
        elif kind == _FORWARD:
            self.forward(what)
        elif kind == _REPLY:
            self.reply(what)
        elif kind == _START:
            self.start_cycles([what])
        elif kind == _HOLD_END:
            self.hold_end(*what)
        elif kind == _CYCLE_END:
            return self.end_cycles(what, window)
        return False

    def prediction(self) -> Prediction:
        window = self.now - self.t0
        for worker in self.drafters + self.verifiers:  # the passes still running count up to now
            if worker.batch is not None:
                worker.busy_ms += self.now - max(worker.pass_start, self.t0)
        tokens_per_s = 1e3 * self.output / window
        ttfts = sorted(self.ttfts)
        verify_passes = sum(v.passes for v in self.verifiers)
        return Prediction(
            tokens_per_s=tokens_per_s,
            tokens_per_s_se=1e3 * self.standard_error(),
            per_session_tokens_per_s=tokens_per_s / self.cluster.sessions,
            ttft_ms=statistics.fmean(ttfts) if ttfts else None,
            ttft_p50_ms=_quantile(ttfts, 0.5),
            ttft_p90_ms=_quantile(ttfts, 0.9),
            cycle_ms=self.cycle_ms_sum / self.steady_cycles if self.steady_cycles else None,
            drafter_utilization=_utilization(self.drafters, window),
            verifier_utilization=_utilization(self.verifiers, window),
            tokens_per_verify_pass=sum(v.tokens for v in self.verifiers) / verify_passes if verify_passes else 0.0,
            drafted_ahead_share=self.ready_cycles / self.drafting_cycles if self.drafting_cycles else None,
            cycles=self.cycles,
            window_ms=window,
        )


def _utilization(workers: list[_Worker], window_ms: float) -> float | None:
    """The workers' mean busy fraction (None: there are none)."""
    return sum(w.busy_ms for w in workers) / (len(workers) * window_ms) if workers else None


def _quantile(ordered: list[float], q: float) -> float | None:
    """The q-quantile of sorted values, interpolated (None when there are none)."""
    if not ordered:
        return None
    x = q * (len(ordered) - 1)
    i = int(x)
    j = min(i + 1, len(ordered) - 1)
    return ordered[i] + (ordered[j] - ordered[i]) * (x - i)


def simulate(costs: Costs, cluster: Cluster, gamma: int, *, seed: int = 0, window: Window | None = None) -> Prediction:
    """The cluster's steady state at a fixed γ, deterministic for a seed.

    One run, measured by batch means: its window is cut into blocks of cycles, and it ends once
    the blocks' tokens/s vary little enough for the window's mean to be known to
    window.precision (relative standard error; 0.4 % by default, so that runs of different seeds
    agree within about 1 %). Sessions sharing workers fall into cohorts that regroup as sessions
    end, and a prefill shakes a pass, so a busy cluster needs a longer window than a quiet one
    (a few thousand cycles alone, tens of thousands where a saturated worker's cohorts keep
    regrouping); max_cycles bounds it, and tokens_per_s_se says how well the window knew its
    rate."""
    _check_gamma(cluster, gamma)
    return _Run(costs, cluster, gamma, seed).run(window or Window.for_cluster(cluster))


def _check_gamma(cluster: Cluster, gamma: int) -> None:
    _require(isinstance(gamma, int) and 0 <= gamma <= MAX_GAMMA, "gamma", f"must be an integer in [0, {MAX_GAMMA}]")
    _require(gamma == 0 or cluster.drafters >= 1, "drafters", "must be >= 1 to draft (gamma > 0)")


def load_tokens_per_s(costs: Costs, cluster: Cluster, gamma: int, sessions: int, *, seeds: int = 32) -> float:
    """A finite load, as a benchmark's client runs one: `sessions` sessions of
    cluster.tokens_per_session tokens, cluster.sessions at a time, the first ones started
    together and each next one as soon as one ends → all their tokens over the time the last
    ends, averaged over seeds 0 … seeds − 1 (a load's time follows its draws of acceptance). Unlike
    the steady state (simulate), it counts the load's start, all its sessions in their prefill at
    once, and its end, as its last sessions run with fewer beside them."""
    _require(isinstance(sessions, int) and sessions >= cluster.sessions, "sessions",
             f"must be an integer >= the sessions in flight ({cluster.sessions})")
    _check_gamma(cluster, gamma)
    tokens = sessions * cluster.tokens_per_session
    return statistics.fmean(1e3 * tokens / _Run(costs, cluster, gamma, seed).run_load(sessions)
                            for seed in range(seeds))


# --- the planner -----------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanRow:
    """One configuration the planner simulated."""

    drafters: int
    verifiers: int
    gamma: int
    gpus: float  # verifiers + draft_gpu_cost · drafters, in verifier GPUs
    prediction: Prediction

    @property
    def drafters_per_verifier(self) -> float:
        return self.drafters / self.verifiers

    @property
    def tokens_per_s(self) -> float:
        return self.prediction.tokens_per_s

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.prediction.tokens_per_s / self.gpus

    def as_dict(self) -> dict:
        return {"drafters": self.drafters, "verifiers": self.verifiers,
                "drafters_per_verifier": self.drafters_per_verifier, "gamma": self.gamma, "gpus": self.gpus,
                "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu, **asdict(self.prediction)}


@dataclass(frozen=True)
class Plan:
    """Every configuration simulated, the best γ for each drafter count, and the recommendation."""

    rows: tuple[PlanRow, ...]
    best_per_ratio: tuple[PlanRow, ...]  # per drafter count (ascending), its γ with the most tokens/s
    recommended: PlanRow  # the most tokens/s per GPU

    def as_dict(self) -> dict:
        return {"recommended": self.recommended.as_dict(),
                "best_per_ratio": [r.as_dict() for r in self.best_per_ratio],
                "rows": [r.as_dict() for r in self.rows]}


def drafter_counts(verifiers: int, max_drafters_per_verifier: float) -> list[int]:
    """The drafter counts to try: 0, then round(ratio · verifiers) (at least 1) for each of
    RATIOS up to the maximum, and the maximum itself; each count once."""
    ratios = [r for r in RATIOS if 0 < r <= max_drafters_per_verifier]
    if max_drafters_per_verifier > 0:
        ratios.append(max_drafters_per_verifier)
    counts = [0]
    for ratio in ratios:
        n = max(1, round(ratio * verifiers))
        if n not in counts:
            counts.append(n)
    return sorted(counts)


def plan_cluster(costs: Costs, sessions: int, verifiers: int, max_drafters_per_verifier: float = 2.0,
                 gammas: Iterable[int] = range(0, 9), replicas: int = 1, *, draft_gpu_cost: float = 1.0,
                 tokens_per_session: int = 256, host_cores: int = 0, draft_ahead: bool = False,
                 ahead_rejections: int = 0, seed: int = 0, precision: float = PRECISION) -> Plan:
    """Simulate every drafter count (drafter_counts) with every γ > 0 of gammas, and plain target
    decoding once, with no drafters (γ = 0 would leave drafters idle, so it is not tried with
    them, whatever gammas holds); recommend the configuration with the most tokens/s per GPU,
    drafters weighed by draft_gpu_cost (the fewest GPUs, then the shortest γ, on a tie). Every
    run has the same seed."""
    gammas = sorted(set(gammas))
    _require(bool(gammas) and all(isinstance(g, int) and 0 <= g <= MAX_GAMMA for g in gammas), "gammas",
             f"must be integers in [0, {MAX_GAMMA}]")
    _require(max_drafters_per_verifier >= 0, "max_drafters_per_verifier", "must be >= 0")
    _require(draft_gpu_cost >= 0, "draft_gpu_cost", "must be >= 0")
    rows = []
    for drafters in drafter_counts(verifiers, max_drafters_per_verifier):
        cluster = Cluster(drafters, verifiers, sessions, replicas, tokens_per_session, host_cores, draft_ahead,
                          ahead_rejections)
        for gamma in ([0] if drafters == 0 else [g for g in gammas if g > 0]):
            prediction = simulate(costs, cluster, gamma, seed=seed, window=Window.for_cluster(cluster, precision))
            rows.append(PlanRow(drafters, verifiers, gamma, verifiers + draft_gpu_cost * drafters, prediction))
    best_per_ratio = [max((r for r in rows if r.drafters == drafters), key=lambda r: (r.tokens_per_s, -r.gamma))
                      for drafters in sorted({r.drafters for r in rows})]
    recommended = max(rows, key=lambda r: (r.tokens_per_s_per_gpu, -r.gpus, -r.gamma))
    return Plan(tuple(rows), tuple(best_per_ratio), recommended)


def plot_plan(plan: Plan, path: str) -> None:
    """tokens/s against drafters per verifier, a line per γ (plain decoding a dashed level), the
    recommendation marked; to a PNG. matplotlib is the bench extra's, so it loads only here."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drafters = sorted({r.drafters for r in plan.rows})  # one count per ratio: the verifiers are fixed
    where = {count: i for i, count in enumerate(drafters)}  # evenly spaced: the ratios double
    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    for gamma in sorted({r.gamma for r in plan.rows if r.gamma > 0}):
        line = sorted((r for r in plan.rows if r.gamma == gamma), key=lambda r: r.drafters)
        ax.plot([where[r.drafters] for r in line], [r.tokens_per_s for r in line], marker="o",
                label=f"γ = {gamma}")
    for r in plan.rows:
        if r.gamma == 0:
            ax.axhline(r.tokens_per_s, color="gray", linestyle="--", label="γ = 0 (no drafters)")
    best = plan.recommended
    ax.plot([where[best.drafters]], [best.tokens_per_s], marker="*", markersize=18, color="black",
            linestyle="none", label=f"recommended: {best.drafters} drafters, γ = {best.gamma}")
    ax.set_xticks(range(len(drafters)), [f"{d}/{best.verifiers}" for d in drafters])
    ax.set_xlabel("drafters / verifiers")
    ax.set_ylabel("tokens/s")
    ax.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)

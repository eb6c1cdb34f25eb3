"""The adaptive γ policy: what the work costs, measured once per replica (`PoolCosts`), and each
session's acceptance (`GammaPolicy`, whose state lives in Redis).

It picks γ in [0, γ_max] to maximize expected tokens per millisecond of the cluster's time,

    S(γ) = E[tokens | γ] / (the cluster's time per cycle at γ),

that time worked out from every cost measured as the sessions run (The load, below), and
E[tokens | γ] = Σ_{i=0..γ} P(the block's first i tokens accepted) = Σ_i Π_{j≤i} a_j, a_j the
acceptance at a block's position j given the ones before it. With i.i.d. acceptance (a_j = α)
that is (1 − α^(γ+1)) / (1 − α) (Leviathan et al. 2023, eq. 1), where the policy starts; it then
learns a_j. Acceptance is bursty: measured on the shipped pair (greedy, blocks of 8), a_j was
0.70, 0.68, 0.66, 0.80, 0.85, 0.88, 0.93, 0.95 (a block that has got far is in text the draft
follows). The i.i.d. form at those blocks' α (0.75, accepted over verified tokens) puts E 11 %
too high at γ = 4 and 6 % at γ = 8: it overvalues short blocks against long ones, whose last
tokens add more than α^j.

Every session chooses with the replica's acceptance (`PairAcceptance`: what every session's
cycles have shown of this draft against this target, overall and per block position, fading
0.2 % a block observed, so that it follows the pair and the mix of texts over some 500 blocks).
A session's own last blocks say little of its next one: on the test bed (the shipped pair, the
held-out prompts) they predicted its next block's accepted tokens with a correlation of 0.13. A
session's α on its own evidence fading 10 % a cycle (on the replica's, worth 8 verified tokens)
moved between 0.31 and 0.75 within a stream, over γ 1–4 whose S differed by 13 % (the median),
so its choices followed noise: alone at 0 ms, greedy, it served 0.88–0.92× the best fixed γ's
tokens/s, and 0.95–0.98× choosing with the replica's α (at 1 ms, T = 1: 0.93× and 0.97–1.00×);
with the replica's fading 2 % a cycle, 0.92–0.94×. Over the whole test bed's sweep, adaptive's
worst point went from 0.91× the best fixed γ to 0.94× alone, and from 0.89× to 0.93× at 8 in
flight (benchmarks/README.md). Alone, on a weak fixed prior, two blocks rejected at their first
token took α from 0.6 to 0.3 and held a session at γ = 0 for most of its stream across a 20 ms
link, where the draft was right two times in three. What this gives up: a session whose text
the draft cannot follow, among sessions whose text it can, drafts the replica's γ where γ = 0
would serve it better.

γ = 0 is plain target decoding; while it wins, every `probe_every` cycles one cycle drafts
anyway, so a stale α can recover. A probe after which γ = 0 still wins doubles the session's
wait for the next one (up to MAX_PROBE_GAP cycles): where drafting does not pay, probes cost
what they cannot win back, and more than a drafting cycle's work: a probe after a long γ-0
streak catches the draft up on every token since its last (with the verifier's head under load,
up to 64 cycles between probes cost adaptive 0.91× γ = 0 while it held γ = 0; up to 256, 0.99×).
A probe after which drafting wins brings the wait back to `probe_every`. It was "accepted a
token" once: at T = 1 nearly every probe does, and cohorts probed every 8 cycles at the
verifier's head, where drafting did not pay: with the choice held at γ = 0 (probes only), 0.91×
γ = 0's tokens/s then, 1.01× now. A draft call answered with no block (an n-gram lookup without
a match) is a block rejected at its first token (tandem.orchestrator.cycle): taught as a γ-0
cycle, it left the wait as it was, and every cycle after the first probe drafted in vain.
Sessions that share passes probe together (Cohorts, below). α is learned along the accepted
path, whatever the draft's shape (a token tree's is a path γ deep).

γ = 0 teaches nothing of the draft, so an estimate that fell below what drafting needs would stand:
an option that disappointed is not tried again, so its estimate is not corrected (the hot stove;
Denrell and March 2001). So alone, γ = 0 wins only where it wins at an α `hope` standard errors
higher (the replica's error on all the tokens it has verified), and where γ = 0 wins at the
estimate alone, the cycle drafts what the hopeful α is worth: a young replica drafts on where its α
is within its error of paying, and the hope fades as it learns the pair. Without it, alone across
20 ms, a fresh replica's first streams put its α at 0.39–0.43 on a few dozen verified tokens, where
drafting broke even at 0.41, and sessions held γ = 0 for 7 to 33 cycles at a time (each probe that
did not lift α far enough doubled the wait) where fixed γ = 6 served 1.45× γ = 0; with it, one
streak of 6 cycles in two runs, and adaptive served 0.96× the best fixed γ paired over 4 rounds
(0.94–0.95× before). Sessions that share passes choose at the estimate: their cohorts probe
together on the replica's schedule (Cohorts, below), and with the n-gram on held-out code at 8 in
flight, where the policy rates drafting within 2–5 % of γ = 0, hope had them draft at a mean γ of
0.3–0.8 and serve 0.88–0.93× γ = 0 (0.95× without).

Drafting ahead (tandem.orchestrator.cycle: alone, the draft worker drafts the next block while the
target verifies this one) saves the next cycle's draft call when the verify ends as one of its
guesses did: the whole block accepted and the bonus token guessed (P_γ · g, P_i the chance that
a block's first i tokens are accepted, g the replica's measured rate of right guesses after a
full accept), or, past rejections, the block rejected at one of its first `ahead_rejections`
positions and the recovered token guessed ((1 − P_min(γ, R)) · h, h the replica's rate of right
guesses after a rejection there, a reply that drafted no guess there a miss: an n-gram lookup
drafts past the whole block only). A γ-0 cycle's verify drafts ahead too when the next cycle
would draft (the first cycle's: the prompt's prefill). Across a network that call
is a round trip; charging it to every drafting cycle made γ = 0 look better than it was.

Drafting ahead's wait. The verdict can come back before the draft-ahead call does: the call drafts
γ + 1 steps under each of its guesses (1 + min(γ, ahead_rejections) rows a step) where the verify
is one pass, and the loop waits for it (a session has one draft call in flight). On the test bed
at 0 ms (the shipped pair, 8 rejections) that wait was nothing at γ = 3 and 6.5–12 ms (medians)
at γ 6–8 with T = 1, 0.1 and 1.7 ms greedy. Learned as latency, a line in γ over the γs a session
drafted, it was spread over every γ as a slope: a lone session there mixed γ 2 and 5 (the
target's 6-token pass costs what its 5-token one does) and served 0.89× the best fixed γ over six
rounds. So the policy learns the wait per γ, apart from the latency (`PoolCosts.ahead_wait`, a
decayed mean from none, so that a stray slow call moves it a tenth of the way), and charges a
cycle that drafts ahead the most measured at its γ or below: the call's work grows with γ faster
than the verify's, so a longer block waits at least as long. Over six rounds there, 0.96× (γ = 5
in 25 of 788 cycles, from 291 of 747), and 1.07× γ = 0, from 0.99×.

Chain or tree (draft shape "auto"): the policy keeps, per shape, the decayed output tokens and
cost of its drafting cycles, and drafts the shape that has given more tokens per millisecond,
trying the other one every `probe_every` cycles so that its measure stays current. Cycles that
prefill a worker do not count.

The load. The workers batch: one forward pass runs the steps of every session waiting for it,
and costs about intercept + slope · (its tokens, all sessions'), or what the worker's timed curve
says (The passes' shape, below). The workers say, per call, which passes it ran in
(tandem.wire.worker.Batching); the policy fits that line per worker, and
charges the session its share of a pass: intercept / (sessions in the pass) + slope · (its own
tokens), so that the shares of a pass sum to the pass. A cycle's work so falls on three
stations, each of which runs one thing at a time (`PoolCosts.stations`):

    verifier(γ) = verify intercept / verify sessions + verify slope · (γ + 1) + verify call(γ)
    drafter(γ) = γ · (draft intercept / draft sessions + draft slope) + draft call(γ)  (γ > 0; times
                 the chance that the block was not drafted ahead, alone; the verifier's work
                 where the verifier drafts, with its head)
    replica(γ) = orchestrator CPU(γ)

and its latency(γ) uses none of them (below). The sessions in flight cycle through the stations
as a closed network, and the policy maximizes E[tokens | γ] times the network's cycles per ms,
by exact mean-value analysis (`closed_loop_ms`; the sessions are the loop's in flight, or as
many as the verifier's passes hold where that is more). Alone that is E / (work + latency), the
session's own speed, and γ rightly climbs to amortize the latency. With many sessions the
busiest station's queue hides the latency and S tends to E / that station's work per cycle:
drafting pays when the draft's tokens are accepted often enough to beat what verifying them
(and drafting them, where the verifier drafts) costs the busiest station, while a draft
worker's steps run on a device of its own. Between the two the analysis has the knee, where
queueing begins.

The cluster's time is what the work uses, not what it waited for. A pass costs its device's
time (the workers' Batching.cost_ms: CPU time on a CPU, wall time on an accelerator). A call
costs its worker's CPU outside the passes (Batching.handling_ms) and the orchestrator's CPU
(tandem.cpu: its CPU per event, each worker call and the rest of a cycle being one; a drafting
cycle pays one event more, the draft call's, which a per-cycle average had spread over γ-0
cycles too). Time a call waited for other sessions' passes, for the orchestrator's event loop
or for a core is nobody's cost (the others' shares count their work); charged as wall time it
was most of a cycle at 64 sessions on 2 cores, and made γ climb to amortize a cost that was not
there (adaptive γ fell below γ = 0 there).

Latency (what a cycle's calls and orchestration took beyond their CPU: the network, waits for
the loop or a core) uses no station: it is the time a session spends away from them. Charged as
a pass's intercept is, shared by the sessions of a verify pass, it priced the verifier's head at
T = 1 on the test bed (0 ms, 8 in flight) as drafting's: in a drafting regime a cycle waited
6.9 ms beyond its CPU, against γ = 0's 2.6 (the event loops at both ends, not the network), and
the latency line, flat at the drafting regime's, priced γ = 1 and 2 at 1.11–1.15× γ = 0 where
they served 0.83–0.87×; adaptive served 0.87× γ = 0. In the closed network the verifier's queue
hides it, and adaptive holds γ = 0 there (benchmarks/README.md, "The policy under load").

A round's sessions choose from one answer (`PoolCosts.memo`, kept until the replica has
observed as many cycles as sessions are in flight, or as it had observed when it worked the
answer out: one made of a fresh replica's first cycle held for 32 more cycles). Under load a
cohort's sessions run their cycles one after another in one turn of the replica's event loop,
so a choice's CPU holds the turn's calls once per session: at 0.1 ms a choice (the analysis for
every γ), the turn took 0.8 ms more at 8 in flight, and adaptive served 0.90× γ = 0 holding
γ = 0.

The start. Until the draft is measured, a drafting cycle is priced from the closed form: its
acceptance i.i.d. at the replica's α (the prior's, before any block), the draft's work none (a
device of its own) and the draft call's latency the verify call's (the same network's round
trip: `PoolCosts.stations`). So a fresh replica drafts long blocks where the round trip is long,
and the verifier's cost per token decides where it is short; its first steady drafting call
measures the draft. Before the verifier is measured too, a session drafts initial_gamma alone,
and with others in flight runs γ = 0, which measures it. Started as the head's replica is
(below), a fresh replica's first cohort ran γ = 0 and short blocks for the first 1.5 s of a 19 s
run across 20 ms at 8 in flight (its one-token probe measured the draft amid the cohort's
catching up), where γ = 8 served 1.40× γ = 0; seeded, it drafts from its first steady round.
Where the verifier drafts (its head), the drafting is the busiest station's own work, which nothing
measured prices, and a start at initial_gamma held the head at γ 2–3 for the first second of a
fresh replica at 0 ms, where γ = 0 is best. So there it runs γ = 0 for its first probe_every
rounds of steady cycles (`CohortProbes.steady`), then a probe of one token until the draft's
costs are measured.

The opening. A stream's first drafted blocks are its hardest: on the shipped pair (greedy, the
held-out prompts, 8 in flight) a block's first token was accepted 0.42 of the time in a stream's
first block, 0.50 in its second and 0.72 from its sixth on, and teacher-forced, without a cluster,
the draft's greedy token was the target's at 0.46–0.62 of a stream's first six tokens against 0.65
after (the text, not the cycle). So the replica's acceptance learns nothing from a stream's first
`opening_blocks` blocks; drafting ahead's rates of right guesses count every block. A fresh
replica's first cohort has every stream at its opening: learning from them, its α fell from the
prior's 0.6 to 0.27–0.33, and γ = 0 then held those streams for 8 to 40 of their cycles (15–30 % of
a 48-stream run's cycles at γ = 0 where fixed γ = 3 was best; 3–14 % now).

Cohorts. Under load, sessions move together: those answered together run their cycles in one turn
and send their next calls as one batched call (tandem.orchestrator.turns), which a draft worker
answers once its longest block is drafted. A session's cycle then lasts as long as its cohort's,
whatever its own γ: one that drafts less than the others gives up tokens without saving the time
its share of the passes says it saves, and one at γ = 0 splits off into a verify pass of its own.
Sessions that share the verifier's passes (more than SHARED_PASS sessions per pass), choosing with
the replica's acceptance, choose the same γ: the one that maximizes the cohort's expected tokens
over its time, as a batch-wide γ does (vLLM's fixed γ, SmartSpec's per-batch goodput). Choosing
each with its own α, 8 sessions in flight on the test bed output 2.33 tokens per cycle at a mean γ
of 3.06, against 2.53 at γ = 3 for all, in cycles as long. They probe together too (CohortProbes),
on the replica's schedule rather than each on its own streak: a session that probes alone lags its
cohort by a draft call and splits off into passes of its own. With n-gram drafts on held-out code
(γ = 0 best) at 8 in flight, sessions probing alone held the verifier's passes at 6.3–6.7 sessions
against γ = 0's 7.5–7.9 and served 0.78–0.95× its tokens/s; probing together, 0.99×. A probe lasts
the turn it began in: where the verifier drafts, a session chooses its next γ as it sends the
verify that drafts it, before its probe's outcome is back, and a probe held due until then ran two
rounds of the cohort (16 drafting cycles at 8 in flight, 8 now).

The cohorts' γ: the shortest within the best's error, kept. Around its best a cohort's S(γ) is
flat: on the test bed at 8 in flight, fixed γ = 2 to 6 served within 3–5 % of each other at 0–5
ms, while the replica's E[tokens | γ] moved 3–5 % between snapshots of one run, most at long γ,
whose far positions the fewest blocks reach. Its best γ was then the one whose estimate came out
highest (the optimizer's curse; Smith and Winkler 2006): the cohorts drafted a mean γ of 4.6–6.9
where 3–4 was best, and their γ moved from round to round. So sessions that share passes draft
the shortest block whose S is within one standard error of the best's (the one-standard-error
rule; Breiman et al. 1984), E's error carried from each position's acceptance, a binomial share
of the blocks that reached it (`GammaPolicy.expected_error`: some 2–4 % of E at γ 4–8 on a run's
blocks), and keep that γ while its S stays within the error (`CohortProbes.gamma`). Over the
test bed's loaded sweep adaptive went from 0.93–0.99× the best fixed γ (3 of 8 points within 5 %,
their mean 0.956×) to 0.92–1.03× (6 of 8, mean 0.975×); at 20 ms, where S still climbs at γ 6–8,
the rule drafts a little short (greedy 0.94×, its mean γ 6.4 where γ = 8 is best). Alone a
session drafts the best: its γ splits no cohort.

Each arm at its own fill. A drafting cohort's round is a verify pass and a drafting one (a draft
worker's, or the verifier's own head steps), and cohorts that reached the workers a pass apart
stay apart; at γ = 0 a round is one verify call a session, and the cohorts' verifies line up in
one pass. So where sessions share passes, γ = 0's share of the verify pass is priced at the most
sessions the verifier's passes have held lately (`PoolCosts.verify_full`, a maximum that fades
1 % a cycle observed), drafting's at the passes as measured. Priced both at the drafting
regime's fill, γ = 0 lost to drafting that served less: the verifier's head at T = 1, 8 in flight
on the test bed, its passes holding 5.9–6.6 sessions drafting and 7.3–7.6 at γ = 0, adaptive
served 0.86× γ = 0's tokens/s at a mean γ of 1.7.

A call's costs besides the passes (its worker's CPU, the orchestrator's, its latency) are lines
in γ too: sampled, every drafted token brings its distribution (the vocabulary's probabilities)
through the draft worker, the network, the orchestrator and the verifier. Learned as one number
per call, they made long blocks look cheap at T = 1.

The passes' shape. A line in tokens fits a loaded pass (24–72 tokens at 8 in flight on the test
bed, where the shipped target's passes grow about 0.27 ms a token) but not a lone session's: on a
CPU a pass's cost per token falls as it grows (the shipped target timed alone: 5.0, 6.3, 7.2, 8.2
and 9.0 ms for 1–5 tokens, 10.2 for 9, 11.5 for 16), and fitted over the 3–4-token passes of a
session drafting γ 2–3, the line's slope (1.0–2.3 ms a token, traced) priced γ = 8's pass 3–9 ms
above its cost. So each worker times its pass at a ladder of token counts when it loads
(tandem.services.pass_curve, ModelInfo.pass_ms), and the policy prices a pass along that curve,
scaled to the speed its live passes run at (their mean ratio to it: `PassCost`); where a worker
timed none (an n-gram lookup) the line stands. A scale, not an excess: what slows a live pass
(the host's other processes on its cores and caches) slows each of its tokens. Traced at 8 in
flight on the test bed (0 ms, greedy), the verifier's batched passes ran 1.2–1.8× its curve (the
other core busy with the draft worker, Ray's processes and the proxies), and the fixed γs'
verifier CPU per cycle grew 0.3–0.8 ms a γ; moved by their excess, the curve priced each token at
its idle 0.27 ms. Scaled, the cohorts drafted about one token shorter over the loaded sweep (mean
γ 4.6–4.8 greedy at 5 ms where 5.5, 2.8–3.9 at T = 1 at 0–1 ms where 3.0–4.6), and adaptive
served 0.92–1.02× the best fixed γ paired per round, 7 of 8 points within 5 % (0.90–1.04×, 5 of
8, before); greedy at 0 and 1 ms they still held γ = 4, level with γ = 3 at 0 ms and 6–7 % short
of it each round at 1 ms. And the lines of a call's costs in γ are
fitted over the γs the sessions drafted, a narrow range alone, where their slopes are mostly
noise, and noise clamped at zero from below only ever raises a slope: a replica's orchestrator
CPU, flat in γ greedy, was fitted at 0.75 ms a γ over γ 1–2. So their slopes are shrunk by their
own error (positive-part James–Stein: `LinearFit.line(shrunk=True)`). Traced alone at 0 ms
greedy, the policy's cycle grew 2.6 ms a γ from γ = 2 to 4 where fixed γ's cycles grew 1.35 ms;
with both, 1.8–1.9. Over six rounds alone, greedy, adaptive served 0.95× and 0.98× the best fixed
γ at 1 and 5 ms (mean γ 3.1–3.6 and 4.1–5.6, where γ = 3 and 6 are best), against 0.93× and 0.94×
before (mean γ 1.8–2.9 and 2.4–4.4).

Costs are the pools', not the session's: a pass costs what it costs whoever's rows it carries. So a
replica keeps one `PoolCosts`, fed by every session's cycles and read by every session's choice,
and a session stores only what is its own (its probes' streak and wait, its shapes' rates, its
blocks so far): a few numbers, not the fits. A new or resumed session chooses from what the replica
has measured.

Worker costs are learned from steady cycles only. A call that feeds a worker more committed
tokens than a steady cycle does (the prompt's prefill, a re-prefill after a cache miss, the
draft catching up on the tokens of γ = 0 cycles) costs what no steady cycle will; charged per
drafted token, a probe's catch-up made drafting look dear and kept sessions at γ = 0. So a probe
whose draft caught up goes on through one more cycle (a cohort's probe: through the turn after),
whose steady call measures the draft, and that cycle's outcome is the probe's. And the draft's
costs fade while it does not draft (each γ-0 cycle ages them as an observed cycle does:
`LinearFit.fade`), so that the first steady call after a streak outweighs what came before it.
Without both, a replica at γ = 0 kept the draft's costs of its last drafting cycle for good, and
judged every probe by them: greedy with the hybrid drafter at 8 in flight, a fresh replica's
start measured the draft amid the sessions' prefills (the draft worker's CPU 3.9 ms a call where
a steady one costs 0.3 to 0.5, its latency 9.5 ms where 2 to 5), and 2 runs of 4 held γ = 0 for
most of their streams (0.80 and 0.81× fixed γ = 3).
"""

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cache, partial
from itertools import accumulate

from tandem.math.acceptance import verified_tokens
from tandem.math.fit import LinearFit, PassCost, PassCurve
from tandem.wire.worker import Batching

# Committed tokens a steady cycle feeds: the draft gets the recovered or bonus token, and the
# block's last token too after a full accept; the verifier gets the recovered or bonus token.
STEADY_DRAFT_FED = 2
STEADY_VERIFY_FED = 1
# The longest wait, in γ-0 cycles, for a probe after probes that did not make drafting win.
MAX_PROBE_GAP = 256
# Blocks' worth of the pair's overall acceptance behind each position's.
POSITION_WEIGHT = 4.0
# Sessions per verify pass above which sessions draft as a cohort (the module's docstring).
SHARED_PASS = 1.5
# The busiest station's utilization past which more sessions only queue (closed_loop_ms).
SATURATED = 0.99
# What is a session's own (stored with it, forgotten by a new one): its probes' streak and wait,
# its shapes' rates (tokens per ms) and its drafted blocks so far.
SESSION_STATE = {"zero_streak": 0, "probe_gap": 0, "chain_tokens": 0.0, "chain_ms": 0.0, "tree_tokens": 0.0,
                 "tree_ms": 0.0, "last_tree": False, "shape_streak": 0, "blocks": 0}
# A stream's first drafted blocks, which the replica's acceptance does not learn from (the module's
# docstring, The opening).
OPENING_BLOCKS = 2


@dataclass
class CycleCosts:
    """What one cycle measured, in milliseconds (zeros for a γ-0 cycle's draft)."""

    gamma: int
    accepted: int
    draft_cost_ms: float  # the draft call's work in its device's time (Batching.cost_ms)
    draft_call_ms: float  # the draft worker's CPU per call besides (Batching.handling_ms)
    verify_cost_ms: float
    verify_call_ms: float
    overhead_ms: float  # the orchestrator's CPU per cycle, its draft call's aside
    draft_overhead_ms: float = 0.0  # the orchestrator's CPU for the draft call
    draft_latency_ms: float = 0.0  # the draft call's wall time beyond its work and CPU
    latency_ms: float = 0.0  # the verify call's and the orchestration's, likewise
    drafted_ahead: bool = False  # the block was drafted during the last verify: no draft cost here
    guessed: bool | None = None  # after a full accept with a draft-ahead: whether it guessed the bonus
    recovered: bool | None = None  # after a rejection it drafted past: whether it guessed the recovered token
    tree: bool = False  # the draft was a token tree γ deep (gamma: its depth)
    wall_ms: float = 0.0  # the cycle's wall time, up to its commit
    ahead_wait_ms: float = -1.0  # its wait for its draft-ahead call after the verdict (-1: none answered)
    draft_fed: int = 1  # committed tokens each call fed its worker besides the block
    verify_fed: int = 1
    # The passes each call ran in; None (or no passes) means alone, one pass per step.
    draft_batching: Batching | None = None
    verify_batching: Batching | None = None


@dataclass
class PoolCosts:
    """What a cycle's work costs the cluster, from the cycles of every session of a replica."""

    decay: float = 0.9  # per cycle observed: older measurements fade so the costs follow the load
    # Sessions per draft pass: a flat line at x = 0 is their decayed mean, and it fades as the
    # draft's other fits do.
    draft_fill: LinearFit = field(default_factory=LinearFit)
    verify_sessions: float = -1.0  # sessions per verify pass
    # The most sessions a verify pass has held lately (a decayed maximum): γ = 0's fill where
    # sessions share passes, its cohorts' verifies lining up in one pass (the module's docstring).
    verify_full: float = -1.0
    full_decay: float = 0.99
    drafts_on_verifier: bool = False  # the verifiers draft (their head): drafting's work is theirs
    seen: int = 0  # cycles observed
    # cycles_ms's last answer without drafting ahead: ((top, sessions), seen then, the cycles).
    memo: tuple | None = field(default=None, init=False, repr=False, compare=False)
    # Each worker's cost of one pass against the tokens it ran (every session's).
    draft_pass: PassCost = field(default_factory=PassCost)
    verify_pass: PassCost = field(default_factory=PassCost)
    # A call's costs besides its passes, against γ (the module's docstring): sampled, they grow
    # with the drafted tokens' distributions.
    draft_call: LinearFit = field(default_factory=LinearFit)  # the draft worker's CPU (handling_ms)
    draft_overhead: LinearFit = field(default_factory=LinearFit)  # the orchestrator's CPU for it
    draft_latency: LinearFit = field(default_factory=LinearFit)  # its wall time beyond work and CPU
    verify_call: LinearFit = field(default_factory=LinearFit)
    overhead: LinearFit = field(default_factory=LinearFit)  # the orchestrator's CPU per cycle, draft call aside
    latency: LinearFit = field(default_factory=LinearFit)
    # Per γ, a lone cycle's wait for its draft-ahead call after the verdict (decayed mean, from 0).
    ahead_wait: dict[int, float] = field(default_factory=dict)

    @property
    def draft_sessions(self) -> float:
        """Sessions per draft pass (decayed; -1: not yet)."""
        return self.draft_fill.at(0.0) if self.draft_fill.n else -1.0

    @property
    def priced(self) -> bool:
        """Whether a cycle can be priced: the verifier's passes measured, and the draft's too where
        the verifier drafts (a draft worker's are seeded until then: the module's docstring, The
        start)."""
        return self.verify_pass.n > 0 and (self.draft_pass.n > 0 or not self.drafts_on_verifier)

    @property
    def shared(self) -> bool:
        """Whether sessions share the verifier's passes: the load at which they draft as cohorts."""
        return self.verify_sessions > SHARED_PASS

    def draft_ms_per_token(self) -> float:
        """A session's share of one draft step."""
        sessions = max(self.draft_sessions, 1.0)
        return self.draft_pass.at(sessions) / sessions

    def verify_ms(self, gamma: int, sessions: int | None = None) -> float:
        """A session's share of the verify pass of a γ-token block (sessions: as for fill)."""
        fill = self.fill(gamma, sessions)
        return self.verify_pass.at(fill * (gamma + 1)) / fill

    def fill(self, gamma: int, sessions: int | None = None) -> float:
        """The sessions a verify pass of a γ cycle is shared by: as measured, or at γ = 0 where
        sessions share passes, the most they have held lately, but no more than `sessions` (those
        in the loop, where given): as a run's last streams end, its passes held 4.7 lately where 2
        were left, and γ = 0, priced at 4.7, held the last stream for 40 cycles at 1 ms, where
        alone drafting serves 1.3× γ = 0."""
        if gamma == 0 and self.shared:
            full = self.verify_full if sessions is None else min(self.verify_full, sessions)
            return max(full, self.verify_sessions, 1.0)
        return max(self.verify_sessions, 1.0)

    def cycle_ms(self, gamma: int, sessions: int = 1) -> float:
        return self.cycles_ms(gamma, sessions=sessions)[gamma]

    def cycles_ms(self, top: int, ahead: list[float] | None = None, sessions: int = 1) -> list[float]:
        """The cluster's time per cycle at γ = 0, 1, …, top, with `sessions` cycling at once (the
        replica's, or more where the verifier's passes hold more): 1 / the cycles per ms of the
        closed network its work and latency make (`closed_loop_ms`). Alone, a session's own cycle;
        where the busiest station saturates, that station's work per cycle. Each line is read once
        a call, not once a γ: a policy asks for every γ each cycle. ahead[γ]: the probability that
        a γ block was drafted ahead (no draft call), else 0."""
        n = max(sessions, round(self.verify_sessions), 1)
        # A round's sessions choose from one answer (the module's docstring); one worked out from
        # the replica's first few cycles lasts only as many more.
        if ahead is None and self.memo and self.memo[0] == (top, n) and self.seen - self.memo[1] < min(n, self.memo[1]):
            return self.memo[2]
        verifier, drafter, replica, think = self.stations(top, ahead, n)
        cycles = [closed_loop_ms((verifier[g], drafter[g], replica[g]), think[g], n) for g in range(top + 1)]
        if ahead is None:
            self.memo = ((top, n), self.seen, cycles)
        return cycles

    def stations(self, top: int, ahead: list[float] | None = None, sessions: int | None = None,
                 ) -> tuple[list[float], ...]:
        """A session's cycle at γ = 0 … top as (verifier, drafter, replica, latency): its work at
        each station (its share of the passes and its calls' CPU, the drafting's at the verifier
        where the verifier drafts) and its latency, which uses no station; sessions: as for fill."""
        call = _along(self.verify_call, top)
        # Each drafted token adds to the pass.
        verifier = [self.verify_ms(g, sessions) + call[g] for g in range(top + 1)]
        replica, think, drafter = _along(self.overhead, top), _along(self.latency, top), [0.0] * (top + 1)
        draft_token = self.draft_ms_per_token()
        draft_call, draft_overhead = _along(self.draft_call, top), _along(self.draft_overhead, top)
        # Unmeasured, a draft worker's call takes the verify call's latency: the same round trip.
        seeded = not (self.draft_latency.n or self.drafts_on_verifier)
        draft_latency = [think[0]] * (top + 1) if seeded else _along(self.draft_latency, top)
        waits = self.ahead_waits(top) if ahead else [0.0] * (top + 1)
        for g in range(1, top + 1):
            missed = 1.0 - ahead[g] if ahead else 1.0
            work = missed * (g * draft_token + draft_call[g])
            if self.drafts_on_verifier:
                verifier[g] += work
            else:
                drafter[g] += work
            replica[g] += missed * draft_overhead[g]
            think[g] += missed * draft_latency[g] + waits[g]
        return verifier, drafter, replica, think

    def ahead_waits(self, top: int) -> list[float]:
        """A lone cycle's wait for its draft-ahead call after the verdict, γ = 0 … top: the most
        measured at γ or below (none: 0). It never shrinks with γ: the call drafts γ + 1 steps
        under each of its guesses where the verify's one pass grows far less (the module's
        docstring, Drafting ahead's wait)."""
        return list(accumulate((self.ahead_wait.get(g, 0.0) for g in range(top + 1)), max))

    def timed(self, verify: dict[int, float], draft: dict[int, float]) -> None:
        """The workers' pass curves as they timed them when they loaded (ModelInfo.pass_ms; {}: none):
        their passes are priced along them (PassCost)."""
        self.verify_pass.curve, self.draft_pass.curve = PassCurve.of(verify), PassCurve.of(draft)

    def draft_fits(self) -> tuple[LinearFit | PassCost, ...]:
        """The estimates only a draft call teaches: they fade while the draft does not draft."""
        return (self.draft_fill, self.draft_pass, self.draft_call, self.draft_overhead, self.draft_latency)

    def observe(self, c: CycleCosts) -> None:
        """Fold one cycle's costs into the estimates."""
        d = self.decay
        self.seen += 1
        if not c.gamma:  # the draft's costs fade while it does not draft (the module's docstring)
            for fit in self.draft_fits():
                fit.fade(d)
        elif not c.drafted_ahead and c.draft_fed <= STEADY_DRAFT_FED:
            # Alone, a draft call is γ passes: the first runs the fed tokens, each other one token.
            passes = _passes(c.draft_batching, c.gamma, c.draft_fed + c.gamma - 1)
            self.draft_fill.add(0.0, passes.sessions / passes.passes, d)
            self.draft_pass.add(passes.tokens / passes.passes, c.draft_cost_ms / passes.passes, d)
            self.draft_call.add(c.gamma, c.draft_call_ms, d)
            self.draft_overhead.add(c.gamma, max(c.draft_overhead_ms, 0.0), d)
            self.draft_latency.add(c.gamma, max(c.draft_latency_ms, 0.0), d)
        self.overhead.add(c.gamma, c.overhead_ms, d)
        self.latency.add(c.gamma, max(c.latency_ms, 0.0), d)
        if c.verify_fed > STEADY_VERIFY_FED:
            return
        if c.gamma and c.ahead_wait_ms >= 0.0:  # from none: a stray slow call moves it a tenth of the way
            self.ahead_wait[c.gamma] = _ewma(self.ahead_wait.get(c.gamma, 0.0), c.ahead_wait_ms, d)
        passes = _passes(c.verify_batching, 1, c.verify_fed + c.gamma)
        fill = passes.sessions / passes.passes
        self.verify_sessions = _ewma(self.verify_sessions, fill, d)
        self.verify_full = fill if fill >= self.verify_full else _ewma(self.verify_full, fill, self.full_decay)
        self.verify_pass.add(passes.tokens / passes.passes, c.verify_cost_ms / passes.passes, d)
        self.verify_call.add(c.gamma, c.verify_call_ms, d)


@dataclass
class PairAcceptance:
    """What the replica has seen of its draft against its target, from every session's cycles:
    the decayed accepted and verified tokens, overall and per block position (censored: a block
    verifies its positions up to its first rejection, at most γ), how often drafting ahead
    guessed the bonus and the recovered token, and how many tokens it has verified in all."""

    decay: float = 0.998  # per block observed: it pools every session's, and follows the pair, not a text
    accepted: float = 0.0
    verified: float = 0.0
    seen: int = 0  # verified tokens, undecayed: how much the replica knows of the pair
    # Per block position j = 1, 2, …: the blocks that verified it, and those that accepted it.
    reached: list[float] = field(default_factory=list)
    passed: list[float] = field(default_factory=list)
    guesses: float = 0.0  # fully accepted blocks that had drafted ahead
    hits: float = 0.0  # … and whose bonus token was the draft's guess
    rejections: float = 0.0  # blocks rejected at one of the first ahead_rejections positions, drafted ahead
    recoveries: float = 0.0  # … and whose recovered token was the draft's guess (a lookup drafts none)

    def observe(self, accepted: int, gamma: int, guessed: bool | None, recovered: bool | None = None,
                opening: bool = False) -> None:
        """A block of γ drafted tokens (a tree: its depth) that accepted `accepted` of them; one of
        a stream's opening blocks teaches only the guesses' rates (the module's docstring)."""
        d = self.decay
        if guessed is not None:
            self.guesses, self.hits = d * self.guesses + 1, d * self.hits + guessed
        if recovered is not None:
            self.rejections, self.recoveries = d * self.rejections + 1, d * self.recoveries + recovered
        if opening:
            return
        verified = verified_tokens(accepted, gamma)
        self.accepted, self.verified = d * self.accepted + accepted, d * self.verified + verified
        self.seen += verified
        for counts in (self.reached, self.passed):
            counts.extend([0.0] * (gamma - len(counts)))
        for j in range(len(self.reached)):  # j + 1: the position
            self.reached[j] = d * self.reached[j] + (j < gamma and j <= accepted)
            self.passed[j] = d * self.passed[j] + (j < accepted)

    def position_weights(self, top: int) -> list[float]:
        """Per position 1 … top, the blocks behind its acceptance (those that reached it, and
        POSITION_WEIGHT for the pair's overall)."""
        return [(self.reached[j] if j < len(self.reached) else 0.0) + POSITION_WEIGHT for j in range(top)]

    def by_position(self, alpha: float, top: int) -> list[float]:
        """a_1 … a_top: each position's acceptance, on `alpha` (the pair's overall) worth
        POSITION_WEIGHT blocks, so that a position few blocks reached stays near it."""
        return [(self.passed[j] + POSITION_WEIGHT * alpha) / (self.reached[j] + POSITION_WEIGHT)
                if j < len(self.reached) else alpha for j in range(top)]


@dataclass
class CohortProbes:
    """When sessions that share passes probe: together, on the replica's schedule (the module's
    docstring, Cohorts). A probe is due `gap` of the replica's cycles after its last drafting
    cycle, counted in time (the replica's steady cycles' mean wall time) so that it starts with a
    turn of the event loop, whose sessions all choose then, rather than inside one. It lasts that
    turn (half a cycle from its first choice, or until its first outcome is back), so that a
    session probes once: where the verifier drafts, a session chooses its next γ before its
    probe's outcome is back, and a probe held due until then ran two rounds. Its first outcome
    sets the gap: probe_every again when drafting wins after it, doubled (at most MAX_PROBE_GAP)
    when γ = 0 still does; with no outcome back (its sessions ended), the next probe falls due a
    gap after it began. A probe whose draft caught up is not its outcome: it goes on through the
    next turn, whose steady cycles measure the draft (the module's docstring). Steady cycles only
    time the gap: a probe whose draft catches up on a long γ-0 streak, or a cycle that prefills,
    lasts many cycles, and timing the gap by it would push the next probe out in proportion
    (seconds at a gap of 64)."""

    clock: Callable[[], float] = field(default=time.monotonic, compare=False, repr=False)  # seconds
    due_at: float = 0.0  # on the clock: sessions that share passes probe from then on
    ends_at: float = -1.0  # on the clock: the probe under way lasts until then
    awaiting: bool = False  # a probe began whose first outcome is not back yet
    gap: int = 0  # the replica's cycles between probes (0: probe_every)
    cycle_ms: float = -1.0  # the replica's steady cycles' wall time, decayed mean (-1: none yet)
    decay: float = 0.9
    steady: int = 0  # the replica's steady cycles so far
    gamma: int = 0  # the cohorts' drafting γ (GammaPolicy._cohort_gamma; 0: none yet)

    def due(self) -> bool:
        now = self.clock()
        return now < self.ends_at or now >= self.due_at

    def began(self, every: int) -> None:
        """A session probes: the probe's turn starts now unless it is under way."""
        now, per_cycle_ms = self.clock(), max(self.cycle_ms, 0.0)
        if now < self.ends_at:
            return
        self.ends_at = now + per_cycle_ms / 2e3
        self.awaiting = True
        self._next_after(now, every, per_cycle_ms)

    def cycled(self, wall_ms: float) -> None:
        """A steady cycle (no prefill, no catch-up) of any session took `wall_ms`."""
        self.cycle_ms = _ewma(self.cycle_ms, wall_ms, self.decay)
        self.steady += 1

    def drafted(self, wins: Callable[[], bool], cycle_ms: float, every: int, steady: bool = True) -> None:
        """A drafting cycle of any session came back, after `cycle_ms` (the gap's cycle until a
        steady one has been seen); wins(): whether drafting wins now, with what it taught; steady:
        its draft call fed the worker no more than a steady cycle does."""
        now = self.clock()
        per_cycle_ms = self.cycle_ms if self.cycle_ms >= 0 else cycle_ms
        if not steady:  # the draft caught up: the probe goes on through the next turn
            if self.awaiting:
                self.ends_at = now + per_cycle_ms / 2e3
        elif self.awaiting or now >= self.due_at:  # a probe's first outcome (or drafting's after a pause)
            self.gap = 0 if wins() else min(2 * (self.gap or every), MAX_PROBE_GAP)
            self.awaiting, self.ends_at = False, -1.0
        self._next_after(now, every, per_cycle_ms)

    def _next_after(self, now: float, every: int, per_cycle_ms: float) -> None:
        """The next probe falls due the gap's cycles (probe_every: `every`) after `now`."""
        self.due_at = now + (self.gap or every) * per_cycle_ms / 1e3


@dataclass
class GammaPolicy:
    """A session's γ and shape choice: its probes and shapes, and the replica's costs and acceptance
    (shared)."""

    max_gamma: int = 8
    initial_gamma: int = 4  # used until both workers have been measured
    prior_alpha: float = 0.6  # the replica's α before it has seen a block
    prior_weight: float = 2.0  # pseudo-observations behind prior_alpha
    hope: float = 1.0  # standard errors of the replica's α that γ = 0 must win by (the module's docstring)
    decay: float = 0.9  # per cycle: the shapes' rates fade so that the choice follows the text
    probe_every: int = 8
    ahead_rejections: int = 0  # a block's first positions drafting ahead drafts past a rejection at
    opening_blocks: int = OPENING_BLOCKS  # a stream's first blocks, kept from the replica's acceptance
    zero_streak: int = 0
    probe_gap: int = 0  # γ-0 cycles before the next probe (0: probe_every)
    # Per draft shape, the decayed output tokens and cost of its drafting cycles; the shape of the
    # latest ones and how many ran in a row.
    chain_tokens: float = 0.0
    chain_ms: float = 0.0
    tree_tokens: float = 0.0
    tree_ms: float = 0.0
    last_tree: bool = False
    shape_streak: int = 0
    blocks: int = 0  # the session's drafted blocks so far
    # The latest choice's S(γ), γ = 0 … top (tokens per ms; () before the costs are measured): its
    # cycle's span shows them (tandem.orchestrator.cycle).
    rates_seen: tuple[float, ...] = ()
    # The replica's, one object each for all its sessions: what the work costs, what the draft does,
    # when its cohorts probe.
    costs: PoolCosts = field(default_factory=PoolCosts)
    pair: PairAcceptance = field(default_factory=PairAcceptance)
    probes: CohortProbes = field(default_factory=CohortProbes)

    @property
    def pair_alpha(self) -> float:
        """The replica's acceptance estimate (below 1: survival divides by 1 − α)."""
        pair = self.pair
        return min((pair.accepted + self.prior_alpha * self.prior_weight) / (pair.verified + self.prior_weight), 0.999)

    @property
    def pair_error(self) -> float:
        """The standard error of the replica's α on all the tokens it has verified (and the
        prior's): it fades as the replica learns the pair, where the decayed evidence would stop."""
        alpha = self.pair_alpha
        return math.sqrt(alpha * (1.0 - alpha) / (self.pair.seen + self.prior_weight))

    def survival(self, top: int, hopeful: bool = False) -> list[float]:
        """P(a block's first i tokens are accepted), i = 0 … top: the products of the replica's
        a_j (a session's own last blocks say little of its next one: the module's docstring).
        hopeful: with their odds scaled to an α higher by `hope` standard errors of the
        replica's."""
        pair = self.pair_alpha
        alpha = min(pair + self.hope * self.pair_error, 0.999) if hopeful else pair
        scale = alpha * (1.0 - pair) / max((1.0 - alpha) * pair, 1e-9)  # the odds ratio
        survival = [1.0]
        for a in self.pair.by_position(pair, top):
            survival.append(survival[-1] * min(scale * a / (1.0 - a + scale * a), 0.999))
        return survival

    def expected_tokens(self, top: int) -> list[float]:
        """E[tokens | γ] for γ = 0 … top: the bonus or recovered token and the accepted ones."""
        return list(accumulate(self.survival(top)))

    def expected_error(self, gamma: int) -> float:
        """The standard error of E[tokens | γ], as a share of it: each position's acceptance a
        binomial share of the blocks behind it, carried through the survival products (the
        delta method: ∂E/∂a_j = Σ_{i ≥ j} s_i / a_j)."""
        alphas = self.pair.by_position(self.pair_alpha, gamma)
        weights = self.pair.position_weights(gamma)
        survival = self.survival(gamma)
        tails = list(accumulate(reversed(survival[1:])))[::-1]  # tails[j]: Σ_{i > j} s_i
        variance = sum(t * t * (1.0 - a) / (a * w) for t, a, w in zip(tails, alphas, weights))
        return math.sqrt(variance) / sum(survival)

    def ahead_rates(self, survival: list[float]) -> list[float]:
        """Per γ ≤ top (survival: self.survival(top)), the probability that a drafting cycle finds
        its block drafted ahead: the last block fully accepted (survival[γ]) and its bonus guessed,
        or rejected at one of its first ahead_rejections positions (1 − survival[min(γ, R)]) and
        its recovered token guessed (the replica's rates; before it has them, α and α / 2: the
        draft's next choice is right less often than its first)."""
        alpha, pair = self.pair_alpha, self.pair
        bonus = (pair.hits + 2.0 * alpha) / (pair.guesses + 2.0)
        recovered = (pair.recoveries + alpha) / (pair.rejections + 2.0)
        return [survival[g] * bonus + (1.0 - survival[min(g, self.ahead_rejections)]) * recovered if g else 0.0
                for g in range(len(survival))]

    def tokens_per_ms(self, gamma: int, ahead: bool = False, sessions: int = 1) -> float:
        return self.rates(gamma, ahead, sessions)[gamma]

    def rates(self, top: int, ahead: bool = False, sessions: int = 1, hopeful: bool = False) -> list[float]:
        """Expected tokens per ms of the cluster's time, per γ ≤ top, with `sessions` in flight in
        the loop; ahead: the loop drafts ahead; hopeful: at the hopeful α (survival)."""
        survival = self.survival(top, hopeful)
        cycles = self.costs.cycles_ms(top, self.ahead_rates(survival) if ahead else None, sessions)
        return [tokens / max(ms, 1e-6) for tokens, ms in zip(accumulate(survival), cycles)]

    def choose(self, limit: int | None = None, ahead: bool = False, sessions: int = 1) -> int:
        """γ for the next cycle, at most `limit` (e.g. the tokens still wanted − 1); ahead: the loop
        drafts ahead during this session's verifies; sessions: its sessions in flight."""
        top = self.max_gamma if limit is None else max(0, min(self.max_gamma, limit))
        if not self.costs.priced:
            self.rates_seen = ()
            return min(self._first_gamma(sessions), top)
        rates, gamma = self._choice(top, ahead, sessions)
        self.rates_seen = tuple(rates)
        if gamma == 0 and top > 0 and self._probe_due():
            gamma = max(range(1, top + 1), key=rates.__getitem__)
            if self.costs.shared:
                self.probes.began(self.probe_every)
        return gamma

    def _choice(self, top: int, ahead: bool, sessions: int) -> tuple[list[float], int]:
        """(the rates at the estimated α, the γ to draft): their best γ, and where sessions share
        passes and drafting wins, the cohorts' γ (_cohort_gamma); where the best is 0 and the
        session does not share passes, the best at the hopeful α (γ = 0 teaches nothing of the
        draft: the module's docstring)."""
        rates = self.rates(top, ahead, sessions)
        gamma = _best(rates)
        if self.costs.shared:
            return rates, gamma and self._cohort_gamma(rates, gamma, top)
        if gamma or not top:
            return rates, gamma
        return rates, _best(self.rates(top, ahead, sessions, hopeful=True))

    def _cohort_gamma(self, rates: list[float], best: int, top: int) -> int:
        """The drafting γ of sessions that share passes: the cohorts' last one while its S is
        within a standard error of the best's, else the shortest block that is (the module's
        docstring, The cohorts' γ)."""
        floor = rates[best] * (1.0 - self.expected_error(best))
        held = self.probes.gamma
        if not (0 < held <= top and rates[held] >= floor):
            held = next(g for g in range(1, best + 1) if rates[g] >= floor)
        if top == self.max_gamma:  # a block cut to the tokens left is not the cohorts' choice
            self.probes.gamma = held
        return held

    def _first_gamma(self, sessions: int) -> int:
        """γ before a cycle can be priced: alone, initial_gamma; with others in flight, γ = 0 for
        the replica's first probe_every rounds of steady cycles (a draft worker's replica is priced
        after its first), then a probe of one token until the draft's costs are measured (the
        module's docstring, The start)."""
        if sessions <= 1:
            return self.initial_gamma
        return int(self.probes.steady >= self.probe_every * sessions)

    def _probe_due(self) -> bool:
        """Whether a cycle where γ = 0 wins drafts anyway: where sessions share passes, when the
        replica's cohorts probe (CohortProbes); alone, after the session's own streak of γ-0
        cycles reaches probe_gap (or probe_every)."""
        if self.costs.shared:
            return self.probes.due()
        return self.zero_streak + 1 >= (self.probe_gap or self.probe_every)

    def choose_tree(self) -> bool:
        """Whether the next drafting cycle drafts a tree (draft shape "auto"): the chain first,
        then the tree, then the one with more tokens per ms, the other every probe_every cycles."""
        if not self.chain_ms or not self.tree_ms:
            return bool(self.chain_ms)
        tree_wins = self.tree_tokens * self.chain_ms > self.chain_tokens * self.tree_ms
        if self.shape_streak + 1 >= self.probe_every and self.last_tree == tree_wins:
            return not tree_wins
        return tree_wins

    def observe(self, c: CycleCosts, output_tokens: int = 0, ahead: bool = False, sessions: int = 1) -> None:
        """Fold one cycle's measurements (and, for the shapes' rates, its output tokens) into the
        session's probes and shapes and the replica's costs and acceptance; ahead and sessions: as
        for choose."""
        gap = self.probe_gap or self.probe_every
        probed = bool(c.gamma) and self.zero_streak + 1 >= gap
        self.zero_streak = self.zero_streak + 1 if c.gamma == 0 else 0
        caught_up = c.draft_fed > STEADY_DRAFT_FED
        if probed and caught_up:  # the probe goes on to a steady cycle (the module's docstring)
            self.zero_streak, probed = gap - 1, False
        if c.draft_fed <= STEADY_DRAFT_FED and c.verify_fed <= STEADY_VERIFY_FED:
            self.probes.cycled(c.wall_ms)
        self.costs.observe(c)
        if not c.gamma:
            return
        self._observe_shape(c, output_tokens)
        self.blocks += 1
        self.pair.observe(c.accepted, c.gamma, c.guessed, c.recovered, opening=self.blocks <= self.opening_blocks)
        # Asked only of a probe's outcome (the session's, the cohort's), and once: rates cost CPU.
        wins = cache(partial(self._drafting_wins, ahead, sessions))
        if probed:
            self.probe_gap = 0 if wins() else min(2 * gap, MAX_PROBE_GAP)
        self.probes.drafted(wins, c.wall_ms, self.probe_every, steady=not caught_up)

    def _drafting_wins(self, ahead: bool, sessions: int) -> bool:
        """Whether choose, probes aside, would draft now."""
        if not self.costs.priced:
            return self.initial_gamma > 0
        return self._choice(self.max_gamma, ahead, sessions)[1] > 0

    def _observe_shape(self, c: CycleCosts, output_tokens: int) -> None:
        # A prefill (the first cycle, a re-prefill) costs what no steady cycle of either shape will:
        # charged to the shape that happened to run it, it kept sessions on the other one. A steady
        # cycle feeds the last path and the token after it at most.
        if max(c.draft_fed, c.verify_fed) > self.max_gamma + 1:
            return
        cost = (c.draft_cost_ms + c.draft_call_ms + c.draft_overhead_ms + c.draft_latency_ms + c.verify_cost_ms
                + c.verify_call_ms + c.overhead_ms + c.latency_ms)
        d = self.decay
        if c.tree:
            self.tree_tokens, self.tree_ms = d * self.tree_tokens + output_tokens, d * self.tree_ms + cost
        else:
            self.chain_tokens, self.chain_ms = d * self.chain_tokens + output_tokens, d * self.chain_ms + cost
        self.shape_streak = self.shape_streak + 1 if c.tree == self.last_tree else 1
        self.last_tree = c.tree

    def to_dict(self) -> dict:
        """The session's own state, to store: its probes' streak and wait, its shapes' rates, its
        blocks."""
        return {name: getattr(self, name) for name in SESSION_STATE}

    def for_session(self, state: dict | None = None) -> "GammaPolicy":
        """A policy with these settings and these costs (the same object: the replica's), and
        the own state of `state` (a stored session's to_dict; unknown fields, such as the acceptance
        a session stored before it chose with the replica's, ignored) or a new session's."""
        known = {k: v for k, v in (state or {}).items() if k in SESSION_STATE}
        return replace(self, **(SESSION_STATE | known))


def _best(rates: list[float]) -> int:
    """The γ of the highest rate, the smallest on a tie."""
    return max(range(len(rates)), key=lambda g: (rates[g], -g))


def _ewma(old: float, new: float, decay: float) -> float:
    """An exponentially weighted mean; old < 0: none yet, the first value is it."""
    return new if old < 0 else decay * old + (1 - decay) * new


def _along(fit: LinearFit, top: int) -> list[float]:
    """The fit's line at 0, 1, …, top, read once."""
    intercept, slope = fit.line(shrunk=True)
    return [intercept + slope * g for g in range(top + 1)]


def closed_loop_ms(demands: tuple[float, ...], think_ms: float, sessions: int) -> float:
    """1 / the cycles per ms of `sessions` sessions cycling at once through stations that each
    take demands[k] ms of a cycle's work, one cycle after another, and a latency of think_ms that
    uses none: exact mean-value analysis of the closed network (Reiser and Lavenberg 1980). One
    session: the sum of it all; many: the busiest station's demand, once its queue hides the
    latency. It stops adding sessions once the busiest station is within SATURATED of full: those
    past it only queue (and would cost the policy CPU in every choice)."""
    demands = [d for d in demands if d > 0.0] or [0.0]
    queues = [0.0] * len(demands)
    busiest = max(demands)
    for n in range(1, sessions + 1):
        residence = [d * (1.0 + q) for d, q in zip(demands, queues)]
        cycle = think_ms + sum(residence)
        if n * busiest >= SATURATED * cycle:
            break
        queues = [n * r / cycle for r in residence]
    return max(cycle / n, 1e-9)


def _passes(reported: Batching | None, passes: int, tokens: int) -> Batching:
    """The passes a call ran in, as its worker reported them, or as they are alone."""
    if reported and reported.passes:
        return reported
    return Batching(passes, tokens, passes)

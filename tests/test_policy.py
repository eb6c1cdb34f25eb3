"""tandem.math.analytic and tandem.orchestrator.policy: the analytic model and the adaptive, serializable γ policy."""

import json
import random
from dataclasses import asdict, replace
from itertools import accumulate

import pytest

from tandem.math.analytic import analytic_speedup, best_gamma, expected_tokens
from tandem.math.fit import LinearFit
from tandem.orchestrator.policy import (MAX_PROBE_GAP, SESSION_STATE, CohortProbes, CycleCosts, GammaPolicy,
                                        PairAcceptance, closed_loop_ms)
from tandem.wire.worker import Batching

from support.policies import cheap_good_cycle

ALPHAS = [0.0, 0.1, 0.3, 0.5, 0.6, 0.75, 0.8, 0.9, 0.95, 0.99]


# --- the analytic model ----------------------------------------------------------------------


@pytest.mark.parametrize("alpha", ALPHAS)
def test_expected_tokens_closed_form(alpha):
    for gamma in range(0, 17):
        want = (1 - alpha ** (gamma + 1)) / (1 - alpha)
        assert expected_tokens(alpha, gamma) == pytest.approx(want, rel=1e-12)
        assert expected_tokens(alpha, gamma) == pytest.approx(sum(alpha**i for i in range(gamma + 1)), rel=1e-12)


def test_expected_tokens_limits():
    for gamma in range(0, 10):
        assert expected_tokens(1.0, gamma) == gamma + 1  # every draft accepted, plus the bonus
        assert expected_tokens(0.0, gamma) == 1.0  # only the recovered token
        assert expected_tokens(1 - 1e-9, gamma) == pytest.approx(gamma + 1, rel=1e-6)  # continuous at 1
    for alpha in ALPHAS + [1.0]:
        assert expected_tokens(alpha, 0) == 1.0  # γ = 0 is plain target decoding
        values = [expected_tokens(alpha, g) for g in range(10)]
        assert values == sorted(values)  # more drafting never yields fewer tokens per pass


@pytest.mark.parametrize("alpha", ALPHAS + [1.0])
@pytest.mark.parametrize("cost_ratio", [0.5, 1.0, 3.0, 10.0, 20.0, 100.0])
def test_analytic_speedup_and_best_gamma_brute_force(alpha, cost_ratio):
    for gamma in range(0, 17):
        want = expected_tokens(alpha, gamma) / (1 + gamma / cost_ratio)
        assert analytic_speedup(alpha, gamma, cost_ratio) == pytest.approx(want, rel=1e-12)
    for max_gamma in (0, 1, 4, 8, 16):
        speedups = [analytic_speedup(alpha, g, cost_ratio) for g in range(max_gamma + 1)]
        best = best_gamma(alpha, cost_ratio, max_gamma)
        assert 0 <= best <= max_gamma
        assert speedups[best] == max(speedups)
        assert best == speedups.index(max(speedups))  # the smallest γ among equals


def test_best_gamma_known_values():
    # α = 0.8, C = 20: speedups rise to γ = 8 (3.092) and fall after (γ = 9: 3.078).
    assert best_gamma(0.8, 20.0, 16) == 8
    assert analytic_speedup(0.8, 8, 20.0) == pytest.approx((1 - 0.8**9) / 0.2 / 1.4)
    assert analytic_speedup(0.8, 8, 20.0) > analytic_speedup(0.8, 7, 20.0)
    assert analytic_speedup(0.8, 8, 20.0) > analytic_speedup(0.8, 9, 20.0)
    assert best_gamma(0.8, 20.0, 5) == 5  # capped
    assert best_gamma(0.6, 10.0, 16) == 3
    assert best_gamma(0.0, 1000.0, 16) == 0  # nothing is ever accepted: never draft
    assert best_gamma(0.3, 0.5, 16) == 0  # a draft slower than the target never pays
    assert best_gamma(1.0, 1.0, 8) == 0  # all speedups exactly 1: the smallest γ wins the tie
    assert best_gamma(1.0, 2.0, 8) == 8


# --- GammaPolicy -----------------------------------------------------------------------------


def costly_bad_cycle(gamma: int) -> CycleCosts:
    """An expensive draft that is always wrong."""
    return CycleCosts(gamma=gamma, accepted=0, draft_cost_ms=30.0 * gamma if gamma else 0.0,
                      draft_call_ms=2.0 if gamma else 0.0, verify_cost_ms=10 + 0.5 * (gamma + 1),
                      verify_call_ms=0.3, overhead_ms=0.5)


def brute_force_choice(policy: GammaPolicy, top: int) -> int:
    rates = [policy.tokens_per_ms(g) for g in range(top + 1)]
    return rates.index(max(rates))


def trained(cycle, gammas, on_verifier: bool = False) -> GammaPolicy:
    """A policy that observed these cycles; on_verifier: the verifier drafts (its head)."""
    policy = GammaPolicy(probes=CohortProbes(clock=lambda: 0.0))  # time stands still: no cohort probe falls due
    policy.costs.drafts_on_verifier = on_verifier
    for g in gammas:
        policy.observe(cycle(g))
    return policy


def test_defaults_and_initial_gamma_before_measurements():
    policy = GammaPolicy()
    assert policy.pair_alpha == pytest.approx(policy.prior_alpha)
    assert policy.choose() == policy.initial_gamma == 4
    assert GammaPolicy(initial_gamma=6).choose() == 6
    assert GammaPolicy(initial_gamma=6, max_gamma=3).choose() == 3
    assert GammaPolicy(initial_gamma=6).choose(limit=2) == 2
    assert GammaPolicy(initial_gamma=6).choose(limit=0) == 0
    assert GammaPolicy(initial_gamma=6).choose(limit=-3) == 0
    # Where the verifier drafts, a γ-0 cycle measures the target but not the drafting: still the
    # initial γ.
    policy.costs.drafts_on_verifier = True
    policy.observe(costly_bad_cycle(0))
    assert policy.costs.verify_pass.n > 0 and policy.costs.draft_pass.n == 0
    assert policy.choose() == 4


def closed_form_gamma(alpha: float, verify_ms: list[float], round_trip_ms: float) -> int:
    """argmax over γ of E[tokens | γ] for i.i.d. acceptance over a cycle of the verify's cost
    (verify_ms[γ]), its round trip and, drafting, the draft call's round trip (its work none)."""
    return max(range(len(verify_ms)), key=lambda g: expected_tokens(alpha, g) / (
        verify_ms[g] + round_trip_ms * (1 + (g > 0))))


@pytest.mark.parametrize("latency_ms", [0.0, 5.0, 40.0])
def test_the_draft_is_seeded_from_the_closed_form_until_it_is_measured(latency_ms):
    """A draft worker's replica that has measured only the verifier prices drafting from the
    closed form: i.i.d. acceptance at the prior's α, the draft's work none and its call's round
    trip the verify call's; the longer the round trip, the longer the block."""
    policy = GammaPolicy()
    for tokens in (1, 9):  # a verify pass costs 10 + 5 per token
        policy.observe(CycleCosts(0, 0, 0.0, 0.0, 10.0 + 5.0 * tokens, 0.0, 0.0, latency_ms=latency_ms,
                                  verify_batching=Batching(1, tokens, 1)))
    assert policy.costs.draft_pass.n == 0 and policy.costs.priced
    expected = closed_form_gamma(policy.prior_alpha, [10.0 + 5.0 * (g + 1) for g in range(9)], latency_ms)
    assert policy.choose() == expected == {0.0: 1, 5.0: 2, 40.0: 4}[latency_ms]


def test_under_load_a_new_replica_starts_at_gamma_0_and_then_probes_one_token():
    """Where the verifier drafts, with others in flight, the first costs a replica measures are
    those of the regime it starts in: γ = 0 for its first probe_every rounds of steady cycles, then
    a probe of one token until the draft's costs are measured; alone, the initial γ as ever."""
    replica = GammaPolicy(probes=CohortProbes(clock=lambda: 0.0))
    replica.costs.drafts_on_verifier = True
    session = replica.for_session()
    assert session.choose(sessions=1) == replica.initial_gamma and session.choose(sessions=8) == 0
    for _ in range(replica.probe_every * 8 - 1):
        session.observe(loaded_cycle(0, 8))
    assert session.choose(sessions=8) == 0
    session.observe(replace(loaded_cycle(0, 8), verify_fed=40))  # a prefill is no steady cycle
    assert session.choose(sessions=8) == 0
    session.observe(loaded_cycle(0, 8))
    assert session.choose(sessions=8) == 1
    session.observe(replace(loaded_cycle(1, 8), draft_fed=40))  # the probe's draft catches up: not measured
    assert replica.costs.draft_pass.n == 0 and not replica.costs.priced and session.choose(sessions=8) == 1
    session.observe(loaded_cycle(1, 8))
    assert replica.costs.draft_pass.n > 0 and replica.costs.priced


def test_under_load_a_draft_workers_replica_runs_gamma_0_until_the_verifier_is_measured():
    replica = GammaPolicy(probes=CohortProbes(clock=lambda: 0.0))
    session = replica.for_session()
    assert session.choose(sessions=8) == 0
    session.observe(replace(loaded_cycle(0, 8), verify_fed=40))  # a prefill is no steady cycle
    assert session.choose(sessions=8) == 0
    session.observe(loaded_cycle(0, 8))
    assert replica.costs.priced and session.choose(sessions=8) > 0  # seeded: the draft's work none


def test_high_acceptance_and_cheap_draft_picks_large_gamma():
    policy = trained(cheap_good_cycle, [4, 8, 6, 8, 2, 8] * 5)
    assert policy.pair_alpha > 0.95
    assert policy.choose() == policy.max_gamma == 8
    assert policy.choose() == brute_force_choice(policy, 8)
    assert policy.choose(limit=5) == 5
    assert policy.choose(limit=100) == 8


def test_zero_acceptance_and_expensive_draft_picks_zero():
    policy = trained(costly_bad_cycle, [4, 2, 4, 6] * 8)
    assert policy.pair_alpha < 0.15
    assert policy.choose() == 0
    assert policy.choose(limit=3) == 0


def test_choose_is_the_argmax_of_tokens_per_ms():
    for cycle, gammas in [(cheap_good_cycle, [1, 3, 5, 2]), (costly_bad_cycle, [2, 3, 1])]:
        policy = trained(cycle, gammas)
        for limit in range(0, 10):
            top = min(limit, policy.max_gamma)
            assert policy.choose(limit) == brute_force_choice(policy, top)


def test_costs_are_learned_from_steady_cycles_only():
    """A prefill, a re-prefill or a draft catching up feeds more tokens than a steady cycle
    and costs accordingly: the per-token estimates must not learn from it."""
    policy = GammaPolicy()
    prefill = replace(cheap_good_cycle(4), draft_cost_ms=80.0, verify_cost_ms=90.0,
                      draft_fed=60, verify_fed=60)
    policy.observe(prefill)
    assert policy.costs.draft_pass.n == 0 and policy.costs.verify_pass.n == 0 and policy.costs.overhead.at(4) == 0.5
    assert policy.choose() == policy.initial_gamma  # nothing steady measured yet
    policy = trained(cheap_good_cycle, [4, 2, 4, 6] * 3)
    before, accepted = asdict(policy.costs), policy.pair.accepted
    catch_up = replace(cheap_good_cycle(1), draft_cost_ms=9.0, draft_fed=8)  # after 7 γ-0 cycles
    policy.observe(catch_up)
    assert asdict(policy.costs.draft_pass) == before["draft_pass"]
    assert policy.costs.verify_pass.n > before["verify_pass"]["fit"]["n"]  # the verifier's call was steady
    assert policy.pair.accepted == pytest.approx(policy.pair.decay * accepted + 1)  # acceptance counts
    per_token = policy.costs.draft_ms_per_token()
    policy.observe(replace(cheap_good_cycle(2), draft_cost_ms=2.0, draft_fed=2))  # a full accept: steady
    assert policy.costs.draft_ms_per_token() > per_token


def test_a_probe_that_catches_up_does_not_keep_the_policy_at_zero():
    """Acceptance recovers; the probes' catch-up costs stay out of the per-token estimate."""
    policy = trained(cheap_good_cycle, [2, 4, 3, 5, 2, 4])
    policy.pair = PairAcceptance(verified=40.0, seen=40)  # a bad stretch of text: α near 0
    gammas = []
    for _ in range(40):
        gamma = policy.choose()
        gammas.append(gamma)
        fed = 1 + (policy.zero_streak if gamma else 0)  # the draft catches up on γ-0 cycles
        cycle = cheap_good_cycle(gamma)
        policy.observe(replace(cycle, draft_cost_ms=cycle.draft_cost_ms + 2.0 * fed, draft_fed=fed))
    assert gammas[0] == 0 and gammas[-1] >= 3


def test_probe_after_a_streak_of_zero_cycles():
    policy = trained(costly_bad_cycle, [4, 2, 4, 6] * 8)
    assert policy.probe_every == 8
    choices = []
    for _ in range(policy.probe_every - 1):
        choices.append(policy.choose())
        policy.observe(costly_bad_cycle(0))
    assert choices == [0] * (policy.probe_every - 1)
    assert policy.zero_streak == policy.probe_every - 1
    probe = policy.choose()
    assert probe > 0
    rates = [policy.tokens_per_ms(g) for g in range(1, policy.max_gamma + 1)]
    assert probe == 1 + rates.index(max(rates))  # the best drafting γ
    assert policy.choose(limit=0) == 0  # the limit wins over the probe
    assert policy.choose(limit=1) == 1
    policy.observe(costly_bad_cycle(probe))  # the probe fails: back to γ = 0, streak restarts
    assert policy.zero_streak == 0
    assert policy.choose() == 0


def test_probes_that_do_not_make_drafting_pay_come_ever_more_rarely_until_one_does():
    """On text the draft cannot follow, each failed probe doubles the wait for the next one (to
    MAX_PROBE_GAP γ-0 cycles). A probe fails when γ = 0 still wins after what it taught, even if it
    accepted a token: at T = 1 nearly every probe does, and resetting the wait on that kept
    probing every probe_every cycles where drafting never paid. A probe after which drafting wins
    brings probes back to every probe_every cycles."""
    policy = trained(costly_bad_cycle, [4, 2, 4, 6] * 8)
    policy.zero_streak = 0

    def probe(cycle) -> int:  # γ-0 cycles until a probe is due, then the probe: → the wait
        wait = 0
        while (gamma := policy.choose()) == 0:
            policy.observe(costly_bad_cycle(0))
            wait += 1
        policy.observe(cycle(gamma))
        return wait

    waits = [2 ** k * policy.probe_every - 1 for k in range(6)]  # 7, 15, … , 255
    assert [probe(costly_bad_cycle) for _ in range(8)] == waits + [MAX_PROBE_GAP - 1] * 2  # they accept nothing
    assert policy.to_dict()["probe_gap"] == MAX_PROBE_GAP  # stored with the session
    assert GammaPolicy().for_session(policy.to_dict()).probe_gap == MAX_PROBE_GAP
    assert probe(lambda g: replace(costly_bad_cycle(g), accepted=1)) == MAX_PROBE_GAP - 1  # a token; still dear
    assert policy.probe_gap == MAX_PROBE_GAP and policy.choose() == 0
    # The draft turns cheap and right: what its probes teach (its acceptance, and its costs, which
    # then fade towards theirs while γ = 0 runs) brings drafting back.
    for _ in range(8):
        probe(cheap_good_cycle)
    assert all(policy.choose() > 0 for _ in range(3))
    policy.zero_streak = policy.probe_gap - 1  # a probe after which drafting wins: the wait is probe_every again
    policy.observe(cheap_good_cycle(policy.choose()))
    assert policy.probe_gap == 0


def test_probe_every_is_configurable():
    policy = replace(trained(costly_bad_cycle, [4] * 20), probe_every=3)
    policy.zero_streak = 0
    assert policy.choose() == 0
    policy.observe(costly_bad_cycle(0))
    assert policy.choose() == 0
    policy.observe(costly_bad_cycle(0))
    assert policy.choose() > 0


def test_acceptance_estimate_counts_verified_tokens():
    """The replica's α = accepted / verified, verified = accepted + the one rejected token
    (docs/api.md, "Statistics"), on its prior; its evidence fades per block, not per γ-0 cycle."""
    policy = GammaPolicy(prior_alpha=0.6, prior_weight=2.0, opening_blocks=0)
    pair, d = policy.pair, policy.pair.decay
    policy.observe(CycleCosts(4, 2, 4.0, 1.0, 10.0, 1.0, 1.0))  # 2 accepted, 3 verified
    assert (pair.accepted, pair.verified) == (2.0, 3.0)
    assert policy.pair_alpha == pytest.approx((2 + 1.2) / (3 + 2))
    policy.observe(CycleCosts(4, 4, 4.0, 1.0, 10.0, 1.0, 1.0))  # all accepted: 4 verified
    assert (pair.accepted, pair.verified) == pytest.approx((d * 2 + 4, d * 3 + 4))
    policy.observe(CycleCosts(3, 0, 3.0, 1.0, 10.0, 1.0, 1.0))  # first rejected: 1 verified
    assert pair.verified == pytest.approx(d * (d * 3 + 4) + 1) and pair.seen == 8
    alpha = policy.pair_alpha
    policy.observe(CycleCosts(0, 0, 0.0, 0.0, 10.0, 1.0, 1.0))  # γ = 0 verifies no draft
    assert policy.pair_alpha == alpha
    perfect = GammaPolicy(prior_alpha=1.0)
    for _ in range(5):
        perfect.observe(cheap_good_cycle(4))
    assert perfect.pair_alpha == 0.999  # capped below 1


def test_cost_estimates():
    policy = GammaPolicy(decay=0.9)
    policy.observe(CycleCosts(4, 2, draft_cost_ms=8.0, draft_call_ms=1.0, verify_cost_ms=12.0,
                              verify_call_ms=2.0, overhead_ms=3.0))
    costs = policy.costs
    assert costs.draft_ms_per_token() == 2.0 and costs.draft_call.at(4) == 1.0
    assert costs.verify_call.at(4) == 2.0 and costs.overhead.at(4) == 3.0
    policy.observe(CycleCosts(2, 2, draft_cost_ms=8.0, draft_call_ms=3.0, verify_cost_ms=12.0,
                              verify_call_ms=4.0, overhead_ms=5.0))
    assert policy.costs.draft_ms_per_token() == pytest.approx((0.9 * 2 + 4) / 1.9)  # the fit's decayed mean
    # Call costs are lines against γ; these fell as γ grew, which no cost does: flat, at the
    # decayed mean.
    for line, first, second in [(costs.draft_call, 1, 3), (costs.verify_call, 2, 4), (costs.overhead, 3, 5)]:
        assert line.line() == pytest.approx(((0.9 * first + second) / 1.9, 0.0))
    before = (costs.draft_ms_per_token(), *costs.draft_call.line())
    policy.observe(CycleCosts(0, 0, 0.0, 0.0, 12.0, 2.0, 3.0))  # γ = 0: the draft was not measured
    assert (costs.draft_ms_per_token(), *costs.draft_call.line()) == pytest.approx(before)  # faded, as it was
    alpha = policy.pair_alpha
    policy.observe(CycleCosts(3, 3, 0.0, 0.0, 12.0, 2.0, 3.0, drafted_ahead=True))  # no draft call this cycle
    assert (costs.draft_ms_per_token(), *costs.draft_call.line()) == pytest.approx(before)
    assert policy.pair_alpha > alpha  # its acceptance still counts


def test_verify_cost_fit_recovers_a_linear_cost():
    policy = GammaPolicy()
    for g in [1, 5, 2, 8, 3, 0, 6, 4] * 3:
        policy.observe(CycleCosts(g, 0, 1.0 * g, 0.5, 5.0 + 2.0 * (g + 1), 0.5, 0.5))
    for g in range(0, 9):
        assert policy.costs.verify_ms(g) == pytest.approx(5.0 + 2.0 * (g + 1), rel=1e-6)
        costs = policy.costs
        draft = g * costs.draft_ms_per_token() + costs.draft_call.at(g) if g else 0.0
        want = draft + costs.verify_ms(g) + costs.verify_call.at(g) + costs.overhead.at(g)
        assert policy.costs.cycle_ms(g) == pytest.approx(want)


def test_verify_cost_fit_is_never_negative_or_decreasing():
    steep = GammaPolicy()  # y = 3x - 2: the line would be negative at x = 0
    for g in [1, 3, 5, 7] * 3:
        steep.observe(CycleCosts(g, 0, 1.0, 0.0, 3.0 * (g + 1) - 2.0, 0.0, 0.0))
    assert steep.costs.verify_ms(-1) == pytest.approx(0.0, abs=1e-9)  # clamped to pass through the origin
    assert all(steep.costs.verify_ms(g) > 0 for g in range(9))
    falling = GammaPolicy()  # noise making verify look cheaper with more tokens: slope 0
    for g in [1, 3, 5, 7] * 3:
        falling.observe(CycleCosts(g, 0, 1.0, 0.0, 20.0 - g, 0.0, 0.0))
    assert falling.costs.verify_ms(0) == pytest.approx(falling.costs.verify_ms(8))
    flat = GammaPolicy()  # one γ only: no slope can be fitted
    for _ in range(5):
        flat.observe(CycleCosts(4, 0, 1.0, 0.0, 7.0, 0.0, 0.0))
    assert flat.costs.verify_ms(0) == pytest.approx(7.0) and flat.costs.verify_ms(8) == pytest.approx(7.0)


def test_a_lone_session_prices_longer_blocks_along_the_verifiers_pass_curve():
    """On a CPU a verify pass's cost per token falls as it grows (the shipped target: about a
    millisecond a token up to 5 tokens, a tenth of that from 7 to 12). A lone session drafting γ
    2–3 measures passes of 3–4 tokens only; a line through them extends their slope to every
    longer block (priced out: the module's docstring, The passes' shape). Along the worker's timed
    curve, scaled to the live passes' speed, each block is priced at what its pass costs, and the
    session drafts the γ that serves the most tokens."""
    curve = {1: 5.0, 2: 6.3, 3: 7.2, 4: 8.2, 5: 9.0, 6: 9.1, 7: 10.1, 8: 10.1, 9: 10.2, 12: 10.4}

    def live(i: int, g: int) -> CycleCosts:  # the live passes: 1.25× the curve; every other block all accepted
        return CycleCosts(g, g * (i % 2), draft_cost_ms=0.3 * g, draft_call_ms=0.0, verify_cost_ms=curve[g + 1] * 1.25,
                          verify_call_ms=0.0, overhead_ms=0.5, latency_ms=2.0)

    timed, untimed = GammaPolicy(), GammaPolicy()
    timed.costs.timed(curve, {})
    for policy in (timed, untimed):
        for i, g in enumerate([2, 3] * 10):
            policy.observe(live(i, g))
    for g in range(9):
        assert timed.costs.verify_ms(g) == pytest.approx(curve[g + 1] * 1.25, rel=0.01)
    # 1.25 ms a token on from 4 tokens: 3.75 ms over
    assert untimed.costs.verify_ms(8) == pytest.approx((curve[4] + 5 * 1.0) * 1.25)
    tokens = timed.expected_tokens(8)
    rates = [tokens[g] / (0.3 * g + curve[g + 1] * 1.25 + 0.5 + 2.0) for g in range(9)]
    best = rates.index(max(rates))
    assert best > 3 and timed.choose() == best and untimed.choose() < best  # longer than the blocks it measured


# --- the load: passes shared with other sessions ------------------------------------------


def loaded_cycle(gamma: int, sessions: int, others_tokens: int = 2) -> CycleCosts:
    """A cycle among `sessions` sessions per pass, each other one running `others_tokens` per
    pass: a verify pass costs 10 + 0.5 per token and a draft step 2 + 0.4 per token, every
    session's tokens together; α = 0.5 (every other drafted token accepted)."""
    others = (sessions - 1) * others_tokens
    verify = Batching(1, others + gamma + 1, sessions)
    draft = Batching(gamma, gamma * (others + 1), gamma * sessions) if gamma else None
    return CycleCosts(gamma=gamma, accepted=gamma // 2, draft_cost_ms=sum_passes(draft, 2.0, 0.4),
                      draft_call_ms=0.3 if gamma else 0.0, verify_cost_ms=sum_passes(verify, 10.0, 0.5),
                      verify_call_ms=0.3, overhead_ms=0.5, draft_fed=1, verify_fed=1,
                      draft_batching=draft, verify_batching=verify, wall_ms=20.0)


def sum_passes(b: Batching | None, intercept: float, slope: float) -> float:
    return b.passes * intercept + slope * b.tokens if b else 0.0


@pytest.mark.parametrize("sessions", [1, 4, 32])
def test_a_session_is_charged_its_share_of_each_pass(sessions):
    """intercept / sessions + slope · own tokens, fitted from passes whose size varies with the
    others' tokens; the shares of a pass sum to the pass."""
    policy = GammaPolicy()
    for g, others in zip([1, 3, 2, 4, 1, 3] * 4, [1, 2, 4, 8, 3, 6] * 4):
        policy.observe(loaded_cycle(g, sessions, others))
    assert policy.costs.verify_sessions == pytest.approx(sessions) and policy.costs.draft_sessions == pytest.approx(sessions)
    for g in range(9):
        assert policy.costs.verify_ms(g) == pytest.approx(10.0 / sessions + 0.5 * (g + 1), rel=1e-6)
    assert policy.costs.draft_ms_per_token() == pytest.approx(2.0 / sessions + 0.4, rel=1e-6)
    gammas = [0, 3, 8, 1][:sessions] if sessions <= 4 else [g % 9 for g in range(sessions)]
    shares = sum(policy.costs.verify_ms(g) for g in gammas)
    assert shares == pytest.approx(10.0 + 0.5 * sum(g + 1 for g in gammas), rel=1e-6)


def test_drafting_that_pays_alone_is_dropped_under_load_and_resumed_after():
    """Alone, drafting amortizes the verify pass's fixed cost; with 32 sessions per pass that
    cost is shared, and where the verifier drafts too, a half-accepted draft's tokens cost the
    saturated verifier more than they return."""
    alone = trained(lambda g: loaded_cycle(g, 1), [2, 4, 1, 3] * 4, on_verifier=True)
    assert alone.choose() > 0 and alone.choose() == brute_force_choice(alone, alone.max_gamma)
    loaded = trained(lambda g: loaded_cycle(g, 32), [2, 4, 1, 3] * 4, on_verifier=True)
    assert loaded.pair_alpha == pytest.approx(alone.pair_alpha)
    assert loaded.choose() == brute_force_choice(loaded, loaded.max_gamma) < alone.choose()
    for i in range(120):  # the load goes: once the passes are no longer shared, γ = 0 is priced alone
        g = loaded.choose()  # (every other drafted token accepted, counted across cycles: α = 0.5 at γ = 1 too)
        loaded.observe(replace(loaded_cycle(g, 1), accepted=(g * (i + 1)) // 2 - (g * i) // 2))
    assert not loaded.costs.shared and loaded.choose() > 0


def test_a_draft_workers_steps_are_its_own_devices_time():
    """With 32 sessions per pass and no latency the verifier is saturated. A draft worker's steps
    run on a device of its own meanwhile, so drafting pays what it adds to the verify pass
    alone; the same steps on the verifier (its head) cost it more than they return."""
    worker = trained(lambda g: loaded_cycle(g, 32), [2, 4, 1, 3] * 4)
    head = trained(lambda g: loaded_cycle(g, 32), [2, 4, 1, 3] * 4, on_verifier=True)
    assert worker.choose() == brute_force_choice(worker, worker.max_gamma) > 0
    assert head.choose() == 0
    verifier, drafter, replica, _ = worker.costs.stations(2)
    assert drafter[0] == 0.0 and drafter[2] == pytest.approx(2 * worker.costs.draft_ms_per_token() + 0.3, rel=1e-6)
    assert head.costs.stations(2)[0][2] == pytest.approx(verifier[2] + drafter[2], rel=1e-6)


def test_gamma_0_is_priced_at_the_passes_its_cohort_merges_into():
    """γ = 0's cohorts shared passes of 8 sessions; drafting's passes hold 4 (its cohorts a pass
    apart): γ = 0 is priced at the fuller passes, drafting at its own, and the fuller passes'
    measure fades as passes stop reaching them."""
    policy = trained(lambda g: loaded_cycle(g, 8), [0] * 16)
    for g in [2, 4, 1, 3] * 8:
        policy.observe(loaded_cycle(g, 4))
    costs = policy.costs
    assert costs.fill(0) == pytest.approx(8.0, rel=0.2) and costs.fill(2) == pytest.approx(4.0, rel=0.05)
    assert costs.verify_ms(0) == pytest.approx(10.0 / costs.fill(0) + 0.5, rel=1e-6)
    assert costs.verify_ms(2) == pytest.approx(10.0 / 4 + 0.5 * 3, rel=0.03)
    for _ in range(400):
        policy.observe(loaded_cycle(2, 4))
    assert costs.fill(0) == pytest.approx(4.0, rel=0.05)


def test_gamma_0_is_priced_at_no_more_sessions_than_are_left():
    """A run's last streams: the passes held 8 lately, 2 sessions are left. γ = 0 is priced at the
    2 that can line up, not the 8 that did: the cycle the loop's 2 sessions make, as drafting's."""
    policy = trained(lambda g: loaded_cycle(g, 8), [0] * 16)
    for g in [2, 4, 1, 3] * 4:
        policy.observe(loaded_cycle(g, 2))
    costs = policy.costs
    assert costs.fill(0) > 6.0 and costs.fill(0, 8) > 6.0
    assert costs.fill(0, 2) == pytest.approx(costs.fill(2), rel=0.1)
    assert costs.stations(2, sessions=2)[0][0] > 1.5 * costs.stations(2)[0][0]


def test_call_costs_that_grow_with_gamma_are_learned_as_lines():
    """Sampled, every drafted token carries its distribution: the calls' CPU, the orchestrator's
    and the latency grow with γ (k ms-ish per token here). The policy learns each as a line in γ,
    so its cycle is the true cycle at every γ, and it picks the true best γ, lower as k grows. As
    one number per call (a mean over the γs it ran), long blocks looked cheap."""
    def sampled(g: int, k: float) -> CycleCosts:
        c = loaded_cycle(g, 1)
        return replace(c, accepted=(3 * g) // 4, draft_call_ms=(0.3 + 0.2 * k * g) if g else 0.0,
                       draft_latency_ms=(2.0 + 0.4 * k * g) if g else 0.0, verify_call_ms=0.3 + 0.2 * k * g,
                       latency_ms=2.0 + 0.3 * k * g, overhead_ms=0.5 + 0.1 * k * g)

    def true_ms(g: int, k: float) -> float:  # loaded_cycle's passes alone: a draft step 2.4, a verify 10 + 0.5/token
        draft = 2.4 * g + 0.3 + 0.2 * k * g + 2.0 + 0.4 * k * g if g else 0.0
        return draft + 10.0 + 0.5 * (g + 1) + 0.3 + 0.2 * k * g + 2.0 + 0.3 * k * g + 0.5 + 0.1 * k * g

    chosen = []
    for k in (0.0, 2.0, 8.0):
        policy = trained(lambda g: sampled(g, k), [2, 4, 1, 3, 6, 2, 5] * 4)
        assert [policy.costs.cycle_ms(g) for g in range(9)] == pytest.approx([true_ms(g, k) for g in range(9)])
        best = max(range(9), key=lambda g: policy.expected_tokens(8)[g] / true_ms(g, k))
        assert policy.choose() == best
        chosen.append(best)
    assert chosen[0] > chosen[1] > chosen[2] == 0


def test_latency_is_the_sessions_own_time_alone_and_shared_under_load():
    """40 ms per cycle of waiting (the network, the loop, a core) and no CPU: alone it is the
    session's own time and drafting amortizes it; with 32 sessions per pass it is charged at a
    pass's share, and the session drafts shorter blocks than alone. Charged whole (as wall time
    was), it kept γ high at 64 sessions, below γ = 0's throughput."""
    def waiting(cycle: CycleCosts) -> CycleCosts:
        return replace(cycle, latency_ms=40.0)

    alone = trained(lambda g: waiting(loaded_cycle(g, 1)), [2, 4, 1, 3] * 4)
    quick = trained(lambda g: loaded_cycle(g, 1), [2, 4, 1, 3] * 4)
    assert alone.costs.latency.at(3) == pytest.approx(40.0, rel=0.05) and alone.choose() > quick.choose() > 0
    loaded = trained(lambda g: waiting(loaded_cycle(g, 32)), [2, 4, 1, 3] * 4)
    verifier = 10.0 / 32 + 0.5 + 0.3
    assert loaded.costs.cycle_ms(0) == pytest.approx(closed_loop_ms((verifier, 0.0, 0.5), 40.0, 32), rel=1e-3)
    assert verifier < loaded.costs.cycle_ms(0) < (40.0 + verifier + 0.5) / 32 + verifier
    assert loaded.choose() == brute_force_choice(loaded, loaded.max_gamma) < alone.choose()


def test_a_rounds_sessions_choose_from_one_answer():
    """Under load the cycles' prices are worked out once a round (as many cycles observed as
    sessions in flight): a cohort's sessions choose one after another in one turn of the replica's
    loop, and each working them out again held the turn's calls. Alone, every cycle."""
    loaded = trained(lambda g: loaded_cycle(g, 8), [2, 4, 1, 3] * 4)
    first = loaded.costs.cycles_ms(8, sessions=8)
    dear = replace(loaded_cycle(0, 8), verify_cost_ms=200.0)
    for _ in range(7):
        loaded.observe(dear)
        assert loaded.costs.cycles_ms(8, sessions=8) is first
    loaded.observe(dear)
    assert loaded.costs.cycles_ms(8, sessions=8)[0] > first[0]
    # One worked out from the replica's first cycle lasts one cycle: 32 sessions in flight would
    # have held a price made of one cycle's measurements for 32.
    fresh = trained(lambda g: loaded_cycle(g, 32), [2])
    first = fresh.costs.cycles_ms(8)
    fresh.observe(loaded_cycle(4, 32))
    assert fresh.costs.cycles_ms(8) is not first
    alone = trained(lambda g: loaded_cycle(g, 1), [2, 4, 1, 3] * 4)
    before = alone.costs.cycles_ms(8)
    alone.observe(replace(loaded_cycle(0, 1), verify_cost_ms=200.0))
    assert alone.costs.cycles_ms(8)[0] > before[0]


def machine_repairman_ms(demand: float, think: float, sessions: int) -> float:
    """1 / throughput of one exponential station and a think time (the machine repairman model),
    in closed form: X = (1 − p0) / D, p0 = 1 / Σ_k N! / (N − k)! · (D / Z)^k."""
    terms, term = [1.0], 1.0
    for k in range(1, sessions + 1):
        term *= (sessions - k + 1) * demand / think
        terms.append(term)
    return demand / (1.0 - 1.0 / sum(terms))


@pytest.mark.parametrize("demand, think, sessions", [(1.0, 4.0, 1), (1.0, 4.0, 8), (0.3, 40.0, 32), (2.0, 1.0, 5)])
def test_closed_loop_time_is_the_machine_repairman_models(demand, think, sessions):
    """Mean-value analysis is exact for one station and a think time: its closed form. One
    session's is its whole cycle; many sessions' approach the station's demand."""
    assert closed_loop_ms((demand,), think, sessions) == pytest.approx(machine_repairman_ms(demand, think, sessions),
                                                                       rel=0.01)
    assert closed_loop_ms((demand, 0.5, 0.0), think, 1) == pytest.approx(think + demand + 0.5)


def test_closed_loop_time_is_the_busiest_stations_once_it_saturates():
    assert closed_loop_ms((1.0, 0.25), 2.0, 64) == pytest.approx(1.0, rel=0.011)
    assert closed_loop_ms((1.0, 0.25), 2.0, 2) > (2.0 + 1.25) / 2


def test_sessions_that_share_passes_draft_one_gamma_as_a_cohort():
    """Under load a session's cycle lasts as long as its cohort's (the policy's docstring): every
    session chooses with the replica's acceptance, so a session whose last blocks the draft
    followed and one whose last blocks it did not draft the same γ, a new session's."""
    replica = GammaPolicy()
    for accepted in [4, 2, 3, 1] * 8:
        replica.for_session().observe(replace(loaded_cycle(4, 8), accepted=accepted))
    followed, lost = replica.for_session(), replica.for_session()
    for _ in range(8):
        followed.observe(replace(loaded_cycle(4, 8), accepted=4))
        lost.observe(replace(loaded_cycle(4, 8), accepted=0))
    assert followed.costs.shared and followed.choose() == lost.choose() == replica.for_session().choose() > 0


def test_a_cohort_drafts_the_shortest_block_within_the_best_ones_error_and_keeps_it():
    """On a flat S curve the best γ is the one whose estimate came out highest, and a long block's
    E rests on the fewest blocks (the policy's docstring, The cohorts' γ): a cohort drafts the shortest
    block whose S is within a standard error of the best's, and keeps its γ while that γ is
    within it. Known well, or alone, the best."""
    def taught(sessions: int, cycles: int) -> GammaPolicy:
        replica = GammaPolicy(opening_blocks=0)
        for g in [3, 6] * cycles:
            replica.for_session().observe(replace(loaded_cycle(g, sessions), accepted=g))
        return replica
    young = taught(8, 5)
    rates, error = young.rates(8, sessions=8), [young.expected_error(g) for g in range(9)]
    best, chosen = rates.index(max(rates)), young.choose(sessions=8)  # the smallest on a tie
    floor = rates[best] * (1.0 - error[best])
    assert young.costs.shared and 0 < chosen < best
    assert rates[chosen] >= floor > max(rates[1:chosen])
    assert error[0] == 0.0 < error[1] < error[4] < error[8] < 0.1
    young.probes.gamma = best  # held while within the error, whichever it is
    assert young.choose(sessions=8) == best
    young.probes.gamma = 1  # below it: the shortest within
    assert rates[1] < floor and young.choose(sessions=8) == chosen
    known = taught(8, 40)
    known_rates = known.rates(8, sessions=8)
    assert known.choose(sessions=8) == known_rates.index(max(known_rates))
    alone = taught(1, 5)
    alone_rates = alone.rates(8)
    assert not alone.costs.shared and alone.choose() == alone_rates.index(max(alone_rates))


def lost_cycle(gamma: int) -> CycleCosts:
    """A cycle in passes of 8 sessions, 20 ms of wall time, its draft rejected at its first token."""
    return replace(loaded_cycle(gamma, 8), accepted=0, wall_ms=20.0)


def losing_cohort_replica(now: list[float]) -> GammaPolicy:
    """A replica on the clock now[0] whose sessions share passes at the verifier's head (its steps
    queue with the verifies: drafting at a loss costs), after drafting cycles the draft lost."""
    replica = GammaPolicy(probes=CohortProbes(clock=lambda: now[0]), opening_blocks=0)
    replica.costs.drafts_on_verifier = True
    for g in [4, 2, 4, 6] * 4:
        replica.for_session().observe(lost_cycle(g))
    return replica


def test_sessions_that_share_passes_probe_together_on_the_replicas_schedule():
    """Under load a session that probes alone lags its cohort by a draft call (the policy's
    docstring): sessions that share passes probe all at once, `gap` of the replica's cycles (in
    their wall time) after its last drafting cycle, whatever their own streaks; a probe that
    does not make drafting win doubles the gap, one that does brings it back to probe_every.
    Alone, each session keeps its own streak."""
    now = [0.0]
    replica = losing_cohort_replica(now)
    cohort = [replica.for_session() for _ in range(8)]
    assert replica.costs.shared and [s.choose() for s in cohort] == [0] * 8
    for streak, session in enumerate(cohort):  # their own streaks differ and do not count
        session.zero_streak = streak + 20
        session.observe(lost_cycle(0))
    assert [s.choose() for s in cohort] == [0] * 8
    now[0] += 2 * 8 * 0.020  # the last probe accepted nothing: due 2 · probe_every cycles of 20 ms on
    probes = [s.choose() for s in cohort]
    assert all(g > 0 for g in probes)  # all at once
    cohort[0].observe(lost_cycle(probes[0]))  # the first outcome: nothing accepted, the gap doubles again
    assert replica.probes.gap == 4 * replica.probe_every and cohort[1].choose() == 0
    now[0] += 4 * 8 * 0.020
    cohort[1].observe(replace(lost_cycle(cohort[1].choose()), accepted=1))  # a token, and still γ = 0 wins
    assert replica.probes.gap == 8 * replica.probe_every and cohort[2].choose() == 0
    good = lambda g: replace(loaded_cycle(g, 8), accepted=g, wall_ms=20.0)  # the draft turns right
    for _ in range(80):  # outcomes before the next probe is due do not set the gap
        cohort[2].observe(good(4))
    assert replica.probes.gap == 8 * replica.probe_every
    now[0] = replica.probes.due_at
    cohort[3].observe(good(4))  # the first outcome of a due probe, after which drafting wins
    assert replica.probes.gap == 0 and all(s.choose() > 0 for s in cohort)

    alone = GammaPolicy(probes=CohortProbes(clock=lambda: now[0]))
    for g in [4, 2, 4, 6] * 4:
        alone.observe(replace(lost_cycle(g), verify_batching=None, draft_batching=None))
    assert not alone.costs.shared
    alone.zero_streak = alone.probe_every - 1
    assert alone.choose() > 0  # its own streak, whatever the replica's schedule
    alone.zero_streak = 0
    now[0] += 1000.0
    assert alone.choose() == 0


def test_a_cohort_probe_whose_draft_caught_up_goes_on_to_a_steady_cycle():
    """A probe's draft call that caught up on a γ-0 streak (it fed the worker more than a steady
    cycle) measures no steady cost, so the probe goes on through the next turn and its outcome is
    the first steady cycle's: decided on the catch-up, the draft's costs stayed those of a
    replica's start for a whole run. The gap counts the replica's steady cycles, not the
    catch-up's own wall time (2 s here: timed by it the next probe fell due 2 · probe_every · 2 s
    on)."""
    now = [0.0]
    replica = losing_cohort_replica(now)
    session = replica.for_session()
    session.observe(lost_cycle(0))
    now[0] = replica.probes.due_at  # a probe is due; its draft catches up on 40 tokens, for 2 s
    probe = session.choose()
    assert probe > 0 and replica.probes.gap == 2 * replica.probe_every
    now[0] += 2.0
    session.observe(replace(lost_cycle(probe), wall_ms=2000.0, draft_fed=40))
    assert replica.probes.gap == 2 * replica.probe_every and replica.probes.awaiting  # not its outcome
    assert session.choose() == probe  # the next turn probes too
    now[0] += 0.020
    session.observe(lost_cycle(probe))  # steady: the probe's outcome, nothing accepted
    assert replica.probes.gap == 4 * replica.probe_every and not replica.probes.awaiting
    assert replica.probes.due_at == pytest.approx(now[0] + 4 * 8 * 0.020)  # steady cycles of 20 ms
    now[0] += 0.010
    assert session.choose() == 0
    for _ in range(4 * 8):
        now[0] += 0.020
        session.observe(lost_cycle(0))
    assert session.choose() > 0


def test_a_lone_probe_whose_draft_caught_up_goes_on_to_a_steady_cycle():
    """Alone as in a cohort: a probe that caught the draft up is followed by one more drafting
    cycle, whose outcome sets the wait for the next probe."""
    policy = trained(costly_bad_cycle, [4, 2, 4, 6] * 8)
    for _ in range(policy.probe_every - 1):
        assert policy.choose() == 0
        policy.observe(costly_bad_cycle(0))
    probe = policy.choose()
    assert probe > 0
    policy.observe(replace(costly_bad_cycle(probe), draft_fed=policy.probe_every))
    assert policy.probe_gap == 0 and policy.choose() == probe  # the probe goes on
    policy.observe(costly_bad_cycle(probe))
    assert policy.probe_gap == 2 * policy.probe_every and policy.choose() == 0


def test_the_drafts_costs_fade_while_it_does_not_draft():
    """What a draft call cost when the replica last drafted (at its start, amid the sessions'
    prefills: 3.9 ms of the worker's CPU a call, where a steady call costs 0.3) fades over the
    γ-0 cycles after it, so the next steady call's costs outweigh it; drafting cycles do not fade
    it, and the line stays as it was until a new call is measured."""
    policy = trained(lambda g: replace(cheap_good_cycle(g), draft_call_ms=3.9), [1, 1, 2, 1])
    assert policy.costs.draft_call.at(1) == pytest.approx(3.9)
    for _ in range(64):
        policy.observe(cheap_good_cycle(0))
    assert policy.costs.draft_call.at(1) == pytest.approx(3.9)  # faded, not moved
    policy.observe(cheap_good_cycle(2))
    assert policy.costs.draft_call.at(2) == pytest.approx(0.3, abs=0.02)
    without_fading = trained(lambda g: replace(cheap_good_cycle(g), draft_call_ms=3.9), [1, 1, 2, 1])
    for _ in range(8):  # drafting cycles drafted ahead: no draft call, no fading
        without_fading.observe(replace(cheap_good_cycle(3), drafted_ahead=True))
    without_fading.observe(cheap_good_cycle(2))
    assert without_fading.costs.draft_call.at(2) > 2.0


def test_a_cohort_probe_lasts_one_turn():
    """Where the verifier drafts, a session chooses its next γ before its probe's outcome is back:
    a probe held due until then ran two rounds. It lasts the turn it began in (half a cycle); a
    probe whose outcome never comes back (its sessions ended) is followed by the next one a gap
    after it began."""
    now = [0.0]
    replica = losing_cohort_replica(now)
    cohort = [replica.for_session() for _ in range(8)]
    now[0] = replica.probes.due_at
    assert all(s.choose() > 0 for s in cohort)  # one turn: all of them
    now[0] += 0.005
    assert all(s.choose() > 0 for s in cohort)  # still the turn (half a cycle of 20 ms)
    began = now[0] - 0.005
    now[0] = began + 0.020  # the next round: the probe's outcome is not back, and no one probes again
    assert [s.choose() for s in cohort] == [0] * 8
    now[0] = began + (replica.probes.gap or replica.probe_every) * 0.020  # none came back
    assert all(s.choose() > 0 for s in cohort)


# --- across a network: the replica's acceptance, fading evidence, drafting ahead ------------


def remote_cycle(gamma: int, accepted: int, guessed: bool | None = None) -> CycleCosts:
    """A lone session's cycle with its workers a 40 ms round trip away (loaded_cycle's costs)."""
    return replace(loaded_cycle(gamma, 1), accepted=accepted, latency_ms=40.0,
                   draft_latency_ms=40.0 if gamma else 0.0, guessed=guessed)


def replica_that_saw(accepted_of_4: list[int], **settings) -> GammaPolicy:
    """The replica's policy (settings, costs, acceptance) after sessions drafted 4-token blocks
    that accepted these many tokens."""
    replica = GammaPolicy(**({"opening_blocks": 0} | settings))
    for a in accepted_of_4:
        session = replica.for_session()
        session.observe(remote_cycle(4, a))
    return replica


def test_the_replica_learns_no_acceptance_from_a_streams_opening():
    """A stream's first drafted blocks are its hardest (measured on the shipped pair: a block's
    first token accepted 0.42 of the time in a stream's first block, 0.50 in its second, 0.72
    later). A fresh replica whose first cohort all sit at their openings learned α from them alone
    and held γ = 0 for most of those streams; its acceptance now comes from blocks past them."""
    replica = GammaPolicy()
    cohort = [replica.for_session() for _ in range(8)]
    for session in cohort:
        session.observe(remote_cycle(4, 0))
        session.observe(remote_cycle(4, 0))
    assert replica.pair.verified == 0 and replica.pair_alpha == pytest.approx(replica.prior_alpha)
    assert cohort[0].blocks == 2  # its own count
    for session in cohort:
        session.observe(remote_cycle(4, 3))
    assert replica.pair_alpha > replica.prior_alpha
    counted = GammaPolicy(opening_blocks=0)  # the control: openings taught the replica
    for _ in range(8):
        session = counted.for_session()
        session.observe(remote_cycle(4, 0))
        session.observe(remote_cycle(4, 0))
    assert counted.pair_alpha < replica.prior_alpha / 2
    # A stored session keeps its count of blocks: resumed past its opening, it teaches the replica.
    resumed = replica.for_session(cohort[0].to_dict())
    assert resumed.blocks == 3
    before = replica.pair.verified
    resumed.observe(remote_cycle(4, 4))
    assert replica.pair.verified > before


def test_a_sessions_own_blocks_do_not_move_its_choice():
    """A session's last blocks say little of its next one (on the test bed, a correlation of
    0.13): across a round trip, a session whose first two blocks are rejected at their first token
    keeps drafting where the replica has seen this draft right two times in three, as a new
    session does (the replica learned of those two blocks too)."""
    replica = replica_that_saw([4, 2, 3, 0, 4, 1] * 6)
    session = replica.for_session()
    session.observe(remote_cycle(4, 0))
    session.observe(remote_cycle(4, 0))
    assert 0.6 < replica.pair_alpha < 0.8
    assert session.choose() == replica.for_session().choose() >= 2


def test_acceptance_by_position_starts_from_the_iid_closed_form():
    """Before any block, every position's acceptance is the prior α: E[tokens | γ] is the i.i.d.
    closed form, and so are the chances drafting ahead counts on."""
    policy = GammaPolicy(prior_alpha=0.7)
    assert policy.expected_tokens(8) == pytest.approx([expected_tokens(0.7, g) for g in range(9)], rel=1e-12)
    assert policy.survival(8) == pytest.approx([0.7 ** g for g in range(9)], rel=1e-12)


def test_acceptance_by_position_is_censored_at_the_first_rejection_and_at_gamma():
    """A block verifies its positions up to its first rejection, at most γ: those are the ones
    it reached, and it passed the ones it accepted."""
    policy = GammaPolicy(opening_blocks=0)
    policy.observe(remote_cycle(4, 2))
    assert policy.pair.reached == [1, 1, 1, 0] and policy.pair.passed == [1, 1, 0, 0]
    policy.observe(remote_cycle(2, 2))
    d = policy.pair.decay
    assert policy.pair.reached == pytest.approx([1 + d, 1 + d, d, 0]) and policy.pair.passed == pytest.approx([1 + d, 1 + d, 0, 0])
    policy.observe(remote_cycle(6, 0))
    assert len(policy.pair.reached) == 6 and policy.pair.reached[0] == pytest.approx(1 + d + d * d)
    assert policy.pair.passed[0] == pytest.approx(d + d * d) and policy.pair.reached[1] == pytest.approx(d + d * d)


EASY, HARD = 0.95, 0.3  # a token's acceptance in text the draft follows, and in text it does not


def bursty(n: int, easy: float, seed: int = 0) -> list[int]:
    """Accepted tokens of n 8-token blocks whose acceptance is bursty: a block is in text the draft
    follows (each token accepted with EASY) with probability `easy`, else in text it does not (HARD)."""
    rng = random.Random(seed)
    blocks = []
    for _ in range(n):
        p = EASY if rng.random() < easy else HARD
        blocks.append(next((j for j in range(8) if rng.random() >= p), 8))
    return blocks


def test_bursty_acceptance_is_learned_by_position():
    """A block that has got far is in text the draft follows: its later positions accept more
    often than its first. Learned by position, E[tokens | γ] is the blocks' own at every γ;
    the i.i.d. form at the same α overvalues short blocks (most accepted tokens are easy blocks'),
    which blocks whose tokens are accepted independently teach the policy instead (within noise)."""
    replica = replica_that_saw([])
    for accepted in bursty(400, easy=0.6):
        replica.for_session().observe(remote_cycle(8, accepted))
    policy = replica.for_session()
    rates = policy.pair.by_position(policy.pair_alpha, 8)
    assert rates[0] < policy.pair_alpha < rates[-1]
    truth = [0.6 * expected_tokens(EASY, g) + 0.4 * expected_tokens(HARD, g) for g in range(9)]
    assert policy.expected_tokens(8) == pytest.approx(truth, rel=0.1)
    iid = [expected_tokens(policy.pair_alpha, g) for g in range(9)]
    assert max(i / t for i, t in zip(iid, truth)) > 1.1
    independent = replica_that_saw([])
    rng = random.Random(1)
    for _ in range(400):
        independent.for_session().observe(remote_cycle(8, next((j for j in range(8) if rng.random() >= 0.7), 8)))
    flat = independent.for_session()
    assert flat.expected_tokens(8) == pytest.approx([expected_tokens(flat.pair_alpha, g) for g in range(9)], rel=0.1)


def test_hope_scales_the_replicas_acceptance_by_position():
    """A session's acceptance is the replica's at every position; hopeful (γ = 0 wins only by the
    replica's error), every position's odds are scaled to the higher α: more at every position,
    less at none."""
    replica = replica_that_saw([])
    for accepted in bursty(200, easy=0.6):
        replica.for_session().observe(remote_cycle(8, accepted))
    session = replica.for_session()
    assert session.survival(8)[1:] == pytest.approx(
        list(accumulate(replica.pair.by_position(replica.pair_alpha, 8), lambda a, b: a * b)))
    ratios = [h / s for h, s in zip(session.survival(8, hopeful=True)[1:], session.survival(8)[1:])]
    assert replica.pair_error > 0 and all(r > 1 for r in ratios) and ratios == sorted(ratios)


def test_gamma_0_wins_only_by_the_replicas_error():
    """γ = 0 teaches nothing of the draft, so a low estimate would stand (the hot stove): γ = 0
    wins only where it wins at α a standard error of the replica's higher. On a dozen blocks the
    replica's α (0.42, just short of where drafting pays across this link) is unsure, and a
    session drafts what that hope is worth; on ninety blocks at the same α it is sure, and γ = 0
    wins. Sessions that share passes choose at the estimate: their cohort's probes explore (the
    n-gram at 8 in flight drafted at a loss on hope)."""
    unsure, sure = replica_that_saw([1, 1, 0] * 4), replica_that_saw([1, 1, 0] * 30)
    assert unsure.pair_alpha == pytest.approx(sure.pair_alpha, abs=0.02) and unsure.pair_error > sure.pair_error
    session = unsure.for_session()
    hopeful = session.rates(8, hopeful=True)
    assert brute_force_choice(session, 8) == 0 and 0 < session.choose() == hopeful.index(max(hopeful))
    assert sure.for_session().choose() == 0 and replace(unsure, hope=0.0).for_session().choose() == 0
    cohort = GammaPolicy(opening_blocks=0, probes=CohortProbes(clock=lambda: 0.0))
    cohort.costs.drafts_on_verifier = True
    for accepted in [1, 0, 1, 0]:
        cohort.for_session().observe(replace(loaded_cycle(4, 8), accepted=accepted, wall_ms=20.0))
    member = cohort.for_session()
    hopeful = member.rates(8, hopeful=True)
    assert cohort.costs.shared and hopeful.index(max(hopeful)) > 0 and member.choose() == 0


def test_drafting_ahead_saves_the_draft_call_it_guesses():
    """Alone, a block drafted ahead skips the next cycle's draft call (a round trip here) with
    probability α^γ · (the replica's rate of right guesses): the policy charges drafting that much
    less, and drafts more."""
    replica = replica_that_saw([4, 3, 4, 2] * 10)
    for _ in range(20):
        replica.for_session().observe(remote_cycle(4, 4, guessed=True))
    policy = replica.for_session()
    costs, alpha, survival = policy.costs, policy.pair_alpha, policy.survival(8)
    guessed = (policy.pair.hits + 2 * alpha) / (policy.pair.guesses + 2)
    assert guessed > 0.9
    plain, ahead = costs.cycles_ms(8), costs.cycles_ms(8, policy.ahead_rates(survival))
    for g in range(1, 9):
        draft_call = costs.draft_call.at(g) + costs.draft_overhead.at(g) + costs.draft_latency.at(g)
        saved = survival[g] * guessed * (g * costs.draft_ms_per_token() + draft_call)
        assert ahead[g] == pytest.approx(plain[g] - saved)
    assert ahead[0] == plain[0]
    assert policy.choose(ahead=True) >= policy.choose() > 0
    assert policy.tokens_per_ms(3, ahead=True) > policy.tokens_per_ms(3)
    for _ in range(1000):  # guesses that never come true save nothing
        replica.for_session().observe(remote_cycle(4, 4, guessed=False))
    session = replica.for_session()
    assert max(session.ahead_rates(session.survival(8))) < 0.05


def test_drafting_ahead_past_rejections_saves_the_draft_call_after_them_too():
    """Past rejections at a block's first R positions, a block drafted ahead is also ready when
    the block is rejected there, 1 − α^min(γ, R) of the time, and the recovered token guessed
    (the replica's rate): the policy charges drafting that much less again, and no less than
    without them; a session that never guesses the recovered token saves nothing by them."""
    replica = replica_that_saw([4, 3, 4, 2] * 10, ahead_rejections=2)
    for recovered in [True, False, True] * 10:
        replica.for_session().observe(replace(remote_cycle(4, 1), recovered=recovered))
    policy = replica.for_session()
    alpha, pair, survival = policy.pair_alpha, policy.pair, policy.survival(8)
    bonus = (pair.hits + 2 * alpha) / (pair.guesses + 2)
    recovered = (pair.recoveries + alpha) / (pair.rejections + 2)
    assert 0.6 < recovered < 0.7
    rates, bonus_only = policy.ahead_rates(survival), replace(policy, ahead_rejections=0).ahead_rates(survival)
    assert rates[0] == 0.0
    for g in range(1, 9):
        assert rates[g] == pytest.approx(survival[g] * bonus + (1 - survival[min(g, 2)]) * recovered)
        assert rates[g] > bonus_only[g]
    assert policy.tokens_per_ms(4, ahead=True) > replace(policy, ahead_rejections=0).tokens_per_ms(4, ahead=True)
    for _ in range(1500):
        replica.for_session().observe(replace(remote_cycle(4, 0), recovered=False))
    never = replica.for_session()
    survival = never.survival(8)
    assert never.ahead_rates(survival)[4] == pytest.approx(
        replace(never, ahead_rejections=0).ahead_rates(survival)[4], abs=0.01)


def test_a_lone_cycles_wait_for_its_draft_ahead_call_is_priced_at_its_gamma_and_beyond():
    """Alone, the cycle waits after the verdict for its draft-ahead call, γ + 1 steps under each
    guess (at T = 1 on the test bed: nothing at γ = 3, 8–12 ms at 6–8). The policy learns that
    wait per γ, from none (a stray slow call moves it a tenth of the way), and charges it where
    the loop drafts ahead, at γ and every longer block: long blocks that outlast the verify stop
    looking cheap, and a loop that does not draft ahead pays nothing."""
    policy = trained(cheap_good_cycle, [4, 8, 6, 8, 2, 8] * 5)
    assert policy.choose(ahead=True) == policy.choose() == 8
    costs = policy.costs
    costs.observe(replace(cheap_good_cycle(3), ahead_wait_ms=10.0))
    assert costs.ahead_wait == {3: pytest.approx(1.0)}  # from none, a tenth of the way
    costs.observe(replace(cheap_good_cycle(3), ahead_wait_ms=0.0, verify_fed=40))  # a prefill teaches none
    assert costs.ahead_wait == {3: pytest.approx(1.0)}
    for _ in range(60):
        for gamma, wait in [(3, 0.1), (6, 40.0)]:
            costs.observe(replace(cheap_good_cycle(gamma), ahead_wait_ms=wait))
        costs.observe(cheap_good_cycle(8))  # no draft-ahead call answered: no wait learned
    assert costs.ahead_waits(8) == pytest.approx([0.0] * 3 + [0.1] * 3 + [40.0] * 3, rel=0.02, abs=1e-3)
    session = policy.for_session()
    hits = [0.0] * 9
    plain, ahead = costs.cycles_ms(8), costs.cycles_ms(8, hits)
    assert [a - p for a, p in zip(ahead, plain)] == pytest.approx(costs.ahead_waits(8))
    assert session.choose() == 8 and 3 <= session.choose(ahead=True) < 6


def test_the_draft_calls_orchestrator_cpu_is_charged_to_drafting_cycles_only():
    """A drafting cycle makes one call more, and the orchestrator's CPU is mostly per call: its
    draft call's share is learned from drafting cycles and charged to γ > 0 only."""
    def cpu(cycle: CycleCosts) -> CycleCosts:
        return replace(cycle, overhead_ms=1.0, draft_overhead_ms=0.5 if cycle.gamma else 0.0)

    policy = trained(lambda g: cpu(loaded_cycle(g, 4)), [0, 2, 4, 0, 1, 3] * 4)
    costs = policy.costs
    assert costs.overhead.at(3) == pytest.approx(1.0) and costs.draft_overhead.at(3) == pytest.approx(0.5)
    replica = costs.stations(3)[2]
    unaware = replace(costs, draft_overhead=LinearFit()).stations(3)[2]
    assert replica[0] == unaware[0] and all(c == pytest.approx(u + 0.5) for c, u in zip(replica[1:], unaware[1:]))


def test_a_call_without_a_batching_report_counts_as_alone():
    reported = trained(lambda g: loaded_cycle(g, 1), [2, 4, 1, 3] * 3)
    silent = trained(lambda g: replace(loaded_cycle(g, 1), draft_batching=None, verify_batching=None), [2, 4, 1, 3] * 3)
    assert silent == reported


def test_a_session_stores_its_own_state_and_shares_the_replicas_costs_and_acceptance():
    """to_dict is the session's own state (a few numbers, through JSON); for_session gives a
    stored or new session the replica's settings and its costs, the very object, so that every
    session's cycles measure them and every session's choice reads them."""
    policy = trained(cheap_good_cycle, [4, 8, 6, 2, 8, 0, 0, 3])
    state = json.loads(json.dumps(policy.to_dict()))
    assert set(state) == set(SESSION_STATE) and state["blocks"] > 0
    replica = GammaPolicy(costs=policy.costs, pair=policy.pair, probes=policy.probes)  # the replica's, no session
    restored = replica.for_session(state)
    assert restored == policy and restored.costs is policy.costs and restored.pair is policy.pair
    assert restored.probes is policy.probes
    for limit in range(5):
        assert restored.choose(limit) == policy.choose(limit)
    fresh = replica.for_session()
    assert fresh.costs is policy.costs and fresh.to_dict() == SESSION_STATE and fresh.pair_alpha > fresh.prior_alpha
    n = policy.costs.verify_pass.n
    fresh.observe(costly_bad_cycle(3))  # measures the replica's costs, and counts its own blocks
    assert policy.costs.verify_pass.n > n and restored.to_dict() == state and fresh.blocks == 1


def test_a_stored_state_with_unknown_or_missing_fields_restores():
    """A record written by another version: the settings stay the replica's, unknown fields
    (such as the costs and the acceptance older versions stored per session) are ignored."""
    replica = GammaPolicy(max_gamma=6)
    restored = replica.for_session({"probe_gap": 16, "accepted": 1.5, "max_gamma": 3, "draft_pass": {"n": 4.0}, "newer": 1})
    assert restored.max_gamma == 6 and restored.probe_gap == 16 and restored.zero_streak == 0
    assert restored.costs is replica.costs and restored.costs.draft_pass.n == restored.costs.verify_pass.n == 0
    assert replica.for_session({}) == replica.for_session(None) == replica


def shape_cycle(tree: bool, cost_ms: float) -> CycleCosts:
    return CycleCosts(gamma=3, accepted=2, draft_cost_ms=cost_ms / 2, draft_call_ms=0.0, verify_cost_ms=cost_ms / 2,
                      verify_call_ms=0.0, overhead_ms=0.0, tree=tree)


def test_auto_shape_tries_both_then_drafts_the_faster_and_probes_the_other():
    policy = GammaPolicy(probe_every=4)
    assert not policy.choose_tree()  # a chain first
    policy.observe(shape_cycle(False, 10.0), output_tokens=3)
    assert policy.choose_tree()  # then a tree
    policy.observe(shape_cycle(True, 12.0), output_tokens=5)  # 0.42 tokens/ms against the chain's 0.30
    picks = []
    for _ in range(8):
        tree = policy.choose_tree()
        picks.append(tree)
        policy.observe(shape_cycle(tree, 12.0 if tree else 10.0), output_tokens=5 if tree else 3)
    assert picks == [True, True, False, True, True, True, False, True]  # the chain every 4th drafting cycle
    for _ in range(30):  # trees turn slow: the chain wins from its next probe on
        tree = policy.choose_tree()
        policy.observe(shape_cycle(tree, 40.0 if tree else 10.0), output_tokens=5 if tree else 3)
    assert [policy.choose_tree() for _ in range(1)] == [False]
    fresh = policy.for_session()
    assert (fresh.chain_ms, fresh.tree_ms) == (0.0, 0.0) and not fresh.choose_tree()


def test_a_prefilling_cycle_does_not_count_for_its_shape():
    """The first cycle feeds the prompt: its cost says nothing about chains against trees."""
    policy = GammaPolicy()
    prefill = CycleCosts(gamma=4, accepted=2, draft_cost_ms=90.0, draft_call_ms=0.0, verify_cost_ms=200.0,
                         verify_call_ms=0.0, overhead_ms=1.0, draft_fed=60, verify_fed=60)
    policy.observe(prefill, output_tokens=3)
    assert (policy.chain_ms, policy.chain_tokens) == (0.0, 0.0) and not policy.choose_tree()
    policy.observe(shape_cycle(False, 10.0), output_tokens=3)
    assert policy.chain_tokens == 3 and policy.choose_tree()

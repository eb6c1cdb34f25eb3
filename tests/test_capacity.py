"""tandem.capacity: the cluster simulation against closed forms, its answers under contention,
the planner's answer for one input, and `tandem plan --cluster`."""

import json
import math
from dataclasses import replace

import pytest

from tandem.capacity import (Cluster, Costs, InvalidInput, Window, closed_form_tokens_per_s, drafter_counts,
                             load_tokens_per_s, lone_cycle_ms, pass_ms, plan_cluster, simulate)
from tandem.cli import main
from tandem.math.analytic import expected_tokens

ENDLESS = 10**9  # tokens per session: the session never ends, so no prefill after the first
# A CPU-like pair (a verify token is dear), used where contention matters.
BUSY = Costs(draft_pass=(1.0, 0.05), target_pass=(8.0, 0.3), alpha=0.7, rtt_ms=2.0, orchestrator_ms=0.2)


def lone(costs: Costs, gamma: int, tokens_per_session: int = ENDLESS, host_cores: int = 0, **window):
    cluster = Cluster(1 if gamma else 0, 1, 1, tokens_per_session=tokens_per_session, host_cores=host_cores)
    return simulate(costs, cluster, gamma, window=Window(**window) if window else None)


# --- one session alone: closed forms -----------------------------------------------------------


@pytest.mark.parametrize("alpha, gamma, rtt_ms", [(0.8, 4, 1.0), (0.8, 0, 1.0), (0.0, 3, 0.5), (0.0, 0, 0.0),
                                                  (0.6, 1, 10.0), (0.9, 8, 0.0), (1.0, 5, 3.0), (0.5, 16, 25.0)])
@pytest.mark.parametrize("host_cores", [0, 1])
def test_one_session_is_the_closed_form(alpha, gamma, rtt_ms, host_cores):
    """Alone, a session's passes, calls and cycles run one after another: one shared core serves
    it as well as a processor per worker. A call's handling (its row's and its own) is its
    worker's work (in its pass)."""
    costs = Costs(draft_pass=(2.0, 0.02), target_pass=(20.0, 0.1), alpha=alpha, rtt_ms=rtt_ms, orchestrator_ms=0.5,
                  orchestrator_draft_call_ms=0.25, call_ms=0.3, handling_ms=0.2, handling_call_ms=0.15,
                  draft_token_ms=0.07, wire_token_ms=0.04)
    expected = closed_form_tokens_per_s(costs, gamma)
    calls = 2 if gamma else 1
    cycle = gamma * (2.02 + 0.07 + 0.04) + 20.0 + 0.1 * (gamma + 1) + calls * (rtt_ms + 0.3 + 0.35) + 0.5  # by hand
    cycle += 0.25 if gamma else 0.0  # the orchestrator's CPU for its draft call
    assert expected == pytest.approx(1e3 * expected_tokens(alpha, gamma) / cycle, rel=1e-12)
    got = lone(costs, gamma, host_cores=host_cores)
    # Exact but for rounding: every cycle is alike, and a cycle counts its expected output.
    assert got.tokens_per_s == pytest.approx(expected, rel=1e-9)
    assert got.cycle_ms == pytest.approx(cycle, rel=1e-9)
    assert got.verifier_utilization == pytest.approx((20.0 + 0.1 * (gamma + 1) + 0.35) / cycle, rel=1e-6)
    if gamma:
        assert got.drafter_utilization == pytest.approx((gamma * 2.02 + 0.35) / cycle, rel=1e-6)
    else:
        assert got.drafter_utilization is None
    assert got.tokens_per_verify_pass == gamma + 1
    assert got.per_session_tokens_per_s == got.tokens_per_s


@pytest.mark.parametrize("gamma", [0, 1, 4])
@pytest.mark.parametrize("host_cores", [0, 1])
def test_a_lone_sessions_workers_start_each_cycle_cold(gamma, host_cores):
    """Alone, each worker idles for the rest of every cycle, so its first pass costs
    cold_ms · (1 − e^(−idle / cold_after_ms)) more: the verifier idles for the drafter's passes,
    and the drafter for the verifier's, so the cycle is a fixed point, found here by bisection."""
    costs = Costs(draft_pass=(2.0, 0.02), target_pass=(20.0, 0.1), alpha=0.7, rtt_ms=1.0, orchestrator_ms=0.5,
                  call_ms=0.3, handling_ms=0.2, draft_cold_ms=0.8, target_cold_ms=1.5, cold_after_ms=12.0)
    drafter = gamma * 2.02 + 0.2 if gamma else 0.0
    verifier = 20.0 + 0.1 * (gamma + 1) + 0.2
    warm = drafter + verifier + (2 if gamma else 1) * (1.0 + 0.3) + 0.5

    def target_cold(draft_cold: float) -> float:  # the verifier idles for all but its own pass
        return 1.5 * (1 - math.exp(-(warm + draft_cold - verifier) / 12.0))

    low, high = 0.0, 0.8 if gamma else 0.0  # the drafter's coldness, where its own equation holds
    for _ in range(200):
        mid = (low + high) / 2
        if 0.8 * (1 - math.exp(-(warm + target_cold(mid) - drafter) / 12.0)) > mid:
            low = mid
        else:
            high = mid
    cycle = warm + low + target_cold(low)
    assert lone_cycle_ms(costs, gamma) == pytest.approx(cycle, rel=1e-9)
    got = lone(costs, gamma, host_cores=host_cores)
    assert got.cycle_ms == pytest.approx(cycle, rel=1e-9)
    assert got.tokens_per_s == pytest.approx(1e3 * expected_tokens(0.7, gamma) / cycle, rel=1e-9)
    assert cycle > lone_cycle_ms(replace(costs, draft_cold_ms=0.0, target_cold_ms=0.0), gamma)


def test_passes_back_to_back_are_warm():
    """A verifier that runs its passes back to back (no round trip, no turn between them) pays its
    cold_ms once, for its first pass: a load's time is the same but for that."""
    costs = Costs(draft_pass=(1.0, 0.0), target_pass=(10.0, 0.5), alpha=0.5, prompt_tokens=8)
    cluster, tokens = Cluster(0, 1, 4, tokens_per_session=16), 16
    load_ms = (10.0 + 0.5 * 4 * 8) + (tokens - 1) * (10.0 + 0.5 * 4)
    assert load_tokens_per_s(costs, cluster, 0, 4) == pytest.approx(1e3 * 4 * tokens / load_ms, rel=1e-12)
    cold = replace(costs, target_cold_ms=5.0)
    assert load_tokens_per_s(cold, cluster, 0, 4) == pytest.approx(1e3 * 4 * tokens / (load_ms + 5.0), rel=1e-12)


@pytest.mark.parametrize("gamma", [1, 4, 8])
def test_acceptance_by_position_is_its_closed_form_and_draws_by_position(gamma):
    """Bursty acceptance, a_j rising along the block (past the last given, the last): alone, a
    cycle yields Σ_i Π_{j≤i} a_j tokens, and a block is accepted whole Π_{j≤γ} a_j of the time
    (the share drafting ahead then finds ready, its bonus always guessed), not α^γ."""
    rates = (0.5, 0.7, 0.9)
    costs = Costs(draft_pass=(2.0, 0.02), target_pass=(20.0, 0.1), alpha=0.6, acceptance_by_position=rates,
                  rtt_ms=1.0, orchestrator_ms=0.5, call_ms=0.3)
    survival = [1.0]
    for j in range(gamma):
        survival.append(survival[-1] * rates[min(j, len(rates) - 1)])
    expected = closed_form_tokens_per_s(costs, gamma)
    assert expected == pytest.approx(1e3 * sum(survival) / lone_cycle_ms(costs, gamma), rel=1e-12)
    assert lone(costs, gamma).tokens_per_s == pytest.approx(expected, rel=1e-9)
    guessing = replace(costs, bonus_guess=1.0, recovered_guess=0.0)
    ahead = simulate(guessing, Cluster(1, 1, 1, tokens_per_session=ENDLESS, draft_ahead=True), gamma)
    assert ahead.drafted_ahead_share == pytest.approx(survival[-1], abs=0.02)
    assert abs(survival[-1] - costs.alpha**gamma) > 0.05  # what i.i.d. draws would have found


@pytest.mark.parametrize("host_cores, share", [(1, 0.5), (2, 1.0), (3, 1.0), (0, 1.0)])
def test_sessions_on_shared_cores(host_cores, share):
    """Two sessions on two verifiers, nothing between their passes: on one core both passes
    always run, each at half speed (processor sharing), so the pair makes what one session
    alone does; on two cores or more, or a processor each, twice that."""
    costs = Costs(draft_pass=(1.0, 0.0), target_pass=(10.0, 0.0), alpha=0.5)
    got = simulate(costs, Cluster(0, 2, 2, tokens_per_session=ENDLESS, host_cores=host_cores), 0)
    assert got.tokens_per_s == pytest.approx(2 * share * 1e3 / 10.0, rel=1e-9)
    assert got.verifier_utilization == pytest.approx(1.0)


def test_shared_cores_slow_a_busy_cluster():
    """Passes, calls and cycles that a cluster runs side by side take longer on fewer cores."""
    costs = replace(BUSY, call_ms=0.5, draft_token_ms=0.1)
    got = [simulate(costs, Cluster(1, 1, 8, tokens_per_session=64, host_cores=cores), 3).tokens_per_s
           for cores in (1, 2, 4, 0)]
    assert got == sorted(got) and got[0] < 0.8 * got[-1]


def _cycles_for(tokens: int, alpha: float, gamma: int) -> float:
    """Expected drafting cycles to produce `tokens` tokens, a cycle yielding min(k + 1, what is
    left) with P(k = j) = α^j (1 − α) below γ and α^γ at γ."""
    p = [alpha**j * (1 - alpha) for j in range(gamma)] + [alpha**gamma]
    cycles = [0.0]
    for left in range(1, tokens + 1):
        cycles.append(1 + sum(pj * cycles[left - min(j + 1, left)] for j, pj in enumerate(p)))
    return cycles[tokens]


@pytest.mark.parametrize("alpha, gamma, tokens", [(0.7, 3, 16), (0.9, 6, 40)])
def test_sessions_that_end_follow_the_draws(alpha, gamma, tokens):
    """A session of T tokens: a prefill (its TTFT), then drafting cycles until it has T; tokens/s
    is T over their expected time (renewal-reward), which only the right draws of k give. A
    prefill carries no drafted tokens (nor their transport)."""
    costs = Costs(draft_pass=(1.0, 0.1), target_pass=(10.0, 0.05), alpha=alpha, rtt_ms=2.0, orchestrator_ms=0.4,
                  prompt_tokens=100, wire_token_ms=0.3)
    prefill_ms = 2.0 + 10.0 + 0.05 * 100 + 0.4
    session_ms = prefill_ms + _cycles_for(tokens - 1, alpha, gamma) * lone_cycle_ms(costs, gamma)
    got = lone(costs, gamma, tokens, warmup_cycles=1000, block_cycles=1000, precision=0.0, max_cycles=100_000)
    assert got.tokens_per_s == pytest.approx(1e3 * tokens / session_ms, rel=0.01)
    assert got.ttft_ms == pytest.approx(prefill_ms) and got.ttft_p90_ms == pytest.approx(prefill_ms)


def test_a_pass_takes_whole_steps_within_its_budget():
    few = replace(BUSY, max_batch_tokens=3, prompt_tokens=2)
    cluster = Cluster(0, 1, 8)
    assert simulate(few, cluster, 0).tokens_per_verify_pass <= 3
    assert simulate(replace(few, max_batch_tokens=512), cluster, 0).tokens_per_verify_pass > 3
    # A prefill longer than the budget still runs, whole and alone.
    long = lone(replace(BUSY, max_batch_tokens=16, prompt_tokens=100), 2, 64)
    assert long.ttft_ms == pytest.approx(2.0 + 8.0 + 0.3 * 100 + 0.2)


def test_deterministic_for_a_seed():
    cluster = Cluster(1, 2, 16, tokens_per_session=64)
    assert simulate(BUSY, cluster, 3, seed=5) == simulate(BUSY, cluster, 3, seed=5)
    other = simulate(BUSY, cluster, 3, seed=6)
    assert other != simulate(BUSY, cluster, 3, seed=5)
    assert other.tokens_per_s == pytest.approx(simulate(BUSY, cluster, 3, seed=5).tokens_per_s, rel=0.015)


# --- contention ------------------------------------------------------------------------------


def _no_lower(values: list, noise: float = 3.0) -> None:
    """Each prediction's tokens/s at least the one before's, within `noise` standard errors."""
    for before, after in zip(values, values[1:]):
        assert after.tokens_per_s >= before.tokens_per_s - noise * (before.tokens_per_s_se + after.tokens_per_s_se)


@pytest.mark.parametrize("gamma", [0, 4])
def test_more_verifiers_never_lower_tokens_per_s(gamma):
    got = [simulate(BUSY, Cluster(2 if gamma else 0, verifiers, 32), gamma) for verifiers in (1, 2, 3, 4, 8)]
    _no_lower(got)
    assert got[-1].tokens_per_s > 1.5 * got[0].tokens_per_s  # the verifiers were the bottleneck
    assert got[0].verifier_utilization > 0.85  # busy but while it holds a pass for a cohort due back


@pytest.mark.parametrize("gamma", [2, 5])
def test_a_longer_round_trip_never_raises_tokens_per_s(gamma):
    got = [simulate(replace(BUSY, rtt_ms=rtt), Cluster(1, 2, 16), gamma) for rtt in (40.0, 20.0, 10.0, 5.0, 1.0, 0.0)]
    _no_lower(got)
    assert got[0].tokens_per_s < 0.7 * got[-1].tokens_per_s


def test_a_long_round_trip_drafts_no_shorter():
    """The round trip is paid per cycle: longer blocks amortize it, so the best γ does not fall."""
    def best_gamma(rtt_ms: float) -> int:
        got = {g: simulate(replace(BUSY, rtt_ms=rtt_ms), Cluster(1, 2, 16), g).tokens_per_s for g in range(1, 9)}
        return max(got, key=got.get)

    near, far = best_gamma(0.0), best_gamma(50.0)
    assert far >= near and far >= near + 2, (near, far)


def test_the_orchestrator_caps_a_replica():
    """64 sessions on 0.5 ms of orchestrator CPU a cycle: at most 2,000 cycles/s per replica."""
    costs = replace(BUSY, orchestrator_ms=0.5, target_pass=(2.0, 0.001), rtt_ms=0.0)
    one, two = (simulate(costs, Cluster(0, 8, 64, replicas=r), 0).tokens_per_s for r in (1, 2))
    assert one == pytest.approx(2000.0, rel=0.01)
    assert two > 1.5 * one


# --- the planner -----------------------------------------------------------------------------


def test_drafter_counts():
    assert drafter_counts(4, 2.0) == [0, 1, 2, 4, 8]
    assert drafter_counts(1, 2.0) == [0, 1, 2]
    assert drafter_counts(8, 0.5) == [0, 1, 2, 4]
    assert drafter_counts(3, 1.5) == [0, 1, 2, 3, 4]  # 1.5 · 3 = 4.5 rounds to 4
    assert drafter_counts(4, 0.0) == [0]


GOLDEN = Costs(draft_pass=(2.0, 0.05), target_pass=(10.0, 0.2), alpha=0.6, rtt_ms=1.0, orchestrator_ms=0.2,
               prompt_tokens=64)


def test_plan_golden_numbers():
    """With 8 sessions per verifier sharing its passes (a held pass waits for its cohort), plain
    decoding gives the most tokens/s per GPU here; drafting gives the most tokens/s."""
    plan = plan_cluster(GOLDEN, sessions=16, verifiers=2, max_drafters_per_verifier=1.0, gammas=range(0, 7),
                        tokens_per_session=128)
    assert [(r.drafters, r.gamma) for r in plan.rows] == [(0, 0)] + [(n, g) for n in (1, 2) for g in range(1, 7)]
    assert [(r.drafters, r.gamma) for r in plan.best_per_ratio] == [(0, 0), (1, 3), (2, 1)]
    best = plan.recommended
    assert (best.drafters, best.verifiers, best.gamma, best.gpus) == (0, 2, 0, 2.0)
    assert best.tokens_per_s == pytest.approx(1066.8563300142032, rel=1e-9)
    assert best.tokens_per_s_per_gpu == pytest.approx(533.4281650071016, rel=1e-9)
    assert best.prediction.ttft_ms == pytest.approx(26.82807017543865, rel=1e-9)
    assert plan.best_per_ratio[1].tokens_per_s == pytest.approx(1194.9788, rel=1e-4)
    assert best.tokens_per_s_per_gpu == max(r.tokens_per_s_per_gpu for r in plan.rows)


def test_dear_draft_gpus_recommend_none():
    plan = plan_cluster(GOLDEN, sessions=16, verifiers=2, max_drafters_per_verifier=1.0, gammas=[3],
                        tokens_per_session=128, draft_gpu_cost=3.0)
    assert (plan.recommended.drafters, plan.recommended.gamma) == (0, 0)
    assert plan.rows[1].gpus == 2 + 3.0


def test_bad_inputs_name_their_field():
    with pytest.raises(InvalidInput, match="rtt_ms must be >= 0"):
        replace(BUSY, rtt_ms=-1.0)
    with pytest.raises(InvalidInput, match="alpha"):
        replace(BUSY, alpha=float("nan"))
    with pytest.raises(InvalidInput, match="drafters must be >= 1 to draft"):
        simulate(BUSY, Cluster(0, 1, 1), 2)
    with pytest.raises(InvalidInput, match="gammas"):
        plan_cluster(BUSY, 4, 1, gammas=[17])
    with pytest.raises(InvalidInput, match="sessions"):
        Cluster(1, 1, 0)


# --- tandem plan --cluster ---------------------------------------------------------------------

SMALL = ["plan", "--cluster", "--draft-ms", "1,0.05", "--target-ms", "8,0.3", "--alpha", "0.7", "--rtt-ms", "2",
         "--sessions", "4", "--verifiers", "1", "--max-drafters-per-verifier", "1", "--max-gamma", "3",
         "--tokens-per-session", "64"]


def run_json(capsys, *args: str) -> dict:
    main([*args, "--json"])
    out = capsys.readouterr().out
    assert out.count("\n") == 1, out  # one JSON line
    return json.loads(out)


def test_cli_json(capsys):
    out = run_json(capsys, *SMALL)
    assert set(out) == {"costs", "sessions", "replicas", "host_cores", "draft_gpu_cost", "recommended",
                        "best_per_ratio", "rows"}
    assert out["costs"] == {"draft_pass": [1.0, 0.05], "target_pass": [8.0, 0.3], "alpha": 0.7, "rtt_ms": 2.0,
                            "orchestrator_ms": 0.0, "orchestrator_draft_call_ms": 0.0, "call_ms": 0.0,
                            "handling_ms": 0.0, "handling_call_ms": 0.0, "draft_token_ms": 0.0, "wire_token_ms": 0.0,
                            "acceptance_by_position": None, "ahead_step_ms": None, "background_ms": 0.0,
                            "draft_row_ms": 0.0, "target_row_ms": 0.0, "draft_cold_ms": 0.0, "target_cold_ms": 0.0,
                            "cold_after_ms": 10.0, "prompt_tokens": 128, "bonus_guess": None, "recovered_guess": None,
                            "max_batch_tokens": 512}
    assert [(r["drafters"], r["gamma"]) for r in out["rows"]] == [(0, 0), (1, 1), (1, 2), (1, 3)]
    row_fields = {"drafters", "verifiers", "drafters_per_verifier", "gamma", "gpus", "tokens_per_s", "tokens_per_s_se",
                  "tokens_per_s_per_gpu", "per_session_tokens_per_s", "ttft_ms", "ttft_p50_ms", "ttft_p90_ms",
                  "cycle_ms", "drafter_utilization", "verifier_utilization", "tokens_per_verify_pass",
                  "drafted_ahead_share", "cycles", "window_ms"}
    assert all(set(r) == row_fields for r in out["rows"] + out["best_per_ratio"] + [out["recommended"]])
    assert out["recommended"] == max(out["rows"], key=lambda r: r["tokens_per_s_per_gpu"])
    assert out["rows"][0]["drafter_utilization"] is None and out["rows"][1]["drafter_utilization"] > 0
    direct = plan_cluster(replace(BUSY, orchestrator_ms=0.0), 4, 1, 1.0, range(0, 4), tokens_per_session=64)
    assert out["recommended"]["tokens_per_s"] == direct.recommended.tokens_per_s


def test_cli_table(capsys):
    main(SMALL)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["drafters/verifier", "drafters", "best", "gamma", "tokens/s", "TTFT", "ms",
                                "tokens/s", "per", "GPU"]
    assert [line.split()[:2] for line in lines[1:3]] == [["0", "0"], ["1", "1"]]
    assert len(lines) == 4 and lines[3].startswith("recommended: ") and " tokens/s, " in lines[3]


def test_cli_costs_file_and_flags_over_it(capsys, tmp_path):
    path = tmp_path / "costs.json"
    measured = {"draft_pass": [1.0, 0.05], "target_pass": [8.0, 0.3], "alpha": 0.7, "rtt_ms": 2.0,
                "orchestrator_ms": 0.2, "orchestrator_draft_call_ms": 0.1, "call_ms": 0.1, "handling_ms": 0.3,
                "handling_call_ms": 0.4, "draft_token_ms": 0.05, "wire_token_ms": 0.02, "background_ms": 0.0,
                "draft_row_ms": 0.01, "target_row_ms": 0.2, "draft_cold_ms": 0.4, "target_cold_ms": 1.2,
                "cold_after_ms": 12.0, "prompt_tokens": 32, "max_batch_tokens": 256}
    path.write_text(json.dumps(measured))
    small = ["plan", "--cluster", "--sessions", "4", "--verifiers", "1", "--max-drafters-per-verifier", "1",
             "--gamma", "2", "--costs", str(path)]
    out = run_json(capsys, *small)
    unset = {"acceptance_by_position": None, "ahead_step_ms": None, "bonus_guess": None, "recovered_guess": None}
    assert out["costs"] == measured | unset
    assert [(r["drafters"], r["gamma"]) for r in out["rows"]] == [(0, 0), (1, 2)]
    over = run_json(capsys, *small, "--rtt-ms", "20", "--target-ms", "9,0.25", "--alpha", "0.5", "--target-row-ms", "1")
    assert over["costs"] == {**measured, **unset, "rtt_ms": 20.0, "target_pass": [9.0, 0.25], "alpha": 0.5,
                             "target_row_ms": 1.0}
    assert over["rows"][1]["tokens_per_s"] < out["rows"][1]["tokens_per_s"]


@pytest.mark.parametrize("args, message", [
    (["--rtt-ms", "-1"], "tandem plan: --rtt-ms must be >= 0"),
    (["--alpha", "1.5"], "tandem plan: --alpha must be in [0, 1]"),
    (["--draft-ms", "1"], "tandem plan: --draft-ms must be INTERCEPT,SLOPE"),
    (["--target-ms", "0,0"], "tandem plan: --target-ms must cost > 0"),
    (["--prompt-tokens", "0"], "tandem plan: --prompt-tokens must be an integer >= 1"),
    (["--sessions", "0"], "tandem plan: --sessions must be >= 1"),
    (["--host-cores", "-1"], "tandem plan: --host-cores must be >= 0"),
    (["--draft-token-ms", "-1"], "tandem plan: --draft-token-ms must be >= 0"),
    (["--ahead-step-ms", "-1"], "tandem plan: --ahead-step-ms must be >= 0"),
    (["--target-row-ms", "-1"], "tandem plan: --target-row-ms must be >= 0"),
    (["--handling-ms", "-1"], "tandem plan: --handling-ms must be >= 0"),
    (["--target-cold-ms", "-1"], "tandem plan: --target-cold-ms must be >= 0"),
    (["--cold-after-ms", "0"], "tandem plan: --cold-after-ms must be > 0"),
    (["--acceptance-by-position", "0.5,x"], "tandem plan: --acceptance-by-position must be numbers separated by "
                                            "commas, got '0.5,x'"),
    (["--acceptance-by-position", "0.5,1.5"], "tandem plan: --acceptance-by-position must be one or more numbers "
                                              "in [0, 1]"),
    (["--verifiers", "0"], "tandem plan: --verifiers must be >= 1"),
    (["--replicas", "0"], "tandem plan: --replicas must be >= 1"),
    (["--max-drafters-per-verifier", "-1"], "tandem plan: --max-drafters-per-verifier must be in [0, 64]"),
    (["--draft-gpu-cost", "nan"], "tandem plan: --draft-gpu-cost must be >= 0"),
    (["--gamma", "17"], "tandem plan: --gamma must be in [0, 16]"),
    (["--cost-ratio", "20"], "tandem plan: --cost-ratio is the analytic model's"),
    (["--costs", "/nonexistent/costs.json"], "tandem plan: --costs /nonexistent/costs.json: "),
])
def test_cli_bad_flags(capsys, args, message):
    with pytest.raises(SystemExit) as e:
        main([*SMALL, *args, "--json"])
    assert str(e.value.code).startswith(message) and "\n" not in str(e.value.code)
    assert capsys.readouterr().out == ""


def test_cli_missing_and_misplaced_flags(tmp_path):
    with pytest.raises(SystemExit, match=r"^tandem plan: --cluster needs --draft-ms \(or draft_pass in --costs\)$"):
        main(["plan", "--cluster", "--target-ms", "8,0.3", "--alpha", "0.7"])
    with pytest.raises(SystemExit, match="^tandem plan: --sessions needs --cluster$"):
        main(["plan", "--alpha", "0.8", "--gamma", "3", "--sessions", "4"])
    path = tmp_path / "costs.json"
    path.write_text(json.dumps({"draft_pass": [1, 0.1], "target_pass": [8, 0.3], "alpha": 0.7, "rtt_ms": -2}))
    with pytest.raises(SystemExit, match=rf"^tandem plan: --rtt-ms must be >= 0 \(rtt_ms in {path}\)$"):
        main(["plan", "--cluster", "--costs", str(path)])
    path.write_text(json.dumps({"draft_pass": [1, 0.1], "target_pass": [8, 0.3], "alpha": 0.7, "rtt": 2}))
    with pytest.raises(SystemExit, match=rf"^tandem plan: --costs {path}: rtt is not a cost"):
        main(["plan", "--cluster", "--costs", str(path)])


def test_cli_plot(capsys, tmp_path):
    pytest.importorskip("matplotlib")  # the bench extra's
    png = tmp_path / "plan.png"
    main([*SMALL, "--plot", str(png)])
    assert f"plot in {png}" in capsys.readouterr().out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --- batched calls and finite loads ----------------------------------------------------------


def test_a_load_started_together_moves_as_one_cohort():
    """Four fresh sessions at γ = 0 start in one turn: each cycle is one batched call (one round
    trip, one call_ms, one pass of all four rows) and four cycles on the replica, so the load's
    time is a prefill and T − 1 such cycles, whatever the seed."""
    costs = Costs(draft_pass=(1.0, 0.0), target_pass=(10.0, 0.5), alpha=0.5, rtt_ms=20.0, orchestrator_ms=0.25,
                  call_ms=1.5, prompt_tokens=8)
    tokens = 16
    cluster = Cluster(0, 1, 4, tokens_per_session=tokens)
    turn = 20.0 + 1.5 + 4 * 0.25
    load_ms = (turn + 10.0 + 0.5 * 4 * 8) + (tokens - 1) * (turn + 10.0 + 0.5 * 4)
    assert load_tokens_per_s(costs, cluster, 0, 4, seeds=3) == pytest.approx(1e3 * 4 * tokens / load_ms, rel=1e-12)
    # Twice the sessions through the same four slots: twice the time.
    assert load_tokens_per_s(costs, cluster, 0, 8, seeds=3) == pytest.approx(1e3 * 4 * tokens / load_ms, rel=1e-12)
    # Each of its `tokens` passes has three rows past its first, and each costs target_row_ms;
    # each of its four rows' handling, handling_ms, waits for the pass.
    rows = replace(costs, target_row_ms=0.7, handling_ms=0.4)
    assert load_tokens_per_s(rows, cluster, 0, 4, seeds=3) == pytest.approx(
        1e3 * 4 * tokens / (load_ms + tokens * (3 * 0.7 + 4 * 0.4)), rel=1e-12)
    # The call's own handling, handling_call_ms, once a pass: the four rows came as one call.
    calls = replace(rows, handling_call_ms=0.9)
    assert load_tokens_per_s(calls, cluster, 0, 4, seeds=3) == pytest.approx(
        1e3 * 4 * tokens / (load_ms + tokens * (3 * 0.7 + 4 * 0.4 + 0.9)), rel=1e-12)


def test_a_batched_draft_call_costs_the_replica_once():
    """Four sessions drafting as one cohort (α = 0: a token a cycle): each cycle is a batched
    draft call, a batched verify call and four cycles on the replica, and the replica's CPU for
    the draft call, orchestrator_draft_call_ms, is paid once for the four rows."""
    costs = Costs(draft_pass=(1.0, 0.0), target_pass=(10.0, 0.5), alpha=0.0, rtt_ms=20.0, orchestrator_ms=0.25,
                  call_ms=1.5, prompt_tokens=8)
    tokens, cluster = 16, Cluster(1, 1, 4, tokens_per_session=16)
    prefill = 20.0 + 1.5 + 10.0 + 0.5 * 4 * 8 + 4 * 0.25
    cycle = (20.0 + 1.5 + 1.0) + (20.0 + 1.5 + 10.0 + 0.5 * 4 * 2) + 4 * 0.25
    load_ms = prefill + (tokens - 1) * cycle
    assert load_tokens_per_s(costs, cluster, 1, 4) == pytest.approx(1e3 * 4 * tokens / load_ms, rel=1e-12)
    dear = replace(costs, orchestrator_draft_call_ms=2.0)
    assert load_tokens_per_s(dear, cluster, 1, 4) == pytest.approx(
        1e3 * 4 * tokens / (load_ms + (tokens - 1) * 2.0), rel=1e-12)


def test_a_load_ends_with_fewer_in_flight():
    """Sessions drafting at γ > 0 end at different cycles, so a load's last ones run with fewer
    beside them: its tokens/s falls short of the steady state's, less so the longer the load."""
    cluster = Cluster(1, 1, 8, tokens_per_session=64)
    steady = simulate(BUSY, cluster, 3).tokens_per_s
    short, long = (load_tokens_per_s(BUSY, cluster, 3, n) for n in (8, 64))
    assert short < long < steady * 1.02


def test_a_load_refuses_fewer_sessions_than_slots():
    with pytest.raises(InvalidInput) as e:
        load_tokens_per_s(BUSY, Cluster(1, 1, 8), 3, 4)
    assert e.value.field == "sessions"


def test_background_work_loads_shared_cores_only():
    """CPU per cycle that no call waits for: nothing on processors of their own, a slower
    cluster where it shares cores with the passes."""
    costs = replace(BUSY, call_ms=0.5)
    for cores, slower in ((0, False), (1, True), (2, True)):
        cluster = Cluster(1, 1, 8, tokens_per_session=64, host_cores=cores)
        plain = simulate(costs, cluster, 3).tokens_per_s
        loaded = simulate(replace(costs, background_ms=3.0), cluster, 3).tokens_per_s
        assert (loaded < 0.95 * plain) if slower else loaded == plain


# --- drafting ahead ------------------------------------------------------------------------------


def test_a_lone_session_that_always_guesses_right_only_waits_for_its_verifies():
    """Every block accepted whole and its bonus guessed: after its first cycle every cycle's
    block was drafted ahead, so a cycle is its verify call or its draft-ahead call, whichever is
    longer (they run side by side), and the orchestrator's time (the cycle's, and its draft-ahead
    call's: orchestrator_draft_call_ms). The draft-ahead call is one job
    of 1 + min(γ, R) chains: a step is one pass of them and ahead_step_ms (draft_token_ms where
    that is not given)."""
    costs = Costs(draft_pass=(2.0, 0.5), target_pass=(20.0, 0.1), alpha=1.0, rtt_ms=10.0, orchestrator_ms=0.5,
                  orchestrator_draft_call_ms=0.2, call_ms=0.3, draft_token_ms=0.05, bonus_guess=1.0)
    gamma = 4
    verify = 10.0 + 20.0 + 0.1 * (gamma + 1) + 0.3
    for draft_pass, rejections, step, slower in (((2.0, 0.5), 0, None, "verify"), ((8.0, 0.5), 0, None, "ahead"),
                                                 ((2.0, 0.5), 2, 0.5, "verify"), ((2.0, 0.5), 2, 1.0, "ahead")):
        c = replace(costs, draft_pass=draft_pass, ahead_step_ms=step)
        cluster = Cluster(1, 1, 1, tokens_per_session=ENDLESS, draft_ahead=True, ahead_rejections=rejections)
        got = simulate(c, cluster, gamma)
        per_step = pass_ms(draft_pass, 1 + rejections) + (0.05 if step is None else step)
        ahead = 10.0 + (gamma + 1) * per_step + 0.3
        assert max(verify, ahead) == (verify if slower == "verify" else ahead)
        assert got.tokens_per_s == pytest.approx(1e3 * (gamma + 1) / (max(verify, ahead) + 0.5 + 0.2), rel=1e-9)
        assert got.drafted_ahead_share == 1.0


def test_guesses_past_rejections_find_more_blocks_ready():
    """A block is ready after a full accept with its bonus guessed (α^γ · bonus_guess), and with
    rejections drafted past, after a rejection at one of the first R positions with its recovered
    token guessed ((1 − α^min(γ, R)) · recovered_guess): the share the simulation finds, and more
    tokens/s across a round trip. Guesses that never come true save nothing, and where the
    drafter shares the verifier's core, they slow its verifies."""
    costs = replace(BUSY, rtt_ms=20.0, bonus_guess=0.7, recovered_guess=0.5)
    gamma, alpha = 4, BUSY.alpha

    def run(rejections: int, c: Costs = costs, sessions: int = 1, host_cores: int = 0, ahead: bool = True):
        cluster = Cluster(1, 1, sessions, tokens_per_session=64, host_cores=host_cores, draft_ahead=ahead,
                          ahead_rejections=rejections)
        return simulate(c, cluster, gamma)

    plain = run(0, ahead=False)
    bonus, past = run(0), run(2)
    assert bonus.drafted_ahead_share == pytest.approx(alpha**gamma * 0.7, abs=0.03)
    assert past.drafted_ahead_share == pytest.approx(alpha**gamma * 0.7 + (1 - alpha**2) * 0.5, abs=0.03)
    assert plain.drafted_ahead_share == 0.0 and plain.tokens_per_s < bonus.tokens_per_s < past.tokens_per_s
    never = replace(costs, bonus_guess=0.0, recovered_guess=0.0)
    assert run(2, never).drafted_ahead_share == 0.0
    assert run(2, never).tokens_per_s == pytest.approx(plain.tokens_per_s, rel=0.01)
    assert run(2, never, host_cores=1).tokens_per_s < 0.95 * run(0, host_cores=1, ahead=False).tokens_per_s
    # Two sessions in one replica: neither is alone, so neither drafts ahead.
    assert run(2, sessions=2).drafted_ahead_share == 0.0


# --- passes as measured tables -------------------------------------------------------------------


def test_a_table_of_passes_is_read_between_its_points():
    table = ((1, 6.0), (4, 9.0), (8, 20.0))
    assert [pass_ms(table, n) for n in (1, 2, 4, 6, 8, 12)] == [6.0, 7.0, 9.0, 14.5, 20.0, 31.0]
    assert pass_ms(((2, 1.0), (4, 5.0)), 1) == 0.0  # below its first point, never below 0
    # A table on a line simulates as the line does.
    line = Costs.from_fields({"draft_pass": [1.0, 0.05], "target_pass": [8.0, 0.3], "alpha": 0.7, "rtt_ms": 2.0})
    on_it = replace(line, target_pass=((1, 8.3), (100, 38.0)), draft_pass=((1, 1.05), (2, 1.1)))
    cluster = Cluster(1, 1, 8, tokens_per_session=64)
    assert simulate(on_it, cluster, 3).tokens_per_s == pytest.approx(simulate(line, cluster, 3).tokens_per_s, rel=1e-9)
    assert Costs.from_fields({"draft_pass": [[1, 1.05], [2, 1.1]], "target_pass": [8.0, 0.3], "alpha": 0.7}
                             ).draft_pass == ((1, 1.05), (2, 1.1))
    for bad in ([[2, 1.0], [1, 2.0]], [[1, 1.0]], [[1.5, 1.0], [2, 1.0]], [[1, -1.0], [2, 1.0]], [1, 2, 3]):
        with pytest.raises(InvalidInput) as e:
            Costs.from_fields({"draft_pass": bad, "target_pass": [8.0, 0.3], "alpha": 0.7})
        assert e.value.field == "draft_pass"


def test_a_slower_processor_stretches_every_cost_but_the_round_trip():
    costs = replace(BUSY, call_ms=0.3, handling_ms=0.2, handling_call_ms=0.15, draft_token_ms=0.07,
                    background_ms=0.4, target_row_ms=0.1, target_pass=((1, 8.3), (9, 10.7)))
    # With no round trip every event comes `factor` times later: the same run, slower.
    still = replace(costs, rtt_ms=0.0)
    cluster = Cluster(1, 1, 8, tokens_per_session=64, host_cores=2)
    assert simulate(still.slowed(1.5), cluster, 3).tokens_per_s == pytest.approx(
        simulate(still, cluster, 3).tokens_per_s / 1.5, rel=1e-9)
    # Alone, the cycle's CPU is stretched and its two round trips are not.
    assert lone_cycle_ms(costs.slowed(2.0), 3) == pytest.approx(2 * lone_cycle_ms(costs, 3) - 2 * costs.rtt_ms)
    assert costs.slowed(2.0).alpha == costs.alpha and costs.slowed(2.0).prompt_tokens == costs.prompt_tokens
    with pytest.raises(InvalidInput) as e:
        costs.slowed(0.0)
    assert e.value.field == "factor"


def test_a_held_pass_gathers_its_cohort(monkeypatch):
    """Four sessions on four replicas reach one verifier at staggered times: holding a pass for
    the sessions due back (a share of its fixed cost, as the workers do) puts all four in every
    pass; without it they split into cohorts that take turns on the verifier."""
    costs = Costs(draft_pass=(1.0, 0.0), target_pass=(10.0, 0.1), alpha=0.5, rtt_ms=1.0, orchestrator_ms=0.5)
    cluster = Cluster(0, 1, 4, replicas=4, tokens_per_session=ENDLESS)
    held = simulate(costs, cluster, 0)
    monkeypatch.setattr("tandem.capacity.HOLD_SHARE", 0.0)
    apart = simulate(costs, cluster, 0)
    assert held.tokens_per_verify_pass == pytest.approx(4.0) and apart.tokens_per_verify_pass < 2.5
    assert held.tokens_per_s > 1.5 * apart.tokens_per_s

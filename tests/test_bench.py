"""The benchmark harness: its statistics on hand-made runs, and a smoke run of `run_bench`
against the real cluster with the tiny random pair (a few tokens; no timing is asserted)."""

import json

import pytest

from tandem.bench import report, summary
from tandem.bench.harness import BenchConfig, add_unbatched, run_bench
from tandem.bench.runs import Run, cluster_mode, mode_gamma, mode_shape, mode_verification
from tandem.math.analytic import expected_tokens


def cycle(gamma, accepted, output, draft=1.0, verify=4.0, drafted_ahead=False, ahead=0.0):
    return {"gamma": gamma, "accepted": accepted, "output_tokens": output, "start_ms": 0.0, "draft_ms": draft,
            "verify_ms": verify, "wait_ms": 0.4, "transport_ms": 0.5, "redis_ms": 0.3, "orchestration_ms": 0.2,
            "wire_bytes": 100,
            "drafted_ahead": drafted_ahead, "ahead_ms": ahead}


def run(mode, prompt, tokens, wall_s, cycles=None, sizes=None):
    sizes = sizes or [1] * tokens
    arrivals = [wall_s * (i + 1) / len(sizes) for i in range(len(sizes))]
    stats = {"per_cycle": cycles} if cycles is not None else None
    return Run(mode, "greedy", prompt, list(range(tokens)), wall_s, arrivals, sizes, stats)


def test_inter_token_gaps_are_zero_inside_a_burst():
    r = Run("gamma_3", "greedy", 0, [1, 2, 3, 4], 0.3, [0.1, 0.3], [3, 1])
    assert r.ttft_s == 0.1
    assert r.gaps_s == pytest.approx([0.0, 0.0, 0.2])
    assert r.tokens_per_s == pytest.approx(4 / 0.3)


def test_acceptance_counts_verified_tokens_and_positions_reached():
    runs = [run("gamma_3", 0, 6, 1.0, [cycle(3, 3, 4), cycle(3, 1, 2)])]
    acc = summary.acceptance(runs)
    assert acc["acceptance_rate"] == pytest.approx(4 / 5)  # the rejected token was verified, not the one after
    assert acc["draft_efficiency"] == pytest.approx(4 / 6)
    assert acc["mean_acceptance_length"] == pytest.approx(3.0)
    # Position 1: reached twice, accepted twice; position 2: reached twice, accepted once;
    # position 3: reached once (the rejection at 2 ends the second block), accepted once.
    assert summary.acceptance_by_position(runs, 4) == [1.0, 0.5, 1.0, None]


def test_cycles_by_gamma_leave_out_prefills_and_capped_ends():
    """A stream of 12 tokens, max γ 4: its prefill (1 token), then γ 4, 0 and 3 with 11, 6 and 5
    tokens to go, then γ 2 and 1 with 3 and 1 to go (capped by them, whatever the choice)."""
    cycles = [cycle(0, 0, 1), cycle(4, 4, 5), cycle(0, 0, 1), cycle(3, 1, 2), cycle(2, 1, 2), cycle(1, 0, 1)]
    assert summary.cycles_by_gamma([run("adaptive", 0, 12, 1.0, cycles)], 4) == {0: 1, 3: 1, 4: 1}


def test_acceptance_by_block_follows_each_streams_drafted_blocks():
    """Two streams: the first rejects its 1st block and accepts its 2nd and 3rd (pooled as the
    last entry, "2nd on"); the second accepts its 1st and rejects its 2nd. γ-0 cycles count for
    no block."""
    first = run("adaptive", 0, 9, 1.0, [cycle(0, 0, 1), cycle(2, 0, 1), cycle(0, 0, 1), cycle(3, 3, 4), cycle(1, 1, 2)])
    second = run("adaptive", 1, 4, 1.0, [cycle(0, 0, 1), cycle(2, 1, 2), cycle(1, 0, 1)])
    assert summary.acceptance_by_block([first, second], 2) == [0.5, pytest.approx(2 / 3)]
    assert summary.acceptance_by_block([first], 4) == [0.0, 1.0, 1.0, None]


def test_analytic_bound_is_expected_tokens_over_compute_in_target_token_units():
    target_alone = [run("gamma_0", 0, 2, 1.0, [cycle(0, 0, 1, 0.0, 5.0), cycle(0, 0, 1, 0.0, 5.0)])]
    assert summary.target_token_ms(target_alone) == 5.0
    spec = [run("gamma_2", 0, 3, 1.0, [cycle(2, 2, 3, 2.0, 6.0)])]
    assert summary.analytic_bound(spec, 0.5, 5.0) == pytest.approx(expected_tokens(0.5, 2) * 5.0 / 8.0)
    assert summary.analytic_bound(target_alone, None, 5.0) == pytest.approx(1.0)


def test_cycle_split_leaves_the_overlapped_redis_commit_off_the_critical_path():
    split = summary.cycle_split([run("gamma_2", 0, 3, 1.0, [cycle(2, 2, 3, 2.0, 6.0)])])
    assert split["total_ms"] == pytest.approx(2.0 + 6.0 + 0.4 + 0.5 + 0.2)
    assert split["redis_ms"] == 0.3 and split["wire_bytes_per_cycle"] == 100
    assert split["orchestration_share"] == pytest.approx(0.2 / 9.1)


def test_cycle_split_counts_blocks_drafted_ahead_among_drafting_cycles():
    cycles = [cycle(2, 2, 3, 2.0, 6.0, ahead=3.0), cycle(2, 1, 2, 0.0, 6.0, drafted_ahead=True), cycle(0, 0, 1, 0.0)]
    split = summary.cycle_split([run("adaptive", 0, 6, 1.0, cycles)])
    assert split["drafted_ahead_share"] == 0.5  # of the two cycles that drafted, not of all three
    assert split["ahead_ms"] == pytest.approx(1.0)


def test_speedups_pair_runs_by_prompt():
    base = [run("hf_target", 0, 10, 1.0), run("hf_target", 1, 10, 2.0)]
    fast = [run("gamma_2", 0, 10, 0.5, []), run("gamma_2", 1, 10, 0.5, [])]
    assert summary.paired_speedup(fast, base) == {"median": 3.0, "p25": 2.5, "p75": 3.5}


@pytest.mark.cluster
def test_smoke_run_writes_every_output(cluster, pair, workers, tmp_path):
    config = BenchConfig(pair["draft"], pair["target"], ["def f(x):", "import os\nclass A:"], max_tokens=6,
                         gammas=[0, 2], concurrency=[1, 2], concurrency_sessions=2, concurrency_repeats=2,
                         verifications=["token", "block"], progress=False)
    results = run_bench(config, cluster["address"], tmp_path, workers["pids"])
    names = {p.name for p in tmp_path.iterdir()}
    assert {"bench.json", "bench.md", "runs.jsonl", "speedup_vs_gamma.png", "acceptance_by_position.png",
            "cycle_timeline.png", "throughput_vs_concurrency.png"} <= names
    assert json.loads((tmp_path / "bench.json").read_text())["config"]["gammas"] == [0, 2]
    runs = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert len(runs) == 2 * 2 * 8  # prompts × workloads × modes
    for workload in ("greedy", "sampled"):
        rows = results["workloads"][workload]
        assert set(rows) == {"hf_target", "hf_assisted", "hf_lookup", "gamma_0", "gamma_2", "adaptive",
                             "gamma_2_block", "adaptive_block"}  # no γ = 0 under block verification: it has no block
        assert rows["gamma_0"]["speedup_vs_gamma_0"]["median"] == 1.0
        g2 = rows["gamma_2"]
        assert 0 <= g2["draft_efficiency"] <= g2["acceptance_rate"] <= 1
        assert all(p is None or 0 <= p <= 1 for p in g2["acceptance_by_position"])
        assert g2["cycle"]["wire_bytes_per_cycle"] > 0 and g2["analytic_speedup"] > 0
    # Greedy output is the target's own, in every mode: HF assisted, HF prompt lookup and the cluster's.
    assert all(v["identical"] == v["runs"] == 2 for v in results["greedy_identical_to_target"].values())
    assert [c["in_flight"] for c in results["concurrency"]["adaptive"]] == [1, 2]
    # Each level ran each mode twice, side by side: a row pools both and lists each run.
    assert all(len(c["repeats_tokens_per_s"]) == 2 and c["sessions"] == 2 for c in results["concurrency"]["adaptive"])
    assert "| batched | 2 |" in (tmp_path / "bench.md").read_text()  # adaptive ÷ γ = 0, per level
    # `--drafter model,hybrid`: one table over both passes, each against its own HF runs.
    combined = report.drafters_markdown({"model": results, "hybrid": results})
    assert "| hybrid | tandem adaptive γ, block verification |" in combined
    assert "| model | HF prompt lookup |" in combined
    report.drafters_plot({"model": results, "hybrid": results}, tmp_path / "drafters.png")
    assert (tmp_path / "drafters.png").stat().st_size > 0
    hf_batches = results["concurrency"]["hf_target"]  # HF's target alone, batches of 1 and 2
    assert [c["sessions"] for c in hf_batches] == [2, 2] and all(c["aggregate_tokens_per_s"] > 0 for c in hf_batches)
    assert all(c["itl_ms"]["p50"] is not None for c in hf_batches)
    # The unbatched sweep joins the same outputs (here against the same cluster: the harness's part).
    merged = add_unbatched(config, cluster["address"], tmp_path)
    assert {"unbatched_gamma_0", "unbatched_adaptive", "adaptive"} <= set(merged["concurrency"])
    assert "| tandem adaptive γ, unbatched | 2 |" in (tmp_path / "bench.md").read_text()
    assert merged["concurrency"]["adaptive"][1]["cycle"]["total_ms"] > 0
    assert results["peak_memory_mb"]["draft"] > 0 and results["peak_memory_mb"]["target"] > 0
    assert "| tandem γ=2 |" in (tmp_path / "bench.md").read_text()
    assert "| tandem γ=2, block verification |" in (tmp_path / "bench.md").read_text()


def test_cluster_modes_name_their_gamma_verification_and_draft_shape():
    config = BenchConfig("draft", "target", [], gammas=[0, 4], verifications=["token", "block"],
                         draft_shapes=["chain", "tree"])
    assert config.cluster_modes == ["gamma_0", "gamma_4", "adaptive", "gamma_4_block", "adaptive_block",
                                    "gamma_4_tree", "adaptive_tree", "gamma_4_block_tree", "adaptive_block_tree"]
    for mode in config.cluster_modes:
        assert cluster_mode(mode_gamma(mode), mode_verification(mode), mode_shape(mode)) == mode
    assert (mode_gamma("gamma_4_block_auto"), mode_verification("gamma_4_block_auto")) == (4, "block")
    assert report.label("adaptive_block_tree") == "tandem adaptive γ, block verification, token trees"

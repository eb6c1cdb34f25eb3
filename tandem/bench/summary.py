"""Statistics over timed runs: pure functions, no I/O.

Speedups are paired by prompt (the same prompt under two modes in the same run) and reported
as the median with the interquartile range over prompts. For the cluster's modes, the analytic
speedup is S(α, γ, measured costs): the expected tokens of every cycle under the mode's pooled
acceptance rate, E[tokens | α, γ] = (1 − α^(γ+1)) / (1 − α), over the cycle's measured draft and
verify compute, in units of one target token's verify compute measured at γ = 0. It leaves out
transport, Redis and orchestration, so realized / analytic is the share of the bound the
per-cycle overhead lets through.
"""

import numpy as np

from tandem.bench.runs import Run
from tandem.math.acceptance import verified_tokens
from tandem.math.analytic import expected_tokens

PARTS = ("draft_ms", "verify_ms", "wait_ms", "transport_ms", "redis_ms", "orchestration_ms")


def spread(values: list[float]) -> dict:
    """Median and interquartile range."""
    if not values:
        return {"median": None, "p25": None, "p75": None}
    p25, median, p75 = np.percentile(values, [25, 50, 75])
    return {"median": float(median), "p25": float(p25), "p75": float(p75)}


def percentiles_ms(values_s: list[float]) -> dict:
    if not values_s:
        return {"p50": None, "p90": None, "p99": None}
    p50, p90, p99 = np.percentile(np.asarray(values_s) * 1e3, [50, 90, 99])
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99)}


def paired_speedup(runs: list[Run], baseline: list[Run]) -> dict:
    """tokens/s of each prompt's run over the baseline's on the same prompt."""
    base = {r.prompt: r.tokens_per_s for r in baseline}
    return spread([r.tokens_per_s / base[r.prompt] for r in runs if base.get(r.prompt)])


def cycles(runs: list[Run]) -> list[dict]:
    return [c for r in runs if r.stats for c in r.stats["per_cycle"]]


def acceptance(runs: list[Run]) -> dict:
    """α = accepted / verified, mean acceptance length (output tokens per cycle, bonus included)
    and draft efficiency = accepted / drafted, pooled over runs. Hugging Face's runs have no
    cycle counts: a delivery of its streamer is one assisted step."""
    cs = cycles(runs)
    if not cs:
        steps = sum(len(r.sizes) for r in runs)
        return {"mean_acceptance_length": sum(r.tokens for r in runs) / steps if steps else None}
    drafted = sum(c["gamma"] for c in cs)
    accepted = sum(c["accepted"] for c in cs)
    verified = sum(verified_tokens(c["accepted"], c["gamma"]) for c in cs)
    return {
        "acceptance_rate": accepted / verified if verified else None,
        "mean_acceptance_length": sum(c["output_tokens"] for c in cs) / len(cs),
        "draft_efficiency": accepted / drafted if drafted else None,
        "mean_gamma": drafted / len(cs),
    }


def cycles_by_gamma(runs: list[Run], max_gamma: int) -> dict[int, int]:
    """The cycles that drafted each γ, among those whose γ only the choice set: not a stream's
    first (its prefill), nor one with max_gamma or fewer tokens still to go (capped by them)."""
    counts: dict[int, int] = {}
    for r in runs:
        left = r.tokens
        for i, c in enumerate(r.stats["per_cycle"] if r.stats else []):
            if i and left > max_gamma:
                counts[c["gamma"]] = counts.get(c["gamma"], 0) + 1
            left -= c["output_tokens"]
    return dict(sorted(counts.items()))


def acceptance_by_block(runs: list[Run], blocks: int) -> list[float | None]:
    """P(a block's first token is accepted) for a stream's 1st, 2nd, … drafted block, the last
    entry pooling every block from the blocks-th on: a stream's first tokens are harder to draft
    than its later ones, and a replica that starts with every stream at its start learns that."""
    drafted, passed = np.zeros(blocks), np.zeros(blocks)
    for r in runs:
        drafting = [c for c in (r.stats["per_cycle"] if r.stats else []) if c["gamma"]]
        for k, c in enumerate(drafting):
            drafted[min(k, blocks - 1)] += 1
            passed[min(k, blocks - 1)] += c["accepted"] > 0
    return [float(p / n) if n else None for p, n in zip(passed, drafted)]


def acceptance_by_position(runs: list[Run], max_gamma: int) -> list[float | None]:
    """P(position i of a block is accepted | the block reached position i), i = 0 … max_gamma−1."""
    reached, passed = np.zeros(max_gamma), np.zeros(max_gamma)
    for c in cycles(runs):
        for i in range(min(verified_tokens(c["accepted"], c["gamma"]), max_gamma)):
            reached[i] += 1
            passed[i] += i < c["accepted"]
    return [float(p / n) if n else None for p, n in zip(passed, reached)]


def target_token_ms(target_alone: list[Run]) -> float | None:
    """Verify compute per token with γ = 0: the unit of the analytic bound."""
    cs = cycles(target_alone)
    tokens = sum(c["output_tokens"] for c in cs)
    return sum(c["verify_ms"] for c in cs) / tokens if tokens else None


def analytic_bound(runs: list[Run], alpha: float | None, target_ms: float | None) -> float | None:
    """Σ_cycles E[tokens | α, γ_c] · target_ms / Σ_cycles (draft_ms_c + verify_ms_c)."""
    cs = cycles(runs)
    compute = sum(c["draft_ms"] + c["verify_ms"] for c in cs)
    if not cs or target_ms is None or not compute:
        return None
    expected = sum(expected_tokens(alpha or 0.0, c["gamma"]) if c["gamma"] else 1.0 for c in cs)
    return expected * target_ms / compute


def cycle_split(runs: list[Run]) -> dict:
    """Mean milliseconds per cycle of each part, the critical path (the Redis commit overlaps
    the next cycle's first call, so it is left out), its shares, and wire bytes; the share of
    drafting cycles whose block was drafted ahead, and the draft compute overlapped with verify."""
    cs = cycles(runs)
    if not cs:
        return {}
    split = {p: float(np.mean([c.get(p, 0.0) for c in cs])) for p in PARTS}
    total = sum(split[p] for p in PARTS if p != "redis_ms")
    split["total_ms"] = total
    split["orchestration_share"] = split["orchestration_ms"] / total if total else None
    split["overhead_share"] = (split["transport_ms"] + split["orchestration_ms"]) / total if total else None
    split["wire_bytes_per_cycle"] = float(np.mean([c["wire_bytes"] for c in cs]))
    drafting = [c for c in cs if c["gamma"]]
    split["drafted_ahead_share"] = float(np.mean([c["drafted_ahead"] for c in drafting])) if drafting else None
    split["ahead_ms"] = float(np.mean([c["ahead_ms"] for c in cs]))
    return split


def summarize(runs: list[Run], workload: str, modes: list[str], max_gamma: int) -> dict:
    """Per mode of one workload: speed, speedups, acceptance, bound, cycle split, latencies."""
    by_mode = {m: [r for r in runs if r.workload == workload and r.mode == m] for m in modes}
    target_ms = target_token_ms(by_mode.get("gamma_0", []))
    out = {}
    for mode, rs in by_mode.items():
        if not rs:
            continue
        acc = acceptance(rs)
        row = {
            "runs": len(rs),
            "tokens": sum(r.tokens for r in rs),
            "tokens_per_s": spread([r.tokens_per_s for r in rs]),
            "speedup_vs_hf_target": paired_speedup(rs, by_mode.get("hf_target", [])),
            "speedup_vs_hf_assisted": paired_speedup(rs, by_mode.get("hf_assisted", [])),
            "speedup_vs_hf_lookup": paired_speedup(rs, by_mode.get("hf_lookup", [])),
            **acc,
            "ttft_ms": percentiles_ms([r.ttft_s for r in rs]),
            "itl_ms": percentiles_ms([g for r in rs for g in r.gaps_s]),
        }
        if rs[0].stats:  # the cluster's modes
            realized = paired_speedup(rs, by_mode.get("gamma_0", []))
            bound = analytic_bound(rs, acc.get("acceptance_rate"), target_ms)
            row |= {
                "speedup_vs_gamma_0": realized,
                "analytic_speedup": bound,
                "realized_over_analytic": realized["median"] / bound if bound and realized["median"] else None,
                "cycle": cycle_split(rs),
                "acceptance_by_position": acceptance_by_position(rs, max_gamma),
            }
        out[mode] = row
    return out


def greedy_identity(runs: list[Run]) -> dict:
    """How many greedy runs of each mode produced exactly the HF target's tokens."""
    reference = {r.prompt: r.token_ids for r in runs if r.workload == "greedy" and r.mode == "hf_target"}
    out: dict[str, list[int]] = {}
    for r in runs:
        if r.workload == "greedy" and r.mode != "hf_target" and r.prompt in reference:
            same, total = out.setdefault(r.mode, [0, 0])
            out[r.mode] = [same + (r.token_ids == reference[r.prompt]), total + 1]
    return {m: {"identical": s, "runs": n} for m, (s, n) in out.items()}


def concurrency_row(runs: list[Run], wall_s: float, in_flight: int) -> dict:
    return {
        "in_flight": in_flight,
        "sessions": len(runs),
        "aggregate_tokens_per_s": sum(r.tokens for r in runs) / wall_s,
        "latency_ms": percentiles_ms([r.wall_s for r in runs]),
        "ttft_ms": percentiles_ms([r.ttft_s for r in runs]),
        "itl_ms": percentiles_ms([g for r in runs for g in r.gaps_s]),
        "per_session_tokens_per_s": spread([r.tokens_per_s for r in runs]),
        "cycle": cycle_split(runs),  # where a cycle's time goes at this load
        "mean_gamma": acceptance(runs).get("mean_gamma"),
    }


def pooled_concurrency_row(measured: list[tuple[list[Run], float]], in_flight: int) -> dict:
    """One level's repeated runs [(runs, wall seconds)] as one row, with each repeat's tokens/s."""
    runs = [r for level_runs, _ in measured for r in level_runs]
    row = concurrency_row(runs, sum(wall for _, wall in measured), in_flight)
    row["sessions"] = len(measured[0][0])
    row["repeats_tokens_per_s"] = [sum(r.tokens for r in level_runs) / wall for level_runs, wall in measured]
    return row
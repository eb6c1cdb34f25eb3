"""bench.md and the PNG plots, from the results dict (and the raw runs for the timeline)."""

import os
from pathlib import Path

from tandem.bench.runs import BLOCK, Run, mode_gamma, mode_shape, mode_verification

LABELS = {"hf_target": "HF target alone", "hf_assisted": "HF assisted", "hf_lookup": "HF prompt lookup"}
_DRAFT_AHEAD = {True: "on", False: "off", None: "as the cluster at --address is set"}


def label(mode: str) -> str:
    if mode.startswith("unbatched_"):
        return label(mode.removeprefix("unbatched_")) + ", unbatched"
    if (shape := mode_shape(mode)) != "chain":
        return label(mode.removesuffix(f"_{shape}")) + (", token trees" if shape == "tree" else ", chain or tree")
    if mode.endswith(BLOCK):
        return label(mode.removesuffix(BLOCK)) + ", block verification"
    if mode in LABELS:
        return LABELS[mode]
    return "tandem adaptive γ" if mode == "adaptive" else f"tandem γ={mode.removeprefix('gamma_')}"


def _ms(percentiles: dict | None, key: str) -> str:
    value = (percentiles or {}).get(key)
    return "–" if value is None else f"{value:.0f}"


def _short(path: str) -> str:
    """A path relative to the working directory when it lies below it."""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def _x(value, digits: int = 2, suffix: str = "") -> str:
    return "–" if value is None else f"{value:.{digits}f}{suffix}"


def _pct(share: float | None) -> float | None:
    return None if share is None else 100 * share


def _spread(s: dict, digits: int = 2, suffix: str = "") -> str:
    if not s or s.get("median") is None:
        return "–"
    return f"{s['median']:.{digits}f}{suffix} ({s['p25']:.{digits}f}–{s['p75']:.{digits}f})"


def _speed_table(rows: dict) -> list[str]:
    lines = ["| mode | tokens/s | × HF target | × HF assisted | × HF prompt lookup | × tandem γ=0 (realized) "
             "| analytic | realized / analytic | α | mean acceptance length | draft efficiency | TTFT p50 ms "
             "| ITL p50 / p90 / p99 ms |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for mode, r in rows.items():
        itl = r["itl_ms"]
        lines.append(
            f"| {label(mode)} | {_spread(r['tokens_per_s'], 1)} | {_spread(r['speedup_vs_hf_target'])} "
            f"| {_spread(r['speedup_vs_hf_assisted'])} | {_spread(r.get('speedup_vs_hf_lookup', {}))} "
            f"| {_spread(r.get('speedup_vs_gamma_0', {}))} "
            f"| {_x(r.get('analytic_speedup'))} | {_x(r.get('realized_over_analytic'))} "
            f"| {_x(r.get('acceptance_rate'))} | {_x(r.get('mean_acceptance_length'))} "
            f"| {_x(r.get('draft_efficiency'))} | {_x(r['ttft_ms']['p50'], 1)} "
            f"| {_x(itl['p50'], 1)} / {_x(itl['p90'], 1)} / {_x(itl['p99'], 1)} |")
    return lines


def _cycle_table(rows: dict) -> list[str]:
    lines = ["| mode | mean γ | draft ms | verify ms | wait ms | transport ms | orchestration ms | cycle ms "
             "| orchestration share | transport + orchestration share | Redis ms (overlapped) "
             "| drafted ahead | ahead ms (overlapped) | wire bytes / cycle |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for mode, r in rows.items():
        c = r.get("cycle")
        if not c:
            continue
        lines.append(
            f"| {label(mode)} | {_x(r.get('mean_gamma'))} | {_x(c['draft_ms'])} | {_x(c['verify_ms'])} "
            f"| {_x(c.get('wait_ms'))} | {_x(c['transport_ms'])} | {_x(c['orchestration_ms'])} | {_x(c['total_ms'])} "
            f"| {_x(_pct(c['orchestration_share']), 1, '%')} | {_x(_pct(c['overhead_share']), 1, '%')} "
            f"| {_x(c['redis_ms'])} | {_x(_pct(c['drafted_ahead_share']), 0, '%')} | {_x(c['ahead_ms'])} "
            f"| {c['wire_bytes_per_cycle']:.0f} |")
    return lines


def markdown(results: dict) -> str:
    cfg, m = results["config"], results["machine"]
    lines = [
        "# tandem bench",
        "",
        f"{results['started']}, {results['duration_s'] / 60:.1f} min on {m['cpu']} ({m['cores']} cores"
        f"{', ' + m['gpu'] if m['gpu'] else ', no GPU'}), Python {m['python']}, torch {m['torch']}. "
        f"{cfg['prompts']} prompts × {cfg['max_tokens']} max tokens, drafter {cfg.get('drafter', 'model')}, "
        f"draft `{_short(cfg['draft_model'])}`, "
        f"target `{_short(cfg['target_model'])}`, {cfg['threads']} torch thread(s) per model, "
        f"drafting ahead {_DRAFT_AHEAD[cfg.get('draft_ahead', True)]}.",
        "",
        "Speedups are per prompt against the same prompt's baseline run, median (interquartile range).",
    ]
    for workload, rows in results["workloads"].items():
        lines += ["", f"## {workload} ({'T=0' if workload == 'greedy' else 'T=1'})", "", *_speed_table(rows), "",
                  "Per-cycle time split (means per cycle; the cycle is its critical path: the Redis commit "
                  "overlaps the next cycle's first worker call):", "", *_cycle_table(rows)]
    identity = results["greedy_identical_to_target"]
    if identity:
        lines += ["", "## Exactness", "", "Greedy runs token-identical to HF's target alone: "
                  + ", ".join(f"{label(k)} {v['identical']}/{v['runs']}" for k, v in identity.items()) + "."]
    if results["concurrency"]:
        lines += ["", "## Concurrency (greedy)", "", "HF target alone runs its sessions in left-padded batches "
                  "of the level's size (a batch ends with its longest generation); unbatched: the same cluster "
                  "with workers at `--max-batch-tokens 1`.", "",
                  "| mode | sessions in flight | aggregate tokens/s | × one session | TTFT p50 / p99 ms "
                  "| ITL p50 / p99 ms | latency p50 / p90 ms |", "|---|---|---|---|---|---|---|"]
        for mode, levels in results["concurrency"].items():
            for c in levels:
                one = levels[0]["aggregate_tokens_per_s"] if levels[0]["in_flight"] == 1 else None
                lines.append(f"| {label(mode)} | {c['in_flight']} | {c['aggregate_tokens_per_s']:.1f} "
                             f"| {_x(c['aggregate_tokens_per_s'] / one if one else None)} "
                             f"| {_ms(c['ttft_ms'], 'p50')} / {_ms(c['ttft_ms'], 'p99')} "
                             f"| {_ms(c.get('itl_ms'), 'p50')} / {_ms(c.get('itl_ms'), 'p99')} "
                             f"| {_ms(c['latency_ms'], 'p50')} / {_ms(c['latency_ms'], 'p90')} |")
        lines += _adaptive_vs_target(results["concurrency"])
        lines += ["", "Where a cycle's time goes at each load (means per cycle, ms; wait: the worker calls waiting "
                  "for passes of other sessions' work):", "",
                  "| mode | sessions in flight | mean γ | draft | verify | wait | transport | orchestration | cycle |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for mode, levels in results["concurrency"].items():
            for c in levels:
                split = c.get("cycle")
                if split:
                    lines.append(f"| {label(mode)} | {c['in_flight']} | {_x(c.get('mean_gamma'))} "
                                 + "".join(f"| {_x(split.get(p), 1)} " for p in
                                           ("draft_ms", "verify_ms", "wait_ms", "transport_ms", "orchestration_ms",
                                            "total_ms")) + "|")
    lines += ["", "## Peak memory (VmHWM)", "", "| process | MiB |", "|---|---|"]
    lines += [f"| {k} | {_x(v, 0)} |" for k, v in results["peak_memory_mb"].items()]
    return "\n".join(lines) + "\n"


def drafters_markdown(passes: dict[str, dict]) -> str:
    """One table per workload over the passes of `tandem bench --drafter a,b`: each drafter's
    cluster modes and the HF modes of its own pass, against that pass's HF runs."""
    lines = ["# tandem bench: drafters", "",
             "Each drafter ran in its own pass with the HF baselines re-run beside it; speedups are per prompt "
             "against the same pass's run, median (interquartile range).",
             *[f"- {drafter}: {r['started']}, {r['duration_s'] / 60:.1f} min" for drafter, r in passes.items()]]
    workloads = dict.fromkeys(w for r in passes.values() for w in r["workloads"])
    for workload in workloads:
        lines += ["", f"## {workload} ({'T=0' if workload == 'greedy' else 'T=1'})", "",
                  "| drafter | mode | tokens/s | × HF target | × HF assisted | × HF prompt lookup "
                  "| mean acceptance length | α | mean γ |", "|---|---|---|---|---|---|---|---|---|"]
        for drafter, results in passes.items():
            for mode, r in results["workloads"].get(workload, {}).items():
                if mode == "hf_target":
                    continue
                lines.append(f"| {drafter} | {label(mode)} | {_spread(r['tokens_per_s'], 1)} "
                             f"| {_spread(r['speedup_vs_hf_target'])} | {_spread(r['speedup_vs_hf_assisted'])} "
                             f"| {_spread(r.get('speedup_vs_hf_lookup', {}))} "
                             f"| {_x(r.get('mean_acceptance_length'))} | {_x(r.get('acceptance_rate'))} "
                             f"| {_x(r.get('mean_gamma'))} |")
    identical = [f"{drafter} {label(k)} {v['identical']}/{v['runs']}" for drafter, r in passes.items()
                 for k, v in r["greedy_identical_to_target"].items()]
    if identical:
        lines += ["", "Greedy runs token-identical to HF's target alone: " + ", ".join(identical) + "."]
    return "\n".join(lines) + "\n"


DRAFTER_COLOURS = ("C0", "C1", "C2", "C3", "C4", "C5", "C6", "C8", "C9")  # matplotlib's cycle less its grey


def drafters_plot(passes: dict[str, dict], path: Path) -> None:
    """Bars of × HF target alone (median, IQR) per drafter and mode, one panel per workload;
    the HF peers' bars from the first pass."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(dict.fromkeys(w for r in passes.values() for w in r["workloads"]))
    if not workloads:  # a concurrency sweep alone: each pass's bench.md has its tables
        return
    fig, axes = plt.subplots(1, len(workloads), figsize=(7 * len(workloads), 4.5), squeeze=False)
    first = next(iter(passes))
    for ax, workload in zip(axes[0], workloads):
        bars = [(label(m), r["speedup_vs_hf_target"], "C7") for m, r in passes[first]["workloads"][workload].items()
                if m in ("hf_assisted", "hf_lookup")]  # (name, spread, colour): the peers grey
        bars += [(f"{drafter}: {label(m).removeprefix('tandem ').replace(', block verification', '')}",
                  r["speedup_vs_hf_target"], DRAFTER_COLOURS[i % len(DRAFTER_COLOURS)])
                 for i, (drafter, results) in enumerate(passes.items())
                 for m, r in results["workloads"][workload].items() if not m.startswith("hf_")]
        medians = [s["median"] for _, s, _ in bars]
        err = [[m - s["p25"] for m, (_, s, _) in zip(medians, bars)],
               [s["p75"] - m for m, (_, s, _) in zip(medians, bars)]]
        ax.bar(range(len(bars)), medians, yerr=err, capsize=3, color=[colour for _, _, colour in bars])
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xticks(range(len(bars)), [name for name, _, _ in bars], rotation=35, ha="right", fontsize=8)
        ax.set(title=workload, ylabel="speedup over HF target alone (median, IQR)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _adaptive_vs_target(concurrency: dict) -> list[str]:
    """Adaptive γ's aggregate tokens/s over γ = 0's at each level, pooled and per repeat (the
    repeats ran side by side, so their ratios show the run-to-run spread)."""
    lines = []
    for prefix in ("", "unbatched_"):
        adaptive, zero = concurrency.get(prefix + "adaptive"), concurrency.get(prefix + "gamma_0")
        if not (adaptive and zero):
            continue
        if not lines:
            lines = ["", "Adaptive γ ÷ γ = 0, aggregate tokens/s (each repeat's ratio in brackets):", "",
                     "| cluster | sessions in flight | adaptive ÷ γ = 0 | per repeat |", "|---|---|---|---|"]
        for a, z in zip(adaptive, zero, strict=True):
            each = [x / y for x, y in zip(a.get("repeats_tokens_per_s", []), z.get("repeats_tokens_per_s", []))]
            lines.append(f"| {prefix.rstrip('_') or 'batched'} | {a['in_flight']} "
                         f"| {a['aggregate_tokens_per_s'] / z['aggregate_tokens_per_s']:.2f} "
                         f"| {', '.join(f'{r:.2f}' for r in each)} |")
    return lines


def plots(results: dict, runs: list[Run], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if results["workloads"]:  # not with --concurrency-only
        _speedup_vs_gamma(plt, results, out / "speedup_vs_gamma.png")
        _acceptance_by_position(plt, results, out / "acceptance_by_position.png")
    _timeline(plt, runs, out / "cycle_timeline.png")
    _concurrency(plt, results, out / "throughput_vs_concurrency.png")


def _speedup_vs_gamma(plt, results, path):
    workloads = results["workloads"]
    fig, axes = plt.subplots(1, len(workloads), figsize=(6 * len(workloads), 4.2), squeeze=False)
    for ax, (workload, rows) in zip(axes[0], workloads.items()):
        for verification in ("token", "block"):
            series = sorted((mode_gamma(m), r) for m, r in rows.items()
                            if m.startswith("gamma_") and mode_verification(m) == verification
                            and mode_shape(m) == "chain")
            if series:
                med = [r["speedup_vs_hf_target"]["median"] for _, r in series]
                err = [[m - r["speedup_vs_hf_target"]["p25"] for m, (_, r) in zip(med, series)],
                       [r["speedup_vs_hf_target"]["p75"] - m for m, (_, r) in zip(med, series)]]
                ax.errorbar([g for g, _ in series], med, yerr=err, marker="o", capsize=3,
                            label=f"tandem, fixed γ, {verification} verification (median, IQR)")
        fixed = sorted((mode_gamma(m), r) for m, r in rows.items()
                       if m.startswith("gamma_") and mode_verification(m) == "token" and mode_shape(m) == "chain")
        gammas = [g for g, _ in fixed]
        base = rows.get("gamma_0", {}).get("speedup_vs_hf_target", {}).get("median")
        if base:  # the analytic bound is relative to tandem γ=0: put it on the same scale
            ax.plot(gammas, [(r.get("analytic_speedup") or 0) * base for _, r in fixed], "k--",
                    label="analytic S(α, γ, measured costs)")
        for mode, style in (("adaptive", "C2"), ("adaptive" + BLOCK, "C4"), ("hf_assisted", "C3")):
            if mode in rows:
                ax.axhline(rows[mode]["speedup_vs_hf_target"]["median"], color=style, linestyle=":",
                           label=label(mode))
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set(title=workload, xlabel="γ (tokens drafted per cycle)", ylabel="speedup over HF target alone")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _acceptance_by_position(plt, results, path):
    fig, ax = plt.subplots(figsize=(6, 4))
    for workload, rows in results["workloads"].items():
        for mode in ("gamma_8", "adaptive"):
            probs = rows.get(mode, {}).get("acceptance_by_position")
            if probs:
                pos = [i + 1 for i, p in enumerate(probs) if p is not None]
                ax.plot(pos, [p for p in probs if p is not None], marker="o", label=f"{workload}, {label(mode)}")
    ax.set(xlabel="position in the drafted block", ylabel="P(accepted | position reached)", ylim=(0, 1),
           title="acceptance by position in the block")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _timeline(plt, runs, path):
    run = next((r for r in runs if r.mode == "adaptive" and r.workload == "greedy" and r.stats), None)
    run = run or next((r for r in runs if r.stats), None)
    if run is None:
        return
    # Transport is split around the calls in reality; drawn as one piece. Redis comes last: it
    # runs while the next cycle's first call is under way.
    parts = [("draft_ms", "draft", "C0"), ("verify_ms", "verify", "C1"), ("wait_ms", "wait (batching)", "C8"),
             ("transport_ms", "transport", "C7"), ("orchestration_ms", "orchestration", "C2"),
             ("redis_ms", "Redis (overlapped)", "C3")]
    cycles = run.stats["per_cycle"]
    fig, ax = plt.subplots(figsize=(10, 0.22 * len(cycles) + 1.5))
    ahead_labelled = False
    for i, c in enumerate(cycles):
        x = c["start_ms"]
        for key, name, color in parts:
            ax.broken_barh([(x, c.get(key, 0.0))], (i - 0.4, 0.8), color=color, label=name if i == 0 else None)
            x += c.get(key, 0.0)
        if c["ahead_ms"]:  # the draft worker drafting past the block, alongside its verify
            ax.broken_barh([(c["start_ms"] + c["draft_ms"], c["ahead_ms"])], (i + 0.05, 0.35), color="C4",
                           label=None if ahead_labelled else "draft ahead (overlapped)")
            ahead_labelled = True
        mark = " (drafted ahead)" if c["drafted_ahead"] else ""
        ax.text(x + 0.3, i, f"γ={c['gamma']} +{c['output_tokens']}{mark}", va="center", fontsize=6)
    ax.invert_yaxis()
    ax.set(xlabel="ms since the request", ylabel="cycle",
           title=f"one generation ({label(run.mode)}, {run.workload}, prompt {run.prompt}): "
                 "time split per cycle (parts drawn in sequence)")
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _concurrency(plt, results, path):
    if not results["concurrency"]:
        return
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for mode, levels in results["concurrency"].items():
        x = [c["in_flight"] for c in levels]
        style = {"linestyle": ":" if mode.startswith("unbatched_") else "-"}
        line, = ax1.plot(x, [c["aggregate_tokens_per_s"] for c in levels], marker="o", label=label(mode), **style)
        ax2.plot(x, [c["ttft_ms"]["p50"] for c in levels], marker="o", color=line.get_color(),
                 label=f"{label(mode)} p50", **style)
    ax1.set(xlabel="sessions in flight", ylabel="aggregate tokens/s", title="throughput vs concurrency (greedy)")
    ax2.set(xlabel="sessions in flight", ylabel="time to first token, ms", title="TTFT p50 vs concurrency")
    ax2.set_yscale("log")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

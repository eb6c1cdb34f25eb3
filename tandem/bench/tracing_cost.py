"""What tracing costs, measured on one traced cluster. Each prompt runs twice, interleaved, in
a shuffled order: once under a sampled caller trace (every service records and exports its
spans: full sampling) and once under a sampled-out one (the W3C traceparent says so, and each
service's parent-based sampler drops the whole trace). Greedy with a fixed γ makes both runs
of a prompt the same cycles, so the per-cycle difference is the recording and exporting."""

import json
import os
import random
import secrets
import time
from pathlib import Path

from opentelemetry import context, trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from tandem.bench import summary
from tandem.bench.runs import Run, cluster_mode, cluster_run
from tandem import Client

STATES = ("traced", "untraced")
GAMMA = 3


def caller_context(sampled: bool) -> context.Context:
    """A caller's trace context whose sampled flag decides for the whole request."""
    flags = TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT)
    span = NonRecordingSpan(SpanContext(secrets.randbits(128), secrets.randbits(64), is_remote=False,
                                        trace_flags=flags))
    return trace.set_span_in_context(span)


def _run(client, state, i, prompt, max_tokens, gamma, seed) -> tuple[Run, bytes]:
    """One generation under a traced or untraced caller → (run, its trace id)."""
    caller = caller_context(state == "traced")
    token = context.attach(caller)
    try:
        run = cluster_run(client, cluster_mode(gamma), "greedy", i, prompt, max_tokens, seed)
    finally:
        context.detach(token)
    return run, trace.get_current_span(caller).get_span_context().trace_id.to_bytes(16, "big")


def measure(address: str, prompts: list[list[int]], max_tokens: int, seed: int, receiver,
            progress: bool = True, gamma: int = GAMMA) -> tuple[dict, list]:
    """→ (the results, the spans of the first traced request as (service, span) pairs)."""
    from tqdm import tqdm

    order = random.Random(seed)
    runs: dict[str, list[Run]] = {s: [] for s in STATES}
    trace_ids: list[bytes] = []  # of the traced runs
    with Client(address) as client:
        for state in STATES:  # warm-up
            _run(client, state, 0, prompts[0], max_tokens, gamma, seed)
        with tqdm(total=2 * len(prompts), desc="tracing on/off", unit="run", disable=not progress) as bar:
            for i, prompt in enumerate(prompts):
                states = list(STATES)
                order.shuffle(states)
                for state in states:
                    run, trace_id = _run(client, state, i, prompt, max_tokens, gamma, seed + i)
                    runs[state].append(run)
                    if state == "traced":
                        trace_ids.append(trace_id)
                    bar.update()
    # Let the last spans land: one batch-processor schedule (OTEL_BSP_SCHEDULE_DELAY, 5 s by default) and a bit.
    time.sleep(float(os.environ.get("OTEL_BSP_SCHEDULE_DELAY", 5000)) / 1e3 + 1.0)
    splits = {s: summary.cycle_split(runs[s]) for s in STATES}
    cycle_ms = {s: splits[s]["total_ms"] for s in STATES}
    with receiver.lock:
        spans = len(receiver.spans)
    result = {
        "mode": f"greedy, gamma={gamma}", "prompts": len(prompts), "max_tokens": max_tokens,
        "cycle_split": splits,
        "overhead_of_cycle_time": cycle_ms["traced"] / cycle_ms["untraced"] - 1,
        "tokens_per_s": {s: summary.spread([r.tokens_per_s for r in runs[s]]) for s in STATES},
        "traced_over_untraced_tokens_per_s": summary.paired_speedup(runs["traced"], runs["untraced"]),
        "spans_exported_per_traced_request": spans / (len(prompts) + 1),
        "identical_outputs": sum(a.token_ids == b.token_ids for a, b in zip(runs["traced"], runs["untraced"])),
    }
    return result, receiver.trace(trace_ids[0])


def write(result: dict, example: list, out: Path) -> None:
    (out / "tracing_overhead.json").write_text(json.dumps(result, indent=2) + "\n")
    s = result["cycle_split"]
    lines = [
        f"# Tracing overhead ({result['mode']}, {result['prompts']} prompts × {result['max_tokens']} max tokens)",
        "",
        "| | draft ms | verify ms | transport ms | orchestration ms | cycle ms | tokens/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for state in STATES:
        c, t = s[state], result["tokens_per_s"][state]
        lines.append(f"| {state} | {c['draft_ms']:.2f} | {c['verify_ms']:.2f} | {c['transport_ms']:.2f} "
                     f"| {c['orchestration_ms']:.2f} | {c['total_ms']:.2f} | {t['median']:.1f} |")
    paired = result["traced_over_untraced_tokens_per_s"]
    lines += ["", f"Tracing at full sampling adds {100 * result['overhead_of_cycle_time']:+.1f} % to the mean cycle "
              f"(critical path); traced / untraced tokens/s per prompt: {paired['median']:.3f} "
              f"({paired['p25']:.3f}–{paired['p75']:.3f}). {result['spans_exported_per_traced_request']:.0f} spans "
              f"exported per traced request; outputs identical in {result['identical_outputs']}/{result['prompts']} "
              "pairs."]
    (out / "tracing_overhead.md").write_text("\n".join(lines) + "\n")
    _plot(s, out / "tracing_overhead.png")
    if example:
        render_trace(example, out / "trace_timeline.png")


def _plot(splits: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    bottom = [0.0, 0.0]
    for part, color in (("draft_ms", "C0"), ("verify_ms", "C1"), ("transport_ms", "C7"), ("orchestration_ms", "C2")):
        heights = [splits[s][part] for s in STATES]
        ax.bar(STATES, heights, bottom=bottom, color=color, label=part.removesuffix("_ms"))
        bottom = [b + h for b, h in zip(bottom, heights)]
    ax.set(ylabel="mean ms per cycle (critical path)", title="tracing at full sampling vs sampled out")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def render_trace(spans: list, path: Path, cycles: int = 4) -> None:
    """A Jaeger-style timeline of one request's first cycles: a row per span, indented by
    depth, coloured by service."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_id = {sp.span_id: (sv, sp) for sv, sp in spans}
    children: dict[bytes, list] = {}
    for sv, sp in spans:
        children.setdefault(sp.parent_span_id, []).append((sv, sp))
    roots = [(sv, sp) for sv, sp in spans if sp.parent_span_id not in by_id]
    rows: list[tuple[int, str, object]] = []

    def visit(sv, sp, depth):
        if sp.name == "cycle" and _int_attribute(sp, "tandem.cycle.index") >= cycles:
            return
        rows.append((depth, sv, sp))
        for child in sorted(children.get(sp.span_id, []), key=lambda c: c[1].start_time_unix_nano):
            visit(*child, depth + 1)

    for root in sorted(roots, key=lambda c: c[1].start_time_unix_nano):
        visit(*root, 0)
    t0 = min(sp.start_time_unix_nano for _, _, sp in rows)
    # Show the first cycles only: what starts after the last of them (the releases) is cut.
    end = max(sp.end_time_unix_nano for _, _, sp in rows if sp.name == "cycle")
    rows = [row for row in rows if row[2].start_time_unix_nano <= end]
    colors = {"tandem-orchestrator": "C0", "tandem-draft-worker": "C2", "tandem-target-verifier": "C1"}
    fig, ax = plt.subplots(figsize=(11, 0.26 * len(rows) + 1.2))
    fig.subplots_adjust(left=0.3)
    for y, (depth, sv, sp) in enumerate(rows):
        start = (sp.start_time_unix_nano - t0) / 1e6
        ax.barh(y, (sp.end_time_unix_nano - sp.start_time_unix_nano) / 1e6, left=start, color=colors.get(sv, "C7"))
        ax.text(-0.36, y, "   " * depth + sp.name, ha="left", va="center", fontsize=6, family="monospace",
                transform=ax.get_yaxis_transform())
    ax.set_yticks([])
    ax.invert_yaxis()
    ax.set_xlim(0, (end - t0) / 1e6 * 1.05)
    ax.set(xlabel="ms since the request span began",
           title=f"one traced request, its first {cycles} cycles (orchestrator blue, draft worker green, "
                 "target verifier orange; the request span goes on)")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def _int_attribute(span, key: str) -> int:
    return next((a.value.int_value for a in span.attributes if a.key == key), 0)

"""The cluster across a network: tokens/s against the one-way delay between the orchestrator and
its workers, for every fixed γ and the adaptive policy, on the multi-host test bed.

    .venv/bin/python benchmarks/network.py up [--delay-ms 5]     # a cluster on the test bed, until Ctrl-C
    .venv/bin/python benchmarks/network.py sweep [--delays 0,1,5,20] [--gammas 0-8,auto]

The test bed (tandem.bench.testbed, tandem.bench.network) puts the orchestrator, the draft worker
and the target verifier each in a network namespace of its own, on its own address, and runs
every orchestrator↔worker link through a user-space delay proxy (the kernel here has no netem).
`up` starts it, prints the ingress and the link addresses, and takes the proxy's commands on
stdin (`delay * 20`, `drop draft-0`, ...). `sweep` runs, per delay, workload (greedy, T = 1) and
sessions in flight (1, 8), every mode once in a shuffled order over the held-out prompts, with
ignore_eos so that every stream is max_tokens long. Needs root (network namespaces).

Writes results/network/sweep.{json,md,png}.
"""

import argparse
import json
import random
import sys
import time
from pathlib import Path

import matplotlib
from transformers import AutoTokenizer

from tandem.bench.network import NetworkCluster
from tandem.bench.runs import cluster_mode, concurrent_runs
from tandem.bench.summary import concurrency_row
from tandem.bench.testbed import unavailable
from tandem.cli import HELDOUT_PROMPTS, default_pair

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "network"
WORKLOADS = ("greedy", "sampled")


def _modes(text: str) -> list[str]:
    """"0-8,auto" → the cluster modes of γ 0 … 8 and adaptive."""
    modes = []
    for part in text.split(","):
        if part == "auto":
            modes.append(cluster_mode(None))
        elif "-" in part:
            lo, hi = part.split("-")
            modes += [cluster_mode(g) for g in range(int(lo), int(hi) + 1)]
        else:
            modes.append(cluster_mode(int(part)))
    return modes


def up(args) -> None:
    draft, target = default_pair()
    with NetworkCluster(draft, target, args.drafters, args.verifiers, args.delay_ms, args.jitter_ms,
                        echo=True) as cluster:
        print(f"ingress {cluster.address}; links {cluster.bed.links}", flush=True)
        print("commands: delay NAME|* MS [JITTER_MS], drop NAME|*, down NAME|*, up NAME|*; Ctrl-D to stop", flush=True)
        for line in sys.stdin:
            try:
                cluster.bed.command(line.strip())
                print("ok", flush=True)
            except ValueError as e:
                print(e, flush=True)


def sweep(args) -> None:
    draft, target = default_pair()
    tokenizer = AutoTokenizer.from_pretrained(target)
    prompts = [tokenizer.encode(json.loads(line)["prompt"]) for line in open(HELDOUT_PROMPTS)]
    modes = _modes(args.gammas)
    delays = [float(d) for d in args.delays.split(",")]
    levels = [int(n) for n in args.in_flight.split(",")]
    points = [(d, w, n) for d in delays for w in args.workloads.split(",") for n in levels]
    rng = random.Random(args.seed)
    rows = []
    OUT.mkdir(parents=True, exist_ok=True)
    with NetworkCluster(draft, target, delay_ms=delays[0]) as cluster:
        concurrent_runs(cluster.address, cluster_mode(None), "greedy", prompts[:2], 16, 2, 0)  # warm-up
        start = time.time()
        for i, (delay, workload, in_flight) in enumerate(points):
            cluster.bed.set_delay(delay, args.jitter_ms)
            # The same prompts at every delay and workload: points differ only in what they vary.
            batch = [prompts[j % len(prompts)] for j in range(max(args.sessions, 2 * in_flight))]
            for mode in rng.sample(modes, len(modes)):
                runs, wall = concurrent_runs(cluster.address, mode, workload, batch, args.max_tokens, in_flight,
                                             args.seed, ignore_eos=True)
                row = concurrency_row(runs, wall, in_flight)
                rows.append({"delay_ms": delay, "jitter_ms": args.jitter_ms, "workload": workload, "mode": mode,
                             **{k: row[k] for k in ("in_flight", "sessions", "aggregate_tokens_per_s", "ttft_ms",
                                                    "mean_gamma", "cycle")}})
            best, adaptive, _ = _point(rows[-len(modes):])
            print(f"[{i + 1}/{len(points)}, {time.time() - start:.0f} s] delay {delay:g} ms, {workload}, "
                  f"{in_flight} in flight: best {best['mode']} {best['aggregate_tokens_per_s']:.1f} tokens/s"
                  + (f", adaptive {adaptive['aggregate_tokens_per_s']:.1f} (mean γ {adaptive['mean_gamma'] or 0:.2f})"
                     if adaptive else ""), flush=True)
            write(rows, args)


def _point(group: list[dict]) -> tuple[dict, dict | None, dict | None]:
    """A point's rows → (its best fixed γ's, adaptive γ's, γ = 0's; None where not run)."""
    best = max((r for r in group if r["mode"] != "adaptive"), key=lambda r: r["aggregate_tokens_per_s"])
    adaptive = next((r for r in group if r["mode"] == "adaptive"), None)
    zero = next((r for r in group if r["mode"] == cluster_mode(0)), None)
    return best, adaptive, zero


def write(rows: list[dict], args) -> None:
    (OUT / "sweep.json").write_text(json.dumps({"args": vars(args) | {"func": None}, "rows": rows}, indent=1))
    lines = ["| delay (ms) | workload | in flight | best fixed γ | its tokens/s | adaptive tokens/s | adaptive / best "
             "| adaptive mean γ | γ = 0 tokens/s |", "|---|---|---|---|---|---|---|---|---|"]
    groups = sorted({(r["delay_ms"], r["workload"], r["in_flight"]) for r in rows})
    for key in groups:
        best, adaptive, zero = _point([r for r in rows if (r["delay_ms"], r["workload"], r["in_flight"]) == key])
        a = adaptive["aggregate_tokens_per_s"] if adaptive else float("nan")
        lines.append(f"| {key[0]:g} | {key[1]} | {key[2]} | {best['mode']} | {best['aggregate_tokens_per_s']:.1f} | "
                     f"{a:.1f} | {a / best['aggregate_tokens_per_s']:.2f} | "
                     f"{(adaptive or {}).get('mean_gamma') or 0:.2f} | "
                     f"{zero['aggregate_tokens_per_s'] if zero else float('nan'):.1f} |")
    (OUT / "sweep.md").write_text("\n".join(lines) + "\n")
    plot(rows)


def plot(rows: list[dict]) -> None:
    panels = sorted({(r["workload"], r["in_flight"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (workload, in_flight) in zip(axes[0], panels):
        group = [r for r in rows if (r["workload"], r["in_flight"]) == (workload, in_flight)]
        for mode in sorted({r["mode"] for r in group}, key=lambda m: (m == "adaptive", m)):
            points = sorted((r["delay_ms"], r["aggregate_tokens_per_s"]) for r in group if r["mode"] == mode)
            style = dict(color="black", linewidth=2.5) if mode == "adaptive" else dict(alpha=0.6)
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=mode, **style)
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xlabel("one-way delay, orchestrator ↔ each worker (ms)")
        ax.set_ylabel("tokens/s (all sessions)")
        ax.set_title(f"{workload}, {in_flight} in flight")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(OUT / "sweep.png", dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(required=True)
    p_up = sub.add_parser("up", help="a cluster on the test bed until Ctrl-D")
    p_up.add_argument("--delay-ms", type=float, default=5.0)
    p_up.add_argument("--jitter-ms", type=float, default=0.0)
    p_up.add_argument("--drafters", type=int, default=1)
    p_up.add_argument("--verifiers", type=int, default=1)
    p_up.set_defaults(func=up)
    p_sweep = sub.add_parser("sweep", help="tokens/s against delay, per γ and the adaptive policy")
    p_sweep.add_argument("--delays", default="0,1,5,20", help="one-way delays in ms")
    p_sweep.add_argument("--jitter-ms", type=float, default=0.0)
    p_sweep.add_argument("--gammas", default="0-8,auto")
    p_sweep.add_argument("--workloads", default="greedy,sampled")
    p_sweep.add_argument("--in-flight", default="1,8")
    p_sweep.add_argument("--sessions", type=int, default=4, help="sessions per point (at least twice as many as in flight)")
    p_sweep.add_argument("--max-tokens", type=int, default=64)
    p_sweep.add_argument("--seed", type=int, default=0)
    p_sweep.set_defaults(func=sweep)
    args = parser.parse_args()
    if reason := unavailable():
        raise SystemExit(f"benchmarks/network.py: the test bed cannot run here: {reason}")
    args.func(args)


if __name__ == "__main__":
    main()

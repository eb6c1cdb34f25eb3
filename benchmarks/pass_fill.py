"""How full the target's forward passes are in the cluster: sessions and tokens per pass at each
level of sessions in flight, read from the target worker's Prometheus histograms
(`tandem:worker_batch_sessions`, `tandem:worker_batch_tokens`; prefills included) before and
after each level. A local cluster as `vllm_peer.py` starts it (the shipped pair, the held-out
prompts, greedy, 96 tokens), γ = 0 and adaptive. Writes {pass_fill.json, pass_fill.md,
pass_fill.png} to --out (default results/pass_fill/).

    .venv/bin/python benchmarks/pass_fill.py [--levels 8,32,64] [--drafter hybrid] [--out DIR] [--smoke]   # ~2 min

--smoke: the whole path at a tiny size (2 prompts, 2 sessions at 2 in flight, 8 tokens; flags
given explicitly still win), results only to --out (a new temporary directory when none is
given).
"""

import argparse
import json
import tempfile
from pathlib import Path

from vllm_peer import ROOT, load_prompt_ids, say, sessions_at

from tandem.bench.runs import cluster_mode, concurrent_runs
from tandem.bench.worker_metrics import batch_histogram
from tandem.local import LocalCluster
from tandem.ports import free_port


def fill(port: int, run) -> dict:
    """run() between two reads of the target's histograms → passes, sessions and tokens per pass."""
    before = {name: batch_histogram("127.0.0.1", port, name) for name in ("sessions", "tokens")}
    run()
    after = {name: batch_histogram("127.0.0.1", port, name) for name in ("sessions", "tokens")}
    passes = after["sessions"][1] - before["sessions"][1]
    return {"passes": passes} | {f"{name}_per_pass": (after[name][0] - before[name][0]) / passes
                                 for name in ("sessions", "tokens")}


# --smoke's sizes (main's defaults under --smoke; a flag given explicitly wins).
SMOKE = {"levels": [2], "sessions": 2, "max_tokens": 8, "limit": 2}


def measure(args) -> dict:
    """γ = 0, then adaptive, at each level: {mode: {level: passes, sessions and tokens per pass}}."""
    prompts = load_prompt_ids(args.target, args.limit)
    cluster = LocalCluster(args.draft, args.target, free_port(), threads=1, max_gamma=8, echo=False,
                           metrics_port=free_port(), metrics_fallback=True,
                           options={"max_sessions": max(64, *args.levels)}, drafter=args.drafter)
    results: dict = {}
    with cluster:
        port = cluster.metrics_ports["target-0"]
        concurrent_runs(cluster.address, "gamma_0", "greedy", [p[:16] for p in prompts[:4]], 8, 4, 0)  # warm-up
        for gamma in (0, None):
            mode = cluster_mode(gamma)
            for level in args.levels:
                sessions = sessions_at(prompts, level, args.sessions)
                results.setdefault(mode, {})[level] = row = fill(port, lambda: concurrent_runs(
                    cluster.address, mode, "greedy", sessions, args.max_tokens, level, 0))
                say(f"{mode} at {level} in flight: {row['sessions_per_pass']:.1f} sessions, "
                    f"{row['tokens_per_pass']:.1f} tokens per pass ({row['passes']:.0f} passes)")
    return results


def write(results: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    (out / "pass_fill.json").write_text(json.dumps(results, indent=1))
    levels = sorted({level for rows in results.values() for level in rows})
    lines = ["| mode | " + " | ".join(f"{level} in flight" for level in levels) + " |",
             "|---|" + "---|" * len(levels)]
    for mode, rows in results.items():
        cells = [f"{rows[level]['sessions_per_pass']:.1f} sessions, {rows[level]['tokens_per_pass']:.1f} tokens"
                 for level in levels]
        lines.append(f"| {mode} | " + " | ".join(cells) + " |")
    (out / "pass_fill.md").write_text("\n".join(lines) + "\n")
    fig, ax = plt.subplots(figsize=(6, 4))
    for mode, rows in results.items():
        ax.plot(levels, [rows[level]["sessions_per_pass"] for level in levels], marker="o", label=mode)
    ax.plot(levels, levels, linestyle=":", color="grey", label="every session in every pass")
    ax.set(xlabel="sessions in flight", ylabel="sessions per target pass", title="How full the target's passes are")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "pass_fill.png", dpi=120)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--levels", default="8,32,64", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--sessions", type=int, default=16, help="sessions per level: max(this, level)")
    p.add_argument("--limit", type=int, default=64, help="held-out prompts used")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--drafter", default="hybrid", choices=("hybrid", "model", "ngram"))
    p.add_argument("--target", default=str(ROOT / "models" / "target"))
    p.add_argument("--draft", default=str(ROOT / "models" / "draft"))
    p.add_argument("--out", default=None, help="default: benchmarks/results/pass_fill (with --smoke: a new "
                                                "temporary directory)")
    p.add_argument("--smoke", action="store_true", help="the whole path at a tiny size")
    if p.parse_known_args(argv)[0].smoke:
        p.set_defaults(**SMOKE)
    args = p.parse_args(argv)
    args.out = args.out or (tempfile.mkdtemp(prefix="pass_fill-smoke-") if args.smoke
                            else str(ROOT / "benchmarks" / "results" / "pass_fill"))
    write(measure(args), Path(args.out))
    say(f"results in {args.out}")


if __name__ == "__main__":
    main()

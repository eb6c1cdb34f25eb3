"""Operator calls and CPU time of one worker round, by the number of sessions in it, against the
engine before batching in the same run.

A round is what a worker's model thread does for the steps it batches: one forward pass over
every session's new tokens and the answers of their asks (tandem.services.sampler), driven on
the calling thread as the Batcher's model thread drives it. On the shipped pair:

- uniform: each session holds a 100-token context, then all at once the target verifies a
  block of γ = 3 (4 tokens each; greedy, and T = 1 with the draft's distributions), or the
  draft drafts the next token (1 token each);
- mixed, greedy, as a cluster's passes come: contexts of 130 to 229 tokens; the target checks
  blocks of 1 to 8 drafted tokens after 1 or 2 committed ones, the draft feeds 1 token (70 %)
  or 2 to 8.

The torch profiler counts the aten operators a round calls from Python (an operator's own
internal calls, such as a CPU matrix product's per-batch slices, are not counted). The CPU time
of a round is its thread's. With `--baseline COMMIT` (benchmarks/baseline.py) a second process
runs the engine of that commit; the two take turns round by round on the same rounds, so that
each ratio pairs rounds run side by side on the machine's drift. Writes
operator_calls.{json,md,png} to --out (results/). `--smoke` runs it all at a tiny size (1 and 2
sessions, one timed round), against the checkout's HEAD unless --baseline names another.

    .venv/bin/python benchmarks/operator_calls.py [--sessions 1,3,8,32,64] [--rounds 16] [--baseline COMMIT]
        [--out DIR] [--smoke]
"""

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import baseline
import torch
from torch.profiler import ProfilerActivity, profile

from tandem.math.params import SamplingParams
from tandem.math.sampling import warp
from tandem.services.draft_worker import propose
from tandem.services.runtime import ModelRuntime
from tandem.services.target_verifier import verify

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results"
GAMMA = 3
WORKLOADS = {"greedy": SamplingParams(temperature=0.0), "T=1": SamplingParams(temperature=1.0, seed=3),
             "mixed greedy": SamplingParams(temperature=0.0)}


def run_round(runtime: ModelRuntime, jobs: list) -> list:
    """One round of one-step jobs on this thread: their steps in one pass, their asks answered
    together (an engine before asks: each job samples on its own), each job sent its answer →
    the jobs' results."""
    steps = [next(job) for job in jobs]
    results = runtime.extend_batch(steps)
    asked = [i for i, s in enumerate(steps) if getattr(s, "ask", None) is not None]
    if asked:
        from tandem.services import sampler

        for i, answer in zip(asked, sampler.answer([steps[i].ask for i in asked], [results[i] for i in asked])):
            results[i] = answer
    out = []
    for job, result in zip(jobs, results):
        try:
            job.send(result)
        except StopIteration as done:
            out.append(done.value)
    return out


def make_jobs(kind: str, runtime: ModelRuntime, n: int, workload: str, rng: random.Random) -> list:
    """n sessions' one-step jobs, each after a fresh context of its own."""
    vocab, params, mixed = runtime.info.vocab_size, WORKLOADS[workload], workload.startswith("mixed")
    jobs = []
    for i in range(n):
        context = rng.randrange(130, 230) if mixed else 100
        runtime.extend(f"s{i}", 0, [rng.randrange(vocab) for _ in range(context)], keep=1)
        if kind == "draft":
            fed = 1 if not mixed or rng.random() < 0.7 else rng.randrange(2, 9)
            jobs.append(propose(f"s{i}", context, [rng.randrange(vocab) for _ in range(fed)], 1, params))
            continue
        gamma, tail = (rng.randrange(1, 9), rng.randrange(1, 3)) if mixed else (GAMMA, 1)
        drafts = [rng.randrange(vocab) for _ in range(gamma)]
        draft_probs = None if params.greedy else warp(torch.randn(gamma, vocab), params)  # [γ, V]
        jobs.append(verify(f"s{i}", context, [rng.randrange(vocab) for _ in range(tail)], drafts, draft_probs, params))
    return jobs


def operator_calls(prof) -> int:
    """The aten operators called from Python during a profile: those with no operator above them."""
    return sum(1 for e in prof.events() if e.name.startswith("aten::") and e.cpu_parent is None)


def serve() -> None:
    """Answer rounds ({"kind", "sessions", "workload", "seed", "count"}) with the round's CPU ms,
    or its operator calls when counted."""
    torch.set_num_threads(1)  # as a worker runs here
    runtimes = {kind: ModelRuntime(str(ROOT / "models" / kind)) for kind in ("target", "draft")}

    def measure_round(ask: dict) -> dict:
        runtime = runtimes[ask["kind"]]
        jobs = make_jobs(ask["kind"], runtime, ask["sessions"], ask["workload"], random.Random(ask["seed"]))
        if ask["count"]:
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                run_round(runtime, jobs)
            return {"operator_calls": operator_calls(prof)}
        start = time.thread_time()
        run_round(runtime, jobs)
        return {"cpu_ms": (time.thread_time() - start) * 1e3}

    baseline.serve(measure_round)


def measure(engines: dict[str, baseline.Engine], counts: list[int], rounds: int) -> list[dict]:
    rows = []
    for kind in ("target", "draft"):
        for workload in WORKLOADS:
            for n in counts:
                row = {"worker": kind, "workload": workload, "sessions": n}
                times = {name: [] for name in engines}
                for i in range(rounds + 2):  # the first two warm up
                    for name in baseline.in_turn(engines, i):
                        ms = engines[name].ask(kind=kind, sessions=n, workload=workload, seed=i, count=False)["cpu_ms"]
                        times[name].append(ms)
                for name, engine in engines.items():
                    row[name] = {"operator_calls": engine.ask(kind=kind, sessions=n, workload=workload, seed=0,
                                                              count=True)["operator_calls"],
                                 "cpu_ms": statistics.median(times[name][2:])}
                if "before" in engines:
                    row["paired_ratio"] = statistics.median(b / a for a, b in zip(times["before"][2:],
                                                                                  times["batched"][2:]))
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", default="1,3,8,32,64")
    parser.add_argument("--rounds", type=int, default=16, help="timed rounds per engine and point")
    parser.add_argument("--baseline", help="a commit (or its package directory) whose engine runs the same rounds")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # a round server
    parser.add_argument("--out", type=Path,
                        help="the folder for operator_calls.{json,md,png} (default: benchmarks/results)")
    parser.add_argument("--smoke", action="store_true", help="the whole run at a tiny size, against HEAD by default")
    args = parser.parse_args()
    if args.smoke and args.out is None:  # a smoke run writes nothing over the measured results
        parser.error("--smoke writes only to a folder given with --out")
    args.out = args.out or OUT
    if args.smoke:
        args.sessions, args.rounds, args.baseline = "1,2", 1, args.baseline or "HEAD"
    if args.serve:
        serve()
        return
    counts = [int(n) for n in args.sessions.split(",")]
    rows, engines = baseline.side_by_side(__file__, args.baseline, lambda e: measure(e, counts, args.rounds))
    baseline.save(args.out, "operator_calls", args.baseline, rows)
    write_table(rows, engines, args.out)


def write_table(rows: list[dict], engines: list[str], out: Path) -> None:
    plt = baseline.pyplot()
    shown = baseline.shown(engines)
    lines = ["| worker | workload | sessions | " + " | ".join(f"{e}: operator calls" for e in shown) + " | "
             + " | ".join(f"{e}: CPU ms per round" for e in shown) + (" | batched ÷ before (paired) |"
                                                                       if "before" in shown else " |"),
             "|---|---|---|" + "---|" * (2 * len(shown)) + ("---|" if "before" in shown else "")]
    for r in rows:
        lines.append(f"| {r['worker']} | {r['workload']} | {r['sessions']} | "
                     + " | ".join(str(r[e]["operator_calls"]) for e in shown) + " | "
                     + " | ".join(f"{r[e]['cpu_ms']:.2f}" for e in shown)
                     + (f" | {r['paired_ratio']:.2f} |" if "before" in shown else " |"))
    (out / "operator_calls.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for ax, kind in zip(axes, ("target", "draft")):
        for e in shown:
            for workload in WORKLOADS:
                points = [r for r in rows if r["worker"] == kind and r["workload"] == workload]
                ax.plot([r["sessions"] for r in points], [r[e]["operator_calls"] for r in points], marker="o",
                        linestyle="-" if e == "batched" else "--", label=f"{e}, {workload}")
        ax.set(title=f"{kind}: one round", xlabel="sessions in the round", ylabel="aten operator calls")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "operator_calls.png", dpi=120)


if __name__ == "__main__":
    main()

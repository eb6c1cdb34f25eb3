"""Operator calls and time of one worker round, by the number of sessions in it.

A round is what a worker's model thread does for the steps it batches: one forward pass over
every session's new tokens and the answers of their asks (tandem.services.sampler). Here, on the
shipped pair, each session holds a 100-token context and then, all at once:

- target: verifies a block of γ = 3 drafted tokens (4 tokens per session; greedy, and T = 1
  with the draft's distributions);
- draft: drafts the next token (1 token per session; greedy and T = 1).

With `--baseline COMMIT` the same rounds run on that commit's engine too, in a subprocess
(benchmarks/baseline.py; the engine before batching: each session's attention and sampling
apart): the "before" rows.

The torch profiler counts the aten operators a round calls from Python (an operator's own
internal calls, such as a CPU matrix product's per-batch slices, are not counted), on the
calling thread; the round is driven there, as the Batcher's model thread drives it. The median
of `--repeats` timed rounds follows. Writes results/operator_calls.{json,md,png}.

    .venv/bin/python benchmarks/operator_calls.py [--sessions 1,8,32,64] [--repeats 9] [--baseline COMMIT]
"""

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import baseline
import matplotlib
import torch
from torch.profiler import ProfilerActivity, profile

from tandem.math.params import SamplingParams
from tandem.math.sampling import warp
from tandem.services.draft_worker import propose
from tandem.services.runtime import ModelRuntime
from tandem.services.target_verifier import verify

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results"
CONTEXT, GAMMA = 100, 3
WORKLOADS = {"greedy": SamplingParams(temperature=0.0), "T=1": SamplingParams(temperature=1.0, seed=3)}


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


def operator_calls(prof) -> int:
    """The aten operators called from Python during a profile: those with no operator above them."""
    return sum(1 for e in prof.events() if e.name.startswith("aten::") and e.cpu_parent is None)


def make_jobs(kind: str, runtime: ModelRuntime, n: int, params: SamplingParams, rng: random.Random) -> list:
    """n sessions' one-step jobs after a fresh 100-token context each."""
    vocab = runtime.info.vocab_size
    for i in range(n):
        runtime.extend(f"s{i}", 0, [rng.randrange(vocab) for _ in range(CONTEXT)], keep=1)
    if kind == "draft":
        return [propose(f"s{i}", CONTEXT, [rng.randrange(vocab)], 1, params) for i in range(n)]
    jobs = []
    for i in range(n):
        drafts = [rng.randrange(vocab) for _ in range(GAMMA)]
        draft_probs = None if params.greedy else warp(torch.randn(GAMMA, vocab), params)  # [γ, V]
        jobs.append(verify(f"s{i}", CONTEXT, [rng.randrange(vocab)], drafts, draft_probs, params))
    return jobs


def measure(kind: str, model_dir: Path, counts: list[int], repeats: int) -> dict:
    runtime = ModelRuntime(str(model_dir))
    rng = random.Random(0)
    rows = {}
    for workload, params in WORKLOADS.items():
        for n in counts:
            run_round(runtime, make_jobs(kind, runtime, n, params, rng))  # warm-up
            jobs = make_jobs(kind, runtime, n, params, rng)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                run_round(runtime, jobs)
            calls = operator_calls(prof)
            times = []
            for _ in range(repeats):
                jobs = make_jobs(kind, runtime, n, params, rng)
                start = time.perf_counter()
                run_round(runtime, jobs)
                times.append((time.perf_counter() - start) * 1e3)
            rows[f"{workload} {n}"] = {"workload": workload, "sessions": n, "operator_calls": calls,
                                       "round_ms": statistics.median(times)}
            print(f"{kind} {workload:6s} {n:3d} sessions: {calls:6d} operator calls, "
                  f"{statistics.median(times):7.2f} ms per round", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", default="1,8,32,64")
    parser.add_argument("--repeats", type=int, default=9)
    baseline.add_arguments(parser)
    args = parser.parse_args()
    torch.set_num_threads(1)  # as a worker runs here
    counts = [int(n) for n in args.sessions.split(",")]
    results = baseline.compare(args, lambda: {kind: measure(kind, ROOT / "models" / kind, counts, args.repeats)
                                              for kind in ("target", "draft")})
    if results:
        OUT.mkdir(parents=True, exist_ok=True)
        (OUT / "operator_calls.json").write_text(json.dumps(results, indent=1))
        write_table(results)


def write_table(results: dict) -> None:
    engines = [e for e in ("before", "batched") if e in results]
    lines = ["| worker | workload | sessions | " + " | ".join(f"{e}: operator calls | {e}: round ms" for e in engines)
             + " |", "|---|---|---|" + "---|---|" * len(engines)]
    for kind, rows in results["batched"].items():
        for key, r in rows.items():
            cells = " | ".join(f"{results[e][kind][key]['operator_calls']} | {results[e][kind][key]['round_ms']:.2f}"
                               for e in engines)
            lines.append(f"| {kind} | {r['workload']} | {r['sessions']} | {cells} |")
    (OUT / "operator_calls.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for ax, kind in zip(axes, results["batched"]):
        for e in engines:
            for workload in WORKLOADS:
                points = [r for r in results[e][kind].values() if r["workload"] == workload]
                ax.plot([r["sessions"] for r in points], [r["operator_calls"] for r in points], marker="o",
                        linestyle="-" if e == "batched" else "--", label=f"{e}, {workload}")
        ax.set(title=f"{kind}: one round", xlabel="sessions in the round", ylabel="aten operator calls")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(OUT / "operator_calls.png", dpi=120)


if __name__ == "__main__":
    main()

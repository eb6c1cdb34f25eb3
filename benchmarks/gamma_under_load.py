"""Aggregate tokens/s of fixed γ against adaptive γ at several loads, on one local cluster.

    .venv/bin/python benchmarks/gamma_under_load.py --levels 8,16,32,64 --gammas 0,1,2,3,auto

Starts `tandem up`'s local cluster (shipped pair, embedded Redis, one torch thread per worker)
and, for each level and γ in turn, runs that many greedy sessions of up to 128 tokens at once
over the held-out prompts, measured as `tandem bench`'s concurrency sweep measures a level
(tandem.bench.runs.concurrent_runs, summary.concurrency_row). It prints, per run, the aggregate
tokens/s, TTFT p50 and the mean γ of its cycles: what the adaptive policy chose against what
each fixed γ achieves at the same load (benchmarks/README.md, "Many sessions at once").
"""

import argparse
import json

from transformers import AutoTokenizer

from tandem.bench.runs import cluster_mode, concurrent_runs
from tandem.bench.summary import concurrency_row
from tandem.cli import HELDOUT_PROMPTS, default_pair
from tandem.local import LocalCluster
from tandem.ports import free_port

MAX_TOKENS = 128


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="8,16,32,64", help="sessions in flight, comma-separated")
    parser.add_argument("--gammas", default="0,1,2,3,auto", help="fixed γ values and/or 'auto'")
    args = parser.parse_args()
    draft, target = default_pair()
    tokenizer = AutoTokenizer.from_pretrained(target)
    prompts = [tokenizer.encode(json.loads(line)["prompt"]) for line in open(HELDOUT_PROMPTS)]
    modes = [cluster_mode(None if g == "auto" else int(g)) for g in args.gammas.split(",")]
    with LocalCluster(draft, target, free_port(), threads=1, echo=False, options={"max_sessions": 128}) as cluster:
        concurrent_runs(cluster.address, "adaptive", "greedy", prompts[:4], 8, 4, 0)  # warm-up: the first passes
        for sessions in (int(n) for n in args.levels.split(",")):
            batch = [prompts[i % len(prompts)] for i in range(sessions)]
            for mode in modes:
                row = concurrency_row(*concurrent_runs(cluster.address, mode, "greedy", batch, MAX_TOKENS, sessions, 0),
                                      sessions)
                print(f"{sessions:3d} sessions, {mode}: {row['aggregate_tokens_per_s']:.1f} tokens/s, "
                      f"TTFT p50 {row['ttft_ms']['p50']:.0f} ms, mean γ {row['mean_gamma'] or 0:.2f}", flush=True)


if __name__ == "__main__":
    main()

"""Aggregate tokens/s of fixed γ against adaptive γ at several loads, on one local cluster.

    .venv/bin/python benchmarks/gamma_under_load.py --levels 8,16,32,64 --gammas 0,1,2,3,auto
        [--max-tokens 128] [--out DIR] [--smoke]

Starts `tandem up`'s local cluster (shipped pair, embedded Redis, one torch thread per worker)
and, for each level and γ in turn, runs that many greedy sessions of up to --max-tokens (128) at once
over the held-out prompts, measured as `tandem bench`'s concurrency sweep measures a level
(tandem.bench.runs.concurrent_runs, summary.concurrency_row). It prints, per run, the aggregate
tokens/s, TTFT p50 and the mean γ of its cycles: what the adaptive policy chose against what
each fixed γ achieves at the same load (its last run: benchmarks/LOG.md, "2026-11-23: the γ
policy charges CPU, not wall time"). With --out, it also writes what it prints, and each run's
whole row, to DIR/gamma_under_load.{json,md}.

--smoke: the whole path at a tiny size (2 sessions, γ 0 and auto, 12 tokens); its numbers mean
nothing.
"""

import argparse
import json
import time
from pathlib import Path

from transformers import AutoTokenizer

from tandem.bench.runs import cluster_mode, concurrent_runs
from tandem.bench.summary import concurrency_row
from tandem.cli import HELDOUT_PROMPTS, default_pair
from tandem.local import LocalCluster
from tandem.ports import free_port

MAX_TOKENS = 128
WARM_UP = {"prompts": 4, "max_tokens": 8, "in_flight": 4}  # the first passes, before anything is measured
SMOKE = {"levels": "2", "gammas": "0,auto", "max_tokens": 12}
SMOKE_WARM_UP = {"prompts": 1, "max_tokens": 4, "in_flight": 1}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="8,16,32,64", help="sessions in flight, comma-separated")
    parser.add_argument("--gammas", default="0,1,2,3,auto", help="fixed γ values and/or 'auto'")
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS, help="tokens per session, at most")
    parser.add_argument("--out", type=Path, default=None, help="also write what it prints here (JSON and Markdown)")
    parser.add_argument("--smoke", action="store_true", help="the whole path at a tiny size; numbers mean nothing")
    args = parser.parse_args()
    if args.smoke:
        args.levels, args.gammas, args.max_tokens = SMOKE["levels"], SMOKE["gammas"], SMOKE["max_tokens"]
    try:
        args.levels = [int(n) for n in args.levels.split(",")]
        args.gammas = [None if g == "auto" else int(g) for g in args.gammas.split(",")]
    except ValueError:
        parser.error("--levels takes integers and --gammas integers or 'auto', comma-separated")
    if min(args.levels) < 1 or any(g is not None and g < 0 for g in args.gammas) or args.max_tokens < 1:
        parser.error("levels and --max-tokens must be ≥ 1, γ ≥ 0")
    return args


def line(row: dict, mode: str) -> str:
    return (f"{row['in_flight']:3d} sessions, {mode}: {row['aggregate_tokens_per_s']:.1f} tokens/s, "
            f"TTFT p50 {row['ttft_ms']['p50']:.0f} ms, mean γ {row['mean_gamma'] or 0:.2f}")


def write(out: Path, config: dict, rows: list[dict], lines: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "gamma_under_load.json").write_text(json.dumps({"config": config, "rows": rows}, indent=1) + "\n")
    heading = (f"# Fixed γ against adaptive γ under load\n\nShipped pair, greedy, up to {config['max_tokens']} "
               f"tokens per session, one local cluster, {config['date']}.\n\n")
    (out / "gamma_under_load.md").write_text(heading + "".join(f"    {text}\n" for text in lines))


def main() -> None:
    args = parse_args()
    draft, target = default_pair()
    tokenizer = AutoTokenizer.from_pretrained(target)
    prompts = [tokenizer.encode(json.loads(text)["prompt"]) for text in open(HELDOUT_PROMPTS)]
    modes = [cluster_mode(g) for g in args.gammas]
    warm = SMOKE_WARM_UP if args.smoke else WARM_UP
    rows, lines = [], []
    with LocalCluster(draft, target, free_port(), threads=1, echo=False, options={"max_sessions": 128}) as cluster:
        concurrent_runs(cluster.address, "adaptive", "greedy", prompts[:warm["prompts"]], warm["max_tokens"],
                        warm["in_flight"], 0)
        for sessions in args.levels:
            batch = [prompts[i % len(prompts)] for i in range(sessions)]
            for mode in modes:
                row = concurrency_row(*concurrent_runs(cluster.address, mode, "greedy", batch, args.max_tokens,
                                                       sessions, 0), sessions)
                rows.append({"mode": mode, **row})
                lines.append(line(row, mode))
                print(lines[-1], flush=True)
    if args.out:
        config = {"levels": args.levels, "modes": modes, "max_tokens": args.max_tokens, "smoke": args.smoke,
                  "date": time.strftime("%Y-%m-%d %H:%M")}
        write(args.out, config, rows, lines)


if __name__ == "__main__":
    main()

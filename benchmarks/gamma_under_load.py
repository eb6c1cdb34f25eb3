"""Aggregate tokens/s of fixed γ against adaptive γ at several loads, on one local cluster.

    .venv/bin/python benchmarks/gamma_under_load.py --levels 8,16,32,64 --gammas 0,1,2,3,auto

Starts `tandem up`'s local cluster (shipped pair, embedded Redis, one torch thread per worker)
and, for each level and γ in turn, runs that many greedy sessions of up to 128 tokens at once
over the held-out prompts through the SDK's streaming call. It prints, per run, the aggregate
tokens/s, TTFT p50 and the mean γ of its cycles: what the adaptive policy chose against what
each fixed γ achieves at the same load (benchmarks/README.md, "Many sessions at once").
"""

import argparse
import asyncio
import json
import statistics
import time

import tandem
from tandem.cli import HELDOUT_PROMPTS, default_pair
from tandem.local import LocalCluster
from tandem.orchestrator.redis_server import free_port


async def run_level(address: str, prompts: list[str], sessions: int, gamma: int | None) -> dict:
    async with tandem.AsyncClient(address, timeout_s=600) as client:
        ttft, gammas = [], []

        async def one(i: int) -> int:
            start, tokens = time.perf_counter(), 0
            async for chunk in client.stream(prompts[i % len(prompts)], max_tokens=128, temperature=0, gamma=gamma):
                if not tokens and chunk.token_ids:
                    ttft.append(time.perf_counter() - start)
                tokens += len(chunk.token_ids)
                if chunk.stats:
                    gammas.extend(chunk.stats.gammas)
            return tokens

        start = time.perf_counter()
        tokens = sum(await asyncio.gather(*(one(i) for i in range(sessions))))
        wall = time.perf_counter() - start
    return {"sessions": sessions, "gamma": "auto" if gamma is None else gamma, "tokens_per_s": tokens / wall,
            "ttft_p50_s": statistics.median(ttft), "mean_gamma": statistics.mean(gammas) if gammas else 0.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="8,16,32,64", help="sessions in flight, comma-separated")
    parser.add_argument("--gammas", default="0,1,2,3,auto", help="fixed γ values and/or 'auto'")
    args = parser.parse_args()
    prompts = [json.loads(line)["prompt"] for line in open(HELDOUT_PROMPTS)]
    gammas = [None if g == "auto" else int(g) for g in args.gammas.split(",")]
    draft, target = default_pair()
    with LocalCluster(draft, target, free_port(), threads=1, echo=False, options={"max_sessions": 128}) as cluster:
        asyncio.run(run_level(cluster.address, prompts, 4, None))  # warm-up: the workers' first passes
        for sessions in (int(n) for n in args.levels.split(",")):
            for gamma in gammas:
                r = asyncio.run(run_level(cluster.address, prompts, sessions, gamma))
                print(f"{r['sessions']:3d} sessions, γ={r['gamma']}: {r['tokens_per_s']:.1f} tokens/s, "
                      f"TTFT p50 {r['ttft_p50_s'] * 1e3:.0f} ms, mean γ {r['mean_gamma']:.2f}", flush=True)


if __name__ == "__main__":
    main()

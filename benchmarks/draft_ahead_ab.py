"""Drafting ahead on and off, paired prompt by prompt in one run (reproduces the A/B in
benchmarks/README.md).

The cycle loop runs without Ray, as in the tests: real worker processes with the shipped pair,
an embedded Redis, and two `SpeculativeLoop`s on the same clients, one drafting ahead and one
not. For each held-out prompt, every (γ, on/off) mode runs once in a shuffled order after a
warm-up; it prints tokens/s, the per-cycle split, the share of blocks drafted ahead, and the
on/off ratio per prompt (median and IQR).

    .venv/bin/python benchmarks/draft_ahead_ab.py [gammas, default 2,3] [temperature, default 0]
"""

import asyncio
import random
import statistics as st
import sys
import time
from pathlib import Path

from tandem.bench.corpus import load_prompts
from tandem.local import spawn_worker, stop_processes
from tandem.math.params import SamplingParams
from tandem.orchestrator.clients import DraftClient, VerifierClient
from tandem.orchestrator.cycle import SpeculativeLoop
from tandem.orchestrator.policy import GammaPolicy
from tandem.orchestrator.redis_server import EmbeddedRedis
from tandem.orchestrator.session import Request, Session
from tandem.orchestrator.store import SessionStore

ROOT = Path(__file__).resolve().parent.parent
PROMPTS, MAX_TOKENS = 16, 128


async def measure(addresses: dict, redis_url: str, prompts: list[list[int]], gammas: list[int], temperature: float):
    draft, target = DraftClient(addresses["draft"]), VerifierClient(addresses["target"])
    store = SessionStore.from_url(redis_url)
    loops = {on: SpeculativeLoop(draft, target, store, (), draft_ahead=on) for on in (False, True)}
    results: dict = {}
    order, n = random.Random(0), 0
    modes = [(g, on) for g in gammas for on in (False, True)]
    for i, prompt in enumerate([prompts[0][:16], *prompts]):  # the first is a warm-up
        order.shuffle(modes)
        for gamma, on in modes:
            n += 1
            request = Request(SamplingParams(temperature=temperature, seed=i), len(prompt), MAX_TOKENS, gamma)
            s = Session(f"ab-{n}", request, list(prompt), GammaPolicy())
            await store.create(s)
            start, tokens = time.perf_counter(), 0
            async for out in loops[on].run(s):
                tokens += len(out.tokens)
            elapsed = time.perf_counter() - start
            await asyncio.gather(draft.release(s.session_id), target.release(s.session_id))
            if i:
                results.setdefault((gamma, on), []).append((tokens / elapsed, s.stats.per_cycle))
            print(f"\r{n} runs", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    await asyncio.gather(draft.close(), target.close(), store.close())
    return results


def report(results: dict, gammas: list[int]) -> None:
    for gamma in gammas:
        for on in (False, True):
            runs = results[(gamma, on)]
            cycles = [c for _, per_cycle in runs for c in per_cycle]
            mean = lambda name: st.mean(getattr(c, name) for c in cycles)  # noqa: E731
            print(f"γ={gamma} drafting ahead {'on ' if on else 'off'}: {st.median(r[0] for r in runs):6.1f} tokens/s, "
                  f"per cycle: draft {mean('draft_ms'):.2f} ms, verify {mean('verify_ms'):.2f}, "
                  f"transport {mean('transport_ms'):.2f}, orchestration {mean('orchestration_ms'):.2f}; "
                  f"blocks drafted ahead {mean('drafted_ahead'):.0%}")
        ratios = [on[0] / off[0] for off, on in zip(results[(gamma, False)], results[(gamma, True)])]
        q1, _, q3 = st.quantiles(ratios, n=4)
        print(f"γ={gamma}: on / off per prompt {st.median(ratios):.3f} (IQR {q1:.3f}–{q3:.3f})")


def main() -> None:
    from transformers import AutoTokenizer

    gammas = [int(g) for g in (sys.argv[1] if len(sys.argv) > 1 else "2,3").split(",")]
    temperature = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    models = ROOT / "models"
    tokenizer = AutoTokenizer.from_pretrained(models / "target")
    texts = load_prompts(ROOT / "benchmarks" / "prompts" / "heldout.jsonl")[:PROMPTS]
    prompts = [tokenizer.encode(text) for text in texts]
    procs = {kind: spawn_worker(kind, str(models / kind), "127.0.0.1", 1, "cpu", "float32", echo=False)
             for kind in ("draft", "target")}
    redis = EmbeddedRedis()
    try:
        addresses = {kind: address for kind, (_, address) in procs.items()}
        report(asyncio.run(measure(addresses, redis.url, prompts, gammas, temperature)), gammas)
    finally:
        stop_processes([proc for proc, _ in procs.values()])
        redis.stop()


if __name__ == "__main__":
    main()

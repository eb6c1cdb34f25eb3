"""Drafting ahead on and off, paired prompt by prompt in one run (reproduces the A/B in
benchmarks/README.md).

The cycle loop runs without Ray, as in the tests (tests/support/loops.py): real worker processes
with the shipped pair, an embedded Redis, and two `SpeculativeLoop`s over the same worker pools,
one drafting ahead and one not. For each held-out prompt, every (γ, on/off) mode runs once in a
shuffled order after a warm-up; it prints tokens/s, the per-cycle split, the share of blocks
drafted ahead, and the on/off ratio per prompt (median and IQR). With --out, it also writes what
it prints to DIR/draft_ahead_ab.{json,md}.

    .venv/bin/python benchmarks/draft_ahead_ab.py [gammas, default 2,3] [temperature, default 0]
        [--prompts 16] [--max-tokens 128] [--out DIR] [--smoke]

--smoke: the whole path at a tiny size (2 prompts, 12 tokens, γ = 2); its numbers mean nothing.
"""

import argparse
import asyncio
import json
import random
import statistics as st
import sys
import tempfile
import time
from pathlib import Path

from tandem.bench.corpus import load_prompts
from tandem.local import spawn_worker, stop_processes
from tandem.math.params import SamplingParams
from tandem.orchestrator.clients import DraftClient, VerifierClient
from tandem.orchestrator.cycle import SpeculativeLoop
from tandem.orchestrator.policy import GammaPolicy
from tandem.orchestrator.pool import WorkerPool
from tandem.orchestrator.redis_server import EmbeddedRedis
from tandem.orchestrator.session import Request, Session
from tandem.orchestrator.store import SessionStore

ROOT = Path(__file__).resolve().parent.parent
PROMPTS, MAX_TOKENS = 16, 128
SMOKE = {"prompts": 2, "max_tokens": 12, "gammas": "2"}  # two prompts: the IQR needs two ratios
OWNER = "draft-ahead-ab"  # the loops' writer id in the session records
WAIT_S = 60.0  # bound on a pool's first available worker (the workers load their models first)


async def _pools(addresses: dict[str, str]) -> tuple[WorkerPool, WorkerPool]:
    """A started pool of each kind over its one worker, once that worker is available."""
    pools = WorkerPool("draft", [addresses["draft"]], DraftClient), WorkerPool("target", [addresses["target"]],
                                                                               VerifierClient)
    await asyncio.gather(*(pool.start() for pool in pools))
    for pool in pools:
        if not await pool.wait_available(WAIT_S):
            raise RuntimeError(f"the {pool.kind} worker was not available within {WAIT_S:.0f} s")
    return pools


async def _release(pools: dict[str, WorkerPool], s: Session) -> None:
    """Free the session's caches on every worker that took its calls."""
    await asyncio.gather(*(pools[kind].workers[address].client.release(s.session_id, epoch=s.epoch)
                           for kind, address in s.used))


async def measure(addresses: dict[str, str], redis_url: str, prompts: list[list[int]], gammas: list[int],
                  temperature: float, max_tokens: int) -> dict:
    """(γ, drafting ahead) → per prompt (tokens/s, its per-cycle stats), the warm-up left out."""
    store = SessionStore.from_url(redis_url)
    drafts, targets = await _pools(addresses)
    try:
        loops = {on: SpeculativeLoop(drafts, targets, store, (), draft_ahead=on) for on in (False, True)}
        results: dict = {}
        order, n = random.Random(0), 0
        modes = [(g, on) for g in gammas for on in (False, True)]
        for i, prompt in enumerate([prompts[0][:16], *prompts]):  # the first is a warm-up
            order.shuffle(modes)
            for gamma, on in modes:
                n += 1
                request = Request(SamplingParams(temperature=temperature, seed=i), len(prompt), max_tokens, gamma)
                s = Session(f"ab-{n}", request, list(prompt), GammaPolicy(), owner=OWNER)
                await store.create(s)
                start, tokens = time.perf_counter(), 0
                async for out in loops[on].run(s):
                    tokens += len(out.tokens)
                elapsed = time.perf_counter() - start
                await _release({"draft": drafts, "target": targets}, s)
                if i:
                    results.setdefault((gamma, on), []).append((tokens / elapsed, s.stats.per_cycle))
                print(f"\r{n} runs", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
        return results
    finally:
        await asyncio.gather(drafts.close(), targets.close(), store.close())


def summarise(results: dict, gammas: list[int]) -> dict:
    """Per γ: each mode's median tokens/s and mean per-cycle split, and on/off paired by prompt."""
    summary = {}
    for gamma in gammas:
        row = {}
        for on in (False, True):
            runs = results[(gamma, on)]
            cycles = [c for _, per_cycle in runs for c in per_cycle]
            mean = lambda name: st.mean(getattr(c, name) for c in cycles)  # noqa: E731
            row["on" if on else "off"] = {
                "tokens_per_s": st.median(r[0] for r in runs), "per_prompt_tokens_per_s": [r[0] for r in runs],
                **{f"{name}_per_cycle": mean(name) for name in ("draft_ms", "verify_ms", "transport_ms",
                                                               "orchestration_ms")},
                "drafted_ahead_share": mean("drafted_ahead")}
        ratios = [on[0] / off[0] for off, on in zip(results[(gamma, False)], results[(gamma, True)])]
        q1, _, q3 = st.quantiles(ratios, n=4)
        row["on_over_off"] = {"median": st.median(ratios), "q1": q1, "q3": q3, "per_prompt": ratios}
        summary[str(gamma)] = row
    return summary


def report(summary: dict) -> list[str]:
    """The lines the run prints (and writes as its Markdown)."""
    lines = []
    for gamma, row in summary.items():
        for mode in ("off", "on"):
            m = row[mode]
            lines.append(f"γ={gamma} drafting ahead {mode:3s}: {m['tokens_per_s']:6.1f} tokens/s, "
                         f"per cycle: draft {m['draft_ms_per_cycle']:.2f} ms, verify {m['verify_ms_per_cycle']:.2f}, "
                         f"transport {m['transport_ms_per_cycle']:.2f}, "
                         f"orchestration {m['orchestration_ms_per_cycle']:.2f}; "
                         f"blocks drafted ahead {m['drafted_ahead_share']:.0%}")
        r = row["on_over_off"]
        lines.append(f"γ={gamma}: on / off per prompt {r['median']:.3f} (IQR {r['q1']:.3f}–{r['q3']:.3f})")
    return lines


def write(out: Path, config: dict, summary: dict, lines: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "draft_ahead_ab.json").write_text(json.dumps({"config": config, "gammas": summary}, indent=1) + "\n")
    heading = (f"# Drafting ahead on and off\n\nShipped pair, {config['prompts']} held-out prompts, "
               f"{config['max_tokens']} tokens, T = {config['temperature']}, {config['date']}.\n\n")
    (out / "draft_ahead_ab.md").write_text(heading + "".join(f"    {line}\n" for line in lines))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("gammas", nargs="?", default="2,3", help="fixed γ values, comma-separated")
    parser.add_argument("temperature", nargs="?", type=float, default=0.0)
    parser.add_argument("--prompts", type=int, default=PROMPTS, help="held-out prompts")
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    parser.add_argument("--out", type=Path, default=None, help="also write what it prints here (JSON and Markdown)")
    parser.add_argument("--smoke", action="store_true", help="the whole path at a tiny size; numbers mean nothing")
    args = parser.parse_args()
    if args.smoke:
        args.prompts, args.max_tokens, args.gammas = SMOKE["prompts"], SMOKE["max_tokens"], SMOKE["gammas"]
    try:
        args.gammas = [int(g) for g in args.gammas.split(",")]
    except ValueError:
        parser.error(f"gammas must be comma-separated integers, got {args.gammas!r}")
    if any(g < 1 for g in args.gammas) or args.prompts < 2 or args.max_tokens < 2:
        parser.error("γ must be ≥ 1 (drafting ahead needs a block), --prompts ≥ 2 (the IQR of the ratios) "
                     "and --max-tokens ≥ 2")
    return args


def main() -> None:
    from transformers import AutoTokenizer

    args = parse_args()
    models = ROOT / "models"
    tokenizer = AutoTokenizer.from_pretrained(models / "target")
    texts = load_prompts(ROOT / "benchmarks" / "prompts" / "heldout.jsonl")[:args.prompts]
    prompts = [tokenizer.encode(text) for text in texts]
    procs = {kind: spawn_worker(kind, str(models / kind), "127.0.0.1", 1, "cpu", "float32", echo=False)
             for kind in ("draft", "target")}
    try:
        with tempfile.TemporaryDirectory(prefix="tandem-redis-") as scratch, EmbeddedRedis(data_dir=scratch) as redis:
            addresses = {kind: address for kind, (_, address) in procs.items()}
            results = asyncio.run(measure(addresses, redis.url, prompts, args.gammas, args.temperature,
                                          args.max_tokens))
    finally:
        stop_processes([proc for proc, _ in procs.values()])
    summary = summarise(results, args.gammas)
    lines = report(summary)
    print("\n".join(lines))
    if args.out:
        config = {"prompts": len(prompts), "max_tokens": args.max_tokens, "gammas": args.gammas,
                  "temperature": args.temperature, "smoke": args.smoke, "date": time.strftime("%Y-%m-%d %H:%M")}
        write(args.out, config, summary, lines)


if __name__ == "__main__":
    main()

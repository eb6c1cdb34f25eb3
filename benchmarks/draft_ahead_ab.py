"""Drafting ahead against off, paired prompt by prompt in one run, across one-way delays to the
workers and on the workers' devices of choice (reproduces the A/Bs in benchmarks/README.md).

The cycle loop runs without Ray, as in the tests (tests/support/loops.py): real worker processes
with the shipped pair, an embedded Redis, a delay proxy (tandem.bench.delay_proxy, on loopback)
on each worker's link, and a `SpeculativeLoop` per drafting-ahead setting over the same worker
pools: off, G guesses of the bonus token, or G+R (and past a rejection at each of a block's first
R positions). Per delay, for each held-out prompt, every (γ, setting) runs once in a shuffled order
after a warm-up; it prints tokens/s, the per-cycle split, the share of blocks drafted ahead, and
each setting against off per prompt (median and IQR). With --out, it also writes what it prints
to DIR/draft_ahead_ab.{json,md}. `--device cuda` puts the target on a GPU; `--draft-device`
gives the draft worker a device of its own (a GPU host's CPU cores, say).

    .venv/bin/python benchmarks/draft_ahead_ab.py [gammas, default 2,3] [temperature, default 0]
        [--settings off,1] [--delays 0] [--device cpu] [--draft-device D] [--threads 1]
        [--prompts 16] [--max-tokens 128] [--out DIR] [--smoke]

--smoke: the whole path at a tiny size (2 prompts, 12 tokens, γ = 2, 0 and 1 ms, off and 1+2); its
numbers mean nothing.
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
from tandem.bench.delay_proxy import ProxyProcess
from tandem.bench.runs import ahead_setting
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
# Two prompts: the IQR needs two ratios.
SMOKE = {"prompts": 2, "max_tokens": 12, "gammas": "2", "delays": "0,1", "settings": "off,1+2"}
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


async def _generate(loop: SpeculativeLoop, store: SessionStore, pools: dict[str, WorkerPool], s: Session) -> float:
    """Run the session's generation to its end → its tokens/s; then free its caches."""
    await store.create(s)
    start, tokens = time.perf_counter(), 0
    async for out in loop.run(s):
        tokens += len(out.tokens)
    elapsed = time.perf_counter() - start
    await _release(pools, s)
    return tokens / elapsed


def _loop(drafts: WorkerPool, targets: WorkerPool, store: SessionStore, setting: str) -> SpeculativeLoop:
    if (parsed := ahead_setting(setting)) is None:
        return SpeculativeLoop(drafts, targets, store, (), draft_ahead=False)
    guesses, rejections = parsed
    return SpeculativeLoop(drafts, targets, store, (), ahead_guesses=guesses, ahead_rejections=rejections)


async def measure(links: ProxyProcess, redis_url: str, prompts: list[list[int]], gammas: list[int], settings: list[str],
                  delays: list[float], temperature: float, max_tokens: int) -> dict:
    """(delay, γ, setting) → per prompt (tokens/s, its per-cycle stats), the warm-up left out."""
    store = SessionStore.from_url(redis_url)
    drafts, targets = await _pools(links.links)
    try:
        loops = {setting: _loop(drafts, targets, store, setting) for setting in settings}
        results: dict = {}
        order, n = random.Random(0), 0
        modes = [(g, setting) for g in gammas for setting in settings]
        for delay in delays:
            links.set_delay(delay)
            for i, prompt in enumerate([prompts[0][:16], *prompts]):  # the first is a warm-up
                order.shuffle(modes)
                for gamma, setting in modes:
                    n += 1
                    request = Request(SamplingParams(temperature=temperature, seed=i), len(prompt), max_tokens, gamma)
                    s = Session(f"ab-{n}", request, list(prompt), GammaPolicy(), owner=OWNER)
                    tokens_per_s = await _generate(loops[setting], store, {"draft": drafts, "target": targets}, s)
                    if i:
                        results.setdefault((delay, gamma, setting), []).append((tokens_per_s, s.stats.per_cycle))
                    print(f"\r{delay:g} ms: {n} runs", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
        return results
    finally:
        await asyncio.gather(drafts.close(), targets.close(), store.close())


def _split(runs: list) -> dict:
    """A mode's median tokens/s over its prompts and its cycles' mean split."""
    cycles = [c for _, per_cycle in runs for c in per_cycle]
    mean = lambda name: st.mean(getattr(c, name) for c in cycles)  # noqa: E731
    return {"tokens_per_s": st.median(r[0] for r in runs), "per_prompt_tokens_per_s": [r[0] for r in runs],
            **{f"{name}_per_cycle": mean(name) for name in ("draft_ms", "verify_ms", "transport_ms",
                                                           "orchestration_ms")},
            "drafted_ahead_share": mean("drafted_ahead")}


def summarise(results: dict, delays: list[float], gammas: list[int], settings: list[str]) -> list[dict]:
    """Per delay and γ: each setting's split, and each drafting-ahead setting against off, paired
    by prompt (median and IQR of the ratios)."""
    rows = []
    for delay in delays:
        for gamma in gammas:
            row = {"delay_ms": delay, "gamma": gamma,
                   "settings": {s: _split(results[(delay, gamma, s)]) for s in settings}, "over_off": {}}
            for setting in (s for s in settings if s != "off" and "off" in settings):
                ratios = [on[0] / off[0] for off, on in zip(results[(delay, gamma, "off")],
                                                            results[(delay, gamma, setting)])]
                q1, _, q3 = st.quantiles(ratios, n=4)
                row["over_off"][setting] = {"median": st.median(ratios), "q1": q1, "q3": q3, "per_prompt": ratios}
            rows.append(row)
    return rows


def report(rows: list[dict]) -> list[str]:
    """The lines the run prints (and writes as its Markdown)."""
    lines = []
    for row in rows:
        at = f"{row['delay_ms']:g} ms, γ={row['gamma']}"
        for setting, m in row["settings"].items():
            lines.append(f"{at}, drafting ahead {setting:4s}: {m['tokens_per_s']:6.1f} tokens/s, per cycle: draft "
                         f"{m['draft_ms_per_cycle']:.2f} ms, verify {m['verify_ms_per_cycle']:.2f}, transport "
                         f"{m['transport_ms_per_cycle']:.2f}, orchestration {m['orchestration_ms_per_cycle']:.2f}; "
                         f"blocks drafted ahead {m['drafted_ahead_share']:.0%}")
        for setting, r in row["over_off"].items():
            lines.append(f"{at}: {setting} / off per prompt {r['median']:.3f} (IQR {r['q1']:.3f}–{r['q3']:.3f})")
    return lines


def write(out: Path, config: dict, rows: list[dict], lines: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "draft_ahead_ab.json").write_text(json.dumps({"config": config, "rows": rows}, indent=1) + "\n")
    heading = (f"# Drafting ahead against off\n\nShipped pair, workers on {config['devices']}, "
               f"{config['prompts']} held-out prompts, {config['max_tokens']} tokens, T = {config['temperature']}, "
               f"{config['date']}.\n\n")
    (out / "draft_ahead_ab.md").write_text(heading + "".join(f"    {line}\n" for line in lines))
    plot(rows, config["devices"], out / "draft_ahead_ab.png")


def plot(rows: list[dict], devices: str, path: Path) -> None:
    """Tokens/s against the delay per γ and setting; each setting over off (median, IQR)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    delays = sorted({r["delay_ms"] for r in rows})
    x = range(len(delays))  # the delays evenly spaced: 0 has no place on a log axis
    fig, (tps, ratio) = plt.subplots(1, 2, figsize=(10, 4))
    for gamma in sorted({r["gamma"] for r in rows}):
        at = {r["delay_ms"]: r for r in rows if r["gamma"] == gamma}
        for setting in at[delays[0]]["settings"]:
            tps.plot(x, [at[d]["settings"][setting]["tokens_per_s"] for d in delays], marker="o",
                     label=f"γ={gamma}, {setting}")
        for setting in at[delays[0]]["over_off"]:
            r = [at[d]["over_off"][setting] for d in delays]
            ratio.errorbar(x, [v["median"] for v in r], yerr=[[v["median"] - v["q1"] for v in r],
                                                              [v["q3"] - v["median"] for v in r]],
                           marker="o", capsize=3, label=f"γ={gamma}, {setting} / off")
    ratio.axhline(1.0, color="grey", lw=0.8)
    for ax, ylabel in ((tps, "tokens/s (median over prompts)"), (ratio, "against off, paired per prompt")):
        ax.set_xticks(list(x), [f"{d:g}" for d in delays])
        ax.set_xlabel("one-way delay to each worker (ms)")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
    tps.set_yscale("log")
    fig.suptitle(f"Drafting ahead against off, a lone session ({devices})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("gammas", nargs="?", default="2,3", help="fixed γ values, comma-separated")
    parser.add_argument("temperature", nargs="?", type=float, default=0.0)
    parser.add_argument("--settings", default="off,1",
                        help="drafting ahead: off, G (guesses of the bonus token) or G+R (and past a rejection "
                             "at a block's first R positions), comma-separated")
    parser.add_argument("--delays", default="0", help="one-way delays (ms) on the links to the workers")
    parser.add_argument("--device", default="cpu", help="the target worker's device (cpu, cuda)")
    parser.add_argument("--draft-device", default=None, help="the draft worker's device (default: --device)")
    parser.add_argument("--threads", type=int, default=1, help="each CPU worker's torch threads")
    parser.add_argument("--prompts", type=int, default=PROMPTS, help="held-out prompts")
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    parser.add_argument("--out", type=Path, default=None, help="also write what it prints here (JSON and Markdown)")
    parser.add_argument("--smoke", action="store_true", help="the whole path at a tiny size; numbers mean nothing")
    args = parser.parse_args()
    if args.smoke:
        args.prompts, args.max_tokens, args.gammas = SMOKE["prompts"], SMOKE["max_tokens"], SMOKE["gammas"]
        args.delays, args.settings = SMOKE["delays"], SMOKE["settings"]
    try:
        args.gammas = [int(g) for g in args.gammas.split(",")]
        args.delays = [float(d) for d in args.delays.split(",")]
        args.settings = args.settings.split(",")
        for setting in args.settings:
            ahead_setting(setting)
    except ValueError:
        parser.error("gammas, delays and settings are comma-separated: γs and delays numbers, settings off, G or G+R")
    if any(g < 1 for g in args.gammas) or args.prompts < 2 or args.max_tokens < 2 or min(args.delays) < 0:
        parser.error("γ must be ≥ 1 (drafting ahead needs a block), --prompts ≥ 2 (the IQR of the ratios), "
                     "--max-tokens ≥ 2 and delays ≥ 0")
    args.draft_device = args.draft_device or args.device
    return args


def main() -> None:
    from transformers import AutoTokenizer

    args = parse_args()
    models = ROOT / "models"
    tokenizer = AutoTokenizer.from_pretrained(models / "target")
    texts = load_prompts(ROOT / "benchmarks" / "prompts" / "heldout.jsonl")[:args.prompts]
    prompts = [tokenizer.encode(text) for text in texts]
    devices = {"draft": args.draft_device, "target": args.device}
    procs = {kind: spawn_worker(kind, str(models / kind), "127.0.0.1", args.threads, devices[kind], "float32",
                                echo=False) for kind in ("draft", "target")}
    links = None
    try:
        # A delay proxy on a link to each worker: the loops reach the workers through it.
        links = ProxyProcess([f"{kind}=127.0.0.1:0,{address}" for kind, (_, address) in procs.items()])
        with tempfile.TemporaryDirectory(prefix="tandem-redis-") as scratch, EmbeddedRedis(data_dir=scratch) as redis:
            results = asyncio.run(measure(links, redis.url, prompts, args.gammas, args.settings, args.delays,
                                          args.temperature, args.max_tokens))
    finally:
        stop_processes([proc for proc, _ in procs.values()] + ([links.proc] if links else []))
    rows = summarise(results, args.delays, args.gammas, args.settings)
    lines = report(rows)
    print("\n".join(lines))
    if args.out:
        config = {"prompts": len(prompts), "max_tokens": args.max_tokens, "gammas": args.gammas,
                  "settings": args.settings, "delays_ms": args.delays, "temperature": args.temperature,
                  "devices": f"draft {args.draft_device}, target {args.device}", "smoke": args.smoke,
                  "date": time.strftime("%Y-%m-%d %H:%M")}
        write(args.out, config, rows, lines)


if __name__ == "__main__":
    main()

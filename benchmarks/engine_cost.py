"""What the workers' engines cost per generated token when every step is batched over all the
sessions in flight, as a control plane that steps them together would feed them.

In one process, the shipped pair and the held-out prompts, greedy: n sessions generate up to
`--max-tokens` tokens each, cycle after cycle. Each cycle submits every unfinished session's
draft job (γ tokens) to the draft worker's Batcher and waits for them all, then every session's
verify job to the target's Batcher, then accepts (tandem.math.acceptance). The model threads'
CPU time (from /proc, each Batcher's own thread) divided by the tokens generated is each
engine's CPU per token; no gRPC, no orchestrator, nothing else counted. With `--baseline
COMMIT` a second process runs that commit's engine (benchmarks/baseline.py): the two take turns
generation by generation, and each ratio pairs generations run side by side on the machine's
drift. Writes engine_cost.{json,md,png} to --out (results/). `--smoke` runs it all at a tiny
size (1 and 2 sessions, 8 tokens, one generation each), against the checkout's HEAD unless
--baseline names another.

    .venv/bin/python benchmarks/engine_cost.py [--sessions 1,8,32,64] [--gammas 0,3] [--repeats 3] [--baseline COMMIT]
        [--out DIR] [--smoke]
"""

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import baseline
import torch
from transformers import AutoTokenizer

from tandem.math.acceptance import count_accepted, output_tokens
from tandem.math.params import SamplingParams
from tandem.services.batching import Batcher
from tandem.services.draft_worker import propose
from tandem.services.runtime import ModelRuntime
from tandem.services.target_verifier import verify

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results"
GREEDY = SamplingParams(temperature=0.0)


def thread_cpu_s(native_id: int) -> float:
    """CPU seconds of one of this process's threads, from /proc."""
    fields = Path(f"/proc/self/task/{native_id}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def warm_pool(runtime: ModelRuntime, tokens: int) -> None:
    """Grow the runtime's KV pool to hold `tokens`, as a worker under load has (growing zero-fills
    the new blocks); an engine without a pool (before batching) grows per session."""
    pool = getattr(runtime.forward_pass, "pool", None)
    if pool is not None:
        from tandem.services.kv import BlockTable

        table = BlockTable()
        pool.reserve(table, tokens)
        pool.release(table)


class Session:
    """One generation's committed tokens and what each worker's cache holds of them."""

    def __init__(self, name: str, prompt: list[int]) -> None:
        self.name, self.prompt, self.tokens = name, len(prompt), list(prompt)
        self.draft_held = self.target_held = 0

    @property
    def generated(self) -> int:
        return len(self.tokens) - self.prompt


def generate(draft: Batcher, target: Batcher, prompts: list[list[int]], gamma: int, max_tokens: int,
             eos: tuple[int, ...]) -> tuple[int, int]:
    """Every session to max_tokens or EOS, all sessions in every round → (tokens, session cycles)."""
    sessions = [Session(f"s{i}-{time.monotonic_ns()}", p) for i, p in enumerate(prompts)]
    active, cycles = list(sessions), 0
    while active:
        cycles += len(active)
        proposals = [None] * len(active)
        if gamma:
            futures = [draft.submit(propose(s.name, s.draft_held, s.tokens[s.draft_held:], gamma, GREEDY))
                       for s in active]
            proposals = [f.result() for f in futures]
        futures = [target.submit(verify(s.name, s.target_held, s.tokens[s.target_held:],
                                        p.draft_tokens if p else [], None, GREEDY)) for s, p in zip(active, proposals)]
        for s, p, f in zip(active, proposals, futures):
            v, before = f.result(), len(s.tokens)
            drafted = p.draft_tokens if p else []
            accepted = count_accepted([1.0] * len(drafted), v.target_token_probs, [0.5] * len(drafted))
            new = output_tokens(drafted, accepted, v.recovered_tokens, v.bonus_token)
            s.tokens += new[:max_tokens - s.generated]
            s.target_held = before + accepted
            s.draft_held = before + min(accepted, max(gamma - 1, 0)) if gamma else 0
        done = [s for s in active if s.generated >= max_tokens or any(t in eos for t in s.tokens[s.prompt:])]
        for s in done:
            draft.submit(lambda name=s.name: draft.runtime.release(name)).result()
            target.submit(lambda name=s.name: target.runtime.release(name)).result()
        active = [s for s in active if s not in done]
    return sum(s.generated for s in sessions), cycles


class Workers:
    """The shipped pair's draft and target engines, each behind its Batcher, with the held-out prompts."""

    def __init__(self, max_sessions: int) -> None:
        draft_dir, target_dir = ROOT / "models" / "draft", ROOT / "models" / "target"
        tokenizer = AutoTokenizer.from_pretrained(target_dir)
        self.prompts = [tokenizer.encode(json.loads(line)["prompt"])
                        for line in (ROOT / "benchmarks" / "prompts" / "heldout.jsonl").read_text().splitlines()]
        self.draft, self.target = Batcher(ModelRuntime(str(draft_dir))), Batcher(ModelRuntime(str(target_dir)))
        self.eos = self.target.runtime.info.eos_token_ids
        generate(self.draft, self.target, self.prompts[:2], 3, 8, self.eos)  # warm-up
        for batcher in (self.draft, self.target):  # grow the KV pools once, to what the largest level holds
            batcher.submit(lambda runtime=batcher.runtime: warm_pool(runtime, max_sessions * 512)).result()

    def measure(self, sessions: int, gamma: int, max_tokens: int) -> dict:
        """n sessions generating together → each model thread's CPU ms per generated token."""
        batch = [self.prompts[i % len(self.prompts)] for i in range(sessions)]
        threads = {"draft": self.draft._thread.native_id, "target": self.target._thread.native_id}
        before = {k: thread_cpu_s(t) for k, t in threads.items()}
        start = time.perf_counter()
        tokens, cycles = generate(self.draft, self.target, batch, gamma, max_tokens, self.eos)
        wall = time.perf_counter() - start
        cpu = {k: (thread_cpu_s(t) - before[k]) * 1e3 / tokens for k, t in threads.items()}
        return {"tokens": tokens, "tokens_per_cycle": tokens / cycles, "draft_cpu_ms_per_token": cpu["draft"],
                "target_cpu_ms_per_token": cpu["target"], "tokens_per_s": tokens / wall}


def measure(engines: dict[str, baseline.Engine], counts: list[int], gammas: list[int], max_tokens: int,
            repeats: int) -> list[dict]:
    rows = []
    for n in counts:
        for gamma in gammas:
            runs = {name: [] for name in engines}
            for i in range(repeats):
                for name in baseline.in_turn(engines, i):
                    runs[name].append(engines[name].ask(sessions=n, gamma=gamma, max_tokens=max_tokens))
            row = {"sessions": n, "gamma": gamma}
            for name in engines:
                row[name] = {key: statistics.median(r[key] for r in runs[name]) for key in runs[name][0]}
            if "before" in engines:
                row["paired_ratio"] = {worker: statistics.median(  # the draft's at γ = 0: none
                    a[key] / b[key] for a, b in zip(runs["batched"], runs["before"])) if runs["before"][0][key] else None
                    for worker in ("target", "draft") for key in [f"{worker}_cpu_ms_per_token"]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", default="1,8,32,64")
    parser.add_argument("--gammas", default="0,3")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3, help="generations per engine and point")
    parser.add_argument("--baseline", help="a commit (or its package directory) whose engine runs the same generations")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # a generation server for up to N sessions
    parser.add_argument("--out", type=Path,
                        help="the folder for engine_cost.{json,md,png} (default: benchmarks/results)")
    parser.add_argument("--smoke", action="store_true", help="the whole run at a tiny size, against HEAD by default")
    args = parser.parse_args()
    if args.smoke and args.out is None:  # a smoke run writes nothing over the measured results
        parser.error("--smoke writes only to a folder given with --out")
    args.out = args.out or OUT
    if args.smoke:
        args.sessions, args.max_tokens, args.repeats, args.baseline = "1,2", 8, 1, args.baseline or "HEAD"
    torch.set_num_threads(1)  # as a worker runs here
    counts, gammas = [int(n) for n in args.sessions.split(",")], [int(g) for g in args.gammas.split(",")]
    if args.serve:
        workers = Workers(args.serve)
        baseline.serve(lambda ask: workers.measure(ask["sessions"], ask["gamma"], ask["max_tokens"]))
        return
    rows, engines = baseline.side_by_side(__file__, args.baseline,
                                          lambda e: measure(e, counts, gammas, args.max_tokens, args.repeats),
                                          args=("--serve", str(max(counts))))
    baseline.save(args.out, "engine_cost", args.baseline, rows)
    write_table(rows, engines, args.out)


def write_table(rows: list[dict], engines: list[str], out: Path) -> None:
    plt = baseline.pyplot()
    shown = baseline.shown(engines)
    paired = "before" in shown
    lines = ["| sessions | γ | tokens per cycle | " + " | ".join(
        f"{e}: target CPU ms/token | {e}: draft CPU ms/token" for e in shown)
        + (" | batched ÷ before, target (paired) | draft (paired) |" if paired else " |"),
        "|---|---|---|" + "---|---|" * (len(shown) + paired)]
    for r in rows:
        cells = " | ".join(f"{r[e]['target_cpu_ms_per_token']:.2f} | {r[e]['draft_cpu_ms_per_token']:.2f}"
                           for e in shown)
        ratios = "".join(f" | {x:.2f}" if x is not None else " | –"
                         for x in r["paired_ratio"].values()) if paired else ""
        lines.append(f"| {r['sessions']} | {r['gamma']} | {r['batched']['tokens_per_cycle']:.2f} | {cells}{ratios} |")
    (out / "engine_cost.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for ax, worker in zip(axes, ("target", "draft")):
        for e in shown:
            for gamma in sorted({r["gamma"] for r in rows}):
                points = [r for r in rows if r["gamma"] == gamma]
                ax.plot([r["sessions"] for r in points], [r[e][f"{worker}_cpu_ms_per_token"] for r in points],
                        marker="o", linestyle="-" if e == "batched" else "--", label=f"{e}, γ = {gamma}")
        ax.set(title=f"{worker} worker's model thread", xlabel="sessions in flight",
               ylabel="CPU ms per generated token", xscale="log")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "engine_cost.png", dpi=120)


if __name__ == "__main__":
    main()

"""Sampled token trees by each tree rule: recursive rejection sampling without replacement (rrsw)
against the greedy multi-draft rule (greedy), on one local cluster.

    .venv/bin/python benchmarks/tree_rules.py [--limit 12] [--max-tokens 128] [--gamma 4]
        [--widths 2,2] [--temperatures 0.3,1] [--out benchmarks/results/tree_rules] [--smoke]

Starts `tandem up`'s local cluster with the draft model alone drafting (every cycle a tree: the
hybrid's lookup drafts chains), trees of --widths at γ = --gamma, and runs each held-out prompt
under each rule at each temperature, the runs of a prompt interleaved in a shuffled order, each
with its own seed shared by both rules. Per rule and temperature: tokens per target pass (mean
acceptance length), tokens/s, and the greedy rule's ratio to rrsw paired by prompt. Writes
tree_rules.json, tree_rules.md and tree_rules.png to --out (benchmarks/README.md, "The tree rule").

--smoke: the whole path at a tiny size (1 prompt, 12 tokens, γ = 2, T = 1), into --out alone;
its numbers mean nothing.
"""

import argparse
import json
import random
import statistics
import time
from pathlib import Path

from tandem.cli import HELDOUT_PROMPTS, default_pair
from tandem import Client
from tandem.local import LocalCluster
from tandem.ports import free_port

RULES = ("rrsw", "greedy")


def run(client: Client, prompt: list[int], rule: str, temperature: float, seed: int, args) -> dict:
    start = time.perf_counter()
    result = client.generate(prompt_token_ids=prompt, max_tokens=args.max_tokens, temperature=temperature, seed=seed,
                             gamma=args.gamma, draft_shape="tree", tree_rule=rule, ignore_eos=True)
    wall = time.perf_counter() - start
    cycles = [c for c in result.stats.per_cycle if c.gamma > 0]  # the drafting cycles (the first prefills)
    return {"tokens_per_s": len(result.token_ids) / wall,
            "acceptance_length": sum(c.output_tokens for c in cycles) / max(1, len(cycles))}


def summary(runs: list[dict], temperature: float) -> dict:
    row = {}
    for rule in RULES:
        mine = [r for r in runs if r["rule"] == rule and r["temperature"] == temperature]
        row[rule] = {k: statistics.median(r[k] for r in mine) for k in ("tokens_per_s", "acceptance_length")}
        row[rule]["mean_acceptance_length"] = statistics.mean(r["acceptance_length"] for r in mine)
    paired = {}
    for key in ("tokens_per_s", "acceptance_length"):
        by_prompt = {(r["prompt"], r["rule"]): r[key] for r in runs if r["temperature"] == temperature}
        ratios = [by_prompt[p, "greedy"] / by_prompt[p, "rrsw"] for p, rule in by_prompt if rule == "rrsw"]
        paired[key] = statistics.median(ratios)
    row["greedy_over_rrsw"] = paired
    return row


def report(results: dict, out: Path) -> None:
    lines = ["| T | rule | tokens/s (median) | tokens per target pass (median / mean) |", "|---|---|---|---|"]
    for t, row in results["temperatures"].items():
        for rule in RULES:
            r = row[rule]
            lines.append(f"| {t} | {rule} | {r['tokens_per_s']:.1f} | {r['acceptance_length']:.2f} / "
                         f"{r['mean_acceptance_length']:.2f} |")
        ratio = row["greedy_over_rrsw"]
        lines.append(f"| {t} | greedy ÷ rrsw, paired by prompt | {ratio['tokens_per_s']:.2f}× | "
                     f"{ratio['acceptance_length']:.2f}× |")
    (out / "tree_rules.md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    temperatures = list(results["temperatures"])
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, label in zip(axes, ("acceptance_length", "tokens_per_s"), ("tokens per target pass", "tokens/s")):
        for i, rule in enumerate(RULES):
            values = [results["temperatures"][t][rule][key] for t in temperatures]
            ax.bar([x + 0.4 * i for x in range(len(temperatures))], values, 0.4, label=rule)
        ax.set_xticks([x + 0.2 for x in range(len(temperatures))], [f"T = {t}" for t in temperatures])
        ax.set(ylabel=f"{label} (median over prompts)", title=label)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / "tree_rules.png", dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=12, help="held-out prompts")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--widths", default="2,2")
    parser.add_argument("--temperatures", default="0.3,1")
    parser.add_argument("--out", default=None, help="the folder for tree_rules.{json,md,png} "
                        "(default: benchmarks/results/tree_rules)")
    parser.add_argument("--smoke", action="store_true", help="the whole path at a tiny size; numbers mean nothing")
    args = parser.parse_args()
    if args.smoke:
        if args.out is None:
            parser.error("--smoke writes only to --out: give one")
        args.limit, args.max_tokens, args.gamma, args.temperatures = 1, 12, 2, "1"
    args.out = args.out or "benchmarks/results/tree_rules"
    draft, target = default_pair()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target)
    prompts = [tokenizer.encode(json.loads(line)["prompt"]) for line in open(HELDOUT_PROMPTS)][:args.limit]
    temperatures = [float(t) for t in args.temperatures.split(",")]
    plan = [(p, rule, t) for p in range(len(prompts)) for t in temperatures for rule in RULES]
    random.Random(0).shuffle(plan)
    widths = tuple(int(w) for w in args.widths.split(","))
    options = {"draft_shape": "tree", "tree_widths": widths}
    runs = []
    with LocalCluster(draft, target, free_port(), threads=1, echo=False, drafter="model", options=options) as cluster, \
            Client(cluster.address) as client:
        run(client, prompts[0][:16], "rrsw", 1.0, 0, argparse.Namespace(max_tokens=8, gamma=args.gamma))  # warm-up
        for i, (p, rule, t) in enumerate(plan):
            runs.append({"prompt": p, "rule": rule, "temperature": t, **run(client, prompts[p], rule, t, p, args)})
            print(f"[{i + 1}/{len(plan)}] prompt {p}, {rule}, T = {t}: {runs[-1]['tokens_per_s']:.1f} tokens/s, "
                  f"{runs[-1]['acceptance_length']:.2f} tokens per pass", flush=True)
    results = {"config": {"prompts": len(prompts), "max_tokens": args.max_tokens, "gamma": args.gamma,
                          "widths": list(widths), "drafter": "model", "smoke": args.smoke,
                          "date": time.strftime("%Y-%m-%d %H:%M")},
               "temperatures": {str(t): summary(runs, t) for t in temperatures}, "runs": runs}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tree_rules.json").write_text(json.dumps(results, indent=1))
    report(results, out)
    print((out / "tree_rules.md").read_text())


if __name__ == "__main__":
    main()

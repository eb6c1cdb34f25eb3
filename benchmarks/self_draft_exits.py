"""Self-drafting's acceptance at every exit layer of a target: does drafting with the target's
own first K layers (then its final norm and LM head, no early-exit training) pay?

For each held-out prompt the target writes its greedy continuation; at every position of it the
exit-K logits (the hidden state entering layer K, normed and projected by the target's own head)
are scored against the full target's: greedy agreement (α at T = 0), T = 1 acceptance
E[Σ min(draft_probs, target_probs)], and the analytic speedup at the best γ ≤ 8 with the cost
ratio K / L (a K-layer step against an L-layer one, the head's share ignored: an upper bound).

    .venv/bin/python benchmarks/self_draft_exits.py [--target models/target] [--limit 48] [--out DIR] [--smoke]

Writes exits.json, exits.md and exits.png to --out (benchmarks/results/self_draft/). `--smoke`
runs it all at a tiny size: 2 prompts, 8 tokens each.
"""

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from tandem.bench.corpus import load_prompts  # noqa: E402
from tandem.math.analytic import analytic_speedup, best_gamma  # noqa: E402
from tandem.suitability import greedy_continuation  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "self_draft"


@torch.inference_mode()
def exit_scores(model, prompt: list[int], continuation: list[int]) -> list[tuple[int, float, int]]:
    """Per exit layer K = 1 … L−1: (argmax agreements, Σ of Σ_v min(exit_probs, target_probs), positions)."""
    ids = torch.tensor([prompt + continuation[:-1]])
    out = model(input_ids=ids, output_hidden_states=True)
    scored = slice(len(prompt) - 1, None)
    target = out.logits[0, scored].double().softmax(-1)  # [n, V]
    scores = []
    for k in range(1, len(model.model.layers)):
        exit_logits = model.lm_head(model.model.norm(out.hidden_states[k][0, scored]))  # [n, V]
        probs = exit_logits.double().softmax(-1)
        scores.append((int((probs.argmax(-1) == target.argmax(-1)).sum()), float(torch.minimum(probs, target).sum()),
                       len(continuation)))
    return scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default=str(ROOT / "models" / "target"))
    parser.add_argument("--prompts", default=str(ROOT / "benchmarks" / "prompts" / "heldout.jsonl"))
    parser.add_argument("--limit", type=int, default=48)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path,
                        help="the folder for exits.{json,md,png} (default: benchmarks/results/self_draft)")
    parser.add_argument("--smoke", action="store_true", help="the whole run at a tiny size")
    args = parser.parse_args()
    if args.smoke and args.out is None:  # a smoke run writes nothing over the measured results
        parser.error("--smoke writes only to a folder given with --out")
    args.out = args.out or OUT
    if args.smoke:
        args.limit, args.max_new_tokens = 2, 8
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(args.target).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    layers = len(model.model.layers)
    totals = [[0, 0.0, 0] for _ in range(1, layers)]
    for i, text in enumerate(load_prompts(args.prompts)[:args.limit]):
        prompt = tokenizer(text)["input_ids"]
        continuation = greedy_continuation(model, prompt, args.max_new_tokens, (tokenizer.eos_token_id,))
        for total, score in zip(totals, exit_scores(model, prompt, continuation)):
            for j in range(3):
                total[j] += score[j]
        print(f"\r{i + 1} prompts", end="", flush=True)
    print()
    rows = []
    for k, (agree, overlap, n) in enumerate(totals, start=1):
        greedy, sampled, ratio = agree / n, overlap / n, k / layers
        rows.append({"exit_layer": k, "greedy_agreement": greedy, "t1_acceptance": sampled, "cost_ratio": ratio,
                     "best_gamma_greedy": best_gamma(greedy, ratio, 8),
                     "speedup_greedy": analytic_speedup(greedy, best_gamma(greedy, ratio, 8), ratio),
                     "speedup_t1": analytic_speedup(sampled, best_gamma(sampled, ratio, 8), ratio)})
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "exits.json").write_text(json.dumps({"target": args.target, "prompts": args.limit, "rows": rows},
                                                    indent=2))
    lines = ["| exit layer K | greedy agreement | T=1 acceptance | cost ratio K/L | analytic speedup, greedy | T=1 |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['exit_layer']} | {r['greedy_agreement']:.2f} | {r['t1_acceptance']:.2f} | {r['cost_ratio']:.2f} | "
              f"{r['speedup_greedy']:.2f}× (γ={r['best_gamma_greedy']}) | {r['speedup_t1']:.2f}× |" for r in rows]
    (args.out / "exits.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ks = [r["exit_layer"] for r in rows]
    ax.plot(ks, [r["greedy_agreement"] for r in rows], "o-", label="greedy agreement")
    ax.plot(ks, [r["t1_acceptance"] for r in rows], "s-", label="T=1 acceptance")
    ax.plot(ks, [r["speedup_greedy"] for r in rows], "^--", label="analytic speedup, greedy")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel(f"exit layer K (of {layers})")
    ax.set_title("Self-drafting without early-exit training")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out / "exits.png", dpi=120)


if __name__ == "__main__":
    main()

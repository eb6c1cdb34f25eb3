"""The workers' forward pass on CPU: one pass of n tokens after a 50-token prompt, through each
pass `ModelRuntime` can use, interleaved so that all see the same machine:

- Hugging Face stock: the module tree as loaded (what the HF baselines of `tandem bench` run);
- Hugging Face column-major: the same with `tandem.services.runtime.gemm_friendly_layout`, the
  runtime's pass for architectures the Llama pass does not cover;
- Llama pass: `tandem.services.llama.LlamaPass`, the runtime's pass for the shipped pair.

Writes forward_pass.{json,md,png} to --out (results/); reproduces the table in
benchmarks/README.md. `--smoke` runs it all at a tiny size: one repetition of 1 and 4 tokens.

    .venv/bin/python benchmarks/forward_pass.py [repetitions per point, default 40] [--out DIR] [--smoke]
"""

import argparse
import copy
import json
import statistics as st
import time
from pathlib import Path

import matplotlib
import torch
from tqdm import tqdm
from transformers import AutoModelForCausalLM

from tandem.services.llama import LlamaPass
from tandem.services.runtime import HFPass

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results"
TOKENS = (1, 2, 3, 4, 5, 8)  # a decode step, and verify blocks of γ + 1 tokens
PROMPT = list(range(10, 60))
BASELINE = "HF stock"


def forward_ms(fp, n: int) -> float:
    """One pass of n new tokens on a fresh 50-token cache."""
    cache = fp.new_cache()
    fp.forward(cache, 0, PROMPT, keep=1)
    start = time.perf_counter()
    fp.forward(cache, len(PROMPT), list(range(100, 100 + n)), keep=n)
    elapsed = (time.perf_counter() - start) * 1e3
    fp.release(cache)
    return elapsed


def measure(model_dir: Path, reps: int, tokens: tuple[int, ...] = TOKENS) -> dict:
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    passes = {BASELINE: HFPass(copy.deepcopy(model), column_major=False),
              "HF column-major": HFPass(copy.deepcopy(model), column_major=True),
              "Llama pass": LlamaPass(model, column_major=True)}
    rows = {}
    with torch.inference_mode():
        for n in tqdm(tokens, desc=model_dir.name, unit="point"):
            times = {name: [] for name in passes}
            for _ in range(reps):
                for name, fp in passes.items():
                    times[name].append(forward_ms(fp, n))
            rows[n] = {name: st.median(t) for name, t in times.items()}
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("reps", nargs="?", type=int, default=40, help="repetitions per point")
    parser.add_argument("--out", type=Path,
                        help="the folder for forward_pass.{json,md,png} (default: benchmarks/results)")
    parser.add_argument("--smoke", action="store_true", help="the whole run at a tiny size")
    args = parser.parse_args()
    if args.smoke and args.out is None:  # a smoke run writes nothing over the measured results
        parser.error("--smoke writes only to a folder given with --out")
    args.out = args.out or OUT
    reps, tokens = (1, (1, 4)) if args.smoke else (args.reps, TOKENS)
    torch.set_num_threads(1)  # as a worker runs here
    results = {name: measure(ROOT / "models" / name, reps, tokens) for name in ("target", "draft")}
    write(results, reps, args.out)


def write(results: dict, reps: int, out: Path) -> None:
    """The medians as out/forward_pass.json, a table (.md, and printed) and a chart (.png)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "forward_pass.json").write_text(json.dumps({"repetitions": reps, "median_ms": results}, indent=1))
    names = list(next(iter(results["target"].values())))
    lines = ["| model | tokens | " + " | ".join(f"{n} ms" for n in names) + " | "
             + " | ".join(f"{n} / stock" for n in names[1:]) + " |", "|---" * (2 + 2 * len(names) - 1) + "|"]
    for model, rows in results.items():
        for n, r in rows.items():
            lines.append(f"| {model} | {n} | " + " | ".join(f"{r[k]:.2f}" for k in names) + " | "
                         + " | ".join(f"{r[k] / r[BASELINE]:.2f}" for k in names[1:]) + " |")
    (out / "forward_pass.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for ax, (model, rows) in zip(axes, results.items()):
        for name in names:
            ax.plot(list(rows), [r[name] for r in rows.values()], marker="o", label=name)
        ax.set(title=f"{model}: one forward pass", xlabel="tokens in the pass", ylabel="ms (median)")
        ax.set_ylim(bottom=0)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / "forward_pass.png", dpi=120)


if __name__ == "__main__":
    main()

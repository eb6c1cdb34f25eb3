"""The workers' weight layout on CPU: one forward pass of n tokens after a 50-token prompt, the
stock row-major Linear weights against the column-major ones `ModelRuntime` uses
(`services.runtime.gemm_friendly_layout`), interleaved so that both see the same machine.

Writes results/gemm_layout.{json,md,png}; reproduces the table in benchmarks/README.md.

    .venv/bin/python benchmarks/gemm_layout.py [repetitions per point, default 40]
"""

import copy
import json
import statistics as st
import sys
import time
from pathlib import Path

import matplotlib
import torch
from tqdm import tqdm
from transformers import AutoModelForCausalLM, DynamicCache

from services.runtime import gemm_friendly_layout

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results"
TOKENS = (1, 2, 3, 4, 5, 8)  # a decode step, and verify blocks of γ + 1 tokens
PROMPT = list(range(10, 60))


def forward_ms(model, n: int) -> float:
    """One pass of n new tokens on a fresh 50-token cache."""
    cache = DynamicCache(config=model.config)
    model(torch.tensor([PROMPT]), past_key_values=cache, use_cache=True)
    new = torch.tensor([list(range(100, 100 + n))])  # [1, n]
    start = time.perf_counter()
    model(new, past_key_values=cache, use_cache=True, logits_to_keep=n)
    return (time.perf_counter() - start) * 1e3


def measure(model_dir: Path, reps: int) -> dict:
    stock = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ours = copy.deepcopy(stock)
    gemm_friendly_layout(ours)
    rows = {}
    with torch.inference_mode():
        for n in tqdm(TOKENS, desc=model_dir.name, unit="point"):
            times = {"stock": [], "column-major": []}
            for _ in range(reps):
                for name, model in (("stock", stock), ("column-major", ours)):
                    times[name].append(forward_ms(model, n))
            rows[n] = {name: st.median(t) for name, t in times.items()}
    return rows


def main() -> None:
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    torch.set_num_threads(1)  # as a worker runs here
    results = {name: measure(ROOT / "models" / name, reps) for name in ("target", "draft")}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "gemm_layout.json").write_text(json.dumps({"repetitions": reps, "median_ms": results}, indent=1))
    lines = ["| model | tokens | stock ms | column-major ms | ratio |", "|---|---|---|---|---|"]
    for name, rows in results.items():
        for n, r in rows.items():
            lines.append(f"| {name} | {n} | {r['stock']:.2f} | {r['column-major']:.2f} | "
                         f"{r['column-major'] / r['stock']:.2f} |")
    (OUT / "gemm_layout.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for ax, (name, rows) in zip(axes, results.items()):
        for layout in ("stock", "column-major"):
            ax.plot(list(rows), [r[layout] for r in rows.values()], marker="o", label=layout)
        ax.set(title=f"{name}: one forward pass", xlabel="tokens in the pass", ylabel="ms (median)")
        ax.set_ylim(bottom=0)
        ax.legend()
    fig.tight_layout()
    fig.savefig(OUT / "gemm_layout.png", dpi=120)


if __name__ == "__main__":
    main()

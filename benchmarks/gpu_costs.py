"""The pass costs that `tandem plan --cluster --costs FILE` takes, measured on a GPU through the
workers' engine: how long a worker's pass takes against the tokens in it, for random pairs
shaped as deployments' pairs.

A pass is a worker round as `gpu_engine.py` drives it (the batched forward and every session's
ask answered, greedy), each session holding a CONTEXT-token context:

- the target's: S sessions each checking a γ = 3 block (4 tokens), S = 1 … 128 (4–512 tokens;
  the 32B's up to 64, whose caches fit beside its weights), and one session's single token (1);
- the draft's: S sessions each drafting a token, S = 1 … 128 (1–128 tokens; the 32B pair's up to
  64), and one session's prefill of its context (CONTEXT tokens).

Times are medians after a warm-up, synchronized; the kernels of a one-session pass and the
target's prefill are recorded beside them. A table keyed by tokens alone is the planner's
approximation: a pass's time also depends on its sessions and their contexts. The weights are
random (they say nothing about acceptance: α is a workload's, `tandem check` measures it),
Llama-shaped, built in the device's memory in the run's dtype: a 32B model's 64 GB would not fit
the disk to be saved and loaded through `from_pretrained`.

Pairs: `32b`, Qwen2.5-32B's shape for the target (64 layers, hidden 5120, 40 heads, 8 KV heads,
a 152,064-token vocabulary) and Qwen2.5-0.5B's for the draft, the Helm guide's worked example;
`8b`, Llama-3-8B's and Llama-3.2-1B's. Per pair it writes costs-PAIR.json, a --costs file whose
draft_pass and target_pass are tables of (tokens, ms) (α, the round trip and the load stay
flags), and for the run gpu_costs.{json,md,png}. `--smoke`: a tiny pair on the CPU in float32, at
the smallest sizes, a check of the script that measures nothing.

    python benchmarks/gpu_costs.py --out DIR [--pairs 32b,8b] [--repeats 10] [--smoke]
"""

import argparse
import gc
import json
import random
from pathlib import Path

import gpu_engine
import torch

BLOCK = 4  # a γ = 3 block and its bonus position
SESSIONS = (1, 2, 4, 8, 16, 32, 64, 128)
PAIRS = {
    # 64 sessions' 512-token caches fit beside the 32B's 65.5 GB of weights on a 141 GB card with
    # room for the cache pool's growth (a copy); 128 do not.
    "32b": {"vocab": 152064, "sessions": 64,
            "target": dict(hidden_size=5120, intermediate_size=27648, num_hidden_layers=64, num_attention_heads=40,
                           num_key_value_heads=8),
            "draft": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                          num_key_value_heads=2)},
    "8b": {"vocab": 128256,
           "target": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                          num_key_value_heads=8),
           "draft": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                         num_key_value_heads=8)},
    "small": {"vocab": 4096, **gpu_engine.PAIRS["small"]},
}


def build(pair: str, kind: str) -> torch.nn.Module:
    """The random model, built on the run's device in the run's dtype (never in float32 first:
    a 32B model's float32 weights would not fit beside anything)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=PAIRS[pair]["vocab"], max_position_embeddings=4096, tie_word_embeddings=False,
                         eos_token_id=2, bos_token_id=1, pad_token_id=0, **PAIRS[pair][kind])
    default = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, gpu_engine.DTYPE))
    try:
        with torch.device(gpu_engine.DEVICE):
            return LlamaForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(default)


def passes(engine: gpu_engine.Engine, kind: str, sessions: list[str], repeats: int) -> list[dict]:
    """The kind's passes, timed → [{tokens, sessions, each, ms}], by tokens."""
    start = gpu_engine.CONTEXT
    counts = [n for n in SESSIONS if n <= len(sessions)]
    shapes = [(1, 1)] + [(n, BLOCK) for n in counts] if kind == "target" else [(n, 1) for n in counts]
    rows = []
    for n, each in shapes:
        who = sessions[:n]
        if each == 1:
            fn = lambda: engine.decode_round(who, start, [1] * n)  # noqa: E731
        else:
            blocks = [[1] * (each - 1) for _ in who]
            fn = lambda: engine.verify_round(who, start, blocks)  # noqa: E731
        rows.append({"tokens": n * each, "sessions": n, "each": each, "ms": gpu_engine.timed(fn, repeats)})
        print(json.dumps({kind: rows[-1]}), flush=True)
    return rows


def measure(pair: str, repeats: int) -> dict:
    """Both models of the pair, one at a time on the device → their passes and what they are."""
    rng = random.Random(0)
    sessions = [f"s{i}" for i in range(min(max(SESSIONS), PAIRS[pair].get("sessions", max(SESSIONS))))]
    result = {}
    for kind in ("target", "draft"):
        model = build(pair, kind)
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        # The cache's cap leaves room beside a 32B model's weights for its pool's growth (a copy).
        engine = gpu_engine.Engine(f"random {pair} {kind}", model, max_cache_bytes=24 << 30)
        engine.prefill(sessions, rng)
        context = [rng.randrange(PAIRS[pair]["vocab"]) for _ in range(gpu_engine.CONTEXT)]
        one = sessions[:1]
        result[kind] = {
            "parameters": engine.runtime.info.num_parameters,
            "weight_bytes": weight_bytes,
            "kernels_one_session": gpu_engine.kernels(
                lambda: engine.verify_round(one, gpu_engine.CONTEXT, [[1] * (BLOCK - 1)]) if kind == "target"
                else engine.decode_round(one, gpu_engine.CONTEXT, [1])),
            "prefill_ms": gpu_engine.timed(lambda: engine.runtime.extend("prefill", 0, context, keep=1), repeats),
            "passes": passes(engine, kind, sessions, repeats),
        }
        if kind == "draft":  # its passes past the sessions' tokens are prefills
            result[kind]["passes"].append({"tokens": len(context), "sessions": 1, "each": len(context),
                                           "ms": result[kind]["prefill_ms"]})
        del engine, model
        gc.collect()
        if gpu_engine.DEVICE == "cuda":
            torch.cuda.empty_cache()
    return result


def costs_file(measured: dict) -> dict:
    """A --costs file's passes: (tokens, ms) by tokens."""
    return {f"{kind}_pass": [[r["tokens"], round(r["ms"], 3)] for r in measured[kind]["passes"]]
            for kind in ("draft", "target")}


def write(results: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_costs.json").write_text(json.dumps(results, indent=1))
    lines = [f"{results['device']}, torch {results['torch']}, {results['dtype']}, random weights, "
             f"{results['context']}-token contexts; a pass's median ms", ""]
    fig, ax = plt.subplots(figsize=(6, 4))
    for pair, measured in results["pairs"].items():
        (out / f"costs-{pair}.json").write_text(json.dumps(costs_file(measured), indent=1) + "\n")
        for kind in ("target", "draft"):
            m = measured[kind]
            rows = m["passes"]
            lines += [f"**{pair} {kind}** ({m['parameters'] / 1e9:.2f} B parameters, {m['weight_bytes'] / 1e9:.1f} GB; "
                      f"one session's pass {m['kernels_one_session']} kernels; one session's "
                      f"{results['context']}-token prefill {m['prefill_ms']:.1f} ms)", "",
                      "| tokens | " + " | ".join(str(r["tokens"]) for r in rows) + " |",
                      "|---|" + "---|" * len(rows),
                      "| sessions × tokens | " + " | ".join(f"{r['sessions']}×{r['each']}" for r in rows) + " |",
                      "| ms | " + " | ".join(f"{r['ms']:.2f}" for r in rows) + " |", ""]
            ax.plot([r["tokens"] for r in rows], [r["ms"] for r in rows], marker="o", label=f"{pair} {kind}")
    ax.set(xscale="log", xlabel="tokens in the pass", ylabel="ms a pass", ylim=(0, None),
           title=f"a worker's pass, {results['device']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "gpu_costs.png", dpi=120)
    (out / "gpu_costs.md").write_text("\n".join(lines))
    print("\n".join(lines))


def main() -> None:
    global SESSIONS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--pairs", default="32b,8b")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--smoke", action="store_true", help="a tiny pair on the CPU, at the smallest sizes")
    args = parser.parse_args()
    gpu_engine.DEVICE, gpu_engine.DTYPE, gpu_engine.CONTEXT = "cuda", "bfloat16", args.context
    if args.smoke:
        gpu_engine.DEVICE, gpu_engine.DTYPE, gpu_engine.CONTEXT = "cpu", "float32", 32
        args.pairs, args.repeats, SESSIONS = "small", 1, (1, 2)
        torch.set_num_threads(1)
    pairs = args.pairs.split(",")
    unknown = sorted(set(pairs) - set(PAIRS))
    if unknown:
        raise SystemExit(f"--pairs: no pair {unknown[0]!r} (they are {', '.join(PAIRS)})")
    results = {"device": torch.cuda.get_device_name() if gpu_engine.DEVICE == "cuda" else "cpu",
               "torch": torch.__version__, "dtype": gpu_engine.DTYPE, "context": gpu_engine.CONTEXT,
               "block": BLOCK, "pairs": {}}
    for pair in pairs:  # each pair's results written as it ends: a later pair may not fit the device
        results["pairs"][pair] = measure(pair, args.repeats)
        write(results, Path(args.out))


if __name__ == "__main__":
    main()

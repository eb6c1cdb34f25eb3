"""The workers' engine on a CUDA GPU: kernel launches and time of one worker round, and greedy
decoding throughput, against the per-session engine it replaced and Hugging Face's `generate`.

The pair is random (weights say nothing about acceptance here), shaped as the field's small
pairs, in bfloat16, built with `from_config` and loaded through `from_pretrained`:
a ~1.1 B Llama target (TinyLlama's shape: 22 layers, hidden 2048, 32 heads, 4 KV heads, vocab
32000) and a ~100 M draft (8 layers, hidden 768, 12 heads, 4 KV heads, the same vocabulary).
Per number of sessions, each holding a 256-token context:

- verify round: every session checks a block of γ = 3 drafted tokens (4 tokens; greedy);
- draft round: every session drafts one token with the draft model;
- decoding: every session generates 64 tokens greedily with the target, one round per token
  (γ = 0), against Hugging Face's `generate` on the same batch of prompts.

Kernels are counted with the torch profiler (CUDA activity), times are medians after a
warm-up, synchronized. With `--baseline COMMIT` (or a directory holding that commit's `tandem`
package, benchmarks/baseline.py), the same rounds run on the engine before batching in a
subprocess: the "before" rows.
`--device cpu --small` runs it all on a tiny pair, counting aten operators instead of kernels:
a check of the script, not a measurement. `--smoke` is that check at its smallest, the one CI
runs: on the CPU in float32, the tiny pair with a 4096-token vocabulary, 1 and 2 sessions of
32-token contexts decoding 8 tokens, one repetition, the pair built under --out, against the
checkout's HEAD unless --baseline names another.

    python benchmarks/gpu_engine.py --out DIR [--baseline DIR] [--sessions 1,8,32,64] [--dtype bfloat16] [--smoke]
"""

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import baseline
import torch

CONTEXT, GAMMA, DECODE = 256, 3, 64
VOCAB = 32000
PAIRS = {
    "1b": {"target": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                          num_key_value_heads=4),
           "draft": dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=8, num_attention_heads=12,
                         num_key_value_heads=4)},
    "small": {"target": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2),
              "draft": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                            num_key_value_heads=1)},
}
DEVICE, DTYPE = "cuda", "bfloat16"


def build(out: Path, pair: str) -> dict[str, str]:
    """The random pair, saved as Hugging Face model directories (once, in DTYPE)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    dirs = {}
    for name, shape in PAIRS[pair].items():
        path = out / pair / name
        if not (path / "config.json").exists():
            torch.manual_seed(0)
            config = LlamaConfig(vocab_size=VOCAB, max_position_embeddings=4096, tie_word_embeddings=False,
                                 eos_token_id=2, bos_token_id=1, pad_token_id=0, **shape)
            LlamaForCausalLM(config).to(getattr(torch, DTYPE)).save_pretrained(path)
        dirs[name] = str(path)
    return dirs


def synchronize() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def timed(fn, repeats: int) -> float:
    """Median milliseconds of fn() over repeats, after one warm-up, synchronized."""
    fn()
    times = []
    for _ in range(repeats):
        synchronize()
        start = time.perf_counter()
        fn()
        synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def kernels(fn) -> int:
    """CUDA kernels (and copies) fn() launches; on the CPU, the aten operators it calls from Python."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    synchronize()
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEVICE == "cuda" else [])) as prof:
        fn()
        synchronize()
    if DEVICE == "cuda":
        return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    return sum(1 for e in prof.events() if e.name.startswith("aten::") and e.cpu_parent is None)


class Engine:
    """One worker runtime driven round by round on this thread, batched (asks answered for the
    whole round) or per session (the engine before batching: each session's own sampling)."""

    def __init__(self, model_dir: str, model: torch.nn.Module | None = None, max_cache_bytes: int = 40 << 30) -> None:
        from tandem.services.runtime import ModelRuntime, Step

        self.Step = Step
        built = {} if model is None else {"model": model}  # the engine before batching loads from model_dir alone
        self.runtime = ModelRuntime(model_dir, device=DEVICE, dtype=DTYPE, max_cache_bytes=max_cache_bytes, **built)
        try:
            from tandem.services import sampler
        except ImportError:
            sampler = None
        self.sampler = sampler

    def prefill(self, sessions: list[str], rng: random.Random) -> None:
        vocab = self.runtime.info.vocab_size
        for s in sessions:
            self.runtime.extend(s, 0, [rng.randrange(vocab) for _ in range(CONTEXT)], keep=1)

    def verify_round(self, sessions: list[str], start: int, blocks: list[list[int]]) -> list[int]:
        """Each session checks its block (greedy) → each one's bonus token."""
        if self.sampler:
            from tandem.math.params import SamplingParams

            greedy = SamplingParams(temperature=0.0)
            asks = [self.sampler.Check(greedy, tuple(b), None, start + 1) for b in blocks]
            steps = [self.Step(s, start, [1] + b, keep=len(b) + 1, ask=a) for s, b, a in zip(sessions, blocks, asks)]
            return [c.bonus_token for c in self.sampler.answer(asks, self.runtime.extend_batch(steps))]
        from tandem.math.sampling import verify_greedy

        steps = [self.Step(s, start, [1] + b, keep=len(b) + 1) for s, b in zip(sessions, blocks)]
        return [verify_greedy(logits, torch.tensor(b, device=logits.device)).bonus_token
                for logits, b in zip(self.runtime.extend_batch(steps), blocks)]

    def decode_round(self, sessions: list[str], start: int, tokens: list[int]) -> list[int]:
        """Each session feeds its last token and draws the next (greedy)."""
        if self.sampler:
            from tandem.math.params import SamplingParams

            greedy = SamplingParams(temperature=0.0)
            steps = [self.Step(s, start, [t], keep=1, ask=self.sampler.Draw(greedy))
                     for s, t in zip(sessions, tokens)]
            return [d.token for d in self.sampler.answer([s.ask for s in steps], self.runtime.extend_batch(steps))]
        steps = [self.Step(s, start, [t], keep=1) for s, t in zip(sessions, tokens)]
        return [int(logits[-1].argmax()) for logits in self.runtime.extend_batch(steps)]


def measure_engine(dirs: dict[str, str], counts: list[int], repeats: int) -> list[dict]:
    rng = random.Random(0)
    rows = []
    engines = {kind: Engine(path) for kind, path in dirs.items()}
    for n in counts:
        sessions = [f"n{n}s{i}" for i in range(n)]
        for engine in engines.values():
            engine.prefill(sessions, rng)
        blocks = [[rng.randrange(VOCAB) for _ in range(GAMMA)] for _ in sessions]
        target, draft = engines["target"], engines["draft"]
        row = {"sessions": n}
        row["verify_kernels"] = kernels(lambda: target.verify_round(sessions, CONTEXT, blocks))
        row["verify_ms"] = timed(lambda: target.verify_round(sessions, CONTEXT, blocks), repeats)
        row["draft_kernels"] = kernels(lambda: draft.decode_round(sessions, CONTEXT, [1] * n))
        row["draft_ms"] = timed(lambda: draft.decode_round(sessions, CONTEXT, [1] * n), repeats)

        def generate():
            tokens = [1] * n
            for i in range(DECODE):
                tokens = target.decode_round(sessions, CONTEXT + i, tokens)

        row["decode_tokens_per_s"] = n * DECODE / (timed(generate, 2) / 1e3)
        rows.append(row)
        print(json.dumps(row), flush=True)
        for engine in engines.values():
            for s in sessions:
                engine.runtime.release(s)
    return rows


def measure_hf(target_dir: str, counts: list[int]) -> list[dict]:
    """Hugging Face's generate on the target alone, greedy, a batch of n equal-length prompts."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=getattr(torch, DTYPE)).to(DEVICE).eval()
    rows = []
    for n in counts:
        prompts = torch.randint(3, VOCAB, (n, CONTEXT), device=DEVICE)

        def generate():
            model.generate(prompts, max_new_tokens=DECODE, min_new_tokens=DECODE, do_sample=False, pad_token_id=0)

        rows.append({"sessions": n, "decode_tokens_per_s": n * DECODE / (timed(generate, 2) / 1e3)})
        print(json.dumps({"hf": rows[-1]}), flush=True)
    return rows


def configure(args: argparse.Namespace) -> None:
    """The run's device, dtype and sizes (module-wide); --smoke's are the smallest, on the CPU."""
    global DEVICE, DTYPE, CONTEXT, DECODE, VOCAB
    if args.smoke:
        args.device, args.dtype, args.small, args.sessions, args.repeats = "cpu", "float32", True, "1,2", 1
        args.models, args.baseline = str(Path(args.out) / "models"), args.baseline or "HEAD"
        CONTEXT, DECODE, VOCAB = 32, 8, 4096
        torch.set_num_threads(1)  # a small shared machine: one thread per process is the fastest here
        if not args.engine_only:
            print("smoke: on the CPU in float32; CUDA kernel launches are not profiled (no GPU in this check):"
                  " the kernel columns count aten operators", flush=True)
    DEVICE, DTYPE = args.device, args.dtype


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--models", default="/tmp/tandem-gpu-pair")
    parser.add_argument("--sessions", default="1,8,32,64")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"),
                        help="the pair's and the engines' dtype")
    parser.add_argument("--small", action="store_true", help="a tiny pair: checks the script, measures nothing")
    parser.add_argument("--smoke", action="store_true", help="the tiny pair on the CPU, at the smallest sizes")
    baseline.add_arguments(parser)
    args = parser.parse_args()
    configure(args)
    counts = [int(n) for n in args.sessions.split(",")]
    pair = "small" if args.small else "1b"
    dirs = build(Path(args.models), pair)
    results = baseline.compare(args, lambda: measure_engine(dirs, counts, args.repeats))
    if results:
        results |= {"device": torch.cuda.get_device_name() if DEVICE == "cuda" else DEVICE, "pair": pair,
                    "dtype": DTYPE, "context": CONTEXT, "decode": DECODE, "torch": torch.__version__,
                    "hf_generate": measure_hf(dirs["target"], counts)}
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "gpu_engine.json").write_text(json.dumps(results, indent=1))
        write_table(results, out)


def write_table(results: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    engines = [e for e in ("before", "batched") if e in results]
    lines = [f"{results['device']}, torch {results['torch']}, {results['dtype']}, random pair {results['pair']}, "
             f"{results['context']}-token contexts", "",
             "| sessions | engine | verify kernels | verify ms | draft kernels | draft ms | decode tokens/s |",
             "|---|---|---|---|---|---|---|"]
    for i, n in enumerate(r["sessions"] for r in results["batched"]):
        for e in engines:
            r = results[e][i]
            lines.append(f"| {n} | {e} | {r['verify_kernels']} | {r['verify_ms']:.2f} | {r['draft_kernels']} | "
                         f"{r['draft_ms']:.2f} | {r['decode_tokens_per_s']:.0f} |")
        lines.append(f"| {n} | HF generate | | | | | {results['hf_generate'][i]['decode_tokens_per_s']:.0f} |")
    (out / "gpu_engine.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    counts = [r["sessions"] for r in results["batched"]]
    for e in engines:
        axes[0].plot(counts, [r["verify_kernels"] for r in results[e]], marker="o", label=e)
        axes[1].plot(counts, [r["decode_tokens_per_s"] for r in results[e]], marker="o", label=e)
    axes[1].plot(counts, [r["decode_tokens_per_s"] for r in results["hf_generate"]], marker="o", label="HF generate")
    axes[0].set(title="kernels per verify round", xlabel="sessions", ylabel="CUDA kernels")
    axes[1].set(title="greedy decoding (γ = 0)", xlabel="sessions", ylabel="tokens/s")
    for ax in axes:
        ax.legend()
        ax.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(out / "gpu_engine.png", dpi=120)


if __name__ == "__main__":
    main()

"""The control plane's ceiling: what the orchestrator, Ray Serve and Redis can drive when the
workers' passes cost almost nothing.

It builds a tiny random Llama pair with the shipped tokenizer (one layer, hidden 32: a pass is a
sliver of a millisecond), saved with `save_pretrained` and loaded by the workers through
`from_pretrained`, then runs the tandem half of benchmarks/vllm_peer.py on it: the held-out
prompts, greedy, at each level of sessions in flight, γ = 0 and adaptive γ with the draft model,
tokens/s and every process's CPU per generated token. Random weights accept almost nothing, so
adaptive γ should stay near γ = 0; what the table shows is the control plane's cost per token.

    .venv/bin/python benchmarks/control_plane.py [--levels 1,8,32,64] [--out benchmarks/results/control_plane]
        [--smoke]

--smoke: the same path at vllm_peer.py's smoke size (it gets --smoke and --out; its smoke levels
unless --levels is given), results only to --out. The pair is built in a temporary directory
either way.
"""

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "models" / "target"


def build_pair(out: Path) -> tuple[str, str]:
    """A tiny random target and draft (different seeds) with the shipped tokenizer → their directories."""
    tokenizer = AutoTokenizer.from_pretrained(SHIPPED)
    shipped = LlamaConfig.from_pretrained(SHIPPED)
    dirs = []
    for name, seed in (("target", 1), ("draft", 2)):
        config = LlamaConfig(vocab_size=shipped.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                             num_attention_heads=1, num_key_value_heads=1,
                             max_position_embeddings=shipped.max_position_embeddings,
                             bos_token_id=shipped.bos_token_id, eos_token_id=shipped.eos_token_id,
                             pad_token_id=shipped.pad_token_id, tie_word_embeddings=False)
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
        model.generation_config.eos_token_id = config.eos_token_id
        model.save_pretrained(out / name)
        tokenizer.save_pretrained(out / name)
        dirs.append(str(out / name))
    return dirs[0], dirs[1]


def peer_command(args: argparse.Namespace, target: str, draft: str) -> list[str]:
    """vllm_peer.py's command line: tandem alone, the draft model drafting, on the tiny pair."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "vllm_peer.py"), "--systems", "tandem", "--drafters", "model",
           "--target", target, "--draft", draft]
    if args.levels:
        cmd += ["--levels", args.levels]
    if args.out:
        cmd += ["--out", args.out]
    return cmd + (["--smoke"] if args.smoke else [])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default=None, help="sessions in flight, comma-separated (default: 1,8,32,64; "
                                                       "with --smoke: vllm_peer.py's smoke levels)")
    parser.add_argument("--out", default=None, help="default: benchmarks/results/control_plane (with --smoke: "
                                                    "vllm_peer.py's, a new temporary directory)")
    parser.add_argument("--smoke", action="store_true", help="the same path at vllm_peer.py's smoke size")
    args = parser.parse_args(argv)
    if not args.smoke:
        args.levels = args.levels or "1,8,32,64"
        args.out = args.out or str(ROOT / "benchmarks" / "results" / "control_plane")
    with tempfile.TemporaryDirectory(prefix="tandem-tiny-pair-") as tmp:
        target, draft = build_pair(Path(tmp))
        done = subprocess.run(peer_command(args, target, draft))
    if done.returncode:
        raise SystemExit(f"control_plane: vllm_peer.py exited {done.returncode}")


if __name__ == "__main__":
    main()

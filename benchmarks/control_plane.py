"""The control plane's ceiling: what the orchestrator, Ray Serve and Redis can drive when the
workers' passes cost almost nothing.

It builds a tiny random Llama pair with the shipped tokenizer (one layer, hidden 32: a pass is a
sliver of a millisecond), saved with `save_pretrained` and loaded by the workers through
`from_pretrained`, then runs the tandem half of benchmarks/vllm_peer.py on it: the held-out
prompts, greedy, at each level of sessions in flight, γ = 0 and adaptive γ with the draft model,
tokens/s and every process's CPU per generated token. Random weights accept almost nothing, so
adaptive γ should stay near γ = 0; what the table shows is the control plane's cost per token.

    .venv/bin/python benchmarks/control_plane.py [--levels 1,8,32,64] [--out benchmarks/results/control_plane]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="1,8,32,64", help="sessions in flight, comma-separated")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "control_plane"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tandem-tiny-pair-") as tmp:
        target, draft = build_pair(Path(tmp))
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "vllm_peer.py"), "--systems", "tandem",
                        "--drafters", "model", "--target", target, "--draft", draft, "--levels", args.levels,
                        "--out", args.out], check=True)


if __name__ == "__main__":
    main()

"""What tandem's outputs are checked against: Hugging Face's own decoding (its generate, a forward
pass without a cache, its logits warpers), and the greedy walk down a token tree."""

import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper

from tandem.math.tree import Tree, greedy_verdict, outcome


def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """The target alone: Hugging Face's greedy generate (it stops at the model's EOS)."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=max_new_tokens)
    return out[0, len(prompt):].tolist()


def hf_logits(model, tokens: list[int]) -> torch.Tensor:
    """Full forward, no cache: logits [len(tokens), V]."""
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].float()


def hf_argmax(model, tokens: list[int], n: int) -> list[int]:
    """n tokens of an argmax loop with a full recompute per step (no cache, no EOS)."""
    seq = list(tokens)
    for _ in range(n):
        seq.append(int(hf_logits(model, seq)[-1].argmax()))
    return seq[len(tokens):]


def hf_warped(logits: torch.Tensor, temperature: float, top_k: int = 0) -> torch.Tensor:
    """Hugging Face's own warpers → probabilities [..., V]."""
    scores = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k:
        scores = TopKLogitsWarper(top_k)(None, scores)
    return scores.softmax(-1)


def greedy_walk(tree: Tree, argmax: list[int]) -> tuple[list[int], int]:
    """The walk with greedy accept probabilities (0 or 1: any uniform decides the same)."""
    return outcome(tree, greedy_verdict(tree, argmax), [0.999] * len(tree))

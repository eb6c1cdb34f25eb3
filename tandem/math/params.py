"""Sampling parameters: how tokens are drawn, with the meaning of Hugging Face's warpers."""

from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are drawn: Hugging Face's warpers, applied temperature → top-k → top-p."""

    temperature: float = 1.0  # 0 means greedy
    top_k: int = 0  # 0 keeps all tokens
    top_p: float = 1.0  # 1 keeps all tokens
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

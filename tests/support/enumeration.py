"""A toy target and draft over a vocabulary small enough to enumerate every sequence, so that a
verification rule's output distribution can be checked exactly (float64) and by χ²."""

import functools
import itertools

import numpy as np

P_MIN = 1e-3  # chi-square p-value below which the distributions differ
V = 3  # a vocabulary small enough to enumerate


class Pair:
    """A toy target and draft: a fixed random distribution over V tokens after every prefix."""

    def __init__(self, seed: int, draft_temperature: float = 1.0, one_hot_draft: bool = False) -> None:
        self.seed, self.draft_temperature, self.one_hot_draft = seed, draft_temperature, one_hot_draft

    @functools.lru_cache(maxsize=None)
    def _dist(self, prefix: tuple, which: int) -> np.ndarray:
        gen = np.random.default_rng([self.seed, which, len(prefix), *prefix])
        logits = gen.normal(size=V) * 1.5
        if which == 1:  # the draft: the target's logits, perturbed and sharpened, so they disagree
            logits = (logits + gen.normal(size=V)) / self.draft_temperature
            if self.one_hot_draft:  # a draft that proposes its argmax (an n-gram match, say)
                return np.eye(V)[logits.argmax()]
        e = np.exp(logits - logits.max())
        return e / e.sum()

    def target(self, prefix: tuple) -> np.ndarray:
        return self._dist(prefix, 0)

    def draft(self, prefix: tuple) -> np.ndarray:
        return self._dist(prefix, 1)


def target_sequences(pair: Pair, length: int) -> dict:
    """Every sequence of `length` tokens → the target's probability of it."""
    out = {}
    for seq in itertools.product(range(V), repeat=length):
        out[seq] = np.prod([pair.target(seq[:i])[x] for i, x in enumerate(seq)])
    return out

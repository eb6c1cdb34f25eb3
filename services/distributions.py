"""Draft distributions between the workers: the draft worker packs its warped distributions
[γ, V] into one compact DraftDistribution per drafted position (sparse when top-k, top-p or a
one-hot draft truncates it, dense otherwise); the target verifier unpacks them for exact
residual sampling. The orchestrator forwards the messages as they are."""

import numpy as np
import torch

from tandem.wire.worker import draft_distribution


def pack(probs: torch.Tensor) -> list:
    """Warped draft distributions [γ, V] → one compact message per position."""
    out = []
    for row in probs.float().cpu().numpy():  # [V]
        support = np.flatnonzero(row)
        if 2 * support.size < row.size:  # sparse pays off: 8 bytes per kept token vs 4 per token
            out.append(draft_distribution(support.astype("<i4").tobytes(), row[support].astype("<f4").tobytes()))
        else:
            out.append(draft_distribution(b"", row.astype("<f4").tobytes()))
    return out


def unpack(msgs, vocab_size: int) -> torch.Tensor:
    """Compact messages → dense float32 [γ, V]. Raises ValueError on malformed bytes."""
    dense = np.zeros((len(msgs), vocab_size), dtype=np.float32)
    for i, msg in enumerate(msgs):
        probs = np.frombuffer(msg.probs, dtype="<f4")
        if msg.token_ids:
            ids = np.frombuffer(msg.token_ids, dtype="<i4")
            if ids.size != probs.size or ids.size == 0:
                raise ValueError(f"draft_distributions[{i}]: token_ids and probs differ in length")
            if ids.min() < 0 or ids.max() >= vocab_size:
                raise ValueError(f"draft_distributions[{i}]: token id outside the vocabulary")
            dense[i, ids] = probs
        elif probs.size == vocab_size:
            dense[i] = probs
        else:
            raise ValueError(f"draft_distributions[{i}]: dense probs need {vocab_size} floats")
    if not np.isfinite(dense).all() or (dense < 0).any():
        raise ValueError("draft_distributions: probabilities must be finite and >= 0")
    return torch.from_numpy(dense)


def token_probs(msgs, tokens: list[int]) -> list[float]:
    """Each message's probability of its token (the draft probability of a drafted token), read
    from the bytes without unpacking the rows; 0 for a token outside a sparse row's support."""
    out = []
    for msg, token in zip(msgs, tokens, strict=True):
        probs = np.frombuffer(msg.probs, dtype="<f4")
        if msg.token_ids:
            where = np.flatnonzero(np.frombuffer(msg.token_ids, dtype="<i4") == token)
            out.append(float(probs[where[0]]) if where.size else 0.0)
        else:
            out.append(float(probs[token]))
    return out

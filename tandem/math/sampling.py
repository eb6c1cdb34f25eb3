"""The workers' half of a cycle, on tensors: tensors in, tensors out; no I/O, no models;
randomness is passed in as uniforms (see tandem.math.rng).

- both workers: `warp` turns logits into the distribution a token is drawn from, with exactly
  the meaning of Hugging Face's temperature, top-k and top-p warpers, and `sample` draws it;
- the target verifier: `verify_block` returns, per drafted position, the target probability of
  the drafted token and a pre-drawn recovered token, plus a pre-drawn bonus token.

The orchestrator's half (`count_accepted`, `output_tokens`) is in tandem.math.acceptance.

Exactness: position i is accepted with probability min(1, target/draft); on the first
rejection the output is drawn from norm(max(0, target - draft)); if all γ pass, from the
target after the block. That is the modified rejection sampling of Leviathan et al. (2023) and
Chen et al. (2023), whose output follows the target's distribution. Pre-drawing the recovered
and bonus tokens changes nothing: each is used only on the event it was drawn for, with
randomness independent of the accept tests. Greedy (temperature 0) is the case where every
distribution is one-hot.
"""

from dataclasses import dataclass

import torch

from tandem.math.params import SamplingParams


def warp(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Logits [..., V] → float32 probabilities [..., V] of the warped distribution.

    Greedy gives the one-hot of the argmax (first index on ties, like torch.argmax and
    Hugging Face's greedy search).
    """
    rows = logits.reshape(-1, logits.shape[-1])  # [R, V]
    n = rows.shape[0]
    return warp_rows(rows, [params.temperature] * n, [params.top_k] * n, [params.top_p] * n).view(logits.shape)


def warp_rows(logits: torch.Tensor, temperature: list[float], top_k: list[int], top_p: list[float]) -> torch.Tensor:
    """Logits [R, V] → float32 probabilities [R, V], row r warped with its own temperature, top-k
    and top-p (each list [R]): what `warp` gives each row alone, in a constant number of
    operator calls. A row of temperature 0 is the one-hot of its argmax."""
    logits = logits.float()
    vocab = logits.shape[-1]
    sampled = [r for r, t in enumerate(temperature) if t > 0]
    probs = torch.zeros_like(logits) if len(sampled) < len(temperature) else None
    if len(sampled) < len(temperature):
        greedy = torch.tensor([r for r, t in enumerate(temperature) if t == 0], device=logits.device)
        probs[greedy, logits[greedy].argmax(-1)] = 1.0
    if not sampled:
        return probs
    everything = len(sampled) == len(temperature)
    index = None if everything else torch.tensor(sampled, device=logits.device)
    # Each divisor is the float32 value of the row's temperature, as a Python scalar would be.
    t = torch.tensor([temperature[r] for r in sampled], dtype=torch.float32, device=logits.device)  # [S]
    scores = (logits if everything else logits[index]) / t[:, None]  # [S, V]
    k_rows = [i for i, r in enumerate(sampled) if top_k[r] > 0]
    if k_rows:
        ks = [min(top_k[sampled[i]], vocab) for i in k_rows]
        sub = torch.tensor(k_rows, device=logits.device)
        kept = scores[sub]  # [K, V]
        kth = kept.topk(max(ks), -1).values.gather(-1, torch.tensor(ks, device=logits.device)[:, None] - 1)  # [K, 1]
        scores[sub] = kept.masked_fill(kept < kth, float("-inf"))
    p_rows = [i for i, r in enumerate(sampled) if top_p[r] < 1.0]
    if p_rows:
        sub = torch.tensor(p_rows, device=logits.device)
        kept = scores[sub]  # [P, V]
        sorted_scores, order = torch.sort(kept, dim=-1)  # ascending, like Hugging Face
        cumulative = sorted_scores.softmax(-1).cumsum(-1)
        # 1 − top_p in float64, then float32: what comparing with a Python scalar computes.
        drop = torch.tensor([1 - top_p[sampled[i]] for i in p_rows], dtype=torch.float32, device=logits.device)
        remove_sorted = cumulative <= drop[:, None]
        remove_sorted[..., -1] = False  # keep at least one token
        scores[sub] = kept.masked_fill(remove_sorted.scatter(-1, order, remove_sorted), float("-inf"))
    warped = scores.softmax(-1)
    if probs is None:
        return warped
    probs[index] = warped
    return probs


def sample(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw: probs [..., V] (need not be normalized), u [...] in [0, 1) → ids [...].

    A token of probability 0 is never drawn. The CDF is accumulated in float64.
    """
    cdf = probs.double().cumsum(-1)  # [..., V]
    threshold = (u.double() * cdf[..., -1]).unsqueeze(-1)  # [..., 1]
    ids = torch.searchsorted(cdf, threshold, right=True).squeeze(-1)
    return ids.clamp_(max=probs.shape[-1] - 1)


def residual(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """norm(max(0, target − draft)) over the last dim; [..., V] → [..., V].

    Where target equals draft the residual is empty, rejection has probability 0, and the
    target itself stands in (the token is never used).
    """
    diff = (target_probs - draft_probs).clamp_(min=0)  # [..., V]
    mass = diff.sum(-1, keepdim=True)  # [..., 1]
    return torch.where(mass > 0, diff / mass.clamp(min=1e-30), target_probs)


@dataclass(frozen=True)
class Verdict:
    """What the verifier answers for one block: O(γ) numbers."""

    target_token_probs: torch.Tensor  # [γ] float32: target prob of each drafted token
    recovered_tokens: torch.Tensor  # [γ] int64: pre-drawn from the residual at each position
    bonus_token: int  # pre-drawn from the target after the whole block
    # [γ] float32, block verification only (tandem.math.block): h, the joint accept probabilities
    block_accept_probs: torch.Tensor | None = None


def verify_block(
    target_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    u_recovered: torch.Tensor,
    u_bonus: float,
) -> Verdict:
    """The verifier's half of a cycle.

    target_probs [γ+1, V]: warped target distributions at each drafted position and after.
    draft_tokens [γ] int64; draft_probs [γ, V]: the draft's warped distributions.
    u_recovered [γ] float64 and u_bonus: uniforms for the recovered and bonus draws.
    """
    gamma = draft_tokens.shape[0]
    at_drafts = target_probs[:gamma]  # [γ, V]
    token_probs = at_drafts.gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)  # [γ]
    recovered = sample(residual(at_drafts, draft_probs), u_recovered)  # [γ]
    u = torch.tensor(u_bonus, dtype=torch.float64, device=target_probs.device)
    bonus = int(sample(target_probs[gamma], u))
    return Verdict(token_probs.float(), recovered, bonus)


def verify_greedy(target_logits: torch.Tensor, draft_tokens: torch.Tensor) -> Verdict:
    """verify_block for temperature 0, from logits and without vocabulary-sized work.

    target_logits [γ+1, V]; draft_tokens [γ]. Every distribution is one-hot, so a drafted
    token's target probability is 1 where it is the target's argmax and 0 elsewhere, and the
    recovered and bonus tokens are the target's argmax: exactly what verify_block returns on
    the one-hot inputs.
    """
    argmax = target_logits.argmax(-1)  # [γ+1]; first index on ties, like warp
    gamma = draft_tokens.shape[0]
    return Verdict((argmax[:gamma] == draft_tokens).float(), argmax[:gamma], int(argmax[gamma]))

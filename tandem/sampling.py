"""The accept/reject math of speculative decoding: one pure module.

Tensors in, tensors out; no I/O, no models; randomness is passed in as uniforms (see
tandem.rng). Each side of a cycle uses its part:

- both workers: `warp` turns logits into the distribution a token is drawn from, with exactly
  the meaning of Hugging Face's temperature, top-k and top-p warpers, and `sample` draws it;
- the target verifier: `verify_block` returns, per drafted position, the target probability of
  the drafted token and a pre-drawn recovered token, plus a pre-drawn bonus token;
- the orchestrator: `count_accepted` and `output_tokens` decide the cycle's output, and
  `verified_tokens` counts what α divides by.

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


def warp(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Logits [..., V] → float32 probabilities [..., V] of the warped distribution.

    Greedy gives the one-hot of the argmax (first index on ties, like torch.argmax and
    Hugging Face's greedy search).
    """
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    scores = logits / params.temperature
    if params.top_k > 0:
        kth = torch.topk(scores, min(params.top_k, scores.shape[-1]), dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1)  # ascending, like Hugging Face
        cumulative = sorted_scores.softmax(-1).cumsum(-1)
        remove_sorted = cumulative <= 1 - params.top_p
        remove_sorted[..., -1] = False  # keep at least one token
        remove = remove_sorted.scatter(-1, order, remove_sorted)
        scores = scores.masked_fill(remove, float("-inf"))
    return scores.softmax(-1)


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
    bonus = int(sample(target_probs[gamma], torch.tensor(u_bonus, dtype=torch.float64)))
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


def count_accepted(
    draft_token_probs: list[float], target_token_probs: list[float], u_accept: list[float]
) -> int:
    """The orchestrator's accept test: accept position i while u_i < target_i / draft_i."""
    for i, (d, t, u) in enumerate(zip(draft_token_probs, target_token_probs, u_accept, strict=True)):
        if not u * d < t:  # u < t/d without dividing; a draft prob is never 0 for a drawn token
            return i
    return len(draft_token_probs)


def output_tokens(
    draft_tokens: list[int], accepted: int, recovered_tokens: list[int], bonus_token: int
) -> list[int]:
    """A cycle's output: the accepted prefix, then the recovered token or the bonus."""
    last = recovered_tokens[accepted] if accepted < len(draft_tokens) else bonus_token
    return [*draft_tokens[:accepted], last]


def verified_tokens(accepted: int, gamma: int) -> int:
    """Drafted tokens the target verified in a cycle: the accepted ones, plus the rejected one
    (tokens after a rejection were never verified). α = accepted / verified."""
    return min(accepted + 1, gamma)

"""Block verification (Sun et al., "Block Verification Accelerates Speculative Decoding", ICLR
2025, Algorithm 2): the drafted block's prefix is accepted jointly instead of token by token.

For a block X_1 … X_γ drafted from `draft`, with target(· | X≤i) and draft(· | X≤i) the two
warped distributions after the first i drafted tokens:

    p_0 = 1,   p_i = min(p_{i−1} · target(X_i | X<i) / draft(X_i | X<i), 1)
    Z_i = Σ_x max(p_i · target(x | X≤i) − draft(x | X≤i), 0)
    h_i = Z_i / (Z_i + 1 − p_i) for i < γ,   h_γ = p_γ

draw independent η_1 … η_γ and accept τ = the largest i with η_i < h_i (0 if none: the scan
does not stop at the first failure). The cycle outputs X≤τ and one more token: from the target
after the block when τ = γ, else from norm(max(p_τ · target(· | X≤τ) − draft(· | X≤τ), 0)).

Why it is exact (Sun et al., Theorem 2): p_i is the largest weight with which the prefix X≤i
can be kept; the residual at τ is what the target still owes after that weight is paid, and
h_i is the chance that the target's mass past X≤i is carried by the block rather than by that
residual. Summed over the η events, each output sequence gets exactly its target probability.
Each expected count of accepted tokens is at least token-level verification's (Theorem 1).

In tandem the vectors stay where they are (invariant 3): the verifier computes the γ numbers
h_i (`block_verdict`) and pre-draws one residual token per possible τ < γ, the orchestrator
draws η and picks τ (tandem.math.acceptance.accepted_jointly). Pre-drawing is exact for the same reason as at token
level: the token drawn for τ is used only on the event τ, and its uniform (Purpose.RECOVERED)
is independent of the η (Purpose.ACCEPT). The wire stays O(γ).

Where p_i = 1 the denominator is Z_i, and h_i = 1 (also where Z_i = 0, the draft then equal to
the target after X≤i: every later p is 1 too, so τ = γ and the empty residual is never drawn
from). Greedy requests (one-hot target and draft) make every p_i 0 or 1: block verification is
then token-level verification, token for token. A one-hot draft under a sampled target is not:
there p_i is the product of the target's probabilities of X≤i.
"""

import torch

from tandem.math.sampling import Verdict, sample


def block_verdict(
    target_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    u_recovered: torch.Tensor,
    u_bonus: float,
) -> Verdict:
    """The verifier's half of block verification: the arguments of `verify_block`, the same
    answer plus `block_accept_probs` (h), with each recovered token drawn from its τ's residual.

    target_probs [γ+1, V]; draft_tokens [γ] int64; draft_probs [γ, V]; u_recovered [γ] float64.
    """
    gamma = draft_tokens.shape[0]
    target = target_probs.double()  # [γ+1, V]
    draft = draft_probs.double()  # [γ, V]
    token_target = target[:gamma].gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)  # [γ]
    token_draft = draft.gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1).clamp(min=1e-30)  # [γ]
    weights = token_prefix_weights(token_target / token_draft)  # [γ+1]: p_0 … p_γ
    owed = (weights[:gamma, None] * target[:gamma] - draft).clamp_(min=0)  # [γ, V]: row τ unnormalized residual
    mass = owed.sum(-1)  # [γ]: Z_0 … Z_{γ−1}
    h = torch.empty(gamma, dtype=torch.float64)  # h_1 … h_γ
    if gamma:
        p, z = weights[1:gamma], mass[1:]  # [γ−1] each: p_i and Z_i for i = 1 … γ−1
        h[: gamma - 1] = torch.where(p >= 1, torch.ones_like(p), z / (z + 1 - p).clamp(min=1e-300))
        h[gamma - 1] = weights[gamma]
    residuals = torch.where(mass[:, None] > 0, owed, target[:gamma])  # [γ, V]; an empty one is never used
    recovered = sample(residuals, u_recovered)  # [γ]
    bonus = int(sample(target[gamma], torch.tensor(u_bonus, dtype=torch.float64)))
    return Verdict(token_target.float(), recovered, bonus, h.float())


def token_prefix_weights(ratios: torch.Tensor) -> torch.Tensor:
    """target/draft of each drafted token [γ] → p_0 … p_γ [γ+1], p_i = min(p_{i−1} · ratio_i, 1)."""
    weights = [torch.ones((), dtype=ratios.dtype)]
    for ratio in ratios:
        weights.append(torch.clamp(weights[-1] * ratio, max=1.0))
    return torch.stack(weights)


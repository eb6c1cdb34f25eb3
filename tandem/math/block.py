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
    token_target, h, recovered = block_verdicts(target_probs[:gamma], draft_tokens, draft_probs, [gamma], u_recovered)
    u = torch.tensor(u_bonus, dtype=torch.float64, device=target_probs.device)
    bonus = int(sample(target_probs[gamma].double(), u))
    return Verdict(token_target, recovered, bonus, h)


def block_verdicts(
    target_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    gammas: list[int],
    u_recovered: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`block_verdict` for several blocks at once, their drafted positions concatenated (P = the
    γs' sum): target_probs and draft_probs [P, V] at each drafted position, draft_tokens [P],
    gammas: each block's γ, u_recovered [P] float64 → (the target probability of each drafted
    token [P] float32, h [P] float32, the recovered tokens [P]). The vectors take a constant
    number of operator calls; the O(P) scalars of the prefix weights are plain floats."""
    target = target_probs.double()  # [P, V]
    draft = draft_probs.double()  # [P, V]
    token_target = target.gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)  # [P]
    token_draft = draft.gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1).clamp(min=1e-30)  # [P]
    before, after = [], []  # per position i of a block: p_{i−1} and p_i
    for gamma, ratios in zip(gammas, _split((token_target / token_draft).tolist(), gammas)):
        weights = token_prefix_weights(ratios)
        before.extend(weights[:gamma])
        after.extend(weights[1:])
    # [P, V]: each τ's unnormalized residual
    owed = (target.new_tensor(before)[:, None] * target - draft).clamp_(min=0)
    mass = owed.sum(-1)  # [P]: Z_0 … Z_{γ−1} of each block
    h = []
    at = 0
    for gamma, z in zip(gammas, _split(mass.tolist(), gammas)):
        p = after[at:at + gamma]  # p_1 … p_γ
        h.extend(1.0 if p[i] >= 1 else z[i + 1] / max(z[i + 1] + 1 - p[i], 1e-300) for i in range(gamma - 1))
        h.extend(p[gamma - 1:])  # h_γ = p_γ
        at += gamma
    residuals = torch.where(mass[:, None] > 0, owed, target)  # [P, V]; an empty one is never used
    recovered = sample(residuals, u_recovered)  # [P]
    return token_target.float(), torch.tensor(h, dtype=torch.float32), recovered


def token_prefix_weights(ratios: list[float]) -> list[float]:
    """target/draft of each drafted token [γ] → p_0 … p_γ [γ+1], p_i = min(p_{i−1} · ratio_i, 1)."""
    weights = [1.0]
    for ratio in ratios:
        weights.append(min(weights[-1] * ratio, 1.0))
    return weights


def _split(values: list, sizes: list[int]) -> list[list]:
    """values cut into consecutive pieces of these sizes."""
    out, at = [], 0
    for size in sizes:
        out.append(values[at:at + size])
        at += size
    return out

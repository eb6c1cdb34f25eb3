"""The orchestrator's half of a cycle, in plain Python: the accept test on the O(γ) numbers
the verifier answers, the cycle's output tokens, and what α divides by.

Position i is accepted with probability min(1, target/draft); on the first rejection the
output is the verifier's pre-drawn recovered token, and if all γ pass its pre-drawn bonus
token (see `tandem.math.sampling` for why that is exact). Block verification
(`tandem.math.block`) accepts the block's prefix jointly instead (`accepted_jointly`).
"""


def count_accepted(
    draft_token_probs: list[float], target_token_probs: list[float], u_accept: list[float]
) -> int:
    """The orchestrator's accept test: accept position i while u_i < target_i / draft_i."""
    for i, (d, t, u) in enumerate(zip(draft_token_probs, target_token_probs, u_accept, strict=True)):
        if not u * d < t:  # u < t/d without dividing; a draft prob is never 0 for a drawn token
            return i
    return len(draft_token_probs)


def accepted_jointly(block_accept_probs: list[float], u_accept: list[float]) -> int:
    """Block verification's accept step: τ = the largest i with u_i < h_i, 0 if none (the scan
    does not stop at the first failure)."""
    for i in range(len(block_accept_probs), 0, -1):
        if u_accept[i - 1] < block_accept_probs[i - 1]:
            return i
    return 0


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

"""Block verification (Sun et al., ICLR 2025): the chain's prefix is accepted jointly, with at
least token-level verification's expected accepted tokens (tandem.math.block has the algorithm
and why it is exact).

The verifier answers h_1 … h_γ and pre-draws one residual token per possible τ < γ; the
orchestrator draws η (Purpose.ACCEPT) and accepts τ = the largest i with η_i < h_i. Greedy
requests get no h: block verification is token-level verification there, token for token.
"""

from tandem.math.acceptance import accepted_jointly
from tandem.math.rng import Purpose, cycle_uniforms
from tandem.rules.base import ChainRule, Outcome
from tandem.rules.token import TOKEN


class BlockRule(ChainRule):
    name = "block"

    def accept(self, proposal, verification, seed: int, position: int) -> Outcome:
        if not verification.block_accept_probs:  # greedy: the token-level test on 0/1 probabilities
            return TOKEN.accept(proposal, verification, seed, position)
        u = cycle_uniforms(seed, position, len(proposal.draft_tokens), Purpose.ACCEPT)
        return self.output(proposal, verification, accepted_jointly(verification.block_accept_probs, u))

    def verdicts(self, target_probs, draft_tokens, draft_probs, gammas, u_recovered):
        from tandem.math.block import block_verdicts  # torch: the worker half only

        token_probs, h, recovered = block_verdicts(target_probs, draft_tokens, draft_probs, gammas, u_recovered)
        return token_probs, recovered, h.tolist()


BLOCK = BlockRule()

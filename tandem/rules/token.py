"""Token-level verification (Leviathan et al. 2023; Chen et al. 2023): drafted token i is
accepted with probability min(1, target_i / draft_i) while every token before it was; at the
first rejection the output is a token drawn from the residual norm(max(0, target − draft)),
and after γ acceptances the bonus token drawn from the target after the block.

The verifier pre-draws the recovered token of every position (each used only on the event of a
rejection there: exact) and answers γ target probabilities; the orchestrator draws the accept
uniforms (Purpose.ACCEPT, independent of the verifier's Purpose.RECOVERED) and decides.
"""

from tandem.math.acceptance import count_accepted
from tandem.math.rng import Purpose, cycle_uniforms
from tandem.rules.base import ChainRule, Outcome


class TokenRule(ChainRule):
    name = "token"

    def accept(self, proposal, verification, seed: int, position: int) -> Outcome:
        u = cycle_uniforms(seed, position, len(proposal.draft_tokens), Purpose.ACCEPT)
        accepted = count_accepted(proposal.draft_token_probs, verification.target_token_probs, u)
        return self.output(proposal, verification, accepted)

    def verdicts(self, target_probs, draft_tokens, draft_probs, gammas, u_recovered):
        from tandem.math.sampling import residual, sample  # torch: the worker half only

        token_probs = target_probs.gather(-1, draft_tokens[:, None])[:, 0].float()  # [P]
        return token_probs, sample(residual(target_probs, draft_probs), u_recovered), []


TOKEN = TokenRule()

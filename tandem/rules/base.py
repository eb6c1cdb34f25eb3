"""What every verification rule is: a name, an orchestrator half, and for chains a worker half
with one signature (tandem.rules)."""

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, NamedTuple

from tandem.math.acceptance import output_tokens

if TYPE_CHECKING:  # the worker halves' types; the orchestrator never loads torch
    import torch

    from tandem.wire.worker import Proposal, Verification


class Outcome(NamedTuple):
    """A verified block's outcome, as the orchestrator decides it."""

    accepted: int  # drafted tokens accepted (a tree: its accepted path's length)
    tokens: list[int]  # the cycle's output: the accepted tokens, then the recovered or the bonus token
    kept: int  # how many accepted tokens the verifier's cache holds past the committed ones


class Rule(ABC):
    name: str

    @abstractmethod
    def accept(self, proposal: "Proposal", verification: "Verification", seed: int, position: int) -> Outcome:
        """The orchestrator half: accept from the verifier's answer to a drafted block whose first
        token sits at absolute `position`, with uniforms keyed by (seed, position)."""


class ChainRule(Rule):
    """A rule for a chain of γ drafted tokens. Greedy requests make every chain rule the same test
    (the target's argmax decides, tandem.math.sampling.verify_greedy): the verifier answers those
    without a rule's worker half, and `accept` reads them as token-level answers."""

    @abstractmethod
    def verdicts(self, target_probs: "torch.Tensor", draft_tokens: "torch.Tensor", draft_probs: "torch.Tensor",
                 gammas: list[int], u_recovered: "torch.Tensor",
                 ) -> tuple["torch.Tensor", "torch.Tensor", list[float]]:
        """The worker half, for the drafted positions of several sampled blocks at once (P = the
        γs' sum, block after block): target_probs and draft_probs [P, V], the warped distributions
        before each drafted token; draft_tokens [P]; gammas: each block's γ; u_recovered [P]
        float64 → (the target's probability of each drafted token [P], the recovered token
        pre-drawn for a rejection at each position [P], the rule's accept probabilities per
        position, or [] when the rule needs none beyond the token probabilities)."""

    @staticmethod
    def output(proposal: "Proposal", verification: "Verification", accepted: int) -> Outcome:
        """The accepted prefix, then the recovered token at the rejection or the bonus."""
        tokens = output_tokens(proposal.draft_tokens, accepted, verification.recovered_tokens,
                               verification.bonus_token)
        return Outcome(accepted, tokens, accepted)

"""Verification rules, one module each: how the target checks a drafted block and how the
orchestrator accepts from what the target answers.

A rule owns both halves of its mode:
- the worker half (`verdicts`, on tensors, in the target verifier's sampler): from the target's
  and the draft's distributions, the O(γ) numbers the wire carries and the pre-drawn tokens;
- the orchestrator half (`accept`, plain Python, where acceptance is decided): from those
  numbers and the orchestrator's own counter-based uniforms, the cycle's `Outcome`.

- `token`: token by token (Leviathan et al. 2023), a chain;
- `block`: the chain's prefix accepted jointly (Sun et al., ICLR 2025);
- `tree`: a token tree, recursive rejection sampling without replacement (Jeon et al. 2024).

A request's `verification` names a chain's rule; a token tree is always verified by `tree`.
Adding a rule is a module here, its name on the wire (tandem.v1.Verification) and in
`CHAIN_RULES`. The worker halves import torch when they run, so the orchestrator, which runs
only the other half, never loads it.
"""

from tandem.rules.base import ChainRule, Outcome, Rule
from tandem.rules.block import BLOCK
from tandem.rules.token import TOKEN
from tandem.rules.tree import TREE

CHAIN_RULES: dict[str, ChainRule] = {rule.name: rule for rule in (TOKEN, BLOCK)}  # a request's `verification`


def of(verification: str, tree: bool = False) -> Rule:
    """The rule a block is verified by: a token tree's, else the chain rule `verification` names."""
    return TREE if tree else CHAIN_RULES[verification]


__all__ = ["BLOCK", "CHAIN_RULES", "TOKEN", "TREE", "ChainRule", "Outcome", "Rule", "of"]

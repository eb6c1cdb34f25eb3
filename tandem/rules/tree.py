"""Token-tree verification (tandem.math.tree): the target scores every node in one pass, and the
walk from the root descends to the first child that passes its test, while there is one.

Greedy, a node passes when it holds its parent's argmax; sampled, by the session's tree rule:
recursive rejection sampling without replacement (tandem.math.tree_sampling), or the greedy
multi-draft rule (tandem.math.tree_greedy), each with its algorithm and why it is exact. The
walk is the same for both: they differ in how the draft draws children and in the verdict.
The verifier answers per node its accept probability and per row its pre-drawn token
(Purpose.TREE_RECOVERED); the orchestrator walks with its own per-node uniforms
(Purpose.TREE_ACCEPT). The verifier walks with the same uniforms too (`path`), to keep the
path's keys and values in its cache: what the orchestrator's next call finds there.
"""

from tandem.math import tree
from tandem.math.rng import Purpose, cycle_uniforms
from tandem.rules.base import Outcome, Rule


class TreeRule(Rule):
    name = "tree"

    @staticmethod
    def uniforms(draft: tree.Tree, seed: int, position: int) -> list[float]:
        """The walk's per-node uniforms: both halves walk with these."""
        return cycle_uniforms(seed, position, len(draft), Purpose.TREE_ACCEPT)

    def path(self, draft: tree.Tree, accept_probs: list[float], seed: int, position: int) -> list[int]:
        """The nodes the walk accepts (the verifier's half: the path it keeps in its cache)."""
        return tree.walk(draft, accept_probs, self.uniforms(draft, seed, position))

    def accept(self, proposal, verification, seed: int, position: int) -> Outcome:
        """A tree's outcome; the verifier's cache holds the path only when it kept the same one."""
        draft = tree.Tree(tuple(proposal.draft_tokens), tuple(proposal.parents))
        verdict = tree.Verdict(verification.tree_accept_probs, verification.tree_recovered_tokens)
        path, token = tree.outcome(draft, verdict, self.uniforms(draft, seed, position))
        kept = len(path) if verification.kept_path == path else 0
        return Outcome(len(path), [draft.tokens[i] for i in path] + [token], kept)

    @staticmethod
    def verdicts(trees: list[tree.Tree], target_probs, draft_probs, u_recovered: list[list[float]],
                 rule: str = "rrsw") -> list[tree.Verdict]:
        """The worker half for several sampled trees at once: target_probs [N, V], every tree's
        n + 1 rows, tree after tree; draft_probs [E, V] at every expanded node (None: no tree has
        one); u_recovered, per tree, one uniform per row; rule: how the children were drawn,
        "rrsw" (tandem.math.tree_sampling) or "greedy" (tandem.math.tree_greedy). Accept
        probabilities come rounded to float32, as the wire carries them: the orchestrator walks
        with those values."""
        import torch  # the worker half only

        from tandem.math import tree_greedy, tree_sampling

        module = tree_greedy if rule == "greedy" else tree_sampling
        verdicts = module.verdicts(trees, target_probs, draft_probs, u_recovered)
        rounded = torch.tensor([p for v in verdicts for p in v.accept_probs], dtype=torch.float32).tolist()
        out, at = [], 0
        for v in verdicts:
            out.append(tree.Verdict(rounded[at:at + len(v.accept_probs)], v.recovered))
            at += len(v.accept_probs)
        return out


TREE = TreeRule()

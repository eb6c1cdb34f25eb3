"""Recursive rejection sampling without replacement over a token tree (tandem.math.tree).

Sampled: recursive rejection sampling without replacement (RRSw; Jeon et al. 2024, "Recursive
Speculative Decoding"), node by node. The draft draws a node's k children from its
distribution q there without replacement (`draw_without_replacement`). With p the target's
distribution at the node:

    p_1 = p, q_1 = q
    child i = 1 … k:  accept x_i with probability min(1, p_i(x_i) / q_i(x_i)), then descend to it;
                      else p_{i+1} = norm(max(p_i − q_i, 0)), q_{i+1} = q_i without x_i, renormalized
    none accepted:    the output is drawn from p_{k+1}

Proof sketch (`accept_child` is exact): x_i is drawn from q_i given the children before it,
whatever was decided about them. So each round is one step of speculative sampling (Leviathan
et al. 2023): a token drawn from q_i, kept with probability min(1, p_i/q_i), else replaced by a
draw from norm(max(p_i − q_i, 0)), is distributed as p_i. Round i+1 plays the part of that
replacement draw: by induction from the last round (a plain draw from p_{k+1}) it yields
p_{i+1}, so round i yields p_i and the node's output follows p_1 = p. A rejected x_i has
p_i(x_i) < q_i(x_i), so p_{i+1}(x_i) = 0 and dropping x_i from q_{i+1} loses nothing. Across
depths: a node's output follows the target given the path to it, and descending into the
accepted child continues with the target's distribution after that child, so the path and
the token after it follow the target's joint distribution (the chain's argument, per node).
Without the residual step (p_{i+1} = p_i) a rejected child is drawn again in later rounds too
often: `verdict(..., residual=False)` is the negative control the tests show to be wrong.

Randomness is passed in as uniforms (tandem.math.rng): one accept test per child and one
residual draw per node, each used only on its own event.
"""

import torch

from tandem.math import sampling
from tandem.math.tree import Tree, Verdict, expanded


def draw_without_replacement(q: torch.Tensor, u: torch.Tensor) -> list[int]:
    """k distinct tokens from q [V], each from q without the ones before it (u [k] float64):
    what RRSw assumes of a node's children. Fewer when q has fewer than k tokens."""
    q = q.double().clone()
    tokens = []
    for ui in u:
        if q.sum() <= 0:
            break
        token = int(sampling.sample(q, ui))
        tokens.append(token)
        q[token] = 0
    return tokens


def verdict(tree: Tree, target: torch.Tensor, draft: torch.Tensor, u_residual: list[float],
            residual: bool = True) -> Verdict:
    """RRSw's numbers for every node (the module's docstring). target [n+1, V]: the target's
    distribution per row; draft [e, V]: the draft's at each expanded node (`expanded` order);
    u_residual [n+1] float64, one per row. residual=False skips the residual step: wrong, kept
    as the tests' negative control."""
    accept_probs = [0.0] * len(tree)
    recovered = []
    rows = {node: i for i, node in enumerate(expanded(tree.parents))}
    for node in range(-1, len(tree)):
        kids = tree.children[node]
        q = draft[rows[node]] if kids else None
        ratios, token = node_verdict(target[node + 1], q, [tree.tokens[c] for c in kids], u_residual[node + 1],
                                     residual)
        for child, ratio in zip(kids, ratios):
            accept_probs[child] = ratio
        recovered.append(token)
    return Verdict(accept_probs, recovered)


def node_verdict(p: torch.Tensor, q: torch.Tensor | None, children: list[int], u_residual: float,
                 residual: bool = True) -> tuple[list[float], int]:
    """RRSw at one node. p, q [V]: the target's and the draft's distributions there (q: None for
    a leaf); children: the tokens drawn from q without replacement → (each child's accept
    probability given its earlier siblings' rejection, the token drawn from what is left)."""
    p = p.double().clone()  # [V]
    ratios = []
    if children:
        q = q.double().clone()  # [V]
    for token in children:
        q_token = float(q[token])
        ratios.append(min(1.0, float(p[token]) / q_token) if q_token > 0 else 0.0)
        if residual:
            p = sampling.residual(p, q)  # the target itself where it is q: that rejection had probability 0
        q[token] = 0
        q = q / q.sum().clamp(min=1e-300)
    return ratios, int(sampling.sample(p, torch.tensor(u_residual, dtype=torch.float64)))

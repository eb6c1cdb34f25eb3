"""Token trees (SpecInfer, Miao et al. 2024): the draft proposes a tree of tokens instead of one
chain, the target scores every node in one pass under a tree attention mask, and the cycle
keeps the longest path the target accepts.

A tree of n nodes: node i holds token `tokens[i]` and hangs under `parents[i]` (−1: under the
root, the last committed token). Parents come before their children; a node's children are
distinct tokens, in the order the draft drew them. Each node sees its ancestors and itself
(`ancestor_mask`) at position root + depth (`depths`).

Greedy: from the root, descend to the child that holds the target's argmax while there is
one → the path and the target's argmax after it. The output is the target's greedy
continuation, as with a chain.

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
often: `accept_child(..., residual=False)` is the negative control the tests show to be wrong.

Randomness is passed in as uniforms (tandem.math.rng): one accept test per child and one
residual draw per node, each used only on its own event.
"""

from dataclasses import dataclass
from functools import cached_property

import torch

from tandem.math import sampling


@dataclass(frozen=True)
class Tree:
    tokens: tuple[int, ...]
    parents: tuple[int, ...]  # −1: a child of the root

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents):
            raise ValueError(f"{len(self.tokens)} tokens but {len(self.parents)} parents")
        for i, parent in enumerate(self.parents):
            if not -1 <= parent < i:
                raise ValueError(f"node {i}'s parent must be -1 or an earlier node, got {parent}")
        for node, kids in self.children.items():
            if len({self.tokens[k] for k in kids}) != len(kids):
                raise ValueError(f"node {node}'s children repeat a token")

    @classmethod
    def chain(cls, tokens: list[int]) -> "Tree":
        return cls(tuple(tokens), tuple(range(-1, len(tokens) - 1)))

    def __len__(self) -> int:
        return len(self.tokens)

    @cached_property
    def children(self) -> dict[int, list[int]]:
        """node (−1: the root) → its children, in the order they were drawn."""
        kids: dict[int, list[int]] = {-1: []}
        for i, parent in enumerate(self.parents):
            kids.setdefault(parent, []).append(i)
            kids.setdefault(i, [])
        return kids

    @cached_property
    def depths(self) -> list[int]:
        return depths(self.parents)

    def ancestor_mask(self) -> torch.Tensor:
        return ancestor_mask(self.parents)

    def path(self, node: int) -> list[int]:
        """The nodes from the root's child down to `node` (−1: none)."""
        nodes = []
        while node >= 0:
            nodes.append(node)
            node = self.parents[node]
        return nodes[::-1]


def depths(parents: tuple[int, ...]) -> list[int]:
    """Each node's depth: 1 for the root's children."""
    depth: list[int] = []
    for parent in parents:
        depth.append(1 if parent < 0 else depth[parent] + 1)
    return depth


def ancestor_mask(parents: tuple[int, ...]) -> torch.Tensor:
    """[n, n] bool: node i may attend to node j (j is i or one of its ancestors)."""
    mask = torch.eye(len(parents), dtype=torch.bool)
    for i, parent in enumerate(parents):
        if parent >= 0:
            mask[i] |= mask[parent]
    return mask


def greedy_walk(tree: Tree, argmax: list[int]) -> tuple[list[int], int]:
    """The target's argmax at the root and after each node, argmax [n+1] (index 0: the root,
    1+i: after node i) → (the accepted path's nodes, the token after it)."""
    node, path = -1, []
    while True:
        token = argmax[node + 1]
        child = next((c for c in tree.children[node] if tree.tokens[c] == token), None)
        if child is None:
            return path, token
        node = child
        path.append(child)


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


def accept_child(p: torch.Tensor, q: torch.Tensor, children: list[int], u_accept: torch.Tensor,
                 u_residual: torch.Tensor, residual: bool = True) -> tuple[int | None, int]:
    """RRSw at one node (the module's docstring). p, q [V]: the target's and the draft's
    distributions there; children: the tokens drawn from q without replacement; u_accept [k]
    and u_residual [] float64 → (the index of the accepted child, or None, and the output
    token). residual=False skips the residual step: wrong, kept as the tests' negative control."""
    p, q = p.double().clone(), q.double().clone()  # [V]
    for i, token in enumerate(children):
        q_token = q[token]
        if q_token > 0 and u_accept[i] < min(1.0, float(p[token] / q_token)):
            return i, token
        if residual:
            p = sampling.residual(p, q)  # the target itself where it is q: that rejection had probability 0
        q[token] = 0
        q = q / q.sum().clamp(min=1e-300)
    return None, int(sampling.sample(p, u_residual))


def sampled_walk(tree: Tree, target: torch.Tensor, draft: torch.Tensor, u_accept: torch.Tensor,
                 u_residual: torch.Tensor, residual: bool = True) -> tuple[list[int], int]:
    """RRSw down the tree. target, draft [n+1, V]: the distributions at the root (row 0) and
    after each node (row 1+i); u_accept [n] (node i's accept test as a child), u_residual [n+1]
    (a row's residual draw) float64 → (the accepted path's nodes, the token after it)."""
    node, path = -1, []
    while True:
        kids = tree.children[node]
        chosen, token = accept_child(target[node + 1], draft[node + 1], [tree.tokens[c] for c in kids],
                                     u_accept[kids], u_residual[node + 1], residual)
        if chosen is None:
            return path, token
        node = kids[chosen]
        path.append(node)

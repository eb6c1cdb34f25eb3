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

Sampled: recursive rejection sampling without replacement, node by node
(tandem.math.tree_sampling, which uses torch) answers each node's accept probability and each
row's recovered token (`Verdict`); the walk down the tree with one uniform per node is here,
pure, where the orchestrator decides acceptance.
"""

from dataclasses import dataclass
from functools import cached_property


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


def ancestor_mask(parents: tuple[int, ...]) -> list[list[bool]]:
    """[n][n]: node i may attend to node j (j is i or one of its ancestors)."""
    mask = [[i == j for j in range(len(parents))] for i in range(len(parents))]
    for i, parent in enumerate(parents):
        if parent >= 0:
            mask[i] = [a or b for a, b in zip(mask[i], mask[parent])]
    return mask


def expanded(parents: tuple[int, ...]) -> list[int]:
    """The nodes that have children, the root (−1) first, in order: one draft distribution each."""
    return sorted(set(parents))


@dataclass(frozen=True)
class Verdict:
    """What the target says of a tree, O(nodes): the walk (`walk`) needs nothing else.

    accept_probs [n]: node i's probability of acceptance when the walk is at its parent and has
    rejected its earlier siblings (0 or 1 when greedy). recovered [n+1]: per row (0: the root,
    1+i: node i), the token the cycle ends with when the walk stops there, every child rejected
    (a leaf's: drawn from the target after it, the bonus)."""

    accept_probs: list[float]
    recovered: list[int]


def greedy_verdict(tree: Tree, argmax: list[int]) -> Verdict:
    """argmax [n+1]: the target's argmax at each row → a node is accepted iff it holds its
    parent's argmax; a walk ends with its row's argmax."""
    return Verdict([1.0 if t == argmax[p + 1] else 0.0 for t, p in zip(tree.tokens, tree.parents)], list(argmax))


def walk(tree: Tree, accept_probs: list[float], u_accept: list[float]) -> list[int]:
    """From the root, descend to the first child whose test u < its accept probability passes,
    while there is one → the accepted path's nodes. u_accept [n]: one per node."""
    node, path = -1, []
    while True:
        node = next((c for c in tree.children[node] if u_accept[c] < accept_probs[c]), None)
        if node is None:
            return path
        path.append(node)


def outcome(tree: Tree, v: Verdict, u_accept: list[float]) -> tuple[list[int], int]:
    """→ (the accepted path's nodes, the token after it)."""
    path = walk(tree, v.accept_probs, u_accept)
    return path, v.recovered[path[-1] + 1 if path else 0]


def within(parents: list[int] | tuple[int, ...], depth: int) -> int:
    """How many first nodes lie at most `depth` deep: nodes drafted depth by depth, the tree cut
    to its first depths (what a shallower draft of the same tree would have drafted)."""
    return sum(1 for d in depths(tuple(parents)) if d <= depth)


def widths_at(widths: tuple[int, ...], depth: int) -> tuple[int, ...]:
    """A tree's widths `depth` deep: the given ones, then 1 (a chain under every node)."""
    return (tuple(widths) + (1,) * depth)[:depth]


def size(widths: tuple[int, ...]) -> int:
    """The nodes of a tree whose every node at depth d has widths[d] children."""
    total, level = 0, 1
    for width in widths:
        level *= width
        total += level
    return total

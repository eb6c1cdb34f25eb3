"""Token trees as pure math (tandem.math.tree): the tree's structure and mask, the greedy walk,
and recursive rejection sampling without replacement, exact against float64 enumeration and by
χ² over many draws, with a negative control (no residual step) that must fail both."""

import itertools

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from tandem.math.tree import Tree, ancestor_mask, depths, expanded, outcome, size, walk, widths_at, within
from tandem.math.tree_sampling import draw_without_replacement, node_verdict, verdict

from support.references import greedy_walk

P = torch.tensor([0.05, 0.40, 0.25, 0.20, 0.10], dtype=torch.float64)  # the target at a node
Q = torch.tensor([0.45, 0.05, 0.30, 0.05, 0.15], dtype=torch.float64)  # the draft there: far from it


def test_structure_mask_and_depths():
    #        root
    #      0      1
    #    2   3    4
    #    5
    tree = Tree((10, 11, 12, 13, 14, 15), (-1, -1, 0, 0, 1, 2))
    assert tree.children[-1] == [0, 1] and tree.children[0] == [2, 3] and tree.children[5] == []
    assert depths(tree.parents) == [1, 1, 2, 2, 2, 3]
    assert tree.path(5) == [0, 2, 5] and tree.path(-1) == []
    mask = torch.tensor(ancestor_mask(tree.parents))
    assert mask[5].nonzero().flatten().tolist() == [0, 2, 5]
    assert mask[4].nonzero().flatten().tolist() == [1, 4]
    assert torch.tensor(ancestor_mask((-1, 0, 1))).equal(torch.ones(3, 3, dtype=torch.bool).tril())  # a chain
    assert expanded(tree.parents) == [-1, 0, 1, 2]  # the draft distributions' rows
    assert widths_at((3, 2), 4) == (3, 2, 1, 1) and widths_at((3, 2), 1) == (3,)
    assert size((3, 2, 1, 1)) == 3 + 6 + 6 + 6
    assert [within(tree.parents, d) for d in (0, 1, 2, 3, 9)] == [0, 2, 5, 6, 6]  # a tree cut to its first depths
    for tokens, parents in (((1, 2), (-1,)), ((1, 2), (1, -1)), ((1, 1), (-1, -1))):
        with pytest.raises(ValueError):
            Tree(tokens, parents)


def accept_child(p, q, children, u_accept, u_residual, residual=True):
    """RRSw at one node, decided: (the index of the accepted child or None, the output token)."""
    ratios, token = node_verdict(p, q, children, float(u_residual), residual)
    chosen = next((i for i, r in enumerate(ratios) if u_accept[i] < r), None)
    return (None, token) if chosen is None else (chosen, children[chosen])


def sampled_walk(tree, target, draft, u_accept, u_residual, residual=True):
    """RRSw down the tree, target and draft [n+1, V] (a row per node, leaves' unused)."""
    v = verdict(tree, target, draft[[node + 1 for node in expanded(tree.parents)]], u_residual.tolist(), residual)
    return outcome(tree, v, u_accept.tolist())


def test_walk_descends_to_the_first_child_that_passes_its_test():
    tree = Tree((10, 11, 12, 13, 14, 15), (-1, -1, 0, 0, 1, 2))
    probs = [0.5, 0.9, 0.2, 0.7, 0.0, 1.0]
    assert walk(tree, probs, [0.6, 0.1, 0.1, 0.0, 0.0, 0.0]) == [1]  # node 0 fails; node 1 passes; node 4 cannot
    assert walk(tree, probs, [0.4, 0.0, 0.3, 0.6, 0.0, 0.5]) == [0, 3]  # node 2 fails, its sibling 3 passes
    assert walk(tree, probs, [0.4, 0.0, 0.1, 0.0, 0.0, 0.99]) == [0, 2, 5]


def test_greedy_walk_takes_the_longest_path_of_target_argmaxes():
    tree = Tree((10, 11, 12, 13, 14, 15), (-1, -1, 0, 0, 1, 2))
    # argmax at the root, then after nodes 0 … 5
    assert greedy_walk(tree, [11, 0, 14, 0, 0, 0, 0]) == ([1, 4], 0)  # root → 11 → 14 → the leaf's next
    assert greedy_walk(tree, [10, 12, 0, 15, 0, 0, 7]) == ([0, 2, 5], 7)  # the whole deepest path, then bonus
    assert greedy_walk(tree, [10, 13, 0, 0, 9, 0, 0]) == ([0, 3], 9)  # the second child at depth 2
    assert greedy_walk(tree, [3, 0, 0, 0, 0, 0, 0]) == ([], 3)  # no child holds it: the target's token


def test_draws_without_replacement_are_distinct_and_follow_q():
    g = torch.Generator().manual_seed(0)
    counts = np.zeros((5, 5))
    for _ in range(4000):
        first, second = draw_without_replacement(Q, torch.rand(2, generator=g, dtype=torch.float64))
        counts[first, second] += 1
    assert np.trace(counts) == 0  # never the same token twice
    expected = np.array([[0 if a == b else Q[a] * Q[b] / (1 - Q[a]) for b in range(5)] for a in range(5)])
    cells = expected > 0
    assert chisquare(counts[cells], expected[cells] * 4000).pvalue > 1e-3
    assert draw_without_replacement(torch.tensor([0.0, 1.0, 0.0]), torch.rand(3, dtype=torch.float64)) == [1]


def exact_output(p: torch.Tensor, q: torch.Tensor, k: int, residual: bool) -> torch.Tensor:
    """The float64 output distribution of RRSw at a node with k children, by enumerating every
    ordered draw of the children and the accept probabilities (independent of the code's path)."""
    out = torch.zeros_like(p)
    for children in itertools.permutations(range(len(p)), k):
        weight, pi, qi = 1.0, p.clone(), q.clone()
        for x in children:  # the chance of this draw order
            weight *= float(qi[x] / qi.sum())
            qi = qi.clone()
            qi[x] = 0
        reach, pi, qi = weight, p.clone(), q.clone()  # probability of reaching round i
        for x in children:
            qn = qi / qi.sum()
            accept = min(1.0, float(pi[x] / qn[x])) if qn[x] > 0 else 0.0
            out[x] += reach * accept
            reach *= 1 - accept
            if residual:
                owed = (pi - qn).clamp(min=0)
                pi = owed / owed.sum() if owed.sum() > 0 else pi
            qi = qn.clone()
            qi[x] = 0
        out += reach * pi
    return out


@pytest.mark.parametrize("k", [1, 2, 3])
def test_rrsw_at_a_node_is_the_target_exactly_and_without_the_residual_is_not(k):
    assert torch.allclose(exact_output(P, Q, k, residual=True), P, atol=1e-12)
    assert (exact_output(P, Q, k, residual=False) - P).abs().max() > 0.02


@pytest.mark.parametrize("residual", [True, False])
def test_accept_child_samples_the_target_and_its_negative_control_fails(residual):
    g = torch.Generator().manual_seed(1)
    n, counts = 8000, np.zeros(5)
    for _ in range(n):
        u = torch.rand(5, generator=g, dtype=torch.float64)
        children = draw_without_replacement(Q, u[:2])
        _, token = accept_child(P, Q, children, u[2:4], u[4], residual=residual)
        counts[token] += 1
    pvalue = chisquare(counts, P.numpy() * n).pvalue
    assert pvalue > 1e-3 if residual else pvalue < 1e-6


def two_level(residual: bool, n: int, seed: int) -> np.ndarray:
    """Counts of the first two output tokens over n cycles on trees of widths (2, 2), drafted
    from a draft that depends on the previous token, verified by sampled_walk."""
    g = torch.Generator().manual_seed(seed)
    after_p = torch.stack([P.roll(t) for t in range(5)])  # [V, V]: the target after token t
    after_q = torch.stack([Q.roll(2 * t) for t in range(5)])  # [V, V]: the draft after token t
    counts = np.zeros((5, 5))
    for _ in range(n):
        u = torch.rand(19, generator=g, dtype=torch.float64)  # 6 for the draws, 6 accept tests, 7 residuals
        first = draw_without_replacement(Q, u[0:2])
        tokens, parents = list(first), [-1] * len(first)
        for i, t in enumerate(first):
            kids = draw_without_replacement(after_q[t], u[2 + 2 * i:4 + 2 * i])
            tokens += kids
            parents += [i] * len(kids)
        tree = Tree(tuple(tokens), tuple(parents))
        target = torch.cat([P[None], after_p[list(tokens)]])  # [n+1, V]
        draft = torch.cat([Q[None], after_q[list(tokens)]])  # [n+1, V]
        path, token = sampled_walk(tree, target, draft, u[6:12], u[12:19], residual=residual)
        emitted = [tokens[i] for i in path] + [token]
        if len(emitted) == 1:  # the next cycle starts from the target after it
            emitted.append(int(torch.multinomial(after_p[emitted[0]], 1, generator=g)))
        counts[emitted[0], emitted[1]] += 1
    return counts


@pytest.mark.parametrize("residual", [True, False])
def test_sampled_walk_follows_the_targets_joint_distribution(residual):
    n = 6000
    joint = (P[:, None] * torch.stack([P.roll(t) for t in range(5)])).numpy()  # [V, V]: p(a) p(b | a)
    pvalue = chisquare(two_level(residual, n, seed=2).ravel(), joint.ravel() * n).pvalue
    assert pvalue > 1e-3 if residual else pvalue < 1e-6

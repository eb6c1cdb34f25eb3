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
    return draw_children(q[None], [u.tolist()[:int((q > 0).sum())]])[0]


def draw_children(q: torch.Tensor, u: list[list[float]]) -> list[list[int]]:
    """`draw_without_replacement` for several nodes at once, one round per child rank: q [R, V]
    (each row's support at least len(u[r])), row r drawing one child per uniform of u[r]."""
    q = q.double().clone()  # [R, V]
    children: list[list[int]] = [[] for _ in u]
    for k in range(max(map(len, u), default=0)):
        active = [r for r, ur in enumerate(u) if len(ur) > k]
        rows = torch.tensor(active, device=q.device)
        draws = torch.tensor([u[r][k] for r in active], dtype=torch.float64, device=q.device)
        tokens = sampling.sample(q[rows], draws)  # [A]
        q[rows, tokens] = 0
        for r, token in zip(active, tokens.tolist()):
            children[r].append(token)
    return children


def verdict(tree: Tree, target: torch.Tensor, draft: torch.Tensor, u_residual: list[float],
            residual: bool = True) -> Verdict:
    """RRSw's numbers for every node (the module's docstring). target [n+1, V]: the target's
    distribution per row; draft [e, V]: the draft's at each expanded node (`expanded` order);
    u_residual [n+1] float64, one per row. residual=False skips the residual step: wrong, kept
    as the tests' negative control."""
    return verdicts([tree], target, draft, [u_residual], residual)[0]


def verdicts(trees: list[Tree], target: torch.Tensor, draft: torch.Tensor | None, u_residual: list[list[float]],
             residual: bool = True) -> list[Verdict]:
    """`verdict` for several trees at once: every node of every tree takes its k-th child in
    the same round (a round per child rank, not per node), then every row draws its token in one
    call. target [N, V]: every tree's n+1 rows, tree after tree; draft [E, V]: every tree's
    expanded nodes, in the same order (None: no tree has nodes)."""
    return verdicts_by(lambda p, q, kids: (_rounds(p, q.clone(), kids, residual), p), trees, target, draft,
                       u_residual)


def verdicts_by(rule, trees: list[Tree], target: torch.Tensor, draft: torch.Tensor | None,
                u_residual: list[list[float]]) -> list[Verdict]:
    """Verdicts by a node rule for several trees at once, in `verdicts`' layout: rule(p, q, kids)
    with p, q [E, V] float64 the target's and the draft's at every expanded node and kids[e] its
    children's tokens → (each child's accept probability, [E, V] what each node's recovered
    token is drawn from); a leaf's row draws from the target. Every row draws in one call."""
    rows = [(t, node) for t, tree in enumerate(trees) for node in range(-1, len(tree))]
    expanded_rows = [i for i, (t, node) in enumerate(rows) if trees[t].children[node]]
    p_all = target.to(torch.float64, copy=True)  # [N, V]: each row's target, then what it draws from
    ratios: list[list[float]] = []
    if expanded_rows:
        index = torch.tensor(expanded_rows, device=p_all.device)
        kids = [[trees[rows[i][0]].tokens[c] for c in trees[rows[i][0]].children[rows[i][1]]] for i in expanded_rows]
        ratios, rest = rule(p_all[index], draft.to(p_all.device, torch.float64), kids)  # [E, V]
        p_all[index] = rest
    u = torch.tensor([x for us in u_residual for x in us], dtype=torch.float64, device=p_all.device)  # [N]
    recovered = sampling.sample(p_all, u).tolist()
    out, at, e = [], 0, 0
    for tree in trees:
        accept_probs = [0.0] * len(tree)
        for node in range(-1, len(tree)):
            if tree.children[node]:
                for child, ratio in zip(tree.children[node], ratios[e]):
                    accept_probs[child] = ratio
                e += 1
        out.append(Verdict(accept_probs, recovered[at:at + len(tree) + 1]))
        at += len(tree) + 1
    return out


def _rounds(p: torch.Tensor, q: torch.Tensor, kids: list[list[int]], residual: bool) -> list[list[float]]:
    """RRSw at every expanded node at once, in place: p, q [E, V] float64, kids[e] the node's
    children's tokens → each child's accept probability; p ends as what is left to draw from."""
    ratios: list[list[float]] = [[] for _ in kids]
    for k in range(max(map(len, kids))):
        active = [e for e, ks in enumerate(kids) if len(ks) > k]
        rows = torch.tensor(active, device=p.device)
        tokens = torch.tensor([kids[e][k] for e in active], device=p.device)
        each = torch.arange(len(active), device=p.device)
        p_k, q_k = p[rows], q[rows]  # [A, V]
        q_token = q_k[each, tokens]  # [A]
        ratio = torch.where(q_token > 0, (p_k[each, tokens] / q_token).clamp(max=1.0), 0.0)
        for e, r in zip(active, ratio.tolist()):
            ratios[e].append(r)
        if residual:
            p[rows] = sampling.residual(p_k, q_k)  # the target itself where it is q: that rejection had probability 0
        q_k[each, tokens] = 0
        q[rows] = q_k / q_k.sum(-1, keepdim=True).clamp(min=1e-300)
    return ratios


def node_verdict(p: torch.Tensor, q: torch.Tensor | None, children: list[int], u_residual: float,
                 residual: bool = True) -> tuple[list[float], int]:
    """RRSw at one node. p, q [V]: the target's and the draft's distributions there (q: None for
    a leaf); children: the tokens drawn from q without replacement → (each child's accept
    probability given its earlier siblings' rejection, the token drawn from what is left)."""
    node = Tree(tuple(children), (-1,) * len(children))
    targets = torch.cat([p[None], p.new_zeros(len(children), p.shape[-1])])  # the children's rows are unused
    v = verdict(node, targets, q[None] if children else None, [u_residual] + [0.0] * len(children), residual)
    return v.accept_probs, v.recovered[0]

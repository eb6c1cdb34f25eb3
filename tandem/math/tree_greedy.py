"""The greedy multi-draft rule for a token tree's node (Hu et al., ICLR 2025, "Towards Optimal
Multi-draft Speculative Decoding"): the draft's w children at a node are its top w − 1 tokens D,
taken deterministically, and one token X drawn from q′, the draft's distribution q restricted to
the tokens outside D and renormalised. With p the target's distribution at the node:

    accept X with probability min(1, p(X) / q′(X))
    else (R = 1 − Σ_{x∉D} min(p(x), q′(x))): output d ∈ D with probability p(d) / R each
    else: draw from max(p − q′, 0) over the tokens outside D, normalised

Proof sketch (exact): for x ∉ D, P(X = x and accepted) = q′(x) · min(1, p(x)/q′(x)) = min(p(x),
q′(x)), so X is rejected with probability R; then d ∈ D comes out with probability p(d)/R, so
P(d) = p(d). The residual draw happens with probability R − p(D) = Σ_{x∉D} p(x) − Σ_{x∉D} min(p(x),
q′(x)) = Σ_{x∉D} max(p(x) − q′(x), 0), its own mass, so x ∉ D comes out with probability
min(p(x), q′(x)) + max(p(x) − q′(x), 0) = p(x). (Σ_D p(d)/R ≤ 1 for the same reason.)
Optimal for this way of drafting: the output lands on a child with probability p(D) + Σ_{x∉D}
min(p(x), q′(x)), and no rule can do better, since Y ~ p falls in D with probability p(D) at
most and equals X ∉ D with probability Σ_{x∉D} min(p(x), q′(x)) at most (the coupling bound).
Recursive rejection sampling without replacement (tandem.math.tree_sampling) draws every child
from q and accepts less often (the tests compare both on the same nodes).

In a tree (tandem.math.tree) the walk tests a node's children in their order, so the sampled
child comes first: children = [X, d_1, …, d_{w−1}]. X's accept probability is min(1,
p(X)/q′(X)); d_j's, once X and d_1 … d_{j−1} are rejected, is p(d_j) / (R − Σ_{k<j} p(d_k)); the
row's recovered token is the residual draw. With w = 1 (D empty) this is token-level
speculative sampling. When q has no mass outside D, the draft takes D's first token as X: q′
is then one-hot on it, which is what drawing X from q′ gives, so the rule stays exact.
"""

import torch

from tandem.math import sampling
from tandem.math.tree import Tree, Verdict


def children(q: torch.Tensor, width: int, u: float) -> list[int]:
    """A node's `width` children under the greedy rule, q [V] → [X, d_1, …, d_{w−1}]: D = q's
    top w − 1 tokens with mass, then X drawn from q′ with the uniform u, first (fewer children
    when q has fewer tokens with mass)."""
    return draw_children(q[None], [[u]], [width])[0]


def draw_children(q: torch.Tensor, u: list[list[float]], widths: list[int]) -> list[list[int]]:
    """`children` for several nodes at once: q [R, V], row r's X drawn with u[r][0] (none when
    u[r] is empty: no token to draw) after its top widths[r] − 1 tokens."""
    q = q.double()  # [R, V]
    k = min(max(widths) - 1, q.shape[-1])
    top = q.topk(k, -1).indices.tolist() if k > 0 else [[] for _ in widths]  # [R][k], most likely first
    tops = [[t for t in row[:w - 1] if q[r, t] > 0] for r, (row, w) in enumerate(zip(top, widths))]
    rest = q.clone()
    for r, d in enumerate(tops):
        rest[r, d] = 0
    out = [list(d) for d in tops]
    drawing = [r for r in range(len(widths)) if u[r] and rest[r].sum() > 0]  # else D's first token is X
    if drawing:
        rows = torch.tensor(drawing)
        draws = torch.tensor([u[r][0] for r in drawing], dtype=torch.float64)
        for r, x in zip(drawing, sampling.sample(rest[rows], draws).tolist()):
            out[r] = [x, *tops[r]]
    return out


def verdicts(trees: list[Tree], target: torch.Tensor, draft: torch.Tensor | None, u_residual: list[list[float]],
             ) -> list[Verdict]:
    """The greedy rule's verdict for every node of several trees (tandem.math.tree_sampling.verdicts'
    layout): target [N, V], every tree's n + 1 rows (the root, then each node), tree after tree;
    draft [E, V], every tree's expanded nodes in the same order; u_residual, per tree, one
    uniform per row. A row with children draws from its residual, a leaf's from the target."""
    out, row, e = [], 0, 0
    for tree, us in zip(trees, u_residual):
        accept, recovered = [0.0] * len(tree), []
        for node in range(-1, len(tree)):
            kids = tree.children[node]
            if kids:
                ratios, token = node_verdict(target[row], draft[e], [tree.tokens[k] for k in kids], us[node + 1])
                for k, ratio in zip(kids, ratios):
                    accept[k] = ratio
                e += 1
            else:
                token = int(sampling.sample(target[row:row + 1].double(), torch.tensor([us[node + 1]],
                                                                                       dtype=torch.float64))[0])
            recovered.append(token)
            row += 1
        out.append(Verdict(accept, recovered))
    return out


def node_verdict(p: torch.Tensor, q: torch.Tensor, kids: list[int], u_residual: float,
                 residual: bool = True) -> tuple[list[float], int]:
    """The greedy rule at one node. p, q [V]: the target's and the draft's distributions there;
    kids: `children`'s answer ([X, *D]) → (each child's accept probability given its earlier
    siblings' rejection, the token drawn with the uniform u_residual from what is left).
    residual=False: see `node_rule`."""
    ratios, rest = node_rule(p, q, kids, residual)
    return ratios, int(sampling.sample(rest[None], torch.tensor([u_residual], dtype=torch.float64))[0])


def node_rule(p: torch.Tensor, q: torch.Tensor, kids: list[int], residual: bool = True,
              ) -> tuple[list[float], torch.Tensor]:
    """node_verdict's numbers → (the children's accept probabilities, the distribution [V]
    float64 the recovered token is drawn from, normalised). residual=False draws it from p over
    the tokens outside D instead of max(p − q′, 0): wrong, the tests' negative control."""
    p, q = p.double(), q.double()
    x, d = kids[0], kids[1:]
    outside = torch.ones_like(p, dtype=torch.bool)  # [V]: the tokens outside D
    outside[d] = False
    q_prime = torch.where(outside, q, 0.0)
    q_prime = q_prime / q_prime.sum()  # [V]; X was drawn from it, so it has mass
    ratios = [min(1.0, float(p[x] / q_prime[x]))]
    left = 1.0 - float(torch.where(outside, torch.minimum(p, q_prime), 0.0).sum())  # R, then what d_j's tests leave
    for token in d:
        ratios.append(min(1.0, float(p[token]) / left) if left > 0 else 0.0)
        left -= float(p[token])
    rest = torch.where(outside, (p - q_prime).clamp(min=0) if residual else p, 0.0)  # [V]
    if rest.sum() <= 0:
        rest = p  # never drawn: the residual has no mass, so some child is accepted
    return ratios, rest / rest.sum()

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
from q, a different scheme: where the draft approximates the target it accepts less often (the
tests compare both on the same nodes), not on every pair (benchmarks/README.md, "The tree rule").

In a tree (tandem.math.tree) the walk tests a node's children in their order, so the sampled
child comes first: children = [X, d_1, …, d_{w−1}]. X's accept probability is min(1,
p(X)/q′(X)); d_j's, once X and d_1 … d_{j−1} are rejected, is p(d_j) / (R − Σ_{k<j} p(d_k)); the
row's recovered token is the residual draw. With w = 1 (D empty) this is token-level
speculative sampling. When q has no mass outside D, the draft takes D's first token as X: q′
is then one-hot on it, which is what drawing X from q′ gives, so the rule stays exact.
"""

import torch

from tandem.math import sampling, tree_sampling
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
    values, indices = q.topk(k, -1) if k > 0 else (q[:, :0], q[:, :0].long())  # [R, k], most likely first
    keep = (values > 0) & (torch.arange(k, device=q.device)[None] < torch.tensor(widths, device=q.device)[:, None] - 1)
    rest = q.scatter(-1, indices, torch.where(keep, 0.0, values))  # [R, V]: q without each row's D
    tops = [[t for t, kept in zip(row, mask) if kept] for row, mask in zip(indices.tolist(), keep.tolist())]
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
    """The greedy rule's verdict for every node of several trees at once, in
    tandem.math.tree_sampling.verdicts' layout (target [N, V], draft [E, V], a uniform per row)."""
    return tree_sampling.verdicts_by(rule, trees, target, draft, u_residual)


def node_verdict(p: torch.Tensor, q: torch.Tensor, kids: list[int], u_residual: float,
                 residual: bool = True) -> tuple[list[float], int]:
    """The greedy rule at one node. p, q [V]: the target's and the draft's distributions there;
    kids: `children`'s answer ([X, *D]) → (each child's accept probability given its earlier
    siblings' rejection, the token drawn with the uniform u_residual from what is left).
    residual=False: see `rule`."""
    ratios, rest = node_rule(p, q, kids, residual)
    return ratios, int(sampling.sample(rest[None], torch.tensor([u_residual], dtype=torch.float64))[0])


def node_rule(p: torch.Tensor, q: torch.Tensor, kids: list[int], residual: bool = True,
              ) -> tuple[list[float], torch.Tensor]:
    """`rule` at one node: p, q [V] → (its children's accept probabilities, [V] what its recovered
    token is drawn from)."""
    ratios, rest = rule(p[None], q[None], [kids], residual)
    return ratios[0], rest[0]


def rule(p: torch.Tensor, q: torch.Tensor, kids: list[list[int]], residual: bool = True,
         ) -> tuple[list[list[float]], torch.Tensor]:
    """The greedy rule at E nodes at once: p, q [E, V] the target's and the draft's distributions
    there, kids[e] the node's children ([X, *D]) → (each child's accept probability given its
    earlier siblings' rejection, [E, V] float64 the distribution each recovered token is drawn
    from, normalised). residual=False draws it from p over the tokens outside D instead of
    max(p − q′, 0): wrong, the tests' negative control."""
    p, q = p.double(), q.double()
    e_index = torch.arange(len(kids), device=p.device)
    width = max(map(len, kids))
    padded = torch.tensor([k + [k[0]] * (width - len(k)) for k in kids], device=p.device)  # [E, w]: X pads
    in_d = torch.tensor([[0 < j < len(k) for j in range(width)] for k in kids], device=p.device)  # [E, w]
    outside = torch.ones_like(p, dtype=torch.bool)  # [E, V]: the tokens outside D
    outside[e_index[:, None].expand_as(padded)[in_d], padded[in_d]] = False
    q_prime = torch.where(outside, q, 0.0)
    q_prime = q_prime / q_prime.sum(-1, keepdim=True).clamp(min=1e-300)  # X was drawn from it: it has mass
    x = padded[:, 0]
    p_x, q_x = p[e_index, x], q_prime[e_index, x]  # [E]
    ratio_x = torch.where(q_x > 0, (p_x / q_x).clamp(max=1.0), 0.0)
    r = 1.0 - torch.where(outside, torch.minimum(p, q_prime), 0.0).sum(-1)  # [E]: R
    p_d = torch.where(in_d, p.gather(-1, padded), 0.0)[:, 1:]  # [E, w − 1]
    left = r[:, None] - (p_d.cumsum(-1) - p_d)  # [E, w − 1]: R less the top tokens before each
    ratio_d = torch.where(left > 0, (p_d / left.clamp(min=1e-300)).clamp(max=1.0), 0.0)
    ratios = torch.cat([ratio_x[:, None], ratio_d], -1).tolist()
    rest = torch.where(outside, (p - q_prime).clamp(min=0) if residual else p, 0.0)  # [E, V]
    empty = rest.sum(-1, keepdim=True) <= 0  # never drawn: the residual has no mass, some child is accepted
    rest = torch.where(empty, p, rest)
    return [row[:len(k)] for row, k in zip(ratios, kids)], rest / rest.sum(-1, keepdim=True)

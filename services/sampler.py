"""What the workers compute from logits, for every step of a round at once.

A job's step carries an ask (tandem.services.runtime.Step.ask): draw a drafted token (`Draw`),
draw a tree depth's children (`Branch`), guess what follows a row (`Top`), check a drafted chain
(`Check`) or tree (`CheckTree`).
After a forward pass, `answer` takes every ask of the pass together: one warp of all the rows
that sample, each with its own temperature, top-k and top-p (tandem.math.sampling.warp_rows),
one argmax of all the rows that are greedy, then each kind's draws and verdicts over all of its
rows at once. The operator calls of a round do not grow with its sessions; what does is plain
Python over O(γ) numbers per session and the protobuf messages of the draft distributions.

The numbers are those each step would get alone: the same warped distributions row by row, the
same counter-based uniforms (tandem.math.rng), the same draws.
"""

import itertools
from dataclasses import dataclass
from typing import Any

import torch

from tandem import rules
from tandem.math import tree as tree_math
from tandem.math import tree_greedy, tree_sampling
from tandem.math.params import SamplingParams
from tandem.math.rng import Purpose, cycle_uniforms, uniform, uniforms
from tandem.math.sampling import sample, warp_rows
from tandem.services import distributions


@dataclass(frozen=True)
class Draw:
    """Draft one token from the step's row: its argmax (greedy), or a draw with the uniform `u`
    (tandem.math.rng: the drafting job keys it) → `Drawn`."""

    params: SamplingParams
    u: float = 0.0


@dataclass(frozen=True)
class Drawn:
    token: int
    prob: float  # its draft probability (1 greedy)
    distribution: Any = None  # the warped distribution, packed (tandem.services.distributions); None greedy


@dataclass(frozen=True)
class Branch:
    """A tree depth's children for each of the step's rows: each row's `width` top tokens
    (greedy), or, sampled, as its tree rule draws them (tandem.math.tree_sampling's without
    replacement, tandem.math.tree_greedy's top tokens and one drawn), row r's draws keyed by the
    node indices its children get (uniforms: the depth's, from its first node on) → `Branched`."""

    params: SamplingParams
    width: int
    uniforms: tuple[float, ...] = ()
    rule: str = "rrsw"  # "rrsw" or "greedy" (tandem.rules.tree)


@dataclass(frozen=True)
class Branched:
    children: list[list[int]]  # per row
    probs: list[list[float]]  # each child's draft probability (1 greedy)
    distributions: list  # per row, packed; empty greedy


@dataclass(frozen=True)
class Top:
    """Guesses of the token after each of the step's rows: its `count` most likely tokens by the
    draft, most likely first, leaving out those it cannot draft (−inf logits: a draft's tokens
    outside the target's vocabulary) → per row [(token, its draft probability)] (greedy: the
    one-hot draft's, 1 for the first and 0 for the others)."""

    params: SamplingParams
    count: int


@dataclass(frozen=True)
class Check:
    """Verify a drafted chain from the step's γ+1 rows (the target after each drafted prefix)
    by a chain rule (tandem.rules: token by token, or as a block) → `Checked`.
    draft_probs [γ, V]: the draft's distributions; None for one-hot drafts."""

    params: SamplingParams
    draft_tokens: tuple[int, ...]
    draft_probs: torch.Tensor | None
    position: int  # absolute position of the first drafted token
    rule: rules.ChainRule = rules.TOKEN


@dataclass(frozen=True)
class Checked:
    target_token_probs: list[float]
    recovered_tokens: list[int]
    bonus_token: int
    block_accept_probs: list[float]  # the rule's accept probabilities (block verification's h), else empty


@dataclass(frozen=True)
class CheckTree:
    """Verify a token tree from the step's n+1 rows (the root, then each node) → a
    tandem.math.tree.Verdict whose accept probabilities are rounded to float32, as the wire
    carries them. draft_probs [e, V] at each expanded node; None when greedy."""

    params: SamplingParams
    tree: tree_math.Tree
    draft_probs: torch.Tensor | None
    position: int  # absolute position of the depth-1 nodes
    rule: str = "rrsw"  # how the tree's children were drawn: "rrsw" or "greedy" (tandem.rules.tree)


def answer(asks: list, logits: list[torch.Tensor]) -> list:
    """Every ask of a round → its answer, from its step's logits [rows, V]. The rows of every
    sampled ask are warped in one call, those of every greedy ask take one argmax; then each
    kind answers all of its asks at once, reading their rows by index."""
    out: list = [None] * len(asks)
    for greedy in (True, False):
        chosen = [i for i, ask in enumerate(asks) if ask.params.greedy == greedy]
        if not chosen:
            continue
        rows = torch.cat([logits[i] for i in chosen])  # [R, V]
        values = rows.argmax(-1).tolist() if greedy else _warp(rows, [(asks[i].params, len(logits[i])) for i in chosen])
        firsts = [0, *itertools.accumulate(len(logits[i]) for i in chosen)]
        for kind, handler in _HANDLERS.items():
            mine = [j for j, i in enumerate(chosen) if isinstance(asks[i], kind)]
            if mine:
                spans = [range(firsts[j], firsts[j + 1]) for j in mine]
                for j, result in zip(mine, handler([asks[chosen[j]] for j in mine], spans, values, rows, greedy)):
                    out[chosen[j]] = result
    return out


def _warp(rows: torch.Tensor, params: list[tuple[SamplingParams, int]]) -> torch.Tensor:
    """Every sampled row of the round warped in one call, each with its ask's parameters → [R, V] float32."""
    per_row = [p for p, n in params for _ in range(n)]
    return warp_rows(rows, [p.temperature for p in per_row], [p.top_k for p in per_row], [p.top_p for p in per_row])


def _index(rows, like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(list(rows), dtype=torch.long, device=like.device)


def _draws(asks: list[Draw], spans: list[range], values, rows: torch.Tensor, greedy: bool) -> list[Drawn]:
    if greedy:  # warp's one-hot and its draw, without vocabulary-sized work
        return [Drawn(values[span[-1]], 1.0) for span in spans]
    probs = values.index_select(0, _index((span[-1] for span in spans), values))  # [A, V]
    u = torch.tensor([a.u for a in asks], dtype=torch.float64, device=probs.device)
    tokens = sample(probs, u)  # [A]
    token_probs = probs.gather(-1, tokens[:, None])[:, 0].tolist()
    packed = distributions.pack(probs)
    return [Drawn(t, p, d) for t, p, d in zip(tokens.tolist(), token_probs, packed)]


def _branches(asks: list[Branch], spans: list[range], values, rows: torch.Tensor, greedy: bool) -> list[Branched]:
    index = _index((r for span in spans for r in span), rows)
    widths = [a.width for a, span in zip(asks, spans) for _ in span]  # per row
    if greedy:  # each node's top tokens; one-hot drafts need no distributions
        top = rows.index_select(0, index).topk(min(max(widths), rows.shape[-1]), -1).indices.tolist()
        children = [t[:w] for t, w in zip(top, widths)]
        probs, packed = [[1.0] * len(c) for c in children], [None] * len(children)
    else:
        q = values.index_select(0, index)  # [R, V]: every node's draft distribution
        u = _child_uniforms(asks, spans, (q > 0).sum(-1).tolist())

        def draw(rule: str, mine: list[int]) -> list[list[int]]:
            q_mine, u_mine = q.index_select(0, _index(mine, q)), [u[r] for r in mine]
            if rule == "greedy":
                return tree_greedy.draw_children(q_mine, [w[:1] for w in u_mine], [widths[r] for r in mine])
            return tree_sampling.draw_children(q_mine, u_mine)

        children = _by_rule([a.rule for a, span in zip(asks, spans) for _ in span], draw)  # per row
        flat = _index((r * q.shape[-1] + t for r, kids in enumerate(children) for t in kids), q)
        probs = _cut(q.flatten()[flat].tolist(), [len(c) for c in children])
        packed = distributions.pack(q)
    sizes = [len(span) for span in spans]
    return [Branched(c, p, [] if greedy else d)
            for c, p, d in zip(_cut(children, sizes), _cut(probs, sizes), _cut(packed, sizes))]


def _child_uniforms(asks: list[Branch], spans: list[range], support: list[int]) -> list[list[float]]:
    """Per row, the uniforms of its draws: min(width, its support) of them, keyed by the nodes its
    children become, after the children of the rows before it in its ask."""
    draws, at = [], 0
    for ask, span in zip(asks, spans):
        used = 0
        for r in range(at, at + len(span)):
            count = min(ask.width, support[r])
            draws.append(list(ask.uniforms[used:used + count]))
            used += count
        at += len(span)
    return draws


def _cut(values: list, sizes: list[int]) -> list[list]:
    """values in consecutive pieces of these sizes."""
    starts = [0, *itertools.accumulate(sizes)]
    return [values[a:b] for a, b in zip(starts, starts[1:])]


def _tops(asks: list[Top], spans: list[range], values, rows: torch.Tensor, greedy: bool) -> list[list]:
    # The logits' order is the warped distribution's: temperature, top-k and top-p keep it.
    index = _index((r for span in spans for r in span), rows)
    logits, tokens = rows.index_select(0, index).topk(min(max(a.count for a in asks), rows.shape[-1]), -1)
    logits, tokens = logits.tolist(), tokens.tolist()
    out, row = [], 0
    for ask, span in zip(asks, spans):
        guesses = []
        for r in span:
            top = [t for t, logit in zip(tokens[row][:ask.count], logits[row][:ask.count]) if logit > float("-inf")]
            probs = [float(i == 0) for i in range(len(top))] if greedy else values[r, top].tolist()
            guesses.append(list(zip(top, probs)))
            row += 1
        out.append(guesses)
    return out


def _checks(asks: list[Check], spans: list[range], values, rows: torch.Tensor, greedy: bool) -> list[Checked]:
    gammas = [len(a.draft_tokens) for a in asks]
    if greedy:  # one-hot distributions: the target's argmax decides (tandem.math.sampling.verify_greedy)
        out = []
        for ask, span, g in zip(asks, spans, gammas):
            argmax = values[span[0]:span[-1] + 1]
            out.append(Checked([1.0 if a == t else 0.0 for a, t in zip(argmax, ask.draft_tokens)], argmax[:g],
                               argmax[g], []))
        return out
    target = values.index_select(0, _index((r for span in spans for r in span[:-1]), values))  # [P, V]
    device = target.device
    drafts = torch.tensor([t for a in asks for t in a.draft_tokens], dtype=torch.long, device=device)  # [P]
    draft = _draft_probs(asks, gammas, drafts, target.shape[-1])  # [P, V]
    u = [x for a, g in zip(asks, gammas) for x in uniforms(a.params.seed, a.position, g, Purpose.RECOVERED)]
    u = torch.tensor(u, dtype=torch.float64, device=device)  # [P]
    starts = [0, *itertools.accumulate(gammas)]
    token_probs, recovered = [0.0] * len(drafts), [0] * len(drafts)
    accept: list[list[float]] = [[] for _ in asks]  # per block: the rule's accept probabilities, if any
    for rule in dict.fromkeys(a.rule for a in asks):  # each rule's verdicts over all of its blocks at once
        mine = [b for b, a in enumerate(asks) if a.rule is rule]
        at = [i for b in mine for i in range(starts[b], starts[b + 1])]
        if not at:  # γ = 0 blocks: a bonus token only
            continue
        index = torch.tensor(at, dtype=torch.long, device=device)
        mine_gammas = [gammas[b] for b in mine]
        probs, drawn, h = rule.verdicts(target[index], drafts[index], draft[index], mine_gammas, u[index])
        for i, p, r in zip(at, probs.tolist(), drawn.tolist()):
            token_probs[i], recovered[i] = p, r
        for b, block in zip(mine, _cut(h, mine_gammas) if h else ()):
            accept[b] = block
    bonus_u = torch.tensor([uniform(a.params.seed, a.position + g, Purpose.BONUS) for a, g in zip(asks, gammas)],
                           dtype=torch.float64, device=device)
    after = values.index_select(0, _index((span[-1] for span in spans), values))  # [A, V]: the target after each block
    bonus = sample(after, bonus_u).tolist()
    return [Checked(p, r, b, a)
            for p, r, b, a in zip(_cut(token_probs, gammas), _cut(recovered, gammas), bonus, accept)]


def _draft_probs(asks: list[Check], gammas: list[int], drafts: torch.Tensor, vocab: int) -> torch.Tensor:
    """Every block's draft distributions [P, V]; a one-hot draft's from its tokens."""
    given = [a.draft_probs for a in asks if a.draft_probs is not None]
    if len(given) == len(asks):
        return torch.cat(given).to(drafts.device)
    draft = torch.zeros(len(drafts), vocab, device=drafts.device)
    rows = _cut(list(range(len(drafts))), gammas)  # each block's positions
    if given:
        draft[_index((r for a, rs in zip(asks, rows) if a.draft_probs is not None for r in rs), drafts)] = \
            torch.cat(given).to(drafts.device)
    one_hot = _index((r for a, rs in zip(asks, rows) if a.draft_probs is None for r in rs), drafts)
    draft[one_hot, drafts[one_hot]] = 1.0
    return draft


def _check_trees(asks: list[CheckTree], spans: list[range], values, rows: torch.Tensor, greedy: bool) -> list:
    if greedy:
        return [tree_math.greedy_verdict(a.tree, values[span[0]:span[-1] + 1]) for a, span in zip(asks, spans)]

    def check(rule: str, mine: list[int]) -> list:
        target = values.index_select(0, _index((r for i in mine for r in spans[i]), values))  # [N, V]
        drafts = [asks[i].draft_probs for i in mine if asks[i].draft_probs is not None]
        u = [cycle_uniforms(asks[i].params.seed, asks[i].position, len(asks[i].tree) + 1, Purpose.TREE_RECOVERED)
             for i in mine]
        return rules.TREE.verdicts([asks[i].tree for i in mine], target, torch.cat(drafts) if drafts else None, u,
                                   rule)

    return _by_rule([a.rule for a in asks], check)


def _by_rule(rules_of: list[str], answer) -> list:
    """answer(rule, indices) for each tree rule's items at once (a pass mixes sessions of both)
    → every item's result, in the items' order."""
    out: list = [None] * len(rules_of)
    for rule in dict.fromkeys(rules_of):
        mine = [i for i, r in enumerate(rules_of) if r == rule]
        for i, result in zip(mine, answer(rule, mine)):
            out[i] = result
    return out


_HANDLERS = {Draw: _draws, Branch: _branches, Top: _tops, Check: _checks, CheckTree: _check_trees}

"""Verification rules (tandem.rules): each owns both halves of its mode, and only the two halves
of one rule together are exact.

- names: a request's verification names a chain rule, as the wire spells it; a tree has its own;
- the orchestrator halves are the accept tests of tandem.math, walked with the rule's uniforms;
- statistically: cycles through the workers' batched sampler (the draft's draws, the target's
  check by a chain rule's worker half) and the rule's orchestrator half (`accept`), every
  uniform keyed as in the cluster, follow the target's distribution (chi square); mixing one
  rule's worker half with another's orchestrator half does not, nor does block verification
  whose draws are keyed by absolute position (a later cycle re-reads them);
- the orchestrator, which runs only the plain-Python half, never loads torch.
"""

import itertools
import subprocess
import sys

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from support.enumeration import P_MIN, V, Pair, target_sequences

from tandem import rules
from tandem.math import tree
from tandem.math.acceptance import accepted_jointly, count_accepted, output_tokens
from tandem.math.params import SamplingParams
from tandem.math.rng import Purpose, cycle_uniforms, uniforms
from tandem.services import distributions, sampler
from tandem.services.draft_worker import draw_uniforms
from tandem.wire.generation import VERIFICATION_MODES
from tandem.wire.worker import Proposal, Verification


def test_a_requests_verification_names_a_chain_rule_and_a_tree_has_its_own():
    assert tuple(rules.CHAIN_RULES) == VERIFICATION_MODES
    assert rules.of("token") is rules.TOKEN and rules.of("block") is rules.BLOCK
    assert rules.of("token", tree=True) is rules.of("block", tree=True) is rules.TREE


def _chain(draft_tokens, draft_probs, target_probs, recovered, bonus, h=()):
    return (Proposal(list(draft_tokens), list(draft_probs), [], 0.0),
            Verification(list(target_probs), list(recovered), bonus, 0.0, block_accept_probs=list(h)))


def test_chain_rules_accept_with_the_maths_tests_and_their_own_uniforms():
    seed, position = 11, 40
    u = cycle_uniforms(seed, position, 3, Purpose.ACCEPT)
    proposal, verification = _chain([5, 6, 7], [0.5, 0.4, 0.9], [0.45, 0.1, 0.9], [8, 9, 10], 11,
                                    h=[0.3, 0.2, 0.95])
    accepted = count_accepted(proposal.draft_token_probs, verification.target_token_probs, u)
    assert rules.TOKEN.accept(proposal, verification, seed, position) == (
        accepted, output_tokens([5, 6, 7], accepted, [8, 9, 10], 11), accepted)
    jointly = accepted_jointly(verification.block_accept_probs, u)
    assert rules.BLOCK.accept(proposal, verification, seed, position) == (
        jointly, output_tokens([5, 6, 7], jointly, [8, 9, 10], 11), jointly)


def test_the_block_rule_reads_a_greedy_answer_as_token_level():
    """Greedy requests get no h: the target's argmax decides, as it does token by token."""
    proposal, verification = _chain([5, 6, 7], [1.0] * 3, [1.0, 0.0, 1.0], [5, 3, 7], 11)
    assert rules.BLOCK.accept(proposal, verification, 1, 0) == rules.TOKEN.accept(proposal, verification, 1, 0) \
        == (1, [5, 3], 1)


def test_the_tree_rule_walks_with_the_uniforms_the_verifier_walks_with():
    draft = tree.Tree((10, 11, 12, 13), (-1, -1, 0, 0))
    accept_probs = [0.6, 0.7, 0.5, 0.9]
    seed, position = 3, 17
    path = rules.TREE.path(draft, accept_probs, seed, position)
    assert path == tree.walk(draft, accept_probs, cycle_uniforms(seed, position, 4, Purpose.TREE_ACCEPT))
    recovered = [20, 21, 22, 23, 24]
    proposal = Proposal(list(draft.tokens), [0.5] * 4, [], 0.0, parents=list(draft.parents))
    kept = Verification([], [], 0, 0.0, tree_accept_probs=accept_probs, tree_recovered_tokens=recovered,
                        kept_path=path)
    token = recovered[path[-1] + 1 if path else 0]
    assert rules.TREE.accept(proposal, kept, seed, position) == (
        len(path), [draft.tokens[i] for i in path] + [token], len(path))
    crossed = Verification([], [], 0, 0.0, tree_accept_probs=accept_probs, tree_recovered_tokens=recovered,
                           kept_path=[1] if path != [1] else [0])  # the verifier kept another path: none held
    assert rules.TREE.accept(proposal, crossed, seed, position).kept == 0


def run_cycles(pair: Pair, gamma: int, length: int, samples: int, worker: rules.ChainRule,
               orchestrator: rules.ChainRule, draws=draw_uniforms) -> np.ndarray:
    """Sequences of `length` tokens, one per request seed 0 … samples−1, made of cycles run in
    lockstep through the workers' batched sampler (tandem.services.sampler: the draft's draws,
    the target's Check by `worker`'s half, every uniform the sampler keys) and accepted by
    `orchestrator`'s half. draws(seed, position, γ): the draft's uniforms → counts per sequence
    (base-V index)."""
    seqs: list[tuple] = [() for _ in range(samples)]
    while active := [i for i, seq in enumerate(seqs) if len(seq) < length]:
        params = {i: SamplingParams(temperature=1.0, seed=i) for i in active}
        u = {i: draws(i, len(seqs[i]), gamma) for i in active}
        blocks: dict[int, tuple] = {i: () for i in active}
        drawn: dict[int, list] = {i: [] for i in active}
        for step in range(gamma):  # the draft worker: one round of every session's draw
            asks = [sampler.Draw(params[i], u[i][step]) for i in active]
            answers = sampler.answer(asks, [_logits(pair.draft(seqs[i] + blocks[i])) for i in active])
            for i, d in zip(active, answers):
                blocks[i] += (d.token,)
                drawn[i].append(d)
        checks = [sampler.Check(params[i], blocks[i], distributions.unpack([d.distribution for d in drawn[i]], V),
                                len(seqs[i]), worker) for i in active]
        targets = [torch.cat([_logits(pair.target(seqs[i] + blocks[i][:k])) for k in range(gamma + 1)])
                   for i in active]
        for i, checked in zip(active, sampler.answer(checks, targets)):  # the verifier: one round
            proposal = Proposal(list(blocks[i]), [d.prob for d in drawn[i]], [], 0.0)
            verification = Verification(checked.target_token_probs, checked.recovered_tokens, checked.bonus_token,
                                        0.0, block_accept_probs=checked.block_accept_probs)
            seqs[i] += tuple(orchestrator.accept(proposal, verification, i, len(seqs[i])).tokens)
    counts = np.zeros(V**length)
    for seq in seqs:
        counts[int("".join(map(str, seq[:length])), V)] += 1
    return counts


def _logits(probs: np.ndarray) -> torch.Tensor:
    """[1, V]: logits whose softmax is probs (what the sampler warps at temperature 1)."""
    return torch.from_numpy(np.log(probs)).float()[None]


def p_value(worker: rules.ChainRule, orchestrator: rules.ChainRule, draws=draw_uniforms) -> float:
    """χ² p-value of 4,000 three-token sequences (γ = 3, a draft that disagrees with the target)
    made by run_cycles, against the target's exact distribution."""
    pair, gamma, length, samples = Pair(5, draft_temperature=0.4), 3, 3, 4000
    exact = target_sequences(pair, length)
    expected = np.array([exact[s] for s in itertools.product(range(V), repeat=length)]) * samples
    return chisquare(run_cycles(pair, gamma, length, samples, worker, orchestrator, draws), expected).pvalue


@pytest.mark.parametrize("rule", [rules.TOKEN, rules.BLOCK], ids=lambda r: r.name)
def test_a_chain_rules_two_halves_follow_the_target(rule):
    p = p_value(rule, rule)
    assert p > P_MIN, f"{rule.name} verification differs from the target: p = {p:.2g}"


def test_halves_of_different_rules_do_not_make_an_exact_rule():
    """A negative control: block verification's residuals accepted token by token."""
    p = p_value(rules.BLOCK, rules.TOKEN)
    assert p < P_MIN, f"mixed halves passed: p = {p:.2g}"


def test_block_verification_is_not_exact_when_a_later_cycle_rereads_its_draws():
    """A negative control: the draft's draws keyed by absolute position, not by cycle. A block's
    τ depends on the tokens drafted past it, which the next cycle would draw again."""

    def by_position(seed, position, count):
        return uniforms(seed, position, count, Purpose.DRAFT)

    p = p_value(rules.BLOCK, rules.BLOCK, by_position)
    assert p < P_MIN, f"draws keyed by position passed: p = {p:.2g}"
    assert p_value(rules.TOKEN, rules.TOKEN, by_position) > P_MIN, \
        "token by token, a cycle's outcome never depends on draws past it"


def test_the_orchestrator_never_loads_torch():
    code = ("import sys, tandem.orchestrator.cycle, tandem.rules; "
            "assert 'torch' not in sys.modules, 'torch was loaded'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)

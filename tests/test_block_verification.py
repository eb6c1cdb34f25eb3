"""Block verification (tandem.math.block, tandem.math.acceptance.accepted_jointly), checked:

- exactly, on a small vocabulary where every draft block and accept event can be enumerated:
  the first tokens it outputs follow the target's distribution to float64 precision, while the
  negative control (stopping at the first failure, as token-level verification does) does not;
  its expected accepted length is never below token-level verification's;
- against an independent float64 reference of h and of the residuals, on random inputs;
- statistically: cycles run through the real functions (float32 tensors, counter-free uniforms)
  pass a chi-square against the target's exact distribution, and the negative control fails it;
- greedy (one-hot target and draft): it is token-level verification.
"""

import itertools

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from tandem.math.acceptance import accepted_jointly, count_accepted, output_tokens
from tandem.math.block import block_verdict, token_prefix_weights
from tandem.math.sampling import verify_block

from support.enumeration import P_MIN, V, Pair, target_sequences


def ref_block(pair: Pair, context: tuple, block: tuple) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
    """Float64 reference of Sun et al.'s Algorithm 2 for one drafted block → (h [γ], residual
    distribution per τ < γ, target after the block)."""
    gamma = len(block)
    p = [1.0]
    for i, x in enumerate(block):
        prefix = context + block[:i]
        p.append(min(p[-1] * pair.target(prefix)[x] / pair.draft(prefix)[x], 1.0))
    h, residuals = np.zeros(gamma), []
    for tau in range(gamma):
        prefix = context + block[:tau]
        owed = np.maximum(p[tau] * pair.target(prefix) - pair.draft(prefix), 0)
        residuals.append(owed / owed.sum() if owed.sum() > 0 else pair.target(prefix))
        if tau >= 1:
            h[tau - 1] = 1.0 if p[tau] >= 1 else owed.sum() / (owed.sum() + 1 - p[tau])
    h[gamma - 1] = p[gamma]
    return h, residuals, pair.target(context + block)


def tau_probs(h: np.ndarray, first_failure: bool = False) -> np.ndarray:
    """P(τ = 0 … γ): the largest i with η_i < h_i; or, for the negative control, the accepted
    run before the first η_i ≥ h_i."""
    gamma = len(h)
    out = np.zeros(gamma + 1)
    for tau in range(gamma + 1):
        if first_failure:
            out[tau] = np.prod(h[:tau]) * (1 - h[tau] if tau < gamma else 1)
        else:
            out[tau] = (h[tau - 1] if tau else 1) * np.prod(1 - h[tau:])
    return out


def cycle_outputs(pair: Pair, context: tuple, gamma: int, first_failure: bool = False) -> dict:
    """Every output of one block-verification cycle after `context` → its exact probability."""
    out: dict[tuple, float] = {}
    for block in itertools.product(range(V), repeat=gamma):
        p_block = np.prod([pair.draft(context + block[:i])[x] for i, x in enumerate(block)])
        if p_block == 0:
            continue
        h, residuals, after = ref_block(pair, context, block)
        for tau, p_tau in enumerate(tau_probs(h, first_failure)):
            last = after if tau == gamma else residuals[tau]
            for y in range(V):
                key = block[:tau] + (y,)
                out[key] = out.get(key, 0.0) + p_block * p_tau * last[y]
    return out


def first_tokens(pair: Pair, gamma: int, length: int, first_failure: bool = False, context: tuple = ()) -> dict:
    """The exact distribution of the first `length` tokens that cycles output after `context`."""
    if length <= 0:
        return {(): 1.0}
    out: dict[tuple, float] = {}
    for chunk, p in cycle_outputs(pair, context, gamma, first_failure).items():
        if p == 0:
            continue
        chunk = chunk[:length]
        for rest, q in first_tokens(pair, gamma, length - len(chunk), first_failure, context + chunk).items():
            out[chunk + rest] = out.get(chunk + rest, 0.0) + p * q
    return out


@pytest.mark.parametrize("seed,gamma,one_hot", [(0, 1, False), (1, 2, False), (2, 3, False), (3, 3, False),
                                                 (4, 3, True)])
def test_block_verification_follows_the_target_exactly(seed, gamma, one_hot):
    """Sampled drafts, and a one-hot draft under a sampled target (p_i: the product of the
    target's probabilities of the drafted tokens)."""
    pair = Pair(seed, draft_temperature=0.5, one_hot_draft=one_hot)
    length = gamma + 1
    target, block = target_sequences(pair, length), first_tokens(pair, gamma, length)
    worst = max(abs(block[s] - target[s]) for s in target)
    assert worst < 1e-12, f"largest gap to the target's probability of a sequence: {worst:.3g}"
    if gamma > 1:  # the negative control: stopping at the first failure is not exact
        control = first_tokens(pair, gamma, length, first_failure=True)
        gap = sum(abs(control.get(s, 0.0) - target[s]) for s in target) / 2
        assert gap > 1e-3, f"stopping at the first failure should change the distribution (TV {gap:.3g})"


def token_level_accepted(pair: Pair, context: tuple, gamma: int) -> float:
    """Expected accepted tokens of token-level verification, enumerated."""
    total = 0.0
    for block in itertools.product(range(V), repeat=gamma):
        p_block, survive = 1.0, 1.0
        expected = 0.0
        for i, x in enumerate(block):
            prefix = context + block[:i]
            p_block *= pair.draft(prefix)[x]
            survive *= min(1.0, pair.target(prefix)[x] / pair.draft(prefix)[x])
            expected += survive
        total += p_block * expected
    return total


def block_accepted(pair: Pair, context: tuple, gamma: int) -> float:
    total = 0.0
    for block in itertools.product(range(V), repeat=gamma):
        p_block = np.prod([pair.draft(context + block[:i])[x] for i, x in enumerate(block)])
        h, _, _ = ref_block(pair, context, block)
        total += p_block * sum(tau * p for tau, p in enumerate(tau_probs(h)))
    return total


def test_block_accepts_at_least_as_many_tokens_as_token_level():
    gains = []
    for seed in range(12):
        pair = Pair(seed, draft_temperature=0.7)
        for gamma in (2, 3, 4):
            token, block = token_level_accepted(pair, (), gamma), block_accepted(pair, (), gamma)
            assert block >= token - 1e-12, f"seed {seed}, γ {gamma}: block {block:.6f} < token-level {token:.6f}"
            gains.append(block - token)
    assert max(gains) > 1e-3  # and it does gain where the draft disagrees


def random_probs(gen, shape, zero_frac=0.2):
    p = gen.random(shape) * (gen.random(shape) > zero_frac)
    p[..., 0] += 1e-3  # never an all-zero row
    return p / p.sum(-1, keepdims=True)


@pytest.mark.parametrize("seed", range(6))
def test_block_verdict_matches_the_float64_reference(seed):
    gen = np.random.default_rng(seed)
    gamma, vocab = 1 + seed % 5, 50
    target = random_probs(gen, (gamma + 1, vocab))
    draft = random_probs(gen, (gamma, vocab))
    tokens = np.array([gen.choice(vocab, p=row) for row in draft])
    verdict = block_verdict(torch.from_numpy(target).float(), torch.from_numpy(tokens), torch.from_numpy(draft).float(),
                            torch.from_numpy(gen.random(gamma)), 0.5)
    p = [1.0]
    for i, x in enumerate(tokens):
        p.append(min(p[-1] * target[i, x] / draft[i, x], 1.0))
    for i in range(1, gamma + 1):
        if i == gamma:
            h = p[gamma]
        else:
            z = np.maximum(p[i] * target[i] - draft[i], 0).sum()
            h = 1.0 if p[i] >= 1 else z / (z + 1 - p[i])
        assert verdict.block_accept_probs[i - 1].item() == pytest.approx(h, abs=1e-5)
    np.testing.assert_allclose(token_prefix_weights((target[np.arange(gamma), tokens]
                                                     / draft[np.arange(gamma), tokens]).tolist()), p, atol=1e-12)
    for tau, token in enumerate(verdict.recovered_tokens.tolist()):  # drawn from its τ's residual, if any
        if np.maximum(p[tau] * target[tau] - draft[tau], 0).sum() > 0:
            assert p[tau] * target[tau, token] - draft[tau, token] > -1e-6


def run_cycles(pair: Pair, gamma: int, length: int, samples: int, first_failure: bool, seed: int) -> np.ndarray:
    """Generate `samples` sequences of `length` tokens with block-verification cycles through
    the real functions → counts per sequence (base-V index)."""
    gen = np.random.default_rng(seed)
    counts = np.zeros(V**length)
    for _ in range(samples):
        seq: tuple = ()
        while len(seq) < length:
            block, draft_rows = (), []
            for _ in range(gamma):
                row = pair.draft(seq + block)
                draft_rows.append(row)
                block += (int(gen.choice(V, p=row)),)
            target = np.stack([pair.target(seq + block[:i]) for i in range(gamma + 1)])
            verdict = block_verdict(torch.from_numpy(target).float(), torch.tensor(block),
                                    torch.from_numpy(np.stack(draft_rows)).float(),
                                    torch.from_numpy(gen.random(gamma)), float(gen.random()))
            h, eta = verdict.block_accept_probs.tolist(), gen.random(gamma).tolist()
            if first_failure:
                tau = next((i for i in range(gamma) if not eta[i] < h[i]), gamma)
            else:
                tau = accepted_jointly(h, eta)
            seq += tuple(output_tokens(list(block), tau, verdict.recovered_tokens.tolist(), verdict.bonus_token))
        counts[int("".join(map(str, seq[:length])), V)] += 1
    return counts


def test_block_verification_chi_square_against_the_target_and_its_negative_control():
    pair, gamma, length, samples = Pair(5, draft_temperature=0.4), 3, 3, 6000
    exact = target_sequences(pair, length)
    expected = np.array([exact[s] for s in itertools.product(range(V), repeat=length)]) * samples
    ok = chisquare(run_cycles(pair, gamma, length, samples, first_failure=False, seed=1), expected)
    assert ok.pvalue > P_MIN, f"block verification differs from the target: p = {ok.pvalue:.2g}"
    control = chisquare(run_cycles(pair, gamma, length, samples, first_failure=True, seed=2), expected)
    assert control.pvalue < P_MIN, f"the negative control passed: p = {control.pvalue:.2g}"


def test_greedy_block_verification_is_token_level_verification():
    gen = np.random.default_rng(7)
    for _ in range(20):
        gamma, vocab = 4, 30
        target = torch.from_numpy(random_probs(gen, (gamma + 1, vocab))).float()
        tokens = torch.from_numpy(gen.choice(vocab, size=gamma))
        greedy_target = torch.nn.functional.one_hot(target.argmax(-1), vocab).float()
        matching = int(gen.integers(0, gamma + 1))
        tokens[:matching] = greedy_target.argmax(-1)[:matching]  # a prefix the target agrees with
        one_hot = torch.nn.functional.one_hot(tokens, vocab).float()
        u = torch.from_numpy(gen.random(gamma))
        block = block_verdict(greedy_target, tokens, one_hot, u, 0.3)
        token = verify_block(greedy_target, tokens, one_hot, u, 0.3)
        eta = gen.random(gamma).tolist()
        assert accepted_jointly(block.block_accept_probs.tolist(), eta) == count_accepted(
            [1.0] * gamma, token.target_token_probs.tolist(), eta)
        assert block.recovered_tokens.tolist() == token.recovered_tokens.tolist()
        assert block.bonus_token == token.bonus_token


def test_accepted_jointly_takes_the_largest_passing_position():
    assert accepted_jointly([0.9, 0.1, 0.8], [0.95, 0.5, 0.2]) == 3  # later success after failures
    assert accepted_jointly([0.9, 0.1, 0.8], [0.5, 0.05, 0.9]) == 2
    assert accepted_jointly([0.9, 0.1, 0.8], [0.95, 0.5, 0.9]) == 0
    assert accepted_jointly([], []) == 0

"""tandem.math.sampling and tandem.math.acceptance: the accept/reject math, against Hugging Face and a float64 reference.

Three kinds of checks:
- `warp` means exactly what Hugging Face's temperature, top-k and top-p warpers mean;
- one whole cycle (`verify_block` + `count_accepted` + `output_tokens`) gives the same tokens as
  a float64 numpy reference of modified rejection sampling, case by case;
- statistically, the cycle's output tokens follow the target distribution (chi-square), with
  negative controls that show the same test rejects a wrong procedure.
"""

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from tandem.math.acceptance import count_accepted, output_tokens, verified_tokens
from tandem.math.params import SamplingParams
from tandem.math.sampling import Verdict, residual, sample, verify_block, verify_greedy, warp, warp_rows

P_MIN = 1e-3  # chi-square p-value below which we call the distributions different


# --- warp ------------------------------------------------------------------------------------


def hf_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Hugging Face's sampling chain: temperature → top-k → top-p, then softmax."""
    input_ids = torch.zeros((logits.shape[0], 1), dtype=torch.long)  # unused by the warpers
    scores = TemperatureLogitsWarper(float(temperature))(input_ids, logits.clone())
    if top_k > 0:
        scores = TopKLogitsWarper(top_k)(input_ids, scores)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(input_ids, scores)
    return scores.softmax(-1)


WARP_CASES = [
    # (temperature, top_k, top_p)
    (1.0, 0, 1.0),  # untouched softmax
    (0.7, 0, 1.0),  # temperature only
    (1.5, 5, 1.0),  # top-k only
    (1.0, 1, 1.0),  # top-k 1: one-hot of the max
    (1.0, 500, 1.0),  # k larger than V keeps everything
    (1.0, 0, 0.9),  # top-p only
    (0.8, 0, 0.5),
    (0.5, 10, 0.8),  # all three
    (2.0, 40, 0.95),
    (1.3, 3, 0.3),
    (1.0, 0, 0.0),  # top-p 0 keeps only the most likely token
    (1.0, 500, 0.99),
]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("temperature,top_k,top_p", WARP_CASES)
def test_warp_matches_hugging_face(seed, temperature, top_k, top_p):
    gen = torch.Generator().manual_seed(seed)
    vocab = [50, 77, 100][seed]
    logits = torch.randn(4, vocab, generator=gen) * 3.0  # [B, V]
    got = warp(logits, SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p))
    want = hf_probs(logits, temperature, top_k, top_p)
    assert got.dtype == torch.float32 and got.shape == logits.shape
    assert torch.equal(got > 0, want > 0), "kept tokens differ from Hugging Face's"
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(got.sum(-1), torch.ones(4), rtol=0, atol=1e-5)


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 3, 1.0), (1.0, 5, 1.0), (0.9, 4, 0.9), (1.0, 0, 0.6)])
def test_warp_matches_hugging_face_with_ties(temperature, top_k, top_p):
    """Integer logits: many ties at the top-k boundary (both keep every tied token)."""
    gen = torch.Generator().manual_seed(7)
    logits = torch.randint(-3, 4, (6, 64), generator=gen).float()  # [B, V], 7 distinct values
    got = warp(logits, SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p))
    want = hf_probs(logits, temperature, top_k, top_p)
    assert torch.equal(got > 0, want > 0)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    if top_p == 1.0:
        # Ties at the k-th value are all kept, so at least k tokens survive.
        assert ((got > 0).sum(-1) >= top_k).all()


def test_warp_top_k_keeps_ties_explicitly():
    logits = torch.tensor([[1.0, 3.0, 2.0, 3.0, 2.0, 0.0]])
    got = warp(logits, SamplingParams(top_k=2))
    assert (got > 0).tolist() == [[False, True, False, True, False, False]]
    got = warp(logits, SamplingParams(top_k=3))  # the 3rd value (2.0) is tied: both kept
    assert (got > 0).tolist() == [[False, True, True, True, True, False]]


def test_warp_works_on_any_leading_shape():
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 3, 40, generator=gen)
    params = SamplingParams(temperature=0.8, top_k=10, top_p=0.9)
    flat = warp(logits.reshape(6, 40), params).reshape(2, 3, 40)
    torch.testing.assert_close(warp(logits, params), flat, rtol=0, atol=0)
    one = warp(logits[1, 2], params)  # [V]
    torch.testing.assert_close(one, flat[1, 2], rtol=0, atol=0)


def test_warp_accepts_half_precision_logits():
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(3, 50, generator=gen).to(torch.bfloat16)
    got = warp(logits, SamplingParams(temperature=0.9, top_k=20, top_p=0.9))
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, hf_probs(logits.float(), 0.9, 20, 0.9), rtol=1e-5, atol=1e-7)


def test_warp_greedy_is_one_hot_of_first_argmax():
    logits = torch.tensor(
        [
            [0.0, 2.0, 1.0, 2.0],  # tie between 1 and 3: first wins
            [5.0, 5.0, 5.0, 5.0],  # all tied: index 0
            [-1.0, -3.0, -0.5, -2.0],
        ]
    )
    got = warp(logits, SamplingParams(temperature=0.0, top_k=2, top_p=0.5))  # k, p irrelevant
    want = torch.tensor([[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]])
    assert got.dtype == torch.float32
    assert torch.equal(got, want)
    assert SamplingParams(temperature=0.0).greedy and not SamplingParams().greedy


def test_warp_greedy_random_logits():
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(16, 60, generator=gen)
    got = warp(logits, SamplingParams(temperature=0.0))
    assert torch.equal(got.argmax(-1), logits.argmax(-1))
    assert torch.equal(got.sum(-1), torch.ones(16))
    assert torch.equal((got == 1).sum(-1), torch.ones(16, dtype=torch.long))


def test_warp_rows_gives_each_row_what_warp_gives_it_alone():
    """One call for rows of different temperatures, top-k and top-p (greedy rows among them),
    bit for bit what `warp` gives each row with its own parameters; ties included."""
    gen = torch.Generator().manual_seed(11)
    cases = [(0.0, 0, 1.0), *WARP_CASES, (0.0, 3, 0.5)]
    logits = torch.cat([torch.randn(len(cases), 90, generator=gen) * 3,
                        torch.randint(-3, 4, (len(cases), 90), generator=gen).float()])  # [2C, V]
    params = [SamplingParams(*case) for case in cases] * 2
    got = warp_rows(logits, [p.temperature for p in params], [p.top_k for p in params], [p.top_p for p in params])
    for row, p, probs in zip(logits, params, got):
        assert torch.equal(probs, warp(row, p))


# --- sample ----------------------------------------------------------------------------------


def test_sample_grid_reproduces_probabilities():
    probs = torch.tensor([0.1, 0.0, 0.25, 0.05, 0.0, 0.3, 0.3, 0.0])
    n = 10_000
    u = (torch.arange(n, dtype=torch.float64) + 0.5) / n  # evenly spread over [0, 1)
    ids = sample(probs.expand(n, -1), u)
    counts = torch.bincount(ids, minlength=8).double()
    assert (counts[probs == 0] == 0).all()
    assert torch.all((counts - n * probs.double()).abs() <= 1.0 + 1e-9), counts


def test_sample_unnormalized_probabilities():
    weights = torch.tensor([2.0, 0.0, 6.0, 0.0, 12.0])  # total 20
    n = 2_000
    u = (torch.arange(n, dtype=torch.float64) + 0.5) / n
    counts = torch.bincount(sample(weights.expand(n, -1), u), minlength=5).double()
    want = n * weights.double() / weights.sum()
    assert torch.all((counts - want).abs() <= 1.0 + 1e-9), counts
    # Scaling the weights changes nothing.
    torch.testing.assert_close(sample(weights.expand(n, -1) * 1e-3, u), sample(weights.expand(n, -1), u))


def test_sample_never_draws_a_zero_probability_token():
    probs = torch.tensor([0.0, 0.0, 0.4, 0.0, 0.6, 0.0, 0.0])
    u_edges = torch.tensor([0.0, 2.0**-53, 0.4 - 1e-12, 0.4, 0.4 + 1e-12, 0.5, 1 - 2.0**-53], dtype=torch.float64)
    ids = sample(probs.expand(len(u_edges), -1), u_edges)
    assert set(ids.tolist()) <= {2, 4}
    assert ids[0] == 2 and ids[-1] == 4  # u = 0 → first nonzero; largest u < 1 → last nonzero
    gen = torch.Generator().manual_seed(11)
    probs = torch.rand(200, 30, generator=gen) * (torch.rand(200, 30, generator=gen) < 0.3)
    probs[:, 7] += 0.01  # every row has some mass
    ids = sample(probs, torch.rand(200, dtype=torch.float64, generator=gen))
    assert (probs.gather(-1, ids[:, None]) > 0).all()


def test_sample_batch_shapes():
    gen = torch.Generator().manual_seed(12)
    probs = torch.rand(3, 4, 10, generator=gen)
    u = torch.rand(3, 4, dtype=torch.float64, generator=gen)
    ids = sample(probs, u)
    assert ids.shape == (3, 4) and ids.dtype == torch.int64
    for i in range(3):
        for j in range(4):
            assert int(sample(probs[i, j], u[i, j])) == ids[i, j]
    scalar = sample(probs[0, 0], torch.tensor(0.3, dtype=torch.float64))
    assert scalar.shape == ()
    assert sample(probs[:, :, :], u.float()).shape == (3, 4)  # float32 uniforms too


def test_sample_matches_float64_inverse_cdf():
    gen = torch.Generator().manual_seed(13)
    probs = torch.rand(500, 20, generator=gen)
    u = torch.rand(500, dtype=torch.float64, generator=gen)
    p = probs.double().numpy()
    cdf = np.cumsum(p, -1)
    want = (cdf <= (u.numpy() * cdf[:, -1])[:, None]).sum(-1)  # first index with cdf > u·total
    assert sample(probs, u).tolist() == want.tolist()


# --- residual --------------------------------------------------------------------------------


def residual_ref(target: np.ndarray, draft: np.ndarray) -> np.ndarray:
    diff = np.maximum(target - draft, 0.0)
    mass = diff.sum(-1, keepdims=True)
    return np.where(mass > 0, diff / np.where(mass > 0, mass, 1.0), target)


def random_dist(gen: np.random.Generator, shape, zero_frac=0.3) -> np.ndarray:
    """Random float32 distributions over the last dim, some entries exactly zero."""
    x = gen.random(shape) * (gen.random(shape) >= zero_frac)
    x[..., 0] += (x.sum(-1) == 0)  # never an all-zero row
    return (x / x.sum(-1, keepdims=True)).astype(np.float32)


def test_residual_matches_float64_reference():
    gen = np.random.default_rng(20)
    target = random_dist(gen, (300, 25))
    draft = random_dist(gen, (300, 25))
    got = residual(torch.from_numpy(target), torch.from_numpy(draft))
    want = residual_ref(target.astype(np.float64), draft.astype(np.float64))
    assert got.dtype == torch.float32 and got.shape == (300, 25)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-7)
    assert np.array_equal(got.numpy() > 0, target > draft)
    np.testing.assert_allclose(got.sum(-1).numpy(), 1.0, atol=1e-5)


def test_residual_of_identical_distributions_is_the_target():
    gen = np.random.default_rng(21)
    target = torch.from_numpy(random_dist(gen, (5, 12)))
    assert torch.equal(residual(target, target.clone()), target)
    # Mixed batch: one row identical, one not.
    draft = torch.stack([target[0], torch.from_numpy(random_dist(gen, (12,)))])
    got = residual(target[:2], draft)
    assert torch.equal(got[0], target[0])
    np.testing.assert_allclose(got[1].numpy(), residual_ref(target[1].double().numpy(), draft[1].double().numpy()),
                               rtol=1e-5, atol=1e-7)


def test_residual_does_not_modify_inputs():
    target = torch.tensor([[0.5, 0.3, 0.2]])
    draft = torch.tensor([[0.2, 0.3, 0.5]])
    t0, d0 = target.clone(), draft.clone()
    residual(target, draft)
    assert torch.equal(target, t0) and torch.equal(draft, d0)


def test_residual_one_hot_draft_removes_the_drafted_token():
    """docs/exactness.md, "Token-level verification": a one-hot (argmax) draft's residual is the
    target without that token."""
    target = torch.tensor([0.1, 0.4, 0.3, 0.2])
    draft = torch.tensor([0.0, 1.0, 0.0, 0.0])
    torch.testing.assert_close(residual(target, draft), torch.tensor([1 / 6, 0.0, 3 / 6, 2 / 6]))


# --- one cycle against a float64 reference ----------------------------------------------------


def ref_inverse_cdf(weights: np.ndarray, u: float) -> tuple[int, float]:
    """First index whose cumulative weight exceeds u·total; and u's distance to the nearest
    CDF boundary, relative to the total (small means float32 rounding could flip the draw)."""
    cdf = np.cumsum(weights)
    threshold = u * cdf[-1]
    idx = next(j for j in range(len(cdf)) if cdf[j] > threshold)
    return idx, float(np.min(np.abs(cdf - threshold)) / cdf[-1])


def ref_cycle(target, draft, draft_tokens, u_accept, u_recovered, u_bonus):
    """Modified rejection sampling, one cycle, in float64. Returns (output tokens, margin)."""
    gamma = len(draft_tokens)
    margin = np.inf
    for i, tok in enumerate(draft_tokens):
        t, d = target[i, tok], draft[i, tok]
        margin = min(margin, abs(u_accept[i] - t / d))
        if u_accept[i] < t / d:
            continue
        diff = np.maximum(target[i] - draft[i], 0.0)
        weights = diff if diff.sum() > 0 else target[i]
        last, m = ref_inverse_cdf(weights, u_recovered[i])
        return [*draft_tokens[:i], last], min(margin, m)
    bonus, m = ref_inverse_cdf(target[gamma], u_bonus)
    return [*draft_tokens, bonus], min(margin, m)


def product_cycle(target_probs, draft_probs, draft_tokens, u_accept, u_recovered, u_bonus):
    """The product's cycle, split between verifier and orchestrator as in production."""
    verdict = verify_block(
        target_probs, torch.tensor(draft_tokens, dtype=torch.long), draft_probs,
        torch.tensor(u_recovered, dtype=torch.float64), float(u_bonus),
    )
    assert isinstance(verdict, Verdict)
    draft_token_probs = [float(draft_probs[i, t]) for i, t in enumerate(draft_tokens)]
    accepted = count_accepted(draft_token_probs, verdict.target_token_probs.tolist(), list(u_accept))
    return output_tokens(draft_tokens, accepted, verdict.recovered_tokens.tolist(), verdict.bonus_token), accepted


def test_cycle_matches_float64_reference():
    gen = np.random.default_rng(30)
    compared = 0
    cases = 1500
    lengths = set()
    for case in range(cases):
        vocab = int(gen.integers(2, 24))
        gamma = int(gen.integers(0, 6))
        target = random_dist(gen, (gamma + 1, vocab), zero_frac=gen.choice([0.0, 0.3, 0.6]))
        if case % 5 == 0:
            draft = target[:gamma].copy()  # identical rows: residual empty, never rejected
        else:
            draft = random_dist(gen, (gamma, vocab), zero_frac=gen.choice([0.0, 0.3, 0.6]))
        if case % 7 == 0 and gamma:
            draft[0] = np.eye(vocab, dtype=np.float32)[gen.integers(vocab)]  # one-hot draft row
        d64 = draft.astype(np.float64)
        draft_tokens = [int(gen.choice(vocab, p=d64[i] / d64[i].sum())) for i in range(gamma)]
        u_accept, u_recovered, u_bonus = gen.random(gamma), gen.random(gamma), float(gen.random())
        want, margin = ref_cycle(target.astype(np.float64), draft.astype(np.float64), draft_tokens,
                                 u_accept, u_recovered, u_bonus)
        got, accepted = product_cycle(torch.from_numpy(target), torch.from_numpy(draft), draft_tokens,
                                      u_accept, u_recovered, u_bonus)
        assert len(got) == accepted + 1 and got[:accepted] == draft_tokens[:accepted]
        if margin < 1e-6:
            continue  # a float32 rounding could legitimately flip this one
        compared += 1
        lengths.add(len(got))
        assert got == want, (case, target, draft, draft_tokens, u_accept, u_recovered, u_bonus)
    assert compared >= 0.97 * cases
    assert lengths >= {1, 2, 3, 4, 5, 6}  # every outcome from first-rejection to all-accepted


def test_cycle_with_gamma_zero_is_plain_target_sampling():
    target = torch.tensor([[0.0, 0.5, 0.0, 0.5]])
    for u_bonus, want in [(0.1, 1), (0.7, 3), (0.0, 1), (1 - 2.0**-53, 3)]:
        verdict = verify_block(target, torch.zeros(0, dtype=torch.long), torch.zeros(0, 4),
                               torch.zeros(0, dtype=torch.float64), u_bonus)
        assert verdict.target_token_probs.shape == (0,) and verdict.recovered_tokens.shape == (0,)
        assert verdict.bonus_token == want
        assert output_tokens([], count_accepted([], [], []), [], verdict.bonus_token) == [want]


def test_verify_block_types_and_token_probs():
    target = torch.tensor([[0.1, 0.2, 0.7], [0.5, 0.5, 0.0], [0.3, 0.3, 0.4]])
    draft = torch.tensor([[0.2, 0.2, 0.6], [0.1, 0.1, 0.8]])
    verdict = verify_block(target, torch.tensor([2, 2]), draft, torch.tensor([0.5, 0.5], dtype=torch.float64), 0.9)
    assert verdict.target_token_probs.dtype == torch.float32
    assert verdict.target_token_probs.tolist() == pytest.approx([0.7, 0.0])
    assert verdict.recovered_tokens.dtype == torch.int64 and verdict.recovered_tokens.shape == (2,)
    assert isinstance(verdict.bonus_token, int) and verdict.bonus_token == 2
    # Position 0: residual = norm([0, 0, 0.1]) → token 2. Position 1: norm([0.4, 0.4, 0]) → u 0.5 → 1.
    assert verdict.recovered_tokens.tolist() == [2, 1]


def test_verify_block_is_row_wise():
    """Concatenating blocks into one call gives each block's per-position answers; the bonus is a
    plain draw from the last target row. The statistical tests below rely on this to batch."""
    gen = np.random.default_rng(31)
    gamma, vocab, blocks = 3, 9, 20
    targets = [torch.from_numpy(random_dist(gen, (gamma + 1, vocab))) for _ in range(blocks)]
    drafts = [torch.from_numpy(random_dist(gen, (gamma, vocab))) for _ in range(blocks)]
    tokens = [torch.from_numpy(gen.integers(0, vocab, gamma)) for _ in range(blocks)]
    u_rec = [torch.from_numpy(gen.random(gamma)) for _ in range(blocks)]
    u_bonus = gen.random(blocks)
    singles = [verify_block(t, k, d, u, float(b)) for t, k, d, u, b in zip(targets, tokens, drafts, u_rec, u_bonus)]
    big = verify_block(torch.cat([t[:gamma] for t in targets] + [targets[0][gamma:]]), torch.cat(tokens),
                       torch.cat(drafts), torch.cat(u_rec), 0.5)
    assert torch.equal(big.target_token_probs, torch.cat([s.target_token_probs for s in singles]))
    assert torch.equal(big.recovered_tokens, torch.cat([s.recovered_tokens for s in singles]))
    bonus = sample(torch.stack([t[gamma] for t in targets]), torch.from_numpy(u_bonus))
    assert bonus.tolist() == [s.bonus_token for s in singles]


# --- count_accepted and output_tokens ---------------------------------------------------------


def test_count_accepted_all_accepted():
    assert count_accepted([0.5, 0.2, 0.9], [0.5, 0.3, 0.9], [0.99, 0.99, 0.999]) == 3  # target ≥ draft
    assert count_accepted([0.5, 0.2], [0.25, 0.1], [0.49, 0.0]) == 2  # u below the ratio 0.5


def test_count_accepted_rejections():
    assert count_accepted([1.0], [0.0], [0.0]) == 0  # draft prob 1, target prob 0: always rejected
    assert count_accepted([0.5, 0.5, 0.5], [0.5, 0.0, 0.5], [0.1, 0.0, 0.1]) == 1
    assert count_accepted([0.5, 0.2], [0.25, 0.1], [0.5, 0.0]) == 0  # u equal to the ratio rejects
    assert count_accepted([0.5, 0.2], [0.25, 0.1], [0.1, 0.5]) == 1
    assert count_accepted([0.8, 0.8, 0.8], [0.4, 0.4, 0.4], [0.1, 0.2, 0.6]) == 2  # stops at the first


def test_count_accepted_empty():
    assert count_accepted([], [], []) == 0


def test_output_tokens():
    assert output_tokens([5, 6, 7], 0, [1, 2, 3], 9) == [1]
    assert output_tokens([5, 6, 7], 2, [1, 2, 3], 9) == [5, 6, 3]
    assert output_tokens([5, 6, 7], 3, [1, 2, 3], 9) == [5, 6, 7, 9]
    assert output_tokens([], 0, [], 4) == [4]


def test_verified_tokens_count_the_rejected_one_but_not_what_follows():
    assert verified_tokens(0, 3) == 1 and verified_tokens(2, 3) == 3 and verified_tokens(3, 3) == 3
    assert verified_tokens(0, 0) == 0  # γ = 0 verifies no draft


# --- greedy ----------------------------------------------------------------------------------


def test_greedy_cycle_accepts_the_longest_matching_prefix():
    gen = torch.Generator().manual_seed(40)
    rng = np.random.default_rng(40)
    gamma, vocab = 5, 30
    greedy = SamplingParams(temperature=0.0)
    seen = set()
    for case in range(120):
        target_logits = torch.randn(gamma + 1, vocab, generator=gen)
        draft_logits = torch.randn(gamma, vocab, generator=gen)
        agree = case % (gamma + 1)  # the draft's argmax agrees with the target's for this many
        draft_logits[:agree] = target_logits[:agree] + 0.1 * torch.randn(agree, vocab, generator=gen)
        draft_logits[:agree].scatter_(-1, target_logits[:agree].argmax(-1, keepdim=True), 100.0)
        target_probs, draft_probs = warp(target_logits, greedy), warp(draft_logits, greedy)
        target_argmax = target_logits.argmax(-1).tolist()
        draft_tokens = sample(draft_probs, torch.from_numpy(rng.random(gamma))).tolist()
        assert draft_tokens == draft_logits.argmax(-1).tolist()
        expected = next((i for i in range(gamma) if draft_tokens[i] != target_argmax[i]), gamma)
        assert expected >= agree
        got, accepted = product_cycle(target_probs, draft_probs, draft_tokens,
                                      rng.random(gamma), rng.random(gamma), float(rng.random()))
        assert accepted == expected
        assert got == target_argmax[: accepted + 1]
        seen.add(accepted)
    assert seen == set(range(gamma + 1))


def test_verify_greedy_equals_verify_block_on_one_hot_distributions():
    gen = torch.Generator().manual_seed(41)
    rng = np.random.default_rng(41)
    greedy = SamplingParams(temperature=0.0)
    for gamma in (0, 1, 4):
        for _ in range(40):
            logits = torch.randn(gamma + 1, 12, generator=gen)
            logits[:, 3] = logits[:, 5]  # ties: the first index wins in both
            drafts = torch.randint(0, 12, (gamma,), generator=gen)
            drafts[: gamma // 2] = logits[: gamma // 2].argmax(-1)  # some agree
            one_hot = torch.nn.functional.one_hot(drafts, 12).float()
            full = verify_block(warp(logits, greedy), drafts, one_hot, torch.from_numpy(rng.random(gamma)),
                                float(rng.random()))
            fast = verify_greedy(logits, drafts)
            assert torch.equal(fast.target_token_probs, full.target_token_probs)
            assert torch.equal(fast.recovered_tokens, full.recovered_tokens)
            assert fast.bonus_token == full.bonus_token


# --- statistical exactness -------------------------------------------------------------------


def simulate(target_probs: torch.Tensor, draft_probs: torch.Tensor, n: int, seed: int,
             recover_from_target: bool = False):
    """Run n independent cycles of the full procedure.

    Drafts are drawn with `sample`, the verifier's answers come from `verify_block` (all n blocks
    in one call: it is row-wise, see test_verify_block_is_row_wise), the bonus from `sample` on
    the last target row, acceptance from `count_accepted`, the tokens from `output_tokens`.
    recover_from_target=True is a deliberately wrong procedure (recovered tokens drawn from the
    target instead of the residual), a negative control.
    Returns (list of output token lists, draft tokens [n, γ]).
    """
    gamma, vocab = draft_probs.shape
    gen = torch.Generator().manual_seed(seed)
    u_draft, u_accept, u_recovered = (torch.rand(n, gamma, dtype=torch.float64, generator=gen) for _ in range(3))
    u_bonus = torch.rand(n, dtype=torch.float64, generator=gen)
    drafts = draft_probs.expand(n, gamma, vocab)
    draft_tokens = sample(drafts, u_draft)  # [n, γ]
    draft_token_probs = drafts.gather(-1, draft_tokens[..., None]).squeeze(-1)  # [n, γ] float32
    verdict = verify_block(
        torch.cat([target_probs[:gamma].repeat(n, 1), target_probs[gamma:]]),
        draft_tokens.reshape(-1),
        torch.zeros(n * gamma, vocab) if recover_from_target else draft_probs.repeat(n, 1),
        u_recovered.reshape(-1),
        0.5,
    )
    target_token_probs = verdict.target_token_probs.reshape(n, gamma).tolist()
    recovered = verdict.recovered_tokens.reshape(n, gamma).tolist()
    bonus = sample(target_probs[gamma].expand(n, vocab), u_bonus).tolist()
    dt, dp, ua = draft_tokens.tolist(), draft_token_probs.tolist(), u_accept.tolist()
    outputs = []
    for k in range(n):
        accepted = count_accepted(dp[k], target_token_probs[k], ua[k])
        outputs.append(output_tokens(dt[k], accepted, recovered[k], bonus[k]))
    return outputs, draft_tokens


def chisquare_p(tokens, probs: np.ndarray) -> float:
    """Chi-square p-value of observed tokens against probs (cells of zero probability must be empty)."""
    counts = np.bincount(np.asarray(tokens, dtype=np.int64), minlength=len(probs))
    support = probs > 0
    assert counts[~support].sum() == 0, f"drew tokens of target probability 0: {counts}"
    expected = probs[support] / probs[support].sum() * counts.sum()
    return float(chisquare(counts[support], expected).pvalue)


def check_each_position(target_probs: torch.Tensor, draft_probs: torch.Tensor, n: int, seed: int):
    """Output token j, on the cycles that reach it, follows target_probs[j]; and each position is
    accepted with probability Σ min(target, draft)."""
    gamma = draft_probs.shape[0]
    outputs, _ = simulate(target_probs, draft_probs, n, seed)
    t64, d64 = target_probs.double().numpy(), draft_probs.double().numpy()
    for j in range(gamma + 1):
        reached = [out[j] for out in outputs if len(out) > j]
        assert len(reached) >= 300, "the setup gives too few samples at this position"
        p = chisquare_p(reached, t64[j])
        assert p > P_MIN, f"position {j}: output does not follow the target (p={p:.2e})"
        if j < gamma:
            beta = np.minimum(t64[j], d64[j]).sum()
            passed = sum(len(out) > j + 1 for out in outputs)
            sd = np.sqrt(len(reached) * beta * (1 - beta))
            assert abs(passed - len(reached) * beta) <= 5 * sd + 1e-9, (j, passed, len(reached), beta)
    return outputs


T_A = torch.tensor(
    [
        [0.30, 0.25, 0.15, 0.12, 0.10, 0.08],
        [0.05, 0.10, 0.40, 0.20, 0.15, 0.10],
        [0.20, 0.20, 0.20, 0.20, 0.10, 0.10],
        [0.10, 0.05, 0.05, 0.30, 0.30, 0.20],  # after the block: the bonus
    ]
)
D_A = torch.tensor(
    [
        [0.10, 0.40, 0.10, 0.20, 0.10, 0.10],
        [0.25, 0.05, 0.30, 0.10, 0.20, 0.10],
        [0.40, 0.10, 0.10, 0.10, 0.20, 0.10],
    ]
)
# Disjoint supports: the draft puts mass where the target has none and vice versa.
T_B = torch.tensor(
    [
        [0.30, 0.25, 0.20, 0.15, 0.10, 0.00, 0.00, 0.00],
        [0.00, 0.00, 0.50, 0.20, 0.10, 0.10, 0.10, 0.00],
        [0.10, 0.10, 0.10, 0.10, 0.20, 0.20, 0.20, 0.00],
        [0.00, 0.00, 0.00, 0.00, 0.25, 0.25, 0.25, 0.25],
    ]
)
D_B = torch.tensor(
    [
        [0.00, 0.10, 0.30, 0.10, 0.20, 0.20, 0.10, 0.00],
        [0.20, 0.20, 0.10, 0.10, 0.10, 0.00, 0.00, 0.30],
        [0.50, 0.30, 0.00, 0.00, 0.00, 0.00, 0.00, 0.20],
    ]
)


def test_exact_output_distribution_per_position():
    check_each_position(T_A, D_A, n=30_000, seed=100)


def test_exact_output_distribution_disjoint_supports():
    check_each_position(T_B, D_B, n=40_000, seed=101)


def test_exact_output_distribution_one_hot_draft():
    """docs/exactness.md, "Token-level verification": drafting the argmax while the request samples
    is exact too."""
    one_hot_draft = torch.nn.functional.one_hot(torch.tensor([1, 2, 0]), 6).float()
    check_each_position(T_A, one_hot_draft, n=30_000, seed=102)


def test_identical_draft_is_always_accepted():
    outputs, draft_tokens = simulate(T_A, T_A[:3].clone(), n=5_000, seed=103)
    assert all(len(out) == 4 for out in outputs)
    assert [out[:3] for out in outputs] == draft_tokens.tolist()
    assert chisquare_p([out[3] for out in outputs], T_A[3].double().numpy()) > P_MIN


def test_exact_output_stream_position_independent():
    """Position-independent distributions: the stream of all cycles' outputs is i.i.d. target,
    token by token and in (non-overlapping) pairs."""
    target = torch.tensor([0.05, 0.30, 0.10, 0.20, 0.0, 0.15, 0.20])
    draft = torch.tensor([0.25, 0.05, 0.20, 0.10, 0.15, 0.05, 0.20])
    gamma = 3
    outputs, _ = simulate(target.expand(gamma + 1, -1), draft.expand(gamma, -1), n=20_000, seed=104)
    stream = np.array([t for out in outputs for t in out])
    t64 = target.double().numpy()
    assert chisquare_p(stream, t64) > P_MIN
    for j in range(gamma + 1):
        assert chisquare_p([out[j] for out in outputs if len(out) > j], t64) > P_MIN
    pairs = stream[: len(stream) // 2 * 2].reshape(-1, 2)
    assert chisquare_p(pairs[:, 0] * 7 + pairs[:, 1], np.outer(t64, t64).ravel()) > P_MIN


def test_chi_square_rejects_draft_tokens_as_output():
    """Negative control: the same check fails when the output is just the drafted tokens."""
    outputs, draft_tokens = simulate(T_A, D_A, n=30_000, seed=100)
    assert chisquare_p([out[0] for out in outputs], T_A[0].double().numpy()) > P_MIN
    counts = np.bincount(draft_tokens[:, 0].numpy(), minlength=6)
    assert chisquare(counts, T_A[0].double().numpy() * counts.sum()).pvalue < P_MIN


def test_chi_square_rejects_recovery_from_the_target():
    """Negative control: recovered tokens drawn from the target instead of the residual (a
    classic bug) give a detectably wrong output distribution."""
    outputs, _ = simulate(T_A, D_A, n=30_000, seed=100, recover_from_target=True)
    assert chisquare_p([out[0] for out in outputs], T_A[0].double().numpy()) < P_MIN


def test_count_accepted_refuses_lists_of_different_lengths():
    """A truncated verifier reply must fail loudly, never accept untested positions."""
    with pytest.raises(ValueError):
        count_accepted([0.5] * 3, [0.5, 0.0, 0.0], [0.1])

"""tandem.math.rng: counter-based uniforms keyed by (seed, position, purpose)."""

from enum import IntEnum

import numpy as np
import pytest
from scipy.stats import kstest

from tandem.math.rng import (CYCLE_KEYS, PURPOSE_BITS, Purpose, _splitmix64, check_purposes, cycle_uniforms, uniform,
                             uniforms)

P_MIN = 1e-3


def test_splitmix64_known_answers():
    """The mixer is SplitMix64 (Steele et al.; Vigna's reference splitmix64.c): _splitmix64(x) is
    the first output of a generator seeded with x. The reference sequence from state 0:"""
    gamma = 0x9E3779B97F4A7C15
    assert _splitmix64(0) == 0xE220A8397B1DCDAF
    assert _splitmix64(gamma) == 0x6E789E6AA1B965F4
    assert _splitmix64(2 * gamma % 2**64) == 0x06C45D188009454F


def test_values_are_pinned():
    """Sessions are resumed from Redis on any replica, possibly after an upgrade: the numbers
    must never change. If this fails, the RNG changed and resumed sessions would diverge."""
    assert uniform(0, 0, Purpose.DRAFT) == 0.03401170130434639
    assert uniform(42, 1000, Purpose.BONUS) == 0.9172256013921495
    assert uniform(2**64 - 1, 7, Purpose.ACCEPT) == 0.1604421406248715
    assert uniform(123456789, 31, Purpose.RECOVERED) == 0.6926510506721784
    assert [int(p) for p in Purpose] == [1, 2, 3, 4, 5, 6, 7]  # part of the key: never renumber


def test_a_purpose_that_does_not_fit_its_bits_is_refused():
    """A ninth purpose would spill into the position's bits: purpose 9 at an odd position is
    DRAFT's key there, another purpose's numbers reused without a word. check_purposes (run on
    Purpose at import) refuses it, and 0 (the key of no purpose)."""
    check_purposes(Purpose)
    assert (5 << PURPOSE_BITS | 9) == (5 << PURPOSE_BITS | Purpose.DRAFT)  # what it guards against
    for value in (8, 0):
        wider = IntEnum("Wider", {p.name: int(p) for p in Purpose} | {"NEW": value})
        with pytest.raises(ValueError, match=f"NEW = {value} does not fit the key's 3 purpose bits"):
            check_purposes(wider)


def _reference_splitmix64(x: int) -> int:
    m = 2**64
    z = (x + 0x9E3779B97F4A7C15) % m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % m
    return z ^ (z >> 31)


def test_matches_documented_key_construction():
    """uniform = top 53 bits of splitmix64(splitmix64(seed) XOR (position << 3 | purpose))."""
    for seed, position, purpose in [(0, 0, Purpose.DRAFT), (5, 17, Purpose.BONUS), (2**64 - 1, 123, Purpose.ACCEPT)]:
        key = _reference_splitmix64(_reference_splitmix64(seed) ^ (position << 3 | int(purpose)))
        assert uniform(seed, position, purpose) == (key >> 11) / 2.0**53


@pytest.mark.parametrize("seed", [0, 1, 42, 2**32 + 7, 2**63, 2**64 - 1])
def test_in_unit_interval_and_deterministic(seed):
    for purpose in Purpose:
        values = uniforms(seed, 0, 500, purpose)
        assert all(isinstance(v, float) and 0.0 <= v < 1.0 for v in values)
        assert values == uniforms(seed, 0, 500, purpose)  # same key, same value
        assert uniform(seed, 123, purpose) == uniform(seed, 123, purpose)


def test_large_and_large_position_keys_work():
    seed = 2**64 - 1
    a = uniform(seed, 0, Purpose.ACCEPT)
    b = uniform(seed, 10**12, Purpose.ACCEPT)
    assert 0.0 <= a < 1.0 and 0.0 <= b < 1.0 and a != b
    assert uniform(seed, 0, Purpose.ACCEPT) == a


def test_uniforms_equals_uniform_calls():
    for seed, start, count, purpose in [(0, 0, 10, Purpose.DRAFT), (7, 1000, 33, Purpose.BONUS),
                                        (2**64 - 1, 5, 4, Purpose.RECOVERED), (3, 9, 0, Purpose.ACCEPT)]:
        assert uniforms(seed, start, count, purpose) == [uniform(seed, start + i, purpose) for i in range(count)]
    assert uniforms(1, 5, 0, Purpose.ACCEPT) == []


def test_different_keys_give_different_values():
    values = {}
    for seed in range(10):
        for position in range(200):
            for purpose in Purpose:
                values[(seed, position, purpose)] = uniform(seed, position, purpose)
    assert len(set(values.values())) == len(values)  # all 8000 distinct
    # One coordinate at a time, explicitly.
    assert uniform(1, 10, Purpose.DRAFT) != uniform(2, 10, Purpose.DRAFT)
    assert uniform(1, 10, Purpose.DRAFT) != uniform(1, 11, Purpose.DRAFT)
    assert uniform(1, 10, Purpose.DRAFT) != uniform(1, 10, Purpose.ACCEPT)


def test_overlapping_windows_agree():
    """A window starting later reads the same numbers at the same absolute positions (a replayed
    or shifted cycle draws what it drew before)."""
    a = uniforms(9, 100, 20, Purpose.ACCEPT)
    b = uniforms(9, 110, 20, Purpose.ACCEPT)
    assert a[10:] == b[:10]


@pytest.mark.parametrize("purpose", list(Purpose))
def test_roughly_uniform(purpose):
    n = 20_000
    values = np.array(uniforms(1234, 0, n, purpose))
    assert abs(values.mean() - 0.5) < 5 * np.sqrt(1 / 12 / n)
    assert abs(values.var() - 1 / 12) < 0.005
    assert kstest(values, "uniform").pvalue > P_MIN
    counts = np.bincount((values * 10).astype(int), minlength=10)
    assert counts.min() > n / 10 - 5 * np.sqrt(n * 0.09)


def test_uniform_across_seeds_at_one_position():
    values = np.array([uniform(seed, 0, Purpose.DRAFT) for seed in range(20_000)])
    assert kstest(values, "uniform").pvalue > P_MIN


def test_no_linear_correlation_between_purposes_positions_and_seeds():
    """The exactness argument needs the numbers behind different events to be independent; at
    least they must not be visibly correlated."""
    n = 20_000
    bound = 5 / np.sqrt(n)
    by_purpose = {p: np.array(uniforms(77, 0, n, p)) for p in Purpose}
    for p in Purpose:
        for q in Purpose:
            if p < q:
                assert abs(np.corrcoef(by_purpose[p], by_purpose[q])[0, 1]) < bound, (p, q)
    accept = by_purpose[Purpose.ACCEPT]
    assert abs(np.corrcoef(accept[:-1], accept[1:])[0, 1]) < bound  # neighbouring positions
    other_seed = np.array(uniforms(78, 0, n, Purpose.ACCEPT))
    assert abs(np.corrcoef(accept, other_seed)[0, 1]) < bound  # neighbouring seeds


def test_tree_keys_are_pinned_and_disjoint_between_trees():
    assert cycle_uniforms(7, 100, 3, Purpose.TREE_ACCEPT) == [0.41005171723586176, 0.803487061857289,
                                                               0.5267205345329058]
    # Trees at successive positions never share a key, however many nodes they have.
    assert cycle_uniforms(7, 101, 1, Purpose.TREE_ACCEPT)[0] not in cycle_uniforms(7, 100, CYCLE_KEYS,
                                                                                 Purpose.TREE_ACCEPT)
    with pytest.raises(ValueError, match="at most"):
        cycle_uniforms(7, 100, CYCLE_KEYS + 1, Purpose.TREE_ACCEPT)

"""A cost against its tokens (tandem.math.fit): the decayed line, its slope shrunk by its own
error, a worker's pass curve and a pass's cost along it."""

import random

import pytest

from tandem.math.fit import LinearFit, PassCost, PassCurve

# The shipped target's passes on the 2-core test machine (benchmarks/network.py's pass table, ms).
SHIPPED = {1: 5.0, 2: 6.3, 3: 7.2, 4: 8.2, 5: 9.0, 6: 9.1, 7: 10.1, 8: 9.3, 9: 10.2, 12: 10.4, 16: 11.5, 24: 13.9}


def test_a_slope_within_its_own_error_of_nothing_is_shrunk_to_nothing_and_a_measured_one_is_kept():
    rng = random.Random(1)
    noise = LinearFit()  # a flat cost over x 2 and 2.5, noisy: the fitted slope is noise
    for _ in range(200):
        noise.add(2 + rng.choice((0.0, 0.5)), 1.0 + rng.gauss(0, 0.4), 0.9)
    assert noise.line()[1] > 0.1  # unshrunk, the noise is priced per x
    assert noise.line(shrunk=True) == (pytest.approx(noise.sy / noise.n), 0.0)
    real = LinearFit()  # 0.5 a unit of x, measured over x 2–4
    for _ in range(200):
        x = rng.choice((2, 3, 4))
        real.add(x, 1.0 + 0.5 * x + rng.gauss(0, 0.1), 0.9)
    assert real.line(shrunk=True)[1] == pytest.approx(0.5, abs=0.1)
    assert real.line(shrunk=True)[1] == pytest.approx(real.line()[1], rel=0.02)
    exact = LinearFit()  # two points, no residual: nothing to shrink by
    exact.add(1, 3.0, 1.0)
    exact.add(2, 5.0, 1.0)
    assert exact.line(shrunk=True) == pytest.approx((1.0, 2.0))


def test_a_pass_curve_runs_straight_between_its_points_never_falls_and_goes_on_from_the_last_two():
    curve = PassCurve.of(SHIPPED)
    assert curve.at(3) == 7.2 and curve.at(3.5) == pytest.approx(7.7)
    assert curve.at(8) == 10.1  # timed below 7 tokens' pass: taken as 7's
    assert curve.at(32) == pytest.approx(13.9 + 8 * (13.9 - 11.5) / 8)  # on from 16 and 24
    assert curve.at(0.5) == pytest.approx(5.0 - 0.5 * 1.3)
    assert not PassCurve.of({}) and not PassCurve.of({4: 8.0})  # a worker that timed nothing


def test_a_pass_is_priced_along_its_workers_curve_at_the_speed_the_live_passes_run():
    """A lone session drafting γ 2–3 runs passes of 3–4 tokens: a line through them extends their
    slope (about a millisecond a token on the shipped target) to every longer block, where the
    passes cost a fraction of that per token; the curve scaled to the live passes does not."""
    live = {3: 7.2 * 1.25, 4: 8.2 * 1.25}  # the passes 1.25× as long on the live machine
    curved, line = PassCost(PassCurve.of(SHIPPED)), PassCost()
    for _ in range(10):
        for tokens, ms in live.items():
            curved.add(tokens, ms, 0.9)
            line.add(tokens, ms, 0.9)
    for tokens, ms in live.items():
        assert curved.at(tokens) == pytest.approx(ms, abs=0.05) and line.at(tokens) == pytest.approx(ms, abs=0.05)
    assert curved.at(9) == pytest.approx(10.2 * 1.25, abs=0.05)
    assert line.at(9) == pytest.approx(8.2 * 1.25 + 5 * 1.25, abs=0.05)  # 1.25 ms a token on from 4
    assert PassCost(PassCurve.of(SHIPPED)).n == 0  # nothing live yet: not priced


def test_passes_slowed_by_a_busy_host_cost_more_for_every_token_not_by_a_constant():
    """Under load the verifier's passes ran 1.6× its curve (the other core busy): each token they
    add costs 1.6× the curve's too, which a constant excess over the curve would not price."""
    curve = PassCurve.of(SHIPPED)
    slow = PassCost(curve)
    for _ in range(20):
        for tokens in (16, 20, 24):
            slow.add(tokens, 1.6 * curve.at(tokens), 0.9)
    per_token = (slow.at(24) - slow.at(16)) / 8
    assert per_token == pytest.approx(1.6 * (13.9 - 11.5) / 8)

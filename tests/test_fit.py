"""The cost lines: a decayed least-squares line, and one whose slope has a longer memory."""

import random

import pytest

from tandem.math.fit import CostLine, LinearFit

TRUE = (10.0, 0.5)  # a pass: 10 ms + 0.5 ms a token


def cost(x: float, rng: random.Random, intercept: float = TRUE[0]) -> float:
    return intercept + TRUE[1] * x + rng.gauss(0.0, 2.0)


def test_a_slope_through_the_mean_keeps_the_line_a_cost():
    fit = LinearFit()
    for x in (2.0, 4.0, 6.0):
        fit.add(x, 3.0 * x, 1.0)
    assert fit.line() == pytest.approx((0.0, 3.0))
    assert fit.line(slope=1.0) == pytest.approx((8.0, 1.0))  # through the mean (4, 12)
    assert fit.line(slope=5.0) == pytest.approx((0.0, 3.0))  # never below nothing at x = 0


def test_a_cost_lines_slope_outlasts_a_stretch_at_one_x():
    """Passes of many sizes, then a cohort's passes of 8 tokens ± 1 for 200 calls: the short
    memory's own slope is that stretch's noise, the cost line's stays the hardware's; then the
    load doubles the fixed cost and the level follows within a few dozen calls."""
    rng = random.Random(0)
    line, short = CostLine(), LinearFit()
    for _ in range(300):
        x = rng.choice([2, 4, 8, 12, 16])
        line.add(x, cost(x, rng), 0.9, 0.998)
    errors = []
    for _ in range(200):
        x = 8 + rng.choice([-1, 0, 0, 1])
        y = cost(x, rng)
        line.add(x, y, 0.9, 0.998)
        short.add(x, y, 0.9)
        errors.append((abs(line.line()[1] - TRUE[1]), abs(short.line()[1] - TRUE[1])))
    assert max(e for e, _ in errors) < 0.15
    assert max(e for _, e in errors) > 1.0  # what the short memory alone made of it
    for _ in range(40):
        x = 8 + rng.choice([-1, 0, 1])
        line.add(x, cost(x, rng, intercept=20.0), 0.9, 0.998)
    assert line.at(8) == pytest.approx(20.0 + 4.0, abs=2.0)
    assert line.line()[1] == pytest.approx(TRUE[1], abs=0.15)

"""Comparing a sweep's modes across rounds (tandem.bench.pairing), and the machine's speed probe
(tandem.bench.speed) in a real process."""

import math
import time

import pytest

from tandem.bench.pairing import at_speed, held_out_best, paired, speed_slope
from tandem.bench.speed import SpeedProbe


def row(mode, repeat, tokens_per_s, speed_us=None, point=0):
    return {"mode": mode, "repeat": repeat, "aggregate_tokens_per_s": tokens_per_s, "speed_us": speed_us,
            "point": point}


def test_paired_ratios_are_a_geometric_mean_over_rounds_with_an_interval():
    rows = [row("a", 0, 110), row("b", 0, 100), row("a", 1, 220), row("b", 1, 200), row("a", 2, 55), row("b", 2, 50)]
    mean, low, high = paired(rows, "a", "b")
    assert mean == pytest.approx(1.1)
    assert low == pytest.approx(1.1) and high == pytest.approx(1.1)  # the same ratio every round
    assert paired(rows, "a", {0: "b", 1: "a", 2: "b"})[0] == pytest.approx(math.exp((2 * math.log(1.1)) / 3))
    assert math.isnan(paired(rows[:2], "a", "b")[1])  # one round: no interval


def test_the_best_is_chosen_on_the_other_rounds():
    # b wins round 0 by 30 %, a the others by a few: judged on the rounds without round 0, a is
    # the best; on the rounds with it, b.
    rows = [row("a", 0, 100), row("b", 0, 130), row("a", 1, 110), row("b", 1, 100), row("a", 2, 108),
            row("b", 2, 104), row("adaptive", 0, 1)]
    assert held_out_best(rows, {"a", "b"}) == {0: "a", 1: "b", 2: "b"}
    assert held_out_best(rows[:2], {"a", "b"}) == {}  # one round: nothing to choose on


def test_runs_are_put_at_the_machines_median_speed():
    # Each mode's tokens/s halves as the probe's unit takes twice as long: a slope of −1, and at
    # the median speed each mode's rounds agree.
    rows = [row(m, k, base * 400 / speed, speed) for m, base in (("a", 100), ("b", 90))
            for k, speed in enumerate((400, 800, 500))]
    slope = speed_slope(rows, {"a", "b"}, lambda r: r["point"])
    assert slope == pytest.approx(-1.0)
    steady = at_speed(rows, slope)
    assert {round(r["aggregate_tokens_per_s"], 6) for r in steady if r["mode"] == "a"} == {80.0}
    assert speed_slope([row("a", 0, 100, 400)], {"a"}, lambda r: r["point"]) == 0.0  # one run a mode
    assert at_speed([row("a", 0, 100)], -1.0)[0]["aggregate_tokens_per_s"] == 100  # unwatched: as it was


def test_the_probe_reads_cpu_time_per_unit_from_its_own_process():
    with SpeedProbe() as probe:
        before = probe.reading()
        time.sleep(1.0)
        after = probe.reading()
    assert after[0] > before[0]  # it worked meanwhile, every PERIOD_S
    assert 0 < SpeedProbe.us_per_unit(before, after) < 1e6
    assert SpeedProbe.us_per_unit(after, after) is None

"""Comparing a sweep's modes across its rounds: ratios paired round by round, against the mode
the other rounds found best, and at the machine's speed.

A row is one run: its "mode" (or another key), "repeat" (its round), "aggregate_tokens_per_s" and,
where a SpeedProbe watched it, "speed_us" (tandem.bench.speed). A round runs its modes back to
back, so a ratio within a round pairs away the drift between rounds.
"""

import math
from collections import defaultdict
from collections.abc import Callable, Hashable

import numpy as np
from scipy import stats

NAN3 = (float("nan"),) * 3


def paired(rows: list[dict], mode: str, against: str | dict[int, str], by: str = "mode",
           ) -> tuple[float, float, float]:
    """`mode`'s tokens/s over `against`'s (values of the rows' `by`; or per round, {repeat: value}),
    round by round → the geometric mean of the rounds' ratios and its 95 % t-interval (nan with
    one round)."""
    tokens_per_s = {(r[by], r["repeat"]): r["aggregate_tokens_per_s"] for r in rows}
    rounds = sorted({r["repeat"] for r in rows})
    other = against if isinstance(against, dict) else dict.fromkeys(rounds, against)
    logs = np.log([tokens_per_s[mode, k] / tokens_per_s[other[k], k] for k in rounds
                   if (mode, k) in tokens_per_s and (other.get(k), k) in tokens_per_s])
    if len(logs) < 2:
        return (float(np.exp(logs.mean())), math.nan, math.nan) if len(logs) else NAN3
    half = stats.t.ppf(0.975, len(logs) - 1) * logs.std(ddof=1) / np.sqrt(len(logs))
    return float(np.exp(logs.mean())), float(np.exp(logs.mean() - half)), float(np.exp(logs.mean() + half))


def held_out_best(rows: list[dict], modes: set[str]) -> dict[int, str]:
    """Per round, the mode of `modes` with the most tokens/s over the other rounds (the geometric
    mean). Against the best chosen on the same rounds, a ratio is biased low: among modes within
    a few % of each other, the one whose runs came out fast is the one chosen (the winner's curse);
    chosen on the other rounds, its runs in this one are a fair draw. Nothing with one round."""
    logs: dict[str, dict[int, float]] = defaultdict(dict)
    for r in rows:
        if r["mode"] in modes:
            logs[r["mode"]][r["repeat"]] = math.log(r["aggregate_tokens_per_s"])
    rounds = sorted({k for by_round in logs.values() for k in by_round})
    best = {}
    for k in rounds:
        others = {m: [v for j, v in by_round.items() if j != k] for m, by_round in logs.items() if k in by_round}
        scored = {m: sum(v) / len(v) for m, v in others.items() if v}
        if scored:
            best[k] = max(scored, key=scored.__getitem__)
    return best


def speed_slope(rows: list[dict], fixed: set[str], point: Callable[[dict], Hashable]) -> float:
    """How a run's tokens/s moves with the machine's speed: the least-squares slope of log tokens/s
    on log speed_us among runs of one mode (of `fixed`, whose work is the same every round) at one
    point (`point` of a row: what the sweep varies), pooled; 0 without two such runs."""
    groups: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    for r in rows:
        if r["mode"] in fixed and r.get("speed_us"):
            groups[point(r), r["mode"]].append((math.log(r["speed_us"]), math.log(r["aggregate_tokens_per_s"])))
    xs, ys = [], []
    for runs in groups.values():
        if len(runs) > 1:
            x, y = np.array(runs).T
            xs.append(x - x.mean())
            ys.append(y - y.mean())
    if not xs:
        return 0.0
    x, y = np.concatenate(xs), np.concatenate(ys)
    return float(x @ y / (x @ x)) if x @ x > 0 else 0.0


def at_speed(rows: list[dict], slope: float) -> list[dict]:
    """The rows with their tokens/s as at the rows' median speed (`slope`: speed_slope's); a row the
    probe did not watch unchanged."""
    speeds = [r["speed_us"] for r in rows if r.get("speed_us")]
    if not speeds or not slope:
        return rows
    median = float(np.median(speeds))
    return [r | {"aggregate_tokens_per_s": r["aggregate_tokens_per_s"] * (median / r["speed_us"]) ** slope}
            if r.get("speed_us") else r for r in rows]

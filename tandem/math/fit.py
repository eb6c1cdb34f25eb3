"""A cost against its tokens: a decayed least-squares line, kept where a cost can be, that can
fade without a new point so that the next one outweighs what it held."""

from bisect import bisect_right
from dataclasses import dataclass, field
from itertools import accumulate

# The least weight fading leaves: the next value then outweighs what was held a thousand to one.
FADED = 1e-3


@dataclass
class LinearFit:
    """Decayed least squares of y = intercept + slope · x (x ≥ 0), kept where a cost can be: the
    slope is never negative and the intercept never below zero."""

    n: float = 0.0
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0
    syy: float = 0.0

    def add(self, x: float, y: float, decay: float) -> None:
        self.n, self.sx, self.sy = decay * self.n + 1, decay * self.sx + x, decay * self.sy + y
        self.sxx, self.sxy, self.syy = decay * self.sxx + x * x, decay * self.sxy + x * y, decay * self.syy + y * y

    def fade(self, decay: float) -> None:
        """Age what is held without a new point (down to FADED of a point): the line stays until
        one comes, which then outweighs it."""
        if self.n * decay >= FADED:
            self.n, self.sx, self.sy = decay * self.n, decay * self.sx, decay * self.sy
            self.sxx, self.sxy, self.syy = decay * self.sxx, decay * self.sxy, decay * self.syy

    @property
    def varied(self) -> bool:
        """Whether x has varied, so that the slope is measured."""
        return self.n > 0 and self._var() > 1e-6

    def line(self, shrunk: bool = False) -> tuple[float, float]:
        """(intercept, slope); a flat line through the mean while x has not varied, and (0, 0)
        before anything was measured (a cost not seen yet is none). shrunk: the slope shrunk by
        its own error (positive-part James–Stein: slope · (1 − se² / slope²)), so that a slope
        fitted over an x that barely varied, mostly noise, counts for little."""
        if not self.n:
            return 0.0, 0.0
        mean_x, mean_y = self.sx / self.n, self.sy / self.n
        slope = (self.sxy / self.n - mean_x * mean_y) / self._var() if self.varied else 0.0
        if shrunk and slope > 0.0:
            residual = max(self.syy / self.n - mean_y * mean_y - slope * slope * self._var(), 0.0)
            error2 = residual / max(self.n - 2.0, 1.0) / self._var()  # the slope's variance
            slope *= max(0.0, 1.0 - error2 / (slope * slope))
        slope = max(0.0, slope)
        if mean_x > 0:
            slope = min(slope, mean_y / mean_x)  # a cost is never below nothing at x = 0
        return mean_y - slope * mean_x, slope

    def at(self, x: float, shrunk: bool = False) -> float:
        """The line at x."""
        intercept, slope = self.line(shrunk)
        return intercept + slope * x

    def _var(self) -> float:
        return self.sxx / self.n - (self.sx / self.n) ** 2


@dataclass(frozen=True)
class PassCurve:
    """A worker's pass time against its tokens, as it timed them when it loaded (ModelInfo.pass_ms):
    straight between the points and on from the last two, never falling (a median that came out
    below a shorter pass's is noise)."""

    tokens: tuple[float, ...] = ()
    ms: tuple[float, ...] = ()

    @classmethod
    def of(cls, points: dict[float, float]) -> "PassCurve":
        """The curve through {tokens: ms}; none with fewer than two points."""
        if len(points) < 2:
            return cls()
        tokens = tuple(sorted(points))
        return cls(tokens, tuple(accumulate((points[t] for t in tokens), max)))

    def __bool__(self) -> bool:
        return bool(self.tokens)

    def at(self, tokens: float) -> float:
        i = min(max(bisect_right(self.tokens, tokens), 1), len(self.tokens) - 1)
        (t0, t1), (m0, m1) = self.tokens[i - 1:i + 1], self.ms[i - 1:i + 1]
        return max(m0 + (m1 - m0) * (tokens - t0) / (t1 - t0), 0.0)


@dataclass
class PassCost:
    """A worker's pass cost against the tokens it runs, learned from its live passes: its curve
    (PassCurve) scaled to the speed the live passes run at, where the worker timed one; else a
    line fitted to them. A line bends nowhere, and fitted over the few token counts a lone
    session's blocks span, its slope is noise: extended to longer blocks, it priced them out on a
    CPU, where a pass's cost per token falls as it grows (the orchestrator's policy). The live
    passes run slower than the curve by a factor, not by a constant: what slows them (other
    processes on the host's cores and caches) slows each token."""

    curve: PassCurve = field(default_factory=PassCurve)
    # With a curve: the live passes' cost over the curve's (a flat line at x = 0); else cost
    # against tokens.
    fit: LinearFit = field(default_factory=LinearFit)

    @property
    def n(self) -> float:
        return self.fit.n

    def add(self, tokens: float, ms: float, decay: float) -> None:
        if not self.curve:
            self.fit.add(tokens, ms, decay)
        elif (timed := self.curve.at(tokens)) > 0:
            self.fit.add(0.0, ms / timed, decay)

    def fade(self, decay: float) -> None:
        self.fit.fade(decay)

    def at(self, tokens: float) -> float:
        """The cost of a pass of `tokens` tokens (never below nothing)."""
        if not self.curve:
            return self.fit.at(tokens, shrunk=True)
        return max(self.curve.at(tokens) * self.fit.at(0.0), 0.0)

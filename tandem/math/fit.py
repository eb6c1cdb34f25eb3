"""A cost against its tokens: a decayed least-squares line, kept where a cost can be, that can
fade without a new point so that the next one outweighs what it held."""

from dataclasses import dataclass

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

    def add(self, x: float, y: float, decay: float) -> None:
        self.n, self.sx, self.sy = decay * self.n + 1, decay * self.sx + x, decay * self.sy + y
        self.sxx, self.sxy = decay * self.sxx + x * x, decay * self.sxy + x * y

    def fade(self, decay: float) -> None:
        """Age what is held without a new point (down to FADED of a point): the line stays until
        one comes, which then outweighs it."""
        if self.n * decay >= FADED:
            self.n, self.sx, self.sy = decay * self.n, decay * self.sx, decay * self.sy
            self.sxx, self.sxy = decay * self.sxx, decay * self.sxy

    @property
    def varied(self) -> bool:
        """Whether x has varied, so that the slope is measured."""
        return self.n > 0 and self._var() > 1e-6

    def line(self) -> tuple[float, float]:
        """(intercept, slope); a flat line through the mean while x has not varied, and (0, 0)
        before anything was measured (a cost not seen yet is none)."""
        if not self.n:
            return 0.0, 0.0
        mean_x, mean_y = self.sx / self.n, self.sy / self.n
        slope = max(0.0, (self.sxy / self.n - mean_x * mean_y) / self._var()) if self.varied else 0.0
        if mean_x > 0:
            slope = min(slope, mean_y / mean_x)  # a cost is never below nothing at x = 0
        return mean_y - slope * mean_x, slope

    def at(self, x: float) -> float:
        """The line at x."""
        intercept, slope = self.line()
        return intercept + slope * x

    def _var(self) -> float:
        return self.sxx / self.n - (self.sx / self.n) ** 2


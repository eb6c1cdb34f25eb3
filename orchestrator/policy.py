"""The adaptive γ policy: a pure, serializable object (its state lives in Redis).

It picks γ in [0, γ_max] to maximize expected tokens per second,

    S(γ) = E[tokens | α, γ] / (draft(γ) + verify(γ) + overhead),

with E[tokens | α, γ] = (1 − α^(γ+1)) / (1 − α) (Leviathan et al. 2023, eq. 1), α the
session's running acceptance estimate, and every cost measured as the session runs:
draft(γ) = γ · draft compute per token + draft transport; verify(γ) = a fitted
intercept + slope · (γ + 1) of verify compute, plus verify transport; overhead = Redis and
orchestration. γ = 0 is plain target decoding; while it wins, every `probe_every` cycles one
cycle drafts anyway, so a stale α can recover.

Worker costs are learned from steady cycles only. A call that feeds a worker more committed
tokens than a steady cycle does (the prompt's prefill, a re-prefill after a cache miss, the
draft catching up on the tokens of γ = 0 cycles) costs what no steady cycle will; charged per
drafted token, a probe's catch-up made drafting look dear and kept sessions at γ = 0.
"""

from dataclasses import asdict, dataclass, fields

from tandem.math.acceptance import verified_tokens
from tandem.math.analytic import expected_tokens

# Committed tokens a steady cycle feeds: the draft gets the recovered or bonus token, and the
# block's last token too after a full accept; the verifier gets the recovered or bonus token.
STEADY_DRAFT_FED = 2
STEADY_VERIFY_FED = 1


@dataclass
class CycleCosts:
    """What one cycle measured, in milliseconds (zeros for a γ-0 cycle's draft)."""

    gamma: int
    accepted: int
    draft_compute_ms: float
    draft_transport_ms: float
    verify_compute_ms: float
    verify_transport_ms: float
    overhead_ms: float  # orchestration (the Redis commit is overlapped)
    drafted_ahead: bool = False  # the block was drafted during the last verify: no draft cost here
    draft_fed: int = 1  # committed tokens each call fed its worker besides the block
    verify_fed: int = 1


@dataclass
class GammaPolicy:
    max_gamma: int = 8
    initial_gamma: int = 4  # used until both workers have been measured
    prior_alpha: float = 0.6
    prior_weight: float = 2.0  # pseudo-observations behind prior_alpha
    decay: float = 0.9  # per cycle: older evidence fades so the policy follows the text
    probe_every: int = 8
    # Decayed acceptance evidence.
    accepted: float = 0.0
    verified: float = 0.0
    # Exponentially weighted cost estimates; negative means not measured yet.
    draft_ms_per_token: float = -1.0
    draft_transport_ms: float = -1.0
    verify_transport_ms: float = -1.0
    overhead_ms: float = -1.0
    # Decayed least squares of verify compute against tokens verified (γ + 1).
    n: float = 0.0
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0
    zero_streak: int = 0

    @property
    def alpha(self) -> float:
        a = (self.accepted + self.prior_alpha * self.prior_weight) / (self.verified + self.prior_weight)
        return min(a, 0.999)

    def verify_ms(self, gamma: int) -> float:
        mean_x, mean_y = self.sx / self.n, self.sy / self.n
        var = self.sxx / self.n - mean_x**2
        slope = max(0.0, (self.sxy / self.n - mean_x * mean_y) / var) if var > 1e-6 else 0.0
        slope = min(slope, mean_y / mean_x)  # a pass never costs less than nothing at x = 0
        return mean_y + slope * (gamma + 1 - mean_x)

    def cycle_ms(self, gamma: int) -> float:
        draft = gamma * self.draft_ms_per_token + self.draft_transport_ms if gamma else 0.0
        return draft + self.verify_ms(gamma) + self.verify_transport_ms + self.overhead_ms

    def tokens_per_ms(self, gamma: int) -> float:
        return expected_tokens(self.alpha, gamma) / max(self.cycle_ms(gamma), 1e-6)

    def choose(self, limit: int | None = None) -> int:
        """γ for the next cycle, at most `limit` (e.g. the tokens still wanted − 1)."""
        top = self.max_gamma if limit is None else max(0, min(self.max_gamma, limit))
        if self.draft_ms_per_token < 0 or self.n == 0:
            return min(self.initial_gamma, top)
        gamma = max(range(top + 1), key=lambda g: (self.tokens_per_ms(g), -g))
        if gamma == 0 and top > 0 and self.zero_streak + 1 >= self.probe_every:
            gamma = max(range(1, top + 1), key=self.tokens_per_ms)
        return gamma

    def observe(self, c: CycleCosts) -> None:
        """Fold one cycle's measurements into the estimates."""
        self.zero_streak = self.zero_streak + 1 if c.gamma == 0 else 0
        if c.gamma:
            self.accepted = self.decay * self.accepted + c.accepted
            self.verified = self.decay * self.verified + verified_tokens(c.accepted, c.gamma)
        if c.gamma and not c.drafted_ahead and c.draft_fed <= STEADY_DRAFT_FED:
            self.draft_ms_per_token = self._ewma(self.draft_ms_per_token, c.draft_compute_ms / c.gamma)
            self.draft_transport_ms = self._ewma(self.draft_transport_ms, c.draft_transport_ms)
        self.overhead_ms = self._ewma(self.overhead_ms, c.overhead_ms)
        if c.verify_fed > STEADY_VERIFY_FED:
            return
        self.verify_transport_ms = self._ewma(self.verify_transport_ms, c.verify_transport_ms)
        x, y, d = c.gamma + 1.0, c.verify_compute_ms, self.decay
        self.n, self.sx, self.sy = d * self.n + 1, d * self.sx + x, d * self.sy + y
        self.sxx, self.sxy = d * self.sxx + x * x, d * self.sxy + x * y

    def _ewma(self, old: float, new: float) -> float:
        return new if old < 0 else self.decay * old + (1 - self.decay) * new

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, state: dict) -> "GammaPolicy":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in state.items() if k in names})

    def with_fresh_acceptance(self) -> "GammaPolicy":
        """A copy that keeps the measured costs but forgets acceptance (for a new session)."""
        return GammaPolicy.from_dict(self.to_dict() | {"accepted": 0.0, "verified": 0.0, "zero_streak": 0})

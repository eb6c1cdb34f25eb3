"""The analytic model of speculative decoding (Leviathan et al. 2023): expected tokens per
target pass at acceptance rate α and draft length γ, and the speedup over the target alone
when a drafted token costs 1/cost_ratio of a target pass."""


def expected_tokens(alpha: float, gamma: int) -> float:
    """E[output tokens per target pass] = 1 + α + … + α^γ (accepted plus recovered/bonus)."""
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def analytic_speedup(alpha: float, gamma: int, cost_ratio: float) -> float:
    """Speedup over plain target decoding when a draft token costs 1/cost_ratio of a target pass."""
    return expected_tokens(alpha, gamma) / (1.0 + gamma / cost_ratio)


def best_gamma(alpha: float, cost_ratio: float, max_gamma: int) -> int:
    """The γ in [0, max_gamma] maximizing analytic_speedup (the smallest on ties)."""
    return max(range(max_gamma + 1), key=lambda g: (analytic_speedup(alpha, g, cost_ratio), -g))

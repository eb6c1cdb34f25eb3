"""Cycles a γ policy can be taught, shared by the policy's tests and the loop's."""

from tandem.orchestrator.policy import CycleCosts


def cheap_good_cycle(gamma: int) -> CycleCosts:
    """A cheap draft that is always right: verify costs 10 + 0.5 per token verified."""
    return CycleCosts(gamma=gamma, accepted=gamma, draft_cost_ms=0.2 * gamma, draft_call_ms=0.3,
                      verify_cost_ms=10 + 0.5 * (gamma + 1), verify_call_ms=0.3, overhead_ms=0.5)

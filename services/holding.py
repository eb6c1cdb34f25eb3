"""Holding a round for the rows about to come back, so that a worker's sessions share one pass.

Sessions fall into cohorts. Each batched call's rows go back to the orchestrator together and
come back together, a few milliseconds later; meanwhile the worker runs the rows that arrived
while it was busy. Two cohorts then take turns on the worker and never meet, and the worker pays
a pass's fixed cost (its weights read, its operator calls) once per cohort where one pass would
do. A round may therefore wait for rows that are due back: sessions answered a moment ago that
came back that quickly last time. It waits only while the wait is shorter than a share of the
fixed cost it saves (`HOLD_SHARE`), for rows due (or late) by no more than that: a cohort
whose way round is longer (many sessions, a busy orchestrator) is not waited for, and a session
that finished or moved elsewhere costs at most one such wait before it is overdue and forgotten.

A worker whose passes are of several kinds (a verifier's target and its head, a hybrid drafter's
lookups and its model) fits each kind's line on its own passes and holds for the dearest, the
pass the rows due back would join. Fitted on whole rounds, some the head's 5 ms pass and some
the target's 20 ms one, the line was neither, and a verifier that drafted at 8 in flight held its
passes at 5.2 sessions against 6.0 with a line per kind.
"""

from collections import OrderedDict

from tandem.math.fit import LinearFit

HOLD_SHARE = 0.5  # a round waits at most this share of a pass's fixed cost
# The fixed cost is fitted on passes of steps this short (decode steps, verify blocks): a prefill
# costs less per token than a decode step (a matrix product of many rows, no other session's keys to
# read), and passes that carry one would bend the line up and make the fixed cost look larger.
FIT_STEP_TOKENS = 16
PASS_DECAY = 0.98  # per pass fitted: the fit follows the load
FORGET_S = 5.0  # a session answered longer ago than this is not expected back


def fixed_s(passes: LinearFit) -> float:
    """A pass's fixed cost, in seconds: the intercept of pass time against tokens (`passes`, fitted
    with PASS_DECAY), 0 until passes of different sizes have been seen."""
    return passes.line()[0] if passes.varied else 0.0


class Returns:
    """When each session was last answered, and how long its calls took to come back."""

    def __init__(self) -> None:
        self._out: OrderedDict[str, tuple[float, float]] = OrderedDict()  # answered: (at, its last way round)
        self._last: dict[str, float] = {}  # sessions in the worker: how long their last way round took

    def arrived(self, session_id: str, at: float) -> None:
        answered = self._out.pop(session_id, None)
        if answered is not None:
            self._last[session_id] = at - answered[0]

    def answered(self, session_id: str, at: float) -> None:
        self._out[session_id] = (at, self._last.pop(session_id, -1.0))
        self._out.move_to_end(session_id)
        while self._out and at - next(iter(self._out.values()))[0] > FORGET_S:
            self._out.popitem(last=False)

    def due(self, now: float, within_s: float) -> dict[str, float]:
        """Sessions expected back within `within_s` of now (late by as much at most) → when."""
        due = {}
        for session_id, (at, way_round) in self._out.items():
            back = at + way_round
            if way_round >= 0 and abs(back - now) <= within_s:
                due[session_id] = back
        return due

"""CPU time per event of an asyncio process: the orchestrator's per worker call (and the rest of
a cycle, one more event), a worker's per call.

Under load, the wall time of a step in an asyncio process counts the time it waited for the
event loop and for a core while other sessions' work ran; that waiting is most of it, and is no
cost of the step's own (charged as one, it makes every cycle look dear and γ climb: the γ
policy in tandem.orchestrator.policy). What a step takes from everyone is the CPU it uses. One
coroutine's CPU cannot be read apart from the others' on the same loop, so the meter reads the
loop's thread's and divides it over the events counted meanwhile. The thread's, not the
process's: a process's other threads (a worker's model thread, whose passes are charged apart;
Ray's and the exporters' background threads) work whether or not events come, and divided over
few events, their time made each one look dear.
"""

import time

WINDOW_S = 0.5  # the shortest stretch read at once: CPU time ticks coarsely on some systems


class CpuMeter:
    """The calling thread's CPU milliseconds per event, a running average over recent windows.
    Count every event from the same thread (the event loop's)."""

    def __init__(self, decay: float = 0.8) -> None:
        self.decay = decay
        self.per_event_ms = -1.0  # negative: not measured yet
        self._events = 0
        self._since: tuple[float, float] | None = None

    def count(self, events: int = 1) -> float:
        """Count events (one by default) → the estimate (negative until the first window has
        closed). The first count opens the first window: what the thread did before (starting up)
        is no event's."""
        if self._since is None:
            self._since = time.perf_counter(), time.thread_time()
            return self.per_event_ms
        self._events += events
        # The thread's CPU clock is read only when a window closes: under a hypervisor it can be a
        # real system call, where perf_counter is not.
        wall = time.perf_counter()
        if wall - self._since[0] >= WINDOW_S:
            now = wall, time.thread_time()
            sample = (now[1] - self._since[1]) * 1e3 / self._events
            old = self.per_event_ms
            self.per_event_ms = sample if old < 0 else self.decay * old + (1 - self.decay) * sample
            self._events, self._since = 0, now
        return self.per_event_ms

"""How fast the machine runs now: a process beside the test bed that does one fixed piece of work
every few milliseconds and counts the CPU time each took.

On the 2-core VM the benchmarks run on, the CPU time of identical work moves with the host: one
fixed pure-Python unit, woken every 50 ms on an idle machine, took a median 1.49 to 2.32 ms by
5-second window within one minute (1.44 to 1.58 ms run back to back, caches warm). Every role of
the test bed moves together with it: among runs of a sweep that did the same work (greedy, fixed
γ, the same streams), the CPU per cycle of the client, the delay proxy and Ray's proxy, which do
the same thing whatever the policy, rose and fell by up to 30 % between rounds along with the
workers'. The probe wakes, works and sleeps as the bed's processes do, so that its CPU per unit
reads the machine as they find it, with none of their own traffic in it (the benchmarks/network
sweep's `speed_us`).
"""

import multiprocessing as mp
import time
from multiprocessing.sharedctypes import SynchronizedArray
from multiprocessing.synchronize import Event

# The probe's rhythm: a unit of about 0.4 ms every 20 ms, some 2 % of one core.
UNIT_ITERATIONS = 5000
PERIOD_S = 0.02


def _unit() -> int:
    """A fixed piece of interpreter work: arithmetic and a small dict, as the bed's Python does."""
    total, table = 0, {}
    for i in range(UNIT_ITERATIONS):
        total += i * i % 7
        table[i & 255] = total
    return total


def _probe(counters: SynchronizedArray, stop: Event) -> None:
    while not stop.is_set():
        start = time.thread_time_ns()
        _unit()
        took = time.thread_time_ns() - start
        with counters.get_lock():
            counters[0] += 1
            counters[1] += took
        stop.wait(PERIOD_S)


class SpeedProbe:
    """The probe process; `reading()` before and after a stretch of work, `us_per_unit` of the two:
    the probe's mean CPU microseconds per unit over that stretch (higher: a slower machine)."""

    def __init__(self) -> None:
        context = mp.get_context("spawn")
        self._counters = context.Array("d", 2)  # units done, their CPU time in ns
        self._stop = context.Event()
        self._process = context.Process(target=_probe, args=(self._counters, self._stop), daemon=True)

    def start(self) -> "SpeedProbe":
        self._process.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._process.join(timeout=5)
        if self._process.is_alive():
            self._process.kill()

    def reading(self) -> tuple[float, float]:
        with self._counters.get_lock():
            return self._counters[0], self._counters[1]

    @staticmethod
    def us_per_unit(before: tuple[float, float], after: tuple[float, float]) -> float | None:
        units = after[0] - before[0]
        return (after[1] - before[1]) / units / 1e3 if units else None

    def __enter__(self) -> "SpeedProbe":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

"""tandem.cpu: an event loop thread's CPU per event, which the γ policy charges instead of wall
time."""

import threading
import time

from tandem.cpu import WINDOW_S, CpuMeter

PER_EVENT_S = WINDOW_S / 8  # a window closes after 8 to 9 events: each takes at least this long


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def _events(meter: CpuMeter, work, n: int = 10) -> float:
    estimate = -1.0
    for _ in range(n):
        work()
        estimate = meter.count()
    return estimate


def test_cpu_per_event_counts_work_and_not_waiting():
    assert CpuMeter().count() < 0  # nothing measured before a window closes
    ms = PER_EVENT_S * 1e3
    assert 0.5 * ms < _events(CpuMeter(), lambda: _burn(PER_EVENT_S)) < 2 * ms
    assert 0 <= _events(CpuMeter(), lambda: time.sleep(PER_EVENT_S)) < 0.2 * ms


def test_other_threads_work_is_not_counted():
    """A worker's model thread, Ray's background threads: they work whether events come or not."""
    stop = threading.Event()
    busy = threading.Thread(target=lambda: [_burn(0.01) for _ in iter(stop.is_set, True)])
    busy.start()
    try:
        assert _events(CpuMeter(), lambda: time.sleep(PER_EVENT_S)) < 0.2 * PER_EVENT_S * 1e3
    finally:
        stop.set()
        busy.join()


def test_work_before_the_first_event_is_no_events():
    """A worker's start-up (gRPC, tracing) comes before its first call and is no call's cost."""
    meter = CpuMeter()
    _burn(0.3)
    assert _events(meter, lambda: time.sleep(PER_EVENT_S)) < 0.2 * PER_EVENT_S * 1e3


def test_a_count_of_several_events_divides_the_work_over_them():
    """The orchestrator counts a cycle's calls at once: work of 3 events read as 3 events."""
    meter, ms = CpuMeter(), PER_EVENT_S * 1e3
    meter.count()
    estimate = -1.0
    for _ in range(10):
        _burn(PER_EVENT_S)
        estimate = meter.count(3)
    assert 0.5 * ms / 3 < estimate < 2 * ms / 3

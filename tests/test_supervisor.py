"""Supervision: the supervisor restarts a child that dies and stops restarting what it is told
to forget; a worker whose launcher is SIGKILLed stops by itself instead of holding its model."""

import os
import signal
import subprocess
import sys
import time

from tandem.local import Supervisor


def _wait(condition, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_dead_child_is_restarted_and_a_forgotten_one_is_not():
    said = []
    supervisor = Supervisor(said.append)
    start = lambda: subprocess.Popen(["sleep", "60"])  # noqa: E731
    supervisor.add("sleeper", start)
    supervisor.start()
    try:
        first = supervisor.proc("sleeper")
        first.kill()
        assert _wait(lambda: supervisor.restarts("sleeper") == 1)
        assert supervisor.proc("sleeper").pid != first.pid and supervisor.proc("sleeper").poll() is None
        assert said == ["tandem: sleeper exited (-9); restarting it"]
        forgotten = supervisor.forget("sleeper")
        forgotten.kill()
        time.sleep(0.5)
        assert "sleeper" not in supervisor.names and len(said) == 1
    finally:
        supervisor.stop()


def test_a_worker_stops_when_its_launcher_is_sigkilled(pair, tmp_path):
    launcher = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\n"
         "from tandem.local import spawn_worker\n"
         f"proc, _ = spawn_worker('draft', {pair['draft']!r}, '127.0.0.1', 1, 'cpu', 'float32', echo=False)\n"
         "print(proc.pid, flush=True)\n"
         "time.sleep(600)"],
        stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    worker = int(launcher.stdout.readline())
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait()

    def gone() -> bool:
        try:
            os.kill(worker, 0)
        except ProcessLookupError:
            return True
        with open(f"/proc/{worker}/stat") as f:  # a zombie until init reaps it counts as gone
            return f.read().split()[2] == "Z"

    try:
        assert _wait(gone, timeout_s=30), "the orphaned worker kept running"
    finally:
        if not gone():
            os.kill(worker, signal.SIGKILL)

"""Supervision: the supervisor restarts a child that dies and stops restarting what it is told
to forget; a worker whose launcher is SIGKILLed stops by itself instead of holding its model."""

import os
import signal
import socket
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


def test_tandem_up_stopped_while_it_starts_stops_everything_it_started(pair, tmp_path):
    """SIGTERM as soon as the ingress port opens (Serve may still be deploying): Ray's core worker
    would abort the process on it, leaving its other processes behind; `tandem up` stops instead."""
    from tandem.bench.procfs import descendants
    from tandem.ports import free_port

    port = free_port()
    up = subprocess.Popen([sys.executable, "-m", "tandem.cli", "up", "--draft-model", pair["draft"],
                           "--target-model", pair["target"], "--grpc-port", str(port), "--metrics-port", "0",
                           "--threads", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        def listening() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0

        assert _wait(listening, timeout_s=180), "the ingress never opened"
        started = descendants(up.pid)
        os.kill(up.pid, signal.SIGTERM)
        out, err = up.communicate(timeout=120)
    finally:
        if up.poll() is None:
            up.kill()
    assert up.returncode == 0, err[-2000:]
    assert "tandem stopped" in out and "SIGTERM received" not in err
    assert started and _wait(lambda: not [p for p in started if _alive(p)], timeout_s=60), \
        [open(f"/proc/{p}/cmdline").read() for p in started if _alive(p)]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False

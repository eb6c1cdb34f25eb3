"""A multi-host test bed on one machine: each host a network namespace with its own address,
joined to this one by a veth pair, and the links between hosts run through delay proxies
(tandem.bench.delay_proxy) that add a configured delay and jitter and can drop connections.

    host "orchestrator"   10.B.0.2 ── veth ── 10.B.0.1 ┐
    host "draft-0"        10.B.1.2 ── veth ── 10.B.1.1 ├ this namespace: the proxies and Redis
    host "target-0"       10.B.2.2 ── veth ── 10.B.2.1 ┘

A host reaches this namespace at its gateway (10.B.i.1) and nothing else: no forwarding, so a
host's traffic to another crosses a link's proxy, which listens on the caller's gateway and
connects to the callee's address. Processes start in a host with `run` (or `prefix` in front of
a command), each on its host's address. Needs root and iproute2; `unavailable()` says why not.
"""

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from tandem.bench.delay_proxy import ProxyProcess


def _ip(*args: str, namespace: str | None = None) -> None:
    cmd = ["ip", *(["-n", namespace] if namespace else []), *args]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip()}")


def unavailable() -> str | None:
    """Why this machine cannot run a test bed, or None when it can."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are Linux's"
    if os.geteuid() != 0:
        return "network namespaces and veth pairs need root"
    if not shutil.which("ip"):
        return "no `ip` command (iproute2)"
    # What start() does, in small: a namespace, a veth pair, one end moved into it (a container may
    # allow namespaces and refuse veth pairs).
    tag = uuid.uuid4().hex[:6]
    probe, outside, inside = f"tandem-probe-{tag}", f"tbprobe{tag}", f"tbprobe{tag}p"
    try:
        _ip("netns", "add", probe)
        _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        _ip("link", "set", inside, "netns", probe)
    except RuntimeError as e:
        return f"cannot make a network namespace joined by a veth pair: {e}"
    finally:
        subprocess.run(["ip", "link", "del", outside], capture_output=True)
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


@dataclass(frozen=True)
class Host:
    name: str
    namespace: str
    address: str  # its own, inside its namespace
    gateway: str  # this namespace's end of its veth pair: where its links listen


class Testbed:
    """Hosts and the links between them; start() makes them, stop() (or `with`) removes them."""

    def __init__(self, hosts: Sequence[str]) -> None:
        tag = uuid.uuid4().hex[:5]  # names and a subnet of its own: test beds can run side by side
        self.tag = tag
        subnet = 16 + int(tag, 16) % 200  # 10.16–215.x.0/24
        self.hosts = {name: Host(name, f"tandem-{tag}-{name}", f"10.{subnet}.{i}.2", f"10.{subnet}.{i}.1")
                      for i, name in enumerate(hosts)}
        self.links: dict[str, str] = {}  # link name → the address it listens on
        self._proxy: ProxyProcess | None = None
        self._procs: list[subprocess.Popen] = []

    def start(self) -> "Testbed":
        try:
            for i, host in enumerate(self.hosts.values()):
                self._make(i, host)
        except BaseException:
            self.stop()
            raise
        return self

    def _make(self, i: int, host: Host) -> None:
        outside, inside = f"tb{self.tag}h{i}", f"tb{self.tag}p{i}"  # at most 15 characters
        _ip("netns", "add", host.namespace)
        _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        _ip("link", "set", inside, "netns", host.namespace)
        _ip("addr", "add", f"{host.gateway}/24", "dev", outside)
        _ip("link", "set", outside, "up")
        _ip("addr", "add", f"{host.address}/24", "dev", inside, namespace=host.namespace)
        for dev in ("lo", inside):
            _ip("link", "set", dev, "up", namespace=host.namespace)
        # A default route (to nowhere beyond the gateway): programs that find their own address by
        # "connecting" a UDP socket outward (Ray does) then find the host's.
        _ip("route", "add", "default", "via", host.gateway, namespace=host.namespace)

    def prefix(self, host: str) -> list[str]:
        """The command prefix that runs a program in `host`."""
        return ["ip", "netns", "exec", self.hosts[host].namespace]

    def run(self, host: str, argv: Sequence[str], **popen) -> subprocess.Popen:
        """Start a program in `host` (stopped with the test bed)."""
        proc = subprocess.Popen([*self.prefix(host), *argv], **popen)
        self._procs.append(proc)
        return proc

    def connect(self, links: dict[str, tuple[str | None, str]], delay_ms: float = 0.0, jitter_ms: float = 0.0,
                seed: int = 0) -> dict[str, str]:
        """Start the links {name: (from host, "address:port" to reach)}, each through a delay proxy
        listening on the caller's gateway (on loopback for a caller in this namespace: host None)
        → {name: the address the caller dials}."""
        if self._proxy:
            raise RuntimeError("the test bed's links are started already")
        specs = [f"{name}={self.hosts[source].gateway if source else '127.0.0.1'}:0,{to}"
                 for name, (source, to) in links.items()]
        self._proxy = ProxyProcess(specs, delay_ms, jitter_ms, seed)
        self.links.update(self._proxy.links)
        return dict(self.links)

    @property
    def proxy_pid(self) -> int | None:
        """The links' delay proxy's process (None before connect)."""
        return self._proxy.proc.pid if self._proxy else None

    def command(self, line: str) -> None:
        """Tell the links (delay_proxy's commands: `delay NAME|* MS [JITTER]`, `drop`, `down`, `up`)."""
        self._proxy.command(line)

    def set_delay(self, ms: float, jitter_ms: float = 0.0, link: str = "*") -> None:
        self._proxy.set_delay(ms, jitter_ms, link)

    def stop(self) -> None:
        """Stop what runs in the test bed, then remove its namespaces (their veth pairs go with them)."""
        procs = [*self._procs, *([self._proxy.proc] if self._proxy else [])]
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        self._procs, self._proxy = [], None
        for host in self.hosts.values():
            _kill_what_is_left(host.namespace)
            subprocess.run(["ip", "netns", "del", host.namespace], capture_output=True)

    def __enter__(self) -> "Testbed":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _kill_what_is_left(namespace: str) -> None:
    """SIGKILL whatever still runs in one of the test bed's namespaces once its programs have
    stopped: their children that outlived them (Ray's agents, after an orchestrator stopped while
    it started), which would hold the namespace and its veth pair for a minute more."""
    listed = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True).stdout.split()
    for pid in listed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)

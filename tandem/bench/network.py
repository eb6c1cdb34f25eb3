"""A tandem cluster across the test bed's hosts (tandem.bench.testbed): the orchestrator (`tandem
orchestrator`, its Ray Serve app) on host "orchestrator", each draft worker and verifier on a host
of its own, every orchestrator↔worker link through a delay proxy, Redis beside the orchestrator
(on its gateway: one hop, no delay). Clients dial the orchestrator's address directly.

    cluster = NetworkCluster(draft_dir, target_dir, drafters=1, verifiers=1, delay_ms=5).start()
    cluster.address            # the gRPC ingress, "10.B.0.2:9000"
    cluster.bed.set_delay(20)  # every link, from now on
    cluster.bed.command("drop draft-0")
"""

import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from tandem.bench.procfs import command_line, cpu_seconds, descendants
from tandem.bench.testbed import Testbed
from tandem.bench.worker_metrics import batch_histogram
from tandem.local import VERIFIER_DRAFTERS, spawn_worker, stop_processes, verifier_args, worker_model
from tandem.orchestrator.redis_server import EmbeddedRedis
from tandem.ports import grpc_answers

GRPC_PORT = 9000  # each host is a namespace of its own: its ports are free
METRICS_PORT = 9100  # each worker's Prometheus metrics, on its host's address
READY_S = 180  # Ray's start in a fresh namespace, on a busy small machine
# The orchestrator's Ray actors whose CPU cpu_ms shows apart, by their process titles.
RAY_ROLES = {"ServeReplica": "serve replica", "ProxyActor": "ray proxy"}


class NetworkCluster:
    def __init__(self, draft_model: str, target_model: str, drafters: int = 1, verifiers: int = 1,
                 delay_ms: float = 0.0, jitter_ms: float = 0.0, drafter: str = "hybrid",
                 orchestrator_args: Sequence[str] = (), worker_args: Sequence[str] = (), echo: bool = False,
                 head: str | None = None, exit_layer: int = 0) -> None:
        """drafter: who drafts, as tandem.local.LocalCluster's: a draft worker on a host of its own
        ("hybrid", "model", "ngram"), or, with no draft hosts, the verifiers ("head" with `head`,
        "self" with `exit_layer`): their blocks cross only the verifier's link."""
        self.verifier_args = verifier_args(drafter, head, exit_layer)
        self.models = {"draft": draft_model, "target": target_model}
        drafters = 0 if drafter in VERIFIER_DRAFTERS else drafters
        self.workers = [f"draft-{i}" for i in range(drafters)] + [f"target-{i}" for i in range(verifiers)]
        self.bed = Testbed(["orchestrator", *self.workers])
        self.delay = (delay_ms, jitter_ms)
        self.drafter, self.echo = drafter, echo
        self.orchestrator_args, self.worker_args = tuple(orchestrator_args), tuple(worker_args)
        self.procs: dict[str, subprocess.Popen] = {}
        self.redis: EmbeddedRedis | None = None
        self.links: tuple[list[str], list[str]] = ([], [])  # the orchestrator's ends: drafters', verifiers'

    @property
    def address(self) -> str:
        return f"{self.bed.hosts['orchestrator'].address}:{GRPC_PORT}"

    def start(self) -> "NetworkCluster":
        try:
            self.bed.start()
            self.redis = EmbeddedRedis(password=secrets.token_urlsafe(16), host=self.bed.hosts["orchestrator"].gateway)
            # The workers load their models side by side: a cluster's start is most of a short run.
            with ThreadPoolExecutor(len(self.workers)) as pool:
                addresses = dict(zip(self.workers, pool.map(self._worker, self.workers)))
            links = self.bed.connect({name: ("orchestrator", to) for name, to in addresses.items()}, *self.delay)
            self.links = ([links[n] for n in self.workers if n.startswith("draft")],
                          [links[n] for n in self.workers if n.startswith("target")])
            self._orchestrator(*self.links)
        except BaseException:
            self.stop()
            raise
        return self

    def _worker(self, name: str) -> str:
        kind, model = worker_model(name.split("-")[0], self.drafter, self.models)
        args = (*self.worker_args, *self.verifier_args) if kind == "target" else self.worker_args
        host = self.bed.hosts[name]
        proc, address = spawn_worker(kind, model, host.address, 1, "cpu", "float32", echo=self.echo,
                                     metrics_port=METRICS_PORT, args=args, prefix=self.bed.prefix(name))
        self.procs[name] = proc
        return address

    def _orchestrator(self, drafts: list[str], targets: list[str]) -> None:
        host = self.bed.hosts["orchestrator"]
        cmd = [sys.executable, "-m", "tandem.cli", "orchestrator", "--draft", ",".join(drafts),
               "--target", ",".join(targets), "--redis-url", self.redis.url, "--tokenizer", self.models["target"],
               "--host", host.address, "--grpc-port", str(GRPC_PORT), "--http-port", "8000", "--metrics-port", "0",
               *self.orchestrator_args]
        proc = self.bed.run("orchestrator", cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.procs["orchestrator"] = proc
        ready = threading.Event()
        seen: list[str] = []

        def read() -> None:
            for line in proc.stdout:  # keep reading, or a full pipe blocks the orchestrator
                seen.append(line.rstrip())
                if self.echo:
                    print(line.rstrip(), flush=True)
                if "gRPC ingress on port" in line:
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        started = time.monotonic()
        if not ready.wait(READY_S) or proc.poll() is not None:
            raise RuntimeError("tandem orchestrator did not start on the test bed:\n" + "\n".join(seen[-20:]))
        # Ray's gRPC proxy can take its port after the orchestrator reports the ingress: once, on a
        # busy machine, the first call was refused past the SDK's retries.
        if not grpc_answers(f"{host.address}:{GRPC_PORT}", max(1.0, READY_S - (time.monotonic() - started))):
            raise RuntimeError(f"the test bed's gRPC ingress {host.address}:{GRPC_PORT} did not answer")

    def restart_orchestrator(self) -> None:
        """A new orchestrator (Ray, its Serve replica) on the same workers, links and Redis: a replica
        that has measured nothing yet (the γ policy's costs and acceptance are the replica's)."""
        stop_processes([self.procs.pop("orchestrator")], timeout_s=30)
        self._orchestrator(*self.links)

    def cpu_ms(self) -> dict[str, float]:
        """Each of the cluster's roles' CPU time so far, in ms: each worker's process; the Serve
        replica's, Ray's gRPC proxy's, and the orchestrator's with the rest of Ray's (its other
        descendants: the controller, the GCS, the raylet); the links' delay proxy; and this
        process's, the client's. A process that exited meanwhile takes its time with it."""
        pids = {name: [proc.pid] for name, proc in self.procs.items()}
        if "orchestrator" in pids:
            for pid in descendants(pids["orchestrator"][0]):
                pids.setdefault(_ray_role(pid), []).append(pid)
        if self.bed.proxy_pid:
            pids["delay proxy"] = [self.bed.proxy_pid]
        pids["client"] = [os.getpid()]
        return {role: 1e3 * sum(filter(None, map(cpu_seconds, group))) for role, group in pids.items()}

    def passes(self) -> dict[str, tuple[float, float]]:
        """Each worker's (sessions, passes) so far, its forward passes and the sessions they ran
        (tandem.bench.worker_metrics): between two readings, how full the passes were (at 8 in
        flight, one cohort of 8 or two of 4 taking turns)."""
        return {name: batch_histogram(self.bed.hosts[name].address, METRICS_PORT, "sessions") for name in self.workers}

    def stop(self) -> None:
        stop_processes(list(self.procs.values()), timeout_s=30)
        self.procs = {}
        self.bed.stop()
        if self.redis:
            self.redis.stop()
            self.redis = None

    def __enter__(self) -> "NetworkCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _ray_role(pid: int) -> str:
    """Which role a process under the orchestrator plays, by the title Ray gives its actors."""
    title = command_line(pid)
    return next((role for actor, role in RAY_ROLES.items() if actor in title), "orchestrator")

"""Pools of workers: the draft workers, or the target verifiers, that sessions are routed to.

A pool is configured with addresses, each host:port or a DNS name that resolves to several
(a Kubernetes headless Service), and resolves them again every `resolve_every_s` so that
workers can come and go. Per worker it keeps one client (a persistent channel), a
grpc.health.v1 Watch that says whether the worker serves, and the load the worker reports,
polled every `load_every_s`.

Routing: a new session goes to the least-loaded available worker (sessions held, then queued
work, then KV-cache bytes, counting the sessions this replica sent there since the last
report); afterwards the session sticks to its worker, which holds its caches, while that is
available. A call that fails marks its worker down for a short cooldown, after which the
health watch decides again. Every worker of a pool must serve the same model: one that
describes another is never routed to.
"""

import asyncio
import logging
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tandem.orchestrator import metrics
from tandem.orchestrator.clients import WorkerClient
from tandem.tls import TLSFiles
from tandem.wire.worker import ModelInfo, WorkerLoad

log = logging.getLogger("tandem.orchestrator")

FAILED_COOLDOWN_S = 1.0  # a worker whose call failed is not routed to for this long


def split_address(address: str) -> tuple[str, int]:
    """"host:port" or "[v6]:port" → (host, port); ValueError when it is neither."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{address!r} is not host:port")
    return host.strip("[]"), int(port)


async def resolve(address: str) -> set[str]:
    """Every ip:port a host:port names (one for an IP, several for a headless Service)."""
    host, port = split_address(address)
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return {f"[{ip}]:{p}" if ":" in ip else f"{ip}:{p}" for *_, (ip, p, *_) in infos}


def _model(info: ModelInfo) -> tuple:
    """What two workers of one pool must agree on (their model directories may differ)."""
    return info.vocab_size, info.max_context, info.eos_token_ids, info.num_parameters


@dataclass
class Worker:
    address: str  # ip:port
    client: WorkerClient
    healthy: bool = False  # as its health watch last said
    down_until: float = 0.0  # monotonic time before which a failed worker is not routed to
    info: ModelInfo | None = None  # its model, once described
    compatible: bool = True  # serves the pool's model
    load: WorkerLoad = field(default_factory=WorkerLoad)
    routed: int = 0  # sessions routed here by this replica since its last load report

    @property
    def available(self) -> bool:
        return self.healthy and self.compatible and self.info is not None and time.monotonic() >= self.down_until

    def score(self) -> tuple:
        return self.load.sessions + self.routed, self.load.queued, self.load.kv_cache_bytes


class WorkerPool:
    def __init__(self, kind: str, addresses: Sequence[str], client_class: type[WorkerClient],
                 timeout_s: float = 30.0, resolve_every_s: float = 10.0, load_every_s: float = 1.0,
                 tls: TLSFiles | None = None) -> None:
        self.kind = kind  # "draft" or "target": the name in metrics, spans and session records
        self.tls = tls  # mutual TLS to every worker; each certificate must name the host configured
        self.addresses = list(addresses)
        self.client_class = client_class
        self.timeout_s = timeout_s
        self.resolve_every_s = resolve_every_s
        self.load_every_s = load_every_s
        self.workers: dict[str, Worker] = {}
        self.info: ModelInfo | None = None  # the pool's model: the first one described
        self._resolved: dict[str, set[str]] = {}  # what each configured address last resolved to
        self._tasks: dict[str, list[asyncio.Task]] = {}
        self._resolver: asyncio.Task | None = None

    async def start(self) -> None:
        """Resolve the addresses and follow them from now on (once: later calls do nothing)."""
        if self._resolver is None:
            self._resolver = asyncio.create_task(self._resolve_forever())
            await self._resolve()

    # --- routing ---------------------------------------------------------------------------

    def route(self, preferred: str | None = None) -> Worker | None:
        """The session's worker if available, else the least-loaded available one; None: none."""
        if (worker := self.get(preferred)) is not None:
            return worker
        candidates = [w for w in self.workers.values() if w.available]
        if not candidates:
            return None
        best = min(candidates, key=Worker.score)
        best.routed += 1
        return best

    def available(self) -> bool:
        return any(w.available for w in self.workers.values())

    def get(self, address: str | None) -> Worker | None:
        """The worker at `address` when it is available."""
        worker = self.workers.get(address) if address else None
        return worker if worker is not None and worker.available else None

    def failed(self, worker: Worker, reason: str) -> None:
        """A call to `worker` failed: route around it for a while."""
        worker.down_until = time.monotonic() + FAILED_COOLDOWN_S
        metrics.worker_failures.labels(pool=self.kind).inc()
        log.warning("%s worker %s failed (%s); routing around it", self.kind, worker.address, reason)

    async def wait_available(self, timeout_s: float) -> bool:
        """Wait up to timeout_s for an available worker."""
        deadline = time.monotonic() + timeout_s
        while not self.available():
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    async def describe(self, timeout_s: float) -> ModelInfo | None:
        """The pool's model, once a worker has described it; None if none has within timeout_s."""
        await self.wait_available(timeout_s)
        return self.info

    # --- membership, health and load ------------------------------------------------------

    async def _resolve(self) -> None:
        for address in self.addresses:
            try:
                self._resolved[address] = await resolve(address)
            except (OSError, ValueError) as e:  # keep what it named: a DNS hiccup is not a departure
                log.warning("cannot resolve %s worker address %s: %s", self.kind, address, e)
        found = set().union(*self._resolved.values())
        for address in found - self.workers.keys():
            self._add(address)
        for address in self.workers.keys() - found:
            await self._remove(address)

    async def _resolve_forever(self) -> None:
        while True:  # the first resolution is start()'s own
            await asyncio.sleep(self.resolve_every_s)
            await self._resolve()

    def _add(self, address: str) -> None:
        worker = Worker(address, self._client(address))
        self.workers[address] = worker
        self._tasks[address] = [asyncio.create_task(self._watch(worker)),
                                asyncio.create_task(self._poll_load(worker))]
        log.info("%s pool: worker %s added", self.kind, address)

    def _client(self, address: str) -> WorkerClient:
        if self.tls is None:
            return self.client_class(address, self.timeout_s)
        # The certificate names what was configured (a Service's DNS name), not the pod IP dialled.
        host = next(split_address(a)[0] for a, found in self._resolved.items() if address in found)
        return self.client_class(address, self.timeout_s, tls=self.tls, server_name=host)

    async def _remove(self, address: str) -> None:
        worker = self.workers.pop(address)
        for task in self._tasks.pop(address):
            task.cancel()
        metrics.worker_healthy.labels(pool=self.kind, address=address).set(0)
        await worker.client.close()
        log.info("%s pool: worker %s removed (no longer resolved)", self.kind, address)

    async def _watch(self, worker: Worker) -> None:
        """Follow the worker's grpc.health.v1 status; reconnect when the watch breaks."""
        stub = health_pb2_grpc.HealthStub(worker.client.channel)
        pause = 0.1
        while True:
            try:
                async for response in stub.Watch(health_pb2.HealthCheckRequest(service="")):
                    serving = response.status == health_pb2.HealthCheckResponse.SERVING
                    if serving and worker.info is None:
                        await self._describe(worker)
                    self._set_healthy(worker, serving)
                    pause = 0.1
            except grpc.aio.AioRpcError:
                pass
            self._set_healthy(worker, False)
            await asyncio.sleep(pause)
            pause = min(pause * 2, 1.0)

    def _set_healthy(self, worker: Worker, healthy: bool) -> None:
        if healthy != worker.healthy:
            log.info("%s worker %s is %s", self.kind, worker.address, "serving" if healthy else "down")
        worker.healthy = healthy
        metrics.worker_healthy.labels(pool=self.kind, address=worker.address).set(int(worker.available))

    async def _describe(self, worker: Worker) -> None:
        worker.info = await worker.client.describe()
        self.info = self.info or worker.info
        worker.compatible = _model(worker.info) == _model(self.info)
        if not worker.compatible:
            log.error("%s worker %s serves %s, not the pool's %s: never routed to", self.kind, worker.address,
                      worker.info.model, self.info.model)

    async def _poll_load(self, worker: Worker) -> None:
        while True:
            if worker.healthy:
                try:
                    worker.load, worker.routed = await worker.client.load(), 0
                except grpc.aio.AioRpcError:
                    pass  # the health watch says whether it is down
            await asyncio.sleep(self.load_every_s)

    async def close(self) -> None:
        if self._resolver:
            self._resolver.cancel()
        for address in list(self.workers):
            await self._remove(address)

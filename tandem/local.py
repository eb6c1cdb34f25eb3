"""A whole cluster on this machine: Redis (embedded unless a URL is given), pools of draft
workers and target verifiers as child processes, and the Ray Serve app behind its gRPC ingress.

A supervisor thread restarts any worker, or the embedded Redis, that dies, on the same port:
the orchestrator's pools find a worker again through their health watches, and the embedded
Redis keeps an append-only file, so its sessions survive a restart. `tandem up` runs a local
cluster until a signal; `tandem bench` runs one around its measurements."""

import concurrent.futures
import os
import secrets
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tandem.ports import free_port, port_in_use

if TYPE_CHECKING:
    from tandem.tls import TLSFiles

DRAFTERS = ("hybrid", "model", "ngram", "head", "self")  # LocalCluster's drafter: which `tandem worker` drafts
VERIFIER_DRAFTERS = ("head", "self")  # those that draft in the verifiers, with no draft workers


def verifier_args(drafter: str, head: str | None, exit_layer: int) -> tuple[str, ...]:
    """The `tandem worker target` flags a drafter needs (the head's directory, the self drafter's
    exit layer; () for the others); ValueError for a drafter that is not one, or a head or exit
    layer given to the wrong drafter or missing."""
    if drafter not in DRAFTERS:
        raise ValueError(f"drafter must be one of {DRAFTERS}, got {drafter!r}")
    if (drafter == "head") != bool(head) or (drafter == "self") != bool(exit_layer):
        raise ValueError("the head drafter needs its head directory and the self drafter its exit layer, "
                         "and only they take them")
    return ("--head", head) if head else ("--exit-layer", str(exit_layer)) if exit_layer else ()


def worker_model(kind: str, drafter: str, models: dict[str, str]) -> tuple[str, str]:
    """A cluster worker's `tandem worker` kind and model, from its kind ("draft", "target"), the
    drafter and the pair {kind: model directory}: a draft worker runs as the drafter does (the
    n-gram lookup without a model)."""
    if kind != "draft" or drafter == "model":
        return kind, models[kind]
    return drafter, "" if drafter == "ngram" else models["draft"]


SUPERVISE_EVERY_S = 0.1  # a poll() per child: a dead one is restarted within 0.1 s


def spawn_worker(kind: str, model: str, host: str, threads: int, device: str, dtype: str,
                 echo: bool = True, metrics_port: int = 0, port: int = 0,
                 tls: "TLSFiles | None" = None, args: Sequence[str] = (),
                 prefix: Sequence[str] = ()) -> tuple[subprocess.Popen, str]:
    """Start `tandem worker` as a child process; return it and the address it listens on; with
    `tls`, it serves mutual TLS only. args: more `tandem worker` flags; prefix: the command it
    runs under (the test bed's `ip netns exec NS`, which execs it: the same pid, our child)."""
    # --parent-pid: the worker stops when this process is gone, however it went (a SIGKILLed
    # launcher must not leave workers holding their models).
    cmd = [*prefix, sys.executable, "-m", "tandem.cli", "worker", kind, *(["--model", model] if model else []),
           "--host", host, "--port", str(port), "--threads", str(threads), "--device", device, "--dtype", dtype,
           "--metrics-port", str(metrics_port), "--parent-pid", str(os.getpid()), *args]
    if tls:
        cmd += ["--tls-cert", tls.cert, "--tls-key", tls.key, "--tls-ca", tls.ca]
    # An OpenMP thread that spins after its parallel region steals a core from the other
    # worker on a small machine; let idle threads sleep.
    env = {"OMP_WAIT_POLICY": "PASSIVE"} | dict(os.environ)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, start_new_session=True, env=env)
    for line in proc.stdout:
        if "listening on" in line:
            if echo:
                print(line.rstrip(), flush=True)
            address = line.split("listening on ")[1].split()[0]
            threading.Thread(target=_drain, args=(proc.stdout, echo), daemon=True).start()
            return proc, address
    raise RuntimeError(f"{kind} worker exited with {proc.wait()} before listening")


def stop_processes(procs: list[subprocess.Popen], timeout_s: float = 10.0) -> None:
    """SIGTERM them all, then wait; kill what outlives the timeout."""
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()


def _drain(stream, echo: bool) -> None:
    for line in stream:  # keep reading, or a chatty worker blocks on a full pipe
        if echo:
            print(line.rstrip(), flush=True)


@dataclass
class _Child:
    """A supervised process and how to start it again."""

    name: str
    start: Callable[[], subprocess.Popen]
    proc: subprocess.Popen
    restarts: int = 0


class Supervisor:
    """Child processes that a thread restarts when they die (with the same start function, so
    on the same port), until stop()."""

    def __init__(self, say: Callable[[str], None] = print) -> None:
        self.say = say
        self._children: dict[str, _Child] = {}
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tandem-supervisor", daemon=True)

    def add(self, name: str, start: Callable[[], subprocess.Popen], proc: subprocess.Popen | None = None) -> None:
        """Supervise `name`: `proc` if it is running already, else what start() starts."""
        self._children[name] = _Child(name, start, proc or start())

    def forget(self, name: str) -> subprocess.Popen:
        """Stop supervising `name` (it is not restarted any more); returns its process."""
        return self._children.pop(name).proc

    def proc(self, name: str) -> subprocess.Popen:
        return self._children[name].proc

    def restarts(self, name: str) -> int:
        return self._children[name].restarts

    @property
    def names(self) -> list[str]:
        return list(self._children)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping.wait(SUPERVISE_EVERY_S):
            for child in list(self._children.values()):
                code = child.proc.poll()
                if code is None or self._stopping.is_set():
                    continue
                self.say(f"tandem: {child.name} exited ({code}); restarting it")
                try:
                    child.proc, child.restarts = child.start(), child.restarts + 1
                except (RuntimeError, OSError) as e:  # try again at the next round
                    self.say(f"tandem: {child.name} did not restart: {e}")

    def stop_restarting(self) -> None:
        """Restart nothing from now on (a restart under way finishes first)."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout=60)

    def stop(self) -> None:
        """Stop restarting, then stop every child."""
        self.stop_restarting()
        stop_processes([c.proc for c in self._children.values()])
        self._children = {}


class LocalCluster:
    """Start with `start()` (or `with`); `address` is the gRPC ingress, `workers` the worker
    processes by name ("draft-0", "target-0", ...) and `addresses` where they listen;
    `supervisor` restarts any of them, and the embedded Redis ("redis"), that dies."""

    def __init__(self, draft_model: str, target_model: str, grpc_port: int, host: str = "127.0.0.1",
                 threads: int = 0, device: str = "cpu", dtype: str = "float32", max_gamma: int = 8,
                 redis_url: str | None = None, echo: bool = True, metrics_port: int = 0,
                 draft_ahead: bool = True, draft_workers: int = 1, target_workers: int = 1, replicas: int = 1,
                 options: dict | None = None, tls_dir: str | None = None, metrics_fallback: bool = False,
                 worker_args: Sequence[str] = (), drafter: str = "hybrid", http_port: int = 0,
                 head: str | None = None, exit_layer: int = 0) -> None:
        """options: more OrchestratorConfig fields (app_name, redis_retry_s, ...). tls_dir: mutual
        TLS between the orchestrator and the workers, with the CA and certificates kept there
        (made by tandem.certs when absent, or when they do not name `host`). metrics_fallback: a
        worker whose metrics port is taken gets a free one (metrics_ports says which) instead of
        failing start(). worker_args: more `tandem worker` flags for every worker. drafter: "hybrid"
        (`tandem worker hybrid` on draft_model), "model" (`tandem worker draft` on draft_model),
        "ngram" (`tandem worker ngram`, no model), or with no draft workers, the verifiers drafting:
        "head" (with `head`, an EAGLE-3 head directory: `tandem worker target --head`) or "self"
        (with the target's first `exit_layer` layers: `--exit-layer`). http_port: the
        OpenAI-compatible API's (0: a free port; options' openai_api turns the API off)."""
        self.verifier_args = verifier_args(drafter, head, exit_layer)
        self.drafter = drafter
        self.models = {"draft": draft_model, "target": target_model}
        # The target's tokenizer: the orchestrator's, and what a draft of another tokenizer maps to.
        self.tokenizer = target_model if (Path(target_model) / "tokenizer_config.json").exists() else None
        self.grpc_port, self.http_port, self.host = grpc_port, http_port, host
        draft_workers = 0 if drafter in VERIFIER_DRAFTERS else draft_workers
        self.names = [f"draft-{i}" for i in range(draft_workers)] + [f"target-{i}" for i in range(target_workers)]
        # Workers on a small machine: split the cores, or they fight over threads.
        self.threads = threads or max(1, (os.cpu_count() or 2) // len(self.names))
        self.device, self.dtype, self.max_gamma = device, dtype, max_gamma
        self.redis_url, self.echo, self.draft_ahead, self.replicas = redis_url, echo, draft_ahead, replicas
        # Prometheus: the orchestrator on metrics_port, the workers on the ports after it.
        self.metrics_ports = {name: metrics_port + i if metrics_port else 0
                              for i, name in enumerate(["orchestrator", *self.names])}
        self.options = options or {}
        self.metrics_fallback = metrics_fallback
        self.worker_args = tuple(worker_args)
        self.tls_dir = tls_dir
        self.tls = None  # {"worker": TLSFiles, "orchestrator": TLSFiles} once started with tls_dir
        self.addresses: dict[str, str] = {}  # worker addresses by name, once started
        self.supervisor = Supervisor(self._say)
        self.redis = None  # the embedded Redis, when no URL was given
        self.config = None  # the orchestrator's, once started

    @property
    def address(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def openai_base_url(self) -> str:
        """The OpenAI-compatible API's base URL (once started)."""
        return f"http://{self.host}:{self.http_port}{self.config.route_prefix.rstrip('/')}/v1"

    @property
    def workers(self) -> dict[str, subprocess.Popen]:
        """The worker processes now running, by name (a restart replaces one)."""
        return {name: self.supervisor.proc(name) for name in self.names if name in self.supervisor.names}

    def start(self) -> "LocalCluster":
        from tandem.orchestrator.app import start_ingress
        from tandem.orchestrator.config import OrchestratorConfig
        from tandem.orchestrator.redis_server import EmbeddedRedis

        try:
            self._check_metrics_ports(free_port)
            if not self.redis_url:
                # A password all the same: Redis on loopback is open to every local user otherwise.
                self.redis = EmbeddedRedis(appendonly=True, password=secrets.token_urlsafe(24))
                self.redis_url = self.redis.url
                self.supervisor.add("redis", self.redis.restart, self.redis.process)
                self._say(f"redis (embedded, append-only file in {self.redis.data_dir}, a password) "
                          f"listening on {self.redis.safe_url}")
            if self.tls_dir:
                self.tls = self._certificates()
            self._start_workers(free_port)
            config = OrchestratorConfig(
                draft_addresses=tuple(self.addresses[n] for n in self.names if n.startswith("draft")),
                target_addresses=tuple(self.addresses[n] for n in self.names if n.startswith("target")),
                redis_url=self.redis_url, tokenizer=self.tokenizer,
                max_gamma=self.max_gamma, metrics_port=self.metrics_ports["orchestrator"],
                draft_ahead=self.draft_ahead, replicas=self.replicas, metrics_host=self.host,
                tls=self.tls["orchestrator"] if self.tls else None, **self.options,
            )
            self.http_port = start_ingress(config, self.grpc_port, self.http_port, host=self.host)
            self.config = config
            self.supervisor.start()
        except BaseException:
            self.stop()
            raise
        return self

    def _check_metrics_ports(self, free_port: Callable[[], int]) -> None:
        """Before anything starts: a metrics port that is taken (another tandem up, say) becomes a
        free one with metrics_fallback, else a RuntimeError that names it."""
        for name in self.metrics_ports:
            port = self.metrics_ports[name]
            if not port_in_use(self.host, port):
                continue
            if not self.metrics_fallback:
                raise RuntimeError(f"port {port} ({name} metrics) on {self.host} is in use")
            self.metrics_ports[name] = free_port()
            self._say(f"tandem: port {port} is in use: {name} serves its metrics on {self.metrics_ports[name]}")

    def _start_workers(self, free_port: Callable[[], int]) -> None:
        """Start every worker at once (each spends seconds importing and loading its model) and
        supervise each one that started, so that stop() ends them even when another failed."""
        starters = {name: self._worker_starter(name, free_port()) for name in self.names}
        with concurrent.futures.ThreadPoolExecutor(len(starters)) as pool:
            started = {name: pool.submit(start) for name, start in starters.items()}
        failure = None
        for name, future in started.items():
            try:
                self.supervisor.add(name, starters[name], future.result())
            except BaseException as e:
                failure = failure or e
        if failure:
            raise failure

    def _worker_starter(self, name: str, port: int) -> Callable[[], subprocess.Popen]:
        """How to start (and restart) worker `name` on `port`."""
        kind, model = worker_model(name.split("-")[0], self.drafter, self.models)
        args = self.worker_args + (self.verifier_args if kind == "target" else ())
        if kind in ("draft", "hybrid") and self.tokenizer:
            args += ("--target-tokenizer", self.tokenizer)  # a draft of another tokenizer speaks the target's ids

        def start() -> subprocess.Popen:
            proc, self.addresses[name] = spawn_worker(kind, model, self.host, self.threads, self.device,
                                                      self.dtype, self.echo, self.metrics_ports[name], port,
                                                      tls=self.tls["worker"] if self.tls else None,
                                                      args=args)
            return proc

        return start

    def _certificates(self) -> dict:
        """The workers' and the orchestrator's TLS files in tls_dir, made there when needed."""
        from tandem.certs import DEFAULT_HOSTS, ensure_certs, orchestrator_files, worker_files

        if ensure_certs(self.tls_dir, [*DEFAULT_HOSTS, self.host]):
            self._say(f"tandem: made a local CA and certificates for mutual TLS in {self.tls_dir}")
        return {"worker": worker_files(self.tls_dir), "orchestrator": orchestrator_files(self.tls_dir)}

    def stop(self) -> None:
        from tandem.orchestrator.app import stop_ingress

        # First: a Ctrl-C reaches the children too, and a Redis that exits must not be restarted.
        self.supervisor.stop_restarting()
        if self.config is not None:
            stop_ingress(self.config.app_name)
            self.config = None
        self.supervisor.stop()
        if self.redis:
            self.redis.stop()
            self.redis = None

    def _say(self, line: str) -> None:
        if self.echo:
            print(line, flush=True)

    def __enter__(self) -> "LocalCluster":
        return self if self.config is not None else self.start()  # started already by start()

    def __exit__(self, *exc) -> None:
        self.stop()

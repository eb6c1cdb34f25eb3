"""A whole cluster on this machine: Redis (embedded unless a URL is given), a draft worker and
a target verifier as child processes, and the Ray Serve app behind its gRPC ingress.
`tandem up` runs one until a signal; `tandem bench` runs one around its measurements."""

import os
import subprocess
import sys
import threading
from pathlib import Path


def spawn_worker(kind: str, model: str, host: str, threads: int, device: str, dtype: str,
                 echo: bool = True, metrics_port: int = 0) -> tuple[subprocess.Popen, str]:
    """Start `tandem worker` as a child process; return it and the address it listens on."""
    cmd = [sys.executable, "-m", "tandem.cli", "worker", kind, "--model", model, "--host", host, "--port", "0",
           "--threads", str(threads), "--device", device, "--dtype", dtype, "--metrics-port", str(metrics_port)]
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


class LocalCluster:
    """Start with `start()` (or `with`); `address` is the gRPC ingress, `workers` the worker
    processes by kind ("draft", "target")."""

    def __init__(self, draft_model: str, target_model: str, grpc_port: int, host: str = "127.0.0.1",
                 threads: int = 0, device: str = "cpu", dtype: str = "float32", max_gamma: int = 8,
                 redis_url: str | None = None, echo: bool = True, metrics_port: int = 0,
                 draft_ahead: bool = True) -> None:
        self.draft_model, self.target_model = draft_model, target_model
        self.grpc_port, self.host = grpc_port, host
        # Two workers on a small machine: split the cores, or they fight over threads.
        self.threads = threads or max(1, (os.cpu_count() or 2) // 2)
        self.device, self.dtype, self.max_gamma = device, dtype, max_gamma
        self.redis_url, self.echo, self.draft_ahead = redis_url, echo, draft_ahead
        # Prometheus: the orchestrator on metrics_port, the draft and target workers on the next two.
        self.metrics_ports = {k: metrics_port + i if metrics_port else 0
                              for i, k in enumerate(("orchestrator", "draft", "target"))}
        self.workers: dict[str, subprocess.Popen] = {}
        self.addresses: dict[str, str] = {}  # worker addresses by kind, once started
        self._redis = None
        self._ingress = False

    @property
    def address(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    def start(self) -> "LocalCluster":
        from tandem.orchestrator.app import start_ingress
        from tandem.orchestrator.config import OrchestratorConfig
        from tandem.orchestrator.redis_server import EmbeddedRedis

        try:
            if not self.redis_url:
                self._redis = EmbeddedRedis()
                self.redis_url = self._redis.url
                self._say(f"redis (embedded) listening on {self.redis_url}")
            addresses = self.addresses
            for kind, model in (("draft", self.draft_model), ("target", self.target_model)):
                proc, addresses[kind] = spawn_worker(kind, model, self.host, self.threads, self.device,
                                                     self.dtype, self.echo, self.metrics_ports[kind])
                self.workers[kind] = proc
            has_tokenizer = (Path(self.target_model) / "tokenizer_config.json").exists()
            config = OrchestratorConfig(
                draft_address=addresses["draft"], target_address=addresses["target"], redis_url=self.redis_url,
                tokenizer=self.target_model if has_tokenizer else None, max_gamma=self.max_gamma,
                metrics_port=self.metrics_ports["orchestrator"], draft_ahead=self.draft_ahead,
            )
            start_ingress(config, self.grpc_port, host=self.host)
            self._ingress = True
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        from tandem.orchestrator.app import stop_ingress

        if self._ingress:
            stop_ingress()
            self._ingress = False
        stop_processes(list(self.workers.values()))
        self.workers = {}
        if self._redis:
            self._redis.stop()
            self._redis = None

    def _say(self, line: str) -> None:
        if self.echo:
            print(line, flush=True)

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

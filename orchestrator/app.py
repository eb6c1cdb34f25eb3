"""The builder: a validated OrchestratorConfig → the Ray Serve application, and the function
that runs it behind Ray Serve's gRPC ingress."""

import logging
import os
import signal
import threading
from contextlib import contextmanager

import ray
from ray import serve
from ray.serve.config import HTTPOptions, gRPCOptions

from tandem.orchestrator.config import OrchestratorConfig
from tandem.orchestrator import deployment
from tandem.ports import free_port

log = logging.getLogger("tandem.orchestrator")

# The generated add_GenerationServicer_to_server, with requests that do not parse handed on to
# the servicer (INVALID_ARGUMENT naming the field) instead of failing in the proxy as UNKNOWN.
SERVICER_FUNCTIONS = ["tandem.wire.generation.add_generation_servicer"]

# The largest request the ingress accepts (gRPC's own default): gRPC refuses a longer one with
# RESOURCE_EXHAUSTED before it is read whole. Ray's proxy allows 2 GiB by default, and its hop
# to the replica 4 MiB, which failed a larger request as INTERNAL; that hop gets room for
# Ray's envelope around the request.
MAX_REQUEST_BYTES = 4 << 20
MESSAGE_SIZE_ENV = {"RAY_SERVE_GRPC_MAX_MESSAGE_SIZE": str(MAX_REQUEST_BYTES),
                    "RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH": str(MAX_REQUEST_BYTES + (1 << 20))}

# Ray Serve's throughput-optimized mode for a Ray that tandem starts itself. Its proxy then
# streams to the replica over gRPC instead of Ray object references, and user code runs on
# the replica's main loop: Ray's CPU per streamed chunk drops from ~5.6 to ~3.6 ms, CPU the
# workers get back on a small machine (benchmarks/LOG.md). Direct ingress stays off: it
# moves the ingress to per-replica ports meant for HAProxy, and tandem's is one known port.
# RAY_SERVE_PROXY_USE_GRPC is named because Ray derives it before applying the mode.
# A user's own environment wins; a Ray cluster at RAY_ADDRESS is configured by its owner.
SERVE_THROUGHPUT_ENV = {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", "RAY_SERVE_ENABLE_DIRECT_INGRESS": "0",
                        "RAY_SERVE_PROXY_USE_GRPC": "1"}


def build_app(config: OrchestratorConfig) -> serve.Application:
    # Serve queues what is over max_ongoing_requests without bound: keep it above the replica's
    # own cap, so that a replica refuses a session at once instead (and still answers Cancel).
    service = deployment.with_openai_api if config.openai_api else deployment.grpc_only
    return service.options(num_replicas=config.replicas, max_ongoing_requests=config.max_sessions + 16).bind(config)


def start_ingress(config: OrchestratorConfig, grpc_port: int, http_port: int = 0,
                  host: str = "127.0.0.1") -> int:
    """Start Ray (local unless RAY_ADDRESS says otherwise), Serve's gRPC and HTTP proxies, and
    the app; return the HTTP port (http_port, or a free one for 0). Returns once the app is
    running; gRPC requests need the metadata ("application", app_name), HTTP ones go under
    config.route_prefix. Serve's proxies start once per Ray: a second application on the same
    Ray shares the first one's ports."""
    if not ray.is_initialized():
        for name, value in (SERVE_THROUGHPUT_ENV | MESSAGE_SIZE_ENV).items():
            os.environ.setdefault(name, value)  # inherited by the Ray processes started below
        _init_ray()
    http_port = http_port or free_port()
    serve.start(
        http_options=HTTPOptions(host=host, port=http_port),
        grpc_options=gRPCOptions(port=grpc_port, grpc_servicer_functions=SERVICER_FUNCTIONS),
    )
    serve.run(build_app(config), name=config.app_name, route_prefix=config.route_prefix, blocking=False)
    return http_port


def _init_ray(attempts: int = 2) -> None:
    """ray.init, again if the local node does not register within Ray's fixed 30 s: seen here
    once, on a busy 2-core machine, a raylet that never started; a second start succeeded."""
    for attempt in range(1, attempts + 1):
        try:
            with _own_sigterm():
                ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False,
                         runtime_env={"env_vars": {"PYTHONWARNINGS": "ignore"}})
            return
        except Exception as e:  # Ray raises a bare Exception for it
            if attempt == attempts or "timed out during startup" not in str(e):
                raise
            log.warning("Ray's local node did not start (%s); starting it again", e)
            ray.shutdown()


@contextmanager
def _own_sigterm():
    """Keep the process's SIGTERM handler through what the block does: Ray's core worker installs
    one that prints a stack and aborts, which would take a stop request (`tandem up`'s, a pod's)
    out of the process's own hands and leave Ray's other processes running. A SIGTERM that comes
    meanwhile waits, blocked, for the process's own handler (seen once under load: one during
    ray.init aborted `tandem up`)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handler = signal.getsignal(signal.SIGTERM)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        yield
    finally:
        if handler is not None:  # None: one installed outside Python, which cannot be put back
            signal.signal(signal.SIGTERM, handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def stop_ingress(app_name: str = "tandem") -> None:
    """Delete tandem's application; shut Serve and Ray down only when nothing else runs on
    them (a Ray cluster joined through RAY_ADDRESS keeps its other applications)."""
    serve.delete(app_name)
    if not serve.status().applications:
        serve.shutdown()
        ray.shutdown()

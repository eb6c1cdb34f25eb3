"""A worker's Prometheus metrics: live sessions, KV-cache memory, compute time and cache
misses per RPC, sessions and tokens per forward pass. Served over HTTP by `serve(port, runtime)`."""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

REGISTRY = CollectorRegistry()

sessions = Gauge("tandem:worker_sessions", "Sessions whose KV cache this worker holds.", registry=REGISTRY)
kv_cache_bytes = Gauge("tandem:worker_kv_cache_bytes", "Memory held by the sessions' KV caches.",
                       registry=REGISTRY)
compute = Histogram("tandem:worker_compute_seconds", "Model and sampling time per call.", ["rpc"],
                    buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0),
                    registry=REGISTRY)
cache_misses = Counter("tandem:worker_cache_misses", "Calls for a session the worker did not hold "
                       "(the caller re-sends the whole sequence).", ["rpc"], registry=REGISTRY)

batch_sessions = Histogram("tandem:worker_batch_sessions", "Sessions whose steps shared one forward pass.",
                           buckets=(1, 2, 4, 8, 16, 32, 64, 128), registry=REGISTRY)
batch_tokens = Histogram("tandem:worker_batch_tokens", "Tokens one forward pass ran, all sessions together.",
                         buckets=(1, 4, 16, 64, 128, 256, 512, 1024, 4096), registry=REGISTRY)


def serve(port: int, runtime, host: str = "127.0.0.1") -> None:
    """Expose the metrics on http://host:port/metrics (a daemon thread; the worker passes the
    host its gRPC server binds, so that the metrics are no more exposed than the worker); the
    gauges read the runtime at each scrape. Raises OSError when the port is taken."""
    sessions.set_function(lambda: runtime.num_sessions)
    kv_cache_bytes.set_function(lambda: runtime.cache_bytes)
    start_http_server(port, addr=host, registry=REGISTRY)

"""What a worker's Prometheus metrics say of its forward passes (services/metrics.py), read over
HTTP: benchmarks take two readings around a run for how full its passes were."""

import re
import urllib.request


def batch_histogram(host: str, port: int, name: str) -> tuple[float, float]:
    """(sum, count) of the worker's tandem:worker_batch_{name} histogram ("sessions": the
    sessions its passes ran and its passes; "tokens": their tokens and its passes)."""
    text = urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10).read().decode()
    return tuple(float(re.search(rf"^tandem:worker_batch_{name}_{part} (\S+)", text, re.M).group(1))
                 for part in ("sum", "count"))

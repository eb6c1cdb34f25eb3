"""The orchestrator's Prometheus metrics, with vLLM's speculative-decoding names and meaning
under a `tandem:` prefix, and the four spec-decode counters under vLLM's own names too, read
from tandem's when scraped (counters are exposed with prometheus_client's `_total` suffix, as
vLLM's are). Served over
HTTP by `serve(port)` from the Ray Serve replica's process, and on the OpenAI API's /metrics."""

import functools
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily

from tandem.wire.generation import CycleStats

REGISTRY = CollectorRegistry()
_LATENCY = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_PART = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)

num_drafts = Counter("tandem:spec_decode_num_drafts", "Cycles that drafted at least one token.",
                     registry=REGISTRY)
num_draft_tokens = Counter("tandem:spec_decode_num_draft_tokens", "Tokens drafted.", registry=REGISTRY)
num_accepted_tokens = Counter("tandem:spec_decode_num_accepted_tokens", "Drafted tokens the target accepted.",
                              registry=REGISTRY)
num_accepted_tokens_per_pos = Counter(
    "tandem:spec_decode_num_accepted_tokens_per_pos",
    "Accepted drafted tokens by their 0-based position in the block; they sum to num_accepted_tokens.",
    ["position"], registry=REGISTRY)
gamma = Histogram("tandem:spec_decode_gamma", "γ chosen per cycle (0: plain target decoding).",
                  buckets=(0, 1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 32, 64), registry=REGISTRY)
cycle_part = Histogram("tandem:cycle_part_seconds", "Per-cycle time split: draft, verify, transport, redis, "
                       "orchestration.", ["part"], buckets=_PART, registry=REGISTRY)
time_to_first_token = Histogram("tandem:time_to_first_token_seconds", "Time to the first generated token.",
                                buckets=_LATENCY, registry=REGISTRY)
inter_token_latency = Histogram("tandem:inter_token_latency_seconds", "Wait before each later token (0 for "
                                "tokens of the same cycle).", buckets=(0.0,) + _LATENCY, registry=REGISTRY)
e2e_request_latency = Histogram("tandem:e2e_request_latency_seconds", "Request to last token.",
                                buckets=_LATENCY, registry=REGISTRY)
request_success = Counter("tandem:request_success", "Finished requests.", ["finished_reason"], registry=REGISTRY)

# The cluster: worker health, failures and failovers, re-prefills, resumes.
worker_healthy = Gauge("tandem:worker_healthy", "1 while a worker serves and is routed to.", ["pool", "address"],
                       registry=REGISTRY)
worker_failures = Counter("tandem:worker_failures", "Worker calls that failed (UNAVAILABLE, deadline, a reset "
                          "stream).", ["pool"], registry=REGISTRY)
failovers = Counter("tandem:failovers", "Sessions moved to another worker of a pool.", ["pool"], registry=REGISTRY)
reprefills = Counter("tandem:reprefills", "Whole sequences sent again to a worker: it had lost the session "
                     "(cache_miss) or the session moved to it (failover).", ["pool", "reason"], registry=REGISTRY)
undrafted_cycles = Counter("tandem:undrafted_cycles", "Cycles run at γ = 0 because no draft worker was available.",
                           registry=REGISTRY)
dropped_blocks = Counter("tandem:dropped_blocks", "Blocks a verifier drafted that it did not verify: it no longer "
                         "kept their distributions (the session re-prefilled or moved).", registry=REGISTRY)
resumes = Counter("tandem:resumes", "Sessions resumed from Redis.", registry=REGISTRY)
store_unavailable = Counter("tandem:store_unavailable", "Requests that ended because Redis stayed unreachable.",
                        registry=REGISTRY)

# Labelled series looked up once (a labels() call costs a lock and a dictionary walk per cycle).
_PART_SERIES = [(f"{part}_ms", cycle_part.labels(part=part))
                for part in ("draft", "verify", "transport", "redis", "orchestration")]


@functools.cache
def _accepted_at(position: int):
    return num_accepted_tokens_per_pos.labels(position=str(position))


class _VllmNames:
    """The four spec-decode counters again under vLLM's own names and labels, for the dashboards
    and tools built on vLLM's (`vllm bench serve` reads them from the OpenAI API's /metrics):
    read from tandem's at scrape time, so a cycle counts once. Labelled with the served model
    once the replica knows it (`serve_model`); nothing before."""

    COUNTERS = (num_drafts, num_draft_tokens, num_accepted_tokens, num_accepted_tokens_per_pos)

    def __init__(self) -> None:
        self.model: str | None = None

    def describe(self) -> list:
        return []  # names known only once a model is served; none clash with tandem's

    def collect(self):
        if self.model is None:
            return
        for counter in self.COUNTERS:
            for family in counter.collect():
                extra = ["position"] if counter is num_accepted_tokens_per_pos else []
                renamed = CounterMetricFamily(family.name.replace("tandem:", "vllm:", 1), family.documentation,
                                              labels=["model_name", "engine", *extra])
                for sample in family.samples:
                    if sample.name.endswith("_total"):
                        renamed.add_metric([self.model, "0", *(sample.labels[k] for k in extra)], sample.value)
                yield renamed


_vllm_names = _VllmNames()
REGISTRY.register(_vllm_names)


def serve_model(model: str) -> None:
    """Name the model the replica serves: vLLM's names of the counters carry it from now on."""
    _vllm_names.model = model


def serve(port: int, host: str = "127.0.0.1") -> None:
    """Expose the metrics on http://host:port/metrics (a daemon thread)."""
    start_http_server(port, addr=host, registry=REGISTRY)


def observe_cycle(c: CycleStats) -> None:
    gamma.observe(c.gamma)
    if c.gamma:
        num_drafts.inc()
        num_draft_tokens.inc(c.gamma)
        num_accepted_tokens.inc(c.accepted)
        for position in range(c.accepted):
            _accepted_at(position).inc()
    for field, series in _PART_SERIES:
        series.observe(getattr(c, field) / 1e3)


class RequestClock:
    """Times one request's deliveries: time to first token, inter-token latency, end to end."""

    def __init__(self) -> None:
        self.arrived = self.previous = time.perf_counter()
        self.first = True

    def delivered(self, tokens: int, finish_reason: str = "") -> None:
        """A cycle's tokens go to the client; the last delivery carries the finish reason."""
        now = time.perf_counter()
        (time_to_first_token if self.first else inter_token_latency).observe(now - self.previous)
        for _ in range(tokens - 1):  # the rest of a cycle's burst arrives at once
            inter_token_latency.observe(0.0)
        self.first, self.previous = False, now
        if finish_reason:
            e2e_request_latency.observe(now - self.arrived)
            request_success.labels(finished_reason=finish_reason).inc()

"""The orchestrator's Prometheus metrics, with vLLM's speculative-decoding names and meaning
under a `tandem:` prefix, and the four spec-decode counters under vLLM's own names too
(counters are exposed with prometheus_client's `_total` suffix, as vLLM's are). Served over
HTTP by `serve(port)` from the Ray Serve replica's process, and on the OpenAI API's /metrics."""

import functools
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

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

# The same four under vLLM's own names and labels, for the dashboards and tools built on vLLM's
# (`vllm bench serve` reads them from the OpenAI API's /metrics): labelled with the served model
# once the replica knows it (`serve_model`).
_VLLM_LABELS = ["model_name", "engine"]
vllm_num_drafts = Counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", _VLLM_LABELS,
                          registry=REGISTRY)
vllm_num_draft_tokens = Counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", _VLLM_LABELS,
                                registry=REGISTRY)
vllm_num_accepted_tokens = Counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.",
                                   _VLLM_LABELS, registry=REGISTRY)
vllm_num_accepted_tokens_per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                                           "Accepted tokens per draft position.", [*_VLLM_LABELS, "position"],
                                           registry=REGISTRY)

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
resumes = Counter("tandem:resumes", "Sessions resumed from Redis.", registry=REGISTRY)
store_unavailable = Counter("tandem:store_unavailable", "Requests that ended because Redis stayed unreachable.",
                        registry=REGISTRY)

# Labelled series looked up once (a labels() call costs a lock and a dictionary walk per cycle).
_PART_SERIES = [(f"{part}_ms", cycle_part.labels(part=part))
                for part in ("draft", "verify", "transport", "redis", "orchestration")]


@functools.cache
def _accepted_at(position: int):
    return num_accepted_tokens_per_pos.labels(position=str(position))


class _VllmSeries:
    """vLLM's four counters, labelled for one model."""

    def __init__(self, model: str) -> None:
        self.labels = {"model_name": model, "engine": "0"}
        self.drafts = vllm_num_drafts.labels(**self.labels)
        self.draft_tokens = vllm_num_draft_tokens.labels(**self.labels)
        self.accepted = vllm_num_accepted_tokens.labels(**self.labels)

    @functools.cache
    def accepted_at(self, position: int):
        return vllm_num_accepted_tokens_per_pos.labels(**self.labels, position=str(position))

    def observe(self, c: CycleStats) -> None:
        self.drafts.inc()
        self.draft_tokens.inc(c.gamma)
        self.accepted.inc(c.accepted)
        for position in range(c.accepted):
            self.accepted_at(position).inc()


_vllm: _VllmSeries | None = None


def serve_model(model: str) -> None:
    """Name the model the replica serves: vLLM's counters count under it from now on."""
    global _vllm
    _vllm = _VllmSeries(model)


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
        if _vllm is not None:
            _vllm.observe(c)
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

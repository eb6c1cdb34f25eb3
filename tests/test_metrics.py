"""Each process's Prometheus endpoint parses, and the counters move as a known generation says."""

import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

import tandem

pytestmark = pytest.mark.cluster


def scrape(port: int, timeout_s: float = 60.0) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} from http://127.0.0.1:port/metrics."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            break
        except OSError:  # the replica may still be starting its endpoint
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples, name, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def per_position(samples) -> float:
    return sum(v for (name, _), v in samples.items() if name == "tandem:spec_decode_num_accepted_tokens_per_pos_total")


def test_orchestrator_counters_follow_a_known_generation(cluster, pair):
    port = cluster["config"].metrics_port
    with tandem.Client(cluster["address"], timeout_s=120) as client:
        client.generate(prompt_token_ids=pair["prompts"][0], max_tokens=4, temperature=0)  # the replica is up
        before = scrape(port)
        result = client.generate(prompt_token_ids=pair["prompts"][5], max_tokens=16, temperature=0, gamma=4)
    after = scrape(port)
    s = result.stats

    def delta(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("tandem:spec_decode_num_drafts_total") == sum(g > 0 for g in s.gammas)
    assert delta("tandem:spec_decode_num_draft_tokens_total") == s.drafted_tokens
    assert delta("tandem:spec_decode_num_accepted_tokens_total") == s.accepted_tokens <= s.drafted_tokens
    assert per_position(after) - per_position(before) == s.accepted_tokens
    assert per_position(after) == value(after, "tandem:spec_decode_num_accepted_tokens_total")
    for i in range(4):  # position i is accepted in every cycle that accepted more than i tokens
        assert delta("tandem:spec_decode_num_accepted_tokens_per_pos_total", position=str(i)) == \
            sum(c.accepted > i for c in s.per_cycle)
    assert delta("tandem:spec_decode_gamma_count") == s.cycles
    assert delta("tandem:spec_decode_gamma_sum") == sum(s.gammas)
    assert delta("tandem:cycle_part_seconds_count", part="verify") == s.cycles
    assert delta("tandem:time_to_first_token_seconds_count") == 1
    # The pools: both workers healthy, and nothing failed over or re-prefilled in a quiet cluster.
    workers = cluster["config"]
    assert value(after, "tandem:worker_healthy", pool="draft", address=workers.draft_addresses[0]) == 1
    assert value(after, "tandem:worker_healthy", pool="target", address=workers.target_addresses[0]) == 1
    assert delta("tandem:failovers_total", pool="target") == delta("tandem:reprefills_total", pool="target",
                                                                    reason="cache_miss") == 0
    assert delta("tandem:inter_token_latency_seconds_count") == len(result.token_ids) - 1
    assert delta("tandem:e2e_request_latency_seconds_count") == 1
    # The waits add up: first token plus the later ones is the request's whole latency.
    waits = delta("tandem:time_to_first_token_seconds_sum") + delta("tandem:inter_token_latency_seconds_sum")
    assert waits == pytest.approx(delta("tandem:e2e_request_latency_seconds_sum"), rel=1e-6)
    assert 0 < delta("tandem:e2e_request_latency_seconds_sum") < 120
    assert delta("tandem:request_success_total", finished_reason=result.finish_reason) == 1


def test_worker_endpoints_report_sessions_cache_memory_and_compute(cluster, workers, pair):
    ports = workers["metrics_ports"]
    before = {kind: scrape(port) for kind, port in ports.items()}
    with tandem.Client(cluster["address"], timeout_s=120) as client:
        chunks = client.stream(prompt_token_ids=pair["prompts"][7], max_tokens=12, temperature=0, gamma=3)
        next(chunks)
        during = {kind: scrape(port) for kind, port in ports.items()}  # the session is live on both
        *_, last = chunks
    after = {kind: scrape(port) for kind, port in ports.items()}
    result = last.stats
    # A draft call per drafting cycle whose block was not drafted ahead, one per answered
    # draft-ahead call, and maybe one more: a draft-ahead call cancelled as the generation ended.
    calls = sum(c.gamma > 0 and not c.drafted_ahead for c in result.per_cycle) + sum(c.ahead_ms > 0 for c in result.per_cycle)
    proposes = value(after["draft"], "tandem:worker_compute_seconds_count", rpc="Propose") - \
        value(before["draft"], "tandem:worker_compute_seconds_count", rpc="Propose")
    assert calls <= proposes <= calls + 1
    assert value(after["target"], "tandem:worker_compute_seconds_count", rpc="Verify") - \
        value(before["target"], "tandem:worker_compute_seconds_count", rpc="Verify") == result.cycles
    for kind in ("draft", "target"):
        assert value(during[kind], "tandem:worker_sessions") >= 1
        assert value(during[kind], "tandem:worker_kv_cache_bytes") > 0
        # The orchestrator releases the session as the stream ends (just after its last chunk).
        expected, deadline = value(during[kind], "tandem:worker_sessions") - 1, time.monotonic() + 10
        while value(after[kind], "tandem:worker_sessions") != expected and time.monotonic() < deadline:
            time.sleep(0.1)
            after[kind] = scrape(ports[kind])
        assert value(after[kind], "tandem:worker_sessions") == expected

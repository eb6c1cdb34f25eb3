"""One request is one trace across the orchestrator and both workers, exported over OTLP/gRPC
to a real receiver (tests/conftest.py), with a span per cycle and the GenAI attributes."""

import time

import pytest
from opentelemetry.sdk.trace import TracerProvider

import tandem

from support.spans import attributes

pytestmark = pytest.mark.cluster
SERVICES = {"tandem-orchestrator", "tandem-draft-worker", "tandem-target-verifier"}
SERVER, CLIENT = 2, 3  # opentelemetry.proto Span.SpanKind


def collect(otlp, trace_id: bytes, cycles: int, timeout_s: float = 30.0) -> list[tuple[str, object]]:
    """The trace's spans, once the request span and every cycle span have arrived."""
    deadline = time.monotonic() + timeout_s
    while True:
        spans = otlp.trace(trace_id)
        names = [span.name for _, span in spans]
        if any(n.startswith("text_completion") for n in names) and names.count("cycle") >= cycles \
                and {service for service, _ in spans} >= SERVICES or time.monotonic() > deadline:
            time.sleep(0.3)  # let the workers' last batches land too
            return otlp.trace(trace_id)
        time.sleep(0.1)


def test_a_request_joins_the_callers_trace_across_three_services(cluster, otlp, pair):
    tracer = TracerProvider().get_tracer("test")  # the caller's own tracing
    prompt = pair["prompts"][3]
    with tracer.start_as_current_span("caller") as caller:
        with tandem.Client(cluster["address"], timeout_s=120) as client:
            result = client.generate(prompt_token_ids=prompt, max_tokens=12, temperature=0, gamma=3, seed=7)
    context = caller.get_span_context()
    trace_id = context.trace_id.to_bytes(16, "big")
    spans = collect(otlp, trace_id, result.stats.cycles)
    assert {service for service, _ in spans} == SERVICES
    by_id = {span.span_id: (service, span) for service, span in spans}

    # The request span: a child of the caller's, with the GenAI semantic-convention attributes.
    [(service, request)] = [(sv, sp) for sv, sp in spans if sp.name.startswith("text_completion")]
    assert service == "tandem-orchestrator" and request.kind == SERVER
    assert request.name == "text_completion target"
    assert request.parent_span_id == context.span_id.to_bytes(8, "big")
    a = attributes(request)
    assert a["gen_ai.operation.name"] == "text_completion" and a["gen_ai.request.model"] == "target"
    assert a["gen_ai.request.temperature"] == 0.0 and a["gen_ai.request.max_tokens"] == 12
    assert a["gen_ai.request.seed"] == 7 and a["gen_ai.request.top_k"] == 0 and a["gen_ai.request.top_p"] == 1.0
    assert a["gen_ai.usage.input_tokens"] == len(prompt)
    assert a["gen_ai.usage.output_tokens"] == len(result.token_ids)
    assert a["gen_ai.response.finish_reasons"] == [result.finish_reason]
    assert a["gen_ai.response.id"] == result.session_id

    # One span per cycle under the request span, in order, agreeing with the returned stats.
    cycles = sorted((sp for _, sp in spans if sp.name == "cycle"), key=lambda sp: attributes(sp)["tandem.cycle.index"])
    assert len(cycles) == result.stats.cycles
    for i, (span, stats) in enumerate(zip(cycles, result.stats.per_cycle)):
        c = attributes(span)
        assert span.parent_span_id == request.span_id and c["tandem.cycle.index"] == i
        assert c["tandem.cycle.gamma"] == stats.gamma and c["tandem.cycle.accepted"] == stats.accepted
        assert c["tandem.cycle.ended_with"] == ("bonus" if stats.accepted == stats.gamma else "recovered")
        assert c["tandem.cycle.drafted_ahead"] == stats.drafted_ahead
        assert 0 < c["tandem.cycle.alpha_estimate"] < 1
    cycle_ids = {span.span_id for span in cycles}

    # Client spans for every worker call under a cycle; the workers' server spans under them.
    calls = [sp for _, sp in spans if sp.kind == CLIENT and sp.name.endswith(("/Propose", "/Verify"))]
    assert all(sp.parent_span_id in cycle_ids for sp in calls)
    assert sum(sp.name.endswith("/Verify") for sp in calls) == result.stats.cycles
    proposes = [sp for sp in calls if sp.name.endswith("/Propose")]
    ahead = [sp for sp in proposes if attributes(sp).get("tandem.draft_ahead")]
    cycles_stats = result.stats.per_cycle
    assert len(proposes) - len(ahead) == sum(c.gamma > 0 and not c.drafted_ahead for c in cycles_stats)
    # Drafting ahead: one call per answered one, and maybe one cancelled as the generation ended.
    assert 0 <= len(ahead) - sum(c.ahead_ms > 0 for c in cycles_stats) <= 1
    servers = [(sv, sp) for sv, sp in spans if sp.kind == SERVER and sp.name.startswith("tandem.v1.")]
    for service, span in servers:
        parent_service, parent = by_id[span.parent_span_id]
        assert parent.kind == CLIENT and parent.name == span.name and parent_service == "tandem-orchestrator"
        assert service == {"DraftWorker": "tandem-draft-worker", "TargetVerifier": "tandem-target-verifier"}[
            span.name.split(".")[2].split("/")[0]]
        if not span.name.endswith("/Release"):
            assert attributes(span)["tandem.compute_ms"] > 0
            assert attributes(span)["tandem.session_id"] == result.session_id
    answered = {sp.span_id for sp in calls if sp.status.code != 2}  # 2: ERROR (a cancelled call)
    served = {sp.parent_span_id for _, sp in servers if not sp.name.endswith("/Release")}
    assert answered <= served <= {sp.span_id for sp in calls}
    commits = [sp for _, sp in spans if sp.name == "redis commit"]
    assert len(commits) == result.stats.cycles and all(sp.parent_span_id in cycle_ids for sp in commits)

    # Each batched call is a step of its worker: a span of its own trace, linked to its rows' calls.
    steps = linked_steps(otlp, answered)
    linked = [(link.trace_id, link.span_id) for step in steps for link in step.links]
    ours = [span_id for trace, span_id in linked if trace == trace_id]
    assert answered <= set(ours) <= {sp.span_id for sp in calls} and len(ours) == len(set(ours))
    for step in steps:
        assert step.kind == CLIENT and step.parent_span_id == b"" and step.trace_id != trace_id
        assert step.name.endswith(("/ProposeBatch", "/VerifyBatch")) and attributes(step)["tandem.rows"] >= 1


def linked_steps(otlp, span_ids: set[bytes], timeout_s: float = 30.0) -> list:
    """The batched calls' spans linked to any of these spans, once every one of them is linked."""
    deadline = time.monotonic() + timeout_s
    while True:
        with otlp.lock:
            steps = [sp for _, sp in otlp.spans if any(link.span_id in span_ids for link in sp.links)]
        if {link.span_id for sp in steps for link in sp.links} >= span_ids or time.monotonic() > deadline:
            return steps
        time.sleep(0.1)


def test_without_a_caller_trace_a_request_is_its_own_trace(cluster, otlp, pair):
    with tandem.Client(cluster["address"], timeout_s=120) as client:
        result = client.generate(prompt_token_ids=pair["prompts"][4], max_tokens=8, temperature=0, gamma=2)
    deadline = time.monotonic() + 30
    request = None
    while request is None and time.monotonic() < deadline:
        time.sleep(0.1)
        with otlp.lock:
            request = next((sp for _, sp in otlp.spans if sp.name.startswith("text_completion")
                            and attributes(sp).get("gen_ai.response.id") == result.session_id), None)
    assert request is not None and request.parent_span_id == b""
    spans = collect(otlp, request.trace_id, result.stats.cycles)
    assert {service for service, _ in spans} == SERVICES


def test_an_adaptive_cycle_shows_the_rates_its_gamma_was_chosen_by(cluster, otlp, pair):
    """Adaptive γ: a cycle whose γ the policy chose shows S(γ), γ = 0 … γ_max, as it saw them (the
    costs measured by then: the first cycles draft the initial γ). Its γ is their best, or less
    where the request wants fewer tokens, or a probe's (γ = 0 best)."""
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("caller") as caller:
        with tandem.Client(cluster["address"], timeout_s=120) as client:
            result = client.generate(prompt_token_ids=pair["prompts"][5], max_tokens=32, temperature=0, seed=7)
    spans = collect(otlp, caller.get_span_context().trace_id.to_bytes(16, "big"), result.stats.cycles)
    cycles = [attributes(sp) for _, sp in spans if sp.name == "cycle"]
    chosen = [c for c in cycles if "tandem.cycle.tokens_per_ms" in c]
    assert chosen
    for c in chosen:
        rates, gamma = list(c["tandem.cycle.tokens_per_ms"]), c["tandem.cycle.gamma"]
        best = rates.index(max(rates))
        assert len(rates) == 9 and all(r > 0 for r in rates)  # γ_max = 8
        assert gamma <= best or best == 0


def test_tracing_cost_harness_compares_sampled_and_sampled_out_requests(cluster, otlp, pair, tmp_path):
    from tandem.bench import tracing_cost

    prompts = pair["prompts"][8:10]
    result, example = tracing_cost.measure(cluster["address"], prompts, 6, 0, otlp, progress=False, gamma=2)
    assert result["identical_outputs"] == 2  # tracing never changes what is generated
    assert result["cycle_split"]["traced"]["total_ms"] > 0 and result["spans_exported_per_traced_request"] > 0
    assert {service for service, _ in example} == SERVICES  # a sampled caller: all three services export
    tracing_cost.write(result, example, tmp_path)
    assert {"tracing_overhead.json", "tracing_overhead.md", "tracing_overhead.png", "trace_timeline.png"} <= {
        p.name for p in tmp_path.iterdir()}


def test_a_sampled_out_caller_gets_no_spans_from_any_service(cluster, otlp, pair):
    from opentelemetry import context, trace

    from tandem.bench.tracing_cost import caller_context

    time.sleep(1.5)  # ten export intervals of the test's batch processors: earlier spans are in
    with otlp.lock:
        before = len(otlp.spans)
    caller = caller_context(sampled=False)
    token = context.attach(caller)
    try:
        with tandem.Client(cluster["address"], timeout_s=120) as client:
            client.generate(prompt_token_ids=pair["prompts"][11], max_tokens=6, temperature=0, gamma=2)
    finally:
        context.detach(token)
    time.sleep(1.5)
    # Not under the caller's trace, and no orphan spans elsewhere: every service honoured the flag.
    with otlp.lock:
        assert otlp.spans[before:] == []
    assert otlp.trace(trace.get_current_span(caller).get_span_context().trace_id.to_bytes(16, "big")) == []


@pytest.mark.parametrize("env, on", [
    ({}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}, True),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4317"}, True),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_SDK_DISABLED": "true"}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_TRACES_EXPORTER": "none"}, False),
], ids=["no endpoint", "endpoint", "traces endpoint", "sdk disabled", "exporter none"])
def test_tracing_is_on_only_when_the_environment_asks(monkeypatch, env, on):
    from tandem import tracing

    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_SDK_DISABLED",
                 "OTEL_TRACES_EXPORTER"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert tracing.enabled() is on


def test_metadata_carries_the_current_span_as_traceparent():
    from opentelemetry import context, trace

    from tandem import tracing
    from tandem.bench.tracing_cost import caller_context

    assert tracing.metadata() == ()  # no current span: nothing to send
    caller = caller_context(sampled=True)
    token = context.attach(caller)
    try:
        [(key, value)] = tracing.metadata()
    finally:
        context.detach(token)
    span_context = trace.get_current_span(caller).get_span_context()
    assert key == "traceparent" and value == f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-01"
    assert trace.get_current_span(tracing.extract([(key, value)])).get_span_context().trace_id == span_context.trace_id

"""OpenTelemetry tracing, configured only through the standard OTEL_* environment variables.

Off unless an OTLP endpoint is set (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or
`OTEL_EXPORTER_OTLP_ENDPOINT`), and off when `OTEL_SDK_DISABLED=true` or
`OTEL_TRACES_EXPORTER=none`. When on: OTLP over gRPC, batch export (`OTEL_BSP_*`), sampling by
`OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG`, resource attributes from
`OTEL_RESOURCE_ATTRIBUTES`, and `service.name` from `OTEL_SERVICE_NAME` or else the process's
own ("tandem-orchestrator", "tandem-draft-worker", "tandem-target-verifier"). Context travels
as W3C `traceparent` in gRPC metadata (`OTEL_PROPAGATORS` can change the format).

A process that has not set tracing up makes no spans at all: `start_span` and `span` hand out
the invalid span, so the per-cycle path pays nothing when tracing is off.
"""

import logging
import os
from contextlib import contextmanager

from opentelemetry import propagate, trace
from opentelemetry.context import Context

log = logging.getLogger("tandem.tracing")
tracer = trace.get_tracer("tandem")
_configured = False


def enabled() -> bool:
    """Whether the environment asks for traces."""
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    if os.environ.get("OTEL_TRACES_EXPORTER", "otlp").lower() == "none":
        return False
    return bool(os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def setup(service_name: str) -> bool:
    """Install an exporting tracer provider for this process, once; False when tracing is off."""
    global _configured
    if _configured or not enabled():
        return _configured
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    if protocol and protocol != "grpc":
        log.warning("OTEL_EXPORTER_OTLP_PROTOCOL=%s is not supported; exporting OTLP over gRPC", protocol)
    # OTEL_SERVICE_NAME, when set, names every process; otherwise each names itself.
    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: service_name}
    provider = TracerProvider(resource=Resource.create(attributes))  # the sampler comes from OTEL_TRACES_SAMPLER
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))  # endpoint and headers from OTEL_*
    trace.set_tracer_provider(provider)
    _configured = True
    return True


def start_span(name: str, parent: Context | None = None, **kwargs) -> trace.Span:
    """A started span when this process traces (end it yourself), else the invalid span."""
    return tracer.start_span(name, context=parent, **kwargs) if _configured else trace.INVALID_SPAN


@contextmanager
def span(name: str, parent: Context | None = None, **kwargs):
    """A current span for a `with` block when this process traces, else the invalid span."""
    if not _configured:
        yield trace.INVALID_SPAN
        return
    with tracer.start_as_current_span(name, context=parent, **kwargs) as current:
        yield current


@contextmanager
def linked_span(name: str, carriers, **kwargs):
    """A current span of a trace of its own, linked to the sampled spans that `carriers` (trace
    contexts, as extract takes them) name: work done for many callers at once, such as a batched
    call's rows. The invalid span when this process does not trace or none of them is sampled (a
    sampled-out caller gets no span from anything done for it)."""
    links = []
    if _configured:
        for carrier in carriers:
            linked = trace.get_current_span(extract(carrier)).get_span_context()
            if linked.is_valid and linked.trace_flags.sampled:
                links.append(trace.Link(linked))
    if not links:
        yield trace.INVALID_SPAN
        return
    with tracer.start_as_current_span(name, context=Context(), links=links, **kwargs) as current:
        yield current


def shutdown() -> None:
    """Flush and stop the exporter (also done at interpreter exit)."""
    provider = trace.get_tracer_provider()
    if _configured and hasattr(provider, "shutdown"):
        provider.shutdown()


def metadata(context: Context | None = None) -> tuple[tuple[str, str], ...]:
    """gRPC metadata carrying the context's span (the current one by default); empty without one."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=context)
    return tuple(carrier.items())


def extract(carrier) -> Context:
    """The remote parent a caller sent (an empty context if none), from gRPC metadata (pairs)
    or a mapping (a streamed request's trace_context)."""
    return propagate.extract(dict(carrier or ()))

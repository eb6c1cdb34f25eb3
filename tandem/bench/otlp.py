"""A minimal OTLP/gRPC trace receiver on 127.0.0.1 that keeps every span sent to it: the
collector of the tracing-overhead benchmark (and of the tracing tests)."""

import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


class OTLPReceiver:
    """Start it, point OTEL_EXPORTER_OTLP_ENDPOINT at `endpoint`, read `spans`."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, object]] = []  # (service.name, opentelemetry.proto Span)
        self.lock = threading.Lock()
        self.server = grpc.server(ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(self), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def trace(self, trace_id: bytes) -> list[tuple[str, object]]:
        with self.lock:
            return [(service, span) for service, span in self.spans if span.trace_id == trace_id]

    def stop(self) -> None:
        self.server.stop(grace=None)


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: OTLPReceiver) -> None:
        self.receiver = receiver

    def Export(self, request, context):
        with self.receiver.lock:
            for resource_spans in request.resource_spans:
                service = next((a.value.string_value for a in resource_spans.resource.attributes
                                if a.key == "service.name"), "")
                for scope_spans in resource_spans.scope_spans:
                    self.receiver.spans.extend((service, span) for span in scope_spans.spans)
        return trace_service_pb2.ExportTraceServiceResponse()

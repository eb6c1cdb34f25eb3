"""Persistent grpc.aio clients of the workers. Each call returns a `Reply`: the decoded answer
(None on a cache miss), its wall time, so the loop can tell transport from compute, and the
protobuf bytes it moved."""

import time
from contextlib import contextmanager
from typing import Any, NamedTuple

import grpc
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind

from tandem import codec, tracing
from tandem.sampling import SamplingParams
from tandem.v1 import worker_pb2_grpc

_OPTIONS = [
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.keepalive_time_ms", 30_000),
]


class Reply(NamedTuple):
    answer: Any  # codec.Proposal / codec.Verification, None on a cache miss
    wall_ms: float
    wire_bytes: int  # request plus response payload


class _WorkerClient:
    stub_class = None

    def __init__(self, address: str, timeout_s: float = 30.0) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.channel = grpc.aio.insecure_channel(address, options=_OPTIONS)
        self.stub = self.stub_class(self.channel)

    async def describe(self) -> codec.ModelInfo:
        msg = await self.stub.Describe(codec.describe_request(), timeout=self.timeout_s, wait_for_ready=True)
        return codec.model_info_from_pb(msg)

    async def release(self, session_id: str, parent: Context | None = None) -> bool:
        with self._span("Release", parent) as (_, metadata):
            msg = await self.stub.Release(codec.release_request(session_id), timeout=self.timeout_s,
                                          metadata=metadata)
            return msg.released

    async def close(self) -> None:
        await self.channel.close()

    async def _call(self, rpc: str, request, decode, parent: Context | None) -> Reply:
        with self._span(rpc, parent) as (span, metadata):
            start = time.perf_counter()
            msg = await getattr(self.stub, rpc)(request, timeout=self.timeout_s, metadata=metadata)
            reply = Reply(decode(msg), (time.perf_counter() - start) * 1e3, request.ByteSize() + msg.ByteSize())
            span.set_attribute("tandem.wire_bytes", reply.wire_bytes)
            return reply

    @contextmanager
    def _span(self, rpc: str, parent: Context | None):
        """A client span for one call, child of `parent`; yields it and the metadata to send."""
        service = self.stub_class.__name__.removesuffix("Stub")
        with tracing.span(
            f"tandem.v1.{service}/{rpc}", parent, kind=SpanKind.CLIENT,
            attributes={"rpc.system": "grpc", "rpc.service": f"tandem.v1.{service}", "rpc.method": rpc,
                        "server.address": self.address},
        ) as span:
            yield span, tracing.metadata() if span.get_span_context().is_valid else ()


class DraftClient(_WorkerClient):
    stub_class = worker_pb2_grpc.DraftWorkerStub

    async def propose(
        self, session_id: str, cache_len: int, tokens: list[int], gamma: int, params: SamplingParams,
        parent: Context | None = None,
    ) -> Reply:
        request = codec.propose_request(session_id, cache_len, tokens, gamma, params)
        return await self._call("Propose", request, codec.proposal_from_pb, parent)


class VerifierClient(_WorkerClient):
    stub_class = worker_pb2_grpc.TargetVerifierStub

    async def verify(
        self, session_id: str, cache_len: int, tokens: list[int], proposal: codec.Proposal | None,
        params: SamplingParams, parent: Context | None = None,
    ) -> Reply:
        request = codec.verify_request(session_id, cache_len, tokens, proposal, params)
        return await self._call("Verify", request, codec.verification_from_pb, parent)

"""Persistent grpc.aio clients of the workers. Each call returns a `Reply`: the decoded answer
(None on a cache miss), its wall time, so the loop can tell transport from compute, and the
protobuf bytes it moved.

Propose and Verify travel on one stream per session and writer (ProposeStream, VerifyStream):
a message on an open stream costs about 0.7 ms less than a unary call here. Keyed by writer
too, because two writers of one session can meet on one replica while a resume takes it over,
and neither may close the other's stream. A writer has one call in flight per worker at a
time; a call that fails or is cancelled half-way drops its stream, whose unread answer must not
reach the next call. `release` ends the writer's streams."""

import asyncio
import time
from contextlib import contextmanager
from typing import Any, NamedTuple

import grpc
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind

from tandem import tracing
from tandem.math.params import SamplingParams
from tandem.tls import TLSFiles, channel_credentials
from tandem.v1 import worker_pb2_grpc
from tandem.wire import worker as wire

_OPTIONS = [
    # Never the tighter side: each worker refuses what its model cannot need (services/limits.py),
    # and what it may send, 64 packed distributions of a vocabulary of up to 512k tokens, fits.
    ("grpc.max_receive_message_length", 256 << 20),
    ("grpc.max_send_message_length", 256 << 20),
    ("grpc.keepalive_time_ms", 30_000),
    # A restarted worker is back within a second, not after gRPC's default backoff (up to 2 min).
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


class Reply(NamedTuple):
    answer: Any  # wire.Proposal / wire.Verification, None on a cache miss
    wall_ms: float
    wire_bytes: int  # request plus response payload
    fed: int = 0  # committed tokens the request fed the worker (a draft block not counted)


class _SessionStream:
    """One session's open stream to a worker; the lock keeps its calls one at a time."""

    def __init__(self, call) -> None:
        self.call = call
        self.lock = asyncio.Lock()


class WorkerClient:
    stub_class = None
    stream_rpc = ""  # the stub's stream method: "ProposeStream" or "VerifyStream"

    def __init__(self, address: str, timeout_s: float = 30.0, tls: TLSFiles | None = None,
                 server_name: str | None = None) -> None:
        """tls: mutual TLS (this side's certificate and key, the workers' CA). server_name: the
        name the worker's certificate must hold when `address` is one of the IPs that name
        resolved to (a pool dials each pod of a Service by IP; its certificate names the Service)."""
        self.address = address
        self.timeout_s = timeout_s
        if tls is None:
            self.channel = grpc.aio.insecure_channel(address, options=_OPTIONS)
        else:
            options = _OPTIONS + ([("grpc.ssl_target_name_override", server_name)] if server_name else [])
            self.channel = grpc.aio.secure_channel(address, channel_credentials(tls), options=options)
        self.stub = self.stub_class(self.channel)
        self._streams: dict[tuple[str, str], _SessionStream] = {}  # by (session id, writer)

    async def describe(self) -> wire.ModelInfo:
        msg = await self.stub.Describe(wire.describe_request(), timeout=self.timeout_s, wait_for_ready=True)
        return wire.model_info_from_pb(msg)

    async def load(self) -> wire.WorkerLoad:
        return wire.load_from_pb(await self.stub.Load(wire.load_request(), timeout=self.timeout_s))

    async def release(self, session_id: str, parent: Context | None = None, writer: str = "") -> bool:
        await self.end_stream((session_id, writer))
        with self._span("Release", parent) as (_, metadata):
            msg = await self.stub.Release(wire.release_request(session_id), timeout=self.timeout_s,
                                          metadata=metadata)
            return msg.released

    async def end_stream(self, key: tuple[str, str]) -> None:
        """Close a (session, writer)'s stream, after the call in flight on it (if any) is answered."""
        stream = self._streams.pop(key, None)
        if stream:
            async with stream.lock:
                await stream.call.done_writing()

    async def close(self) -> None:
        await self.channel.close()

    async def _call(self, rpc: str, encode, decode, key: tuple[str, str], parent: Context | None,
                    attributes: dict | None = None) -> Reply:
        """encode(trace_context) → the request; send it on the session's stream, in a client span."""
        with self._span(rpc, parent, attributes) as (span, metadata):
            request = encode(dict(metadata))
            start = time.perf_counter()
            msg = await self._exchange(key, request)
            reply = Reply(decode(msg), (time.perf_counter() - start) * 1e3, request.ByteSize() + msg.ByteSize(),
                          len(request.tokens))
            span.set_attribute("tandem.wire_bytes", reply.wire_bytes)
            return reply

    async def _exchange(self, key: tuple[str, str], request):
        """Write the request on the (session, writer)'s stream (opened on first use) and read its answer."""
        stream = self._streams.get(key)
        if stream is None:
            stream = self._streams[key] = _SessionStream(getattr(self.stub, self.stream_rpc)())
        async with stream.lock:
            try:
                async with asyncio.timeout(self.timeout_s):
                    await stream.call.write(request)
                    msg = await stream.call.read()
            except TimeoutError:
                self._drop(key, stream)
                raise grpc.aio.AioRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, None, None,
                                           f"no answer in {self.timeout_s} s") from None
            except BaseException:  # failed or cancelled half-way: its answer must not reach the next call
                self._drop(key, stream)
                raise
            if msg is grpc.aio.EOF:  # the worker ended the stream without a status
                self._drop(key, stream)
                raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, None, None, "the worker closed the stream")
            return msg

    def _drop(self, key: tuple[str, str], stream: _SessionStream) -> None:
        if self._streams.get(key) is stream:
            del self._streams[key]
        stream.call.cancel()

    @contextmanager
    def _span(self, rpc: str, parent: Context | None, attributes: dict | None = None):
        """A client span for one call, child of `parent`; yields it and the metadata to send."""
        service = self.stub_class.__name__.removesuffix("Stub")
        with tracing.span(
            f"tandem.v1.{service}/{rpc}", parent, kind=SpanKind.CLIENT,
            attributes={"rpc.system": "grpc", "rpc.service": f"tandem.v1.{service}", "rpc.method": rpc,
                        "server.address": self.address, **(attributes or {})},
        ) as span:
            yield span, tracing.metadata() if span.get_span_context().is_valid else ()


class DraftClient(WorkerClient):
    stub_class = worker_pb2_grpc.DraftWorkerStub
    stream_rpc = "ProposeStream"

    async def propose(
        self, session_id: str, cache_len: int, tokens: list[int], gamma: int, params: SamplingParams,
        parent: Context | None = None, ahead: bool = False, writer: str = "", tree_widths: tuple[int, ...] = (),
    ) -> Reply:
        """ahead: a draft past the block under verification (marked on its span); writer: the
        session's writer, whose stream carries the call; tree_widths: a token tree's (gamma deep)."""
        def encode(trace_context):
            return wire.propose_request(session_id, cache_len, tokens, gamma, params, trace_context, tree_widths)

        attributes = {"tandem.draft_ahead": True} if ahead else None
        if tree_widths:
            attributes = {"tandem.tree_widths": list(tree_widths)}
        return await self._call("Propose", encode, wire.proposal_from_pb, (session_id, writer), parent, attributes)


class VerifierClient(WorkerClient):
    stub_class = worker_pb2_grpc.TargetVerifierStub
    stream_rpc = "VerifyStream"

    async def verify(
        self, session_id: str, cache_len: int, tokens: list[int], proposal: wire.Proposal | None,
        params: SamplingParams, parent: Context | None = None, writer: str = "", verification: str = "token",
    ) -> Reply:
        def encode(trace_context):
            return wire.verify_request(session_id, cache_len, tokens, proposal, params, trace_context, verification)

        return await self._call("Verify", encode, wire.verification_from_pb, (session_id, writer), parent)

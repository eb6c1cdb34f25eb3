"""Persistent grpc.aio clients of the workers. Each call returns a `Reply`: the decoded answer
(None on a cache miss), its wall time, so the loop can tell transport from compute, and the
protobuf bytes it moved.

A worker gets one message per step, not one per session: the Propose (Verify) calls that
sessions make in the same turn of the event loop (tandem.orchestrator.turns) go to the worker
as the rows of one batched call (ProposeBatch, VerifyBatch), packed within the worker's message
limits (its ModelInfo), and each call gets its row's answer or its row's status as the call's
own. Batches travel on long-lived streams (ProposeBatchStream, VerifyBatchStream), one per
batch in flight: a message on an open stream costs about 0.7 ms less than a unary call here. A
batch that fails or is cancelled half-way drops its stream, whose unread answer must not reach
the next batch, and fails each of its rows with its status (UNAVAILABLE moves each session to
another worker on its own). A row still runs when its caller has given up; each carries its
session's writer epoch, so that a taken-over writer's late row cannot change what the new
writer's calls find (tandem.services.fencing)."""

import asyncio
import time
from contextlib import contextmanager
from typing import Any, NamedTuple

import grpc
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind

from tandem import tracing
from tandem.math import tree
from tandem.math.params import SamplingParams
from tandem.orchestrator.turns import Turn
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


ROW_BYTES = 16  # a row's tag and length in a batched message, with room to spare


class Reply(NamedTuple):
    answer: Any  # wire.Proposal / wire.Verification, None on a cache miss
    wall_ms: float
    wire_bytes: int  # request plus response payload
    fed: int = 0  # committed tokens the request fed the worker (a draft block not counted)


class WorkerClient:
    stub_class = None
    batch_rpc = ""  # the batched call: "ProposeBatch" or "VerifyBatch"

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
        self.info: wire.ModelInfo | None = None  # the worker's model and limits, once described
        self._turn = Turn(self._send_rows)  # this turn's calls, sent as batched calls
        self._streams: list = []  # open batch streams with no batch in flight

    async def describe(self) -> wire.ModelInfo:
        msg = await self.stub.Describe(wire.describe_request(), timeout=self.timeout_s, wait_for_ready=True)
        self.info = wire.model_info_from_pb(msg)
        return self.info

    async def load(self) -> wire.WorkerLoad:
        return wire.load_from_pb(await self.stub.Load(wire.load_request(), timeout=self.timeout_s))

    async def release(self, session_id: str, parent: Context | None = None, epoch: int = 0) -> bool:
        """Free the session's cache; with its writer's epoch, the worker also refuses that
        writer's calls still on their way (tandem.services.fencing)."""
        with self._span("Release", parent) as (_, metadata):
            msg = await self.stub.Release(wire.release_request(session_id, epoch), timeout=self.timeout_s,
                                          metadata=metadata)
            return msg.released

    async def close(self) -> None:
        for stream in self._streams:
            stream.cancel()
        self._streams.clear()
        await self.channel.close()

    async def _call(self, rpc: str, encode, decode, parent: Context | None, attributes: dict | None = None) -> Reply:
        """encode(trace_context) → the request; send it as a row of this turn's batch, in a client span."""
        with self._span(rpc, parent, attributes) as (span, metadata):
            request = encode(dict(metadata))
            start = time.perf_counter()
            msg = await self._turn.add(request)  # a row of this turn's batch, whose exchange has the deadline
            reply = Reply(decode(msg), (time.perf_counter() - start) * 1e3, request.ByteSize() + msg.ByteSize(),
                          len(request.tokens))
            span.set_attribute("tandem.wire_bytes", reply.wire_bytes)
            return reply

    async def _send_rows(self, rows: list) -> list:
        """A turn's rows in as few batched calls as the worker's limits allow, sent at once → per
        row its answer or its status, as an AioRpcError of its own."""
        answers = await asyncio.gather(*map(self._send, self._packed(rows)))
        return [answer for batch in answers for answer in batch]

    def _packed(self, rows: list) -> list[list]:
        """The rows in order, cut into batches whose request and largest possible answer fit the
        worker's limits (a row alone always goes)."""
        info = self.info
        if not info or not info.max_request_bytes:
            return [rows]
        batches, request_bytes, answer_bytes = [], 0, 0
        for row in rows:
            size = row.ByteSize() + ROW_BYTES
            bound = self.answer_bound(row, info.vocab_size) + ROW_BYTES
            if not batches or request_bytes + size > info.max_request_bytes - ROW_BYTES \
                    or answer_bytes + bound > info.max_response_bytes - ROW_BYTES:
                batches.append([])
                request_bytes = answer_bytes = 0
            batches[-1].append(row)
            request_bytes, answer_bytes = request_bytes + size, answer_bytes + bound
        return batches

    @staticmethod
    def answer_bound(request, vocab_size: int) -> int:
        """At most how many bytes a request's answer takes in a batched response."""
        raise NotImplementedError

    async def _send(self, batch: list) -> list:
        """One batched call → per row its answer, or its (or the call's) status as an AioRpcError.
        Traced as a step of the worker: a span of its own trace, linked to each row's call span."""
        name, attributes = self._rpc(self.batch_rpc)
        step = tracing.linked_span(name, (row.trace_context for row in batch), kind=SpanKind.CLIENT,
                                   attributes=attributes | {"tandem.rows": len(batch)})
        try:
            with step:
                msg = await self._exchange(wire.batch_request(self.batch_rpc, batch))
        except grpc.aio.AioRpcError as e:  # every row fails as its own call would have
            return [grpc.aio.AioRpcError(e.code(), None, None, e.details()) for _ in batch]
        return [grpc.aio.AioRpcError(a.code, None, None, a.message) if isinstance(a, wire.Failure) else a
                for a in wire.batch_answers(msg)]

    async def _exchange(self, request):
        """Write a batch on a free stream (opened when none is) and read its answer. A free stream
        may have ended meanwhile (its worker restarted): it is dropped, not written to."""
        stream = None
        while self._streams and stream is None:
            stream = self._streams.pop()
            stream = None if stream.done() else stream
        stream = stream or getattr(self.stub, self.batch_rpc + "Stream")()
        try:
            async with asyncio.timeout(self.timeout_s):
                await stream.write(request)
                msg = await stream.read()
        except TimeoutError:
            stream.cancel()
            raise grpc.aio.AioRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, None, None,
                                       f"no answer in {self.timeout_s} s") from None
        except asyncio.InvalidStateError:  # the stream ended between the check and the write
            stream.cancel()
            raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, None, None,
                                       "the stream to the worker ended") from None
        except BaseException:  # failed or cancelled half-way: its answer must not reach the next batch
            stream.cancel()
            raise
        if msg is grpc.aio.EOF:  # the worker ended the stream without a status
            stream.cancel()
            raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, None, None, "the worker closed the stream")
        self._streams.append(stream)
        return msg

    def _rpc(self, rpc: str) -> tuple[str, dict]:
        """A call's span name and its attributes (OpenTelemetry's RPC conventions)."""
        service = f"tandem.v1.{self.stub_class.__name__.removesuffix('Stub')}"
        return f"{service}/{rpc}", {"rpc.system": "grpc", "rpc.service": service, "rpc.method": rpc,
                                    "server.address": self.address}

    @contextmanager
    def _span(self, rpc: str, parent: Context | None, attributes: dict | None = None):
        """A client span for one call, child of `parent`; yields it and the metadata to send."""
        name, rpc_attributes = self._rpc(rpc)
        with tracing.span(name, parent, kind=SpanKind.CLIENT, attributes=rpc_attributes | (attributes or {})) as span:
            yield span, tracing.metadata() if span.get_span_context().is_valid else ()


class DraftClient(WorkerClient):
    stub_class = worker_pb2_grpc.DraftWorkerStub
    batch_rpc = "ProposeBatch"

    @staticmethod
    def answer_bound(request, vocab_size: int) -> int:
        """Per drafted token (a tree's nodes) its id, probability and parent, and when sampling its
        distribution of up to 4 bytes per vocabulary entry; room for the rest."""
        drafted = tree.size(tuple(request.tree_widths)) if request.tree_widths else request.gamma
        drafted *= max(1, request.ahead_guesses) + request.ahead_rejections  # a chain under each guess
        greedy = request.sampling.temperature == 0
        return 256 + drafted * (32 + (0 if greedy else 16 + 4 * vocab_size))

    async def propose(
        self, session_id: str, cache_len: int, tokens: list[int], gamma: int, params: SamplingParams,
        parent: Context | None = None, ahead: bool = False, epoch: int = 0, tree_widths: tuple[int, ...] = (),
        tree_rule: str = "", guesses: int = 1, block: int = 0, rejections: int = 0,
    ) -> Reply:
        """ahead: a draft past the block under verification (its draws keyed for the next cycle,
        ProposeRequest.ahead; marked on its span), for this many guesses of its bonus token
        (ahead_guesses) and rejections at the first positions of the block, the last `block`
        tokens (ahead_rejections, ahead_block); epoch: the session's writer epoch
        (tandem.services.fencing); tree_widths: a token tree's (gamma deep), its children drawn
        by tree_rule ("rrsw", "greedy"; "": the worker's default, rrsw)."""
        def encode(trace_context):
            return wire.propose_request(session_id, cache_len, tokens, gamma, params, trace_context, tree_widths,
                                        epoch, ahead, tree_rule, guesses if ahead else 0, block, rejections)

        attributes = {"tandem.draft_ahead": True, "tandem.ahead_guesses": guesses,
                      "tandem.ahead_rejections": rejections} if ahead else None
        if tree_widths:
            attributes = {"tandem.tree_widths": list(tree_widths)}
        return await self._call("Propose", encode, wire.proposal_from_pb, parent, attributes)


class VerifierClient(WorkerClient):
    stub_class = worker_pb2_grpc.TargetVerifierStub
    batch_rpc = "VerifyBatch"

    @staticmethod
    def answer_bound(request, vocab_size: int) -> int:
        """A few numbers per drafted token (a tree's node) and one more, and the next block a
        verifier that drafts answers (as a draft worker's); room for the rest."""
        greedy = request.sampling.temperature == 0
        drafted = tree.size(list(request.next_tree_widths)) if request.next_tree_widths else request.next_gamma
        return 512 + 32 * (len(request.draft_tokens) + 1) + drafted * (32 + (0 if greedy else 16 + 4 * vocab_size))

    async def verify(
        self, session_id: str, cache_len: int, tokens: list[int], proposal: wire.Proposal | None,
        params: SamplingParams, parent: Context | None = None, epoch: int = 0, verification: str = "token",
        next_gamma: int = 0, next_tree_widths: tuple[int, ...] = (), tree_rule: str = "",
        keep_next_distributions: bool = False,
    ) -> Reply:
        """next_gamma: a verifier that drafts also drafts the next cycle's block of this many tokens
        (a token tree that deep, next_tree_widths children per node at each depth), keeping its
        distributions (keep_next_distributions) for the call that verifies it (a proposal marked
        held); tree_rule: how a sampled tree's children are drawn and verified ("rrsw", "greedy";
        "": rrsw)."""
        def encode(trace_context):
            return wire.verify_request(session_id, cache_len, tokens, proposal, params, trace_context, verification,
                                       epoch, next_gamma, next_tree_widths, tree_rule, keep_next_distributions)

        return await self._call("Verify", encode, wire.verification_from_pb, parent)

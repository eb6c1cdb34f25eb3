"""Persistent grpc.aio clients of the workers. Each call returns a `Reply`: the decoded answer
(None on a cache miss), its wall time, so the loop can tell transport from compute, and the
protobuf bytes it moved."""

import time
from typing import Any, NamedTuple

import grpc

from tandem import codec
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

    async def release(self, session_id: str) -> bool:
        msg = await self.stub.Release(codec.release_request(session_id), timeout=self.timeout_s)
        return msg.released

    async def close(self) -> None:
        await self.channel.close()


class DraftClient(_WorkerClient):
    stub_class = worker_pb2_grpc.DraftWorkerStub

    async def propose(
        self, session_id: str, cache_len: int, tokens: list[int], gamma: int, params: SamplingParams
    ) -> Reply:
        start = time.perf_counter()
        request = codec.propose_request(session_id, cache_len, tokens, gamma, params)
        msg = await self.stub.Propose(request, timeout=self.timeout_s)
        return Reply(codec.proposal_from_pb(msg), (time.perf_counter() - start) * 1e3,
                     request.ByteSize() + msg.ByteSize())


class VerifierClient(_WorkerClient):
    stub_class = worker_pb2_grpc.TargetVerifierStub

    async def verify(
        self, session_id: str, cache_len: int, tokens: list[int], proposal: codec.Proposal | None,
        params: SamplingParams,
    ) -> Reply:
        start = time.perf_counter()
        request = codec.verify_request(session_id, cache_len, tokens, proposal, params)
        msg = await self.stub.Verify(request, timeout=self.timeout_s)
        return Reply(codec.verification_from_pb(msg), (time.perf_counter() - start) * 1e3,
                     request.ByteSize() + msg.ByteSize())

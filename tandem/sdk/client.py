"""The gRPC client SDK: `Client` (blocking) and `AsyncClient` (asyncio).

    from tandem import Client
    with Client("127.0.0.1:9000") as client:
        result = client.generate(prompt="def fib(n):", max_tokens=64, temperature=0)
        print(result.text, result.stats.acceptance_rate)
        for chunk in client.stream(prompt="import os", max_tokens=64):
            print(chunk.text, end="", flush=True)

A stream that breaks (a killed orchestrator replica, a lost connection) is resumed by itself:
the client asks any replica to continue the session from the tokens it has received, a
bounded number of times with backoff, and the caller sees every token once, in order.
"""

import asyncio
import contextlib
import functools
import logging
import math
import os
import random
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import grpc

from tandem.sdk.errors import from_rpc_error
from tandem.v1 import generation_pb2_grpc
from tandem.wire import generation as wire

DEFAULT_ADDRESS = "127.0.0.1:9000"
API_KEY_ENV = "TANDEM_API_KEY"  # the bearer token, when api_key= is not given
log = logging.getLogger("tandem.sdk")

DEFAULT_TIMEOUT_S = 300.0
DEFAULT_RESUME_ATTEMPTS = 8  # resumes in a row without a chunk: about 20 s of backoff
# Ray Serve does not always pass a client's cancellation on to the replica (a third of them
# here), so a stream left early also asks the cluster to stop its session.
CANCEL_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class GenerationStats(wire.CycleTotals):
    """How a generation went, cycle by cycle in `per_cycle` (γ, accepted, output tokens, time
    split, bytes), with the totals derived from it. α = accepted / verified; mean acceptance
    length = output tokens per cycle (bonus included); draft efficiency = accepted / drafted."""

    generated_tokens: int
    elapsed_s: float
    ttft_s: float
    per_cycle: list[wire.CycleStats]

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.verified_tokens if self.verified_tokens else 0.0

    @property
    def draft_efficiency(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        return self.generated_tokens / self.cycles if self.cycles else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.elapsed_s if self.elapsed_s else 0.0

    @classmethod
    def from_stats(cls, s: wire.Stats, generated: int) -> "GenerationStats":
        return cls(generated, s.elapsed_s, s.ttft_s, list(s.per_cycle))

    def summary(self) -> str:
        return (f"{self.generated_tokens} tokens in {self.elapsed_s:.2f} s "
                f"({self.tokens_per_second:.1f} tok/s), {self.cycles} cycles, "
                f"acceptance rate {self.acceptance_rate:.2f}, mean acceptance length "
                f"{self.mean_acceptance_length:.2f}, draft efficiency {self.draft_efficiency:.2f}")


@dataclass(frozen=True)
class GenerationResult:
    session_id: str
    text: str  # empty when the server has no tokenizer
    token_ids: list[int]  # generated tokens only
    finish_reason: str  # "stop" (EOS) or "length"
    stats: GenerationStats


@dataclass(frozen=True)
class StreamChunk:
    session_id: str
    token_ids: list[int]
    text: str
    finish_reason: str = ""  # set on the last chunk
    stats: GenerationStats | None = field(default=None)  # set on the last chunk


def build_request(
    prompt: str | None, prompt_token_ids: list[int] | None, max_tokens: int | None,
    temperature: float | None, top_k: int | None, top_p: float | None, seed: int | None,
    gamma: int | str | None, verification: str | None = None, draft_shape: str | None = None,
    ignore_eos: bool = False, tree_rule: str | None = None,
) -> wire.GenerationRequest:
    """Client-side checks (ValueError) and the wire request."""
    if (prompt is None) == (prompt_token_ids is None):
        raise ValueError("pass exactly one of prompt or prompt_token_ids")
    if prompt is not None and not prompt:
        raise ValueError("prompt must not be empty")
    if prompt_token_ids is not None and (not prompt_token_ids or any(t < 0 for t in prompt_token_ids)):
        raise ValueError("prompt_token_ids must be a non-empty list of non-negative ids")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if temperature is not None and (not math.isfinite(temperature) or temperature < 0):
        raise ValueError(f"temperature must be finite and >= 0, got {temperature}")
    if top_k is not None and top_k < 0:
        raise ValueError(f"top_k must be >= 0, got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if seed is not None and not 0 <= seed < 2**64:
        raise ValueError("seed must be in [0, 2**64)")
    if gamma == "auto":
        gamma = None
    if gamma is not None and (isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 0):
        raise ValueError(f"gamma must be None, 'auto' or an int >= 0, got {gamma!r}")
    if verification is not None and verification not in wire.VERIFICATION_MODES:
        raise ValueError(f"verification must be None (the server's default), 'token' or 'block', "
                         f"got {verification!r}")
    if draft_shape is not None and draft_shape not in wire.DRAFT_SHAPES:
        raise ValueError(f"draft_shape must be None (the server's default), 'chain', 'tree' or 'auto', "
                         f"got {draft_shape!r}")
    if tree_rule is not None and tree_rule not in wire.TREE_RULES:
        raise ValueError(f"tree_rule must be None (the server's default), 'rrsw' or 'greedy', got {tree_rule!r}")
    return wire.GenerationRequest(
        prompt=prompt or "", prompt_token_ids=list(prompt_token_ids or []), max_tokens=max_tokens or 0,
        temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, gamma=gamma, verification=verification or "",
        draft_shape=draft_shape or "", ignore_eos=bool(ignore_eos), tree_rule=tree_rule or "",
    )


class _Follow:
    """One generation's progress on the client, and when to resume it: shared by the blocking
    and asyncio clients. A break before the session id arrived re-sends the request (nothing
    was delivered); after it, the stream resumes from the tokens received."""

    # Statuses of a stream that broke, not of a request that was refused.
    RESUMABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN,
                 grpc.StatusCode.CANCELLED)

    def __init__(self, request, session_id: str | None, received: int, timeout_s: float, attempts: int) -> None:
        self.request = request  # the GenerateRequest, or None for a resume
        self.session_id = session_id
        self.received = received  # generated tokens delivered so far
        self.deadline = time.monotonic() + timeout_s
        self.attempts = attempts  # breaks in a row without progress before one is final
        self.failures = 0  # consecutive breaks without a chunk between them

    def call(self, stub) -> tuple:
        """(the streaming method, its request, the time left) for the next attempt."""
        timeout = max(0.001, self.deadline - time.monotonic())
        if self.session_id is None:
            return stub.GenerateStream, wire.generation_request_to_pb(self.request), timeout
        return stub.Resume, wire.resume_request(self.session_id, self.received), timeout

    def chunk(self, msg) -> StreamChunk | None:
        """A chunk for the caller; None for one that only names the session."""
        c = wire.chunk_from_pb(msg)
        self.session_id = c.session_id or self.session_id
        self.received += len(c.token_ids)
        if not c.token_ids and not c.finish_reason:
            return None
        self.failures = 0  # progress: the next break starts a fresh count
        stats = GenerationStats.from_stats(c.stats, self.received) if c.stats else None
        return StreamChunk(c.session_id, c.token_ids, c.text, c.finish_reason, stats)

    def pause_before_retry(self, e: grpc.RpcError) -> float:
        """Seconds to wait before resuming after `e`; raises the SDK's error when it is final."""
        error = from_rpc_error(e)
        self.failures += 1
        pause = min(4.0, 0.25 * 2 ** (self.failures - 1)) * random.uniform(0.8, 1.2)
        if (error.code not in self.RESUMABLE or self.failures > self.attempts
                or time.monotonic() + pause >= self.deadline):
            raise error from None
        log.debug("stream of session %s broke (%s: %s); resuming from token %d in %.2f s", self.session_id,
                  error.code.name, error.details, self.received, pause)
        return pause


def _fold(chunks: list[StreamChunk]) -> GenerationResult:
    """A whole generation from its chunks (the last carries finish_reason and stats)."""
    last = chunks[-1]
    return GenerationResult(last.session_id, "".join(c.text for c in chunks),
                            [t for c in chunks for t in c.token_ids], last.finish_reason, last.stats)


class _Base:
    def __init__(self, address: str, app_name: str, timeout_s: float, resume_attempts: int,
                 api_key: str | None) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.resume_attempts = resume_attempts
        self._fixed = (("application", app_name),)  # Ray Serve's gRPC ingress routes on it
        api_key = os.environ.get(API_KEY_ENV) if api_key is None else api_key
        if api_key:  # the standard gRPC metadata for a bearer token
            self._fixed += (("authorization", f"Bearer {api_key}"),)

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """Per call: the route, the bearer token if any, and the caller's current trace context
        (W3C traceparent) if any, so that tandem's spans join the caller's trace."""
        propagate = _opentelemetry_propagate()
        if propagate is None:
            return self._fixed
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        return self._fixed + tuple(carrier.items())

    def _follow(self, request, session_id: str | None, received: int, timeout_s: float | None) -> _Follow:
        return _Follow(request, session_id, received, timeout_s or self.timeout_s, self.resume_attempts)


@functools.cache
def _opentelemetry_propagate():
    """OpenTelemetry's propagation API when the application has it installed, else None: a
    caller without OpenTelemetry has no spans to join, and the SDK does not depend on it."""
    try:
        from opentelemetry import propagate
    except ImportError:
        return None
    return propagate


class Client(_Base):
    """Blocking client of a tandem cluster's gRPC ingress. `timeout_s` bounds a whole
    generation, resumes included; `resume_attempts` bounds the resumes in a row that deliver
    nothing. `api_key`: the cluster's bearer token (default: $TANDEM_API_KEY); `credentials`:
    grpc.ssl_channel_credentials(...) for an ingress behind TLS (default: plain text)."""

    def __init__(self, address: str = DEFAULT_ADDRESS, app_name: str = "tandem",
                 timeout_s: float = DEFAULT_TIMEOUT_S, resume_attempts: int = DEFAULT_RESUME_ATTEMPTS,
                 api_key: str | None = None, credentials: grpc.ChannelCredentials | None = None) -> None:
        super().__init__(address, app_name, timeout_s, resume_attempts, api_key)
        self.channel = (grpc.secure_channel(address, credentials) if credentials
                        else grpc.insecure_channel(address))
        self.stub = generation_pb2_grpc.GenerationStub(self.channel)

    def generate(self, prompt: str | None = None, *, prompt_token_ids: list[int] | None = None,
                 max_tokens: int | None = None, temperature: float | None = None,
                 top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                 gamma: int | str | None = None, timeout_s: float | None = None,
                 verification: str | None = None, draft_shape: str | None = None,
                 ignore_eos: bool = False, tree_rule: str | None = None) -> GenerationResult:
        """Generate a completion. gamma None/'auto' is adaptive; temperature 0 is greedy;
        verification ('token', 'block'), draft_shape ('chain', 'tree', 'auto') and tree_rule
        ('rrsw', 'greedy': how sampled trees are drawn and verified): None is the server's
        default; ignore_eos: generate past the target's EOS, up to max_tokens."""
        req = build_request(prompt, prompt_token_ids, max_tokens, temperature, top_k, top_p, seed, gamma,
                            verification, draft_shape, ignore_eos, tree_rule)
        return _fold(list(self._stream(self._follow(req, None, 0, timeout_s))))

    def stream(self, prompt: str | None = None, *, prompt_token_ids: list[int] | None = None,
               max_tokens: int | None = None, temperature: float | None = None,
               top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
               gamma: int | str | None = None, timeout_s: float | None = None,
               verification: str | None = None, draft_shape: str | None = None,
               ignore_eos: bool = False, tree_rule: str | None = None) -> Iterator[StreamChunk]:
        """Yield chunks as cycles commit them; the last one carries finish_reason and stats."""
        req = build_request(prompt, prompt_token_ids, max_tokens, temperature, top_k, top_p, seed, gamma,
                            verification, draft_shape, ignore_eos, tree_rule)
        return self._stream(self._follow(req, None, 0, timeout_s))

    def resume(self, session_id: str, from_index: int = 0, *, timeout_s: float | None = None) -> Iterator[StreamChunk]:
        """Continue a session: the committed tokens past from_index (generated tokens already
        received), then the rest of the generation. A finished session replays its tail."""
        return self._stream(self._follow(None, _checked_session(session_id), _checked_index(from_index), timeout_s))

    def cancel(self, session_id: str, *, timeout_s: float = CANCEL_TIMEOUT_S) -> bool:
        """Stop a session (it stays resumable); False if it had finished or stopped already."""
        request = wire.cancel_request(_checked_session(session_id))
        try:
            return self.stub.Cancel(request, metadata=self.metadata, timeout=timeout_s).cancelled
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    def _stream(self, follow: _Follow) -> Iterator[StreamChunk]:
        while True:
            method, request, timeout = follow.call(self.stub)
            call = method(request, metadata=self.metadata, timeout=timeout)
            try:
                for msg in call:
                    if (chunk := follow.chunk(msg)) is not None:
                        yield chunk
                return
            except grpc.RpcError as e:
                time.sleep(follow.pause_before_retry(e))
            except GeneratorExit:  # the caller stopped reading (break, close): stop the session
                call.cancel()
                if follow.session_id is not None:
                    with contextlib.suppress(Exception):  # best effort: the channel may be closed already
                        self.cancel(follow.session_id)
                raise
            finally:
                call.cancel()

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncClient(_Base):
    """asyncio client of a tandem cluster's gRPC ingress (the same methods as `Client`)."""

    def __init__(self, address: str = DEFAULT_ADDRESS, app_name: str = "tandem",
                 timeout_s: float = DEFAULT_TIMEOUT_S, resume_attempts: int = DEFAULT_RESUME_ATTEMPTS,
                 api_key: str | None = None, credentials: grpc.ChannelCredentials | None = None) -> None:
        super().__init__(address, app_name, timeout_s, resume_attempts, api_key)
        self.channel = (grpc.aio.secure_channel(address, credentials) if credentials
                        else grpc.aio.insecure_channel(address))
        self.stub = generation_pb2_grpc.GenerationStub(self.channel)

    async def generate(self, prompt: str | None = None, *, prompt_token_ids: list[int] | None = None,
                       max_tokens: int | None = None, temperature: float | None = None,
                       top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                       gamma: int | str | None = None, timeout_s: float | None = None,
                       verification: str | None = None, draft_shape: str | None = None,
                       ignore_eos: bool = False, tree_rule: str | None = None) -> GenerationResult:
        req = build_request(prompt, prompt_token_ids, max_tokens, temperature, top_k, top_p, seed, gamma,
                            verification, draft_shape, ignore_eos, tree_rule)
        return _fold([c async for c in self._stream(self._follow(req, None, 0, timeout_s))])

    def stream(self, prompt: str | None = None, *, prompt_token_ids: list[int] | None = None,
               max_tokens: int | None = None, temperature: float | None = None,
               top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
               gamma: int | str | None = None, timeout_s: float | None = None,
               verification: str | None = None, draft_shape: str | None = None,
               ignore_eos: bool = False, tree_rule: str | None = None) -> AsyncIterator[StreamChunk]:
        req = build_request(prompt, prompt_token_ids, max_tokens, temperature, top_k, top_p, seed, gamma,
                            verification, draft_shape, ignore_eos, tree_rule)
        return self._stream(self._follow(req, None, 0, timeout_s))

    def resume(self, session_id: str, from_index: int = 0, *,
               timeout_s: float | None = None) -> AsyncIterator[StreamChunk]:
        return self._stream(self._follow(None, _checked_session(session_id), _checked_index(from_index), timeout_s))

    async def cancel(self, session_id: str, *, timeout_s: float = CANCEL_TIMEOUT_S) -> bool:
        request = wire.cancel_request(_checked_session(session_id))
        try:
            return (await self.stub.Cancel(request, metadata=self.metadata, timeout=timeout_s)).cancelled
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    async def _stream(self, follow: _Follow) -> AsyncIterator[StreamChunk]:
        while True:
            method, request, timeout = follow.call(self.stub)
            call = method(request, metadata=self.metadata, timeout=timeout)
            try:
                async for msg in call:
                    if (chunk := follow.chunk(msg)) is not None:
                        yield chunk
                return
            except grpc.RpcError as e:
                await asyncio.sleep(follow.pause_before_retry(e))
            except GeneratorExit:  # the caller stopped reading (break, aclose): stop the session
                call.cancel()
                if follow.session_id is not None:
                    with contextlib.suppress(Exception):  # best effort: the channel may be closed already
                        await self.cancel(follow.session_id)
                raise
            finally:
                call.cancel()

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


def _checked_session(session_id: str) -> str:
    if not isinstance(session_id, str) or not session_id:
        raise ValueError("session_id must be a non-empty string")
    return session_id


def _checked_index(from_index: int) -> int:
    if isinstance(from_index, bool) or not isinstance(from_index, int) or from_index < 0:
        raise ValueError(f"from_index must be an int >= 0, got {from_index!r}")
    return from_index

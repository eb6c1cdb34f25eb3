"""What both workers share: the servicer base (validation, the model thread, errors) and the
grpc.aio server with standard health checking."""

import asyncio
import functools
import logging
import os
import signal
from collections.abc import Callable
from dataclasses import replace
from typing import Any, NamedTuple

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Status, StatusCode

from tandem import tracing
from tandem.cpu import CpuMeter
from tandem.math.params import SamplingParams
from tandem.ports import port_in_use, port_in_use_line
from tandem.services import memory, metrics
from tandem.services.batching import DEFAULT_BATCH_TOKENS, Batcher, Job
from tandem.services.limits import MessageLimits, any_worker_limits, message_limits
from tandem.services.runtime import CacheMiss, ModelRuntime
from tandem.tls import TLSFiles, server_credentials
from tandem.wire import worker as wire
from tandem.wire.validation import FieldError, check_context, check_sampling, check_session_id, check_token_ids

log = logging.getLogger("tandem.worker")

TRIM_DELAY_S = 0.1  # after a large call, time for its answer to be sent (and freed) before trimming
# A call is large when it feeds this many tokens or moves this many probabilities (γ × vocabulary).
LARGE_TOKENS, LARGE_PROBS = 512, 1 << 20


def _parse(raw: bytes, deserialize, context):
    """The request in raw, or None with INVALID_ARGUMENT set on the context. gRPC's own parsing
    answers UNKNOWN to bytes that are not the message, and raises through its frames."""
    try:
        return deserialize(raw)
    except Exception as e:  # DecodeError, or invalid UTF-8 in a string field
        context.set_code(grpc.StatusCode.INVALID_ARGUMENT)
        context.set_details(f"request: not a valid message ({type(e).__name__}: {e})")
        return None


def _parsing(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """handler, taking raw bytes and parsing them itself (unary-unary and stream-stream; the
    workers have no other kind, and another is left as it is)."""
    deserialize = handler.request_deserializer
    if handler.request_streaming != handler.response_streaming:
        return handler
    if handler.request_streaming:
        behavior = handler.stream_stream

        async def parsed(raw_requests, context):
            async for raw in raw_requests:
                request = _parse(raw, deserialize, context)
                if request is None:  # ends the stream with the status set
                    return
                yield request

        async def stream(raw_requests, context):
            async for response in behavior(parsed(raw_requests, context), context):
                yield response

        return handler._replace(request_deserializer=None, stream_stream=stream)
    behavior = handler.unary_unary

    async def unary(raw, context):
        request = _parse(raw, deserialize, context)
        return None if request is None else await behavior(request, context)

    return handler._replace(request_deserializer=None, unary_unary=unary)


class _ParsingRegistrar:
    """Stands in for the server while a generated add_*Servicer_to_server registers a service:
    registers its method handlers wrapped by _parsing."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self.server = server

    def add_generic_rpc_handlers(self, handlers) -> None:
        pass  # the same handlers come again, by name, in add_registered_method_handlers

    def add_registered_method_handlers(self, service: str, handlers: dict) -> None:
        handlers = {name: _parsing(handler) for name, handler in handlers.items()}
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
        self.server.add_registered_method_handlers(service, handlers)


def _failure(e: BaseException) -> wire.Failure:
    """A failed call's or row's status: a FieldError's code and message; anything else is a bug,
    logged, that must not take the worker down: INTERNAL."""
    if isinstance(e, FieldError):
        return wire.Failure(e.code, str(e))
    log.error("request failed", exc_info=e)
    return wire.Failure(grpc.StatusCode.INTERNAL, f"{type(e).__name__}: {e}")


def _remote_parent(request, context) -> Context:
    """The caller's span: in the request when it came on a stream, else in the call's metadata."""
    carried = getattr(request, "trace_context", None)
    return tracing.extract(carried if carried else context.invocation_metadata())


def _describe(request) -> dict:
    """Span attributes of a worker request: which session, where its cache stands, how much work."""
    attributes = {"tandem.session_id": request.session_id}
    if hasattr(request, "cache_len"):
        attributes |= {"tandem.cache_len": request.cache_len, "tandem.tokens": len(request.tokens)}
    if hasattr(request, "gamma"):
        attributes["tandem.gamma"] = request.gamma
    elif hasattr(request, "draft_tokens"):
        attributes["tandem.gamma"] = len(request.draft_tokens)
    return attributes


class Work(NamedTuple):
    """A checked request's job (tandem.services.batching), whether it is large (it allocates much:
    a long prefill, vocabulary-sized distributions, so the heap it freed is returned to the
    system afterwards, trim_soon), and its writer epoch (tandem.services.fencing)."""

    job: Job
    large: bool = False
    epoch: int = 0
    # What follows the job, given its answer: the work whose answer completes it (a verifier
    # that drafts: the next block's), or None. Run as a job of its own, so that each is costed.
    then: Callable[[Any], "Work | None"] | None = None
    finish: Callable[[Any, Any], None] | None = None  # puts the follow-up's answer into the first's


class WorkerServicer:
    """Base of the draft and verify servicers: decode, validate, compute on the model thread."""

    service = ""  # the gRPC service's full name, e.g. "tandem.v1.DraftWorker"
    register = None  # the generated add_*Servicer_to_server of that service

    def __init__(self, runtime: ModelRuntime, max_batch_tokens: int = DEFAULT_BATCH_TOKENS,
                 limits: MessageLimits | None = None) -> None:
        """limits: the server's message limits, which Describe states (callers pack batched calls
        within them); by default what either kind of worker takes for the runtime's model."""
        self.runtime = runtime
        # One thread owns the model and runs the work of all sessions in shared passes.
        self.batcher = Batcher(runtime, max_batch_tokens)
        self.handling = CpuMeter()  # the event loop's CPU per call: decoding, validating, encoding
        self.queued = 0  # jobs waiting for the model thread or running on it
        self.limits = limits or any_worker_limits(runtime.info.vocab_size, runtime.info.max_context)
        self._trim_pending = False

    @classmethod
    def add_to_server(cls, runtime: ModelRuntime, server, max_batch_tokens: int = DEFAULT_BATCH_TOKENS,
                      limits: MessageLimits | None = None) -> "WorkerServicer":
        """A servicer of this class for the runtime, registered on the server."""
        servicer = cls(runtime, max_batch_tokens, limits)
        cls.register(servicer, server)
        return servicer

    def check_sequence(self, session_id: str, cache_len: int, tokens) -> None:
        check_session_id(session_id)
        if not tokens:
            raise FieldError(grpc.StatusCode.INVALID_ARGUMENT, "tokens", "need at least one token")
        info = self.runtime.info
        check_context("tokens", cache_len + len(tokens), info.max_context)  # first: it costs nothing
        check_token_ids("tokens", tokens, info.vocab_size)

    def check_sampling(self, msg) -> SamplingParams:
        params = wire.sampling_from_pb(msg)
        check_sampling(params.temperature, params.top_k, params.top_p, prefix="sampling.")
        return params

    def prepare(self, request) -> Work:
        """A request's work, checked. FieldError names a bad field."""
        raise NotImplementedError

    async def compute(self, work: Work):
        """Run a job on the model thread, batched with other sessions' → its answer with
        compute_ms set, or None on a cache miss."""
        (result,) = await self.compute_all([work])
        if isinstance(result, BaseException):
            raise result
        return result

    async def compute_all(self, work: list[Work]) -> list:
        """Run jobs on the model thread, submitted together so that they share its passes from
        their first step → per job its answer, None on a cache miss, or what it raised. Then the
        jobs that follow them (Work.then), together, each completing its first's answer; one that
        fails leaves that answer as it was (logged)."""
        results = await self._run(work)
        follow = [(w, r, w.then(r)) for w, r in zip(work, results)
                  if w.then is not None and r is not None and not isinstance(r, BaseException)]
        follow = [(w, r, f) for w, r, f in follow if f is not None]
        if follow:
            for (w, answer, _), result in zip(follow, await self._run([f for _, _, f in follow])):
                if isinstance(result, BaseException):
                    log.error("a follow-up job failed", exc_info=result)
                elif result is not None:
                    w.finish(answer, result)
        return results

    async def _run(self, work: list[Work]) -> list:
        self.queued += len(work)
        try:
            futures = self.batcher.submit_all([w.job for w in work], [w.epoch for w in work])
            results = await asyncio.gather(*map(asyncio.wrap_future, futures), return_exceptions=True)
        finally:
            self.queued -= len(work)
            if any(w.large for w in work):
                self.trim_soon()
        return [None if isinstance(r, CacheMiss) else r for r in results]

    def trim_soon(self) -> None:
        """Return freed heap to the system (malloc_trim, a few ms) once the answer has been sent
        (TRIM_DELAY_S), on the model thread so that it never stalls the event loop; at most one
        pending. glibc keeps what a large call freed otherwise: +50 to +90 MiB after ten prefills
        of a 4096-token context or ten Verify calls with 64 dense 32k-token distributions."""
        if self._trim_pending:
            return
        self._trim_pending = True

        def trim():
            self._trim_pending = False
            memory.trim()

        asyncio.get_running_loop().call_later(TRIM_DELAY_S, self.batcher.submit, trim)

    async def answer(self, context, rpc: str, request, work, encode):
        """Await work() in a server span (child of the caller's, from the metadata) → encode(its
        result). On failure, None with the status set on the context: a FieldError's code, anything
        else INTERNAL. The status is set, not raised with context.abort: a raised abort leaves a
        reference cycle through gRPC's frames that keeps the request alive until a full garbage
        collection, and a worker answering many bad requests grew by their size."""
        span = self._server_span(rpc, request, context)
        try:
            outcome = await work()
        except Exception as e:
            outcome = _failure(e)
        self._settle(rpc, span, outcome)
        if isinstance(outcome, wire.Failure):
            context.set_code(outcome.code)
            context.set_details(outcome.message)
            return None
        return encode(outcome)

    async def answer_rows(self, context, rpc: str, batch: str, rows, encode):
        """A batched call (`batch`): each row answered as `rpc` answers it alone, in a server span
        of its own (its caller's child), every checked row's job entering the model together →
        the batched response, a row's Failure in place of its answer."""
        spans = [self._server_span(rpc, row, context) for row in rows]
        outcomes: list = [None] * len(rows)
        work, checked = [], []
        for i, row in enumerate(rows):
            try:
                work.append(self.prepare(row))
                checked.append(i)
            except Exception as e:
                outcomes[i] = _failure(e)
        for i, result in zip(checked, await self.compute_all(work)):
            outcomes[i] = _failure(result) if isinstance(result, BaseException) else result
        for span, outcome in zip(spans, outcomes):
            self._settle(rpc, span, outcome)
        return wire.batch_response(batch, [o if isinstance(o, wire.Failure) else encode(o) for o in outcomes])

    @staticmethod
    async def in_order(requests, answer):
        """A stream's requests answered in order by answer(request) (None ends the stream)."""
        async for request in requests:
            response = await answer(request)
            if response is None:  # refused: the status set on the context ends the stream
                return
            yield response

    def _server_span(self, rpc: str, request, context):
        """A started server span for one call or row (the invalid span when not tracing)."""
        return tracing.start_span(
            f"{self.service}/{rpc}", _remote_parent(request, context), kind=SpanKind.SERVER,
            attributes={"rpc.system": "grpc", "rpc.service": self.service, "rpc.method": rpc, **_describe(request)})

    def _settle(self, rpc: str, span, outcome) -> None:
        """Account for one answered call or row (its handling CPU, compute time or cache miss, or
        its failure) and end its span."""
        handling_ms = max(0.0, self.handling.count())  # every call's, a failed one's too
        if isinstance(outcome, wire.Failure):
            span.set_status(Status(StatusCode.ERROR, outcome.message))
        elif hasattr(outcome, "compute_ms"):
            outcome.batching.handling_ms = handling_ms
            span.set_attribute("tandem.compute_ms", outcome.compute_ms)
            metrics.compute.labels(rpc=rpc).observe(outcome.compute_ms / 1e3)
        elif outcome is None:  # Propose and Verify answer None on a cache miss
            span.set_attribute("tandem.cache_miss", True)
            metrics.cache_misses.labels(rpc=rpc).inc()
        span.end()

    async def Release(self, request, context):
        async def work():
            check_session_id(request.session_id)
            session_id, epoch = request.session_id, request.writer_epoch

            def release() -> bool:  # on the model thread, in order with the session's steps
                self.batcher.writers.release(session_id, epoch)
                return self.runtime.release(session_id)

            return await asyncio.wrap_future(self.batcher.submit(release))

        return await self.answer(context, "Release", request, work, wire.release_response)

    async def Describe(self, request, context):
        info = replace(self.runtime.info, max_request_bytes=self.limits.receive, max_response_bytes=self.limits.send)
        return wire.model_info_to_pb(info)

    async def Load(self, request, context):
        load = wire.WorkerLoad(self.runtime.num_sessions, self.runtime.cache_bytes, self.queued)
        return wire.load_to_pb(load)


async def start_server(add_servicer, runtime: ModelRuntime, host: str, port: int,
                       tls: TLSFiles | None = None, limits: MessageLimits | None = None,
                       health_servicer: health.aio.HealthServicer | None = None) -> tuple[grpc.aio.Server, int]:
    """Start a grpc.aio server with the worker servicer and health checking; returns (server, port).
    With `tls`, only clients presenting a certificate that its CA signed get through the handshake.
    `limits`: the worker kind's message limits (tandem.services.limits); by default, what either
    kind takes for the runtime's model. `health_servicer`: one to share with a health port."""
    info = runtime.info
    limits = limits or any_worker_limits(info.vocab_size, info.max_context)
    options = [
        *limits.grpc_options(),
        # gRPC lets a second process bind a taken port on Linux; the orchestrator routes
        # sessions by address, so a port must name one worker.
        ("grpc.so_reuseport", 0),
    ]
    server = grpc.aio.server(options=options)
    add_servicer(runtime, _ParsingRegistrar(server), limits=limits)
    health_servicer = health_servicer or health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, _ParsingRegistrar(server))
    address = f"{host}:{port}"
    bound = server.add_secure_port(address, server_credentials(tls)) if tls else server.add_insecure_port(address)
    if bound == 0:
        raise OSError(f"cannot listen on {host}:{port}")
    await server.start()
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    return server, bound


async def start_health_server(health_servicer: health.aio.HealthServicer, host: str,
                              port: int) -> grpc.aio.Server:
    """A plain-text server of grpc.health.v1 alone, answering the worker's own status: for probes
    that cannot present a client certificate (Kubernetes' gRPC probe) while the worker's port
    takes mutual TLS only. It serves nothing else."""
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if server.add_insecure_port(f"{host}:{port}") == 0:
        raise OSError(f"cannot listen on {host}:{port}")
    await server.start()
    return server


async def _stop_when_orphaned(launcher: int, stop: asyncio.Event) -> None:
    """Set `stop` once the process that started this worker (tandem up, a test) is gone, even
    if it was SIGKILLed: an orphaned worker would hold its model and caches for good."""
    while os.getppid() == launcher:
        await asyncio.sleep(1.0)
    log.warning("the process that started this worker (pid %d) is gone: stopping", launcher)
    stop.set()


def _check_ports(host: str, port: int, metrics_port: int, health_port: int = 0) -> None:
    """Exit with one line if the gRPC, metrics or health port is taken, or two are the same."""
    named = [(what, p) for what, p in (("gRPC", port), ("metrics", metrics_port), ("health", health_port)) if p]
    for i, (what, p) in enumerate(named):
        for other, q in named[i + 1:]:
            if p == q:
                raise SystemExit(f"tandem worker: {what} and {other} cannot share port {p}")
    for what, taken in named:
        if port_in_use(host, taken):
            raise SystemExit(port_in_use_line("tandem worker", taken, what, host))


def _cannot_listen(host: str, port: int, what: str, error: Exception) -> str:
    """The line to exit with when binding port failed: "in use" when it is (a race with
    _check_ports), else the library's reason."""
    if port_in_use(host, port):
        return port_in_use_line("tandem worker", port, what, host)
    return f"tandem worker: cannot listen on {host}:{port} ({what}): {error}"


def _in_target_ids(runtime: ModelRuntime, model_dir: str, target_tokenizer: str, kind: str):
    """The draft runtime speaking the target's ids: itself when it already does."""
    from tandem.services import vocabulary

    try:
        mapped = vocabulary.between(model_dir, target_tokenizer)
    except (vocabulary.PairMismatch, OSError) as e:
        raise SystemExit(f"tandem worker {kind}: --target-tokenizer {target_tokenizer}: {e}") from None
    if mapped is None:
        return runtime
    log.info("the draft's tokenizer differs from the target's: %s; it drafts those under the target's ids",
             mapped.overlap.describe())
    return vocabulary.TranslatedRuntime(runtime, mapped)


def run_worker(
    kind: str, model_dir: str, host: str = "127.0.0.1", port: int = 0, device: str = "cpu",
    dtype: str = "float32", max_cache_bytes: int = 2 << 30, threads: int | None = None,
    metrics_port: int = 0, parent_pid: int = 0, tls: TLSFiles | None = None,
    max_batch_tokens: int = DEFAULT_BATCH_TOKENS, health_port: int = 0, lookup=None, head: str | None = None,
    exit_layer: int = 0, target_tokenizer: str | None = None,
) -> None:
    """Serve a draft ("draft"), n-gram draft ("ngram": no model, `lookup` a
    tandem.services.ngram.Lookup), hybrid draft ("hybrid": `lookup`, and the model where it
    finds nothing) or target ("target") worker until SIGINT or SIGTERM, with
    Prometheus metrics on metrics_port (0: none); with parent_pid, also until the process of
    that pid is no longer this one's parent. With `tls`, mutual TLS only (tandem.tls).
    max_batch_tokens: the tokens one forward pass takes from all sessions' waiting work.
    health_port: also serve grpc.health.v1 alone there, in plain text (0: no such port).
    head: a target verifier that drafts with this EAGLE-3 head directory (tandem.services.head);
    exit_layer: one that drafts with its own first exit_layer layers (tandem.services.self_draft).
    target_tokenizer: a draft model's target (its model or tokenizer directory): a draft whose
    tokenizer differs drafts the shared tokens under the target's ids (tandem.services.vocabulary).
    Exits with one line (SystemExit) when it cannot listen on a port."""
    _check_ports(host, port, metrics_port, health_port)  # before the model loads: a taken port fails at once
    memory.one_arena()  # before gRPC and torch start their threads
    import torch

    from tandem.services import draft_worker, hybrid, ngram, pass_curve, target_verifier

    if threads:
        torch.set_num_threads(threads)
    adders = {"draft": draft_worker.add_to_server, "ngram": ngram.add_to_server,
              "hybrid": hybrid.add_to_server, "target": target_verifier.add_to_server}
    add = functools.partial(adders[kind], max_batch_tokens=max_batch_tokens)
    tracing.setup({"draft": "tandem-draft-worker", "ngram": "tandem-ngram-draft-worker",
                   "hybrid": "tandem-hybrid-draft-worker", "target": "tandem-target-verifier"}[kind])
    if kind in ("ngram", "hybrid") and lookup is None:
        raise ValueError(f"a {kind} worker needs its lookup (tandem.services.ngram.Lookup)")
    if kind == "ngram":
        runtime = ngram.NgramRuntime(lookup, max_tokens=max_cache_bytes // 8)
    elif exit_layer:
        from tandem.services.self_draft import SelfDraftRuntime

        try:
            runtime = SelfDraftRuntime(model_dir, exit_layer, device=device, dtype=dtype,
                                       max_cache_bytes=max_cache_bytes)
        except ValueError as e:
            raise SystemExit(f"tandem worker target: {e}") from None
    elif head:
        from tandem.services.head import HeadError
        from tandem.services.head_runtime import HeadRuntime

        try:
            runtime = HeadRuntime(model_dir, head, device=device, dtype=dtype, max_cache_bytes=max_cache_bytes)
        except (HeadError, OSError) as e:
            raise SystemExit(f"tandem worker target: --head {head}: {e}") from None
    else:
        runtime = ModelRuntime(model_dir, device=device, dtype=dtype, max_cache_bytes=max_cache_bytes)
        if target_tokenizer and kind != "target":
            runtime = _in_target_ids(runtime, model_dir, target_tokenizer, kind)
        if kind == "hybrid":
            runtime = hybrid.HybridRuntime(lookup, runtime, max_tokens=max_cache_bytes // 8)
    forward = getattr(runtime, "forward_pass", None)  # none for an n-gram lookup: each session alone, no model
    if forward is not None:  # timed before it serves, so that nothing else runs meanwhile
        runtime.info = replace(runtime.info, pass_ms=pass_curve.pass_ms(forward))
    if metrics_port:
        try:
            metrics.serve(metrics_port, runtime, host)
        except OSError as e:  # taken since _check_ports
            raise SystemExit(_cannot_listen(host, metrics_port, "metrics", e)) from None
    info = runtime.info
    # An n-gram draft's distributions are one token each: a draft worker's limits for a vocabulary of one.
    limits = message_limits("target" if kind == "target" else "draft", 1 if kind == "ngram" else info.vocab_size,
                            info.max_context, drafts=bool(info.drafter))

    async def main():
        status = health.aio.HealthServicer()
        try:
            server, bound = await start_server(add, runtime, host, port, tls, limits, status)
        except (RuntimeError, OSError) as e:  # gRPC raises RuntimeError when it cannot bind
            raise SystemExit(_cannot_listen(host, port, "gRPC", e)) from None
        servers = [server]
        if health_port:
            try:
                servers.append(await start_health_server(status, host, health_port))
            except (RuntimeError, OSError) as e:
                raise SystemExit(_cannot_listen(host, health_port, "health", e)) from None
        # One parseable line: launchers (tandem up, tests) read the port from it. batching=pass:
        # all sessions' steps share one forward pass; sequential: one pass each, in turn.
        # kv_bytes_per_token: what a session's token holds in the cache, against max_cache_bytes.
        batching = "pass" if forward and forward.batched else "sequential"
        print(f"tandem {kind} worker listening on {host}:{bound} model={info.model} "
              f"vocab={info.vocab_size} params={info.num_parameters} device={info.device} "
              f"forward={forward.name if forward else 'lookup'} batching={batching} "
              f"max_batch_tokens={max_batch_tokens} "
              f"{f'drafter={info.drafter} ' if info.drafter else ''}"
              f"kv_bytes_per_token={runtime.token_bytes} max_cache_bytes={max_cache_bytes}"
              f"{' tls=on' if tls else ''}{f' health_port={health_port}' if health_port else ''} "
              f"max_request_bytes={limits.receive} max_response_bytes={limits.send}", flush=True)
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        watch = asyncio.create_task(_stop_when_orphaned(parent_pid, stop)) if parent_pid else None
        await stop.wait()
        if watch:
            watch.cancel()
        await asyncio.gather(*(s.stop(grace=2) for s in servers))
        tracing.shutdown()

    asyncio.run(main())

"""What both workers share: the servicer base (validation, the model thread, errors) and the
grpc.aio server with standard health checking."""

import asyncio
import logging
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Status, StatusCode

from tandem import tracing
from tandem.math.params import SamplingParams
from tandem.services import metrics
from tandem.services.runtime import CacheMiss, ModelRuntime
from tandem.wire import worker as wire
from tandem.wire.validation import FieldError, check_context, check_sampling, check_session_id, check_token_ids

log = logging.getLogger("tandem.worker")

MAX_MESSAGE_BYTES = 64 << 20


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


class WorkerServicer:
    """Base of the draft and verify servicers: decode, validate, compute on the model thread."""

    service = ""  # the gRPC service's full name, e.g. "tandem.v1.DraftWorker"

    def __init__(self, runtime: ModelRuntime) -> None:
        self.runtime = runtime
        # One thread owns the model: calls from all sessions run in order, never concurrently.
        self._model_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="model")
        self.queued = 0  # compute calls waiting for the model thread or running on it

    def check_sequence(self, session_id: str, cache_len: int, tokens) -> None:
        check_session_id(session_id)
        if not tokens:
            raise FieldError(grpc.StatusCode.INVALID_ARGUMENT, "tokens", "need at least one token")
        info = self.runtime.info
        check_token_ids("tokens", tokens, info.vocab_size)
        check_context("tokens", cache_len + len(tokens), info.max_context)

    def check_sampling(self, msg) -> SamplingParams:
        params = wire.sampling_from_pb(msg)
        check_sampling(params.temperature, params.top_k, params.top_p, prefix="sampling.")
        return params

    async def compute(self, fn, *args):
        """Run fn(runtime, *args) on the model thread; None on a cache miss, with compute_ms set."""

        def run():
            start = time.perf_counter()
            try:
                result = fn(self.runtime, *args)
            except CacheMiss:
                return None
            result.compute_ms = (time.perf_counter() - start) * 1e3
            return result

        self.queued += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._model_thread, run)
        finally:
            self.queued -= 1

    async def answer(self, context, rpc: str, request, work):
        """Await work() in a server span (child of the caller's, from the metadata); a
        FieldError becomes its status code, anything else INTERNAL."""
        with tracing.span(
            f"{self.service}/{rpc}", _remote_parent(request, context), kind=SpanKind.SERVER,
            attributes={"rpc.system": "grpc", "rpc.service": self.service, "rpc.method": rpc, **_describe(request)},
            record_exception=False, set_status_on_exception=False,
        ) as span:
            try:
                result = await work()
            except FieldError as e:
                span.set_status(Status(StatusCode.ERROR, str(e)))
                await context.abort(e.code, str(e))
            except Exception as e:  # a bug must not take the worker down: log it, answer INTERNAL
                log.exception("request failed")
                span.set_status(Status(StatusCode.ERROR, f"{type(e).__name__}: {e}"))
                await context.abort(grpc.StatusCode.INTERNAL, f"{type(e).__name__}: {e}")
            if hasattr(result, "compute_ms"):
                span.set_attribute("tandem.compute_ms", result.compute_ms)
                metrics.compute.labels(rpc=rpc).observe(result.compute_ms / 1e3)
            elif result is None:  # Propose and Verify answer None on a cache miss
                span.set_attribute("tandem.cache_miss", True)
                metrics.cache_misses.labels(rpc=rpc).inc()
            return result

    async def Release(self, request, context):
        async def work():
            check_session_id(request.session_id)
            return await asyncio.get_running_loop().run_in_executor(
                self._model_thread, self.runtime.release, request.session_id
            )

        return wire.release_response(await self.answer(context, "Release", request, work))

    async def Describe(self, request, context):
        return wire.model_info_to_pb(self.runtime.info)

    async def Load(self, request, context):
        load = wire.WorkerLoad(self.runtime.num_sessions, self.runtime.cache_bytes, self.queued)
        return wire.load_to_pb(load)


async def start_server(add_servicer, runtime: ModelRuntime, host: str, port: int) -> tuple[grpc.aio.Server, int]:
    """Start a grpc.aio server with the worker servicer and health checking; returns (server, port)."""
    options = [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        # gRPC lets a second process bind a taken port on Linux; the orchestrator routes
        # sessions by address, so a port must name one worker.
        ("grpc.so_reuseport", 0),
    ]
    server = grpc.aio.server(options=options)
    add_servicer(runtime, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot listen on {host}:{port}")
    await server.start()
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    return server, bound


async def _stop_when_orphaned(launcher: int, stop: asyncio.Event) -> None:
    """Set `stop` once the process that started this worker (tandem up, a test) is gone, even
    if it was SIGKILLed: an orphaned worker would hold its model and caches for good."""
    while os.getppid() == launcher:
        await asyncio.sleep(1.0)
    log.warning("the process that started this worker (pid %d) is gone: stopping", launcher)
    stop.set()


def run_worker(
    kind: str, model_dir: str, host: str = "127.0.0.1", port: int = 0, device: str = "cpu",
    dtype: str = "float32", max_cache_bytes: int = 2 << 30, threads: int | None = None,
    metrics_port: int = 0, parent_pid: int = 0,
) -> None:
    """Serve a draft ("draft") or target ("target") worker until SIGINT or SIGTERM, with
    Prometheus metrics on metrics_port (0: none); with parent_pid, also until the process of
    that pid is no longer this one's parent."""
    import torch

    from tandem.services import draft_worker, target_verifier

    if threads:
        torch.set_num_threads(threads)
    add = {"draft": draft_worker.add_to_server, "target": target_verifier.add_to_server}[kind]
    tracing.setup({"draft": "tandem-draft-worker", "target": "tandem-target-verifier"}[kind])
    runtime = ModelRuntime(model_dir, device=device, dtype=dtype, max_cache_bytes=max_cache_bytes)
    if metrics_port:
        metrics.serve(metrics_port, runtime)

    async def main():
        server, bound = await start_server(add, runtime, host, port)
        info = runtime.info
        # One parseable line: launchers (tandem up, tests) read the port from it.
        print(f"tandem {kind} worker listening on {host}:{bound} model={info.model} "
              f"vocab={info.vocab_size} params={info.num_parameters} device={info.device} "
              f"forward={runtime.forward_pass.name}", flush=True)
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        watch = asyncio.create_task(_stop_when_orphaned(parent_pid, stop)) if parent_pid else None
        await stop.wait()
        if watch:
            watch.cancel()
        await server.stop(grace=2)
        tracing.shutdown()

    asyncio.run(main())

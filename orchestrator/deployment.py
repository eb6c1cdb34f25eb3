"""The Ray Serve deployment behind the gRPC ingress: the `tandem.v1.Generation` service.

Topology:

    client ──gRPC──▶ Ray Serve gRPC proxy ──▶ GenerationService (this deployment, N replicas)
                                                 │  persistent grpc.aio channels, per cycle
                                                 ├──▶ draft workers      (a pool: DraftWorker)
                                                 ├──▶ target verifiers   (a pool: TargetVerifier)
                                                 └──▶ Redis              (sessions)

Ray is on the ingress path only: one Serve call per request, never one per cycle. Any replica
serves any session: `Resume` continues one from Redis, taking it over from whichever replica
wrote it before (that one is fenced off at its next commit).
"""

import asyncio
import logging
import os
import socket
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import grpc
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from ray import serve

from tandem import tracing
from tandem.orchestrator import http_ingress, metrics
from tandem.orchestrator.auth import authorize
from tandem.orchestrator.clients import DraftClient, VerifierClient
from tandem.orchestrator.config import OrchestratorConfig
from tandem.orchestrator.cycle import NoWorker, SpeculativeLoop
from tandem.orchestrator.detokenizer import IncrementalDetokenizer, resumed
from tandem.orchestrator.policy import GammaPolicy
from tandem.orchestrator.pool import WorkerPool
from tandem.orchestrator.refusals import Refused, refusal
from tandem.orchestrator.requests import Limits, resolve
from tandem.orchestrator.session import Session, SessionRecord
from tandem.orchestrator.store import FINISHED, Fenced, SessionStore, StoreUnavailable
from tandem.wire import generation as wire
from tandem.wire.validation import FieldError, check_session_id

log = logging.getLogger("tandem.orchestrator")


class GenerationService:
    """A replica: the gRPC methods by name (Serve's gRPC proxy calls them), and the session
    core that both ingresses run (`generation`, `resumption`; the HTTP routes in
    tandem.orchestrator.http_ingress call it with a call object of their own)."""

    def __init__(self, config: OrchestratorConfig) -> None:
        self.config = config
        self.drafts = WorkerPool("draft", config.draft_addresses, DraftClient, config.worker_timeout_s, tls=config.tls)
        self.targets = WorkerPool("target", config.target_addresses, VerifierClient, config.worker_timeout_s,
                                  tls=config.tls)
        self.store = SessionStore.from_url(config.redis_url, config.session_ttl_s, config.redis_retry_s)
        self.tokenizer = config.load_tokenizer()
        # Tokenizing runs here, off the event loop that streams every session's chunks.
        self._tokenizing = ThreadPoolExecutor(max_workers=2, thread_name_prefix="tokenize")
        self._in_flight = 0  # generations and resumptions this replica runs
        tracing.setup("tandem-orchestrator")
        if config.metrics_port:
            try:
                metrics.serve(config.metrics_port, config.metrics_host)
            except OSError as e:  # e.g. a second replica on this node: serve requests all the same
                log.error("Prometheus metrics not served on port %d: %s", config.metrics_port, e)
        self._ready: asyncio.Task | None = None
        # The policy's settings and the replica's costs (tandem.orchestrator.policy): every
        # session's policy shares these costs and acceptance and has its own probes and shapes.
        self._policy = GammaPolicy(max_gamma=config.max_gamma, initial_gamma=min(4, config.max_gamma),
                                   ahead_rejections=config.ahead_rejections if config.draft_ahead else 0)

    async def _connect(self) -> None:
        await asyncio.gather(self.drafts.start(), self.targets.start())  # once: a retried connect skips it
        target_info = await self.targets.describe(self.config.worker_timeout_s)
        if target_info is None:
            raise NoWorker("target", self.config.worker_timeout_s)
        # The draft pool may be empty for now: sessions then run at γ = 0 until a draft worker is up.
        draft_info = await self.drafts.describe(min(5.0, self.config.worker_timeout_s)) or target_info
        self.limits = Limits.of(draft_info, target_info, self.config.max_gamma,
                                self.config.max_tokens_cap, self.config.default_max_tokens, self.config.verification,
                                self.config.draft_shape, self.config.tree_widths, self.config.tree_rule)
        self.loop = SpeculativeLoop(self.drafts, self.targets, self.store, target_info.eos_token_ids,
                                    draft_ahead=self.config.draft_ahead, verifier_wait_s=self.config.verifier_wait_s,
                                    verifier_drafts=bool(target_info.drafter), ahead_guesses=self.config.ahead_guesses,
                                    ahead_rejections=self.config.ahead_rejections)
        self._policy.costs.drafts_on_verifier = self.loop.verifier_drafts
        # How each pool's passes bend with their tokens, as its first worker timed them (none yet for
        # a draft pool without a worker, nor for a verifier's own drafting).
        self._policy.costs.timed(target_info.pass_ms, {} if draft_info is target_info else draft_info.pass_ms)
        self.model = Path(target_info.model).name  # gen_ai.request.model and the OpenAI API's model id
        metrics.serve_model(self.model)
        drafter = f"{target_info.drafter} {target_info.draft_model} in the verifier" if target_info.drafter else \
            draft_info.model
        log.info("connected: draft %s, target %s", drafter, target_info.model)

    async def _ensure_connected(self) -> None:
        if self._ready is None or (self._ready.done() and self._ready.exception()):
            self._ready = asyncio.ensure_future(self._connect())
        await asyncio.shield(self._ready)

    # --- the RPCs --------------------------------------------------------------------------

    async def Generate(self, request, grpc_context):
        chunks = [c async for c in self.generation(request, grpc_context)]
        return wire.response_to_pb(chunks[0].session_id, chunks)

    async def GenerateStream(self, request, grpc_context):
        async for chunk in self.generation(request, grpc_context):
            yield wire.chunk_to_pb(chunk)

    async def Resume(self, request, grpc_context):
        async for chunk in self.resumption(request, grpc_context):
            yield wire.chunk_to_pb(chunk)

    async def Cancel(self, request, grpc_context):
        try:
            self.authorize(grpc_context)
            wire.check_decoded(request)
            check_session_id(request.session_id)
            cancelled = await self.store.stop(request.session_id)
        except (FieldError, StoreUnavailable) as e:
            _refuse(grpc_context, trace.INVALID_SPAN, e)
            raise
        return wire.cancel_response(cancelled)

    # --- admission: the token, then a slot ------------------------------------------------

    def authorize(self, grpc_context) -> None:
        authorize(grpc_context.invocation_metadata(), self.config.api_key_sha256)

    @contextmanager
    def _admitted(self, grpc_context, span):
        """An authorized call, holding one of the replica's max_sessions slots while it runs;
        a refusal is answered at once (never queued) and ends the span."""
        try:
            self.authorize(grpc_context)
            if self._in_flight >= self.config.max_sessions:
                raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"sessions: {self._in_flight} generations in flight on this replica, at most "
                              f"{self.config.max_sessions}; retry later")
        except BaseException as e:
            _refuse(grpc_context, span, e)
            span.end()
            raise
        self._in_flight += 1
        try:
            yield
        finally:
            self._in_flight -= 1

    # --- a new session ---------------------------------------------------------------------

    async def generation(self, request, grpc_context):
        """A new session's chunks: first one with its id and no tokens, then its tokens. request:
        a GenerateRequest message or an already decoded GenerationRequest."""
        # Started, not made current: this generator's context does not survive its yields.
        span = tracing.start_span("text_completion", tracing.extract(grpc_context.invocation_metadata()),
                                  kind=SpanKind.SERVER,
                                  attributes={"gen_ai.operation.name": "text_completion", "gen_ai.system": "tandem"})
        with self._admitted(grpc_context, span):
            try:
                session = await self._start(request)
            except BaseException as e:
                _refuse(grpc_context, span, e)
                span.end()
                raise
            _describe(span, "text_completion", session, self.model)
            yield wire.Chunk(session.session_id, [])  # the session id, before any cycle: resumable from here on
            async for chunk in self._serve(session, span, IncrementalDetokenizer(self.tokenizer), grpc_context):
                yield chunk

    async def _start(self, request) -> Session:
        await self.connect_or_refuse()
        decoded = request if isinstance(request, wire.GenerationRequest) else wire.generation_request_from_pb(request)
        prompt, resolved = await self.off_loop(resolve, decoded, self.limits, self.tokenizer)
        session = Session(uuid.uuid4().hex, resolved, list(prompt), self._policy.for_session(), owner=_writer())
        await self.store.create(session)
        return session

    async def connect_or_refuse(self) -> None:
        try:
            await self._ensure_connected()
        except NoWorker as e:
            raise Refused(grpc.StatusCode.UNAVAILABLE, str(e)) from None

    # --- a resumed session -----------------------------------------------------------------

    async def resumption(self, request, grpc_context):
        """A session's chunks from request.from_index on: the committed tail first, then the rest."""
        span = tracing.start_span("resume", tracing.extract(grpc_context.invocation_metadata()), kind=SpanKind.SERVER,
                                  attributes={"gen_ai.operation.name": "text_completion", "gen_ai.system": "tandem",
                                              "gen_ai.response.id": getattr(request, "session_id", ""),
                                              "tandem.resume.from_index": getattr(request, "from_index", 0)})
        with self._admitted(grpc_context, span):
            try:
                wire.check_decoded(request)
                session, record = await self._restore(request.session_id, request.from_index)
            except BaseException as e:
                _refuse(grpc_context, span, e)
                span.end()
                raise
            metrics.resumes.inc()
            _describe(span, "resume", session, self.model)
            detok = resumed(self.tokenizer, record.generated, [c.output_tokens for c in record.per_cycle],
                            request.from_index)
            finished = record.status in FINISHED
            tail = record.generated[request.from_index:]
            yield wire.Chunk(session.session_id, tail, detok.push(tail, final=finished),
                             record.status if finished else "", session.stats if finished else None)
            if finished:
                _conclude(span, session)
                span.end()
                return
            async for chunk in self._serve(session, span, detok, grpc_context):
                yield chunk

    async def _restore(self, session_id: str, from_index: int) -> tuple[Session, SessionRecord]:
        """The session from Redis, taken over by this replica (a finished one is only read)."""
        check_session_id(session_id)
        await self.connect_or_refuse()
        owner = _writer()
        record = await self.store.claim(session_id, owner)
        if record is None:
            raise FieldError(grpc.StatusCode.NOT_FOUND, "session_id", f"no session {session_id!r} (finished "
                             f"sessions are kept for {self.config.session_ttl_s} s)")
        if from_index > len(record.generated):
            raise FieldError(grpc.StatusCode.OUT_OF_RANGE, "from_index",
                             f"{from_index} is past the {len(record.generated)} tokens committed")
        finished = record.status in FINISHED
        session = Session(
            session_id, record.request, list(record.tokens), self._policy.for_session(record.acceptance), owner=owner,
            epoch=record.epoch, cycle=record.cycle, workers=dict(record.workers), cache_lens=dict(record.cache_lens),
            finish_reason=record.status if finished else "",
            used={(kind, address) for kind, address in record.workers.items() if address},  # freed at the end
            started=time.perf_counter() - max(0.0, time.time() - record.created_s),
        )
        session.stats = wire.Stats(time.time() - record.created_s, record.ttft_s, list(record.per_cycle))
        return session, record

    async def healthy(self) -> bool:
        """Connected to the workers, with a target verifier up: sessions can run."""
        try:
            await self.connect_or_refuse()
        except Refused:
            return False
        return self.targets.available()

    async def off_loop(self, fn, *args):
        """fn(*args) on the replica's tokenizing threads, off the loop that streams every session."""
        return await asyncio.get_running_loop().run_in_executor(self._tokenizing, fn, *args)

    # --- cycles to chunks, and how a request ends ------------------------------------------

    async def _serve(self, session: Session, span, detok: IncrementalDetokenizer, grpc_context):
        """Run the session's cycles and stream their tokens: the first cycle's at once (the time to
        the first token), then a chunk once it holds config.stream_interval tokens, and the rest
        at the end; end the request cleanly however it ends: finished, refused (a clear status), or
        abandoned by its client (committed tokens it was not sent yet are resumable)."""
        clock = metrics.RequestClock()
        here = trace.set_span_in_context(span)
        ended = ""  # how the session ended when it did not finish: abandoned, unavailable, taken over
        try:
            held, first = [], True  # committed tokens not yet streamed (config.stream_interval)
            async for out in self.loop.run(session, here):
                metrics.observe_cycle(session.stats.per_cycle[-1])
                held += out.tokens
                last = out.finished
                if not (first or last or len(held) >= self.config.stream_interval):
                    continue
                clock.delivered(len(held), session.finish_reason if last else "")
                yield wire.Chunk(session.session_id, held, detok.push(held, final=last),
                                 session.finish_reason if last else "", session.stats if last else None)
                held, first = [], False
        except BaseException as e:
            ended = _ending(e)
            _refuse(grpc_context, span, e)
            raise
        finally:
            await self._end(session, ended, here)
            _conclude(span, session)
            span.end()

    async def _end(self, session: Session, ended: str, parent) -> None:
        """Record how an unfinished session ended (it stays resumable) and free its caches now
        rather than waiting for LRU eviction: they are soft state. A session another stream took
        over keeps both."""
        pools = {"draft": self.drafts, "target": self.targets}
        clients = [pools[kind].workers[address].client for kind, address in session.used
                   if address in pools[kind].workers]
        if ended == "taken over":
            return
        if ended in ("abandoned", "unavailable"):  # resumable; the record says why it stopped
            try:
                await self.store.finish(session.session_id, session.owner, ended)
            except StoreUnavailable:
                pass
        calls = [c.release(session.session_id, parent, session.epoch) for c in clients]
        for r in await asyncio.gather(*calls, return_exceptions=True):
            if isinstance(r, Exception):
                log.warning("release of %s failed: %s", session.session_id, r)


def _writer() -> str:
    """A new writer's id for the session record: which orchestrator process writes it, and a
    part of its own (host:pid:random)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


def _ending(e: BaseException) -> str:
    """How an unfinished session ended, as its record will say."""
    if isinstance(e, (asyncio.CancelledError, GeneratorExit)):
        return "abandoned"  # the client went away
    if isinstance(e, Fenced):  # taken over: another stream writes it now, its record and caches are not ours
        return e.reason
    if isinstance(e, StoreUnavailable):
        return "store unavailable"  # nothing can be recorded
    return "unavailable"


def _refuse(grpc_context, span, e: BaseException) -> None:
    """Answer the failure with its status (the client's side of `refusal`), in the span too."""
    refused = refusal(e)
    if refused is None:
        return
    if isinstance(e, StoreUnavailable):
        metrics.store_unavailable.inc()
    grpc_context.set_code(refused.code)
    grpc_context.set_details(str(refused))
    span.set_status(Status(StatusCode.ERROR, f"{refused.code.name}: {refused}"))


def _describe(span, operation: str, session: Session, model: str) -> None:
    """The request span's OpenTelemetry GenAI attributes (semantic conventions v1.36.0)."""
    r = session.request
    p = r.params
    span.update_name(f"{operation} {model}")
    span.set_attributes({
        "gen_ai.request.model": model, "gen_ai.request.temperature": p.temperature,
        "gen_ai.request.top_p": p.top_p, "gen_ai.request.top_k": p.top_k,
        "gen_ai.request.max_tokens": r.max_tokens,
        "gen_ai.usage.input_tokens": r.prompt_len, "gen_ai.response.id": session.session_id,
        "tandem.gamma": "adaptive" if r.gamma is None else str(r.gamma),
        "tandem.verification": r.verification, "tandem.draft_shape": r.draft_shape,
    })
    if p.seed < 2**63:  # OTLP integers are int64; a client's seed may use all 64 bits
        span.set_attribute("gen_ai.request.seed", p.seed)


def _conclude(span, session: Session) -> None:
    s = session.stats
    span.set_attributes({
        "gen_ai.usage.output_tokens": session.generated,
        "gen_ai.response.finish_reasons": [session.finish_reason] if session.finish_reason else [],
        "tandem.cycles": s.cycles, "tandem.drafted_tokens": s.drafted_tokens,
        "tandem.accepted_tokens": s.accepted_tokens,
    })


# Serve's controller notices a dead replica only at its next health check (every 10 s by
# default), and meanwhile counts it as running: two replicas killed within that window left
# none for ~10 s here. Every 2 s, a replacement starts sooner; the 30 s timeout stays, so a
# busy replica is not taken for a dead one. (max_ongoing_requests: build_app sets it above
# the config's max_sessions, so that the replica refuses what is over, not Serve's queue.)
# The same name for both: with the OpenAI API's routes on Serve's HTTP ingress, and without.
_OPTIONS = {"name": "GenerationService", "ray_actor_options": {"num_cpus": 0}, "health_check_period_s": 2.0}
grpc_only = serve.deployment(**_OPTIONS)(GenerationService)
with_openai_api = serve.deployment(**_OPTIONS)(serve.ingress(http_ingress.api)(GenerationService))

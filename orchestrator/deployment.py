"""The Ray Serve deployment behind the gRPC ingress: the `tandem.v1.Generation` service.

Topology:

    client ──gRPC──▶ Ray Serve gRPC proxy ──▶ GenerationService (this deployment)
                                                 │  persistent grpc.aio channels, per cycle
                                                 ├──▶ draft worker      (DraftWorker)
                                                 ├──▶ target verifier   (TargetVerifier)
                                                 └──▶ Redis             (sessions)

Ray is on the ingress path only: one Serve call per request, never one per cycle.
"""

import asyncio
import logging
import uuid
from pathlib import Path

import grpc
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from ray import serve

from tandem import tracing
from tandem.orchestrator import metrics
from tandem.orchestrator.clients import DraftClient, VerifierClient
from tandem.orchestrator.config import OrchestratorConfig
from tandem.orchestrator.cycle import Session, SpeculativeLoop
from tandem.orchestrator.detokenizer import IncrementalDetokenizer
from tandem.orchestrator.policy import GammaPolicy
from tandem.orchestrator.requests import Limits, ResolvedRequest, resolve
from tandem.orchestrator.store import SessionRecord, SessionStore
from tandem.wire import generation as wire
from tandem.wire.validation import FieldError

log = logging.getLogger("tandem.orchestrator")


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=64)
class GenerationService:
    def __init__(self, config: OrchestratorConfig) -> None:
        self.config = config
        self.draft = DraftClient(config.draft_address, config.worker_timeout_s)
        self.target = VerifierClient(config.target_address, config.worker_timeout_s)
        self.store = SessionStore.from_url(config.redis_url, config.session_ttl_s)
        self.tokenizer = config.load_tokenizer()
        tracing.setup("tandem-orchestrator")
        if config.metrics_port:
            try:
                metrics.serve(config.metrics_port)
            except OSError as e:  # e.g. a second replica on this node: serve requests all the same
                log.error("Prometheus metrics not served on port %d: %s", config.metrics_port, e)
        self._ready: asyncio.Task | None = None
        # Costs measured by the last session seed the next one's policy.
        self._policy_template = GammaPolicy(max_gamma=config.max_gamma, initial_gamma=min(4, config.max_gamma))

    async def _connect(self) -> None:
        draft_info, target_info = await asyncio.gather(self.draft.describe(), self.target.describe())
        self.limits = Limits.of(draft_info, target_info, self.config.max_gamma,
                                self.config.max_tokens_cap, self.config.default_max_tokens)
        self.loop = SpeculativeLoop(self.draft, self.target, self.store, target_info.eos_token_ids,
                                    draft_ahead=self.config.draft_ahead)
        self.model = Path(target_info.model).name  # gen_ai.request.model: the target's name
        log.info("connected: draft %s, target %s", draft_info.model, target_info.model)

    async def _start(self, request, grpc_context) -> Session:
        if self._ready is None or (self._ready.done() and self._ready.exception()):
            self._ready = asyncio.ensure_future(self._connect())
        await asyncio.shield(self._ready)
        try:
            resolved = resolve(wire.generation_request_from_pb(request), self.limits, self.tokenizer)
        except FieldError as e:
            grpc_context.set_code(e.code)
            grpc_context.set_details(str(e))
            raise
        session = self._new_session(resolved)
        await self.store.create(SessionRecord(
            session.session_id,
            {"temperature": resolved.params.temperature, "top_k": resolved.params.top_k,
             "top_p": resolved.params.top_p, "seed": resolved.params.seed,
             "max_tokens": resolved.max_tokens, "gamma": resolved.gamma},
            session.prompt_len, session.tokens, 0, session.policy.to_dict(),
            {"draft": self.config.draft_address, "target": self.config.target_address},
            {"draft": 0, "target": 0}, "running",
        ))
        return session

    def _new_session(self, r: ResolvedRequest) -> Session:
        return Session(
            session_id=uuid.uuid4().hex, params=r.params, tokens=list(r.prompt_token_ids),
            prompt_len=len(r.prompt_token_ids), max_tokens=r.max_tokens,
            policy=self._policy_template.with_fresh_acceptance(), fixed_gamma=r.gamma,
        )

    async def _chunks(self, request, grpc_context):
        clock = metrics.RequestClock()
        # Started, not made current: this generator's context does not survive its yields.
        span = tracing.start_span("text_completion", tracing.extract(grpc_context.invocation_metadata()),
                                  kind=SpanKind.SERVER,
                                  attributes={"gen_ai.operation.name": "text_completion", "gen_ai.system": "tandem"})
        try:
            session = await self._start(request, grpc_context)
        except BaseException as e:
            span.set_status(Status(StatusCode.ERROR, str(e)))
            span.end()
            raise
        _describe(span, session, self.model)
        here = trace.set_span_in_context(span)
        detok = IncrementalDetokenizer(self.tokenizer)
        try:
            async for out in self.loop.run(session, here):
                metrics.observe_cycle(session.stats.per_cycle[-1])
                clock.delivered(len(out.tokens), session.finish_reason if out.finished else "")
                text = detok.push(out.tokens, final=out.finished)
                last = out.finished
                yield wire.Chunk(session.session_id, out.tokens, text,
                                  session.finish_reason if last else "", session.stats if last else None)
        except grpc.aio.AioRpcError as e:  # a worker failed: tell the client which and why
            grpc_context.set_code(grpc.StatusCode.UNAVAILABLE if e.code() == grpc.StatusCode.UNAVAILABLE
                                  else grpc.StatusCode.INTERNAL)
            grpc_context.set_details(f"worker call failed: {e.code().name}: {e.details()}")
            span.set_status(Status(StatusCode.ERROR, f"worker call failed: {e.code().name}"))
            raise
        finally:
            if session.policy.n:
                self._policy_template = session.policy
            await self._release(session.session_id, here)
            _conclude(span, session)
            span.end()

    async def _release(self, session_id: str, parent) -> None:
        # Caches are soft state: free them now rather than waiting for LRU eviction.
        results = await asyncio.gather(self.draft.release(session_id, parent),
                                       self.target.release(session_id, parent), return_exceptions=True)
        for r in results:
            if isinstance(r, Exception):
                log.warning("release of %s failed: %s", session_id, r)

    async def Generate(self, request, grpc_context):
        chunks = [c async for c in self._chunks(request, grpc_context)]
        return wire.response_to_pb(chunks[0].session_id, chunks)

    async def GenerateStream(self, request, grpc_context):
        async for chunk in self._chunks(request, grpc_context):
            yield wire.chunk_to_pb(chunk)


def _describe(span, session: Session, model: str) -> None:
    """The request span's OpenTelemetry GenAI attributes (semantic conventions v1.36.0)."""
    p = session.params
    span.update_name(f"text_completion {model}")
    span.set_attributes({
        "gen_ai.request.model": model, "gen_ai.request.temperature": p.temperature,
        "gen_ai.request.top_p": p.top_p, "gen_ai.request.top_k": p.top_k,
        "gen_ai.request.max_tokens": session.max_tokens,
        "gen_ai.usage.input_tokens": session.prompt_len, "gen_ai.response.id": session.session_id,
        "tandem.gamma": "adaptive" if session.fixed_gamma is None else str(session.fixed_gamma),
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

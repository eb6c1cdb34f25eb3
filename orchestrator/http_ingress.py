"""The OpenAI-compatible HTTP API: routes on Ray Serve's HTTP ingress, run by the same
GenerationService replicas as the gRPC methods, so the same sessions, γ policy, Redis and
workers serve both.

    POST /v1/completions, /v1/chat/completions   generations (stream: server-sent events)
    GET  /v1/models                             the served model
    GET  /health                                200 once a target verifier is up, else 503
    GET  /metrics                               this replica's Prometheus metrics

A stream is resumable: its response header x-tandem-session-id names the session, and each
chunk's `resume_index` is how many tokens it has delivered. A client that lost the stream sends
the same request again with that header and x-tandem-resume-index, and gets the rest. (Not SSE
`id:` lines: the field's stream parsers, `vllm bench serve`'s among them, take every event for
a lone `data:` line.)

The routes find their replica through Serve's replica context and call its session core; this
module imports nothing of the deployment's (the deployment imports it).
"""

import json
import logging
import time

import grpc
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from ray import serve
from starlette.exceptions import HTTPException

from tandem.orchestrator import metrics
from tandem.orchestrator.detokenizer import IncrementalDetokenizer
from tandem.orchestrator.openai_protocol import (CHAT, COMPLETION, ApiRequest, Shaper, chat_prompt_ids, error,
                                                 field_name, model_card, parse)
from tandem.orchestrator.refusals import refusal
from tandem.orchestrator.requests import resolve
from tandem.orchestrator.stop_strings import StopStrings
from tandem.wire import generation as wire
from tandem.wire.validation import FieldError, invalid

log = logging.getLogger("tandem.orchestrator")

MAX_BODY_BYTES = 4 << 20  # as the gRPC ingress's largest request
SESSION_HEADER = "x-tandem-session-id"
RESUME_HEADER = "x-tandem-resume-index"
MAX_RESUME_INDEX = 2**32 - 1  # a ResumeRequest's from_index

_STATUS = {grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.OUT_OF_RANGE: 400,
           grpc.StatusCode.FAILED_PRECONDITION: 400, grpc.StatusCode.UNAUTHENTICATED: 401,
           grpc.StatusCode.NOT_FOUND: 404, grpc.StatusCode.ABORTED: 409, grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
           grpc.StatusCode.INTERNAL: 500, grpc.StatusCode.UNAVAILABLE: 503, grpc.StatusCode.DEADLINE_EXCEEDED: 504}
_TYPE = {401: "authentication_error", 429: "rate_limit_error", 500: "server_error", 503: "service_unavailable_error",
         504: "timeout_error"}
_CODE = {401: "invalid_api_key", 413: "request_too_large", 429: "rate_limit_exceeded"}

api = FastAPI(title="tandem", docs_url=None, redoc_url=None, openapi_url=None)


class HttpError(Exception):
    """An HTTP answer of this module's own (404 model, 413 body)."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param, self.code = status, param, code


class HttpCall:
    """What the session core reads of a call: its metadata (the headers, lower-cased, carrying
    `authorization` and `traceparent`). The status goes into the HTTP answer instead."""

    def __init__(self, request: Request) -> None:
        self._metadata = list(request.headers.items())

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return self._metadata

    def set_code(self, code) -> None:
        pass

    def set_details(self, details: str) -> None:
        pass


def _service():
    return serve.get_replica_context().servable_object


def _error(status: int, message: str, param: str | None = None, code: str | None = None) -> tuple[int, dict]:
    return status, error(message, _TYPE.get(status, "invalid_request_error"), param, code or _CODE.get(status))


def _answer(status: int, body: dict) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else {"Retry-After": "1"} if status == 429 else None
    return JSONResponse(body, status_code=status, headers=headers)


def _status(e: Exception, req: ApiRequest | None) -> tuple[int, dict]:
    """The HTTP status and OpenAI error body of a failure."""
    if isinstance(e, HttpError):
        return _error(e.status, str(e), e.param, e.code)
    refused = refusal(e)
    if refused is None:
        log.exception("an HTTP request failed")
        return _error(500, f"internal error: {type(e).__name__}: {e}")
    status = _STATUS.get(refused.code, 500)
    if isinstance(e, FieldError):
        return _error(status, str(e), field_name(e, req))
    return _error(status, str(refused))


def _failure(e: Exception, req: ApiRequest | None) -> JSONResponse:
    """The OpenAI error answering a failure before the response began."""
    return _answer(*_status(e, req))


@api.exception_handler(HTTPException)
async def _http_exception(request: Request, e: HTTPException) -> JSONResponse:
    return _answer(*_error(e.status_code, f"{request.method} {request.url.path}: {e.detail}"))


# --- the routes ------------------------------------------------------------------------------


@api.get("/health")
async def health() -> Response:
    if await _service().healthy():
        return Response(status_code=200)
    return _answer(*_error(503, "no target verifier is up"))


@api.get("/metrics")
async def prometheus() -> Response:
    return Response(generate_latest(metrics.REGISTRY), media_type=CONTENT_TYPE_LATEST)


@api.get("/v1/models")
async def models(request: Request) -> JSONResponse:
    service = _service()
    try:
        service.authorize(HttpCall(request))
        await service.connect_or_refuse()
    except Exception as e:
        return _failure(e, None)
    card = model_card(service.model, service.limits.max_context, int(time.time()))
    return JSONResponse({"object": "list", "data": [card]})


@api.post("/v1/completions")
async def completions(request: Request) -> Response:
    return await _generate(request, COMPLETION)


@api.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    return await _generate(request, CHAT)


async def _generate(request: Request, kind: str) -> Response:
    service, call, req = _service(), HttpCall(request), None
    try:
        service.authorize(call)  # before anything is read or tokenized
        req = parse(await _body(request), kind)
        await service.connect_or_refuse()
        if req.model not in (None, service.model):
            raise HttpError(404, f"the model {req.model!r} is not served here; /v1/models lists {service.model!r}",
                            "model", "model_not_found")
        prompt = await service.off_loop(_prompt_ids, req, service.limits, service.tokenizer)
        session_id = request.headers.get(SESSION_HEADER)
        if session_id:
            answer = await _resumed(service, req, call, prompt, session_id, _resume_index(request))
        else:
            req.generation.prompt, req.generation.prompt_token_ids = "", prompt  # tokenized once
            answer = _Answer(service, req, service.generation(req.generation, call), len(prompt))
        await answer.open()
    except Exception as e:
        return _failure(e, req)
    headers = {SESSION_HEADER: answer.session_id}
    if req.stream:
        return _EventStream(answer.events(), headers=headers | {"Cache-Control": "no-cache"})
    try:
        return JSONResponse(await answer.whole(), headers=headers)
    except Exception as e:
        return _failure(e, req)


def _prompt_ids(req: ApiRequest, limits, tokenizer) -> list[int]:
    """The prompt's token ids (a chat's through its template), checked as the session core checks them."""
    if req.kind == CHAT:
        req.generation.prompt_token_ids = chat_prompt_ids(tokenizer, req.messages)
    prompt, _ = resolve(req.generation, limits, tokenizer)
    return prompt


async def _body(request: Request) -> object:
    """The request's JSON, read up to MAX_BODY_BYTES (Serve's HTTP proxy bounds none)."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > MAX_BODY_BYTES:
        raise HttpError(413, f"the request body has {length} bytes, at most {MAX_BODY_BYTES}")
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > MAX_BODY_BYTES:
            raise HttpError(413, f"the request body is over {MAX_BODY_BYTES} bytes")
    try:
        return json.loads(body)
    except ValueError as e:
        raise invalid("body", f"not valid JSON: {e}") from None


def _resume_index(request: Request) -> int:
    value = request.headers.get(RESUME_HEADER, "0").strip() or "0"
    if not value.isdigit() or int(value) > MAX_RESUME_INDEX:
        raise invalid(RESUME_HEADER, f"the last resume_index the stream sent, got {value[:40]!r}")
    return int(value)


async def _resumed(service, req: ApiRequest, call: HttpCall, prompt: list[int], session_id: str,
                   from_index: int) -> "_Answer":
    """The answer that goes on with a session from from_index: the same request again (its
    prompt is checked against the session's), the rest of its tokens, its stop strings
    matched across the break exactly as they would have been without it."""
    record = await service.store.load(session_id) if 0 < len(session_id) <= 128 else None
    if record is None:
        raise HttpError(404, f"no session {session_id[:128]!r} (finished sessions are kept for "
                        f"{service.config.session_ttl_s} s)", SESSION_HEADER)
    if prompt != record.tokens[:record.request.prompt_len]:
        raise invalid("prompt" if req.kind == COMPLETION else "messages",
                      f"not the prompt of session {session_id}: resume with the request that began it")
    before = record.generated[:from_index]
    chunks = service.resumption(wire.resume_request(session_id, from_index), call)
    return _Answer(service, req, chunks, len(prompt), before)


class _Answer:
    """One response: the session's chunks, cut at a stop string, shaped as OpenAI's objects."""

    def __init__(self, service, req: ApiRequest, chunks, prompt_tokens: int, before: list[int] = ()) -> None:
        self.service, self.req, self.chunks = service, req, chunks
        self.prompt_tokens = prompt_tokens
        self.generated = list(before)  # generated tokens so far, those the client had first
        self.stops = StopStrings(req.stop)
        if req.stop and before:  # what the client had, through the same matcher
            self.stops.push(IncrementalDetokenizer(service.tokenizer).push(list(before)))
        self.session_id = ""
        self.per_cycle: list = []

    async def open(self) -> None:
        """Run to the session's first chunk: its id (admission and validation are behind it)."""
        first = await anext(self.chunks)
        self.session_id = first.session_id
        self._first = first if first.token_ids or first.finish_reason else None  # a resumed tail

    async def pieces(self):
        """(text, finish reason or None) as the session commits tokens; the finish reason on the last."""
        if self._first is not None:
            yield (piece := await self._piece(self._first))
            if piece[1]:
                return
        async for chunk in self.chunks:
            piece = await self._piece(chunk)
            yield piece
            if piece[1]:
                break

    async def _piece(self, chunk: wire.Chunk) -> tuple[str, str | None]:
        self.generated += chunk.token_ids
        if chunk.stats is not None:
            self.per_cycle = chunk.stats.per_cycle
        text = self.stops.push(chunk.text, final=bool(chunk.finish_reason))
        if not self.stops.matched:
            return text, chunk.finish_reason or None
        await self._stopped()
        return text, "stop"

    async def _stopped(self) -> None:
        """A stop string ended the answer: the session is finished ("stop") and stops drafting;
        the tokens counted are those up to the one that completed the stop string."""
        service = self.service
        await service.store.stop(self.session_id, "stop")
        await self.chunks.aclose()
        self.generated = self.generated[:_tokens_to(service.tokenizer, self.generated, self.stops.end)]
        record = await service.store.load(self.session_id)
        self.per_cycle = record.per_cycle if record else self.per_cycle

    async def whole(self) -> dict:
        texts, reason = [], None
        async for text, reason in self.pieces():
            texts.append(text)
        shaper = self._shaper()
        return shaper.whole("".join(texts), reason or "stop", self.prompt_tokens, len(self.generated), self.per_cycle)

    def _shaper(self) -> Shaper:
        return Shaper(self.req, self.session_id, self.service.model, self.service.config.max_gamma)

    async def events(self):
        """The server-sent events: one per chunk with text, the last with the finish reason,
        then (include_usage) usage and metrics, then [DONE]."""
        shaper, first = self._shaper(), True
        try:
            async for text, reason in self.pieces():
                if text or reason:
                    yield _event(shaper.chunk(text, reason, first, resume_index=len(self.generated)))
                    first = False
            if self.req.include_usage:
                yield _event(shaper.last(self.prompt_tokens, len(self.generated), self.per_cycle))
        except Exception as e:  # the 200 is out: the error goes as an event, as vLLM's and OpenAI's do
            yield _event(_status(e, self.req)[1])
        yield b"data: [DONE]\n\n"


def _event(body: dict) -> bytes:
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


def _tokens_to(tokenizer, generated: list[int], end: int) -> int:
    """The fewest leading tokens of `generated` whose text reaches character `end`."""
    lo, hi = 0, len(generated)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(IncrementalDetokenizer(tokenizer).push(generated[:mid], final=True)) >= end:
            hi = mid
        else:
            lo = mid + 1
    return lo


class _EventStream(StreamingResponse):
    """Server-sent events, sent without Starlette's own disconnect listener: its task group
    cancels the stream again inside the session's cleanup (recording an abandoned session,
    releasing its caches). Serve's proxy cancels the call when the client goes, which the
    session core handles."""

    media_type = "text/event-stream"

    async def __call__(self, scope, receive, send) -> None:
        await self.stream_response(send)

"""The Generation service's wire code (client ↔ orchestrator): domain values ↔ tandem.v1
messages. The SDK and the orchestrator's ingress call these functions and never touch *_pb2.
Plain Python and protobuf: the SDK imports it.
"""

from dataclasses import dataclass, field

from google.protobuf.message import DecodeError

from tandem.math.acceptance import verified_tokens
from tandem.v1 import generation_pb2, generation_pb2_grpc, sampling_pb2
from tandem.wire.validation import invalid

class _Choice:
    """A tandem.v1 enum as the lower-case names the rest of tandem uses, "" for unspecified (the
    server's default): VERIFICATION_BLOCK ↔ "block"."""

    def __init__(self, enum, prefix: str, field: str) -> None:
        self.field = field
        self._pb = {name.removeprefix(prefix).lower() if value else "": value for name, value in enum.items()}
        self._of_pb = {value: name for name, value in self._pb.items()}
        self.names = tuple(name for name in self._pb if name)
        given = [name for name, value in enum.items() if value]
        self._hint = ", ".join(given[:-1]) + " or " + given[-1]

    def to_pb(self, name: str) -> int:
        return self._pb[name]

    def from_pb(self, value: int) -> str:
        """→ the name, "" when unspecified; INVALID_ARGUMENT naming the field on a value this
        version lacks."""
        if value not in self._of_pb:
            raise invalid(self.field, f"unknown {self.field.replace('_', ' ')} {value}: use {self._hint}")
        return self._of_pb[value]


VERIFICATION = _Choice(sampling_pb2.Verification, "VERIFICATION_", "verification")  # how a drafted block is accepted
DRAFT_SHAPE = _Choice(sampling_pb2.DraftShape, "DRAFT_SHAPE_", "draft_shape")  # what a cycle drafts
TREE_RULE = _Choice(sampling_pb2.TreeRule, "TREE_RULE_", "tree_rule")  # how sampled token trees are drawn and verified
VERIFICATION_MODES, DRAFT_SHAPES, TREE_RULES = VERIFICATION.names, DRAFT_SHAPE.names, TREE_RULE.names


@dataclass
class GenerationRequest:
    """A decoded GenerateRequest; None marks a field the client left unset."""

    prompt: str = ""
    prompt_token_ids: list[int] = field(default_factory=list)
    max_tokens: int = 0
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    gamma: int | None = None
    verification: str = ""  # "token", "block", or "" for the server's default
    draft_shape: str = ""  # "chain", "tree", "auto", or "" for the server's default
    ignore_eos: bool = False  # generate past the target's EOS, up to max_tokens
    tree_rule: str = ""  # "rrsw", "greedy", or "" for the server's default


def _opt(msg, name):
    return getattr(msg, name) if msg.HasField(name) else None


def generation_request_to_pb(req: GenerationRequest) -> generation_pb2.GenerateRequest:
    kwargs = {k: v for k, v in vars(req).items() if v is not None}
    kwargs["verification"] = VERIFICATION.to_pb(req.verification)
    kwargs["draft_shape"] = DRAFT_SHAPE.to_pb(req.draft_shape)
    kwargs["tree_rule"] = TREE_RULE.to_pb(req.tree_rule)
    return generation_pb2.GenerateRequest(**kwargs)


def resume_request(session_id: str, from_index: int) -> generation_pb2.ResumeRequest:
    return generation_pb2.ResumeRequest(session_id=session_id, from_index=from_index)


def cancel_request(session_id: str) -> generation_pb2.CancelRequest:
    return generation_pb2.CancelRequest(session_id=session_id)


def cancel_response(cancelled: bool) -> generation_pb2.CancelResponse:
    return generation_pb2.CancelResponse(cancelled=cancelled)


def generation_request_from_pb(msg: generation_pb2.GenerateRequest) -> GenerationRequest:
    """The request's fields; a FieldError (INVALID_ARGUMENT) for a message that did not parse."""
    check_decoded(msg)
    return GenerationRequest(
        prompt=msg.prompt, prompt_token_ids=list(msg.prompt_token_ids), max_tokens=msg.max_tokens,
        temperature=_opt(msg, "temperature"), top_k=_opt(msg, "top_k"), top_p=_opt(msg, "top_p"),
        seed=_opt(msg, "seed"), gamma=_opt(msg, "gamma"), verification=VERIFICATION.from_pb(msg.verification),
        draft_shape=DRAFT_SHAPE.from_pb(msg.draft_shape), ignore_eos=msg.ignore_eos,
        tree_rule=TREE_RULE.from_pb(msg.tree_rule),
    )


@dataclass
class CycleStats:
    """One draft-verify cycle (CycleStats on the wire); times in milliseconds."""

    gamma: int = 0
    accepted: int = 0
    output_tokens: int = 0
    start_ms: float = 0.0  # since the generation began
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    transport_ms: float = 0.0
    redis_ms: float = 0.0
    orchestration_ms: float = 0.0
    wire_bytes: int = 0
    drafted_ahead: bool = False  # the block was drafted during the last cycle's verify
    ahead_ms: float = 0.0  # draft compute past this block, overlapped with its verify
    wait_ms: float = 0.0  # the worker calls waiting while their workers ran other sessions' work


def _total(field_name: str, doc: str) -> property:
    return property(lambda self: sum(getattr(c, field_name) for c in self.per_cycle), doc=doc)


class CycleTotals:
    """Totals over `self.per_cycle`: what a generation's stats derive rather than store."""

    per_cycle: list[CycleStats]

    drafted_tokens = _total("gamma", "Tokens the draft proposed.")
    accepted_tokens = _total("accepted", "Drafted tokens the target accepted.")
    draft_ms = _total("draft_ms", "Draft compute, summed.")
    verify_ms = _total("verify_ms", "Verify compute, summed.")
    transport_ms = _total("transport_ms", "gRPC transport and serialization, summed.")
    wait_ms = _total("wait_ms", "Waits for the workers' passes of other sessions' work, summed.")
    redis_ms = _total("redis_ms", "Redis commits, summed (each overlaps the next cycle's first call).")
    orchestration_ms = _total("orchestration_ms", "The rest of the cycles, summed.")

    @property
    def cycles(self) -> int:
        return len(self.per_cycle)

    @property
    def verified_tokens(self) -> int:
        """Accepted plus the one rejected token of each cycle that rejected."""
        return sum(verified_tokens(c.accepted, c.gamma) for c in self.per_cycle)

    @property
    def gammas(self) -> list[int]:
        return [c.gamma for c in self.per_cycle]


@dataclass
class Stats(CycleTotals):
    """Timings and cycles of one generation (GenerationStats on the wire)."""

    elapsed_s: float = 0.0
    ttft_s: float = 0.0
    per_cycle: list[CycleStats] = field(default_factory=list)


def stats_to_pb(stats: Stats) -> generation_pb2.GenerationStats:
    per_cycle = [generation_pb2.CycleStats(**vars(c)) for c in stats.per_cycle]
    return generation_pb2.GenerationStats(elapsed_s=stats.elapsed_s, ttft_s=stats.ttft_s, per_cycle=per_cycle)


def stats_from_pb(msg: generation_pb2.GenerationStats) -> Stats:
    per_cycle = [CycleStats(**{f: getattr(c, f) for f in vars(CycleStats())}) for c in msg.per_cycle]
    return Stats(msg.elapsed_s, msg.ttft_s, per_cycle)


@dataclass
class Chunk:
    """Tokens committed by one cycle; the last chunk carries finish_reason and stats."""

    session_id: str
    token_ids: list[int]
    text: str = ""
    finish_reason: str = ""
    stats: Stats | None = None


def chunk_to_pb(chunk: Chunk) -> generation_pb2.GenerateChunk:
    msg = generation_pb2.GenerateChunk(
        session_id=chunk.session_id, token_ids=chunk.token_ids, text=chunk.text,
        finish_reason=chunk.finish_reason,
    )
    if chunk.stats is not None:
        msg.stats.CopyFrom(stats_to_pb(chunk.stats))
    return msg


def chunk_from_pb(msg: generation_pb2.GenerateChunk) -> Chunk:
    stats = stats_from_pb(msg.stats) if msg.HasField("stats") else None
    return Chunk(msg.session_id, list(msg.token_ids), msg.text, msg.finish_reason, stats)


def response_to_pb(session_id: str, chunks: list[Chunk]) -> generation_pb2.GenerateResponse:
    """The unary answer: all chunks of a generation folded into one message."""
    last = chunks[-1]
    return generation_pb2.GenerateResponse(
        session_id=session_id, text="".join(c.text for c in chunks),
        token_ids=[t for c in chunks for t in c.token_ids], finish_reason=last.finish_reason,
        stats=stats_to_pb(last.stats or Stats()),
    )


# --- requests that do not parse -----------------------------------------------------------


@dataclass(frozen=True)
class Undecodable:
    """Stands in for a request message whose bytes did not parse, so that the servicer answers
    INVALID_ARGUMENT naming the field rather than gRPC answering UNKNOWN with the parser's text."""

    message_type: str
    field: str  # the field at fault where it can be told ("prompt": not UTF-8), else "request"
    reason: str


def check_decoded(msg) -> None:
    """Raise the FieldError an Undecodable stands for; a parsed message passes."""
    if isinstance(msg, Undecodable):
        raise invalid(msg.field, f"{msg.reason} (not a valid {msg.message_type})")


def _lenient(message_class):
    """A request deserializer that returns an Undecodable instead of raising."""

    def parse(data: bytes):
        try:
            return message_class.FromString(data)
        except DecodeError:
            return _explain(message_class, data)

    return parse


def _explain(message_class, data: bytes) -> Undecodable:
    """Which top-level string field is not UTF-8, when that is what failed."""
    name = message_class.DESCRIPTOR.full_name
    strings = {f.number: f.name for f in message_class.DESCRIPTOR.fields if f.type == f.TYPE_STRING}
    try:
        for number, value in _length_delimited(data):
            if number in strings:
                try:
                    value.decode("utf-8")
                except UnicodeDecodeError:
                    return Undecodable(name, strings[number], "is not valid UTF-8")
    except ValueError:
        pass
    return Undecodable(name, "request", "the message does not parse")


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        byte = data[i]
        value |= (byte & 0x7F) << shift
        i, shift = i + 1, shift + 7
        if byte < 0x80:
            return value, i


def _length_delimited(data: bytes):
    """(field number, bytes) of each length-delimited top-level field; ValueError on garbage."""
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            _, i = _varint(data, i)
        elif wire_type in (1, 5):
            i += 8 if wire_type == 1 else 4
        elif wire_type == 2:
            size, i = _varint(data, i)
            yield number, data[i:i + size]
            i += size
        else:
            raise ValueError(f"wire type {wire_type}")


class _LenientServer:
    """What add_GenerationServicer_to_server registers on, with lenient request deserializers."""

    def __init__(self, server) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, handlers) -> None:
        for handler in handlers:
            handler._method_handlers = {name: _leniently(h) for name, h in handler._method_handlers.items()}
        self._server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(self, service: str, method_handlers: dict) -> None:
        self._server.add_registered_method_handlers(
            service, {name: _leniently(h) for name, h in method_handlers.items()})


def _leniently(handler):
    message_class = getattr(handler.request_deserializer, "__self__", None)  # GenerateRequest.FromString's class
    if not isinstance(message_class, type):
        return handler
    return handler._replace(request_deserializer=_lenient(message_class))


def add_generation_servicer(servicer, server) -> None:
    """generation_pb2_grpc.add_GenerationServicer_to_server, with requests that do not parse
    handed to the servicer as Undecodable (Ray Serve's gRPC proxy parses them, in its process)."""
    generation_pb2_grpc.add_GenerationServicer_to_server(servicer, _LenientServer(server))

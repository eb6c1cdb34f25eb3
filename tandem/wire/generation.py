"""The Generation service's wire code (client ↔ orchestrator): domain values ↔ tandem.v1
messages. The SDK and the orchestrator's ingress call these functions and never touch *_pb2.
Plain Python and protobuf: the SDK imports it.
"""

from dataclasses import dataclass, field

from tandem.math.acceptance import verified_tokens
from tandem.v1 import generation_pb2


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


def _opt(msg, name):
    return getattr(msg, name) if msg.HasField(name) else None


def generation_request_to_pb(req: GenerationRequest) -> generation_pb2.GenerateRequest:
    kwargs = {k: v for k, v in vars(req).items() if v is not None}
    return generation_pb2.GenerateRequest(**kwargs)


def resume_request(session_id: str, from_index: int) -> generation_pb2.ResumeRequest:
    return generation_pb2.ResumeRequest(session_id=session_id, from_index=from_index)


def cancel_request(session_id: str) -> generation_pb2.CancelRequest:
    return generation_pb2.CancelRequest(session_id=session_id)


def cancel_response(cancelled: bool) -> generation_pb2.CancelResponse:
    return generation_pb2.CancelResponse(cancelled=cancelled)


def generation_request_from_pb(msg: generation_pb2.GenerateRequest) -> GenerationRequest:
    return GenerationRequest(
        prompt=msg.prompt, prompt_token_ids=list(msg.prompt_token_ids), max_tokens=msg.max_tokens,
        temperature=_opt(msg, "temperature"), top_k=_opt(msg, "top_k"), top_p=_opt(msg, "top_p"),
        seed=_opt(msg, "seed"), gamma=_opt(msg, "gamma"),
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

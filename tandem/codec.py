"""The one place that knows the protobuf types: domain values ↔ tandem.v1 messages.

Servicers, clients and the Ray Serve ingress call these functions and never touch *_pb2.
Token ids travel as packed repeated int32; draft distributions as raw little-endian bytes,
sparse when truncated (top-k, top-p, one-hot), dense otherwise.
"""

from dataclasses import dataclass, field

import numpy as np
import torch

from tandem.sampling import SamplingParams, verified_tokens
from tandem.v1 import generation_pb2, sampling_pb2, worker_pb2

# --- sampling parameters and draft distributions --------------------------------------------


def sampling_to_pb(params: SamplingParams) -> sampling_pb2.SamplingParams:
    return sampling_pb2.SamplingParams(
        temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, seed=params.seed
    )


def sampling_from_pb(msg: sampling_pb2.SamplingParams) -> SamplingParams:
    return SamplingParams(msg.temperature, msg.top_k, msg.top_p, msg.seed)


def distributions_to_pb(probs: torch.Tensor) -> list[sampling_pb2.DraftDistribution]:
    """Warped draft distributions [γ, V] → one compact message per position."""
    out = []
    for row in probs.float().cpu().numpy():  # [V]
        support = np.flatnonzero(row)
        if 2 * support.size < row.size:  # sparse pays off: 8 bytes per kept token vs 4 per token
            out.append(
                sampling_pb2.DraftDistribution(
                    token_ids=support.astype("<i4").tobytes(), probs=row[support].astype("<f4").tobytes()
                )
            )
        else:
            out.append(sampling_pb2.DraftDistribution(probs=row.astype("<f4").tobytes()))
    return out


def distributions_from_pb(
    msgs, vocab_size: int
) -> torch.Tensor:
    """Compact messages → dense float32 [γ, V]. Raises ValueError on malformed bytes."""
    dense = np.zeros((len(msgs), vocab_size), dtype=np.float32)
    for i, msg in enumerate(msgs):
        probs = np.frombuffer(msg.probs, dtype="<f4")
        if msg.token_ids:
            ids = np.frombuffer(msg.token_ids, dtype="<i4")
            if ids.size != probs.size or ids.size == 0:
                raise ValueError(f"draft_distributions[{i}]: token_ids and probs differ in length")
            if ids.min() < 0 or ids.max() >= vocab_size:
                raise ValueError(f"draft_distributions[{i}]: token id outside the vocabulary")
            dense[i, ids] = probs
        elif probs.size == vocab_size:
            dense[i] = probs
        else:
            raise ValueError(f"draft_distributions[{i}]: dense probs need {vocab_size} floats")
    if not np.isfinite(dense).all() or (dense < 0).any():
        raise ValueError("draft_distributions: probabilities must be finite and >= 0")
    return torch.from_numpy(dense)


# --- worker calls ---------------------------------------------------------------------------


@dataclass
class Proposal:
    """A draft worker's answer (None from a client means a cache miss)."""

    draft_tokens: list[int]
    draft_token_probs: list[float]
    draft_distributions: list  # opaque compact messages, forwarded to the verifier as they are
    compute_ms: float


@dataclass
class Verification:
    """A target verifier's answer (None from a client means a cache miss)."""

    target_token_probs: list[float]
    recovered_tokens: list[int]
    bonus_token: int
    compute_ms: float


def propose_request(session_id, cache_len, tokens, gamma, params, trace_context=None) -> worker_pb2.ProposeRequest:
    return worker_pb2.ProposeRequest(
        session_id=session_id, cache_len=cache_len, tokens=tokens, gamma=gamma,
        sampling=sampling_to_pb(params), trace_context=trace_context,
    )


def propose_response(proposal: Proposal | None) -> worker_pb2.ProposeResponse:
    if proposal is None:
        return worker_pb2.ProposeResponse(cache_miss=True)
    return worker_pb2.ProposeResponse(
        draft_tokens=proposal.draft_tokens,
        draft_token_probs=proposal.draft_token_probs,
        draft_distributions=proposal.draft_distributions,
        compute_ms=proposal.compute_ms,
    )


def proposal_from_pb(msg: worker_pb2.ProposeResponse) -> Proposal | None:
    if msg.cache_miss:
        return None
    return Proposal(
        list(msg.draft_tokens), list(msg.draft_token_probs), list(msg.draft_distributions),
        msg.compute_ms,
    )


def verify_request(
    session_id, cache_len, tokens, proposal: Proposal | None, params, trace_context=None
) -> worker_pb2.VerifyRequest:
    return worker_pb2.VerifyRequest(
        session_id=session_id, cache_len=cache_len, tokens=tokens,
        draft_tokens=proposal.draft_tokens if proposal else [],
        draft_distributions=proposal.draft_distributions if proposal else [],
        sampling=sampling_to_pb(params), trace_context=trace_context,
    )


def verify_response(verification: Verification | None) -> worker_pb2.VerifyResponse:
    if verification is None:
        return worker_pb2.VerifyResponse(cache_miss=True)
    return worker_pb2.VerifyResponse(
        target_token_probs=verification.target_token_probs,
        recovered_tokens=verification.recovered_tokens,
        bonus_token=verification.bonus_token,
        compute_ms=verification.compute_ms,
    )


def verification_from_pb(msg: worker_pb2.VerifyResponse) -> Verification | None:
    if msg.cache_miss:
        return None
    return Verification(
        list(msg.target_token_probs), list(msg.recovered_tokens), msg.bonus_token, msg.compute_ms
    )


def release_request(session_id: str) -> worker_pb2.ReleaseRequest:
    return worker_pb2.ReleaseRequest(session_id=session_id)


def release_response(released: bool) -> worker_pb2.ReleaseResponse:
    return worker_pb2.ReleaseResponse(released=released)


def describe_request() -> worker_pb2.DescribeRequest:
    return worker_pb2.DescribeRequest()


@dataclass(frozen=True)
class ModelInfo:
    """A worker's model, as callers validate requests against it."""

    model: str
    vocab_size: int  # width of the logits: token ids must be below it
    max_context: int  # prompt plus generated tokens
    eos_token_ids: tuple[int, ...]
    device: str
    dtype: str
    num_parameters: int


def model_info_to_pb(info: ModelInfo) -> worker_pb2.ModelInfo:
    return worker_pb2.ModelInfo(
        model=info.model, vocab_size=info.vocab_size, max_context=info.max_context,
        eos_token_ids=info.eos_token_ids, device=info.device, dtype=info.dtype,
        num_parameters=info.num_parameters,
    )


def model_info_from_pb(msg: worker_pb2.ModelInfo) -> ModelInfo:
    return ModelInfo(
        msg.model, msg.vocab_size, msg.max_context, tuple(msg.eos_token_ids), msg.device,
        msg.dtype, msg.num_parameters,
    )


# --- the client-facing generation service ---------------------------------------------------


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


def response_from_pb(msg: generation_pb2.GenerateResponse) -> Chunk:
    return Chunk(
        msg.session_id, list(msg.token_ids), msg.text, msg.finish_reason, stats_from_pb(msg.stats)
    )

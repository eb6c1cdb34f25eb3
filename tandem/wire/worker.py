"""The worker services' wire code (orchestrator ↔ draft worker and target verifier): domain
values ↔ tandem.v1 messages. Servicers and the orchestrator's clients call these functions and
never touch *_pb2. Token ids travel as packed repeated int32; draft distributions as raw
little-endian bytes, sparse when truncated (top-k, top-p, one-hot), dense otherwise. Plain
Python and protobuf: tensors are the services' business.
"""

from dataclasses import dataclass, field
from typing import NamedTuple

import grpc

from tandem.math.params import SamplingParams
from tandem.v1 import sampling_pb2, worker_pb2
from tandem.wire.generation import TREE_RULE, VERIFICATION

# --- sampling parameters and draft distributions --------------------------------------------


def sampling_to_pb(params: SamplingParams) -> sampling_pb2.SamplingParams:
    return sampling_pb2.SamplingParams(
        temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, seed=params.seed
    )


def sampling_from_pb(msg: sampling_pb2.SamplingParams) -> SamplingParams:
    return SamplingParams(msg.temperature, msg.top_k, msg.top_p, msg.seed)


def draft_distribution(token_ids: bytes, probs: bytes) -> sampling_pb2.DraftDistribution:
    """One drafted position's distribution: little-endian int32 ids (empty: dense) and float32
    probabilities (tandem.services.distributions packs and unpacks the tensors)."""
    return sampling_pb2.DraftDistribution(token_ids=token_ids, probs=probs)


# --- worker calls ---------------------------------------------------------------------------


@dataclass
class Batching:
    """The forward passes a call's work ran in, shared with other sessions' work: tokens and
    sessions are summed over the passes (a call that ran alone has sessions == passes); wait_ms:
    the time it waited while the model ran work it had no part in; cost_ms: what its work cost
    the device (CPU time on a CPU, wall time on an accelerator; 0: not measured); handling_ms:
    the worker's CPU per call outside its model thread (tandem.v1.Batching)."""

    passes: int = 0
    tokens: int = 0
    sessions: int = 0
    wait_ms: float = 0.0
    cost_ms: float = 0.0
    handling_ms: float = 0.0


@dataclass
class Proposal:
    """A draft worker's answer (None from a client means a cache miss)."""

    draft_tokens: list[int]
    draft_token_probs: list[float]
    draft_distributions: list  # opaque compact messages, forwarded to the verifier as they are
    compute_ms: float
    batching: Batching = field(default_factory=Batching)
    parents: list[int] = field(default_factory=list)  # a token tree's (tandem.math.tree); empty: a chain
    # Drafted ahead past rejections: per child of the root, the block's tokens before its guess
    # (ProposeResponse.draft_anchors); empty: every child of the root guesses the bonus token.
    anchors: list[int] = field(default_factory=list)
    # Its distributions are kept by the verifier that drafted it, not carried
    # (ProposeResponse.distributions_kept; VerifyRequest.held_distributions).
    held: bool = False


@dataclass
class Verification:
    """A target verifier's answer (None from a client means a cache miss)."""

    target_token_probs: list[float]
    recovered_tokens: list[int]
    bonus_token: int
    compute_ms: float
    batching: Batching = field(default_factory=Batching)
    block_accept_probs: list[float] = field(default_factory=list)  # block verification's h, else empty
    # Token trees (tandem.math.tree.Verdict), else empty: per node, per row, and the kept path.
    tree_accept_probs: list[float] = field(default_factory=list)
    tree_recovered_tokens: list[int] = field(default_factory=list)
    kept_path: list[int] = field(default_factory=list)
    # A verifier that drafts: the next cycle's block, after the outcome that accepts
    # next_accepted drafted tokens and ends with next_token (None: none was drafted).
    next_block: Proposal | None = None
    next_accepted: int = 0
    next_token: int = 0
    dropped_block: bool = False  # a held block the verifier no longer kept: it verified none


def _batching_to_pb(b: Batching) -> worker_pb2.Batching:
    return worker_pb2.Batching(passes=b.passes, tokens=b.tokens, sessions=b.sessions, wait_ms=b.wait_ms,
                               cost_ms=b.cost_ms, handling_ms=b.handling_ms)


def _batching_from_pb(msg: worker_pb2.Batching) -> Batching:
    return Batching(msg.passes, msg.tokens, msg.sessions, msg.wait_ms, msg.cost_ms, msg.handling_ms)


def propose_request(session_id, cache_len, tokens, gamma, params, trace_context=None,
                    tree_widths=(), writer_epoch: int = 0, ahead: bool = False,
                    tree_rule: str = "", ahead_guesses: int = 0, ahead_block: int = 0,
                    ahead_rejections: int = 0) -> worker_pb2.ProposeRequest:
    return worker_pb2.ProposeRequest(
        session_id=session_id, cache_len=cache_len, tokens=tokens, gamma=gamma,
        sampling=sampling_to_pb(params), trace_context=trace_context, tree_widths=tree_widths,
        writer_epoch=writer_epoch, ahead=ahead, tree_rule=TREE_RULE.to_pb(tree_rule), ahead_guesses=ahead_guesses,
        ahead_block=ahead_block, ahead_rejections=ahead_rejections,
    )


def propose_response(proposal: Proposal | None) -> worker_pb2.ProposeResponse:
    if proposal is None:
        return worker_pb2.ProposeResponse(cache_miss=True)
    return worker_pb2.ProposeResponse(
        draft_tokens=proposal.draft_tokens,
        draft_token_probs=proposal.draft_token_probs,
        draft_distributions=proposal.draft_distributions,
        compute_ms=proposal.compute_ms,
        batching=_batching_to_pb(proposal.batching),
        draft_parents=proposal.parents,
        draft_anchors=proposal.anchors,
        distributions_kept=proposal.held,
    )


def proposal_from_pb(msg: worker_pb2.ProposeResponse) -> Proposal | None:
    if msg.cache_miss:
        return None
    return Proposal(
        list(msg.draft_tokens), list(msg.draft_token_probs), list(msg.draft_distributions),
        msg.compute_ms, _batching_from_pb(msg.batching), list(msg.draft_parents), list(msg.draft_anchors),
        msg.distributions_kept,
    )


def verify_request(
    session_id, cache_len, tokens, proposal: Proposal | None, params, trace_context=None, verification: str = "token",
    writer_epoch: int = 0, next_gamma: int = 0, next_tree_widths: tuple[int, ...] = (), tree_rule: str = "",
    keep_next_distributions: bool = False,
) -> worker_pb2.VerifyRequest:
    return worker_pb2.VerifyRequest(
        session_id=session_id, cache_len=cache_len, tokens=tokens,
        draft_tokens=proposal.draft_tokens if proposal else [],
        draft_distributions=proposal.draft_distributions if proposal else [],
        sampling=sampling_to_pb(params), trace_context=trace_context,
        verification=VERIFICATION.to_pb(verification),
        draft_parents=proposal.parents if proposal else [],
        writer_epoch=writer_epoch, next_gamma=next_gamma, next_tree_widths=next_tree_widths,
        tree_rule=TREE_RULE.to_pb(tree_rule), keep_next_distributions=keep_next_distributions,
        held_distributions=bool(proposal and proposal.held),
    )


def verify_response(verification: Verification | None) -> worker_pb2.VerifyResponse:
    if verification is None:
        return worker_pb2.VerifyResponse(cache_miss=True)
    return worker_pb2.VerifyResponse(
        target_token_probs=verification.target_token_probs,
        recovered_tokens=verification.recovered_tokens,
        bonus_token=verification.bonus_token,
        compute_ms=verification.compute_ms,
        batching=_batching_to_pb(verification.batching),
        block_accept_probs=verification.block_accept_probs,
        tree_accept_probs=verification.tree_accept_probs,
        tree_recovered_tokens=verification.tree_recovered_tokens,
        kept_path=verification.kept_path,
        next_block=propose_response(verification.next_block) if verification.next_block else None,
        next_accepted=verification.next_accepted, next_token=verification.next_token,
        dropped_block=verification.dropped_block,
    )


def verification_from_pb(msg: worker_pb2.VerifyResponse) -> Verification | None:
    if msg.cache_miss:
        return None
    return Verification(
        list(msg.target_token_probs), list(msg.recovered_tokens), msg.bonus_token, msg.compute_ms,
        _batching_from_pb(msg.batching), list(msg.block_accept_probs), list(msg.tree_accept_probs),
        list(msg.tree_recovered_tokens), list(msg.kept_path),
        proposal_from_pb(msg.next_block) if msg.HasField("next_block") else None, msg.next_accepted, msg.next_token,
        msg.dropped_block,
    )


class Failure(NamedTuple):
    """A batched call's row that has no answer: the status a call of its own would have ended with."""

    code: grpc.StatusCode
    message: str


_CODES = {code.value[0]: code for code in grpc.StatusCode}
_BATCHES = {  # rpc → its request, response and row messages
    "ProposeBatch": (worker_pb2.ProposeBatchRequest, worker_pb2.ProposeBatchResponse, worker_pb2.ProposeRow),
    "VerifyBatch": (worker_pb2.VerifyBatchRequest, worker_pb2.VerifyBatchResponse, worker_pb2.VerifyRow),
}


def batch_request(rpc: str, rows: list):
    """A ProposeBatch or VerifyBatch request of these rows (ProposeRequest / VerifyRequest)."""
    return _BATCHES[rpc][0](rows=rows)


def batch_response(rpc: str, answers: list):
    """The response of a batched call: per row its encoded answer, or its Failure."""
    row = _BATCHES[rpc][2]
    return _BATCHES[rpc][1](rows=[
        row(status=worker_pb2.RowStatus(code=a.code.value[0], message=a.message)) if isinstance(a, Failure)
        else row(response=a) for a in answers])


def batch_answers(msg) -> list:
    """Per row of a batched call's response: its response message, or its Failure."""
    return [Failure(_CODES.get(r.status.code, grpc.StatusCode.UNKNOWN), r.status.message) if r.status.code
            else r.response for r in msg.rows]


def release_request(session_id: str, writer_epoch: int = 0) -> worker_pb2.ReleaseRequest:
    return worker_pb2.ReleaseRequest(session_id=session_id, writer_epoch=writer_epoch)


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
    max_request_bytes: int = 0  # the worker's gRPC limits (0: not stated)
    max_response_bytes: int = 0
    drafter: str = ""  # what drafts inside a verifier: "head", "self", or "" (draft workers do)
    draft_model: str = ""  # the head's directory, or the exit layer self-drafting stops at
    # Its forward pass as it timed it when it loaded: tokens → median ms (services.pass_curve).
    pass_ms: dict[int, float] = field(default_factory=dict)


@dataclass(frozen=True)
class WorkerLoad:
    """How loaded a worker is: what the orchestrator routes new sessions by."""

    sessions: int = 0  # sessions whose KV cache it holds
    kv_cache_bytes: int = 0
    queued: int = 0  # calls waiting for the model or running on it


def load_request() -> worker_pb2.LoadRequest:
    return worker_pb2.LoadRequest()


def load_to_pb(load: WorkerLoad) -> worker_pb2.WorkerLoad:
    return worker_pb2.WorkerLoad(sessions=load.sessions, kv_cache_bytes=load.kv_cache_bytes, queued=load.queued)


def load_from_pb(msg: worker_pb2.WorkerLoad) -> WorkerLoad:
    return WorkerLoad(msg.sessions, msg.kv_cache_bytes, msg.queued)


def model_info_to_pb(info: ModelInfo) -> worker_pb2.ModelInfo:
    return worker_pb2.ModelInfo(
        model=info.model, vocab_size=info.vocab_size, max_context=info.max_context,
        eos_token_ids=info.eos_token_ids, device=info.device, dtype=info.dtype,
        num_parameters=info.num_parameters, max_request_bytes=info.max_request_bytes,
        max_response_bytes=info.max_response_bytes, drafter=info.drafter, draft_model=info.draft_model,
        pass_ms=info.pass_ms,
    )


def model_info_from_pb(msg: worker_pb2.ModelInfo) -> ModelInfo:
    return ModelInfo(
        msg.model, msg.vocab_size, msg.max_context, tuple(msg.eos_token_ids), msg.device,
        msg.dtype, msg.num_parameters, msg.max_request_bytes, msg.max_response_bytes, msg.drafter,
        msg.draft_model, dict(msg.pass_ms),
    )

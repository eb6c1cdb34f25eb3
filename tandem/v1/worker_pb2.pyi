from tandem.v1 import sampling_pb2 as _sampling_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ProposeRequest(_message.Message):
    __slots__ = ("session_id", "cache_len", "tokens", "gamma", "sampling", "trace_context", "tree_widths", "writer_epoch", "ahead", "tree_rule", "ahead_guesses", "ahead_block", "ahead_rejections")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CACHE_LEN_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    GAMMA_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    TREE_WIDTHS_FIELD_NUMBER: _ClassVar[int]
    WRITER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    AHEAD_FIELD_NUMBER: _ClassVar[int]
    TREE_RULE_FIELD_NUMBER: _ClassVar[int]
    AHEAD_GUESSES_FIELD_NUMBER: _ClassVar[int]
    AHEAD_BLOCK_FIELD_NUMBER: _ClassVar[int]
    AHEAD_REJECTIONS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    cache_len: int
    tokens: _containers.RepeatedScalarFieldContainer[int]
    gamma: int
    sampling: _sampling_pb2.SamplingParams
    trace_context: _containers.ScalarMap[str, str]
    tree_widths: _containers.RepeatedScalarFieldContainer[int]
    writer_epoch: int
    ahead: bool
    tree_rule: _sampling_pb2.TreeRule
    ahead_guesses: int
    ahead_block: int
    ahead_rejections: int
    def __init__(self, session_id: _Optional[str] = ..., cache_len: _Optional[int] = ..., tokens: _Optional[_Iterable[int]] = ..., gamma: _Optional[int] = ..., sampling: _Optional[_Union[_sampling_pb2.SamplingParams, _Mapping]] = ..., trace_context: _Optional[_Mapping[str, str]] = ..., tree_widths: _Optional[_Iterable[int]] = ..., writer_epoch: _Optional[int] = ..., ahead: _Optional[bool] = ..., tree_rule: _Optional[_Union[_sampling_pb2.TreeRule, str]] = ..., ahead_guesses: _Optional[int] = ..., ahead_block: _Optional[int] = ..., ahead_rejections: _Optional[int] = ...) -> None: ...

class ProposeResponse(_message.Message):
    __slots__ = ("cache_miss", "draft_tokens", "draft_token_probs", "draft_distributions", "compute_ms", "batching", "draft_parents", "draft_anchors", "distributions_kept")
    CACHE_MISS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKEN_PROBS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_DISTRIBUTIONS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_MS_FIELD_NUMBER: _ClassVar[int]
    BATCHING_FIELD_NUMBER: _ClassVar[int]
    DRAFT_PARENTS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_ANCHORS_FIELD_NUMBER: _ClassVar[int]
    DISTRIBUTIONS_KEPT_FIELD_NUMBER: _ClassVar[int]
    cache_miss: bool
    draft_tokens: _containers.RepeatedScalarFieldContainer[int]
    draft_token_probs: _containers.RepeatedScalarFieldContainer[float]
    draft_distributions: _containers.RepeatedCompositeFieldContainer[_sampling_pb2.DraftDistribution]
    compute_ms: float
    batching: Batching
    draft_parents: _containers.RepeatedScalarFieldContainer[int]
    draft_anchors: _containers.RepeatedScalarFieldContainer[int]
    distributions_kept: bool
    def __init__(self, cache_miss: _Optional[bool] = ..., draft_tokens: _Optional[_Iterable[int]] = ..., draft_token_probs: _Optional[_Iterable[float]] = ..., draft_distributions: _Optional[_Iterable[_Union[_sampling_pb2.DraftDistribution, _Mapping]]] = ..., compute_ms: _Optional[float] = ..., batching: _Optional[_Union[Batching, _Mapping]] = ..., draft_parents: _Optional[_Iterable[int]] = ..., draft_anchors: _Optional[_Iterable[int]] = ..., distributions_kept: _Optional[bool] = ...) -> None: ...

class VerifyRequest(_message.Message):
    __slots__ = ("session_id", "cache_len", "tokens", "draft_tokens", "draft_distributions", "sampling", "trace_context", "verification", "draft_parents", "writer_epoch", "next_gamma", "next_tree_widths", "tree_rule", "keep_next_distributions", "held_distributions")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    CACHE_LEN_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_DISTRIBUTIONS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    VERIFICATION_FIELD_NUMBER: _ClassVar[int]
    DRAFT_PARENTS_FIELD_NUMBER: _ClassVar[int]
    WRITER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    NEXT_GAMMA_FIELD_NUMBER: _ClassVar[int]
    NEXT_TREE_WIDTHS_FIELD_NUMBER: _ClassVar[int]
    TREE_RULE_FIELD_NUMBER: _ClassVar[int]
    KEEP_NEXT_DISTRIBUTIONS_FIELD_NUMBER: _ClassVar[int]
    HELD_DISTRIBUTIONS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    cache_len: int
    tokens: _containers.RepeatedScalarFieldContainer[int]
    draft_tokens: _containers.RepeatedScalarFieldContainer[int]
    draft_distributions: _containers.RepeatedCompositeFieldContainer[_sampling_pb2.DraftDistribution]
    sampling: _sampling_pb2.SamplingParams
    trace_context: _containers.ScalarMap[str, str]
    verification: _sampling_pb2.Verification
    draft_parents: _containers.RepeatedScalarFieldContainer[int]
    writer_epoch: int
    next_gamma: int
    next_tree_widths: _containers.RepeatedScalarFieldContainer[int]
    tree_rule: _sampling_pb2.TreeRule
    keep_next_distributions: bool
    held_distributions: bool
    def __init__(self, session_id: _Optional[str] = ..., cache_len: _Optional[int] = ..., tokens: _Optional[_Iterable[int]] = ..., draft_tokens: _Optional[_Iterable[int]] = ..., draft_distributions: _Optional[_Iterable[_Union[_sampling_pb2.DraftDistribution, _Mapping]]] = ..., sampling: _Optional[_Union[_sampling_pb2.SamplingParams, _Mapping]] = ..., trace_context: _Optional[_Mapping[str, str]] = ..., verification: _Optional[_Union[_sampling_pb2.Verification, str]] = ..., draft_parents: _Optional[_Iterable[int]] = ..., writer_epoch: _Optional[int] = ..., next_gamma: _Optional[int] = ..., next_tree_widths: _Optional[_Iterable[int]] = ..., tree_rule: _Optional[_Union[_sampling_pb2.TreeRule, str]] = ..., keep_next_distributions: _Optional[bool] = ..., held_distributions: _Optional[bool] = ...) -> None: ...

class VerifyResponse(_message.Message):
    __slots__ = ("cache_miss", "target_token_probs", "recovered_tokens", "bonus_token", "compute_ms", "batching", "block_accept_probs", "tree_accept_probs", "tree_recovered_tokens", "kept_path", "next_block", "next_accepted", "next_token", "dropped_block")
    CACHE_MISS_FIELD_NUMBER: _ClassVar[int]
    TARGET_TOKEN_PROBS_FIELD_NUMBER: _ClassVar[int]
    RECOVERED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    BONUS_TOKEN_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_MS_FIELD_NUMBER: _ClassVar[int]
    BATCHING_FIELD_NUMBER: _ClassVar[int]
    BLOCK_ACCEPT_PROBS_FIELD_NUMBER: _ClassVar[int]
    TREE_ACCEPT_PROBS_FIELD_NUMBER: _ClassVar[int]
    TREE_RECOVERED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    KEPT_PATH_FIELD_NUMBER: _ClassVar[int]
    NEXT_BLOCK_FIELD_NUMBER: _ClassVar[int]
    NEXT_ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    NEXT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    DROPPED_BLOCK_FIELD_NUMBER: _ClassVar[int]
    cache_miss: bool
    target_token_probs: _containers.RepeatedScalarFieldContainer[float]
    recovered_tokens: _containers.RepeatedScalarFieldContainer[int]
    bonus_token: int
    compute_ms: float
    batching: Batching
    block_accept_probs: _containers.RepeatedScalarFieldContainer[float]
    tree_accept_probs: _containers.RepeatedScalarFieldContainer[float]
    tree_recovered_tokens: _containers.RepeatedScalarFieldContainer[int]
    kept_path: _containers.RepeatedScalarFieldContainer[int]
    next_block: ProposeResponse
    next_accepted: int
    next_token: int
    dropped_block: bool
    def __init__(self, cache_miss: _Optional[bool] = ..., target_token_probs: _Optional[_Iterable[float]] = ..., recovered_tokens: _Optional[_Iterable[int]] = ..., bonus_token: _Optional[int] = ..., compute_ms: _Optional[float] = ..., batching: _Optional[_Union[Batching, _Mapping]] = ..., block_accept_probs: _Optional[_Iterable[float]] = ..., tree_accept_probs: _Optional[_Iterable[float]] = ..., tree_recovered_tokens: _Optional[_Iterable[int]] = ..., kept_path: _Optional[_Iterable[int]] = ..., next_block: _Optional[_Union[ProposeResponse, _Mapping]] = ..., next_accepted: _Optional[int] = ..., next_token: _Optional[int] = ..., dropped_block: _Optional[bool] = ...) -> None: ...

class RowStatus(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class ProposeBatchRequest(_message.Message):
    __slots__ = ("rows",)
    ROWS_FIELD_NUMBER: _ClassVar[int]
    rows: _containers.RepeatedCompositeFieldContainer[ProposeRequest]
    def __init__(self, rows: _Optional[_Iterable[_Union[ProposeRequest, _Mapping]]] = ...) -> None: ...

class ProposeBatchResponse(_message.Message):
    __slots__ = ("rows",)
    ROWS_FIELD_NUMBER: _ClassVar[int]
    rows: _containers.RepeatedCompositeFieldContainer[ProposeRow]
    def __init__(self, rows: _Optional[_Iterable[_Union[ProposeRow, _Mapping]]] = ...) -> None: ...

class ProposeRow(_message.Message):
    __slots__ = ("status", "response")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    status: RowStatus
    response: ProposeResponse
    def __init__(self, status: _Optional[_Union[RowStatus, _Mapping]] = ..., response: _Optional[_Union[ProposeResponse, _Mapping]] = ...) -> None: ...

class VerifyBatchRequest(_message.Message):
    __slots__ = ("rows",)
    ROWS_FIELD_NUMBER: _ClassVar[int]
    rows: _containers.RepeatedCompositeFieldContainer[VerifyRequest]
    def __init__(self, rows: _Optional[_Iterable[_Union[VerifyRequest, _Mapping]]] = ...) -> None: ...

class VerifyBatchResponse(_message.Message):
    __slots__ = ("rows",)
    ROWS_FIELD_NUMBER: _ClassVar[int]
    rows: _containers.RepeatedCompositeFieldContainer[VerifyRow]
    def __init__(self, rows: _Optional[_Iterable[_Union[VerifyRow, _Mapping]]] = ...) -> None: ...

class VerifyRow(_message.Message):
    __slots__ = ("status", "response")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    status: RowStatus
    response: VerifyResponse
    def __init__(self, status: _Optional[_Union[RowStatus, _Mapping]] = ..., response: _Optional[_Union[VerifyResponse, _Mapping]] = ...) -> None: ...

class Batching(_message.Message):
    __slots__ = ("passes", "tokens", "sessions", "wait_ms", "cost_ms", "handling_ms")
    PASSES_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    COST_MS_FIELD_NUMBER: _ClassVar[int]
    HANDLING_MS_FIELD_NUMBER: _ClassVar[int]
    passes: int
    tokens: int
    sessions: int
    wait_ms: float
    cost_ms: float
    handling_ms: float
    def __init__(self, passes: _Optional[int] = ..., tokens: _Optional[int] = ..., sessions: _Optional[int] = ..., wait_ms: _Optional[float] = ..., cost_ms: _Optional[float] = ..., handling_ms: _Optional[float] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("session_id", "writer_epoch")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    WRITER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    writer_epoch: int
    def __init__(self, session_id: _Optional[str] = ..., writer_epoch: _Optional[int] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: bool
    def __init__(self, released: _Optional[bool] = ...) -> None: ...

class DescribeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("model", "vocab_size", "max_context", "eos_token_ids", "device", "dtype", "num_parameters", "max_request_bytes", "max_response_bytes", "drafter", "draft_model", "pass_ms")
    class PassMsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    NUM_PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    MAX_REQUEST_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_RESPONSE_BYTES_FIELD_NUMBER: _ClassVar[int]
    DRAFTER_FIELD_NUMBER: _ClassVar[int]
    DRAFT_MODEL_FIELD_NUMBER: _ClassVar[int]
    PASS_MS_FIELD_NUMBER: _ClassVar[int]
    model: str
    vocab_size: int
    max_context: int
    eos_token_ids: _containers.RepeatedScalarFieldContainer[int]
    device: str
    dtype: str
    num_parameters: int
    max_request_bytes: int
    max_response_bytes: int
    drafter: str
    draft_model: str
    pass_ms: _containers.ScalarMap[int, float]
    def __init__(self, model: _Optional[str] = ..., vocab_size: _Optional[int] = ..., max_context: _Optional[int] = ..., eos_token_ids: _Optional[_Iterable[int]] = ..., device: _Optional[str] = ..., dtype: _Optional[str] = ..., num_parameters: _Optional[int] = ..., max_request_bytes: _Optional[int] = ..., max_response_bytes: _Optional[int] = ..., drafter: _Optional[str] = ..., draft_model: _Optional[str] = ..., pass_ms: _Optional[_Mapping[int, float]] = ...) -> None: ...

class LoadRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerLoad(_message.Message):
    __slots__ = ("sessions", "kv_cache_bytes", "queued")
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_BYTES_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    sessions: int
    kv_cache_bytes: int
    queued: int
    def __init__(self, sessions: _Optional[int] = ..., kv_cache_bytes: _Optional[int] = ..., queued: _Optional[int] = ...) -> None: ...

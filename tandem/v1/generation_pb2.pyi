from tandem.v1 import sampling_pb2 as _sampling_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CancelRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class CancelResponse(_message.Message):
    __slots__ = ("cancelled",)
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    cancelled: bool
    def __init__(self, cancelled: _Optional[bool] = ...) -> None: ...

class ResumeRequest(_message.Message):
    __slots__ = ("session_id", "from_index")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_INDEX_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    from_index: int
    def __init__(self, session_id: _Optional[str] = ..., from_index: _Optional[int] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("prompt", "prompt_token_ids", "max_tokens", "temperature", "top_k", "top_p", "seed", "gamma", "verification", "draft_shape", "ignore_eos", "tree_rule")
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    GAMMA_FIELD_NUMBER: _ClassVar[int]
    VERIFICATION_FIELD_NUMBER: _ClassVar[int]
    DRAFT_SHAPE_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    TREE_RULE_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    max_tokens: int
    temperature: float
    top_k: int
    top_p: float
    seed: int
    gamma: int
    verification: _sampling_pb2.Verification
    draft_shape: _sampling_pb2.DraftShape
    ignore_eos: bool
    tree_rule: _sampling_pb2.TreeRule
    def __init__(self, prompt: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., gamma: _Optional[int] = ..., verification: _Optional[_Union[_sampling_pb2.Verification, str]] = ..., draft_shape: _Optional[_Union[_sampling_pb2.DraftShape, str]] = ..., ignore_eos: _Optional[bool] = ..., tree_rule: _Optional[_Union[_sampling_pb2.TreeRule, str]] = ...) -> None: ...

class GenerationStats(_message.Message):
    __slots__ = ("elapsed_s", "ttft_s", "per_cycle")
    ELAPSED_S_FIELD_NUMBER: _ClassVar[int]
    TTFT_S_FIELD_NUMBER: _ClassVar[int]
    PER_CYCLE_FIELD_NUMBER: _ClassVar[int]
    elapsed_s: float
    ttft_s: float
    per_cycle: _containers.RepeatedCompositeFieldContainer[CycleStats]
    def __init__(self, elapsed_s: _Optional[float] = ..., ttft_s: _Optional[float] = ..., per_cycle: _Optional[_Iterable[_Union[CycleStats, _Mapping]]] = ...) -> None: ...

class CycleStats(_message.Message):
    __slots__ = ("gamma", "accepted", "output_tokens", "start_ms", "draft_ms", "verify_ms", "transport_ms", "redis_ms", "orchestration_ms", "wire_bytes", "drafted_ahead", "ahead_ms", "wait_ms")
    GAMMA_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    START_MS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_MS_FIELD_NUMBER: _ClassVar[int]
    VERIFY_MS_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_MS_FIELD_NUMBER: _ClassVar[int]
    REDIS_MS_FIELD_NUMBER: _ClassVar[int]
    ORCHESTRATION_MS_FIELD_NUMBER: _ClassVar[int]
    WIRE_BYTES_FIELD_NUMBER: _ClassVar[int]
    DRAFTED_AHEAD_FIELD_NUMBER: _ClassVar[int]
    AHEAD_MS_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    gamma: int
    accepted: int
    output_tokens: int
    start_ms: float
    draft_ms: float
    verify_ms: float
    transport_ms: float
    redis_ms: float
    orchestration_ms: float
    wire_bytes: int
    drafted_ahead: bool
    ahead_ms: float
    wait_ms: float
    def __init__(self, gamma: _Optional[int] = ..., accepted: _Optional[int] = ..., output_tokens: _Optional[int] = ..., start_ms: _Optional[float] = ..., draft_ms: _Optional[float] = ..., verify_ms: _Optional[float] = ..., transport_ms: _Optional[float] = ..., redis_ms: _Optional[float] = ..., orchestration_ms: _Optional[float] = ..., wire_bytes: _Optional[int] = ..., drafted_ahead: _Optional[bool] = ..., ahead_ms: _Optional[float] = ..., wait_ms: _Optional[float] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("session_id", "text", "token_ids", "finish_reason", "stats")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: str
    stats: GenerationStats
    def __init__(self, session_id: _Optional[str] = ..., text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[str] = ..., stats: _Optional[_Union[GenerationStats, _Mapping]] = ...) -> None: ...

class GenerateChunk(_message.Message):
    __slots__ = ("session_id", "token_ids", "text", "finish_reason", "stats")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    text: str
    finish_reason: str
    stats: GenerationStats
    def __init__(self, session_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ..., finish_reason: _Optional[str] = ..., stats: _Optional[_Union[GenerationStats, _Mapping]] = ...) -> None: ...

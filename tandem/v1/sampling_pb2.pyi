from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class Verification(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VERIFICATION_UNSPECIFIED: _ClassVar[Verification]
    VERIFICATION_TOKEN: _ClassVar[Verification]
    VERIFICATION_BLOCK: _ClassVar[Verification]

class DraftShape(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DRAFT_SHAPE_UNSPECIFIED: _ClassVar[DraftShape]
    DRAFT_SHAPE_CHAIN: _ClassVar[DraftShape]
    DRAFT_SHAPE_TREE: _ClassVar[DraftShape]
    DRAFT_SHAPE_AUTO: _ClassVar[DraftShape]

class TreeRule(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TREE_RULE_UNSPECIFIED: _ClassVar[TreeRule]
    TREE_RULE_RRSW: _ClassVar[TreeRule]
    TREE_RULE_GREEDY: _ClassVar[TreeRule]
VERIFICATION_UNSPECIFIED: Verification
VERIFICATION_TOKEN: Verification
VERIFICATION_BLOCK: Verification
DRAFT_SHAPE_UNSPECIFIED: DraftShape
DRAFT_SHAPE_CHAIN: DraftShape
DRAFT_SHAPE_TREE: DraftShape
DRAFT_SHAPE_AUTO: DraftShape
TREE_RULE_UNSPECIFIED: TreeRule
TREE_RULE_RRSW: TreeRule
TREE_RULE_GREEDY: TreeRule

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_k", "top_p", "seed")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_k: int
    top_p: float
    seed: int
    def __init__(self, temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ...) -> None: ...

class DraftDistribution(_message.Message):
    __slots__ = ("token_ids", "probs")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PROBS_FIELD_NUMBER: _ClassVar[int]
    token_ids: bytes
    probs: bytes
    def __init__(self, token_ids: _Optional[bytes] = ..., probs: _Optional[bytes] = ...) -> None: ...

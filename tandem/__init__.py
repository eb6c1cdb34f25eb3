"""tandem: speculative decoding as a cluster. Users import the clients from here.

`pip install tandem` gives this SDK (grpcio and protobuf, nothing more); importing it loads
neither torch nor Ray. Running a cluster needs `pip install 'tandem[server]'`.
"""

from tandem.client import AsyncClient, Client, GenerationResult, GenerationStats, StreamChunk
from tandem.errors import (
    AbortedError,
    DeadlineExceededError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    ResourceExhaustedError,
    TandemError,
    UnauthenticatedError,
    UnavailableError,
)
from tandem.wire.generation import CycleStats

__version__ = "0.1.0"

__all__ = [
    "AsyncClient", "Client", "GenerationResult", "GenerationStats", "StreamChunk", "CycleStats",
    "TandemError", "InvalidArgumentError", "OutOfRangeError", "FailedPreconditionError",
    "UnavailableError", "DeadlineExceededError", "NotFoundError", "ResourceExhaustedError", "InternalError",
    "AbortedError", "UnauthenticatedError",
]

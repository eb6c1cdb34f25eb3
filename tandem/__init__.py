"""tandem: speculative decoding as a cluster. Users import the clients from here.

`pip install tandem` gives the SDK, `tandem.sdk` (grpcio and protobuf, nothing more); importing
it loads neither torch nor Ray. Everything else in the package is the server side and needs
`pip install 'tandem[server]'`.
"""

from tandem.sdk.client import AsyncClient, Client, GenerationResult, GenerationStats, StreamChunk
from tandem.sdk.errors import (
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

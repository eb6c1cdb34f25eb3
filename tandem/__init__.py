"""tandem: speculative decoding as a cluster. Users import the clients from here."""

from tandem.client import AsyncClient, Client, GenerationResult, GenerationStats, StreamChunk
from tandem.errors import (
    DeadlineExceededError, FailedPreconditionError, InternalError, InvalidArgumentError,
    OutOfRangeError, TandemError, UnavailableError,
)

__all__ = [
    "AsyncClient", "Client", "GenerationResult", "GenerationStats", "StreamChunk",
    "TandemError", "InvalidArgumentError", "OutOfRangeError", "FailedPreconditionError",
    "UnavailableError", "DeadlineExceededError", "InternalError",
]

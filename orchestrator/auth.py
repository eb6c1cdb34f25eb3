"""The ingress's bearer token: the standard gRPC `authorization: Bearer <token>` metadata,
checked against the configured token's SHA-256 digest in constant time."""

import hashlib
import hmac

import grpc

from tandem.wire.validation import FieldError


def _unauthenticated(message: str) -> FieldError:
    return FieldError(grpc.StatusCode.UNAUTHENTICATED, "authorization", message)


def authorize(metadata, expected_sha256: str | None) -> None:
    """Pass a call whose metadata carries the token; raise UNAUTHENTICATED otherwise. With no
    token configured (None) every call passes."""
    if expected_sha256 is None:
        return
    values = [value for key, value in metadata or () if key.lower() == "authorization"]
    if not values:
        raise _unauthenticated("missing: this server needs the metadata 'authorization: Bearer <token>'")
    scheme, _, token = str(values[0]).strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise _unauthenticated("expected 'Bearer <token>'")
    presented = hashlib.sha256(token.strip().encode()).hexdigest()
    # Digests of equal length, compared in constant time: the check leaks neither the token nor its length.
    if not hmac.compare_digest(presented, expected_sha256):
        raise _unauthenticated("the token is not valid")

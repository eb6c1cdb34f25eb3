"""The SDK's exception tree: one class per gRPC status a caller may want to handle, each
exposing the status `code` and the server's `details`."""

import grpc


class TandemError(Exception):
    """Any error the server answered; `code` is the grpc.StatusCode."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, details: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(details)
        self.details = details
        if code is not None:
            self.code = code


class InvalidArgumentError(TandemError, ValueError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class OutOfRangeError(TandemError, ValueError):
    code = grpc.StatusCode.OUT_OF_RANGE


class FailedPreconditionError(TandemError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class UnavailableError(TandemError, ConnectionError):
    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceededError(TandemError, TimeoutError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFoundError(TandemError):
    code = grpc.StatusCode.NOT_FOUND


class ResourceExhaustedError(TandemError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class UnauthenticatedError(TandemError, PermissionError):
    """The cluster wants a bearer token (api_key) and got none, or a wrong one."""

    code = grpc.StatusCode.UNAUTHENTICATED


class InternalError(TandemError):
    code = grpc.StatusCode.INTERNAL


class AbortedError(TandemError):
    """The session is continued by another stream (a resume elsewhere took it over)."""

    code = grpc.StatusCode.ABORTED


_BY_CODE = {cls.code: cls for cls in (
    InvalidArgumentError, OutOfRangeError, FailedPreconditionError, UnavailableError,
    DeadlineExceededError, NotFoundError, ResourceExhaustedError, InternalError, AbortedError,
    UnauthenticatedError,
)}


def from_rpc_error(e: grpc.RpcError) -> TandemError:
    """Map a grpc error (sync or aio) to the matching TandemError subclass."""
    code = e.code() if callable(getattr(e, "code", None)) else grpc.StatusCode.UNKNOWN
    details = e.details() if callable(getattr(e, "details", None)) else str(e)
    return _BY_CODE.get(code, TandemError)(details or code.name, code)

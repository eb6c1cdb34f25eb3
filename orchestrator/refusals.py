"""How a failed request is answered: the gRPC status and message for each way a session can
fail. Both ingresses read it (the HTTP one turns the status into its own)."""

import grpc

from tandem.orchestrator.cycle import FAILOVER_CODES, NoWorker
from tandem.orchestrator.store import Fenced, StoreUnavailable
from tandem.wire.validation import FieldError


class Refused(Exception):
    """The request ends with this gRPC status; the client's details name why."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code

    def __reduce__(self):  # picklable, so it crosses Ray's process boundary intact
        return Refused, (self.code, str(self))


def refusal(e: BaseException) -> Refused | None:
    """The status a failure is answered with; None for a client that went away."""
    if isinstance(e, Refused):
        return e
    if isinstance(e, FieldError):
        return Refused(e.code, str(e))
    if isinstance(e, NoWorker):
        return Refused(grpc.StatusCode.UNAVAILABLE, f"{e}; the session can be resumed")
    if isinstance(e, StoreUnavailable):
        return Refused(grpc.StatusCode.UNAVAILABLE, f"{e}; the session can be resumed once it is back")
    if isinstance(e, Fenced):
        return Refused(grpc.StatusCode.ABORTED, f"{e}: this stream stops")
    if isinstance(e, grpc.aio.AioRpcError):  # a worker failed in a way another worker would not mend
        code = grpc.StatusCode.UNAVAILABLE if e.code() in FAILOVER_CODES else grpc.StatusCode.INTERNAL
        if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:  # a worker's bound (its KV cache): the client's to know
            code = e.code()
        return Refused(code, f"worker call failed: {e.code().name}: {e.details()}")
    return None

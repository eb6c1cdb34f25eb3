"""Writer fencing on a worker: a session's cache takes steps from its latest writer only.

A session has one writer at a time, but a resume can take it over while the writer before still
has calls in flight, and a call whose caller gave up still runs. The session store counts a
session's claims (its writer epoch); every call carries its writer's. The model thread admits a
step only if its epoch is at least the highest it has run for the session, and records it: an
earlier writer's late step would overwrite cache positions that a later writer's cache_len
already counts as committed, and the later writer's next verify would read them. Epoch 0 is not
fenced (a caller writing the session alone). Steps are admitted on the model thread, just before
their pass, so admission follows the order in which caches change.
"""

from collections import OrderedDict

import grpc

from tandem.wire.validation import FieldError

MAX_SESSIONS = 1 << 16  # sessions whose epoch is remembered (about 100 bytes each), least recent forgotten


class Superseded(FieldError):
    """A later writer of the session has run a step on this worker."""

    def __init__(self, session_id: str, epoch: int, latest: int) -> None:
        super().__init__(grpc.StatusCode.ABORTED, "writer_epoch",
                         f"session {session_id!r} is written under epoch {latest} on this worker; "
                         f"this call's writer (epoch {epoch}) was taken over")


class WriterEpochs:
    """The highest writer epoch run per session, for the sessions seen last. Not thread-safe:
    the model thread's."""

    def __init__(self, max_sessions: int = MAX_SESSIONS) -> None:
        self.max_sessions = max_sessions
        self._latest: OrderedDict[str, int] = OrderedDict()

    def admit(self, session_id: str, epoch: int) -> None:
        """Record a step of the session's writer `epoch` → raises Superseded when a later
        writer's step has already run."""
        if epoch == 0:
            return
        latest = self._latest.get(session_id, 0)
        if epoch < latest:
            raise Superseded(session_id, epoch, latest)
        self._latest[session_id] = epoch
        self._latest.move_to_end(session_id)
        if len(self._latest) > self.max_sessions:
            self._latest.popitem(last=False)

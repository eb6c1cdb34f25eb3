"""Writer fencing on a worker: a session's cache takes steps from its latest writer only.

A session has one writer at a time, but a resume can take it over while the writer before still
has calls in flight, and a call whose caller gave up still runs. The session store counts a
session's claims (its writer epoch); every call carries its writer's. The model thread admits a
step only if its epoch is at least the highest it has run for the session (and above one that
released it), and records it: an earlier writer's late step would overwrite cache positions
that a later writer's cache_len already counts as committed, and the later writer's next verify
would read them. A writer's Release closes its epoch too: its late calls would make a cache that
nobody releases. Epoch 0 is not fenced (a caller writing the session alone). Steps and releases
are admitted on the model thread, in the order in which caches change.
"""

from collections import OrderedDict

import grpc

from tandem.wire.validation import FieldError

MAX_SESSIONS = 1 << 16  # sessions whose epoch is remembered (about 100 bytes each), least recent forgotten


class Superseded(FieldError):
    """A later writer of the session has run a step on this worker, or this writer released it."""

    def __init__(self, session_id: str, epoch: int, lowest: int) -> None:
        super().__init__(grpc.StatusCode.ABORTED, "writer_epoch",
                         f"session {session_id!r} takes calls of writer epoch {lowest} or later on this worker, "
                         f"this one's is {epoch}: its writer was taken over or released the session")


class WriterEpochs:
    """The lowest writer epoch each session still takes, for the sessions seen last. Not
    thread-safe: the model thread's."""

    def __init__(self, max_sessions: int = MAX_SESSIONS) -> None:
        self.max_sessions = max_sessions
        self._lowest: OrderedDict[str, int] = OrderedDict()

    def admit(self, session_id: str, epoch: int) -> None:
        """Record a step of the session's writer `epoch` → raises Superseded when a later
        writer's step has already run, or this writer released the session."""
        if epoch == 0:
            return
        lowest = self._lowest.get(session_id, 0)
        if epoch < lowest:
            raise Superseded(session_id, epoch, lowest)
        self._set(session_id, epoch)

    def release(self, session_id: str, epoch: int) -> None:
        """The session's writer `epoch` released it: no step of that epoch or an earlier one runs."""
        if epoch:
            self._set(session_id, max(epoch + 1, self._lowest.get(session_id, 0)))

    def _set(self, session_id: str, lowest: int) -> None:
        self._lowest[session_id] = lowest
        self._lowest.move_to_end(session_id)
        if len(self._lowest) > self.max_sessions:
            self._lowest.popitem(last=False)

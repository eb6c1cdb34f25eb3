"""Calls made in one turn of the event loop, sent together.

Sessions resume together: after a batched answer, every session in it runs its accept/reject
and makes its next worker call and its Redis commit in the same turn of the loop. A `Turn`
collects what is added to it during a turn and hands it to `send` at once: one batched call per
worker, one Redis round trip. It flushes two hops of the loop after the first addition (by
default), so that a call made from a task that this turn has just started joins too; of two
turns started together, the one with more hops flushes later (the commits, after the next
step's worker calls). Each caller gets its own item's result or exception; a caller that gave up
is left out of the flush.
"""

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

Send = Callable[[list[Any]], Awaitable[list[Any]]]  # items → per item its result or its exception


class Turn:
    def __init__(self, send: Send, hops: int = 2) -> None:
        self.send = send
        self.hops = max(1, hops)  # of the loop between the first addition and the flush
        self._items: list[tuple[Any, asyncio.Future]] = []
        self._sending: set[asyncio.Task] = set()

    async def add(self, item: Any) -> Any:
        """Send item with the rest of this turn's → its result (or raise its exception)."""
        loop = asyncio.get_running_loop()
        answer = loop.create_future()
        self._items.append((item, answer))
        if len(self._items) == 1:
            loop.call_soon(self._hop, self.hops - 1)
        return await answer

    def _hop(self, left: int) -> None:
        if left:
            asyncio.get_running_loop().call_soon(self._hop, left - 1)
        else:
            self._flush()

    def _flush(self) -> None:
        items, self._items = [(i, a) for i, a in self._items if not a.done()], []
        if items:
            task = asyncio.ensure_future(self._deliver(items))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _deliver(self, items: list[tuple[Any, asyncio.Future]]) -> None:
        try:
            outcomes = await self.send([item for item, _ in items])
        except BaseException as e:  # the whole send failed: every item fails with it
            outcomes = [e] * len(items)
            if not isinstance(e, Exception):
                _settle(items, outcomes)
                raise
        _settle(items, outcomes)


def _settle(items: list[tuple[Any, asyncio.Future]], outcomes: list) -> None:
    for (_, answer), outcome in zip(items, outcomes):
        if answer.done():  # its caller gave up
            continue
        if isinstance(outcome, BaseException):
            answer.set_exception(outcome)
        else:
            answer.set_result(outcome)

"""Turns (tandem.orchestrator.turns): what is added in one turn of the event loop goes in one
send, tasks started by that turn's callers included, each caller getting its own answer; of two
turns started together, the one with more hops is sent later."""

import asyncio

import pytest

from tandem.orchestrator.turns import Turn


def test_a_turns_additions_go_in_one_send_and_the_later_turn_after():
    sent = []

    async def send(items):
        sent.append(list(items))
        return [item * 10 if item >= 0 else ValueError(f"bad {item}") for item in items]

    async def main():
        calls, commits = Turn(send), Turn(send, hops=3)

        async def caller(i):  # a commit added at once, and a call from a task it starts
            call = asyncio.ensure_future(calls.add(i))
            committed = await commits.add(100 + i)
            return await call, committed

        results = await asyncio.gather(*(caller(i) for i in range(3)), calls.add(-1), return_exceptions=True)
        return results

    results = asyncio.run(main())
    assert results[:3] == [(0, 1000), (10, 1010), (20, 1020)]
    assert isinstance(results[3], ValueError)  # a bad item fails alone
    assert sent == [[-1, 0, 1, 2], [100, 101, 102]]  # the calls first, though the commits were added first


def test_a_turn_has_at_least_one_hop():
    assert Turn(lambda items: items, hops=0).hops == 1

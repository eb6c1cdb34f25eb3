"""The session store against a real Redis: each cycle's commit appends and updates atomically,
only for the session's writer and only once; a resume takes a session over; Redis faults are
retried for a bounded time."""

import asyncio
import json
from dataclasses import replace

import grpc
import pytest

from tandem.math.params import SamplingParams
from tandem.orchestrator.policy import GammaPolicy
from tandem.orchestrator.redis_server import EmbeddedRedis
from tandem.orchestrator.session import Request, Session, SessionRecord
from tandem.orchestrator.store import Fenced, SessionStore, StoreUnavailable
from tandem.wire.generation import CycleStats


def _cycle(i: int) -> CycleStats:
    return CycleStats(gamma=3, accepted=i % 4, output_tokens=1 + i % 4, start_ms=10.0 * i, draft_ms=1.5, verify_ms=2.5,
                      transport_ms=0.5, redis_ms=0.0, orchestration_ms=0.25, wire_bytes=100 + i,
                      drafted_ahead=bool(i % 2), ahead_ms=0.75)


REQUEST = Request(SamplingParams(temperature=0.5, top_k=3, top_p=0.9, seed=2**64 - 1), prompt_len=3, max_tokens=20,
                  gamma=None, verification="block", draft_shape="auto", tree_widths=(3, 2))


def _state(**kwargs) -> dict:
    """A commit's progress fields (Session.progress)."""
    return {"acceptance": json.dumps({"probe_gap": 16}), "draft_cache_len": 4, "target_cache_len": 5,
            "draft_worker": "d:1", "target_worker": "t:2", "status": "running", "ttft_s": 0.25} | kwargs


def _record(session_id: str, owner: str = "writer-a") -> Session:
    return Session(session_id, REQUEST, [5, 6, 7], GammaPolicy(), owner=owner)


def test_commits_append_tokens_and_stats_update_state_and_refresh_every_ttl(redis_url):
    async def run():
        store = SessionStore.from_url(redis_url, ttl_s=120)
        try:
            await store.create(_record("store-test"))
            await store.commit("store-test", "writer-a", 1, [8, 9], _cycle(1), _state())
            await store.redis.script_flush()  # a restarted Redis forgets scripts: the next commit reloads it
            await store.redis.expire("tandem:session:store-test", 5)
            await store.commit("store-test", "writer-a", 2, [2**31 - 1], _cycle(2), _state(status="length"))
            keys = ("tandem:session:store-test", "tandem:session:store-test:tokens", "tandem:session:store-test:cycle_stats")
            return await store.load("store-test"), [await store.redis.ttl(k) for k in keys], await store.load("nothing")
        finally:
            await store.close()

    record, ttls, missing = asyncio.run(run())
    assert record.tokens == [5, 6, 7, 8, 9, 2**31 - 1] and record.request == REQUEST
    assert record.generated == [8, 9, 2**31 - 1]
    assert (record.cycle, record.acceptance, record.status) == (2, {"probe_gap": 16}, "length")
    assert record.cache_lens == {"draft": 4, "target": 5}
    assert record.workers == {"draft": "d:1", "target": "t:2"} and record.ttft_s == 0.25
    assert record.per_cycle == [_cycle(1), _cycle(2)]
    assert record.created_s > 0 and record.owner == "writer-a" and record.epoch == 1
    assert all(100 < ttl <= 120 for ttl in ttls)
    assert missing is None


def test_a_new_session_is_stored_in_named_fields_and_reads_back_as_it_was_created(redis_url):
    fixed = replace(REQUEST, gamma=0, tree_widths=())

    async def run():
        store = SessionStore.from_url(redis_url)
        try:
            await store.create(_record("named-fields"))
            await store.create(Session("named-fixed", fixed, [5, 6, 7], GammaPolicy(), owner="w"))
            fields = await store.redis.hgetall("tandem:session:named-fields")
            return fields, await store.load("named-fields"), await store.load("named-fixed")
        finally:
            await store.close()

    fields, adaptive, fixed_gamma = asyncio.run(run())
    assert {k.decode(): v.decode() for k, v in fields.items()}.items() >= {
        "temperature": "0.5", "top_k": "3", "seed": str(2**64 - 1), "gamma": "", "verification": "block",
        "draft_shape": "auto", "tree_widths": "3,2", "draft_worker": "", "cycle": "0", "epoch": "1"}.items()
    assert adaptive.request == REQUEST and fixed_gamma.request == fixed
    assert adaptive.workers == {"draft": None, "target": None} and adaptive.cache_lens == {"draft": 0, "target": 0}


def test_a_record_from_before_named_fields_reads_as_it_was_written():
    """The layout before: JSON objects for the request, the policy, the workers and their cache lengths."""
    old = {"params": json.dumps({"temperature": 1.0, "top_k": 0, "top_p": 1.0, "seed": 9, "max_tokens": 32,
                                 "gamma": 3}),
           "prompt_len": "2", "cycle": "4", "policy": json.dumps({"probe_gap": 32}), "status": "abandoned",
           "workers": json.dumps({"draft": "d:1", "target": None}), "cache_lens": json.dumps({"draft": 5, "target": 0}),
           "owner": "", "epoch": "2", "created_s": "1.5", "ttft_s": "0.125"}
    record = SessionRecord.of("old", old, [1, 2, 3], [])
    assert record.request == Request(SamplingParams(1.0, 0, 1.0, 9), 2, 32, 3, "token", "chain", ())
    assert (record.cycle, record.status, record.epoch, record.acceptance) == (4, "abandoned", 2, {"probe_gap": 32})
    assert record.workers == {"draft": "d:1", "target": None} and record.cache_lens == {"draft": 5, "target": 0}


def test_each_stored_cycle_gets_its_redis_time_from_the_next_commit_or_after_the_last(redis_url):
    """A cycle's Redis time is measured after its commit: the next commit writes it into the
    cycle's stored stats, and the last one's is written on its own; the rest of a record stays."""
    async def run():
        store = SessionStore.from_url(redis_url)
        try:
            await store.create(_record("redis-ms"))
            await store.commit("redis-ms", "writer-a", 1, [8], _cycle(1), _state())
            await store.commit("redis-ms", "writer-a", 2, [9], _cycle(2), _state(), previous_redis_ms=1.5)
            await store.commit("redis-ms", "writer-a", 3, [10], _cycle(3), _state())  # 0: cycle 2's stays
            assert await store.amend_redis_ms("redis-ms", 3, 0.75)
            await store.amend_redis_ms("expired", 1, 0.5)  # no such session: nothing is made
            assert not await store.redis.exists("tandem:session:expired:cycle_stats")
            return await store.load("redis-ms")
        finally:
            await store.close()

    record = asyncio.run(run())
    assert [c.redis_ms for c in record.per_cycle] == [1.5, 0.0, 0.75]
    assert [replace(c, redis_ms=0.0) for c in record.per_cycle] == [replace(_cycle(i), redis_ms=0.0) for i in (1, 2, 3)]
    assert record.tokens == [5, 6, 7, 8, 9, 10]


def test_a_commit_is_fenced_by_owner_and_cycle_and_a_retry_is_idempotent(redis_url):
    async def run():
        store = SessionStore.from_url(redis_url)
        try:
            await store.create(_record("fence-test"))
            await store.commit("fence-test", "writer-a", 1, [8], _cycle(1), _state())
            await store.commit("fence-test", "writer-a", 1, [8], _cycle(1), _state())  # a retry: no second append
            with pytest.raises(Fenced):
                await store.commit("fence-test", "writer-a", 3, [9], _cycle(3), _state())  # a cycle skipped
            taken = await store.claim("fence-test", "writer-b")  # a resume elsewhere takes it over
            again = await store.claim("fence-test", "writer-c")  # and another
            await store.claim("fence-test", "writer-b")
            with pytest.raises(Fenced) as info:
                await store.commit("fence-test", "writer-a", 2, [9], _cycle(2), _state())  # the stale writer stops
            assert info.value.reason == "taken over"
            await store.commit("fence-test", "writer-b", 2, [10], _cycle(2), _state())
            assert not await store.finish("fence-test", "writer-a", "abandoned")
            assert await store.finish("fence-test", "writer-b", "abandoned")
            with pytest.raises(Fenced, match="expired"):
                await store.commit("no-such-session", "writer-a", 1, [1], _cycle(1), _state())
            return taken, again, await store.load("fence-test"), await store.claim("no-such-session", "x")
        finally:
            await store.close()

    taken, again, record, missing = asyncio.run(run())
    assert taken.tokens == [5, 6, 7, 8] and taken.owner == "writer-b" and taken.cycle == 1
    assert (taken.epoch, again.epoch, record.epoch) == (2, 3, 4)  # each claim a later writer epoch
    assert record.tokens == [5, 6, 7, 8, 10] and record.cycle == 2 and len(record.per_cycle) == 2
    assert record.status == "abandoned"
    assert missing is None


def test_a_finished_session_is_read_not_taken_over(redis_url):
    async def run():
        store = SessionStore.from_url(redis_url)
        try:
            await store.create(_record("finished-test"))
            await store.commit("finished-test", "writer-a", 1, [8, 2], _cycle(1), _state(status="stop"))
            return await store.claim("finished-test", "writer-b")
        finally:
            await store.close()

    record = asyncio.run(run())
    assert record.status == "stop" and record.owner == "writer-a" and record.generated == [8, 2]


def test_a_stopped_session_fences_its_writer_and_can_be_resumed(redis_url):
    async def run():
        store = SessionStore.from_url(redis_url)
        try:
            await store.create(_record("stop-test"))
            assert await store.stop("stop-test") and not await store.stop("stop-test")  # once
            with pytest.raises(Fenced) as info:
                await store.commit("stop-test", "writer-a", 1, [8], _cycle(1), _state())
            resumed = await store.claim("stop-test", "writer-b")
            await store.commit("stop-test", "writer-b", 1, [8], _cycle(1), _state(status="length"))
            return info.value.reason, resumed, await store.load("stop-test"), await store.stop("stop-test")
        finally:
            await store.close()

    reason, resumed, record, stopped_finished = asyncio.run(run())
    assert reason == "stopped" and resumed.status == "running" and resumed.owner == "writer-b"
    assert record.generated == [8] and record.status == "length" and not stopped_finished


def test_redis_down_is_retried_within_the_bound_then_unavailable():
    async def run(server: EmbeddedRedis):
        store = SessionStore.from_url(server.url, retry_s=1.0)
        try:
            await store.create(_record("down-test"))
            server.stop()
            with pytest.raises(StoreUnavailable) as info:
                await store.commit("down-test", "writer-a", 1, [8], _cycle(1), _state())
            assert "127.0.0.1" not in str(info.value) and str(server.port) not in str(info.value)
            store.retry_s = 20.0
            restart = asyncio.get_running_loop().run_in_executor(None, server.restart)
            await store.commit("down-test", "writer-a", 1, [8], _cycle(1), _state())  # waits for the restart
            await restart
            return await store.load("down-test")
        finally:
            await store.close()

    with EmbeddedRedis(appendonly=True) as server:
        record = asyncio.run(run(server))
    assert record.tokens == [5, 6, 7, 8] and record.cycle == 1  # the session survived the restart


def test_a_redis_with_a_password_works_the_same_and_a_wrong_one_is_a_clear_error():
    async def run(url: str, wrong: str):
        store = SessionStore.from_url(url)
        try:
            await store.create(_record("auth-test"))
            await store.commit("auth-test", "writer-a", 1, [8], _cycle(1), _state())
            loaded = await store.load("auth-test")
        finally:
            await store.close()
        refused = SessionStore.from_url(wrong, retry_s=3600.0)  # were it retried, the test would time out
        try:
            with pytest.raises(StoreUnavailable, match="credentials") as info:
                await refused.load("auth-test")
            return loaded, str(info.value)
        finally:
            await refused.close()

    with EmbeddedRedis(password="s3cret") as server:
        record, message = asyncio.run(run(server.url, server.url.replace("s3cret", "wrong")))
    assert record.tokens == [5, 6, 7, 8]
    assert "s3cret" not in message and "wrong" not in message


def test_what_the_orchestrator_raises_crosses_ray_intact():
    """Ray pickles an exception a replica raises to hand it to its proxy; one that does not
    unpickle turns the status the client should get into INTERNAL."""
    import pickle

    from tandem.orchestrator.cycle import NoWorker
    from tandem.orchestrator.refusals import Refused
    from tandem.wire.validation import invalid

    for error in (Fenced("s1", "taken over"), NoWorker("target", 30.0), StoreUnavailable("down"),
                  Refused(grpc.StatusCode.UNAVAILABLE, "no verifier"), invalid("gamma", "bad")):
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) and str(copy) == str(error) and vars(copy) == vars(error)


def test_commits_made_in_one_turn_share_a_round_trip_and_fail_alone(redis_url):
    """Concurrent commits go to Redis in one call of the script; a fenced one raises for its
    writer only."""
    async def run():
        store = SessionStore.from_url(redis_url)
        calls = []
        evalsha = store.redis.evalsha

        def counting(sha, numkeys, *args):
            calls.append(numkeys)
            return evalsha(sha, numkeys, *args)

        store.redis.evalsha = counting
        try:
            for i in range(5):
                await store.create(_record(f"turn-{i}"))
            commits = [store.commit(f"turn-{i}", "writer-a" if i != 2 else "writer-b", 1, [10 + i], _cycle(i), _state())
                       for i in range(5)]
            results = await asyncio.gather(*commits, return_exceptions=True)
            return calls, results, [await store.load(f"turn-{i}") for i in range(5)]
        finally:
            await store.close()

    calls, results, records = asyncio.run(run())
    assert calls == [15]  # one call, over 3 keys of each of the 5 sessions
    assert isinstance(results[2], Fenced) and results[2].reason == "taken over"
    assert [r for i, r in enumerate(results) if i != 2] == [None] * 4
    assert [r.generated for r in records] == [[10], [11], [], [13], [14]]


def test_a_commit_after_redis_forgot_the_script_loads_it_again(redis_url):
    """A restarted Redis has no scripts: the commit loads it and goes through."""
    async def run():
        store = SessionStore.from_url(redis_url)
        try:
            await store.create(_record("forgot"))
            await store.redis.script_flush()
            await store.commit("forgot", "writer-a", 1, [10], _cycle(0), _state())
            return await store.load("forgot")
        finally:
            await store.close()

    assert asyncio.run(run()).generated == [10]


def test_a_commit_writes_the_progress_fields_that_changed_since_this_writers_last():
    s = Session("changes", REQUEST, [5, 6, 7], GammaPolicy(), owner="writer-a")
    assert s.changes() == s.progress()  # the first commit: all of them
    assert s.changes() == {}
    s.cache_lens["target"], s.finish_reason = 9, "stop"
    assert s.changes() == {"target_cache_len": 9, "status": "stop"}

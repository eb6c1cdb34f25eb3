"""The session store against a real Redis: each cycle's commit appends and updates atomically."""

import asyncio

from tandem.orchestrator.store import SessionRecord, SessionStore


def test_commits_append_tokens_update_state_and_refresh_both_ttls(redis_url):
    async def run():
        store = SessionStore.from_url(redis_url, ttl_s=120)
        try:
            await store.create(SessionRecord("store-test", {"seed": 7}, 3, [5, 6, 7], 0, {"accepted": 0.0},
                                             {"draft": "d:1", "target": "t:2"}, {"draft": 0, "target": 0},
                                             "running"))
            await store.commit("store-test", [8, 9], 1, {"accepted": 1.5}, {"draft": 4, "target": 5}, "running")
            await store.redis.script_flush()  # a restarted Redis forgets scripts: the next commit reloads it
            await store.redis.expire("tandem:session:store-test", 5)
            await store.commit("store-test", [2**31 - 1], 2, {"accepted": 2.5}, {"draft": 6, "target": 6}, "length")
            ttls = [await store.redis.ttl(k) for k in ("tandem:session:store-test", "tandem:session:store-test:tokens")]
            return await store.load("store-test"), ttls, await store.load("no-such-session")
        finally:
            await store.close()

    record, ttls, missing = asyncio.run(run())
    assert record.tokens == [5, 6, 7, 8, 9, 2**31 - 1] and record.prompt_len == 3
    assert (record.cycle, record.policy, record.status) == (2, {"accepted": 2.5}, "length")
    assert record.cache_lens == {"draft": 6, "target": 6} and record.params == {"seed": 7}
    assert record.workers == {"draft": "d:1", "target": "t:2"}
    assert all(100 < ttl <= 120 for ttl in ttls)
    assert missing is None

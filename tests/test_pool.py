"""Worker pools: routing by reported load, stickiness, routing around failed, unhealthy and
mismatched workers, address resolution, and a pool following real worker processes."""

import asyncio

import pytest

from tandem.orchestrator import pool as pool_module
from tandem.orchestrator.clients import DraftClient, VerifierClient
from tandem.orchestrator.pool import Worker, WorkerPool, resolve, split_address
from tandem.wire.worker import ModelInfo, WorkerLoad

INFO = ModelInfo("target", 300, 256, (2,), "cpu", "float32", 1000)
OTHER = ModelInfo("other", 512, 256, (2,), "cpu", "float32", 5000)


def _pool(*workers: Worker) -> WorkerPool:
    pool = WorkerPool("target", [], VerifierClient)
    pool.workers = {w.address: w for w in workers}
    pool.info = INFO
    return pool


def _worker(address: str, sessions: int = 0, queued: int = 0, healthy: bool = True, info=INFO) -> Worker:
    return Worker(address, client=None, healthy=healthy, info=info, load=WorkerLoad(sessions, 0, queued),
                  compatible=info == INFO)


def test_new_sessions_spread_by_load_and_sessions_stick():
    pool = _pool(_worker("a:1", sessions=3), _worker("b:1", sessions=1), _worker("c:1", sessions=1, queued=5))
    first = [pool.route().address for _ in range(6)]
    # Fewest sessions first (those routed since the last report count), then least queued work.
    assert first == ["b:1", "c:1", "b:1", "c:1", "a:1", "b:1"]
    assert all(pool.route("a:1").address == "a:1" for _ in range(5))  # sticky: no re-count, no move
    assert pool.workers["a:1"].routed == 1


def test_eight_sessions_over_two_idle_verifiers_land_four_and_four():
    pool = _pool(_worker("a:1"), _worker("b:1"))
    routed = [pool.route().address for _ in range(8)]
    assert routed.count("a:1") == routed.count("b:1") == 4


def test_routing_around_failed_down_and_mismatched_workers(monkeypatch):
    pool = _pool(_worker("a:1"), _worker("b:1", sessions=9), _worker("c:1", healthy=False),
                 _worker("d:1", info=OTHER))
    assert pool.route("c:1").address == "a:1"  # its own worker is down: the least-loaded available one
    assert pool.route("d:1").address == "a:1"  # never routed to a worker of another model
    now = [100.0]
    monkeypatch.setattr(pool_module.time, "monotonic", lambda: now[0])
    pool.failed(pool.workers["a:1"], "UNAVAILABLE")
    assert pool.route("a:1").address == "b:1"
    now[0] += pool_module.FAILED_COOLDOWN_S
    assert pool.route("a:1").address == "a:1"  # after the cooldown, the health watch decides again
    for w in pool.workers.values():
        w.healthy = False
    assert pool.route() is None and not pool.available()


def test_addresses_resolve_to_every_ip():
    assert split_address("[::1]:50051") == ("::1", 50051)
    for bad in ("nohost", "host:", ":1", "host:port"):
        with pytest.raises(ValueError):
            split_address(bad)
    assert asyncio.run(resolve("127.0.0.1:50051")) == {"127.0.0.1:50051"}
    assert "127.0.0.1:7" in asyncio.run(resolve("localhost:7"))
    assert asyncio.run(resolve("[::1]:7")) == {"[::1]:7"}


def test_a_pool_follows_real_workers(workers):
    """One real draft worker and one address where nothing listens: the pool describes the
    real one, routes to it, polls its load, and never routes to the dead address."""

    async def run():
        pool = WorkerPool("draft", [workers["draft"], "127.0.0.1:1"], DraftClient, load_every_s=0.05)
        await pool.start()
        try:
            assert await pool.wait_available(30)
            worker = pool.route()
            await worker.client.propose("pool-test", 0, [5, 6, 7], 2, _greedy())
            await asyncio.sleep(0.3)  # a few load reports
            load = worker.load
            await worker.client.release("pool-test")
            return worker.address, pool.info, load, pool.workers["127.0.0.1:1"].available
        finally:
            await pool.close()

    address, info, load, dead_available = asyncio.run(run())
    assert address == workers["draft"] and info.vocab_size > 0
    assert load.sessions >= 1 and load.kv_cache_bytes > 0
    assert not dead_available


def _greedy():
    from tandem.math.params import SamplingParams

    return SamplingParams(temperature=0.0)


def test_workers_come_and_go_as_the_name_resolves_again(monkeypatch):
    """A headless Service: each resolution may name other pods. New ones join; gone ones
    leave; a failed resolution keeps what the name resolved to before."""
    answers = iter([{"10.0.0.1:1"}, {"10.0.0.1:1", "10.0.0.2:1"}, OSError("no DNS"), {"10.0.0.2:1"}])

    async def fake_resolve(address):
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(pool_module, "resolve", fake_resolve)

    async def run():
        pool = WorkerPool("target", ["verifiers.tandem.svc:1"], VerifierClient)
        seen = []
        for _ in range(4):
            await pool._resolve()
            seen.append(set(pool.workers))
        await pool.close()
        return seen

    assert asyncio.run(run()) == [{"10.0.0.1:1"}, {"10.0.0.1:1", "10.0.0.2:1"}, {"10.0.0.1:1", "10.0.0.2:1"},
                                  {"10.0.0.2:1"}]


def test_a_writer_cancelled_mid_call_leaves_another_writers_call_alone(workers):
    """Two writers of one session on one client (a resume taking it over on the same replica):
    the first writer's call is cancelled half-way, which drops its stream; the second writer's
    call, made meanwhile, must not be on that stream."""
    from tandem.math.params import SamplingParams

    greedy = SamplingParams(temperature=0.0)

    async def run():
        client = DraftClient(workers["draft"])
        try:
            first = asyncio.ensure_future(client.propose("mid-call", 0, list(range(5, 200)), 16, greedy, epoch=1))
            await asyncio.sleep(0)  # the first call holds its stream
            second = asyncio.ensure_future(client.propose("mid-call", 0, [5, 6, 7], 2, greedy, epoch=2))
            await asyncio.sleep(0.002)
            first.cancel()
            reply = await second
            await client.release("mid-call")
            return reply
        finally:
            await client.close()

    reply = asyncio.run(run())
    assert reply.answer is not None and len(reply.answer.draft_tokens) == 2

"""Failures with real processes: draft workers, target verifiers, an orchestrator replica and
Redis SIGKILLed mid-stream (by the pids the launcher started). Every stream completes with the
output of an undisturbed run, each token once; what cannot go on says UNAVAILABLE and
resumes later. One cluster for the module: a second application on the test run's Ray Serve
with 2 orchestrator replicas, 2 draft workers, 2 target verifiers and an embedded Redis with an
append-only file, all supervised by `LocalCluster`."""

import asyncio
import os
import signal
import time

import pytest

import tandem
from tandem.local import LocalCluster
from tandem.math.params import SamplingParams
from tandem.orchestrator import metrics
from tandem.orchestrator.store import SessionStore, read_session

from support.loops import generate, open_session, release, running_loop
from support.references import hf_greedy
from support.spans import attributes

pytestmark = [pytest.mark.cluster, pytest.mark.chaos]
MAX_TOKENS = 96
APP = "chaos"


@pytest.fixture(scope="module")
def chaos(pair, cluster):
    local = LocalCluster(pair["draft"], pair["target"], cluster["port"], threads=1, echo=False, draft_workers=2,
                         target_workers=2, replicas=2,
                         options={"app_name": APP, "redis_retry_s": 5.0, "verifier_wait_s": 10.0})
    local.supervisor.say = lambda line: print(line, flush=True)
    with local:
        yield local


@pytest.fixture(scope="module")
def expected(pair, target_model) -> dict[int, list[int]]:
    """The target's own greedy continuations (up to MAX_TOKENS or its EOS) of the prompts whose
    continuation runs long enough for a kill to land mid-stream."""
    runs = {i: hf_greedy(target_model, p, MAX_TOKENS) for i, p in enumerate(pair["prompts"])}
    return {i: out for i, out in runs.items() if len(out) >= MAX_TOKENS // 2}


def _finish(tokens: list[int]) -> str:
    return "length" if len(tokens) == MAX_TOKENS else "stop"


def _kill(proc) -> None:
    os.kill(proc.pid, signal.SIGKILL)


def _wait_restarted(local: LocalCluster, *names: str, timeout_s: float = 90.0) -> None:
    """Until the supervisor has restarted each child at least once and it is running."""
    deadline = time.monotonic() + timeout_s
    while not all(local.supervisor.restarts(n) and local.supervisor.proc(n).poll() is None for n in names):
        assert time.monotonic() < deadline, f"{names} not restarted in {timeout_s} s"
        time.sleep(0.2)


async def _streams(local: LocalCluster, prompts: list[list[int]], when_streaming=None, resume_attempts: int = 8,
                   **kwargs) -> list:
    """One greedy stream per prompt, all at once; when_streaming(session_ids) (a function or a
    coroutine function) runs once every stream has delivered tokens → [(tokens, last chunk's
    stats, session id) or the exception]."""
    streaming = [asyncio.Event() for _ in prompts]
    session_ids = [""] * len(prompts)

    async def one(i: int, client: tandem.AsyncClient):
        out, last = [], None
        async for chunk in client.stream(prompt_token_ids=prompts[i], max_tokens=MAX_TOKENS, temperature=0, **kwargs):
            out.extend(chunk.token_ids)
            last = chunk
            session_ids[i] = chunk.session_id
            streaming[i].set()
        return out, last.stats, last.session_id

    async with tandem.AsyncClient(local.address, app_name=APP, timeout_s=180,
                                  resume_attempts=resume_attempts) as client:
        tasks = [asyncio.create_task(one(i, client)) for i in range(len(prompts))]
        if when_streaming is not None:
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in streaming)), 120)
            if asyncio.iscoroutine(done := when_streaming(session_ids)):
                await done
        return await asyncio.gather(*tasks, return_exceptions=True)


def _spans(otlp, name: str, timeout_s: float = 15.0, **attrs) -> list:
    """Spans any process exported with this name (or name + " " + model) and these attributes."""
    deadline = time.monotonic() + timeout_s
    while True:
        with otlp.lock:
            spans = [sp for _, sp in otlp.spans if sp.name.split(" ")[0] == name]
        found = [sp for sp in spans if all(attributes(sp).get(k) == v for k, v in attrs.items())]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def _record(local: LocalCluster, session_id: str):
    return read_session(local.redis_url, session_id)


async def _held(local: LocalCluster, session_ids: list[str], kind: str, timeout_s: float = 30.0) -> str:
    """The address of a worker of this pool that one of these sessions, still running, holds (its
    record says), waiting up to timeout_s for one to hold any."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = [await _record(local, i) for i in session_ids]
        held = sorted({a for r in records if r.status == "running" and (a := r.workers.get(kind))})
        if held or time.monotonic() > deadline:
            assert held, f"none of the sessions holds a {kind} worker after {timeout_s} s"
            return held[0]
        await asyncio.sleep(0.05)


def test_sessions_spread_over_the_verifiers_and_stick_to_their_workers(chaos, pair, expected):
    """8 sessions at once over 2 verifiers land on both, 4 and 4; each keeps its worker of
    each pool, and no worker ever re-prefills (no cache miss) while all are healthy."""
    targets = [a for n, a in chaos.addresses.items() if n.startswith("target")]
    drafts = [a for n, a in chaos.addresses.items() if n.startswith("draft")]
    prompt = pair["prompts"][min(expected)]
    misses = lambda: sum(metrics.REGISTRY.get_sample_value("tandem:reprefills_total", {"pool": pool, "reason":
                         "cache_miss"}) or 0 for pool in ("draft", "target"))  # noqa: E731

    async def run():
        async with running_loop(drafts, targets, chaos.redis_url, (pair["eos"],)) as loop:
            before = misses()
            sessions = [await open_session(loop, f"route-{i}", prompt, SamplingParams(temperature=0.0), 24, 3)
                        for i in range(8)]
            outs = await asyncio.gather(*(generate(loop, s) for s in sessions))
            for s in sessions:
                await release(loop, s)
            return sessions, outs, misses() - before

    sessions, outs, new_misses = asyncio.run(run())
    assert all(out == expected[min(expected)][:24] for out in outs)
    on = [s.workers["target"] for s in sessions]
    assert sorted(on.count(t) for t in targets) == [4, 4]
    assert all(len(s.used) == 2 for s in sessions)  # one draft worker and one verifier each, throughout
    assert new_misses == 0


def test_killed_draft_worker_and_verifier_fail_over_and_every_stream_completes(chaos, pair, expected, otlp):
    names = {address: name for name, address in chaos.addresses.items()}
    killed = {}  # pool → the address of its worker killed: one that a session holds

    async def kill_held_workers(session_ids: list[str]):
        for kind in ("draft", "target"):
            killed[kind] = await _held(chaos, session_ids, kind)
            _kill(chaos.workers[names[killed[kind]]])

    prompts = list(expected)[:4]
    # A fixed γ: each session holds a draft worker from its first cycle (an adaptive γ may start at 0).
    results = asyncio.run(_streams(chaos, [pair["prompts"][i] for i in prompts], kill_held_workers, gamma=3))
    for i, (out, stats, session_id) in zip(prompts, results):
        assert out == expected[i]
        assert stats.generated_tokens == len(out) == sum(c.output_tokens for c in stats.per_cycle)
        record = asyncio.run(_record(chaos, session_id))
        assert record.generated == expected[i] and record.status == _finish(out)
        assert record.workers["draft"] != killed["draft"] and record.workers["target"] != killed["target"]
    for kind, address in killed.items():  # each move is a span in its request's trace
        moves = _spans(otlp, "failover", **{"tandem.pool": kind, "tandem.from": address})
        assert moves and all(attributes(m)["tandem.to"] not in ("", address) for m in moves)
    _wait_restarted(chaos, *(names[a] for a in killed.values()))  # the supervisor brings both back, on their ports
    again = asyncio.run(_streams(chaos, [pair["prompts"][prompts[0]]] * 4))
    assert all(out == expected[prompts[0]] for out, _, _ in again)


def test_with_no_draft_worker_left_sessions_run_at_gamma_0_then_draft_again(chaos, pair, expected):
    drafts = [n for n in chaos.names if n.startswith("draft")]
    restarts = {n: chaos.supervisor.restarts(n) for n in drafts}
    prompts = list(expected)[:2]
    results = asyncio.run(_streams(chaos, [pair["prompts"][i] for i in prompts],
                                   lambda _: [_kill(chaos.workers[n]) for n in drafts], gamma=3))
    for i, (out, stats, _) in zip(prompts, results):
        assert out == expected[i]
        assert any(c.gamma == 0 for c in stats.per_cycle[:-1])  # the target alone, for lack of a drafter
    deadline = time.monotonic() + 90
    while any(chaos.supervisor.restarts(n) == restarts[n] or chaos.workers[n].poll() is not None for n in drafts):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    for _ in range(20):  # until both replicas' health watches see a draft worker serving again
        (out, stats, _), = asyncio.run(_streams(chaos, [pair["prompts"][prompts[0]]] * 2, gamma=3))[:1]
        assert out == expected[prompts[0]]
        if all(c.gamma > 0 for c in stats.per_cycle[:-1]):
            break
        time.sleep(0.5)
    else:
        raise AssertionError("no drafting after the draft workers came back")


def test_killed_orchestrator_replica_the_stream_resumes_exactly(chaos, pair, expected, otlp):
    i = list(expected)[0]

    async def kill_the_writer(session_ids: list[str]):
        owner = (await _record(chaos, session_ids[0])).owner
        os.kill(int(owner.split(":")[1]), signal.SIGKILL)  # host:pid:id of the replica writing it

    (out, stats, session_id), = asyncio.run(_streams(chaos, [pair["prompts"][i]], kill_the_writer))
    assert out == expected[i]  # nothing lost, nothing twice
    assert stats.generated_tokens == len(out) == sum(c.output_tokens for c in stats.per_cycle)
    assert _spans(otlp, "resume", **{"gen_ai.response.id": session_id})  # the SDK's resume, traced

    async def replay(from_index: int):
        async with tandem.AsyncClient(chaos.address, app_name=APP, timeout_s=60) as client:
            chunks = [c async for c in client.resume(session_id, from_index)]
            return [t for c in chunks for t in c.token_ids], chunks[-1]

    for k in (0, 17, len(out) - 1, len(out)):
        tail, last = asyncio.run(replay(k))
        assert tail == expected[i][k:] and last.finish_reason == _finish(out) and last.stats.cycles == stats.cycles
    with pytest.raises(tandem.OutOfRangeError):
        asyncio.run(replay(len(out) + 1))
    with pytest.raises(tandem.NotFoundError):
        asyncio.run(_resume_all(chaos, "no-such-session", 0))


async def _unfinished_session(local: LocalCluster, statuses=(b"running",)) -> str:
    """The id of the one session in the chaos cluster's Redis whose status is one of these."""
    store = SessionStore.from_url(local.redis_url)
    try:
        for key in await store.redis.keys("tandem:session:*"):
            key = key.decode()
            if key.count(":") == 2 and (await store.redis.hget(key, "status")) in statuses:
                return key.split(":")[2]
        raise AssertionError(f"no session with a status in {statuses}")
    finally:
        await store.close()


async def _resume_all(local: LocalCluster, session_id: str, from_index: int, attempts: int = 8) -> list[int]:
    async with tandem.AsyncClient(local.address, app_name=APP, timeout_s=120, resume_attempts=attempts) as client:
        return [t async for chunk in client.resume(session_id, from_index) for t in chunk.token_ids]


def test_two_streams_resuming_one_session_at_once_commit_each_token_once(chaos, pair, target_model):
    """The first stream is left after its first chunk (which stops its session); then two
    resumes race for it, most likely on both replicas: one writes on, the other is fenced
    (ABORTED) or, if it came after the end, replays. Redis holds each token once."""
    prompt, long = max(((p, hf_greedy(target_model, p, 200)) for p in pair["prompts"]), key=lambda r: len(r[1]))

    async def run():
        async with tandem.AsyncClient(chaos.address, app_name=APP, timeout_s=120, resume_attempts=0) as client:
            stream = client.stream(prompt_token_ids=prompt, max_tokens=200, temperature=0)
            first = await anext(stream)
            await stream.aclose()
            race = await asyncio.gather(_resume_all(chaos, first.session_id, len(first.token_ids), 0),
                                        _resume_all(chaos, first.session_id, len(first.token_ids), 0),
                                        return_exceptions=True)
            return first, race

    first, race = asyncio.run(run())
    won = [r for r in race if isinstance(r, list)]
    assert won and all(isinstance(r, (list, tandem.AbortedError)) for r in race), race
    assert all(first.token_ids + r == long for r in won)
    record = asyncio.run(_record(chaos, first.session_id))
    assert record.generated == long and record.cycle == len(record.per_cycle)  # every cycle committed once


def test_redis_killed_and_restarted_within_the_bound_the_stream_completes(chaos, pair, expected):
    i = list(expected)[1]
    restarts = chaos.supervisor.restarts("redis")
    (out, _, session_id), = asyncio.run(_streams(chaos, [pair["prompts"][i]],
                                                 lambda _: _kill(chaos.supervisor.proc("redis"))))
    assert out == expected[i]
    assert chaos.supervisor.restarts("redis") == restarts + 1
    assert asyncio.run(_record(chaos, session_id)).generated == expected[i]  # the append-only file kept it all


def test_redis_gone_is_unavailable_and_the_session_resumes_once_it_is_back(chaos, pair, expected):
    i = list(expected)[2]
    redis = chaos.supervisor.forget("redis")  # killed for good, as far as anyone can tell
    try:
        (failed,) = asyncio.run(_streams(chaos, [pair["prompts"][i]], lambda _: _kill(redis), resume_attempts=0))
        assert isinstance(failed, tandem.UnavailableError), failed
        assert "session store" in failed.details and chaos.redis_url.split("//")[1] not in failed.details
        assert "127.0.0.1" not in failed.details
    finally:
        chaos.supervisor.add("redis", chaos.redis.restart)
    session_id = asyncio.run(_unfinished_session(chaos, (b"running", b"unavailable")))
    done = len(asyncio.run(_record(chaos, session_id)).generated)
    assert asyncio.run(_resume_all(chaos, session_id, done)) == expected[i][done:]

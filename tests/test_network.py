"""The network between the orchestrator and its workers: the delay proxy (on loopback, anywhere),
and the multi-host test bed (network namespaces: marked `network`, skipped where this machine
cannot make them): the delay a link adds is the delay it was told, a worker behind a link that
drops fails over with the stream unchanged, and the whole cluster serves across the test bed."""

import asyncio
import concurrent.futures
import os
import statistics
import subprocess
import time
from contextlib import asynccontextmanager

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from support.loops import open_session, running_loop
from support.references import hf_greedy
from tandem.bench.delay_proxy import Delay, Link, apply, parse_link
from tandem.bench import testbed as tb
from tandem.bench.network import NetworkCluster
from tandem.bench.procfs import cpu_seconds
from tandem.local import spawn_worker, stop_processes
from tandem.math.params import SamplingParams

NO_TESTBED = tb.unavailable()
needs_testbed = pytest.mark.skipif(NO_TESTBED is not None, reason=f"no multi-host test bed here: {NO_TESTBED}")


# --- the delay proxy, on loopback ------------------------------------------------------------


async def _echo(reader, writer):
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    writer.close()


@asynccontextmanager
async def echo_link(delay: Delay):
    """A link with this delay in front of an echo server → the link."""
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    link = await Link("x", ("127.0.0.1", 0), server.sockets[0].getsockname()[:2], delay).start()
    try:
        yield link
    finally:
        await link.close()
        server.close()


async def _round_trips(delay: Delay, n: int, size: int = 4) -> list[float]:
    """n echo round trips of `size` bytes through a link → milliseconds each."""
    async with echo_link(delay) as link:
        reader, writer = await asyncio.open_connection(*link.listen)
        rtts = []
        for _ in range(n):
            start = time.perf_counter()
            writer.write(b"x" * size)
            await reader.readexactly(size)
            rtts.append((time.perf_counter() - start) * 1e3)
        writer.close()
    return rtts


@pytest.mark.parametrize("ms", [1.0, 5.0, 20.0])
def test_a_link_delays_each_way_by_what_it_was_told(ms):
    rtts = asyncio.run(_round_trips(Delay(ms), 15))
    assert min(rtts) >= 2 * ms  # each direction waits out its delay
    assert statistics.median(rtts) < 2 * ms + 5  # and not much more (timer slack, scheduling)


def test_jitter_spreads_round_trips_within_its_bounds_and_keeps_the_stream_in_order():
    rtts = asyncio.run(_round_trips(Delay(5.0, 4.0), 40))
    assert min(rtts) >= 2 * 1.0 and statistics.pstdev(rtts) > 0.5

    async def stream() -> tuple[bytes, bytes]:
        async with echo_link(Delay(3.0, 3.0)) as link:
            reader, writer = await asyncio.open_connection(*link.listen)
            sent = b"".join(i.to_bytes(4, "big") for i in range(2000))
            for i in range(0, len(sent), 40):  # many small chunks, each with its own jitter
                writer.write(sent[i:i + 40])
                await writer.drain()
                await asyncio.sleep(0)
            got = await reader.readexactly(len(sent))
            writer.close()
        return sent, got

    sent, got = asyncio.run(stream())
    assert got == sent


def test_a_dropped_link_resets_its_connections_and_a_down_one_refuses_new_ones():
    async def run():
        async with echo_link(Delay(1.0)) as link:
            links = {"x": link}
            reader, writer = await asyncio.open_connection(*link.listen)
            writer.write(b"ping")
            assert await reader.readexactly(4) == b"ping"
            assert apply(links, "drop x") == "ok drop x"
            with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
                writer.write(b"ping")
                await reader.readexactly(4)
            assert apply(links, "down *").startswith("ok")
            reader, writer = await asyncio.open_connection(*link.listen)  # accepted by the kernel, then reset
            with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
                writer.write(b"ping")
                await reader.readexactly(4)
            assert apply(links, "up x").startswith("ok")
            reader, writer = await asyncio.open_connection(*link.listen)
            writer.write(b"pong")
            assert await reader.readexactly(4) == b"pong"
            writer.close()

    asyncio.run(run())


def test_the_proxy_answers_bad_commands_with_an_error_naming_them():
    links = {"a": Link("a", ("127.0.0.1", 0), ("127.0.0.1", 1), Delay())}
    assert apply(links, "delay a 5 1").startswith("ok") and links["a"].delay == Delay(5.0, 1.0)
    assert apply(links, "delay b 5") == "error: no link b"
    assert apply(links, "delay a fast").startswith("error: 'delay a fast'")
    assert apply(links, "shake a").startswith("error: unknown command 'shake'")
    assert apply(links, "").startswith("error")
    assert parse_link("d=10.0.0.1:7000,10.0.1.2:50051") == ("d", ("10.0.0.1", 7000), ("10.0.1.2", 50051))


# --- the test bed: workers on hosts of their own ---------------------------------------------

BED_DELAY_MS = 2.0


def test_a_cluster_on_the_test_bed_puts_each_drafter_where_it_drafts():
    """A draft worker gets a host of its own; the head drafter has none (its verifiers draft, with
    the head); a drafter that is not one, or the head without its directory, is refused."""
    assert NetworkCluster("d", "t", drafters=2, drafter="ngram").workers == ["draft-0", "draft-1", "target-0"]
    head = NetworkCluster("d", "t", drafters=2, drafter="head", head="models/head")
    assert head.workers == ["target-0"] and head.verifier_args == ("--head", "models/head")
    with pytest.raises(ValueError, match="drafter must be one of"):
        NetworkCluster("d", "t", drafter="eagle")
    with pytest.raises(ValueError, match="head directory"):
        NetworkCluster("d", "t", drafter="head")


@pytest.fixture(scope="module")
def bed(pair):
    """Two draft workers and two verifiers, each on a host of its own, each behind a link from
    this namespace (where the tests' cycle loop runs) with BED_DELAY_MS each way."""
    if NO_TESTBED:
        pytest.skip(f"no multi-host test bed here: {NO_TESTBED}")
    names = ["draft-0", "draft-1", "target-0", "target-1"]
    with tb.Testbed(names) as testbed:
        def start(name):
            kind = name.split("-")[0]
            return spawn_worker(kind, pair[kind], testbed.hosts[name].address, 1, "cpu", "float32", echo=False,
                                prefix=testbed.prefix(name))

        with concurrent.futures.ThreadPoolExecutor(len(names)) as pool:
            started = dict(zip(names, pool.map(start, names)))
        try:
            links = testbed.connect({name: (None, address) for name, (_, address) in started.items()}, BED_DELAY_MS)
            yield testbed, links
        finally:
            stop_processes([proc for proc, _ in started.values()])


@pytest.mark.network
@needs_testbed
def test_stopping_the_test_bed_kills_what_its_programs_left_behind():
    """A program's child that outlives it (as Ray's agents outlive an orchestrator stopped while
    it starts) is killed with the test bed, and its namespace goes."""
    with tb.Testbed(["orphans"]) as testbed:
        shell = testbed.run("orphans", ["sh", "-c", "sleep 300 > /dev/null 2>&1 & echo $!"], stdout=subprocess.PIPE,
                            text=True)
        orphan = int(shell.communicate(timeout=10)[0])
        os.kill(orphan, 0)  # alive, its parent gone
        namespace = testbed.hosts["orphans"].namespace
    with pytest.raises(ProcessLookupError):
        for _ in range(50):  # SIGKILLed: gone once its new parent has reaped it
            os.kill(orphan, 0)
            time.sleep(0.1)
    assert namespace not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


@pytest.mark.network
@needs_testbed
def test_the_test_bed_adds_the_delay_it_was_told(bed):
    testbed, links = bed
    stub = health_pb2_grpc.HealthStub(channel := grpc.insecure_channel(links["target-0"]))

    def round_trips():
        stub.Check(health_pb2.HealthCheckRequest(), timeout=5)  # the connection is up
        times = []
        for _ in range(15):
            start = time.perf_counter()
            stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
            times.append((time.perf_counter() - start) * 1e3)
        return times

    try:
        base = statistics.median(round_trips())  # BED_DELAY_MS each way
        for ms in (5.0, 20.0):
            testbed.set_delay(ms, link="target-0")
            times = round_trips()
            assert min(times) >= 2 * ms
            assert statistics.median(times) - base == pytest.approx(2 * (ms - BED_DELAY_MS), abs=5)
    finally:
        testbed.set_delay(BED_DELAY_MS, link="target-0")
        channel.close()


@pytest.mark.network
@needs_testbed
@pytest.mark.parametrize("pool", ["draft", "target"])
def test_a_worker_behind_a_dropping_link_fails_over_and_the_stream_is_unchanged(bed, pair, redis_url, target_model,
                                                                               pool):
    testbed, links = bed
    max_tokens = 40
    prompt, expected = next((p, e) for p in pair["prompts"]  # a stream that does not end early
                            if len(e := hf_greedy(target_model, p, max_tokens)) == max_tokens)

    async def run():
        async with running_loop([links["draft-0"], links["draft-1"]], [links["target-0"], links["target-1"]],
                                redis_url, (pair["eos"],), draft_ahead=False) as loop:
            s = await open_session(loop, f"net-drop-{pool}", prompt, SamplingParams(temperature=0.0), max_tokens, 3)
            tokens, cut = [], None
            async for out in loop.run(s):
                tokens += out.tokens
                if cut is None and len(tokens) >= 8:
                    cut = next(name for name, address in links.items() if address == s.workers[pool])
                    testbed.command(f"down {cut}")  # its connections reset, new ones refused
            return tokens, cut, s.workers[pool]

    try:
        tokens, cut, finally_on = asyncio.run(run())
    finally:
        testbed.command("up *")
    assert tokens == expected
    assert finally_on != links[cut]  # the session moved to the pool's other worker


@pytest.mark.network
@pytest.mark.cluster
@needs_testbed
def test_the_whole_cluster_serves_across_the_test_bed(pair, target_model):
    """`tandem orchestrator` (Ray Serve) on a host of its own, each worker on another, 5 ms each
    way between them: the stream is the target's own, and every cycle's calls crossed the links.
    Each role's CPU is read from its processes (the Serve replica's and Ray's proxy's apart from
    the rest of Ray's, and the client's), and each worker's passes from its metrics: one session
    alone runs one session a pass."""
    from tandem import Client

    delay = 5.0
    prompt = pair["prompts"][0]
    # Long enough that every role's CPU spans several of the kernel's 10 ms ticks: over 24 tokens
    # the proxies and the client each counted 20 ms, and once one of them none.
    tokens = 64
    expected = hf_greedy(target_model, prompt, tokens)
    with NetworkCluster(pair["draft"], pair["target"], delay_ms=delay) as cluster, Client(cluster.address) as client:
        before, passed = cluster.cpu_ms(), cluster.passes()
        result = client.generate(prompt_token_ids=prompt, max_tokens=tokens, temperature=0, gamma=3)
        after, passes = cluster.cpu_ms(), cluster.passes()
        alone = 1e3 * cpu_seconds(cluster.procs["orchestrator"].pid)
    assert result.token_ids == expected
    for name in ("draft-0", "target-0"):
        sessions, ran = passes[name][0] - passed[name][0], passes[name][1] - passed[name][1]
        assert ran >= len(result.stats.per_cycle) and sessions == ran
    assert all(c.transport_ms >= 2 * delay for c in result.stats.per_cycle)  # at least one call's round trip
    assert set(after) == {"draft-0", "target-0", "orchestrator", "serve replica", "ray proxy", "delay proxy", "client"}
    assert all(after[role] > before[role] for role in ("draft-0", "target-0", "serve replica", "ray proxy",
                                                        "delay proxy", "client"))
    assert after["orchestrator"] > alone  # Ray's other processes (its controller, the GCS) count too

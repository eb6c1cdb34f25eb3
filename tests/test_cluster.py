"""The whole cluster: Ray Serve's gRPC ingress, the orchestrator, both workers as processes,
and a real Redis. Exactness against Hugging Face with the target alone."""

import asyncio
import time
import urllib.request
from collections import Counter

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

import tandem
from tandem.math.params import SamplingParams
from tandem.math.sampling import warp
from tandem.orchestrator.policy import SESSION_STATE
from tandem.orchestrator.store import SessionStore

from support.references import hf_greedy

pytestmark = pytest.mark.cluster
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def client(cluster):
    with tandem.Client(cluster["address"], timeout_s=120) as c:
        yield c


@pytest.mark.parametrize("gamma, verification", [(3, None), (None, None), (3, "block")],
                         ids=["fixed-gamma", "adaptive", "block-verification"])
def test_greedy_is_token_identical_to_target_alone(client, pair, target_model, gamma, verification):
    hit_eos = 0
    for prompt in pair["prompts"]:
        expected = hf_greedy(target_model, prompt, MAX_TOKENS)
        result = client.generate(prompt_token_ids=prompt, max_tokens=MAX_TOKENS, temperature=0, gamma=gamma,
                                 verification=verification)
        assert result.token_ids == expected, f"prompt {prompt}"
        if expected[-1] == pair["eos"]:
            hit_eos += 1
            assert result.finish_reason == "stop"
        else:
            assert result.finish_reason == "length" and len(expected) == MAX_TOKENS
        s = result.stats
        assert s.accepted_tokens <= s.verified_tokens <= s.drafted_tokens
        assert len(s.gammas) == s.cycles and sum(s.gammas) == s.drafted_tokens
        assert s.generated_tokens == len(expected)
    assert hit_eos >= 2, "the pair should make some prompts stop at EOS"


def test_speculation_happens(client, pair):
    result = client.generate(prompt_token_ids=pair["prompts"][0], max_tokens=MAX_TOKENS, temperature=0, gamma=4)
    s = result.stats
    assert s.drafted_tokens > 0 and s.accepted_tokens > 0, "the noisy-copy draft should be accepted sometimes"
    assert s.cycles < len(result.token_ids) or s.accepted_tokens == 0
    assert s.mean_acceptance_length == pytest.approx(len(result.token_ids) / s.cycles)


def test_per_cycle_stats_describe_every_cycle(client, pair):
    result = client.generate(prompt_token_ids=pair["prompts"][2], max_tokens=MAX_TOKENS, temperature=0, gamma=3)
    s, cycles = result.stats, result.stats.per_cycle
    assert sum(c.output_tokens for c in cycles) == len(result.token_ids) == s.generated_tokens
    assert all(c.gamma <= 3 and c.accepted <= c.gamma and 1 <= c.output_tokens <= c.accepted + 1 for c in cycles)
    for before, c in zip([None, *cycles], cycles):  # every part measured, a draft call only where needed
        assert min(c.draft_ms, c.verify_ms, c.redis_ms, c.ahead_ms) >= 0  # transport, orchestration: clamped
        assert (c.draft_ms > 0) == (c.gamma > 0 and not c.drafted_ahead)
        assert not c.drafted_ahead or before.ahead_ms > 0  # after any outcome it guessed (ahead_rejections)
    assert s.accepted_tokens <= s.verified_tokens <= s.drafted_tokens  # totals derived from the cycles
    starts = [c.start_ms for c in cycles]
    assert starts == sorted(starts) and starts[-1] < s.elapsed_s * 1e3
    assert all(c.wire_bytes > 0 and c.verify_ms > 0 for c in cycles)


def test_stream_matches_unary_and_ends_with_stats(client, pair):
    prompt = pair["prompts"][1]
    unary = client.generate(prompt_token_ids=prompt, max_tokens=MAX_TOKENS, temperature=0, gamma=2)
    chunks = list(client.stream(prompt_token_ids=prompt, max_tokens=MAX_TOKENS, temperature=0, gamma=2))
    assert [t for c in chunks for t in c.token_ids] == unary.token_ids
    assert "".join(c.text for c in chunks) == unary.text
    assert all(c.stats is None for c in chunks[:-1])
    assert chunks[-1].stats.cycles == unary.stats.cycles
    assert chunks[-1].finish_reason == unary.finish_reason


def test_text_prompt_round_trips_through_the_tokenizer(client):
    result = client.generate("def fib(n):", max_tokens=8, temperature=0)
    assert len(result.token_ids) >= 1


@pytest.mark.parametrize("verification", ["token", "block"])
def test_sampled_first_token_follows_the_target_through_batched_passes(cluster, pair, target_model, workers,
                                                                       verification):
    """χ² of the first generated token over many seeds against the target's warped distribution.
    γ = 3 with a different draft: the token is accepted-draft or recovered, never plain target.
    With 32 sessions in flight, the workers draft and verify them in shared passes. Block
    verification decides the first token jointly with the rest of the block (its h_1 … h_3).
    (tests/test_block_verification.py has the full-sequence χ² and its negative control.)"""
    prompt, params = pair["prompts"][2], SamplingParams(temperature=1.0, top_k=8)
    with torch.no_grad():
        logits = target_model(torch.tensor([prompt])).logits[0, -1]
    expected = warp(logits, params).double().numpy()
    n, before = 400, _batched_passes(workers["metrics_ports"]["target"])

    async def run():
        async with tandem.AsyncClient(cluster["address"], timeout_s=120) as c:
            slots = asyncio.Semaphore(32)

            async def one(seed):
                async with slots:
                    # max_tokens 4: the first cycle drafts all 3 (γ stops at what the request still wants)
                    return await c.generate(prompt_token_ids=prompt, max_tokens=4, temperature=1.0, top_k=8,
                                            seed=seed, gamma=3, verification=verification)

            return await asyncio.gather(*(one(seed) for seed in range(n)))

    results = asyncio.run(run())
    passes, alone = (a - b for a, b in zip(_batched_passes(workers["metrics_ports"]["target"]), before))
    assert passes > alone, "no verify pass held two sessions"
    firsts = Counter(r.token_ids[0] for r in results)
    assert sum(r.stats.accepted_tokens for r in results) > 0, "some drafted tokens must be accepted"
    support = np.flatnonzero(expected)
    assert set(firsts) <= set(support.tolist())
    observed = np.array([firsts[t] for t in support], dtype=float)
    assert chisquare(observed, expected[support] / expected[support].sum() * n).pvalue > 1e-3


def _batched_passes(metrics_port: int) -> tuple[float, float]:
    """(forward passes, those with one session) from a worker's Prometheus metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
              if line.startswith("tandem:worker_batch_sessions_")}
    return values["tandem:worker_batch_sessions_count"], values['tandem:worker_batch_sessions_bucket{le="1.0"}']


@pytest.mark.parametrize("sessions", [2, 8, 32])
def test_greedy_is_token_identical_with_many_sessions_in_flight(cluster, pair, target_model, workers, sessions):
    """Sessions generating at once share the workers' forward passes, and each still gets the
    target's own greedy output: half of them with adaptive γ, half drafting γ = 3 (the random pair's
    draft is seldom right, and adaptive sessions under load probe on the replica's schedule,
    which this module's earlier sessions may have pushed past this test's end)."""
    prompts = [pair["prompts"][i % len(pair["prompts"])] for i in range(sessions)]
    gammas = [3 if i % 2 else None for i in range(sessions)]
    expected = {tuple(p): hf_greedy(target_model, p, MAX_TOKENS) for p in prompts}
    before = {kind: _batched_passes(workers["metrics_ports"][kind]) for kind in ("draft", "target")}

    async def run():
        async with tandem.AsyncClient(cluster["address"], timeout_s=120) as c:
            return await asyncio.gather(*(c.generate(prompt_token_ids=p, max_tokens=MAX_TOKENS, temperature=0, gamma=g)
                                          for p, g in zip(prompts, gammas)))

    for prompt, result in zip(prompts, asyncio.run(run())):
        assert result.token_ids == expected[tuple(prompt)], f"prompt {prompt}"
    for kind in ("draft", "target") if sessions >= 8 else ():  # two may happen to alternate
        passes, alone = (a - b for a, b in zip(_batched_passes(workers["metrics_ports"][kind]), before[kind]))
        assert passes > alone, f"no {kind} pass held two sessions ({passes:.0f} passes)"


def test_seeded_request_reproduces_exactly(client, pair):
    kwargs = dict(prompt_token_ids=pair["prompts"][3], max_tokens=MAX_TOKENS, temperature=0.9, top_p=0.95, gamma=3)
    a = client.generate(seed=1234, **kwargs)
    b = client.generate(seed=1234, **kwargs)
    c = client.generate(seed=4321, **kwargs)
    assert a.token_ids == b.token_ids
    assert a.stats.gammas == b.stats.gammas and a.stats.accepted_tokens == b.stats.accepted_tokens
    assert a.token_ids != c.token_ids


def test_redis_holds_the_committed_tokens_of_a_finished_session(client, pair, redis_url):
    prompt = pair["prompts"][4]
    result = client.generate(prompt_token_ids=prompt, max_tokens=MAX_TOKENS, temperature=0, seed=7)

    async def load():
        store = SessionStore.from_url(redis_url)
        try:
            return await store.load(result.session_id), await store.redis.ttl(f"tandem:session:{result.session_id}")
        finally:
            await store.close()

    record, ttl = asyncio.run(load())
    assert record.tokens == prompt + result.token_ids
    assert record.request.prompt_len == len(prompt)
    assert record.status == result.finish_reason
    assert record.cycle == result.stats.cycles
    assert record.request.params.seed == 7 and record.request.params.temperature == 0
    assert set(record.acceptance) == set(SESSION_STATE)  # the session's own: the costs are the replica's
    assert len(record.per_cycle) == record.cycle and all(c.redis_ms > 0 for c in record.per_cycle)  # measured
    assert 0 < ttl <= 3600


@pytest.mark.parametrize(
    "kwargs, error, field",
    [
        (dict(prompt_token_ids=[1, 2, 10**6]), tandem.InvalidArgumentError, "prompt_token_ids[2]"),
        (dict(prompt_token_ids=[1, 2], gamma=99), tandem.OutOfRangeError, "gamma"),
        (dict(prompt_token_ids=[1, 2], max_tokens=10**6), tandem.OutOfRangeError, "max_tokens"),
        (dict(prompt_token_ids=[1, 2], max_tokens=255), tandem.OutOfRangeError, "max_tokens"),
        (dict(prompt_token_ids=[1] * 300), tandem.OutOfRangeError, "prompt"),
    ],
)
def test_bad_requests_get_clear_errors_and_the_cluster_keeps_serving(client, kwargs, error, field):
    with pytest.raises(error) as info:
        client.generate(**kwargs)
    assert field in info.value.details
    assert client.generate(prompt_token_ids=[5, 6], max_tokens=2, temperature=0).token_ids


def test_wire_level_checks_the_sdk_cannot_skip(cluster):
    """Raw protobuf requests with values the SDK would refuse client-side."""
    import grpc

    from tandem.v1 import generation_pb2, generation_pb2_grpc

    channel = grpc.insecure_channel(cluster["address"])
    stub = generation_pb2_grpc.GenerationStub(channel)
    md = (("application", "tandem"),)
    cases = [
        (dict(prompt_token_ids=[1], temperature=float("nan")), "temperature"),
        (dict(prompt_token_ids=[1], temperature=-1.0), "temperature"),
        (dict(prompt_token_ids=[1], top_p=0.0), "top_p"),
        (dict(prompt_token_ids=[1], top_p=1.5), "top_p"),
        (dict(prompt_token_ids=[1], top_k=-3), "top_k"),
        (dict(prompt_token_ids=[1], gamma=-1), "gamma"),
        (dict(prompt_token_ids=[-5]), "prompt_token_ids[0]"),
        (dict(), "prompt"),
        (dict(prompt="x", prompt_token_ids=[1]), "prompt"),
        (dict(prompt_token_ids=[1], verification=9), "verification"),
    ]
    for kwargs, field in cases:
        with pytest.raises(grpc.RpcError) as info:
            stub.Generate(generation_pb2.GenerateRequest(**kwargs), metadata=md, timeout=60)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, kwargs
        assert field in info.value.details(), kwargs
    # Garbage bytes on the ingress port: an error for that call, the server lives on.
    garbage = channel.unary_unary("/tandem.v1.Generation/Generate")
    with pytest.raises(grpc.RpcError):
        garbage(b"\xff\xff\xff\x07garbage", metadata=md, timeout=60)
    ok = stub.Generate(generation_pb2.GenerateRequest(prompt_token_ids=[3], max_tokens=1), metadata=md, timeout=60)
    assert len(ok.token_ids) == 1
    channel.close()


def test_text_prompt_without_tokenizer_is_failed_precondition(cluster):
    from dataclasses import replace

    from ray import serve

    from tandem.orchestrator.app import build_app

    config = replace(cluster["config"], tokenizer=None, app_name="ids-only", metrics_port=0)
    serve.run(build_app(config), name="ids-only", route_prefix="/ids-only")
    try:
        with tandem.Client(cluster["address"], app_name="ids-only") as c:
            with pytest.raises(tandem.FailedPreconditionError) as info:
                c.generate("hello", max_tokens=2)
            assert "prompt" in info.value.details
            assert c.generate(prompt_token_ids=[4, 5], max_tokens=2).text == ""
    finally:
        serve.delete("ids-only")


def test_sdk_checks_parameters_client_side():
    c = tandem.Client("127.0.0.1:1")
    for kwargs in (dict(), dict(prompt="a", prompt_token_ids=[1]), dict(prompt="a", temperature=-1),
                   dict(prompt="a", top_p=0), dict(prompt="a", top_k=-1), dict(prompt="a", gamma=-2),
                   dict(prompt="a", gamma="fast"), dict(prompt="a", max_tokens=0),
                   dict(prompt="a", verification="joint")):
        with pytest.raises(ValueError):
            c.generate(**kwargs)
    c.close()


def test_async_client(cluster, pair, target_model):
    prompt = pair["prompts"][5]

    async def run():
        async with tandem.AsyncClient(cluster["address"]) as c:
            unary = await c.generate(prompt_token_ids=prompt, max_tokens=MAX_TOKENS, temperature=0)
            streamed = [t async for chunk in c.stream(prompt_token_ids=prompt, max_tokens=MAX_TOKENS,
                                                       temperature=0) for t in chunk.token_ids]
            return unary, streamed

    unary, streamed = asyncio.run(run())
    assert unary.token_ids == streamed == hf_greedy(target_model, prompt, MAX_TOKENS)


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_a_stream_left_early_is_abandoned_frees_its_caches_and_resumes(cluster, pair, workers, redis_url,
                                                                      target_model, asynchronous):
    """Leaving stream() early (close, aclose, break) stops the session: the server stops
    generating, frees its caches, records it as abandoned, and it can be resumed later."""
    prompt, expected = max(((p, hf_greedy(target_model, p, 200)) for p in pair["prompts"]), key=lambda r: len(r[1]))
    kwargs = dict(prompt_token_ids=prompt, max_tokens=200, temperature=0)
    held_before = asyncio.run(_sessions_held(workers))
    if asynchronous:
        async def first():
            async with tandem.AsyncClient(cluster["address"], timeout_s=120) as c:
                stream = c.stream(**kwargs)
                chunk = await anext(stream)
                await stream.aclose()
                return chunk
        chunk = asyncio.run(first())
    else:
        with tandem.Client(cluster["address"], timeout_s=120) as c:
            for chunk in c.stream(**kwargs):
                break

    async def ended():
        store = SessionStore.from_url(redis_url)
        try:
            for _ in range(300):  # bounded: 30 s
                record = await store.load(chunk.session_id)
                if record.status != "running" and await _sessions_held(workers) == held_before:
                    break
                await asyncio.sleep(0.1)
            return record, await _sessions_held(workers)
        finally:
            await store.close()

    record, held = asyncio.run(ended())
    assert record.status == "abandoned" and len(record.generated) < len(expected)
    assert held == held_before  # both caches freed
    with tandem.Client(cluster["address"], timeout_s=120) as c:
        rest = [t for piece in c.resume(chunk.session_id, len(chunk.token_ids)) for t in piece.token_ids]
        assert c.cancel(chunk.session_id) is False  # finished now: nothing to stop
    assert chunk.token_ids + rest == expected
    assert asyncio.run(_sessions_held(workers, until=held_before)) == held_before  # the resumed one freed them too


async def _sessions_held(workers, until: dict | None = None, timeout_s: float = 10.0) -> dict:
    """Sessions each worker holds a cache for, as it reports its load (polled until it is
    `until`, for at most timeout_s: the orchestrator frees caches after the last chunk)."""
    from tandem.orchestrator.clients import DraftClient, VerifierClient

    clients = {"draft": DraftClient(workers["draft"]), "target": VerifierClient(workers["target"])}
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            held = {kind: (await c.load()).sessions for kind, c in clients.items()}
            if until is None or held == until or time.monotonic() > deadline:
                return held
            await asyncio.sleep(0.1)
    finally:
        for c in clients.values():
            await c.close()

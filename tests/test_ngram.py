"""The n-gram draft worker (tandem.services.ngram): the lookup and its session store as pure
logic; then `tandem worker ngram` as a real process, alone and drafting for the cycle loop with
a real target verifier and Redis, greedy token-identical to the target alone and sampled
(one-hot drafts, token and block verification) following the target's distribution."""

import asyncio

import grpc
import numpy as np
import pytest

from tandem.math.params import SamplingParams
from tandem.services.ngram import Lookup, NgramRuntime
from tandem.services.runtime import CacheMiss, Step
from tandem.v1 import worker_pb2, worker_pb2_grpc
from tandem.wire import worker as wire

from support.loops import (
    assert_first_tokens_follow_the_target,
    generate,
    open_session,
    release,
    running_loop,
    sampled_first_tokens,
)
from support.references import hf_greedy


def test_lookup_proposes_what_followed_the_latest_longest_match():
    lookup = Lookup(min_n=1, max_n=3, window=0)
    context = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    assert lookup.propose(context, 2) == [7, 8]  # the latest "1 2 3" is followed by 7 8
    # Past the context's end the copy runs on into itself: "1 2 3" recurs every 6 tokens.
    assert lookup.propose(context, 10) == [7, 8, 5, 1, 2, 3, 7, 8, 5, 1]
    assert lookup.propose([4, 5, 6, 5], 3) == [6, 5, 6]  # only "5" matches: n falls back to 1
    assert lookup.propose([4, 5, 6, 7], 3) == []  # nothing occurred before
    assert Lookup(min_n=2, max_n=3).propose([4, 5, 6, 5], 3) == []  # "5" alone is too short
    assert lookup.propose([3], 2) == []


def test_lookup_searches_only_its_window():
    context = [1, 2, 3, 4] + [0] * 20 + [1, 2]
    assert Lookup(1, 2, window=0).propose(context, 2) == [3, 4]
    assert Lookup(1, 2, window=10).propose(context, 2) == []  # the earlier "1 2" is outside the last 10


def test_lookup_rejects_bad_settings():
    for bad in (dict(min_n=0), dict(min_n=3, max_n=2), dict(window=-1)):
        with pytest.raises(ValueError):
            Lookup(**bad)


def test_runtime_crops_extends_and_misses_like_a_kv_cache():
    runtime = NgramRuntime(Lookup(), max_tokens=10)
    assert runtime.extend_batch([Step("a", 0, [1, 2, 3])])[0] == [1, 2, 3]
    assert runtime.extend_batch([Step("a", 2, [7, 8])])[0] == [1, 2, 7, 8]  # cropped to 2, extended
    miss, fresh = runtime.extend_batch([Step("a", 5, [9]), Step("b", 0, [4])])
    assert isinstance(miss, CacheMiss) and fresh == [4]  # a miss leaves the other step alone
    assert runtime.num_sessions == 2 and runtime.cache_bytes == 8 * 5
    runtime.extend_batch([Step("c", 0, list(range(8)))])  # past the bound: the oldest other one goes
    assert runtime.num_sessions == 2 and not runtime.release("a")
    assert runtime.release("c") and runtime.cache_bytes == 8


@pytest.fixture(scope="module")
def ngram_worker():
    from tandem.local import spawn_worker, stop_processes

    proc, address = spawn_worker("ngram", "", "127.0.0.1", 1, "cpu", "float32", echo=False,
                                 args=["--max-n", "3"])
    yield address
    stop_processes([proc])


def test_the_ngram_worker_is_a_draft_worker(ngram_worker):
    with grpc.insecure_channel(ngram_worker) as channel:
        stub = worker_pb2_grpc.DraftWorkerStub(channel)
        info = wire.model_info_from_pb(stub.Describe(worker_pb2.DescribeRequest(), timeout=30))
        assert info.num_parameters == 0 and info.model.startswith("ngram")
        assert info.pass_ms == {}  # a lookup runs no pass to time
        seq = [5, 6, 7, 8, 9, 5, 6]

        def propose(session, cache_len, tokens, gamma, params=SamplingParams(temperature=0.0)):
            request = wire.propose_request(session, cache_len, tokens, gamma, params)
            return wire.proposal_from_pb(stub.Propose(request, timeout=30))

        greedy = propose("s", 0, seq, 3)
        assert greedy.draft_tokens == [7, 8, 9] and greedy.draft_token_probs == [1.0] * 3
        assert greedy.draft_distributions == []
        # The worker now holds seq and the block's first γ−1 tokens, as a model draft's cache does:
        # the next call crops to what was accepted (two of three) and feeds the recovered token.
        assert propose("s", len(seq) + 2, [4], 2).draft_tokens == []  # "…9 4" never occurred
        assert propose("s", 3, [8, 9, 5, 6, 7], 2).draft_tokens == [8, 9]
        sampled = propose("t", 0, seq, 2, SamplingParams(temperature=1.0, seed=1))
        assert sampled.draft_tokens == [7, 8]
        assert [np.frombuffer(d.token_ids, "<i4").tolist() for d in sampled.draft_distributions] == [[7], [8]]
        assert all(np.frombuffer(d.probs, "<f4").tolist() == [1.0] for d in sampled.draft_distributions)
        assert propose("unknown", 4, [1], 2) is None  # a cache miss, as from a model draft


def test_ngram_drafts_keep_greedy_output_identical_to_the_target(ngram_worker, workers, redis_url, pair,
                                                                 target_model):
    prompt = pair["prompts"][3] * 3  # repetition: the lookup finds matches
    expected = hf_greedy(target_model, prompt, 24)

    async def run():
        async with running_loop([ngram_worker], [workers["target"]], redis_url, (pair["eos"],)) as loop:
            out = {}
            for gamma in (4, None):
                s = await open_session(loop, f"ngram-greedy-{gamma}", prompt, SamplingParams(temperature=0.0), 24,
                                       gamma)
                out[gamma] = (await generate(loop, s), s.stats)
                await release(loop, s)
            return out

    out = asyncio.run(run())
    for gamma, (tokens, _) in out.items():
        assert tokens == expected, f"gamma {gamma}"
    # Right after the prompt its last tokens match an earlier copy; adaptive γ's first cycle is
    # the target's alone, and what follows may never match (random weights), so only fixed γ
    # is sure to draft here.
    assert sum(c.gamma for c in out[4][1].per_cycle) > 0, "the lookup should have drafted"


def test_a_lookup_that_finds_nothing_is_a_probe_that_accepted_nothing(workers, redis_url, pair, target_model):
    """A draft call answered with no block (here always: a one-token window holds no earlier
    occurrence) teaches adaptive γ a block rejected at its first token, so each such probe
    doubles the wait for the next one; taught as a γ-0 cycle, it had reset nothing and every
    cycle after the first probe made a draft call in vain. The output is the target's."""
    from tandem.local import spawn_worker, stop_processes

    proc, blind = spawn_worker("ngram", "", "127.0.0.1", 1, "cpu", "float32", echo=False, args=["--window", "1"])
    prompt = pair["prompts"][2]

    async def run():
        async with running_loop([blind], [workers["target"]], redis_url, (pair["eos"],)) as loop:
            s = await open_session(loop, "ngram-blind", prompt, SamplingParams(temperature=0.0), 40, None)
            tokens = await generate(loop, s)
            await release(loop, s)
            return tokens, s

    try:
        tokens, s = asyncio.run(run())
    finally:
        stop_processes([proc])
    assert tokens == hf_greedy(target_model, prompt, 40)
    assert all(c.gamma == 0 for c in s.stats.per_cycle)  # nothing was ever drafted
    # The draft calls (counts of blocks that reached their first position, fading 0.2 % a block):
    # the first cycles' (γ before the costs are measured), probes after 8 and 16 γ-0 cycles, and
    # the calls the cost model itself may choose while α falls (a lookup costs next to nothing;
    # how many depends on the timings: 7–9 seen), not every cycle: that would be ~39 here.
    calls = s.policy.pair.reached[0] if s.policy.pair.reached else 0.0  # none: taught as γ-0 cycles
    assert 1.5 < calls < 16 and s.policy.pair.passed[0] == 0
    assert s.policy.probe_gap >= 4 * s.policy.probe_every


@pytest.mark.parametrize("verification", ["token", "block"])
def test_sampled_first_token_through_ngram_drafts_follows_the_target(ngram_worker, workers, redis_url, pair,
                                                                     target_model, verification):
    """One-hot drafts under a sampled target: accepted with the target's probability of the
    drafted token, else the target without it. χ² of the first token over many seeds."""
    prompt = pair["prompts"][4] * 3
    results = sampled_first_tokens(ngram_worker, workers["target"], redis_url, pair["eos"], prompt, 300,
                                   verification, f"ngram-{verification}")
    assert sum(gamma for _, gamma in results) > 0, "the lookup should have drafted"
    assert_first_tokens_follow_the_target(target_model, prompt, [token for token, _ in results])

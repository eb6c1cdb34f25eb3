"""The hybrid draft worker (tandem.services.hybrid): the runtime driven by its jobs against a
real draft model, drafting by lookup where the context repeats and by the model elsewhere, the
model's cache caught up from the token list; then `tandem worker hybrid` as a real process,
drafting for the cycle loop with a real target verifier and Redis, greedy token-identical to
the target alone and sampled following the target's distribution."""

import asyncio

import grpc
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from tandem.math.params import SamplingParams
from tandem.services.hybrid import HybridRuntime, propose
from tandem.services.ngram import Lookup
from tandem.services.pass_curve import LADDER
from tandem.services.runtime import ModelRuntime
from tandem.v1 import worker_pb2, worker_pb2_grpc
from tandem.wire import worker as wire

from support.jobs import run_alone
from support.loops import (
    assert_first_tokens_follow_the_target,
    generate,
    open_session,
    release,
    running_loop,
    sampled_first_tokens,
)
from support.references import hf_greedy

GREEDY = SamplingParams(temperature=0.0)


def argmax_continuation(model, context: list[int], n: int) -> list[int]:
    out = []
    with torch.no_grad():
        for _ in range(n):
            out.append(int(model(torch.tensor([context + out])).logits[0, -1].argmax()))
    return out


@pytest.fixture(scope="module")
def draft_model(pair):
    return AutoModelForCausalLM.from_pretrained(pair["draft"]).eval()


def test_the_model_drafts_where_the_lookup_misses_from_a_cache_caught_up_on_the_list(pair, draft_model):
    runtime = HybridRuntime(Lookup(min_n=2), ModelRuntime(pair["draft"]))
    prompt = [5, 6, 7, 8, 9, 10]  # no bigram occurs twice: the model drafts

    def call(cache_len, tokens, gamma=3):
        return run_alone(runtime, propose("s", cache_len, tokens, gamma, GREEDY, runtime))

    first = call(0, prompt)
    assert first.draft_tokens == argmax_continuation(draft_model, prompt, 3)
    assert runtime.fed("s") == len(prompt) + 2  # the model holds the block's first γ−1 drafts
    # Nothing accepted; the recovered token makes "5 6" recur: the lookup proposes what followed.
    lookup = call(len(prompt), [5, 6])
    assert lookup.draft_tokens == [7, 8, 9] and lookup.draft_token_probs == [1.0] * 3
    assert runtime.fed("s") == len(prompt)  # the list moved on; the model's cache did not
    # One draft accepted ("7"), then a token that makes no bigram recur: the model catches up.
    context = prompt + [5, 6, 7, 11]
    caught_up = call(len(prompt) + 3, [11])
    assert caught_up.draft_tokens == argmax_continuation(draft_model, context, 3)
    assert runtime.fed("s") == len(context) + 2 == runtime.model.held("s")
    assert runtime.release("s") and runtime.model.held("s") == 0 and runtime.num_sessions == 0


def test_a_session_evicted_from_the_list_is_released_from_the_model(pair):
    runtime = HybridRuntime(Lookup(min_n=2), ModelRuntime(pair["draft"]), max_tokens=12)
    run_alone(runtime, propose("a", 0, [5, 6, 7, 8, 9], 2, GREEDY, runtime))
    run_alone(runtime, propose("b", 0, [15, 16, 17, 18, 19, 20, 21, 22], 2, GREEDY, runtime))
    assert runtime.num_sessions == 1 and runtime.model.held("a") == 0 and runtime.fed("a") == 0
    assert runtime.cache_bytes > 8 * 9  # the list's tokens and the model's cache


@pytest.fixture(scope="module")
def hybrid_worker(pair):
    from tandem.local import spawn_worker, stop_processes

    proc, address = spawn_worker("hybrid", pair["draft"], "127.0.0.1", 1, "cpu", "float32", echo=False)
    yield address
    stop_processes([proc])


def test_the_hybrid_worker_is_a_draft_worker(hybrid_worker, pair, draft_model):
    with grpc.insecure_channel(hybrid_worker) as channel:
        stub = worker_pb2_grpc.DraftWorkerStub(channel)
        info = wire.model_info_from_pb(stub.Describe(worker_pb2.DescribeRequest(), timeout=30))
        assert info.model.startswith("hybrid(ngram(n=2-4") and info.vocab_size == pair["vocab"]
        assert info.num_parameters == sum(p.numel() for p in draft_model.parameters())
        assert sorted(info.pass_ms) == list(LADDER) and min(info.pass_ms.values()) > 0  # its model's passes, timed

        def call(session, cache_len, tokens, gamma, params=GREEDY):
            request = wire.propose_request(session, cache_len, tokens, gamma, params)
            return wire.proposal_from_pb(stub.Propose(request, timeout=30))

        prompt = [5, 6, 7, 8, 9, 10]
        assert call("s", 0, prompt, 2).draft_tokens == argmax_continuation(draft_model, prompt, 2)
        assert call("s", len(prompt), [5, 6], 2).draft_tokens == [7, 8]
        sampled = call("t", 0, prompt * 2, 2, SamplingParams(temperature=1.0, seed=1))
        assert sampled.draft_tokens == [5, 6]  # the lookup's, as one-entry distributions
        assert [np.frombuffer(d.token_ids, "<i4").tolist() for d in sampled.draft_distributions] == [[5], [6]]
        modelled = call("u", 0, prompt, 2, SamplingParams(temperature=1.0, seed=1))
        assert len(modelled.draft_distributions) == 2  # the model's, over the vocabulary
        assert call("unknown", 4, [1], 2) is None  # a cache miss


def test_hybrid_drafts_keep_greedy_output_identical_to_the_target(hybrid_worker, workers, redis_url, pair,
                                                                  target_model):
    prompts = {"repeating": pair["prompts"][3] * 3, "fresh": pair["prompts"][5]}

    async def run():
        async with running_loop([hybrid_worker], [workers["target"]], redis_url, (pair["eos"],)) as loop:
            out = {}
            for name, prompt in prompts.items():
                for gamma in (4, None):
                    s = await open_session(loop, f"hybrid-greedy-{name}-{gamma}", prompt, GREEDY, 24, gamma)
                    out[name, gamma] = (await generate(loop, s), s.stats)
                    await release(loop, s)
            return out

    out = asyncio.run(run())
    for (name, gamma), (tokens, _) in out.items():
        assert tokens == hf_greedy(target_model, prompts[name], 24), f"{name}, gamma {gamma}"
    assert all(sum(c.gamma for c in stats.per_cycle) > 0 for (_, gamma), (_, stats) in out.items() if gamma)


@pytest.mark.parametrize("prompt_kind", ["repeating", "fresh"])
def test_sampled_first_token_through_hybrid_drafts_follows_the_target(hybrid_worker, workers, redis_url, pair,
                                                                      target_model, prompt_kind):
    """The first token's χ² over many seeds, drafted by lookup (a repeating prompt: one-hot
    drafts) or by the model (a fresh one), under block verification."""
    prompt = pair["prompts"][4] * 3 if prompt_kind == "repeating" else pair["prompts"][6]
    results = sampled_first_tokens(hybrid_worker, workers["target"], redis_url, pair["eos"], prompt, 300, "block",
                                   f"hybrid-{prompt_kind}")
    assert all(gamma > 0 for _, gamma in results), "every first cycle should have drafted"
    assert_first_tokens_follow_the_target(target_model, prompt, [token for token, _ in results])

"""The draft worker and the target verifier as real gRPC services, checked against Hugging Face.

Two tiny random Llama models (different weights) are saved and loaded through from_pretrained.
Both grpc.aio servers live on one background event loop for the whole module; the tests call
them with synchronous stubs (and once with the orchestrator's grpc.aio clients), so no async
test plugin is needed. Token comparisons are exact; probabilities get a small tolerance.
"""

import asyncio
import dataclasses
import math
import time

import grpc
import numpy as np
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from transformers import AutoModelForCausalLM

from tandem.cpu import WINDOW_S
from tandem.math import block as block_math
from tandem.math.params import SamplingParams
from tandem.orchestrator.clients import DraftClient, VerifierClient
from tandem.services import distributions, draft_worker, pass_curve, target_verifier
from tandem.services.runtime import CacheFull, CacheMiss, HFPass, ModelRuntime
from tandem.services.server import start_server
from tandem.v1 import sampling_pb2, worker_pb2, worker_pb2_grpc
from tandem.wire import worker as wire

from support.models import save_random_model
from support.references import hf_argmax, hf_logits, hf_warped
from support.workers import (
    EOS,
    GREEDY,
    MAX_CONTEXT,
    TIMEOUT_S,
    VOCAB,
    BackgroundLoop,
    assert_status,
    block,
    prompt,
    propose,
    verify,
    worker_config,
)

# --- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory) -> str:
    return save_random_model(worker_config(), str(tmp_path_factory.mktemp("workers") / "draft"), seed=1)


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory) -> str:
    return save_random_model(worker_config(), str(tmp_path_factory.mktemp("workers") / "target"), seed=0)


@pytest.fixture(scope="module")
def hf_draft(draft_dir):
    return AutoModelForCausalLM.from_pretrained(draft_dir).eval()


@pytest.fixture(scope="module")
def hf_target(target_dir):
    return AutoModelForCausalLM.from_pretrained(target_dir).eval()


@pytest.fixture(scope="module")
def servers(draft_dir, target_dir):
    """Real grpc.aio servers on 127.0.0.1: {"draft": address, "target": address}."""
    loop = BackgroundLoop()
    started = []
    try:
        addresses = {}
        for kind, add, model_dir in (("draft", draft_worker.add_to_server, draft_dir),
                                     ("target", target_verifier.add_to_server, target_dir)):
            server, port = loop.run(start_server(add, ModelRuntime(model_dir), "127.0.0.1", 0))
            started.append(server)
            addresses[kind] = f"127.0.0.1:{port}"
        yield addresses
    finally:
        for server in started:
            loop.run(server.stop(None))
        loop.close()


@pytest.fixture(scope="module")
def draft_channel(servers):
    with grpc.insecure_channel(servers["draft"]) as channel:
        grpc.channel_ready_future(channel).result(timeout=TIMEOUT_S)
        yield channel


@pytest.fixture(scope="module")
def target_channel(servers):
    with grpc.insecure_channel(servers["target"]) as channel:
        grpc.channel_ready_future(channel).result(timeout=TIMEOUT_S)
        yield channel


@pytest.fixture(scope="module")
def draft_stub(draft_channel):
    return worker_pb2_grpc.DraftWorkerStub(draft_channel)


@pytest.fixture(scope="module")
def target_stub(target_channel):
    return worker_pb2_grpc.TargetVerifierStub(target_channel)


# --- helpers --------------------------------------------------------------------------------


def answer(result):
    """A worker's answer without its timing, for equality checks."""
    if isinstance(result, wire.Proposal):
        return (result.draft_tokens, result.draft_token_probs,
                [(d.token_ids, d.probs) for d in result.draft_distributions])
    return result.target_token_probs, result.recovered_tokens, result.bonus_token


# --- Describe and health --------------------------------------------------------------------


def test_describe_both_workers(draft_stub, target_stub, draft_dir, target_dir):
    for stub, model_dir in ((draft_stub, draft_dir), (target_stub, target_dir)):
        info = wire.model_info_from_pb(stub.Describe(wire.describe_request(), timeout=TIMEOUT_S))
        assert info.vocab_size == VOCAB
        assert info.max_context == MAX_CONTEXT
        assert info.eos_token_ids == (EOS,)
        assert info.model == model_dir
        assert info.device == "cpu" and info.dtype == "float32"
        assert info.num_parameters > 0


def test_a_worker_times_its_pass_at_every_count_of_its_ladder_and_frees_the_cache_it_used(draft_dir):
    runtime = ModelRuntime(draft_dir)
    timed = pass_curve.pass_ms(runtime.forward_pass, ladder=(1, 2, 8), repetitions=2)
    assert sorted(timed) == [1, 2, 8] and min(timed.values()) > 0
    assert runtime.forward_pass.cache_bytes == 0
    small = ModelRuntime(draft_dir, max_cache_bytes=16 * runtime.token_bytes)
    assert pass_curve.pass_ms(small.forward_pass) == {}  # no room for the longest pass: nothing timed


def test_health_check_serving(draft_channel, target_channel):
    for channel in (draft_channel, target_channel):
        health = health_pb2_grpc.HealthStub(channel)
        answer = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=TIMEOUT_S)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING


# --- Propose --------------------------------------------------------------------------------


def test_greedy_propose_matches_hf_argmax_loop(draft_stub, hf_draft):
    for seed, (n, gamma) in enumerate([(8, 6), (1, 4), (20, 1)]):
        tokens = prompt(n, seed=100 + seed)
        proposal = propose(draft_stub, f"greedy-{seed}", 0, tokens, gamma)
        assert proposal is not None
        assert proposal.draft_tokens == hf_argmax(hf_draft, tokens, gamma)
        assert proposal.draft_token_probs == [1.0] * gamma
        assert proposal.draft_distributions == []


def test_propose_continues_a_session_like_a_fresh_one(draft_stub, hf_draft):
    """cache_len equal to what the worker holds of the committed sequence: only the new tokens travel."""
    tokens = prompt(10, seed=3)
    first = propose(draft_stub, "continue", 0, tokens, 3)
    # The orchestrator accepted all three drafted tokens and appended one more.
    committed = tokens + first.draft_tokens + [7]
    # The cache holds 10 + 2 tokens (the last drafted one is never fed); cache_len = 12.
    second = propose(draft_stub, "continue", 12, committed[12:], 4)
    assert second.draft_tokens == hf_argmax(hf_draft, committed, 4)
    assert answer(second) == answer(propose(draft_stub, "continue-fresh", 0, committed, 4))


def test_propose_crops_the_cache_and_is_retry_safe(draft_stub):
    tokens = prompt(10, seed=4)
    params = SamplingParams(temperature=1.0, seed=11)
    propose(draft_stub, "crop", 0, tokens, 4, params)  # holds 10 + 3 tokens now

    # A rollback: the first 6 tokens stay committed, a different continuation follows.
    sequence = tokens[:6] + [5, 9, 13]
    cropped = propose(draft_stub, "crop", 6, sequence[6:], 4, params)
    fresh = propose(draft_stub, "crop-fresh", 0, sequence, 4, params)
    assert cropped.draft_tokens == fresh.draft_tokens
    np.testing.assert_allclose(cropped.draft_token_probs, fresh.draft_token_probs, rtol=1e-5, atol=1e-6)

    # A retry of the very same call (e.g. after a lost answer) gives the very same answer.
    again = propose(draft_stub, "crop", 6, sequence[6:], 4, params)
    assert again.draft_tokens == cropped.draft_tokens
    assert again.draft_token_probs == cropped.draft_token_probs
    assert [(d.token_ids, d.probs) for d in again.draft_distributions] == \
        [(d.token_ids, d.probs) for d in cropped.draft_distributions]

    # Cropping into the drafted tokens the cache held: keep the first drafted one as accepted.
    accepted = sequence + again.draft_tokens[:1] + [21]
    partial = propose(draft_stub, "crop", 10, accepted[10:], 3, params)
    assert partial.draft_tokens == propose(draft_stub, "crop-fresh2", 0, accepted, 3, params).draft_tokens

    # cache_len 0 on a known session starts it over.
    assert propose(draft_stub, "crop", 0, sequence, 4, params).draft_tokens == fresh.draft_tokens


def test_sampled_propose_is_counter_based_and_matches_hf(draft_stub, hf_draft):
    tokens = prompt(8, seed=5)
    params = SamplingParams(temperature=1.0, seed=1234)
    a = propose(draft_stub, "sampled-a", 0, tokens, 5, params)
    b = propose(draft_stub, "sampled-b", 0, tokens, 5, params)
    assert a.draft_tokens == b.draft_tokens and a.draft_token_probs == b.draft_token_probs
    assert len(a.draft_distributions) == 5
    # Each drafted token's probability is the draft model's softmax at that position.
    logits = hf_logits(hf_draft, tokens + a.draft_tokens)[len(tokens) - 1 : -1]  # [γ, V]
    expected = logits.softmax(-1).gather(-1, torch.tensor(a.draft_tokens)[:, None])[:, 0]
    np.testing.assert_allclose(a.draft_token_probs, expected.numpy(), atol=1e-4)
    # Dense distributions travel: they decode to the same softmax rows.
    dense = distributions.unpack(a.draft_distributions, VOCAB)
    np.testing.assert_allclose(dense.numpy(), logits.softmax(-1).numpy(), atol=1e-4)
    # Another seed draws other numbers (with 5 draws over 96 tokens, a different block).
    c = propose(draft_stub, "sampled-c", 0, tokens, 5, SamplingParams(temperature=1.0, seed=99))
    assert c.draft_tokens != a.draft_tokens


def test_propose_cache_miss_then_resend(draft_stub, hf_draft):
    tokens = prompt(9, seed=6)
    # Unknown session.
    assert propose(draft_stub, "miss-unknown", 5, tokens[5:], 3) is None
    # Known session holding fewer tokens than the caller believes.
    propose(draft_stub, "miss-short", 0, tokens[:4], 1)  # holds 4
    assert propose(draft_stub, "miss-short", 7, tokens[7:], 3) is None
    # The caller re-sends the whole sequence with cache_len 0.
    expected = hf_argmax(hf_draft, tokens, 3)
    assert propose(draft_stub, "miss-unknown", 0, tokens, 3).draft_tokens == expected
    assert propose(draft_stub, "miss-short", 0, tokens, 3).draft_tokens == expected
    # And the session then continues normally.
    assert propose(draft_stub, "miss-unknown", 9, expected[:1], 2).draft_tokens == \
        hf_argmax(hf_draft, tokens + expected[:1], 2)


# --- Verify ---------------------------------------------------------------------------------


def test_greedy_verify_matches_hf_target(target_stub, hf_target):
    tokens = prompt(12, seed=7)
    truth = hf_argmax(hf_target, tokens, 6)
    # Blocks: all correct; correct then wrong; wrong first; mixed.
    wrong = [(t + 1) % VOCAB for t in truth]
    blocks = [truth[:5], truth[:2] + wrong[2:4], wrong[:3], [truth[0], wrong[1], truth[2]]]
    for i, draft in enumerate(blocks):
        verification = verify(target_stub, f"vg-{i}", 0, tokens, block(draft))
        argmax = hf_logits(hf_target, tokens + draft)[len(tokens) - 1 :].argmax(-1).tolist()  # [γ+1]
        assert verification.target_token_probs == [1.0 if d == a else 0.0 for d, a in zip(draft, argmax)]
        assert verification.recovered_tokens == argmax[: len(draft)]
        assert verification.bonus_token == argmax[len(draft)]
    # The all-correct block: every position accepted, bonus = the next greedy token.
    first = verify(target_stub, "vg-0", 0, tokens, block(truth[:5]))
    assert first.target_token_probs == [1.0] * 5 and first.bonus_token == truth[5]


def test_verify_continues_after_a_rejection(target_stub, hf_target):
    """The cache held the whole block; the next cache_len crops the rejected part away."""
    tokens = prompt(10, seed=8)
    truth = hf_argmax(hf_target, tokens, 6)
    draft = truth[:2] + [(truth[2] + 5) % VOCAB, 4]
    v = verify(target_stub, "reject", 0, tokens, block(draft))
    assert v.target_token_probs[:2] == [1.0, 1.0] and v.target_token_probs[2] == 0.0
    committed = tokens + truth[:2] + [v.recovered_tokens[2]]
    assert committed[len(tokens):] == truth[:3]
    # The verifier holds 14 tokens, the first 12 of them committed: crop to 12, send the recovered one.
    nxt = verify(target_stub, "reject", 12, committed[12:], block(truth[3:5]))
    assert nxt.target_token_probs == [1.0, 1.0] and nxt.bonus_token == truth[5]


def test_gamma_zero_verify_returns_only_the_bonus(target_stub, hf_target):
    tokens = prompt(6, seed=9)
    v = verify(target_stub, "gamma0", 0, tokens, None)
    assert v.target_token_probs == [] and v.recovered_tokens == []
    assert v.bonus_token == hf_argmax(hf_target, tokens, 1)[0]
    # Plain target decoding, one token per call, through the cache.
    seq = tokens + [v.bonus_token]
    v2 = verify(target_stub, "gamma0", len(tokens), [v.bonus_token], None)
    assert v2.bonus_token == hf_argmax(hf_target, seq, 1)[0]


def test_sampled_verify_matches_hf_softmax_and_is_deterministic(draft_stub, target_stub, hf_target):
    tokens = prompt(10, seed=10)
    params = SamplingParams(temperature=1.0, seed=42)
    proposal = propose(draft_stub, "vs", 0, tokens, 5, params)
    assert len(proposal.draft_distributions) == 5
    assert all(not d.token_ids for d in proposal.draft_distributions)  # dense: no truncation
    v = verify(target_stub, "vs", 0, tokens, proposal, params)
    target_probs = hf_warped(hf_logits(hf_target, tokens + proposal.draft_tokens)[len(tokens) - 1 :], 1.0)
    expected = target_probs[:5].gather(-1, torch.tensor(proposal.draft_tokens)[:, None])[:, 0]
    np.testing.assert_allclose(v.target_token_probs, expected.numpy(), atol=1e-4)
    assert len(v.recovered_tokens) == 5
    assert all(0 <= t < VOCAB for t in v.recovered_tokens) and 0 <= v.bonus_token < VOCAB
    # Counter-based randomness: the same call (same seed, same positions) answers the same,
    # on the same session (a retry) and on another one (another replica).
    assert answer(verify(target_stub, "vs", 0, tokens, proposal, params)) == answer(v)
    assert answer(verify(target_stub, "vs-other", 0, tokens, proposal, params)) == answer(v)


def test_block_verify_answers_h_from_the_same_pass(draft_stub, target_stub, hf_draft, hf_target):
    """VERIFICATION_BLOCK: the same target probabilities and bonus, plus h computed from HF's own
    distributions (tandem.math.block), and recovered tokens from the block residuals."""
    tokens = prompt(10, seed=12)
    params = SamplingParams(temperature=1.0, seed=5)
    proposal = propose(draft_stub, "vb", 0, tokens, 4, params)
    token_level = verify(target_stub, "vb", 0, tokens, proposal, params)
    v = verify(target_stub, "vb", 0, tokens, proposal, params, verification="block")
    assert token_level.block_accept_probs == [] and len(v.block_accept_probs) == 4
    np.testing.assert_allclose(v.target_token_probs, token_level.target_token_probs, atol=1e-6)
    assert v.bonus_token == token_level.bonus_token
    seq = tokens + proposal.draft_tokens
    target_probs = hf_warped(hf_logits(hf_target, seq)[len(tokens) - 1:], 1.0).double()  # [γ+1, V]
    draft_probs = hf_warped(hf_logits(hf_draft, seq)[len(tokens) - 1:-1], 1.0).double()  # [γ, V]
    drafted = torch.tensor(proposal.draft_tokens)
    ratios = (target_probs[:4].gather(-1, drafted[:, None]) / draft_probs.gather(-1, drafted[:, None]))[:, 0]
    p = block_math.token_prefix_weights(ratios.tolist())  # [γ+1]
    for i in range(1, 4):
        z = (p[i] * target_probs[i] - draft_probs[i]).clamp(min=0).sum()
        h = 1.0 if p[i] >= 1 else (z / (z + 1 - p[i])).item()
        assert v.block_accept_probs[i - 1] == pytest.approx(h, abs=1e-4)
    assert v.block_accept_probs[3] == pytest.approx(p[4], abs=1e-4)
    greedy = verify(target_stub, "vb-greedy", 0, tokens, block(proposal.draft_tokens), GREEDY, verification="block")
    assert greedy.block_accept_probs == []  # greedy: block verification is token-level verification


def test_sampled_verify_with_top_k_uses_sparse_distributions(draft_stub, target_stub, hf_draft, hf_target):
    tokens = prompt(10, seed=11)
    params = SamplingParams(temperature=1.0, top_k=5, seed=7)
    proposal = propose(draft_stub, "vk", 0, tokens, 4, params)
    # Sparse on the wire: 5 token ids and 5 probabilities per position.
    for d in proposal.draft_distributions:
        assert len(d.token_ids) == 5 * 4 and len(d.probs) == 5 * 4
    draft_logits = hf_logits(hf_draft, tokens + proposal.draft_tokens)[len(tokens) - 1 : -1]
    draft_probs = hf_warped(draft_logits, 1.0, top_k=5)
    np.testing.assert_allclose(distributions.unpack(proposal.draft_distributions, VOCAB).numpy(),
                               draft_probs.numpy(), atol=1e-5)
    np.testing.assert_allclose(
        proposal.draft_token_probs,
        draft_probs.gather(-1, torch.tensor(proposal.draft_tokens)[:, None])[:, 0].numpy(), atol=1e-5)

    v = verify(target_stub, "vk", 0, tokens, proposal, params)
    target_probs = hf_warped(hf_logits(hf_target, tokens + proposal.draft_tokens)[len(tokens) - 1 :], 1.0, top_k=5)
    expected = target_probs[:4].gather(-1, torch.tensor(proposal.draft_tokens)[:, None])[:, 0]
    np.testing.assert_allclose(v.target_token_probs, expected.numpy(), atol=1e-4)
    # Recovered tokens come from norm(max(0, target - draft)): inside the target's top 5, and
    # never where the draft puts at least as much mass as the target.
    for i, t in enumerate(v.recovered_tokens):
        assert target_probs[i, t] > 0
        assert target_probs[i, t] > draft_probs[i, t] - 1e-6
    assert target_probs[4, v.bonus_token] > 0
    assert answer(verify(target_stub, "vk", 0, tokens, proposal, params)) == answer(v)


def test_verify_cache_miss_then_resend(target_stub, hf_target):
    tokens = prompt(8, seed=12)
    draft = [5, 6]
    assert verify(target_stub, "vmiss", 3, tokens[3:], block(draft)) is None
    verify(target_stub, "vmiss-short", 0, tokens[:2], None)  # holds 2
    assert verify(target_stub, "vmiss-short", 5, tokens[5:], block(draft)) is None
    argmax = hf_logits(hf_target, tokens + draft)[len(tokens) - 1 :].argmax(-1).tolist()
    for session in ("vmiss", "vmiss-short"):
        v = verify(target_stub, session, 0, tokens, block(draft))
        assert v.recovered_tokens == argmax[:2] and v.bonus_token == argmax[2]


def test_raw_response_flags_cache_miss(draft_stub, target_stub):
    msg = draft_stub.Propose(wire.propose_request("raw-miss", 4, [5], 2, GREEDY), timeout=TIMEOUT_S)
    assert msg.cache_miss and not msg.draft_tokens
    msg = target_stub.Verify(wire.verify_request("raw-miss", 4, [5], None, GREEDY), timeout=TIMEOUT_S)
    assert msg.cache_miss and not msg.recovered_tokens


# --- Release --------------------------------------------------------------------------------


def test_answers_carry_the_workers_cpu_per_call_once_measured(target_stub):
    """Batching.handling_ms: the worker's CPU per call outside its model thread, over a window
    of its calls (tandem.cpu), what the γ policy charges a call instead of its wall time."""
    tokens, deadline, handling = prompt(5, seed=90), time.monotonic() + 10 * WINDOW_S, 0.0
    while handling == 0.0 and time.monotonic() < deadline:
        handling = verify(target_stub, "cpu", 0, tokens, None).batching.handling_ms
    assert 0 < handling < 1000


def test_release(draft_stub, target_stub):
    propose(draft_stub, "rel", 0, prompt(5, seed=13), 2)
    verify(target_stub, "rel", 0, prompt(5, seed=13), None)
    for stub in (draft_stub, target_stub):
        assert stub.Release(wire.release_request("rel"), timeout=TIMEOUT_S).released is True
        assert stub.Release(wire.release_request("rel"), timeout=TIMEOUT_S).released is False
    # A released session is a miss for any cache_len > 0.
    assert propose(draft_stub, "rel", 5, [3], 2) is None
    assert verify(target_stub, "rel", 5, [3], None) is None


# --- the orchestrator's grpc.aio clients ----------------------------------------------------


def test_aio_clients_round_trip(servers, hf_draft, hf_target):
    tokens = prompt(7, seed=14)

    async def main():
        draft = DraftClient(servers["draft"], timeout_s=TIMEOUT_S)
        target = VerifierClient(servers["target"], timeout_s=TIMEOUT_S)
        try:
            d_info, t_info = await draft.describe(), await target.describe()
            proposal, draft_ms, draft_bytes, draft_fed = await draft.propose("aio", 0, tokens, 3, GREEDY)
            verification, verify_ms, _, verify_fed = await target.verify("aio", 0, tokens, proposal, GREEDY)
            miss = (await draft.propose("aio-unknown", 3, [4], 3, GREEDY)).answer
            released = await draft.release("aio"), await target.release("aio")
            assert draft_bytes > 4 * len(tokens)  # at least the packed prompt went out
            assert draft_fed == verify_fed == len(tokens)  # what the policy learns steadiness from
            return d_info, t_info, proposal, verification, miss, released, draft_ms, verify_ms
        finally:
            await draft.close()
            await target.close()

    d_info, t_info, proposal, verification, miss, released, draft_ms, verify_ms = asyncio.run(main())
    assert d_info.vocab_size == t_info.vocab_size == VOCAB
    assert proposal.draft_tokens == hf_argmax(hf_draft, tokens, 3)
    assert proposal.compute_ms > 0 and draft_ms > 0 and verify_ms > 0
    argmax = hf_logits(hf_target, tokens + proposal.draft_tokens)[len(tokens) - 1 :].argmax(-1).tolist()
    assert verification.recovered_tokens == argmax[:3] and verification.bonus_token == argmax[3]
    assert verification.compute_ms > 0
    # What the work cost the device: CPU time here, at most the wall time it took on each of torch's
    # threads (with more than one, the process's CPU time: tandem.services.batching).
    for answer in (proposal, verification):
        assert 0 < answer.batching.cost_ms <= torch.get_num_threads() * answer.compute_ms + 1.0
    assert miss is None
    assert released == (True, True)


# --- batched calls: rows checked, run and answered on their own ------------------------------


def test_a_batched_verify_answers_each_row_as_its_own_call_would(target_stub, hf_target):
    """Good rows get what Verify gives them; a bad row its status naming the field; a row of an
    unknown session its cache miss: none of them changes another's answer."""
    rows = [prompt(6, seed=40 + i) for i in range(3)]
    drafts = [[(7 * i + 3) % VOCAB, (5 * i + 1) % VOCAB] for i in range(3)]

    def row(session_id, tokens, draft, cache_len=0):
        return wire.verify_request(session_id, cache_len, tokens, wire.Proposal(draft, [1.0] * len(draft), [], 0.0),
                                   GREEDY)

    request = wire.batch_request("VerifyBatch", [
        row("batch-0", rows[0], drafts[0]),
        row("batch-bad", [VOCAB + 5], drafts[1]),  # a token id outside the vocabulary
        row("batch-1", rows[1], drafts[1]),
        row("batch-unknown", [3], drafts[2], cache_len=4),  # holds nothing: a cache miss
        row("batch-2", rows[2], drafts[2]),
    ])
    answers = wire.batch_answers(target_stub.VerifyBatch(request, timeout=TIMEOUT_S))
    assert len(answers) == 5
    bad, miss = answers[1], wire.verification_from_pb(answers[3])
    assert isinstance(bad, wire.Failure) and bad.code == grpc.StatusCode.INVALID_ARGUMENT and "tokens" in bad.message
    assert miss is None
    for i, answer in zip(range(3), (answers[0], answers[2], answers[4])):
        verification = wire.verification_from_pb(answer)
        argmax = hf_logits(hf_target, rows[i] + drafts[i])[len(rows[i]) - 1:].argmax(-1).tolist()
        assert verification.recovered_tokens == argmax[:2] and verification.bonus_token == argmax[2]
        assert verification.batching.sessions >= 3  # the three good rows shared their pass
    for session_id in ("batch-0", "batch-1", "batch-2"):
        target_stub.Release(wire.release_request(session_id), timeout=TIMEOUT_S)


def test_a_batched_propose_over_its_stream_answers_in_order(draft_stub, hf_draft):
    rows = [prompt(5, seed=50 + i) for i in range(4)]
    gammas = [1, 3, 2, 4]
    requests = [wire.batch_request("ProposeBatch", [wire.propose_request(f"pb-{b}-{i}", 0, t, g, GREEDY)
                                                    for i, (t, g) in enumerate(zip(rows, gammas))]) for b in range(2)]
    responses = list(draft_stub.ProposeBatchStream(iter(requests), timeout=TIMEOUT_S))
    assert len(responses) == 2
    for response in responses:
        proposals = [wire.proposal_from_pb(answer) for answer in wire.batch_answers(response)]
        assert [p.draft_tokens for p in proposals] == [hf_argmax(hf_draft, t, g) for t, g in zip(rows, gammas)]


def test_a_call_from_a_taken_over_writer_is_refused_after_the_new_writers(target_stub, hf_target):
    """Rows run in order: the first writer (epoch 1) verifies, a resume's writer (epoch 2) verifies
    after it, and the first writer's late row is refused with ABORTED naming writer_epoch; the
    session's cache stays the new writer's (its next call continues it exactly)."""
    tokens = prompt(8, seed=90)

    def row(epoch, draft, cache_len=0, fed=tokens):
        return wire.verify_request("epochs", cache_len, fed, block(draft), GREEDY, writer_epoch=epoch)

    request = wire.batch_request("VerifyBatch", [row(1, [5, 6]), row(2, [7, 8]), row(1, [9, 10, 11])])
    answers = wire.batch_answers(target_stub.VerifyBatch(request, timeout=TIMEOUT_S))
    assert wire.verification_from_pb(answers[0]) and wire.verification_from_pb(answers[1])
    late = answers[2]
    assert isinstance(late, wire.Failure) and late.code == grpc.StatusCode.ABORTED
    assert "writer_epoch" in late.message and "epoch 2" in late.message
    # The new writer's next call, fed past its block's first token: what the target gives that sequence.
    sequence = tokens + [7]
    nxt = wire.verification_from_pb(target_stub.Verify(row(2, [], len(tokens) + 1, [8]), timeout=TIMEOUT_S))
    assert nxt.bonus_token == int(hf_logits(hf_target, sequence + [8])[-1].argmax())
    with pytest.raises(grpc.RpcError) as refused:  # a unary call of the old writer: refused the same way
        target_stub.Verify(row(1, []), timeout=TIMEOUT_S)
    assert_status(refused, grpc.StatusCode.ABORTED, "writer_epoch")
    # Its release closes epoch 2 as well: a call of it arriving late is refused and makes no
    # cache; a later writer (a resume: epoch 3) is taken.
    assert target_stub.Release(wire.release_request("epochs", 2), timeout=TIMEOUT_S).released
    with pytest.raises(grpc.RpcError) as refused:
        target_stub.Verify(row(2, [5]), timeout=TIMEOUT_S)
    assert_status(refused, grpc.StatusCode.ABORTED, "writer_epoch")
    assert not target_stub.Release(wire.release_request("epochs"), timeout=TIMEOUT_S).released  # nothing made
    assert wire.verification_from_pb(target_stub.Verify(row(3, [5]), timeout=TIMEOUT_S))
    target_stub.Release(wire.release_request("epochs", 3), timeout=TIMEOUT_S)


def test_describe_states_the_workers_message_limits(draft_stub):
    info = wire.model_info_from_pb(draft_stub.Describe(wire.describe_request(), timeout=TIMEOUT_S))
    assert info.max_request_bytes > 0 and info.max_response_bytes > 0


def test_calls_made_in_one_turn_go_as_one_batch_each_answered_alone(servers, hf_draft):
    """Concurrent Propose calls reach the worker as the rows of one batched call; a bad row fails
    its own call only; rows cut into batches within the worker's limits get the same answers."""
    rows = [prompt(4 + i, seed=60 + i) for i in range(6)]

    async def main(limit_rows: int | None):
        draft = DraftClient(servers["draft"], timeout_s=TIMEOUT_S)
        batches = []
        exchange = draft._exchange

        async def counting(request):
            batches.append(len(request.rows))
            return await exchange(request)

        draft._exchange = counting
        try:
            info = await draft.describe()
            if limit_rows:  # room for about limit_rows answers of γ = 2 per batch
                one = DraftClient.answer_bound(wire.propose_request("x", 0, [1], 2, GREEDY), info.vocab_size)
                draft.info = dataclasses.replace(info, max_response_bytes=limit_rows * (one + 16) + 20)
            calls = [draft.propose(f"turn-{limit_rows}-{i}", 0, t, 2, GREEDY) for i, t in enumerate(rows)]
            calls.insert(3, draft.propose("turn-bad", 0, [VOCAB + 1], 2, GREEDY))
            results = await asyncio.gather(*calls, return_exceptions=True)
            for i in range(len(rows)):
                await draft.release(f"turn-{limit_rows}-{i}")
            return batches, results
        finally:
            await draft.close()

    for limit_rows, expected in ((None, [7]), (2, [2, 2, 2, 1])):
        batches, results = asyncio.run(main(limit_rows))
        assert batches == expected
        bad = results.pop(3)
        assert isinstance(bad, grpc.aio.AioRpcError) and bad.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert [r.answer.draft_tokens for r in results] == [hf_argmax(hf_draft, t, 2) for t in rows]


def test_a_restarted_worker_gets_new_batch_streams_not_the_ended_ones(draft_dir):
    """A batch stream left open to a worker that then restarts has ended: the next call must not
    write to it (that raises no gRPC status), but answer, or fail with a status that moves the
    session to another worker."""
    runtime = ModelRuntime(draft_dir)
    loop = BackgroundLoop()
    try:
        server, port = loop.run(start_server(draft_worker.add_to_server, runtime, "127.0.0.1", 0))

        async def call(draft):
            try:
                return (await draft.propose("restart", 0, prompt(5, seed=70), 2, GREEDY)).answer.draft_tokens
            except grpc.aio.AioRpcError as e:
                return e.code()

        async def main():
            draft = DraftClient(f"127.0.0.1:{port}", timeout_s=TIMEOUT_S)
            try:
                await draft.describe()
                first = await call(draft)
                loop.run(server.stop(None))
                servers.append(loop.run(start_server(draft_worker.add_to_server, runtime, "127.0.0.1", port))[0])
                after = []
                while not after or (after[-1] != first and len(after) < 50):  # until the channel reconnects
                    after.append(await call(draft))
                    await asyncio.sleep(0.05)
                return first, after
            finally:
                await draft.close()

        servers = []
        first, after = asyncio.run(main())
        assert isinstance(first, list) and len(first) == 2
        assert all(a == grpc.StatusCode.UNAVAILABLE for a in after[:-1]) and after[-1] == first, after
    finally:
        for server in servers:
            loop.run(server.stop(None))
        loop.close()


# --- the runtime's LRU eviction (no server) -------------------------------------------------


def test_runtime_evicts_least_recently_used(draft_dir):
    block = 16 * ModelRuntime(draft_dir).token_bytes  # a session of up to 16 tokens holds one block
    runtime = ModelRuntime(draft_dir, max_cache_bytes=int(2.5 * block))  # room for two such sessions
    runtime.extend("a", 0, prompt(10, seed=15))
    assert runtime.cache_bytes == block
    runtime.extend("b", 0, prompt(10, seed=16))
    assert runtime.num_sessions == 2
    runtime.extend("a", 10, [5])  # touch a: b is now the least recently used
    runtime.extend("c", 0, prompt(10, seed=17))
    assert runtime.num_sessions == 2 and runtime.cache_bytes == 2 * block
    with pytest.raises(CacheMiss):
        runtime.extend("b", 10, [5])
    runtime.extend("a", 11, [6])  # a and c survived
    runtime.extend("c", 10, [6])
    # b comes back after a re-prefill.
    runtime.extend("b", 0, prompt(10, seed=16) + [5])


def test_runtime_with_room_for_one_block(draft_dir):
    """The bound holds: a session that cannot fit even alone is refused (RESOURCE_EXHAUSTED,
    naming its tokens), and one that fits evicts the others."""
    runtime = ModelRuntime(draft_dir, max_cache_bytes=1)  # one block, the least a pool holds
    logits = runtime.extend("old", 0, prompt(8, seed=18))
    assert logits.shape == (8, VOCAB)
    runtime.extend("old", 8, [4])
    runtime.extend("new", 0, prompt(8, seed=19))
    assert runtime.num_sessions == 1
    with pytest.raises(CacheMiss):
        runtime.extend("old", 9, [4])
    with pytest.raises(CacheFull) as refused:
        runtime.extend("long", 0, prompt(20, seed=20))
    assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED and refused.value.field == "tokens"
    assert runtime.num_sessions == 0 and runtime.cache_bytes == 0  # what it evicted to try stays evicted
    assert not runtime.release("old") and not runtime.release("long")


def test_runtime_logits_match_hf_after_crop(draft_dir, hf_draft):
    runtime = ModelRuntime(draft_dir)
    tokens = prompt(12, seed=20)
    runtime.extend("s", 0, tokens)
    other = tokens[:5] + [7, 8, 9]
    logits = runtime.extend("s", 5, other[5:])  # crop 12 → 5, extend by 3
    torch.testing.assert_close(logits, hf_logits(hf_draft, other)[5:], atol=1e-5, rtol=1e-4)
    with pytest.raises(CacheMiss):
        runtime.extend("s", 9, [1])


def test_runtime_gemm_layout_keeps_the_model_and_keep_returns_the_tail(tmp_path):
    """Hugging Face's pass (a model the Llama pass does not cover): the column-major weights
    hold the same values (tied output embedding included), and keep=n returns the last n
    positions' logits, equal to Hugging Face's."""
    config = worker_config()
    config.tie_word_embeddings = True
    config.attention_bias = True
    path = save_random_model(config, str(tmp_path / "tied"), seed=3)
    hf = AutoModelForCausalLM.from_pretrained(path).eval()
    runtime = ModelRuntime(path)
    assert isinstance(runtime.forward_pass, HFPass)
    assert runtime.info.num_parameters == sum(p.numel() for p in hf.parameters())
    ours, theirs = dict(runtime.forward_pass.model.named_modules()), dict(hf.named_modules())
    linears = [n for n, m in ours.items() if isinstance(m, torch.nn.Linear)]
    assert "lm_head" in linears and len(linears) == 2 * 7 + 1
    for name in linears:
        assert ours[name].weight.stride() == (1, ours[name].weight.shape[0]), name  # column-major
        assert torch.equal(ours[name].weight, theirs[name].weight), name
    embed = runtime.forward_pass.model.get_input_embeddings().weight
    assert embed.is_contiguous() and torch.equal(embed, hf.get_input_embeddings().weight)
    tokens = prompt(12, seed=21)
    logits = runtime.extend("s", 0, tokens, keep=3)
    assert logits.shape == (3, VOCAB)
    torch.testing.assert_close(logits, hf_logits(hf, tokens)[-3:], atol=1e-5, rtol=1e-4)


# --- bad requests ---------------------------------------------------------------------------


def _dist(token_ids=None, probs=None) -> sampling_pb2.DraftDistribution:
    return sampling_pb2.DraftDistribution(
        token_ids=b"" if token_ids is None else np.asarray(token_ids, dtype="<i4").tobytes(),
        probs=b"" if probs is None else np.asarray(probs, dtype="<f4").tobytes(),
    )


def _propose_pb(**kw) -> worker_pb2.ProposeRequest:
    args = dict(session_id="bad", cache_len=0, tokens=[5, 6, 7], gamma=2, params=GREEDY)
    args.update(kw)
    return wire.propose_request(args["session_id"], args["cache_len"], args["tokens"], args["gamma"],
                                 args["params"])


def _verify_pb(draft_tokens=(8, 9), dists=(), **kw) -> worker_pb2.VerifyRequest:
    args = dict(session_id="bad", cache_len=0, tokens=[5, 6, 7], params=GREEDY)
    args.update(kw)
    proposal = wire.Proposal(list(draft_tokens), [1.0] * len(draft_tokens), list(dists), 0.0)
    return wire.verify_request(args["session_id"], args["cache_len"], args["tokens"], proposal, args["params"])


def _with(request, **fields):
    for name, value in fields.items():
        setattr(request, name, value)
    return request


SAMPLED = SamplingParams(temperature=1.0, seed=3)
UNIFORM = [1.0 / VOCAB] * VOCAB
INVALID = grpc.StatusCode.INVALID_ARGUMENT
OUT_OF_RANGE = grpc.StatusCode.OUT_OF_RANGE

BAD_PROPOSALS = {
    "empty-session": (_propose_pb(session_id=""), INVALID, "session_id"),
    "long-session": (_propose_pb(session_id="x" * 129), INVALID, "session_id"),
    "empty-tokens": (_propose_pb(tokens=[]), INVALID, "tokens"),
    "token-too-big": (_propose_pb(tokens=[5, VOCAB, 6]), INVALID, "tokens[1]"),
    "token-negative": (_propose_pb(tokens=[5, 6, -1]), INVALID, "tokens[2]"),
    "gamma-0": (_propose_pb(gamma=0), INVALID, "gamma"),
    "gamma-1000": (_propose_pb(gamma=1000), INVALID, "gamma"),
    "tokens-overflow": (_propose_pb(tokens=[5] * (MAX_CONTEXT + 1)), OUT_OF_RANGE, "tokens"),
    "cache-len-overflow": (_propose_pb(cache_len=MAX_CONTEXT, tokens=[5]), OUT_OF_RANGE, "tokens"),
    "gamma-overflow": (_propose_pb(tokens=[5] * (MAX_CONTEXT - 2), gamma=4), OUT_OF_RANGE, "gamma"),
    "temperature-negative": (_propose_pb(params=SamplingParams(temperature=-0.5)), INVALID,
                             "sampling.temperature"),
    "temperature-nan": (_propose_pb(params=SamplingParams(temperature=math.nan)), INVALID,
                        "sampling.temperature"),
    "temperature-inf": (_propose_pb(params=SamplingParams(temperature=math.inf)), INVALID,
                        "sampling.temperature"),
    "top-p-0": (_propose_pb(params=SamplingParams(top_p=0.0)), INVALID, "sampling.top_p"),
    "top-p-1.5": (_propose_pb(params=SamplingParams(top_p=1.5)), INVALID, "sampling.top_p"),
    "top-p-nan": (_propose_pb(params=SamplingParams(top_p=math.nan)), INVALID, "sampling.top_p"),
    "top-k-negative": (_propose_pb(params=SamplingParams(top_k=-1)), INVALID, "sampling.top_k"),
}

BAD_VERIFICATIONS = {
    "empty-session": (_verify_pb(session_id=""), INVALID, "session_id"),
    "empty-tokens": (_verify_pb(tokens=[]), INVALID, "tokens"),
    "token-too-big": (_verify_pb(tokens=[5, 6, VOCAB + 7]), INVALID, "tokens[2]"),
    "token-negative": (_verify_pb(tokens=[-3]), INVALID, "tokens[0]"),
    "draft-token-too-big": (_verify_pb(draft_tokens=[8, VOCAB]), INVALID, "draft_tokens[1]"),
    "draft-token-negative": (_verify_pb(draft_tokens=[-1]), INVALID, "draft_tokens[0]"),
    "too-many-draft-tokens": (_verify_pb(draft_tokens=[8] * 65), INVALID, "draft_tokens"),
    "tokens-overflow": (_verify_pb(tokens=[5] * (MAX_CONTEXT + 1), draft_tokens=()), OUT_OF_RANGE, "tokens"),
    "draft-overflow": (_verify_pb(tokens=[5] * (MAX_CONTEXT - 1)), OUT_OF_RANGE, "draft_tokens"),
    "temperature-negative": (_verify_pb(params=SamplingParams(temperature=-1.0)), INVALID,
                             "sampling.temperature"),
    "temperature-nan": (_verify_pb(params=SamplingParams(temperature=math.nan)), INVALID,
                        "sampling.temperature"),
    "top-p-0": (_verify_pb(params=SamplingParams(top_p=0.0)), INVALID, "sampling.top_p"),
    "top-p-1.5": (_verify_pb(params=SamplingParams(top_p=1.5)), INVALID, "sampling.top_p"),
    "top-k-negative": (_verify_pb(params=SamplingParams(top_k=-2)), INVALID, "sampling.top_k"),
    "sampled-without-distributions": (_verify_pb(params=SAMPLED), INVALID, "draft_distributions"),
    "distribution-count": (_verify_pb(dists=[_dist(probs=UNIFORM)], params=SAMPLED), INVALID,
                           "draft_distributions"),
    "dense-wrong-length": (_verify_pb(dists=[_dist(probs=UNIFORM)] * 1 + [_dist(probs=UNIFORM[:-1])],
                                      params=SAMPLED), INVALID, "draft_distributions"),
    "sparse-length-mismatch": (_verify_pb(dists=[_dist([8, 9, 10], [0.5, 0.5])] * 2, params=SAMPLED),
                               INVALID, "draft_distributions"),
    "sparse-id-too-big": (_verify_pb(dists=[_dist([8, VOCAB], [0.5, 0.5])] * 2, params=SAMPLED), INVALID,
                          "draft_distributions"),
    "sparse-id-negative": (_verify_pb(dists=[_dist([-1, 8], [0.5, 0.5])] * 2, params=SAMPLED), INVALID,
                           "draft_distributions"),
    "sparse-ragged-bytes": (_verify_pb(dists=[sampling_pb2.DraftDistribution(token_ids=b"\x08\x00\x00",
                                                                             probs=b"\x00\x00\x80\x3f")] * 2,
                                       params=SAMPLED), INVALID, "draft_distributions"),
    "dense-ragged-bytes": (_verify_pb(dists=[sampling_pb2.DraftDistribution(probs=b"\x00" * 5)] * 2,
                                      params=SAMPLED), INVALID, "draft_distributions"),
    "negative-prob": (_verify_pb(dists=[_dist([8, 9], [1.5, -0.5])] * 2, params=SAMPLED), INVALID,
                      "draft_distributions"),
    "nan-prob": (_verify_pb(dists=[_dist(probs=[math.nan] * VOCAB)] * 2, params=SAMPLED), INVALID,
                 "draft_distributions"),
    "unknown-verification": (_with(_verify_pb(), verification=7), INVALID, "verification"),
}


@pytest.mark.parametrize("name", list(BAD_PROPOSALS))
def test_bad_propose_requests(draft_stub, name):
    request, code, field = BAD_PROPOSALS[name]
    with pytest.raises(grpc.RpcError) as excinfo:
        draft_stub.Propose(request, timeout=TIMEOUT_S)
    assert_status(excinfo, code, field)
    # The worker keeps serving.
    assert len(propose(draft_stub, "after-bad", 0, [5, 6, 7], 2).draft_tokens) == 2


@pytest.mark.parametrize("name", list(BAD_VERIFICATIONS))
def test_bad_verify_requests(target_stub, name):
    request, code, field = BAD_VERIFICATIONS[name]
    with pytest.raises(grpc.RpcError) as excinfo:
        target_stub.Verify(request, timeout=TIMEOUT_S)
    assert_status(excinfo, code, field)
    assert len(verify(target_stub, "after-bad", 0, [5, 6, 7], block([8, 9])).recovered_tokens) == 2


def test_bad_request_leaves_the_session_alone(draft_stub, hf_draft):
    tokens = prompt(6, seed=21)
    propose(draft_stub, "kept", 0, tokens, 1)  # holds 6
    with pytest.raises(grpc.RpcError):
        draft_stub.Propose(wire.propose_request("kept", 6, [VOCAB], 2, GREEDY), timeout=TIMEOUT_S)
    assert propose(draft_stub, "kept", 6, [9], 2).draft_tokens == hf_argmax(hf_draft, tokens + [9], 2)


@pytest.mark.parametrize("method,channel_name", [
    ("/tandem.v1.DraftWorker/Propose", "draft_channel"),
    ("/tandem.v1.TargetVerifier/Verify", "target_channel"),
    ("/tandem.v1.DraftWorker/Release", "draft_channel"),
])
def test_garbage_bytes_on_the_port(request, draft_stub, target_stub, method, channel_name):
    channel = request.getfixturevalue(channel_name)
    raw = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
    for garbage in (b"\xff\xff\xff\xff", b"\x0a\xff\xff\xff\xff\x0f", bytes(range(256)) * 4):
        with pytest.raises(grpc.RpcError):
            raw(garbage, timeout=TIMEOUT_S)
    assert len(propose(draft_stub, "after-garbage", 0, [5, 6], 2).draft_tokens) == 2
    assert len(verify(target_stub, "after-garbage", 0, [5, 6], block([7])).recovered_tokens) == 1

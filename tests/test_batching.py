"""Continuous batching (tandem.services.batching): a batched forward pass against each session's
own, the batcher's rounds (sessions joining and leaving, the token budget, one session's miss or
error leaving the others alone), and batched jobs giving the answers of jobs run alone."""

import threading
import time
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tandem import rules
from tandem.math.params import SamplingParams
from tandem.math.sampling import warp
from tandem.math.tree import Tree
from tandem.services import distributions
from tandem.services.batching import MAX_DEFERRALS, Batcher
from tandem.services.draft_worker import propose, propose_ahead, propose_tree
from tandem.services.fencing import Superseded, WriterEpochs
from tandem.services.runtime import CacheMiss, ModelRuntime, Step
from tandem.services.target_verifier import verify, verify_tree

from support.jobs import run_alone
from support.models import llama_config, save_random_model
from support.workers import prompt

VOCAB = 96
TIMEOUT_S = 60
GREEDY = SamplingParams(temperature=0.0, seed=0)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    config = llama_config(vocab_size=VOCAB, layers=2, hidden=64, eos_token_id=2, max_context=256, init_std=0.1)
    return save_random_model(config, str(tmp_path_factory.mktemp("batching") / "m"), seed=11)


def _cache(runtime: ModelRuntime, session_id: str) -> torch.Tensor:
    session, pool = runtime._sessions[session_id], runtime.forward_pass.pool
    return pool.flat()[:, :, :, pool.slots(session.cache, 0, session.length)]  # [layers, 2, kv, length, d]


# --- the batched forward pass ----------------------------------------------------------------


def test_batched_forward_equals_each_sessions_own(model_dir):
    alone, batched = ModelRuntime(model_dir), ModelRuntime(model_dir)
    assert batched.forward_pass.batched
    prefixes = {f"s{i}": prompt(n, seed=i) for i, n in enumerate([3, 17, 40, 1, 9])}
    for sid, tokens in prefixes.items():
        alone.extend(sid, 0, tokens)
    first = batched.extend_batch([Step(sid, 0, tokens) for sid, tokens in prefixes.items()])
    for (sid, tokens), got in zip(prefixes.items(), first):
        torch.testing.assert_close(got, alone.extend(sid, 0, tokens), atol=1e-4, rtol=1e-4)
    # Then steps of different lengths, with crops (a rejected block's tail cut away).
    steps = [Step("s0", 3, prompt(5, 20), keep=5), Step("s1", 12, prompt(1, 21), keep=1),
             Step("s2", 40, prompt(9, 22), keep=3), Step("s3", 1, prompt(2, 23), keep=1),
             Step("s4", 6, prompt(4, 24), keep=0)]
    got = batched.extend_batch(steps)
    for step, logits in zip(steps, got):
        want = alone.extend(step.session_id, step.cache_len, step.tokens, step.keep)
        assert logits.shape == want.shape
        torch.testing.assert_close(logits, want, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(_cache(batched, step.session_id), _cache(alone, step.session_id),
                                   atol=1e-5, rtol=1e-5)


def test_one_sessions_cache_miss_leaves_the_others_in_its_pass(model_dir):
    runtime = ModelRuntime(model_dir)
    runtime.extend("held", 0, prompt(6, 1))
    got = runtime.extend_batch([Step("held", 6, [7]), Step("unknown", 4, [8]), Step("new", 0, prompt(3, 2))])
    assert isinstance(got[1], CacheMiss)
    assert got[0].shape == (1, VOCAB) and got[2].shape == (3, VOCAB)
    assert runtime._sessions["held"].length == 7 and "unknown" not in runtime._sessions


# --- the batcher -----------------------------------------------------------------------------


def _proposals(batcher_or_runtime, requests):
    """Draft jobs for (session, cache_len, tokens, γ) requests, all submitted at once."""
    if isinstance(batcher_or_runtime, Batcher):
        futures = [batcher_or_runtime.submit(propose(*r, GREEDY)) for r in requests]
        return [f.result(TIMEOUT_S) for f in futures]
    return [run_alone(batcher_or_runtime, propose(*r, GREEDY)) for r in requests]


def test_batched_drafting_with_different_gammas_gives_each_sessions_own_draft(model_dir):
    """Sessions with γ 1..8 draft together: each leaves the batch when its block is done, and
    its tokens are those it drafts alone."""
    requests = [(f"d{i}", 0, prompt(4 + 3 * i, seed=30 + i), 1 + i) for i in range(8)]
    alone = _proposals(ModelRuntime(model_dir), requests)
    batcher = Batcher(ModelRuntime(model_dir))
    batched = _proposals(batcher, requests)
    for a, b in zip(alone, batched):
        assert b.draft_tokens == a.draft_tokens
        assert b.compute_ms > 0
        assert b.batching.passes == len(b.draft_tokens)  # one step per drafted token
        assert b.batching.passes <= b.batching.sessions <= 8 * b.batching.passes


def test_a_session_joins_a_running_batch(model_dir):
    """A job submitted while others are mid-draft joins the next round and gets its own answer."""
    runtime = ModelRuntime(model_dir)
    batcher = Batcher(runtime)
    gate = threading.Event()
    batcher.submit(gate.wait)  # hold the model thread until everything is queued
    long = [batcher.submit(propose(f"long{i}", 0, prompt(5, 40 + i), 16, GREEDY)) for i in range(3)]
    gate.set()
    deadline = time.monotonic() + TIMEOUT_S
    while not any(runtime._sessions.get(f"long{i}") for i in range(3)) and time.monotonic() < deadline:
        time.sleep(0.001)  # until the long drafts have started
    late = batcher.submit(verify("late", 0, prompt(7, 50), prompt(3, 51), None, GREEDY))
    reference = ModelRuntime(model_dir)
    assert late.result(TIMEOUT_S).recovered_tokens == \
        run_alone(reference, verify("late", 0, prompt(7, 50), prompt(3, 51), None, GREEDY)).recovered_tokens
    for i, future in enumerate(long):
        assert future.result(TIMEOUT_S).draft_tokens == \
            run_alone(reference, propose(f"long{i}", 0, prompt(5, 40 + i), 16, GREEDY)).draft_tokens


def test_a_miss_or_an_error_fails_only_its_own_job(model_dir):
    runtime = ModelRuntime(model_dir)
    runtime.extend("held", 0, prompt(6, 1))
    batcher = Batcher(runtime)
    gate = threading.Event()
    batcher.submit(gate.wait)

    def broken():
        yield Step("broken", 0, prompt(2, 3))
        raise ValueError("a bug in one job")

    futures = {"miss": batcher.submit(propose("nobody", 5, [7], 2, GREEDY)),
               "broken": batcher.submit(broken()),
               "ok": batcher.submit(propose("held", 6, [7], 3, GREEDY))}
    gate.set()
    with pytest.raises(CacheMiss):
        futures["miss"].result(TIMEOUT_S)
    with pytest.raises(ValueError, match="a bug"):
        futures["broken"].result(TIMEOUT_S)
    assert len(futures["ok"].result(TIMEOUT_S).draft_tokens) == 3


def test_a_taken_over_writers_late_steps_leave_the_new_writers_cache_alone(model_dir):
    """A resume takes session "s" over (epoch 1 → 2) while the first writer's 16-token draft is
    mid-way, and the first writer's next call arrives after the new writer's: neither stale job
    steps the cache once the new writer has, so the cache holds what epoch 2 put there. An
    unfenced call (epoch 0) of another session is untouched."""
    runtime = ModelRuntime(model_dir)
    batcher = Batcher(runtime)
    committed = prompt(9, 60)
    stale = batcher.submit_all([propose("s", 0, committed, 16, GREEDY)], [1])[0]
    deadline = time.monotonic() + TIMEOUT_S
    while runtime.held("s") < len(committed) and time.monotonic() < deadline:
        time.sleep(0.001)  # until the stale draft has started
    fresh = batcher.submit_all([propose("s", 0, committed, 3, GREEDY)], [2])[0]
    late = batcher.submit_all([verify("s", 0, committed, prompt(4, 61), None, GREEDY)], [1])[0]
    other = batcher.submit(propose("other", 0, committed, 3, GREEDY))
    assert fresh.result(TIMEOUT_S).draft_tokens == other.result(TIMEOUT_S).draft_tokens
    for future in (stale, late):
        with pytest.raises(Superseded, match="epoch 2") as refused:
            future.result(TIMEOUT_S)
        assert refused.value.field == "writer_epoch"
    # The fresh draft's cache: the committed tokens and its first two drafted tokens.
    assert runtime.held("s") == len(committed) + 2
    torch.testing.assert_close(_cache(runtime, "s"), _cache(runtime, "other"))


def test_writer_epochs_admit_the_latest_writer_and_forget_the_least_recent_sessions():
    epochs = WriterEpochs(max_sessions=2)
    epochs.admit("a", 3)
    epochs.admit("a", 3)  # the same writer again
    epochs.admit("a", 0)  # not fenced
    with pytest.raises(Superseded, match="epoch 3"):
        epochs.admit("a", 2)
    epochs.admit("b", 1)
    epochs.admit("c", 5)  # past the bound: "a", the least recent, is forgotten
    epochs.admit("a", 1)
    with pytest.raises(Superseded):
        epochs.admit("c", 4)
    epochs.release("c", 5)  # its writer released it: epoch 5 is over, 6 (a resume) is taken
    with pytest.raises(Superseded, match="or later"):
        epochs.admit("c", 5)
    epochs.admit("c", 6)
    epochs.release("c", 0)  # not fenced: changes nothing
    epochs.admit("c", 6)


def test_the_token_budget_splits_rounds_and_the_oldest_always_runs(model_dir):
    runtime = ModelRuntime(model_dir)
    rounds = []
    extend_batch = runtime.extend_batch

    def recording(steps):
        rounds.append([(s.session_id, len(s.tokens)) for s in steps])
        return extend_batch(steps)

    runtime.extend_batch = recording
    batcher = Batcher(runtime, max_batch_tokens=10)
    gate = threading.Event()
    batcher.submit(gate.wait)
    jobs = [verify("big", 0, prompt(30, 1), [], None, GREEDY),  # over the budget on its own
            verify("a", 0, prompt(6, 2), [], None, GREEDY), verify("b", 0, prompt(4, 3), [], None, GREEDY),
            verify("c", 0, prompt(5, 4), [], None, GREEDY), verify("a", 0, prompt(2, 5), [], None, GREEDY)]
    futures = [batcher.submit(job) for job in jobs]
    gate.set()
    answers = [future.result(TIMEOUT_S) for future in futures]
    # One step per session per round, oldest first, within 10 tokens unless alone.
    assert rounds == [[("big", 30)], [("a", 6), ("b", 4)], [("c", 5), ("a", 2)]]
    # Each answer says which pass it ran in, and that it waited for the passes before it.
    assert [(a.batching.passes, a.batching.tokens, a.batching.sessions) for a in answers] == \
        [(1, 30, 1), (1, 10, 2), (1, 10, 2), (1, 7, 2), (1, 7, 2)]
    assert answers[3].batching.wait_ms > answers[1].batching.wait_ms > 0


def test_a_pass_costs_its_cpu_time_not_the_time_it_waited_for_a_core(model_dir):
    """On a CPU, what a call's work cost (Batching.cost_ms) is CPU time: a pass kept 50 ms from a
    core (here: asleep first) takes 50 ms more of wall time and no more of the machine."""
    runtime = ModelRuntime(model_dir)
    extend_batch = runtime.extend_batch

    def descheduled(steps):
        time.sleep(0.05)
        return extend_batch(steps)

    runtime.extend_batch = descheduled
    batcher = Batcher(runtime)
    answer = batcher.submit(verify("slow", 0, prompt(8, 1), prompt(3, 2), None, GREEDY)).result(TIMEOUT_S)
    assert answer.compute_ms >= 50
    assert 0 < answer.batching.cost_ms < answer.compute_ms - 40


@dataclass(frozen=True)
class _Drafting(Step):
    """A verifier's drafting step (as its head's or its exit layers' are): a pass of its own."""


def test_each_kind_of_step_runs_and_is_charged_in_a_pass_of_its_own(model_dir):
    """A round that holds the target's steps and a verifier's drafting steps runs two passes, and
    each job is charged (Batching) the pass it ran in, not the round: charged the round, a head's
    step paid the target's pass of the other sessions' verifies."""
    runtime = ModelRuntime(model_dir)
    passes, extend_batch = [], runtime.extend_batch

    def recording(steps):
        passes.append([(type(step), step.session_id) for step in steps])
        return extend_batch(steps)

    def job(kind: type, session_id: str, tokens: int):
        yield kind(session_id, 0, prompt(tokens, len(session_id)), keep=1)
        return SimpleNamespace(compute_ms=0.0)  # the batcher fills in its time and passes

    runtime.extend_batch = recording
    batcher = Batcher(runtime)
    gate = threading.Event()
    batcher.submit(gate.wait)  # hold the model thread until all three are queued: one round
    futures = batcher.submit_all([job(Step, "a", 4), job(_Drafting, "bb", 3), job(Step, "ccc", 5)])
    gate.set()
    answers = [future.result(TIMEOUT_S) for future in futures]
    assert passes == [[(Step, "a"), (Step, "ccc")], [(_Drafting, "bb")]]
    charged = [(a.batching.passes, a.batching.sessions, a.batching.tokens) for a in answers]
    assert charged == [(1, 2, 9), (1, 1, 3), (1, 2, 9)]


def _kinds_job(session_id: str, kinds: list[type]):
    """A job of one step per kind given, in order (a verify, then its drafting steps)."""
    for i, kind in enumerate(kinds):
        yield kind(session_id, i, prompt(1, i), keep=1)
    return SimpleNamespace(compute_ms=0.0)


def test_drafting_steps_wait_for_a_verify_behind_them_and_then_share_its_jobs_passes(model_dir):
    """On a verifier that drafts, a verify that arrives while another job drafts runs first, and
    the two jobs' drafting steps then share passes (without the wait: a round of two passes, then
    a pass each); a drafting step waits MAX_DEFERRALS rounds at most, however many verifies keep
    arriving."""
    runtime = ModelRuntime(model_dir)
    runtime.draft_step = _Drafting
    passes, extend_batch, arrivals = [], runtime.extend_batch, []

    def recording(steps):
        passes.append([(type(step).__name__, step.session_id) for step in steps])
        if arrivals:  # the next job arrives while this pass runs
            futures.append(batcher.submit(arrivals.pop(0)))
        return extend_batch(steps)

    runtime.extend_batch = recording
    batcher = Batcher(runtime)
    arrivals.append(_kinds_job("y", [Step, _Drafting, _Drafting]))
    futures = [batcher.submit(_kinds_job("x", [Step, _Drafting, _Drafting]))]
    futures[0].result(TIMEOUT_S)  # y arrived during x's first pass
    for future in futures:
        future.result(TIMEOUT_S)
    assert passes == [[("Step", "x")], [("Step", "y")], [("_Drafting", "x"), ("_Drafting", "y")],
                      [("_Drafting", "x"), ("_Drafting", "y")]]

    passes.clear()
    arrivals.extend(_kinds_job(f"v{i}", [Step]) for i in range(4))
    futures = [batcher.submit(_kinds_job("x", [Step, _Drafting]))]
    futures[0].result(TIMEOUT_S)  # each verify arrived during a pass, the last during x's last
    for future in futures:
        future.result(TIMEOUT_S)
    # x's drafting step waits two rounds, then runs (its pass first: it is older) beside v2's verify.
    assert MAX_DEFERRALS == 2
    assert passes == [[("Step", "x")], [("Step", "v0")], [("Step", "v1")], [("_Drafting", "x")], [("Step", "v2")],
                      [("Step", "v3")]]


def test_a_round_of_every_kind_of_ask_gives_each_job_its_own_answer(model_dir):
    """Drafting (chains, trees) and verifying (token, block, trees) under different sampling
    parameters, greedy among them, all in the same rounds: each answer is the one its job gets
    alone (tokens exactly, probabilities to float rounding of the larger products)."""
    params = [GREEDY, SamplingParams(0.7, top_k=5, seed=1), SamplingParams(1.0, top_p=0.9, seed=2),
              SamplingParams(1.3, top_k=20, top_p=0.8, seed=3), SamplingParams(1.0, seed=4)]
    parents = (-1, -1, 0, 0, 1)
    gen = torch.Generator().manual_seed(5)

    def jobs():
        out = []
        for i, p in enumerate(params):
            context = prompt(6 + i, seed=60 + i)
            drafts = prompt(3, seed=70 + i)
            draft_probs = None if p.greedy else warp(torch.randn(3, VOCAB, generator=gen), p)
            # The tree's expanded nodes: the root, 0 and 1.
            tree_probs = None if p.greedy else warp(torch.randn(3, VOCAB, generator=gen), p)
            out += [propose(f"c{i}", 0, context, 4, p), propose_tree(f"t{i}", 0, context, [2, 2], p),
                    verify(f"v{i}", 0, context, drafts, draft_probs, p),
                    verify(f"b{i}", 0, context, drafts, draft_probs, p, rules.BLOCK),
                    verify_tree(f"r{i}", 0, context, Tree(tuple(prompt(5, seed=80 + i)), parents), tree_probs, p)]
        return out

    gen.manual_seed(5)
    batcher = Batcher(ModelRuntime(model_dir))
    gate = threading.Event()
    batcher.submit(gate.wait)
    futures = [batcher.submit(job) for job in jobs()]
    gate.set()
    batched = [f.result(TIMEOUT_S) for f in futures]
    gen.manual_seed(5)
    alone = [run_alone(ModelRuntime(model_dir), job) for job in jobs()]
    assert max(b.batching.sessions for b in batched) > 20  # they did share passes
    for b, a in zip(batched, alone):
        tokens = ["draft_tokens", "parents", "recovered_tokens", "bonus_token", "tree_recovered_tokens", "kept_path"]
        for name in tokens:
            assert getattr(b, name, None) == getattr(a, name, None), name
        for name in ["draft_token_probs", "target_token_probs", "block_accept_probs", "tree_accept_probs"]:
            np.testing.assert_allclose(getattr(b, name, []), getattr(a, name, []), atol=1e-5)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_each_guess_drafted_ahead_is_followed_by_the_block_a_call_from_after_it_would_draft(model_dir, temperature):
    """Drafting past a block for its outcomes (ProposeRequest.ahead_*): the bonus guesses are the
    draft's top tokens after the block, a rejection's guess at position j the draft's most likely
    token there but the drafted one; under each, the chain a call drafting from after that guess
    draws (draws keyed by position, whichever guess they follow), with the distributions it sends."""
    runtime, params, gamma = ModelRuntime(model_dir), SamplingParams(temperature=temperature, seed=5), 4
    committed = prompt(9, 70)
    block = run_alone(runtime, propose("block", 0, committed, gamma, params)).draft_tokens

    def top(n: int, before: list[int]) -> list[int]:  # the draft's n most likely tokens after `before`
        return run_alone(runtime, propose_tree(f"top-{len(before)}", 0, before, [n], GREEDY)).draft_tokens

    ahead = run_alone(runtime, propose_ahead("ahead", 0, committed + block, 3, params, guesses=2, block=gamma,
                                             rejections=3))
    assert ahead.anchors == [gamma, gamma, 0, 1, 2]
    assert ahead.parents == [-1] * 5 + list(range(10))  # a chain of 2 under each of the 5 guesses
    guesses = ahead.draft_tokens[:5]
    assert guesses[:2] == top(2, committed + block)
    assert guesses[2:] == [next(t for t in top(2, committed + block[:j]) if t != block[j]) for j in range(3)]
    assert (len(ahead.draft_distributions) == 0) == params.greedy
    for g, (anchor, guess) in enumerate(zip(ahead.anchors, guesses)):
        fresh = run_alone(runtime, propose(f"fresh-{g}", 0, committed + block[:anchor] + [guess], 2, params))
        nodes = [g + 5 * depth for depth in (1, 2)]
        assert [ahead.draft_tokens[n] for n in nodes] == fresh.draft_tokens
        np.testing.assert_allclose([ahead.draft_token_probs[n] for n in nodes], fresh.draft_token_probs, atol=1e-5)
        if not params.greedy:  # a node's distribution is its parent's row; the root (the guesses') has none
            rows = [ahead.draft_distributions[n - 5] for n in nodes]
            np.testing.assert_allclose(distributions.unpack(rows, VOCAB), distributions.unpack(
                fresh.draft_distributions, VOCAB), atol=1e-5)


def test_a_draft_ahead_past_the_whole_block_alone_feeds_only_its_last_token(model_dir):
    """Without rejections the call needs the block's last token only (the cache holds the rest),
    and one guess makes a chain, laid out in the cache as a chain call's."""
    runtime, params = ModelRuntime(model_dir), SamplingParams(temperature=1.0, seed=5)
    committed = prompt(9, 70)
    run_alone(runtime, propose("s", 0, committed[:-1], 1, params))  # the cache holds all but the last
    ahead = run_alone(runtime, propose_ahead("s", len(committed) - 1, committed[-1:], 4, params))
    assert ahead.parents == [-1, 0, 1, 2] and ahead.anchors == []
    fresh = run_alone(runtime, propose("fresh", 0, committed + ahead.draft_tokens[:1], 3, params))
    assert ahead.draft_tokens[1:] == fresh.draft_tokens
    assert runtime.held("s") == len(committed) + 3

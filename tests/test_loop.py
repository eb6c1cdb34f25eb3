"""The cycle loop without Ray: real workers and Redis, with caches lost mid-generation."""

import asyncio

import pytest
from transformers import AutoModelForCausalLM

from tandem.math.params import SamplingParams
from tandem.orchestrator.policy import GammaPolicy

from support.loops import generate, open_session, release, running_loop
from support.policies import cheap_good_cycle
from support.references import hf_greedy


def test_lost_worker_caches_are_re_prefilled_and_output_stays_exact(workers, redis_url, pair, target_model):
    prompt = pair["prompts"][6]
    expected = hf_greedy(target_model, prompt, 20)

    async def run():
        async with running_loop([workers["draft"]], [workers["target"]], redis_url, (pair["eos"],)) as loop:
            s = await open_session(loop, "loop-test", prompt, SamplingParams(temperature=0.0), 20, 3)
            draft = loop.drafts.workers[workers["draft"]].client
            target = loop.targets.workers[workers["target"]].client
            out, dropped = [], {"draft": 0, "target": 0}
            async for cycle in loop.run(s):
                out.extend(cycle.tokens)
                # Both workers forget the session (eviction, restart, another replica): the next
                # cycle's cache_len > 0 meets a miss and the whole sequence is re-sent. (The next
                # cycle's draft call is already under way: it may land before or after the loss.)
                dropped["draft"] += await draft.release(s.session_id)
                dropped["target"] += await target.release(s.session_id)
            return out, await loop.store.load(s.session_id), s, dropped

    out, record, s, dropped = asyncio.run(run())
    assert dropped["draft"] >= s.cycle // 2 and dropped["target"] == s.cycle
    # Every verify re-prefilled the whole sequence: no steady cost to learn from.
    assert s.policy.costs.verify_pass.n == 0 and s.policy.costs.verify_call.n == 0
    assert out == expected
    assert record.tokens == prompt + out and record.cycle == s.cycle
    assert [c.output_tokens for c in record.per_cycle] == [c.output_tokens for c in s.stats.per_cycle]
    assert record.workers == {"draft": workers["draft"], "target": workers["target"]}


def _generate(workers, redis_url, pair, prompt, params, gamma, draft_ahead, session_id, max_tokens=40, guesses=1,
              rejections=0):
    """One session through the loop → (tokens, per-cycle stats, its γ policy)."""

    async def run():
        async with running_loop([workers["draft"]], [workers["target"]], redis_url, (pair["eos"],),
                                draft_ahead=draft_ahead, ahead_guesses=guesses, ahead_rejections=rejections) as loop:
            s = await open_session(loop, session_id, prompt, params, max_tokens, gamma)
            out = await generate(loop, s)
            await release(loop, s)
            return out, s.stats.per_cycle, s.policy

    return asyncio.run(run())


def _tokens_before_parting(cycles: list, others: list) -> int:
    """The tokens two runs output in their cycles before their γ choices part."""
    same = 0
    for c, other in zip(cycles, others):
        if c.gamma != other.gamma:
            break
        same += c.output_tokens
    return same


def test_drafting_ahead_changes_no_token(workers, redis_url, pair):
    """A block drafted during the last verify is the block a fresh draft call would propose
    (counter-based randomness keyed by position), so with the same seed the output is the
    same token for token, greedy and sampled, with drafting ahead on or off."""
    hits = 0
    for i, (temperature, gamma) in enumerate([(0.0, 2), (0.0, 4), (1.0, 2), (1.0, 3)]):
        prompt = pair["prompts"][i]
        params = SamplingParams(temperature=temperature, seed=100 + i)
        on, on_cycles, on_policy = _generate(workers, redis_url, pair, prompt, params, gamma, True,
                                             f"ahead-on-{i}")
        off, off_cycles, off_policy = _generate(workers, redis_url, pair, prompt, params, gamma, False,
                                                f"ahead-off-{i}")
        assert on == off
        # The policy learns how often a guess of the bonus comes true.
        guesses = on_policy.pair
        assert off_policy.pair.guesses == 0 and guesses.hits <= guesses.guesses
        assert (guesses.hits > 0) == any(c.drafted_ahead for c in on_cycles)
        assert not any(c.drafted_ahead or c.ahead_ms for c in off_cycles)
        # It learns the cycle's wait for its draft-ahead call at the γ it drafted.
        assert gamma in on_policy.costs.ahead_wait and not off_policy.costs.ahead_wait
        for before, c in zip(on_cycles, on_cycles[1:]):
            # A block comes from drafting ahead only after a cycle that accepted all it drafted.
            assert not c.drafted_ahead or (before.accepted == before.gamma and before.ahead_ms > 0)
            assert c.draft_ms == 0 if c.drafted_ahead else (c.draft_ms > 0) == (c.gamma > 0)
        hits += sum(c.drafted_ahead for c in on_cycles)
    assert hits > 0  # the pair agrees often enough for the guess to come true


def test_drafting_ahead_for_several_guesses_changes_no_token_and_comes_true_more_often(workers, redis_url, pair):
    """With three guesses of the bonus token a block drafted ahead is still the block a fresh
    call would propose: the same tokens as without drafting ahead, greedy and sampled. Greedy at
    a fixed γ the cycles are the same, and the draft's top token is among the guesses, so every
    hit of one guess is a hit of three; the others come true too, and a block under a guess that
    is not the first leaves the draft cache in a tree's layout, which the next calls feed past."""
    hits = {}
    for i, (temperature, gamma) in enumerate([(0.0, 2), (0.0, 3), (1.0, 2), (1.0, 3)]):
        prompt = pair["prompts"][i]
        params = SamplingParams(temperature=temperature, seed=200 + i)
        off, _, _ = _generate(workers, redis_url, pair, prompt, params, gamma, False, f"guesses-off-{i}")
        for guesses in (1, 3):
            on, cycles, _ = _generate(workers, redis_url, pair, prompt, params, gamma, True, f"guesses-{guesses}-{i}",
                                      guesses=guesses)
            assert on == off
            hits[temperature, gamma, guesses] = sum(c.drafted_ahead for c in cycles)
    for gamma in (2, 3):
        assert hits[0.0, gamma, 3] >= hits[0.0, gamma, 1]
    assert sum(hits[0.0, gamma, 3] - hits[0.0, gamma, 1] for gamma in (2, 3)) > 0


def test_drafting_ahead_past_rejections_changes_no_token_and_comes_true_after_them(workers, redis_url, pair):
    """Drafting past a rejection at each of a block's positions too: still the tokens of no
    drafting ahead, greedy and sampled. Blocks drafted ahead now follow cycles that rejected a
    token (the draft's next choice was the target's), each of which leaves the draft cache in a
    tree's layout that the next calls feed past; greedy at a fixed γ every hit of the bonus
    alone is still a hit, and there are more; the policy learns how often a recovered token is
    guessed."""
    hits = {}
    for i, (temperature, gamma) in enumerate([(0.0, 2), (0.0, 4), (1.0, 3)]):
        prompt = pair["prompts"][i + 2]
        params = SamplingParams(temperature=temperature, seed=300 + i)
        off, _, _ = _generate(workers, redis_url, pair, prompt, params, gamma, False, f"rejections-off-{i}")
        for rejections in (0, gamma):
            on, cycles, policy = _generate(workers, redis_url, pair, prompt, params, gamma, True,
                                           f"rejections-{rejections}-{i}", rejections=rejections)
            assert on == off
            after = [c for before, c in zip(cycles, cycles[1:]) if c.drafted_ahead and before.accepted < before.gamma]
            hits[temperature, gamma, rejections] = sum(c.drafted_ahead for c in cycles), len(after)
            assert (policy.pair.rejections > 0) == (rejections > 0)
            assert policy.pair.recoveries <= policy.pair.rejections
            assert (policy.pair.recoveries > 0) == (len(after) > 0)
    for gamma in (2, 4):
        assert hits[0.0, gamma, 0][1] == 0 and hits[0.0, gamma, gamma][0] >= hits[0.0, gamma, 0][0]
    assert sum(hits[0.0, gamma, gamma][1] for gamma in (2, 4)) > 0


def test_what_drafting_ahead_guessed_counts_every_outcome_the_policy_prices():
    """Its rates are g after a full accept and h after a rejection at one of the first R positions
    (tandem.orchestrator.policy): a reply that drafted no guess past the rejection (an n-gram
    lookup's, past the whole block only) is a miss of h, not left out of it."""
    from tandem.orchestrator.cycle import _guesses

    reply, block = object(), object()
    assert _guesses(reply, block, 4, 4, 2) == (True, None)
    assert _guesses(reply, None, 4, 4, 2) == (False, None)
    assert _guesses(reply, block, 4, 1, 2) == (None, True)
    assert _guesses(reply, None, 4, 1, 2) == (None, False)  # no guess drafted there, or a wrong one
    assert _guesses(reply, None, 4, 2, 2) == (None, None)  # past the positions it drafts past
    assert _guesses(None, None, 4, 4, 2) == (None, None) == _guesses(None, None, 4, 0, 2)  # no reply


def test_no_drafting_ahead_while_another_session_is_in_flight(workers, redis_url, pair):
    """Drafting ahead uses the draft worker's idle time; with another session in flight it is
    not idle, and wasted guesses would delay that session's blocks."""

    async def run():
        async with running_loop([workers["draft"]], [workers["target"]], redis_url, (pair["eos"],)) as loop:
            sessions = [await open_session(loop, name, pair["prompts"][0], SamplingParams(temperature=0.0), 30, 2)
                        for name in ("ahead-a", "ahead-b")]
            first = loop.run(sessions[0])
            await anext(first)  # session a is in flight (paused between cycles) while b runs
            b = await generate(loop, sessions[1])
            a = [t async for cycle in first for t in cycle.tokens]
            for s in sessions:
                await release(loop, s)
            return sessions, a, b

    (a, b), a_rest, b_tokens = asyncio.run(run())
    assert not any(c.ahead_ms or c.drafted_ahead for c in b.stats.per_cycle)
    assert any(c.ahead_ms for c in a.stats.per_cycle[1:])  # alone again once b is done
    assert b_tokens == a.tokens[a.request.prompt_len:]  # same prompt, greedy: same tokens


def test_an_adaptive_sessions_first_cycle_drafts_ahead_at_any_load(workers, redis_url, pair, target_model):
    """An adaptive session's first cycle is the target's prefill alone (γ = 0); the draft worker
    prefills and drafts the first block meanwhile, with others in flight too, where it would
    otherwise do so in a cycle of its own. Its later cycles do not draft ahead while another
    session is in flight, and the tokens are the target's."""
    draft_model = AutoModelForCausalLM.from_pretrained(pair["draft"]).eval()
    replica = GammaPolicy()  # a replica that has measured a cheap draft that is always right
    for gamma in (1, 2, 3, 4, 6):
        replica.observe(cheap_good_cycle(gamma))

    async def run(i: int, prompt: list[int], draft_ahead: bool):
        async with running_loop([workers["draft"]], [workers["target"]], redis_url, (pair["eos"],),
                                draft_ahead=draft_ahead) as loop:
            sessions = []
            for name in ("first-a", "first-b"):
                s = await open_session(loop, f"{name}-{i}-{draft_ahead}", prompt, SamplingParams(temperature=0.0),
                                       24, None)
                s.policy = replica.for_session()
                sessions.append(s)
            first = loop.run(sessions[0])
            await anext(first)  # session a is in flight (paused between cycles) while b runs
            b = await generate(loop, sessions[1])
            await first.aclose()
            for s in sessions:
                await release(loop, s)
            return sessions[1], b

    hits = 0
    for i, prompt in enumerate(pair["prompts"][3:6]):
        expected = hf_greedy(target_model, prompt, 24)
        guessed = hf_greedy(draft_model, prompt, 1) == expected[:1]  # the draft's guess of the first token
        for draft_ahead in (True, False):
            b, tokens = asyncio.run(run(i, prompt, draft_ahead))
            cycles = b.stats.per_cycle
            assert tokens == expected
            assert cycles[0].gamma == 0 and (cycles[0].ahead_ms > 0) == draft_ahead
            assert not any(c.ahead_ms for c in cycles[1:])
            # The block drafted ahead stands in for the second cycle's draft call when it guessed right.
            assert cycles[1].drafted_ahead == (draft_ahead and guessed)
            hits += cycles[1].drafted_ahead
    assert hits > 0


def test_a_session_whose_record_says_the_workers_hold_everything_still_runs(workers, redis_url, pair, target_model):
    """After a drafted-ahead hit the record says the draft worker holds every committed token;
    a session resumed from it has no block in hand, so its first call must still feed a token."""
    prompt = pair["prompts"][6]
    expected = hf_greedy(target_model, prompt, 8)

    async def run():
        async with running_loop([workers["draft"]], [workers["target"]], redis_url, (pair["eos"],)) as loop:
            s = await open_session(loop, "holds-everything", prompt, SamplingParams(temperature=0.0), 8, 3)
            s.workers = {"draft": workers["draft"], "target": workers["target"]}  # as its record has them
            s.cache_lens = {"draft": len(prompt), "target": len(prompt)}
            out = await generate(loop, s)
            await release(loop, s)
            return out

    assert asyncio.run(run()) == expected


def test_no_verifier_left_waits_the_bound_then_the_session_stays_resumable(workers, redis_url, pair):
    """With no verifier up, a cycle waits verifier_wait_s for one, then raises NoWorker; the
    session's record in Redis is untouched, so it resumes once a verifier is back."""
    from tandem.orchestrator.cycle import NoWorker

    async def run():
        async with running_loop([workers["draft"]], [], redis_url, (pair["eos"],), verifier_wait_s=0.5) as loop:
            s = await open_session(loop, "no-verifier", pair["prompts"][0], SamplingParams(temperature=0.0), 8, 2)
            with pytest.raises(NoWorker, match="no target worker"):
                await generate(loop, s)
            record = await loop.store.load(s.session_id)
            await release(loop, s)
            return record

    record = asyncio.run(run())
    assert record.status == "running" and record.generated == [] and record.cycle == 0


def test_two_writers_of_one_session_on_one_replica_do_not_disturb_each_other(workers, redis_url, pair, target_model):
    """A resume can take a session over on the very replica still writing it. The first
    writer's cleanup must not end the second's calls (their rows may share a batched call). The
    first is fenced at its next commit; the second writes the session to its end."""
    from tandem.orchestrator.session import Session
    from tandem.orchestrator.policy import GammaPolicy
    from tandem.orchestrator.store import Fenced

    prompt = pair["prompts"][0]
    expected = hf_greedy(target_model, prompt, 40)

    async def run():
        async with running_loop([workers["draft"]], [workers["target"]], redis_url, (pair["eos"],)) as loop:
            first = await open_session(loop, "two-writers", prompt, SamplingParams(temperature=0.0), 40, 2)
            cycles = loop.run(first)
            head = (await anext(cycles)).tokens  # the first writer is mid-generation, its streams open
            record = await loop.store.claim("two-writers", "second-writer")
            second = Session("two-writers", record.request, record.tokens, GammaPolicy(), owner="second-writer",
                             epoch=record.epoch, cycle=record.cycle, workers=dict(record.workers),
                             cache_lens=dict(record.cache_lens), used=set(first.used))
            rest = asyncio.create_task(generate(loop, second))
            await release(loop, first)  # the first writer's cleanup, while the second writes
            rest = await rest
            with pytest.raises(Fenced) as fenced:
                await anext(cycles)
            await release(loop, second)
            return head, rest, fenced.value.reason

    head, rest, reason = asyncio.run(run())
    assert head + rest == expected and reason == "taken over"


def test_a_writer_whose_calls_come_after_a_later_writers_stops_at_its_call(workers, redis_url, pair, target_model):
    """The first writer is taken over before its first cycle and calls the workers after the
    second writer has: the workers refuse its calls (writer epochs), so it stops as a fenced
    commit would stop it ("taken over"), before touching the caches; the second writer's
    generation stays the target's own."""
    from tandem.orchestrator.session import Session
    from tandem.orchestrator.policy import GammaPolicy
    from tandem.orchestrator.store import Fenced

    prompt = pair["prompts"][1]
    expected = hf_greedy(target_model, prompt, 30)

    async def run():
        async with running_loop([workers["draft"]], [workers["target"]], redis_url, (pair["eos"],)) as loop:
            first = await open_session(loop, "late-writer", prompt, SamplingParams(temperature=0.0), 30, 2)
            record = await loop.store.claim("late-writer", "second-writer")
            second = Session("late-writer", record.request, record.tokens, GammaPolicy(), owner="second-writer",
                             epoch=record.epoch)
            cycles = loop.run(second)
            head = (await anext(cycles)).tokens  # the second writer's calls reach the workers first
            with pytest.raises(Fenced) as fenced:
                await generate(loop, first)
            rest = [t async for cycle in cycles for t in cycle.tokens]
            second.used |= first.used
            await release(loop, second)
            stored = await loop.store.load("late-writer")
            return head + rest, fenced.value.reason, (record.epoch, first.epoch), stored

    generated, reason, epochs, stored = asyncio.run(run())
    assert reason == "taken over" and epochs == (2, 1)
    assert generated == expected == stored.generated


def test_an_adaptive_session_gets_its_first_token_from_the_target_alone(workers, redis_url, pair, target_model):
    """The first cycle runs no draft call (the caller waits only for the target's prefill).
    Alone, the draft worker prefills and drafts ahead meanwhile, after its guesses of that token;
    without drafting ahead, it prefills with the second cycle's block. The tokens are the same
    either way: greedy, all of them; sampled, those of the cycles before the policy's choices part
    (drafting ahead changes what a cycle costs, so the choices may part, and a sample's draws are
    keyed by its cycle). A fixed γ drafts from the first cycle."""
    hits = 0
    for i, temperature in enumerate((0.0, 0.0, 1.0, 1.0)):
        prompt = pair["prompts"][5 + i]
        params = SamplingParams(temperature=temperature, seed=300 + i)
        ahead, cycles, _ = _generate(workers, redis_url, pair, prompt, params, None, True, f"first-ahead-{i}", 20)
        plain, plain_cycles, _ = _generate(workers, redis_url, pair, prompt, params, None, False, f"first-{i}", 20)
        same = len(ahead) if params.greedy else _tokens_before_parting(cycles, plain_cycles)
        assert not params.greedy or ahead == hf_greedy(target_model, prompt, 20)
        assert same >= cycles[0].output_tokens + cycles[1].output_tokens and ahead[:same] == plain[:same]
        assert [(c[0].gamma, c[0].draft_ms, c[0].output_tokens) for c in (cycles, plain_cycles)] == [(0, 0.0, 1)] * 2
        assert cycles[0].ahead_ms > 0 and plain_cycles[0].ahead_ms == 0
        assert cycles[1].gamma == plain_cycles[1].gamma == GammaPolicy().initial_gamma
        assert plain_cycles[1].draft_ms > 0 and (cycles[1].draft_ms == 0) == cycles[1].drafted_ahead
        hits += cycles[1].drafted_ahead
    assert hits > 0  # the draft guesses the target's first token often enough
    prompt = pair["prompts"][5]
    fixed, fixed_cycles, _ = _generate(workers, redis_url, pair, prompt, SamplingParams(temperature=0.0), 3, True,
                                       "first-fixed", 20)
    assert fixed_cycles[0].gamma == 3
    assert fixed == hf_greedy(target_model, prompt, 20)

"""Holding a round for the rows due back (tandem.services.holding): the fixed cost of a pass,
which sessions are due when, and a batcher whose two cohorts meet in one pass."""

import threading
import time

import pytest

from tandem.math.params import SamplingParams
from tandem.services.batching import Batcher
from tandem.math.fit import LinearFit
from tandem.services.holding import FORGET_S, PASS_DECAY, Returns, fixed_s
from tandem.services.runtime import ModelRuntime, Step
from tandem.services.target_verifier import verify

from support.models import llama_config, save_random_model
from support.workers import prompt

GREEDY = SamplingParams(temperature=0.0, seed=0)
TIMEOUT_S = 60


def test_a_pass_costs_its_fixed_part_plus_its_tokens():
    cost = LinearFit()
    assert fixed_s(cost) == 0.0
    cost.add(4, 0.008, PASS_DECAY)
    cost.add(4, 0.008, PASS_DECAY)
    assert fixed_s(cost) == 0.0  # one size of pass says nothing of the fixed part
    for tokens in (1, 8, 16, 32, 64):
        cost.add(tokens, 0.006 + 0.0005 * tokens, PASS_DECAY)
    assert fixed_s(cost) == pytest.approx(0.006, abs=5e-4)
    falling = LinearFit()
    for tokens, seconds in ((1, 0.02), (50, 0.01)):
        falling.add(tokens, seconds, PASS_DECAY)
    assert fixed_s(falling) == pytest.approx(0.015, abs=1e-3)  # never a negative slope: the mean, flat


def test_a_session_is_due_back_after_its_last_way_round():
    returns = Returns()
    returns.answered("a", 0.0)
    assert returns.due(0.0001, 1.0) == {}  # never seen back: no way round to go by
    returns.arrived("a", 0.003)  # 3 ms round
    returns.answered("a", 1.0)
    assert returns.due(1.001, 0.005) == {"a": pytest.approx(1.003)}
    assert returns.due(1.001, 0.001) == {}  # not within the wait allowed
    assert returns.due(1.004, 0.005) == {"a": pytest.approx(1.003)}  # a little late
    assert returns.due(1.009, 0.005) == {}  # long overdue: it finished, or went elsewhere
    returns.arrived("a", 1.003)
    assert returns.due(1.0031, 1.0) == {}  # back


def test_sessions_answered_long_ago_are_forgotten():
    returns = Returns()
    for i in range(100):
        returns.answered(f"s{i}", 0.0)
    returns.answered("late", FORGET_S + 1.0)
    assert list(returns._out) == ["late"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    config = llama_config(vocab_size=96, layers=2, hidden=64, eos_token_id=2, max_context=256, init_std=0.1)
    return save_random_model(config, str(tmp_path_factory.mktemp("holding") / "m"), seed=5)


@pytest.mark.parametrize("fixed", [1.0, 0.0])
def test_a_round_waits_for_a_session_due_back_while_the_wait_costs_less_than_a_pass(model_dir, fixed):
    """Two sessions go round together, then come back 0.1 s apart: with passes whose fixed cost is
    large, the first waits and they share a pass; with none, it runs at once, alone."""
    runtime = ModelRuntime(model_dir)
    rounds = []
    extend_batch = runtime.extend_batch

    def recording(steps):
        rounds.append(sorted(s.session_id for s in steps))
        return extend_batch(steps)

    runtime.extend_batch = recording
    batcher = Batcher(runtime)
    for _ in range(100):  # what passes cost, as if measured (the real ones barely move it)
        batcher.passes[Step].add(1, fixed + 0.001, PASS_DECAY)
        batcher.passes[Step].add(64, fixed + 0.064, PASS_DECAY)
    tokens = {"x": prompt(6, 1), "y": prompt(6, 2)}

    def step(session_id: str):  # the session's next verify: its last token fed, nothing drafted
        sequence = tokens[session_id]
        start = len(sequence) - 1 if len(sequence) > 6 else 0
        tokens[session_id] = sequence + [5]
        return verify(session_id, start, tokens[session_id][start:len(sequence)], [], None, GREEDY)

    for _ in range(2):  # together twice: the second time, each one's way round is known
        for future in batcher.submit_all([step("x"), step("y")]):
            future.result(TIMEOUT_S)
    x = batcher.submit(step("x"))
    time.sleep(0.1)
    y = batcher.submit(step("y"))
    x.result(TIMEOUT_S), y.result(TIMEOUT_S)
    assert rounds[:2] == [["x", "y"], ["x", "y"]]
    assert rounds[2:] == ([["x", "y"]] if fixed else [["x"], ["y"]])

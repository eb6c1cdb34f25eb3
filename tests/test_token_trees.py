"""Token trees through the real worker services (gRPC on 127.0.0.1): the draft worker drafts a
tree, the verifier checks it in one pass under a tree mask (the Llama pass, and Hugging Face's
for a model the Llama pass does not cover) and keeps the accepted path in its cache; checked
against Hugging Face run on each node's path as a plain sequence."""

import asyncio

import grpc
import pytest
import torch

from tandem.math import tree, tree_greedy, tree_sampling
from tandem.math.params import SamplingParams
from tandem.math.rng import Purpose, cycle_uniforms
from tandem.services import distributions, draft_worker, target_verifier
from tandem.services.runtime import HFPass, ModelRuntime
from tandem.services.server import start_server
from tandem.v1 import worker_pb2_grpc
from tandem.wire import worker as wire

from support.loops import (
    assert_first_tokens_follow_the_target,
    generate,
    open_session,
    release,
    running_loop,
    sampled_first_tokens,
)
from support.models import save_random_model
from support.references import greedy_walk, hf_argmax, hf_greedy, hf_logits, hf_warped
from support.workers import (
    GREEDY,
    TIMEOUT_S,
    VOCAB,
    BackgroundLoop,
    assert_status,
    block,
    prompt,
    verify,
    worker_config,
)

SAMPLED = SamplingParams(temperature=1.0, top_k=12, seed=5)
WIDTHS = [3, 2, 1]  # 3 + 6 + 6 nodes


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("trees")
    biased = worker_config()
    biased.attention_bias = True  # not the Llama pass's: Hugging Face's forward runs it
    return {"target": save_random_model(worker_config(), str(root / "target"), seed=0),
            "draft": save_random_model(worker_config(), str(root / "draft"), seed=1),
            "biased": save_random_model(biased, str(root / "biased"), seed=2)}


@pytest.fixture(scope="module")
def hf(models) -> dict:
    from transformers import AutoModelForCausalLM
    return {name: AutoModelForCausalLM.from_pretrained(path).eval() for name, path in models.items()}


@pytest.fixture(scope="module")
def stubs(models):
    """Draft workers on the draft and on each verifier's own model (which it accepts wholly),
    verifiers on the target (Llama pass) and on the biased model (Hugging Face's pass)."""
    loop = BackgroundLoop()
    servers, channels, stubs = [], [], {}
    plan = {"draft": (draft_worker, "draft"), "self-target": (draft_worker, "target"),
            "self-biased": (draft_worker, "biased"), "target": (target_verifier, "target"),
            "biased": (target_verifier, "biased")}
    try:
        for name, (service, model) in plan.items():
            runtime = ModelRuntime(models[model])
            assert isinstance(runtime.forward_pass, HFPass) == (model == "biased")
            server, port = loop.run(start_server(service.add_to_server, runtime, "127.0.0.1", 0))
            servers.append(server)
            channel = grpc.insecure_channel(f"127.0.0.1:{port}")
            channels.append(channel)
            stub = worker_pb2_grpc.DraftWorkerStub if service is draft_worker else worker_pb2_grpc.TargetVerifierStub
            stubs[name] = stub(channel)
        yield stubs
    finally:
        for channel in channels:
            channel.close()
        for server in servers:
            loop.run(server.stop(None))
        loop.close()


def propose_tree(stub, session_id: str, tokens: list[int], widths: list[int], params=GREEDY,
                 tree_rule: str = "") -> wire.Proposal:
    request = wire.propose_request(session_id, 0, tokens, len(widths), params, tree_widths=widths, tree_rule=tree_rule)
    return wire.proposal_from_pb(stub.Propose(request, timeout=TIMEOUT_S))


def path_tokens(t: tree.Tree, node: int) -> list[int]:
    return [t.tokens[i] for i in t.path(node)]


def assert_continues(stub, model, session: str, cache_len: int, committed: list[int]) -> None:
    """The verifier's cache, said to hold committed[:cache_len], verifies Hugging Face's greedy
    continuation of `committed` wholly (every position's argmax depends on the kept keys)."""
    following = hf_argmax(model, committed, 6)
    after = verify(stub, session, cache_len, committed[cache_len:], block(following[:5]))
    assert after.target_token_probs == [1.0] * 5 and after.bonus_token == following[5]


@pytest.mark.parametrize("params, rule", [(GREEDY, "rrsw"), (SAMPLED, "rrsw"), (SAMPLED, "greedy")],
                         ids=["greedy", "sampled", "sampled-greedy-rule"])
def test_the_draft_tree_is_the_drafts_top_or_drawn_tokens_on_every_path(stubs, hf, params, rule):
    """Every node's children are the draft's top tokens after its path (greedy), or distinct
    tokens drawn from its distribution there, which comes back as the node's row (sampled); by
    the greedy rule, one drawn from outside the top tokens, then the top tokens but one."""
    context = prompt(10, seed=1)
    p = propose_tree(stubs["draft"], f"shape-{rule}", context, WIDTHS, params, rule)
    t = tree.Tree(tuple(p.draft_tokens), tuple(p.parents))
    assert [len(t.children[n]) for n in [-1] + list(range(len(t)))] == [3] + [2] * 3 + [1] * 6 + [0] * 6
    rows = distributions.unpack(p.draft_distributions, VOCAB) if p.draft_distributions else None
    assert (rows is None) == params.greedy
    for row, node in enumerate(tree.expanded(t.parents)):
        logits = hf_logits(hf["draft"], context + path_tokens(t, node))[-1]
        kids = [t.tokens[c] for c in t.children[node]]
        if params.greedy:
            assert kids == logits.topk(len(kids)).indices.tolist()
        else:
            expected = hf_warped(logits, params.temperature, params.top_k)
            torch.testing.assert_close(rows[row], expected, atol=1e-5, rtol=1e-4)
            assert all(expected[k] > 0 for k in kids)
            if rule == "greedy":
                top = expected.topk(len(kids) - 1).indices.tolist()
                assert kids[1:] == top and kids[0] not in top
            assert [p.draft_token_probs[c] for c in t.children[node]] == pytest.approx(expected[kids].tolist(),
                                                                                      abs=1e-5)


@pytest.mark.parametrize("verifier", ["target", "biased"])
@pytest.mark.parametrize("drafter", ["self-draft", "draft"])
def test_greedy_tree_verify_walks_the_targets_argmax_and_keeps_that_path(stubs, hf, verifier, drafter):
    """Each row's token is the target's argmax after the row's path, the walk is the greedy
    walk, and the cache then continues exactly like the committed sequence."""
    context = prompt(10, seed=2)
    session = f"{verifier}-{drafter}"
    drafter = f"self-{verifier}" if drafter == "self-draft" else drafter
    p = propose_tree(stubs[drafter], session, context, WIDTHS)
    t = tree.Tree(tuple(p.draft_tokens), tuple(p.parents))
    v = verify(stubs[verifier], session, 0, context, p)
    argmax = [int(hf_logits(hf[verifier], context + path_tokens(t, n))[-1].argmax()) for n in range(-1, len(t))]
    assert v.tree_recovered_tokens == argmax
    path, token = greedy_walk(t, argmax)
    assert v.kept_path == path
    if drafter.startswith("self-"):
        assert path == [0, 3, 9]  # the first child (the argmax) at every depth: not contiguous, moved by keep_path
    committed = context + [t.tokens[i] for i in path] + [token]
    assert_continues(stubs[verifier], hf[verifier], session, len(context) + len(path), committed)


def test_sampled_tree_verify_answers_rrsw_on_the_targets_distributions(stubs, hf):
    """tree_accept_probs are RRSw's on Hugging Face's warped target after each path; the kept
    path is the walk with the orchestrator's uniforms; the cache continues after it."""
    context = prompt(10, seed=3)
    p = propose_tree(stubs["draft"], "sampled", context, WIDTHS, SAMPLED)
    t = tree.Tree(tuple(p.draft_tokens), tuple(p.parents))
    v = verify(stubs["target"], "sampled", 0, context, p, SAMPLED)
    target = torch.stack([hf_warped(hf_logits(hf["target"], context + path_tokens(t, n))[-1], 1.0, SAMPLED.top_k)
                          for n in range(-1, len(t))])  # [n+1, V]
    draft = distributions.unpack(p.draft_distributions, VOCAB)
    position = len(context)
    expected = tree_sampling.verdict(t, target, draft, cycle_uniforms(SAMPLED.seed, position, len(t) + 1,
                                                            Purpose.TREE_RECOVERED))
    assert v.tree_accept_probs == pytest.approx(expected.accept_probs, abs=1e-5)
    assert v.tree_recovered_tokens == expected.recovered
    path = tree.walk(t, v.tree_accept_probs, cycle_uniforms(SAMPLED.seed, position, len(t), Purpose.TREE_ACCEPT))
    assert v.kept_path == path
    committed = context + [t.tokens[i] for i in path] + [v.tree_recovered_tokens[path[-1] + 1 if path else 0]]
    assert_continues(stubs["target"], hf["target"], "sampled", position + len(path), committed)


def test_sampled_tree_verify_by_the_greedy_rule_answers_its_verdict(stubs, hf):
    """With tree_rule greedy, the draft's children and the verifier's verdict are the greedy
    multi-draft rule's (tandem.math.tree_greedy) on Hugging Face's warped distributions."""
    context = prompt(10, seed=13)
    p = propose_tree(stubs["draft"], "greedy-rule", context, WIDTHS, SAMPLED, "greedy")
    t = tree.Tree(tuple(p.draft_tokens), tuple(p.parents))
    request = wire.verify_request("greedy-rule", 0, context, p, SAMPLED, tree_rule="greedy")
    v = wire.verification_from_pb(stubs["target"].Verify(request, timeout=TIMEOUT_S))
    target = torch.stack([hf_warped(hf_logits(hf["target"], context + path_tokens(t, n))[-1], 1.0, SAMPLED.top_k)
                          for n in range(-1, len(t))])  # [n+1, V]
    draft = distributions.unpack(p.draft_distributions, VOCAB)
    u = cycle_uniforms(SAMPLED.seed, len(context), len(t) + 1, Purpose.TREE_RECOVERED)
    expected = tree_greedy.verdicts([t], target, draft, [u])[0]
    assert v.tree_accept_probs == pytest.approx(expected.accept_probs, abs=1e-5)
    assert v.tree_recovered_tokens == expected.recovered
    assert expected.accept_probs != tree_sampling.verdict(t, target, draft, u).accept_probs  # the rules differ


def test_bad_trees_are_refused_naming_the_field(stubs):
    context = prompt(6, seed=4)
    for widths, message in (([2, 2], "one width per depth"), ([2, 0, 1], "at least 1"), ([8, 8, 1], "nodes")):
        request = wire.propose_request("bad", 0, context, 3, GREEDY, tree_widths=widths)
        with pytest.raises(grpc.RpcError) as e:
            stubs["draft"].Propose(request, timeout=TIMEOUT_S)
        assert_status(e, grpc.StatusCode.INVALID_ARGUMENT, "tree_widths")
        assert message in e.value.details()
    for tokens, parents in (([5, 6], [-1]), ([5, 6], [-1, 1]), ([5, 5], [-1, -1])):
        proposal = wire.Proposal(tokens, [1.0] * len(tokens), [], 0.0, parents=parents)
        with pytest.raises(grpc.RpcError) as e:
            verify(stubs["target"], "bad", 0, context, proposal)
        assert_status(e, grpc.StatusCode.INVALID_ARGUMENT, "draft_parents")
    p = propose_tree(stubs["draft"], "bad-rows", context, [2, 1], SAMPLED)
    p.draft_distributions = p.draft_distributions[:1]  # the root's, not node 0's and node 1's
    with pytest.raises(grpc.RpcError) as e:
        verify(stubs["target"], "bad-rows", 0, context, p, SAMPLED)
    assert_status(e, grpc.StatusCode.INVALID_ARGUMENT, "draft_distributions")
    bad_rule = wire.propose_request("bad-rule", 0, context, 2, SAMPLED, tree_widths=[2, 1])
    bad_rule.tree_rule = 7
    with pytest.raises(grpc.RpcError) as e:
        stubs["draft"].Propose(bad_rule, timeout=TIMEOUT_S)
    assert_status(e, grpc.StatusCode.INVALID_ARGUMENT, "tree_rule")
    bad_rule = wire.verify_request("bad-rule", 0, context, block([5]), GREEDY)
    bad_rule.tree_rule = 7
    with pytest.raises(grpc.RpcError) as e:
        stubs["target"].Verify(bad_rule, timeout=TIMEOUT_S)
    assert_status(e, grpc.StatusCode.INVALID_ARGUMENT, "tree_rule")
    # The verifier keeps serving.
    assert verify(stubs["target"], "after", 0, context, block([])).bonus_token >= 0


# --- through the cycle loop: real worker processes, a real Redis --------------------------------


@pytest.mark.parametrize("shape", ["tree", "auto"])
def test_greedy_output_through_trees_is_the_targets(workers, redis_url, pair, target_model, shape):
    """Token-identical to the target alone, at a fixed depth and adaptive, with trees drafted
    (and, auto, chains too)."""

    async def run():
        async with running_loop([workers["draft"]], [workers["target"]], redis_url, (pair["eos"],)) as loop:
            out = {}
            for i, gamma in enumerate((3, None)):
                context = pair["prompts"][7 + i]
                s = await open_session(loop, f"tree-greedy-{shape}-{gamma}", context, GREEDY, 24, gamma,
                                       draft_shape=shape)
                out[gamma] = (context, await generate(loop, s), s.stats, s.policy.tree_ms)
                await release(loop, s)
            return out

    for gamma, (context, tokens, stats, tree_ms) in asyncio.run(run()).items():
        assert tokens == hf_greedy(target_model, context, 24), f"gamma {gamma}"
        # Trees were drafted: at γ = 3, cycles with more nodes than the chain's 3; adaptive, whose
        # depth its measured costs pick, cycles its policy timed as trees.
        assert [c for c in stats.per_cycle if c.gamma > 3] if gamma else tree_ms > 0, "no tree was drafted"


def test_sampled_first_token_through_trees_follows_the_target(workers, redis_url, pair, target_model):
    """The first token's χ² over many seeds, each first cycle a tree of depth 3 (2 + 4 + 4 nodes)
    verified by recursive rejection sampling without replacement."""
    context = pair["prompts"][6]
    results = sampled_first_tokens(workers["draft"], workers["target"], redis_url, pair["eos"], context, 300,
                                   "token", "tree", draft_shape="tree")
    assert all(gamma == 10 for _, gamma in results), "every first cycle should have drafted a full tree"
    assert_first_tokens_follow_the_target(target_model, context, [token for token, _ in results])


def test_sampled_first_token_through_greedy_rule_trees_follows_the_target(workers, redis_url, pair, target_model):
    """The same through trees drawn and verified by the greedy multi-draft rule (--tree-rule
    greedy); its negative control is the math's (tests/test_tree_greedy.py)."""
    context = pair["prompts"][6]
    results = sampled_first_tokens(workers["draft"], workers["target"], redis_url, pair["eos"], context, 300,
                                   "token", "greedy-rule", draft_shape="tree", tree_rule="greedy")
    assert all(gamma == 10 for _, gamma in results), "every first cycle should have drafted a full tree"
    assert_first_tokens_follow_the_target(target_model, context, [token for token, _ in results])

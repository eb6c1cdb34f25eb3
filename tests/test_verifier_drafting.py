"""Drafting inside the verifier, with an EAGLE-3 head (tandem.services.head, head_pass,
head_runtime, head_training) or the target's own first layers (tandem.services.self_draft):
the head's files in SpecForge's layout, the refusals, the serving pass against the training
forward, and sessions on real verifier processes that draft: greedy identical to the target
alone, sampled tokens that follow the target (χ², with a negative control that fails), a
verifier killed mid-stream, and the cluster behind Ray Serve."""

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from scipy.stats import chisquare
from transformers import AutoConfig, AutoModelForCausalLM

from support.loops import generate, open_session, release, running_loop
from support.models import llama_config, save_random_head, save_random_model
from tandem.local import spawn_worker, stop_processes
from tandem.math.params import SamplingParams
from tandem.orchestrator import metrics
from tandem.math.sampling import warp
from tandem.services import head, head_training
from tandem.services.head_runtime import HeadRuntime, HeadStep
from tandem.services.runtime import KeepPath, KeptBlock, Step
from tandem.v1 import worker_pb2, worker_pb2_grpc
from tandem.wire.worker import draft_distribution, sampling_to_pb

VOCAB = 300
GREEDY = SamplingParams(temperature=0.0)
SAMPLED = SamplingParams(temperature=1.0, top_k=8)


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> str:
    """A small target whose text a one-layer head can learn to follow (a low-variance init)."""
    config = llama_config(VOCAB, 2, 64, eos_token_id=None, max_context=256, init_std=0.05)
    return save_random_model(config, str(tmp_path_factory.mktemp("head") / "target"), seed=0)


@pytest.fixture(scope="module")
def target_model(target):
    return AutoModelForCausalLM.from_pretrained(target).eval()


@pytest.fixture(scope="module")
def trained(target, target_model, tmp_path_factory) -> str:
    """A head trained for a few seconds on the target's own greedy continuations."""
    torch.manual_seed(0)
    prompts = torch.randint(3, VOCAB, (64, 4), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        texts = target_model.generate(prompts, do_sample=False, max_new_tokens=60, eos_token_id=None, pad_token_id=0)
    g = torch.Generator().manual_seed(1)
    batches = (texts[torch.randint(0, len(texts), (16,), generator=g)] for _ in range(150))
    module = head_training.new_head(target_model)
    losses = head_training.train(module, target_model, batches, 150, 3e-3)
    assert losses[-1] < losses[0] / 4
    out = str(tmp_path_factory.mktemp("head") / "trained")
    head.save(module, out)
    return out


@pytest.fixture(scope="module")
def verifier(target, trained):
    """A target verifier that drafts with the trained head, as a real process."""
    proc, address = spawn_worker("target", target, "127.0.0.1", 1, "cpu", "float32", args=["--head", trained])
    yield {"address": address, "proc": proc}
    stop_processes([proc])


def _prompts(n: int, seed: int) -> list[list[int]]:
    return torch.randint(3, VOCAB, (n, 6), generator=torch.Generator().manual_seed(seed)).tolist()


def _greedy(target_model, prompt: list[int], n: int) -> list[int]:
    with torch.no_grad():
        out = target_model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=n, eos_token_id=None,
                                    pad_token_id=0)
    return out[0, len(prompt):].tolist()


# --- the files ----------------------------------------------------------------------------------


def test_a_head_saved_in_specforge_layout_loads_back(target, tmp_path):
    out = save_random_head(target, str(tmp_path / "h"), seed=1, taps=(0, 1, 2), draft_vocab=100)
    config = json.loads((Path(out) / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 100
    assert config["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]  # vLLM's numbering: inputs
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [-1, 0, 1]  # SGLang's: outputs
    weights = load_file(Path(out) / "model.safetensors")
    assert set(weights) == {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d", *(
        f"midlayer.{n}.weight" for n in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                         "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
                                         "input_layernorm", "hidden_norm", "post_attention_layernorm"))}
    assert weights["fc.weight"].shape == (64, 3 * 64) and weights["midlayer.self_attn.q_proj.weight"].shape[1] == 128
    assert weights["d2t"].dtype == torch.int64 and weights["t2d"].dtype == torch.bool
    loaded = head.load(out, AutoConfig.from_pretrained(target))
    assert all(torch.equal(loaded.state_dict()[name], w) for name, w in weights.items())
    mapped = loaded.draft_to_target()
    assert mapped.unique().numel() == 100 and bool(loaded.t2d[mapped].all()) and int(loaded.t2d.sum()) == 100


def _edit(out: Path, config: dict | None = None, weights: dict | None = None, drop: tuple[str, ...] = ()) -> None:
    c = json.loads((out / "config.json").read_text())
    for key, value in (config or {}).items():
        if value is None:
            c.pop(key, None)
        else:
            c[key] = value
    (out / "config.json").write_text(json.dumps(c))
    w = load_file(out / "model.safetensors")
    w.update(weights or {})
    save_file({k: v for k, v in w.items() if k not in drop}, out / "model.safetensors")


@pytest.mark.parametrize("config, weights, drop, field", [
    ({"eagle_aux_hidden_state_layer_ids": [0, 1, 5], "eagle_config": None}, None, (),
     "eagle_aux_hidden_state_layer_ids"),  # past the target's 2 layers
    ({"eagle_aux_hidden_state_layer_ids": [1, 1, 2], "eagle_config": None}, None, (),
     "eagle_aux_hidden_state_layer_ids"),  # not increasing
    ({"eagle_aux_hidden_state_layer_ids": None, "eagle_config": None}, None, (),
     "eagle_aux_hidden_state_layer_ids"),  # not stated: a silent loss of acceptance otherwise
    ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}}, None, (),
     "eagle_aux_hidden_state_layer_ids"),  # the two conventions name different layers
    ({"target_hidden_size": 128}, None, (), "target_hidden_size"),
    ({"vocab_size": 301}, None, (), "vocab_size"),
    ({"architectures": ["LlamaForCausalLM"]}, None, (), "architectures"),
    ({"norm_before_residual": True}, None, (), "norm_before_residual"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, None, (), "rope_scaling"),
    (None, {"fc.weight": torch.zeros(64, 128)}, (), "fc.weight"),
    (None, {"midlayer.extra.weight": torch.zeros(3)}, (), "midlayer.extra.weight"),
    (None, None, ("lm_head.weight",), "lm_head.weight"),
    (None, None, ("d2t",), "d2t"),  # a reduced vocabulary without its map
    (None, {"d2t": torch.full((100,), 500)}, (), "d2t"),  # ids past the target's vocabulary
])
def test_a_head_that_does_not_fit_its_target_is_refused_naming_the_field(target, tmp_path, config, weights, drop,
                                                                          field):
    out = Path(save_random_head(target, str(tmp_path / "h"), seed=1, taps=(0, 1, 2), draft_vocab=100))
    _edit(out, config, weights, drop)
    with pytest.raises(head.HeadError) as e:
        head.load(out, AutoConfig.from_pretrained(target))
    assert e.value.field == field and field in str(e.value)


def test_a_verifier_given_a_head_that_does_not_fit_exits_with_one_line_naming_the_field(target, tmp_path):
    out = Path(save_random_head(target, str(tmp_path / "h"), seed=1, taps=(0, 1, 2)))
    _edit(out, {"target_hidden_size": 32})
    done = subprocess.run([sys.executable, "-m", "tandem.cli", "worker", "target", "--model", target, "--head",
                           str(out), "--port", "0"], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "--head" in done.stderr and "target_hidden_size" in done.stderr and "Traceback" not in done.stderr


# --- the serving pass is the training forward ----------------------------------------------------


def _taps_of(target_model, tokens: list[int], taps: tuple[int, ...]) -> torch.Tensor:
    features, _ = head_training.teacher(target_model, taps, torch.tensor([tokens]))
    return features


@pytest.mark.parametrize("draft_vocab", [None, 100])
def test_the_verifiers_head_pass_drafts_what_the_training_forward_computes(target, target_model, tmp_path,
                                                                           draft_vocab):
    """A catch-up over 8 committed tokens, then two drafting steps, on the runtime the verifier
    runs → the logits of Eagle3Head.unroll's steps 0, 1 and 2 at the last row."""
    out = save_random_head(target, str(tmp_path / "h"), seed=1, taps=(0, 1, 2), draft_vocab=draft_vocab)
    runtime = HeadRuntime(target, out)
    module = head.load(out, target_model.config)
    x = _prompts(1, seed=3)[0] + _prompts(1, seed=4)[0]  # 12 tokens
    runtime.extend_batch([Step("s", 0, x[:8], keep=1)])
    served = [runtime.extend_batch([HeadStep("s", 8 + k, [x[8 + k]], keep=1)])[0][0] for k in range(3)]
    with torch.no_grad():
        steps = module.unroll(target_model.model.embed_tokens(torch.tensor([x[1:11]])),
                              _taps_of(target_model, x[:8], (0, 1, 2)), 3)
    for k, logits in enumerate(served):
        expected = torch.full((VOCAB,), float("-inf"))
        expected[module.draft_to_target()] = steps[k][0, 7]
        finite = torch.isfinite(expected)
        assert torch.equal(torch.isfinite(logits), finite)
        torch.testing.assert_close(logits[finite], expected[finite], atol=1e-4, rtol=1e-4)


def test_the_heads_tree_rows_are_its_chains_along_each_path(target, tmp_path):
    """A token tree's nodes drafted in one step per depth, each reading its parent's output under
    the tree mask → each node's logits are those of a chain drafted along its path; and after the
    target verifies a tree and keeps one path, the head catches up as after that path's chain."""
    out = save_random_head(target, str(tmp_path / "h"), seed=1, taps=(0, 1, 2), draft_vocab=100)
    runtime = HeadRuntime(target, out)
    x = _prompts(3, seed=3)[0] + _prompts(1, seed=4)[0]  # 12 tokens
    a, b, c, d, e = x[9:11] + [x[1], x[2], x[5]]  # a ≠ b

    def catch_up(session: str) -> None:
        runtime.extend_batch([Step(session, 0, x[:8], keep=1)])
        runtime.extend_batch([HeadStep(session, 8, [x[8]], keep=1)])

    catch_up("tree")
    first = runtime.extend_batch([HeadStep("tree", 9, [a, b], keep=2, parents=(-1, -1))])[0]
    second = runtime.extend_batch([HeadStep("tree", 11, [c, d], keep=2, parents=(-1, -1, 0, 1))])[0]
    for row, path in enumerate(([a, c], [b, d])):
        catch_up(f"chain-{row}")
        chain = [runtime.extend_batch([HeadStep(f"chain-{row}", 9 + k, [t], keep=1)])[0][0] for k, t in enumerate(path)]
        for served, expected in ((first[row], chain[0]), (second[row], chain[1])):
            assert torch.equal(torch.isfinite(served), torch.isfinite(expected))
            torch.testing.assert_close(served[torch.isfinite(served)], expected[torch.isfinite(expected)],
                                       atol=1e-4, rtol=1e-4)
    # The target verifies [x8] and the tree (a, b under the root; c under a, d under b), keeps b, d.
    runtime.extend_batch([Step("tree", 8, [x[8], a, b, c, d], keep=5, parents=(-1, 0, 0, 1, 2))])
    assert runtime.keep_paths([KeepPath("tree", 9, [1, 3])]) == [True]
    runtime.extend_batch([Step("path", 0, x[:8] + [x[8], b, d], keep=1)])
    after = [runtime.extend_batch([HeadStep(session, 11, [e], keep=1)])[0][0] for session in ("tree", "path")]
    torch.testing.assert_close(after[0][torch.isfinite(after[0])], after[1][torch.isfinite(after[1])],
                               atol=1e-4, rtol=1e-4)


# --- sessions on a verifier that drafts ----------------------------------------------------------


@pytest.fixture(scope="module")
def self_verifier(target):
    """A target verifier that drafts with its first layer (of two)."""
    proc, address = spawn_worker("target", target, "127.0.0.1", 1, "cpu", "float32", args=["--exit-layer", "1"])
    yield address
    stop_processes([proc])


def _run(verifier: str, redis_url: str, body):
    async def run():
        async with running_loop([], [verifier], redis_url, (), verifier_drafts=True) as loop:
            return await body(loop)

    return asyncio.run(run())


def test_greedy_output_is_the_targets_and_the_head_drafts_every_cycle_after_the_first(verifier, redis_url,
                                                                                       target_model):
    prompts = _prompts(6, seed=5)

    async def body(loop):
        out = []
        for i, (prompt, gamma) in enumerate(zip(prompts, [None, 1, 3, 5, None, 8])):
            s = await open_session(loop, f"greedy-{i}", prompt, GREEDY, 40, gamma)
            out.append((await generate(loop, s), s.stats.per_cycle))
            await release(loop, s)
        return out

    results = _run(verifier["address"], redis_url, body)
    for prompt, (tokens, cycles) in zip(prompts, results):
        assert tokens == _greedy(target_model, prompt, 40)
        assert cycles[0].gamma == 0  # the prefill: the head drafts its first block after it
    fixed = [cycles for (_, cycles), gamma in zip(results, [None, 1, 3, 5, None, 8]) if gamma]
    assert all(c.gamma > 0 for cycles in fixed for c in cycles[1:-1]), "a block should come back with every verify"
    assert sum(c.accepted for _, cycles in results for c in cycles) > 20, "the trained head should be accepted"


def test_the_head_drafts_token_trees_and_greedy_output_stays_the_targets(verifier, redis_url, target_model):
    """Each verify answers the next cycle's token tree (top-k per node, greedy), drafted after
    the outcome of a tree's cycle as well as a chain's."""
    prompts = _prompts(3, seed=23)

    async def body(loop):
        out = []
        for i, (prompt, gamma, shape) in enumerate(zip(prompts, [3, None, 2], ["tree", "tree", "auto"])):
            s = await open_session(loop, f"tree-{i}", prompt, GREEDY, 40, gamma, draft_shape=shape,
                                   tree_widths=(3, 2))
            out.append((await generate(loop, s), s.stats.per_cycle))
            await release(loop, s)
        return out

    results = _run(verifier["address"], redis_url, body)
    for prompt, (tokens, _) in zip(prompts, results):
        assert tokens == _greedy(target_model, prompt, 40)
    fixed = results[0][1]
    assert all(c.gamma > 0 for c in fixed[1:-1]), "a tree should come back with every verify"
    assert sum(c.gamma == 3 + 6 + 6 for c in fixed) > len(fixed) / 2, "full trees but near the end"
    assert sum(c.accepted for c in fixed) >= 5, "the trained head's trees should be accepted"
    assert any(c.gamma == 3 + 6 for c in results[2][1]), "auto should try the tree"


@pytest.mark.parametrize("fields, field", [
    ({"next_gamma": 65}, "next_gamma"),
    ({"next_gamma": 2, "next_tree_widths": [2]}, "next_tree_widths"),  # one width per depth
    ({"next_gamma": 2, "next_tree_widths": [2, 0]}, "next_tree_widths"),
    ({"next_gamma": 2, "next_tree_widths": [8, 8]}, "next_tree_widths"),  # 72 nodes
])
def test_a_next_block_the_verifier_cannot_draft_is_refused_naming_the_field(verifier, fields, field):
    request = worker_pb2.VerifyRequest(session_id="bad", tokens=[5, 6, 7], draft_tokens=[8],
                                       sampling=sampling_to_pb(GREEDY), **fields)
    with grpc.insecure_channel(verifier["address"]) as channel:
        with pytest.raises(grpc.RpcError) as e:
            worker_pb2_grpc.TargetVerifierStub(channel).Verify(request, timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in e.value.details()


def _verify(address: str, **fields) -> worker_pb2.VerifyResponse:
    with grpc.insecure_channel(address) as channel:
        return worker_pb2_grpc.TargetVerifierStub(channel).Verify(worker_pb2.VerifyRequest(**fields), timeout=30)


def test_the_verifier_keeps_its_blocks_distributions_and_verifies_them_as_if_they_were_sent(verifier):
    """keep_next_distributions: the next block comes without its distributions, and the call that
    verifies it with held_distributions answers what sending them would have (a twin session that
    has them sent), again when retried; a block it did not draft is dropped, answered as plain
    decoding."""
    address, prompt = verifier["address"], _prompts(1, seed=31)[0]
    sampling = sampling_to_pb(SamplingParams(SAMPLED.temperature, SAMPLED.top_k, SAMPLED.top_p, seed=4))
    first = {"tokens": prompt, "sampling": sampling, "next_gamma": 3}
    kept = _verify(address, session_id="kept", keep_next_distributions=True, **first)
    sent = _verify(address, session_id="sent", **first)
    assert list(kept.next_block.draft_tokens) == list(sent.next_block.draft_tokens)
    assert kept.next_block.distributions_kept and not kept.next_block.draft_distributions
    assert not sent.next_block.distributions_kept and len(sent.next_block.draft_distributions) == 3
    block = {"cache_len": len(prompt), "tokens": [sent.next_token], "sampling": sampling,
             "draft_tokens": list(sent.next_block.draft_tokens)[:2]}  # a prefix: what the caller still wants
    held = _verify(address, session_id="kept", held_distributions=True, **block)
    shipped = _verify(address, session_id="sent", draft_distributions=sent.next_block.draft_distributions[:2], **block)
    retried = _verify(address, session_id="kept", held_distributions=True, **block)
    for field in ("target_token_probs", "recovered_tokens", "bonus_token", "dropped_block"):
        assert getattr(held, field) == getattr(shipped, field) == getattr(retried, field), field
    other = [(t + 1) % VOCAB for t in block["draft_tokens"]]
    dropped = _verify(address, session_id="kept", held_distributions=True, **{**block, "draft_tokens": other})
    plain = _verify(address, session_id="sent", **{**block, "draft_tokens": []})
    assert dropped.dropped_block and not dropped.target_token_probs and dropped.bonus_token == plain.bonus_token


def test_a_kept_block_serves_a_prefix_of_itself_of_its_own_shape_only():
    chain = KeptBlock(9, (5, 6, 7), (), ("d5", "d6", "d7"))
    tree = KeptBlock(9, (5, 6, 7), (-1, -1, 0), ("root", "d5"))
    assert chain.holds([5, 6], []) and chain.holds([5, 6, 7], []) and not chain.holds([5, 7], [])
    assert tree.holds([5, 6], [-1, -1]) and not tree.holds([5, 6], [-1, 0])
    assert not tree.holds([5, 6], []) and not chain.holds([5, 6], [-1, 0]), "a chain's rows are not a tree's"


def test_held_distributions_with_distributions_sent_too_are_refused_naming_the_field(verifier):
    request = worker_pb2.VerifyRequest(session_id="both", tokens=[5, 6, 7], draft_tokens=[8], held_distributions=True,
                                       sampling=sampling_to_pb(SAMPLED),
                                       draft_distributions=[draft_distribution(b"", b"\0" * 4 * VOCAB)])
    with grpc.insecure_channel(verifier["address"]) as channel:
        with pytest.raises(grpc.RpcError) as e:
            worker_pb2_grpc.TargetVerifierStub(channel).Verify(request, timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "draft_distributions" in e.value.details()


def _second_tokens(verifier: str, redis_url: str, prompt: list[int], seeds: int,
                   **request) -> list[tuple[list[int], int]]:
    """Per seed, a sampled session of 4 tokens at γ = 2 → (its first two tokens, its second cycle's
    γ: a tree's nodes). request: the rest of its Request (draft_shape, tree_widths)."""

    async def body(loop):
        slots = asyncio.Semaphore(16)

        async def one(seed):
            async with slots:
                params = SamplingParams(SAMPLED.temperature, SAMPLED.top_k, SAMPLED.top_p, seed)
                s = await open_session(loop, f"sampled-{request}-{seed}", prompt, params, 4, 2, **request)
                tokens = await generate(loop, s)
                await release(loop, s)
                return tokens[:2], s.stats.per_cycle[1].gamma

        return await asyncio.gather(*(one(seed) for seed in range(seeds)))

    return _run(verifier, redis_url, body)


def _second_token_marginal(target_model, prompt: list[int]) -> np.ndarray:
    """[V] the target's distribution of the second token, Σ_t1 p(t1) p(t2 | t1), under SAMPLED."""
    with torch.no_grad():
        first = warp(target_model(torch.tensor([prompt])).logits[0, -1], SAMPLED).double()  # [V]
        support = torch.nonzero(first).flatten().tolist()
        after = warp(target_model(torch.tensor([[*prompt, t] for t in support])).logits[:, -1], SAMPLED).double()
    return (first[support, None] * after).sum(0).numpy()


def test_sampled_second_tokens_follow_the_target_and_the_heads_own_draws_do_not(verifier, redis_url,
                                                                                 target_model, trained):
    """The first token comes from the prefill, the second from the head's first block, verified:
    its distribution over seeds is the target's Σ_t1 p(t1) p(t2 | t1). The head's own draws from
    the same contexts (what accepting every draft would output) fail the same test."""
    prompt = _prompts(1, seed=7)[0]
    results = _second_tokens(verifier["address"], redis_url, prompt, 400)
    assert all(gamma == 2 for _, gamma in results), "every second cycle should verify the head's block"
    expected = _second_token_marginal(target_model, prompt)
    seconds = [tokens[1] for tokens, _ in results]
    assert _chi2(seconds, expected) > 1e-3
    # The negative control: the head's own second tokens, drawn after the same first tokens.
    module = head.load(trained, target_model.config)
    g = torch.Generator().manual_seed(0)
    drawn = []
    with torch.no_grad():
        for tokens, _ in results:
            context = [*prompt, tokens[0]]
            features = _taps_of(target_model, prompt, module.config.taps)
            logits = module.unroll(target_model.model.embed_tokens(torch.tensor([context[1:]])), features, 1)[0][0, -1]
            q = torch.full((VOCAB,), float("-inf"))
            q[module.draft_to_target()] = logits
            drawn.append(int(torch.multinomial(warp(q, SAMPLED), 1, generator=g)))
    assert _chi2(drawn, expected) < 1e-3


def test_sampled_second_tokens_through_the_heads_token_trees_follow_the_target(verifier, redis_url, target_model):
    """The second token comes from the head's first tree (3 children drawn without replacement
    per node, 3 + 3 nodes), verified by recursive rejection sampling: the target's marginal."""
    prompt = _prompts(1, seed=29)[0]
    results = _second_tokens(verifier["address"], redis_url, prompt, 400, draft_shape="tree", tree_widths=(3,))
    assert all(gamma == 6 for _, gamma in results), "every second cycle should verify the head's tree"
    assert _chi2([tokens[1] for tokens, _ in results], _second_token_marginal(target_model, prompt)) > 1e-3


def _chi2(tokens: list[int], expected: np.ndarray) -> float:
    """χ² p-value of tokens against the distribution `expected` over its support (tokens outside it: 0)."""
    counts = Counter(tokens)
    support = np.flatnonzero(expected)
    if not set(counts) <= set(support.tolist()):
        return 0.0
    observed = np.array([counts[t] for t in support], dtype=float)
    return chisquare(observed, expected[support] / expected[support].sum() * len(tokens)).pvalue


@pytest.mark.parametrize("params", [GREEDY, SamplingParams(1.0, seed=3)], ids=["greedy", "sampled"])
def test_a_verifier_killed_mid_stream_the_next_reprefills_its_head_and_the_output_is_the_targets(
        target, trained, redis_url, target_model, params):
    """Two verifiers that draft; the one serving the session is SIGKILLed after its first tokens:
    the other re-prefills the target's cache and the head's features, and drafts on. Sampled, the
    dead verifier kept the block's distributions: the other drops the block (a γ-0 cycle)."""
    procs = [spawn_worker("target", target, "127.0.0.1", 1, "cpu", "float32", args=["--head", trained])
             for _ in range(2)]
    prompt = _prompts(1, seed=11)[0]
    dropped = metrics.dropped_blocks._value.get()
    try:
        async def body(loop):
            s = await open_session(loop, "failover", prompt, params, 48, 3)
            tokens = []
            async for cycle in loop.run(s):
                tokens += cycle.tokens
                if len(s.stats.per_cycle) == 3:
                    serving = next(p for p, address in procs if address == s.workers["target"])
                    os.kill(serving.pid, signal.SIGKILL)
            return tokens, s

        async def run():
            async with running_loop([], [a for _, a in procs], redis_url, (), verifier_drafts=True) as loop:
                return await body(loop)

        tokens, s = asyncio.run(run())
    finally:
        stop_processes([p for p, _ in procs])
    if params.greedy:
        assert tokens == _greedy(target_model, prompt, 48)
    else:
        assert len(tokens) == 48 and metrics.dropped_blocks._value.get() == dropped + 1
        assert s.stats.per_cycle[3].gamma == 0, "the cycle after the kill verifies no block"
    assert len({address for kind, address in s.used if kind == "target"}) == 2
    assert sum(c.gamma for c in s.stats.per_cycle[4:]) > 0, "the surviving verifier should draft on"


def test_through_the_cluster_greedy_is_the_targets_with_one_call_per_cycle(cluster, verifier, target_model):
    """Ray Serve's ingress in front of a verifier that drafts, with no draft worker at all."""
    from dataclasses import replace

    from ray import serve

    import tandem
    from tandem.orchestrator.app import build_app

    config = replace(cluster["config"], app_name="heads", draft_addresses=(), target_addresses=(verifier["address"],),
                     tokenizer=None, metrics_port=0, openai_api=False)
    serve.run(build_app(config), name="heads", route_prefix="/heads")
    try:
        with tandem.Client(cluster["address"], app_name="heads", timeout_s=120) as client:
            for prompt in _prompts(3, seed=13):
                result = client.generate(prompt_token_ids=prompt, max_tokens=32, temperature=0, gamma=3,
                                         ignore_eos=True)
                assert result.token_ids == _greedy(target_model, prompt, 32)
                cycles = result.stats.per_cycle
                assert cycles[0].gamma == 0 and all(c.gamma > 0 for c in cycles[1:-1])  # the verifier's blocks
    finally:
        serve.delete("heads")


def test_self_drafting_greedy_is_the_targets_and_sampled_second_tokens_follow_it(self_verifier, redis_url,
                                                                                 target_model):
    prompts = _prompts(3, seed=17)

    async def body(loop):
        out = []
        for i, prompt in enumerate(prompts):  # the last drafts token trees (2 + 4 + 4 nodes)
            s = await open_session(loop, f"self-{i}", prompt, GREEDY, 32, 3, draft_shape="tree" if i == 2 else "chain")
            out.append((await generate(loop, s), s.stats.per_cycle))
            await release(loop, s)
        return out

    for prompt, (tokens, cycles) in zip(prompts, _run(self_verifier, redis_url, body)):
        assert tokens == _greedy(target_model, prompt, 32)
        assert all(c.gamma > 0 for c in cycles[1:-1]), "the verifier should draft every cycle after the first"
    assert cycles[1].gamma == 10, "the exit layers should draft a full tree"
    prompt = _prompts(1, seed=19)[0]
    results = _second_tokens(self_verifier, redis_url, prompt, 300)
    assert all(gamma == 2 for _, gamma in results)
    assert _chi2([tokens[1] for tokens, _ in results], _second_token_marginal(target_model, prompt)) > 1e-3


def test_an_exit_layer_the_target_does_not_have_is_refused(target):
    done = subprocess.run([sys.executable, "-m", "tandem.cli", "worker", "target", "--model", target,
                           "--exit-layer", "2", "--port", "0"], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "--exit-layer must be in [1, 1]" in done.stderr and "Traceback" not in done.stderr

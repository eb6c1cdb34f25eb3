"""The lean Llama forward pass against Hugging Face's, on tiny random models saved and loaded
through from_pretrained: logits after prefills, steps, crops and cache growth; greedy
decoding token for token; and which models the runtime gives which pass."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from tandem.math.tree import Tree
from tandem.services.llama import Feed, LlamaPass, unsupported
from tandem.services.runtime import CacheMiss, HFPass, ModelRuntime, Step

from support.models import llama_config, save_random_model
from support.references import hf_logits
from support.workers import VOCAB, prompt


def _config(**overrides):
    config = llama_config(vocab_size=VOCAB, layers=2, hidden=128, eos_token_id=2, max_context=256, init_std=0.1)
    for key, value in overrides.items():
        setattr(config, key, value)
    return config


def _load(tmp_path, name: str, dtype: str = "float32", **overrides) -> tuple[str, torch.nn.Module]:
    path = save_random_model(_config(**overrides), str(tmp_path / name), seed=7)
    return path, AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()


ROPE = {
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
    "llama3": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
}
CASES = {
    "grouped-query, untied": {},
    "multi-head, tied": {"num_key_value_heads": 4, "tie_word_embeddings": True},
    "rope linear": {"rope_parameters": ROPE["linear"]},
    "rope llama3": {"rope_parameters": ROPE["llama3"]},
}


@pytest.mark.parametrize("attention", ["batched", "alone"])
@pytest.mark.parametrize("case", CASES)
def test_logits_match_hf_through_prefill_steps_crops_and_growth(tmp_path, monkeypatch, case, attention):
    """Feeds of up to MAX_BATCHED_QUERIES tokens attend in a group's batched products, longer ones
    alone in the fused kernel: both match Hugging Face's."""
    if attention == "alone":
        monkeypatch.setattr("tandem.services.llama.MAX_BATCHED_QUERIES", 0)
    path, hf = _load(tmp_path, "m", **CASES[case])
    assert unsupported(hf) is None
    runtime = ModelRuntime(path)
    assert isinstance(runtime.forward_pass, LlamaPass)
    seq = prompt(10, seed=1)
    # A 10-token prefill makes a 16-position buffer: the steps below grow it twice.
    steps = [(len(seq), prompt(1, 2), 1), (11, prompt(4, 3), 4), (13, prompt(3, 4), 2),  # crop 15 → 13
             (16, prompt(30, 5), 5), (46, prompt(1, 6), 1)]
    got = runtime.extend("s", 0, seq)
    torch.testing.assert_close(got, hf_logits(hf, seq), atol=2e-5, rtol=1e-4)
    for cache_len, tokens, keep in steps:
        seq = seq[:cache_len] + tokens
        got = runtime.extend("s", cache_len, tokens, keep=keep)
        assert got.shape == (keep, VOCAB)
        torch.testing.assert_close(got, hf_logits(hf, seq)[-keep:], atol=2e-5, rtol=1e-4)
    c = hf.config
    token_bytes = c.num_hidden_layers * 2 * c.num_key_value_heads * c.head_dim * 4
    assert runtime.token_bytes == token_bytes
    assert runtime.cache_bytes == 3 * 16 * token_bytes  # 47 tokens in blocks of 16


def test_bfloat16_matches_hf_in_bfloat16(tmp_path):
    path, hf = _load(tmp_path, "bf16", dtype="bfloat16")
    runtime = ModelRuntime(path, dtype="bfloat16")
    assert isinstance(runtime.forward_pass, LlamaPass)
    seq = prompt(12, seed=8)
    got = runtime.extend("s", 0, seq[:9])
    got = torch.cat([got, runtime.extend("s", 9, seq[9:])])
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), hf_logits(hf, seq), atol=0.05, rtol=0.02)


def test_greedy_decoding_matches_hf_generate(tmp_path):
    path, hf = _load(tmp_path, "g")
    runtime = ModelRuntime(path)
    start = prompt(8, seed=9)
    want = hf.generate(torch.tensor([start]), max_new_tokens=40, do_sample=False, eos_token_id=None,
                       pad_token_id=0)[0, len(start):].tolist()
    got, logits = [], runtime.extend("s", 0, start, keep=1)
    for i in range(40):
        got.append(int(logits[-1].argmax()))
        logits = runtime.extend("s", len(start) + i, got[-1:])
    assert got == want


def test_a_model_already_built_serves_as_its_directory_would(tmp_path):
    """benchmarks/gpu_costs.py serves random models too large to save: the runtime given the
    model answers as the one that read it, and names it as told."""
    path, hf = _load(tmp_path, "built")
    built = ModelRuntime("random 32b target", model=hf)
    read = ModelRuntime(path)
    assert built.info.model == "random 32b target" and built.info.num_parameters == read.info.num_parameters
    seq = prompt(9, seed=10)
    torch.testing.assert_close(built.extend("s", 0, seq), read.extend("s", 0, seq))


def test_weights_are_column_major_on_cpu_and_tied_head_is_a_copy(tmp_path):
    _, hf = _load(tmp_path, "t", tie_word_embeddings=True)
    fp = LlamaPass(hf, column_major=True)
    for layer in fp.layers:
        for name in ("qkv", "o", "gate_up", "down"):
            w = layer[name]
            assert w.stride() == (1, w.shape[0]), name
    assert fp.head.data_ptr() != fp.embed.data_ptr() and torch.equal(fp.head, fp.embed)
    assert fp.embed.is_contiguous()


@pytest.mark.parametrize("override, reason", [
    ({"attention_bias": True}, "biases"), ({"hidden_act": "gelu"}, "hidden_act"),
    ({"rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}}, "rope_type"),
])
def test_other_models_run_through_hf_and_still_match(tmp_path, override, reason):
    path, hf = _load(tmp_path, "u", **override)
    assert reason in unsupported(hf)
    runtime = ModelRuntime(path)
    assert isinstance(runtime.forward_pass, HFPass)
    seq = prompt(14, seed=10)
    runtime.extend("s", 0, seq[:10])
    got = runtime.extend("s", 8, seq[8:], keep=3)  # crop 10 → 8
    torch.testing.assert_close(got, hf_logits(hf, seq)[-3:], atol=2e-5, rtol=1e-4)


def test_failed_pass_forgets_the_session(tmp_path):
    """A pass that fails after writing some layers' keys must leave nothing behind: the retry
    misses and re-prefills, and its answer equals Hugging Face's."""
    path, hf = _load(tmp_path, "f")
    runtime = ModelRuntime(path)
    runtime.extend("s", 0, list(range(3, 13)))
    layer = runtime.forward_pass.layers[1]
    down, layer["down"] = layer["down"], torch.zeros(1, 1)  # layer 1's MLP now raises
    with pytest.raises(RuntimeError):
        runtime.extend("s", 5, [40, 41])
    layer["down"] = down
    with pytest.raises(CacheMiss):
        runtime.extend("s", 5, [40, 41])
    seq = [*range(3, 8), 40, 41]
    torch.testing.assert_close(runtime.extend("s", 0, seq), hf_logits(hf, seq), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("attention", ["batched", "alone"])
def test_a_token_tree_in_one_pass_scores_every_path_as_its_own_chain(tmp_path, monkeypatch, attention):
    """Each node's logits under the tree mask and depth positions equal Hugging Face's on the
    chain of its path; keeping one path's keys and values then continues like that chain, and a
    second session in the same pass (a chain) is untouched."""
    if attention == "alone":
        monkeypatch.setattr("tandem.services.llama.MAX_BATCHED_QUERIES", 0)
    path, hf = _load(tmp_path, "m")
    runtime = ModelRuntime(path)
    llama = runtime.forward_pass
    seq, other = prompt(9, seed=1), prompt(6, seed=2)
    parents = (-1, -1, 0, 0, 1, 2)  # two children of the root, two under the first, a grandchild
    nodes = prompt(6, seed=3)
    caches = [llama.new_cache(), llama.new_cache()]
    with torch.inference_mode():
        llama.forward_batch([Feed(caches[0], 0, seq, 1), Feed(caches[1], 0, other, 1)])
        tree_logits, chain_logits = llama.forward_batch([Feed(caches[0], len(seq), nodes, len(nodes), parents),
                                                         Feed(caches[1], len(other), nodes[:3], 3)])
    for i in range(len(nodes)):
        chain = [nodes[j] for j in Tree(tuple(nodes), parents).path(i)]
        torch.testing.assert_close(tree_logits[i], hf_logits(hf, seq + chain)[-1], atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(chain_logits, hf_logits(hf, other + nodes[:3])[-3:], atol=2e-5, rtol=1e-4)
    with torch.inference_mode():
        llama.keep_paths([(caches[0], len(seq), [0, 2, 5])])
    accepted = seq + [nodes[0], nodes[2], nodes[5]]
    with torch.inference_mode():
        after = llama.forward(caches[0], len(accepted), [7], 1)
    torch.testing.assert_close(after[0], hf_logits(hf, accepted + [7])[-1], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("group_attention", ["products", "fused"])
def test_one_pass_of_ragged_rows_gives_each_session_its_own_logits(tmp_path, group_attention):
    """Rows of 1 to 8 new tokens share padded attention groups (a token tree among the chains),
    one prefill runs alone, contexts differ in length and some were cropped: each row's logits
    are Hugging Face's on that session's own sequence, with a group's attention in three products
    (the CPU's) or in the fused kernel under its mask (an accelerator's)."""
    path, hf = _load(tmp_path, "r")
    runtime = ModelRuntime(path)
    llama = runtime.forward_pass
    llama.fused_groups = group_attention == "fused"
    contexts = [prompt(n, seed=20 + i) for i, n in enumerate([3, 17, 40, 1, 9, 30, 5, 12])]
    for i, context in enumerate(contexts):
        runtime.extend(f"s{i}", 0, context)
    parents = (-1, -1, 0, 1, 2)
    steps = [Step("s0", 3, prompt(1, 40)), Step("s1", 10, prompt(3, 41)),  # crops 17 → 10
             Step("s2", 40, prompt(4, 42)), Step("s3", 1, prompt(2, 43)), Step("s4", 9, prompt(5, 44)),
             Step("s5", 30, prompt(5, 45), parents=parents), Step("s6", 5, prompt(8, 46)),
             Step("s7", 12, prompt(1, 47)), Step("fresh", 0, prompt(70, 48))]  # 70 tokens: alone
    assert sum(len(s.tokens) <= 64 for s in steps) == 8
    got = runtime.extend_batch(steps)
    for step, logits in zip(steps, got):
        held = contexts[int(step.session_id[1:])][:step.cache_len] if step.session_id != "fresh" else []
        if step.parents is None:
            torch.testing.assert_close(logits, hf_logits(hf, held + step.tokens)[-len(step.tokens):], atol=2e-5,
                                       rtol=1e-4)
            continue
        for node in range(len(parents)):
            chain = [step.tokens[j] for j in Tree(tuple(step.tokens), parents).path(node)]
            torch.testing.assert_close(logits[node], hf_logits(hf, held + chain)[-1], atol=2e-5, rtol=1e-4)
    assert llama.pool.used == sum(llama.pool.blocks_for(s.cache_len + len(s.tokens)) for s in steps)

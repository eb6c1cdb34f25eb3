"""`tandem check` and tandem.suitability on tiny random pairs loaded through from_pretrained."""

import json

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from tandem.bench.corpus import load_prompts
from tandem.cli import main as cli
from tandem.math.analytic import analytic_speedup
from tandem.suitability import PairMismatch, acceptance, check_pair, check_vocabulary, greedy_continuation

from support.models import llama_config, save_random_model


@pytest.fixture(scope="module")
def other_vocab(tmp_path_factory, pair) -> str:
    """A model whose vocabulary is larger than the pair's, without a tokenizer to map it by
    (tokenizers that differ: test_vocabulary)."""
    return save_random_model(llama_config(pair["vocab"] + 17, 1, 32, eos_token_id=2), str(tmp_path_factory.mktemp("big")), 5)


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("prompts") / "p.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ["def add(a, b):\n", "import os\n", "class A:\n"]))
    return str(path)


def test_vocabulary_size_mismatch_is_a_clear_error(pair, other_vocab):
    with pytest.raises(PairMismatch, match=rf"the draft has {pair['vocab'] + 17} tokens, the target {pair['vocab']}"):
        check_vocabulary(other_vocab, pair["target"])


def test_matching_pair_passes_the_vocabulary_check(pair):
    assert check_vocabulary(pair["draft"], pair["target"]) is None  # one vocabulary: nothing to map


def test_cli_rejects_mismatched_pair_naming_both_sizes(pair, other_vocab, prompt_file):
    with pytest.raises(SystemExit) as exc:
        cli(["check", "--draft", other_vocab, "--target", pair["target"], "--prompts", prompt_file])
    assert "vocabularies differ" in str(exc.value) and str(pair["vocab"] + 17) in str(exc.value)


def test_greedy_continuation_matches_hf_generate(pair, target_model):
    for prompt in pair["prompts"][:4]:
        ours = greedy_continuation(target_model, prompt, 12, (pair["eos"],))
        hf = target_model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=12,
                                   eos_token_id=pair["eos"], pad_token_id=0)[0, len(prompt):].tolist()
        assert ours == hf


def test_acceptance_against_float64_reference(pair, target_model):
    draft = AutoModelForCausalLM.from_pretrained(pair["draft"]).eval()
    prompt = pair["prompts"][0]
    continuation = greedy_continuation(target_model, prompt, 16, ())
    agree, mass, n = acceptance(draft, target_model, prompt, continuation)
    want_agree, want_mass = 0, 0.0
    with torch.no_grad():
        for i in range(len(continuation)):  # one prefix at a time, no cache, float64 numpy
            ids = torch.tensor([prompt + continuation[:i]])
            d = draft(input_ids=ids).logits[0, -1].double().numpy()
            t = target_model(input_ids=ids).logits[0, -1].double().numpy()
            d, t = np.exp(d - d.max()) / np.exp(d - d.max()).sum(), np.exp(t - t.max()) / np.exp(t - t.max()).sum()
            want_agree += int(d.argmax() == t.argmax())
            want_mass += np.minimum(d, t).sum()
    assert (agree, n) == (want_agree, len(continuation))
    assert mass == pytest.approx(want_mass, rel=1e-5)  # float32 logits: one pass vs one per prefix
    assert 0 < agree < n  # a noisy copy: agrees often, not always


def test_identical_draft_accepts_everything(pair, target_model):
    report = check_pair(pair["target"], pair["target"], pair["prompts"][:2], max_new_tokens=8)
    assert report.greedy_agreement == 1.0
    assert report.sampled_acceptance == pytest.approx(1.0)
    assert report.positions == sum(len(greedy_continuation(target_model, p, 8, (pair["eos"],)))
                                   for p in pair["prompts"][:2])
    assert any("costs" in p for p in report.problems)  # the same model costs as much as itself
    assert not report.verdict.startswith("suitable")


def test_cli_json_report(pair, prompt_file, capsys):
    try:
        cli(["check", "--draft", pair["draft"], "--target", pair["target"], "--prompts", prompt_file,
             "--max-new-tokens", "6", "--json"])
        unsuitable = False
    except SystemExit as exc:  # the verdict "unsuitable" exits 1, after printing the report
        assert exc.code == 1
        unsuitable = True
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"].startswith("unsuitable") == unsuitable
    assert out["prompts"] == 3 and 3 <= out["positions"] <= 18
    assert 0 <= out["greedy_agreement"] <= 1 and 0 <= out["sampled_acceptance"] <= 1
    assert out["cost_ratio"] == pytest.approx(out["draft_ms"] / out["target_ms"])
    speedup = analytic_speedup(out["greedy_agreement"], out["gamma"], 1 / out["cost_ratio"])
    assert out["speedup"] == pytest.approx(speedup)  # the γ reported is the one the speedup is for
    assert out["verdict"].split(":")[0] in {"suitable", "marginal", "unsuitable"}


def test_load_prompts_formats(tmp_path):
    text = tmp_path / "p.txt"
    text.write_text("def f(x):\n    return x\n---\nclass A:\n")
    assert load_prompts(text) == ["def f(x):\n    return x", "class A:"]
    empty = tmp_path / "e.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError, match="no prompts"):
        load_prompts(empty)

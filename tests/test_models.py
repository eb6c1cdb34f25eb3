"""The pair shipped in models/ (and the target's EAGLE-3 head): loads the way users load it,
shares one vocabulary, and its tokenizer gives back code exactly."""

import concurrent.futures
import json
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from tandem.bench.corpus import load_prompts, read, stdlib_files
from tandem.cli import default_pair
from tandem.suitability import check_vocabulary

MODELS = Path(__file__).resolve().parents[1] / "models"
PROMPTS = Path(__file__).resolve().parents[1] / "benchmarks" / "prompts" / "heldout.jsonl"


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(MODELS / "target")


def test_default_pair_is_the_shipped_pair():
    assert default_pair() == (str(MODELS / "draft"), str(MODELS / "target"))


@pytest.mark.parametrize("name", ["draft", "target"])
def test_loads_through_from_pretrained(name, tokenizer):
    model = AutoModelForCausalLM.from_pretrained(MODELS / name)
    assert model.config.model_type == "llama"
    assert model.config.vocab_size == len(tokenizer)
    assert (MODELS / name / "model.safetensors").exists()
    assert AutoTokenizer.from_pretrained(MODELS / name).get_vocab() == tokenizer.get_vocab()


def test_one_vocabulary_and_special_tokens(tokenizer):
    assert check_vocabulary(str(MODELS / "draft"), str(MODELS / "target")) is None  # one vocabulary, nothing to map
    assert 4000 <= len(tokenizer) <= 8192
    assert tokenizer.eos_token == "<|eos|>" and tokenizer.pad_token == "<|pad|>"
    assert AutoModelForCausalLM.from_pretrained(MODELS / "target").generation_config.eos_token_id == tokenizer.eos_token_id


def test_draft_is_much_smaller_and_the_pair_and_head_fit_in_60_mb():
    draft, target = (AutoModelForCausalLM.from_pretrained(MODELS / n) for n in ("draft", "target"))
    assert draft.num_parameters() * 10 <= target.num_parameters()
    size = sum(f.stat().st_size for f in MODELS.rglob("*") if f.is_file() and f.parent.name in ("draft", "target", "head"))
    assert size <= 60 * 2**20


def test_the_shipped_head_fits_the_shipped_target():
    from tandem.services import head

    target = AutoModelForCausalLM.from_pretrained(MODELS / "target")
    loaded = head.load(MODELS / "head", target.config)  # HeadError naming the field otherwise
    assert loaded.config.taps == (1, 3, 6) and loaded.config.draft_vocab_size < target.config.vocab_size
    results = json.loads((MODELS / "head_results.json").read_text())
    assert results["eval"]["greedy_agreement_per_step"][0] > results["shipped_draft"]["greedy_agreement"]


def test_tokenizer_round_trips_code_exactly(tokenizer):
    texts = [read(f) for f in stdlib_files()[::40]] + load_prompts(PROMPTS)
    texts += ["s = 'naïve café ☕ 日本語'\n\tif x:\r\n        pass  # trailing spaces   \n", "\x00\x7f", ""]
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(ids) == text


def test_results_describe_the_shipped_draft():
    results = json.loads((MODELS / "results.json").read_text())
    shipped = results["drafts"][results["shipped"]]
    config = AutoModelForCausalLM.from_pretrained(MODELS / "draft").config
    assert results["parameters"][results["shipped"]] == AutoModelForCausalLM.from_pretrained(MODELS / "draft").num_parameters()
    assert config.num_hidden_layers == results["shape"]["draft"]["layers"] or results["shipped"] == "truncated"
    assert 0 < shipped["greedy_agreement"] <= 1


@pytest.fixture(scope="module")
def shipped_workers():
    """The shipped pair served by real `tandem worker` processes."""
    from tandem.local import spawn_worker, stop_processes

    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # both at once: each takes seconds to load
        procs = list(pool.map(lambda kind: spawn_worker(kind, str(MODELS / kind), "127.0.0.1", 1, "cpu", "float32"),
                              ("draft", "target")))
    yield {"draft": procs[0][1], "target": procs[1][1]}
    stop_processes([proc for proc, _ in procs])


def test_shipped_pair_greedy_is_token_identical_to_the_target(shipped_workers, redis_url, tokenizer):
    """A trained pair accepts some drafted tokens and rejects others in every generation, which
    random pairs rarely do; the output must still be the target's own, token for token."""
    import asyncio

    import torch

    from tandem.math.params import SamplingParams

    from support.loops import generate, open_session, running_loop

    target = AutoModelForCausalLM.from_pretrained(MODELS / "target").eval()
    prompts = [tokenizer(p)["input_ids"] for p in load_prompts(PROMPTS)[:3]]

    async def run(prompt: list[int], index: int, gamma: int | None):
        async with running_loop([shipped_workers["draft"]], [shipped_workers["target"]], redis_url,
                                (tokenizer.eos_token_id,)) as loop:
            s = await open_session(loop, f"shipped-{index}", prompt, SamplingParams(temperature=0.0), 32, gamma)
            return await generate(loop, s), s

    for i, prompt in enumerate(prompts):
        with torch.no_grad():
            expected = target.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=32)[0, len(prompt):]
        gamma = 3 if i < 2 else None  # fixed γ: the acceptance pattern is deterministic; then adaptive
        out, s = asyncio.run(run(prompt, i, gamma))
        assert out == expected.tolist()
        if gamma:
            assert 0 < s.stats.accepted_tokens < s.stats.drafted_tokens  # real partial acceptance

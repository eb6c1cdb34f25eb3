"""Drafts whose tokenizer differs from the target's (tandem.services.vocabulary): the map between
two vocabularies, the runtime that speaks the target's ids over it, exactness by enumeration with
a negative control, `tandem check` and the refusal with the numbers; then `tandem worker draft
--target-tokenizer` as real processes drafting for the cycle loop with a real target verifier and
Redis: a draft with its ids renumbered, one over a reduced vocabulary and one over a tokenizer
trained on other text, greedy token-identical to the target alone and sampled following its
distribution."""

import asyncio

import grpc
import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from tandem.cli import main as cli
from tandem.math.params import SamplingParams
from tandem.math.sampling import residual
from tandem.services import distributions, vocabulary
from tandem.services.runtime import CacheMiss, ModelRuntime, Step
from tandem.suitability import check_pair
from tandem.v1 import worker_pb2_grpc
from tandem.wire import worker as wire
from tandem.wire.validation import FieldError

from support.loops import (
    assert_first_tokens_follow_the_target,
    generate,
    open_session,
    release,
    running_loop,
    sampled_first_tokens,
)
from support.models import SPECIAL, build_tokenizer, draft_over, llama_config, renumbered_tokenizer, save_random_model
from support.references import hf_greedy

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def target_tokenizer(pair):
    return AutoTokenizer.from_pretrained(pair["target"])


@pytest.fixture(scope="module")
def drafts(pair, target_tokenizer, tmp_path_factory) -> dict[str, str]:
    """The pair's draft over three other tokenizers: the target's with its ids shuffled
    (renumbered), a smaller one trained on the same text (reduced: a subset of the target's
    tokens) and one trained on less text (other: tokens each side lacks), all renumbered."""
    tokenizers = {"renumbered": renumbered_tokenizer(target_tokenizer, 3),
                  "reduced": renumbered_tokenizer(build_tokenizer(280, max_chars=100_000), 4),
                  "other": renumbered_tokenizer(build_tokenizer(300, max_chars=30_000), 5)}
    return {name: draft_over(pair["draft"], target_tokenizer, tokenizer, str(tmp_path_factory.mktemp(name)))
            for name, tokenizer in tokenizers.items()}


@pytest.fixture(scope="module")
def unrelated(pair, tmp_path_factory) -> str:
    """A model over a word-level tokenizer: it shares only the special tokens with the target's."""
    words = SPECIAL + ["<unk>"] + [f"word{i}" for i in range(200)]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token=SPECIAL[2])
    return save_random_model(llama_config(len(words), 1, 32, eos_token_id=2), str(tmp_path_factory.mktemp("words")),
                             7, tokenizer)


def test_a_renumbered_draft_maps_every_token_one_for_one(pair, drafts, target_tokenizer):
    mapped = vocabulary.between(drafts["renumbered"], pair["target"])
    own = AutoTokenizer.from_pretrained(drafts["renumbered"])
    assert mapped.overlap == vocabulary.Overlap(pair["vocab"], pair["vocab"], pair["vocab"])
    for token, target_id in target_tokenizer.get_vocab().items():
        assert mapped.spellings[target_id] == (own.get_vocab()[token],)
        assert mapped.target_of[own.get_vocab()[token]] == target_id


def test_a_reduced_draft_spells_the_tokens_it_lacks(pair, drafts, target_tokenizer):
    mapped = vocabulary.between(drafts["reduced"], pair["target"])
    own = AutoTokenizer.from_pretrained(drafts["reduced"])
    assert mapped.overlap == vocabulary.Overlap(280, 280, pair["vocab"])
    lacking = [t for t in range(pair["vocab"]) if t not in set(mapped.target_of.values())]
    assert len(lacking) == pair["vocab"] - 280
    for t in range(pair["vocab"]):
        text = target_tokenizer.decode([t])
        assert own.decode(list(mapped.spellings[t])) == text, t
        assert len(mapped.spellings[t]) > 1 or t not in lacking


def test_the_same_vocabulary_needs_no_map_and_a_draft_without_tokenizer_is_taken_to_share_it(pair, tmp_path):
    assert vocabulary.between(pair["target"], pair["target"]) is None
    assert vocabulary.between(pair["draft"], pair["target"]) is None  # the pair's draft has no tokenizer


def test_unrelated_tokenizers_are_refused_with_the_numbers(pair, unrelated):
    with pytest.raises(vocabulary.PairMismatch, match=r"share too little: 3 shared tokens: 1\.5% of the draft's 204, "
                                                      rf"1\.0% of the target's {pair['vocab']}; .* at least 50%"):
        vocabulary.between(unrelated, pair["target"])


def test_tandem_check_and_tandem_up_refuse_unrelated_tokenizers_with_the_numbers(pair, unrelated, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("def f(x):\n")
    for argv in (["check", "--draft", unrelated, "--target", pair["target"], "--prompts", str(prompts)],
                 ["up", "--draft-model", unrelated, "--target-model", pair["target"], "--drafter", "model"]):
        with pytest.raises(SystemExit) as exc:
            cli(argv)
        assert "3 shared tokens" in str(exc.value) and "at least 50%" in str(exc.value), argv


def test_target_logits_restrict_the_draft_to_the_shared_tokens(pair, drafts):
    mapped = vocabulary.between(drafts["other"], pair["target"])
    logits = torch.randn(2, mapped.draft_size)
    out = mapped.target_logits(logits)  # [2, target vocab]
    probs = out.softmax(-1)
    restricted = logits[:, mapped.draft_ids].softmax(-1)
    assert torch.allclose(probs[:, mapped.target_ids], restricted)
    assert probs.sum(-1).allclose(torch.ones(2)) and 0 < mapped.overlap.shared < mapped.draft_size


def _token_rule_output(target_probs: np.ndarray, drawn: np.ndarray, reported: np.ndarray) -> np.ndarray:
    """The output distribution of one drafted token, exactly: drawn from `drawn`, verified by the
    token rule against `reported` (accept with min(1, p/q), else the residual of p and q)."""
    ratio = np.divide(target_probs, reported, out=np.ones_like(target_probs), where=reported > 0)
    accept = drawn * np.minimum(1.0, ratio)
    rest = residual(torch.from_numpy(target_probs), torch.from_numpy(reported)).numpy()
    return accept + (1 - accept.sum()) * rest


def test_the_restricted_draft_keeps_the_targets_distribution_exactly_and_an_unrenormalised_one_does_not(pair, drafts):
    """Enumeration in float64 over the target's vocabulary. The negative control drafts from the
    restricted distribution but reports the draft's own probabilities of the shared tokens (not
    renormalised): the output is no longer the target's."""
    mapped = vocabulary.between(drafts["other"], pair["target"])
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        draft_logits = torch.randn(1, mapped.draft_size, generator=g, dtype=torch.float64) * 2
        target_probs = (torch.randn(pair["vocab"], generator=g, dtype=torch.float64) * 2).softmax(-1).numpy()
        served = mapped.target_logits(draft_logits)[0].softmax(-1).numpy()
        assert np.abs(_token_rule_output(target_probs, served, served) - target_probs).max() < 1e-12
        unrenormalised = np.zeros(pair["vocab"])
        unrenormalised[mapped.target_ids.numpy()] = draft_logits[0].softmax(-1)[mapped.draft_ids].numpy()
        wrong = _token_rule_output(target_probs, served, unrenormalised)
        assert 0.5 * np.abs(wrong - target_probs).sum() > 1e-3  # total variation


def _fresh_rows(draft, spelled: list[list[int]], keep: int) -> torch.Tensor:
    """The draft's logits after the last of each of the last `keep` spellings, from scratch."""
    ids = [d for s in spelled for d in s]
    ends = np.cumsum([len(s) for s in spelled])
    with torch.no_grad():
        return draft(torch.tensor([ids])).logits[0, [e - 1 for e in ends[-keep:]]]


def test_the_translated_runtime_reads_target_ids_and_positions(pair, drafts):
    mapped = vocabulary.between(drafts["reduced"], pair["target"])
    runtime = vocabulary.TranslatedRuntime(ModelRuntime(drafts["reduced"], max_cache_bytes=64 << 20), mapped)
    draft = AutoModelForCausalLM.from_pretrained(drafts["reduced"]).eval()
    lacking = sorted(set(range(3, pair["vocab"])) - set(mapped.target_of.values()))
    prompt = pair["prompts"][0] + lacking[:3]  # three tokens the draft spells
    spelled = [list(mapped.spellings[t]) for t in prompt]
    assert runtime.info.vocab_size == pair["vocab"] and runtime.held("s") == 0
    [out] = runtime.extend_batch([Step("s", 0, prompt, keep=2)])
    assert out.shape == (2, pair["vocab"])
    assert torch.allclose(out, mapped.target_logits(_fresh_rows(draft, spelled, 2)), atol=1e-4)
    assert runtime.held("s") == len(prompt)
    assert runtime.model.held("s") == sum(map(len, spelled)) > len(prompt)
    # Back to a target position inside the prompt, then on with other tokens.
    more = [lacking[5], 7, 8]
    [out] = runtime.extend_batch([Step("s", len(prompt) - 2, more, keep=1)])
    spelled_more = spelled[:-2] + [list(mapped.spellings[t]) for t in more]
    assert torch.allclose(out, mapped.target_logits(_fresh_rows(draft, spelled_more, 1)), atol=1e-4)
    assert runtime.held("s") == len(prompt) + 1
    results = runtime.extend_batch([Step("unknown", 4, [5]), Step("long", 0, lacking[:1] * 300, keep=1)])
    assert isinstance(results[0], CacheMiss)
    assert isinstance(results[1], FieldError) and results[1].code == grpc.StatusCode.OUT_OF_RANGE
    assert "spells the context" in str(results[1])
    assert runtime.release("s") and runtime.held("s") == 0


def test_tandem_check_reports_the_overlap_and_the_acceptance_of_a_mapped_pair(pair, drafts):
    prompts = pair["prompts"][:3]
    original = check_pair(pair["draft"], pair["target"], prompts, max_new_tokens=12, max_gamma=4)
    renumbered = check_pair(drafts["renumbered"], pair["target"], prompts, max_new_tokens=12, max_gamma=4)
    assert renumbered.shared_tokens == pair["vocab"] and renumbered.coverage == 1.0
    assert renumbered.greedy_agreement == original.greedy_agreement
    assert renumbered.sampled_acceptance == pytest.approx(original.sampled_acceptance, abs=1e-6)
    reduced = check_pair(drafts["reduced"], pair["target"], prompts, max_new_tokens=12, max_gamma=4)
    assert reduced.shared_tokens == 280 and reduced.shared_of_draft == 1.0
    assert reduced.shared_of_target == pytest.approx(280 / pair["vocab"]) and 0 < reduced.coverage <= 1
    assert "vocabulary          mapped: 280 tokens shared (100.0% of the draft's" in reduced.summary()


# --- through the cycle loop: real worker processes, a real verifier and Redis ------------------


@pytest.fixture(scope="module")
def mapped_workers(pair, drafts):
    from tandem.local import spawn_worker, stop_processes

    procs = {name: spawn_worker("draft", path, "127.0.0.1", 1, "cpu", "float32", echo=False,
                                args=["--target-tokenizer", pair["target"]]) for name, path in drafts.items()}
    yield {name: address for name, (_, address) in procs.items()}
    stop_processes([proc for proc, _ in procs.values()])


def _propose(address: str, session: str, prompt: list[int], gamma: int, params: SamplingParams):
    with grpc.insecure_channel(address) as channel:
        stub = worker_pb2_grpc.DraftWorkerStub(channel)
        return wire.proposal_from_pb(stub.Propose(wire.propose_request(session, 0, prompt, gamma, params), timeout=30))


def test_a_renumbered_draft_worker_drafts_what_the_original_drafts(pair, workers, mapped_workers):
    for params in (GREEDY, SamplingParams(temperature=1.0, seed=3), SamplingParams(temperature=0.8, top_k=5, seed=4)):
        for prompt in pair["prompts"][:3]:
            ours = _propose(mapped_workers["renumbered"], "renumbered", prompt, 4, params)
            theirs = _propose(workers["draft"], "original", prompt, 4, params)
            assert ours.draft_tokens == theirs.draft_tokens
            assert ours.draft_token_probs == pytest.approx(theirs.draft_token_probs, abs=1e-5)
            ours_q, theirs_q = (distributions.unpack(p.draft_distributions, pair["vocab"]) for p in (ours, theirs))
            assert torch.allclose(ours_q, theirs_q, atol=1e-5)


@pytest.mark.parametrize("name", ["renumbered", "reduced", "other"])
def test_greedy_output_is_the_targets_through_a_draft_of_another_tokenizer(name, pair, workers, mapped_workers,
                                                                          redis_url, target_model):
    prompts = pair["prompts"][6:9]

    async def run():
        async with running_loop([mapped_workers[name]], [workers["target"]], redis_url, (pair["eos"],)) as loop:
            out = []
            for i, prompt in enumerate(prompts):
                for gamma in (4, None):
                    s = await open_session(loop, f"tli-{name}-{i}-{gamma}", prompt, GREEDY, 24, gamma)
                    out.append((prompt, await generate(loop, s), s.stats))
                    await release(loop, s)
            return out

    out = asyncio.run(run())
    for prompt, tokens, _ in out:
        assert tokens == hf_greedy(target_model, prompt, 24)
    accepted = sum(c.accepted for _, _, stats in out for c in stats.per_cycle)
    assert all(sum(c.gamma for c in stats.per_cycle) > 0 for _, _, stats in out)
    assert accepted > 0, "the pair's draft, renamed, still agrees with the target"


@pytest.mark.parametrize("name", ["renumbered", "reduced"])
def test_sampled_first_token_through_a_draft_of_another_tokenizer_follows_the_target(name, pair, workers,
                                                                                    mapped_workers, redis_url,
                                                                                    target_model):
    prompt = pair["prompts"][10] + [t for t in range(280, pair["vocab"], 7)][:3]  # tokens the reduced draft spells
    results = sampled_first_tokens(mapped_workers[name], workers["target"], redis_url, pair["eos"], prompt, 300,
                                   "token", f"tli-{name}")
    assert all(gamma > 0 for _, gamma in results), "every first cycle should have drafted"
    assert_first_tokens_follow_the_target(target_model, prompt, [token for token, _ in results])

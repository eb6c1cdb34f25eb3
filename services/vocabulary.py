"""A draft model whose tokenizer differs from the target's: token-level intersection (TLI).

The draft drafts only the tokens whose strings the target's vocabulary holds too, under the
target's ids: its logits over every other token are −inf, so the distribution it draws from (and
reports) is its own restricted to the shared tokens and renormalised. Verification does not
change and stays exact at any temperature: modified rejection sampling keeps the target's
distribution whatever distribution the draft proposes from, as long as the draft reports the
one it drew from (Timor et al., ICML 2025; vLLM and Hugging Face ship the same rule).

The committed sequence reaches the draft worker in target ids. A target token the draft shares
becomes that one draft token; any other is spelled by the draft's tokenizer (its text, encoded),
so that the draft reads the text the target reads, not unknown tokens. A session keeps where
each target token's spelling ends in the draft's cache: calls keep speaking target positions
(cache_len, the counter-based randomness), the draft's cache its own.

Two tokenizers are related enough when the shared tokens make at least MIN_SHARED of the
smaller vocabulary (a draft over a subset of the target's tokens passes, two unrelated
tokenizers that share bytes and a few words do not); whether the pair pays is `tandem check`'s
measurement (acceptance along the target's continuations), not this rule's.
"""

import itertools
import logging
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
import torch
from transformers import AutoConfig, AutoTokenizer

from tandem.services.runtime import CacheMiss, ModelRuntime, Step
from tandem.wire.validation import FieldError

log = logging.getLogger("tandem.worker")

MIN_SHARED = 0.5  # of the smaller vocabulary


class PairMismatch(ValueError):
    """The draft and the target cannot speak one vocabulary."""


@dataclass(frozen=True)
class Overlap:
    """How much of two tokenizers' vocabularies is shared."""

    shared: int
    draft: int  # tokens in the draft's tokenizer
    target: int

    @property
    def of_smaller(self) -> float:
        return self.shared / max(1, min(self.draft, self.target))

    def describe(self) -> str:
        return (f"{self.shared} shared tokens: {self.shared / max(1, self.draft):.1%} of the draft's {self.draft}, "
                f"{self.shared / max(1, self.target):.1%} of the target's {self.target}")


def _space_marks(tokenizer) -> tuple[str, ...]:
    """The marks a tokenizer's strings begin words with ('Ġ' byte-level BPE, '▁' SentencePiece),
    found by tokenizing " a"; both when that tells nothing."""
    ids = tokenizer.encode(" a", add_special_tokens=False)
    if ids:
        first = tokenizer.convert_ids_to_tokens(ids[0])
        if isinstance(first, str) and len(first) > 1 and first.endswith("a") and not first[0].isspace():
            return (first[:-1],)
    return ("\u0120", "\u2581")


def _normalized(tokenizer) -> dict[str, int]:
    """The tokenizer's vocabulary with its word-start mark written as a space (first id wins)."""
    marks = _space_marks(tokenizer)
    out: dict[str, int] = {}
    for token, idx in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1]):
        mark = next((m for m in marks if token.startswith(m)), None)
        out.setdefault(" " + token[len(mark):] if mark else token, idx)
    return out


class VocabularyMap:
    """The shared tokens of a draft's and a target's tokenizers, and how the draft reads and
    writes target ids. draft_size, target_size: the models' logits widths (a model may have
    more rows than its tokenizer has tokens)."""

    def __init__(self, draft_tokenizer, target_tokenizer, draft_size: int, target_size: int) -> None:
        draft_vocab, target_vocab = _normalized(draft_tokenizer), _normalized(target_tokenizer)
        pairs = sorted((draft_vocab[s], target_vocab[s]) for s in draft_vocab.keys() & target_vocab.keys()
                       if draft_vocab[s] < draft_size and target_vocab[s] < target_size)
        self.draft_size, self.target_size = draft_size, target_size
        self.draft_ids = torch.tensor([d for d, _ in pairs], dtype=torch.long)  # [shared]
        self.target_ids = torch.tensor([t for _, t in pairs], dtype=torch.long)  # [shared]
        self.target_of = dict(pairs)  # shared draft id → its target id
        self.overlap = Overlap(len(pairs), len(draft_tokenizer), len(target_tokenizer))
        self.spellings = self._spell_all(draft_tokenizer, target_tokenizer, {t: d for d, t in pairs})

    def _spell_all(self, draft_tokenizer, target_tokenizer, shared: dict[int, int]) -> list[tuple[int, ...]]:
        """Per target id, the draft tokens it becomes: the shared one, else its text encoded
        (a lone byte of a multi-byte character decodes to U+FFFD: the draft reads that), else
        one stand-in token (an empty text)."""
        others = [t for t in range(self.target_size) if t not in shared]
        texts = [target_tokenizer.decode([t]) if t < len(target_tokenizer) else "" for t in others]
        encoded = draft_tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
        stand_in = next((i for i in (draft_tokenizer.unk_token_id, draft_tokenizer.eos_token_id) if i is not None), 0)
        spellings = [(shared[t],) if t in shared else () for t in range(self.target_size)]
        for t, ids in zip(others, encoded):
            spellings[t] = tuple(ids) or (stand_in,)
        return spellings

    def check(self) -> None:
        """PairMismatch, with the numbers, when the tokenizers share too little (MIN_SHARED)."""
        if self.overlap.of_smaller < MIN_SHARED:
            raise PairMismatch(f"the draft's and the target's tokenizers share too little: {self.overlap.describe()}; "
                               f"tandem needs at least {MIN_SHARED:.0%} of the smaller vocabulary shared")

    def spell(self, tokens: list[int]) -> tuple[list[int], list[int]]:
        """Target tokens → (the draft tokens they become, where each one's spelling ends in them)."""
        spelled = [self.spellings[t] for t in tokens]
        return list(itertools.chain.from_iterable(spelled)), list(itertools.accumulate(map(len, spelled)))

    def target_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft logits [n, draft_size] → [n, target_size]: the shared tokens' at their target
        ids, −inf elsewhere (their softmax is the draft's restricted to the shared tokens)."""
        out = logits.new_full((logits.shape[0], self.target_size), float("-inf"))
        out[:, self.target_ids] = logits[:, self.draft_ids]
        return out


def has_tokenizer(model_dir: str) -> bool:
    return (Path(model_dir) / "tokenizer_config.json").exists()


def tokenizer_of(model_dir: str):
    """The directory's tokenizer, or None when it has none."""
    return AutoTokenizer.from_pretrained(model_dir) if has_tokenizer(model_dir) else None


def logits_width(model_dir: str, tokenizer) -> int:
    """A model directory's logits width (its config's vocab_size), the tokenizer's size without one."""
    if (Path(model_dir) / "config.json").exists():
        return int(AutoConfig.from_pretrained(model_dir).vocab_size)
    return len(tokenizer)


def between(draft_dir: str, target_dir: str) -> VocabularyMap | None:
    """The map a draft in draft_dir needs to speak the target's ids (target_dir: the target's
    model or tokenizer directory): None when the draft has no tokenizer (it is taken to share
    the target's) or the same vocabulary, id for id. Raises PairMismatch (MIN_SHARED)."""
    draft_tokenizer, target_tokenizer = tokenizer_of(draft_dir), tokenizer_of(target_dir)
    if target_tokenizer is None:
        raise PairMismatch(f"{target_dir} has no tokenizer (tokenizer_config.json)")
    draft_width, target_width = logits_width(draft_dir, draft_tokenizer), logits_width(target_dir, target_tokenizer)
    if draft_tokenizer is None or (draft_tokenizer.get_vocab() == target_tokenizer.get_vocab()
                                   and draft_width == target_width):
        return None
    vocabulary = VocabularyMap(draft_tokenizer, target_tokenizer, draft_width, target_width)
    vocabulary.check()
    return vocabulary


class TranslatedRuntime:
    """A draft ModelRuntime spoken to in the target's ids over a VocabularyMap: steps come in
    target tokens and positions, logits go out over the target's vocabulary. Drafting never
    keeps tree paths (the verifier does), so there is no keep_paths."""

    def __init__(self, model: ModelRuntime, vocabulary: VocabularyMap) -> None:
        self.model, self.vocabulary = model, vocabulary
        self.device, self.forward_pass = model.device, model.forward_pass  # the Batcher's and the banner's
        eos = tuple(vocabulary.target_of[d] for d in model.info.eos_token_ids if d in vocabulary.target_of)
        self.info = replace(model.info, vocab_size=vocabulary.target_size, eos_token_ids=eos,
                            model=f"{model.info.model} (target ids: {vocabulary.overlap.shared} shared tokens)")
        self._ends: dict[str, list[int]] = {}  # session → ends[n]: draft tokens held for its first n target tokens

    @property
    def cache_bytes(self) -> int:
        return self.model.cache_bytes

    @property
    def token_bytes(self) -> int:
        return self.model.token_bytes

    @property
    def num_sessions(self) -> int:
        return self.model.num_sessions

    def held(self, session_id: str) -> int:
        """Target tokens of the session the draft's cache holds."""
        ends = self._ends.get(session_id)
        return len(ends) - 1 if ends and self.model.held(session_id) else 0

    def extend_batch(self, steps: list[Step]) -> list:
        """ModelRuntime.extend_batch in target ids: each step's tokens spelled in draft tokens,
        its logits those after the last spelling of each kept token, over the target's ids."""
        results: list = [None] * len(steps)
        runs = []  # (index, draft step, rows of its logits to keep, the session's ends after it)
        for i, step in enumerate(steps):
            ends = self._ends.get(step.session_id, [0])
            if step.cache_len >= len(ends):
                self._ends.pop(step.session_id, None)
                results[i] = CacheMiss(step.session_id)
                continue
            tokens, local = self.vocabulary.spell(step.tokens)  # local: where each spelling ends in `tokens`
            if step.parents is not None and len(tokens) != len(step.tokens):
                raise ValueError("a tree's nodes are drafted tokens, shared one for one")
            keep = step.keep or len(step.tokens)
            first = local[-keep - 1] if keep < len(local) else 0
            start = ends[step.cache_len]
            after = ends[:step.cache_len + 1] + [start + e for e in local]
            if after[-1] > self.model.info.max_context:
                results[i] = FieldError(grpc.StatusCode.OUT_OF_RANGE, "tokens",
                                        f"the draft spells the context in {after[-1]} of its tokens, past its "
                                        f"{self.model.info.max_context}")
                continue
            rows = [e - 1 - first for e in local[-keep:]]
            runs.append((i, replace(step, cache_len=start, tokens=tokens, keep=len(tokens) - first), rows, after))
        if runs:
            for (i, step, rows, after), out in zip(runs, self.model.extend_batch([run[1] for run in runs])):
                if isinstance(out, torch.Tensor):
                    self._ends[step.session_id] = after
                    out = self.vocabulary.target_logits(out[rows])
                else:
                    self._ends.pop(step.session_id, None)
                results[i] = out
        self._forget_evicted()
        return results

    def release(self, session_id: str) -> bool:
        self._ends.pop(session_id, None)
        return self.model.release(session_id)

    def _forget_evicted(self) -> None:
        """Drop the ends of sessions the model's cache evicted, once they outnumber its sessions."""
        if len(self._ends) > 2 * self.model.num_sessions + 64:
            for session_id in [s for s in self._ends if not self.model.held(s)]:
                del self._ends[session_id]

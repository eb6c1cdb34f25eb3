"""Streaming text equals the decoded whole, chunk boundaries anywhere, UTF-8 never split."""

import copy
import random

import pytest

from tandem.orchestrator.detokenizer import IncrementalDetokenizer

from support.models import build_tokenizer

TEXTS = ["def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
         "naïve café — ünïcödé 🐍 and 中文 mixed\twith tabs\r\n",
         "    x = {'a': [1, 2, 3]}  # comment\n\n\nclass A(B):\n    pass\n"]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(300, max_chars=100_000)


@pytest.mark.parametrize("text", TEXTS)
def test_stream_of_any_chunking_concatenates_to_the_whole_decode(tokenizer, text):
    ids = tokenizer.encode(text)
    whole = tokenizer.decode(ids, skip_special_tokens=True)
    rng = random.Random(7)
    for _ in range(20):
        detok, parts, i = IncrementalDetokenizer(tokenizer), [], 0
        while i < len(ids):
            n = rng.randint(1, 4)
            chunk = ids[i:i + n]
            i += n
            part = detok.push(chunk, final=i >= len(ids))
            assert "\ufffd" not in part or i >= len(ids)
            parts.append(part)
        assert "".join(parts) == whole


def test_no_tokenizer_gives_no_text():
    assert IncrementalDetokenizer(None).push([1, 2, 3], final=True) == ""


def test_the_backend_decodes_as_the_tokenizer_does(tokenizer):
    """The Rust backend's decode stands in for tokenizer.decode only where the text is the same:
    special tokens skipped, and a tokenizer that cleans up spaces keeps its own decode."""
    rng = random.Random(3)
    for _ in range(200):
        ids = [rng.randrange(len(tokenizer)) for _ in range(rng.randint(0, 12))]
        assert IncrementalDetokenizer(tokenizer)._decode_ids(ids) == tokenizer.decode(ids, skip_special_tokens=True)
    cleaning = copy.copy(tokenizer)
    cleaning.clean_up_tokenization_spaces = True
    ids = tokenizer.encode("a , b .")
    assert IncrementalDetokenizer(cleaning)._decode_ids(ids) == cleaning.decode(ids, skip_special_tokens=True)

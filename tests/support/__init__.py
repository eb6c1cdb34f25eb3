"""Test support, not tests: what several test modules share, split by idea. A test module imports
these (`from support.models import llama_config`), never another test module
(tests/test_layout.py checks it).

- `models`: tiny random Llama models with a real tokenizer, loaded through from_pretrained;
- `workers`: a draft worker and a target verifier served in this process, and calls to them;
- `jobs`: a worker's job run alone, the unbatched reference for batched passes;
- `loops`: the cycle loop on real worker processes and a real Redis, without Ray;
- `references`: what outputs are checked against: Hugging Face's own decoding and warpers, and
  the greedy walk down a token tree;
- `enumeration`: a toy target and draft over a vocabulary small enough to enumerate;
- `spans`: OTLP spans as the test receiver holds them.

pytest puts tests/ on sys.path (its default `prepend` import mode inserts the folder of
conftest.py and of each test module, none of them a package), so `support` imports from there
with nothing configured, while the checkout's root stays off sys.path.
"""

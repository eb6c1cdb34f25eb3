"""A random draft/target pair with a real tokenizer, built in seconds with no downloads.

It stands in until a trained pair is shipped in models/, and the tests build their tiny models
with it. The weights are random, so the text is gibberish and acceptance says nothing about a
real pair; the mechanics (tokenizer, from_pretrained, caches, exactness) are the real ones.
"""

import os
import sysconfig
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIAL = ["<|pad|>", "<|bos|>", "<|eos|>"]


def _stdlib_sample(max_chars: int) -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    texts, total = [], 0
    for path in sorted(root.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        texts.append(text)
        total += len(text)
        if total >= max_chars:
            break
    return texts


def build_tokenizer(vocab_size: int, max_chars: int = 400_000) -> PreTrainedTokenizerFast:
    """Byte-level BPE trained on a slice of the standard library."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_stdlib_sample(max_chars), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=SPECIAL[0], bos_token=SPECIAL[1],
                                   eos_token=SPECIAL[2])


def llama_config(vocab_size: int, layers: int, hidden: int, eos_token_id: int, max_context: int = 1024,
                 init_std: float = 0.02) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=hidden * 2,
        num_hidden_layers=layers, num_attention_heads=max(1, hidden // 32), num_key_value_heads=max(1, hidden // 64),
        max_position_embeddings=max_context, pad_token_id=0, bos_token_id=1, eos_token_id=eos_token_id,
        initializer_range=init_std, tie_word_embeddings=False,
    )


def save_random_model(config: LlamaConfig, out_dir: str, seed: int, tokenizer=None) -> str:
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    model.save_pretrained(out_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)
    return out_dir


def build_random_pair(out_dir: str, vocab_size: int = 1024, seed: int = 0) -> tuple[str, str]:
    """A random target (4 layers, d=256) and draft (1 layer, d=64) sharing one tokenizer."""
    tokenizer = build_tokenizer(vocab_size)
    vocab = len(tokenizer)
    eos = tokenizer.convert_tokens_to_ids(SPECIAL[2])
    target = save_random_model(llama_config(vocab, 4, 256, eos), os.path.join(out_dir, "target"), seed, tokenizer)
    draft = save_random_model(llama_config(vocab, 1, 64, eos), os.path.join(out_dir, "draft"), seed + 1, tokenizer)
    return draft, target

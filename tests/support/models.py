"""Tiny random Llama models with a real tokenizer, built in seconds with no downloads and loaded
through from_pretrained, the path users take.

Random weights say nothing about acceptance; the mechanics (tokenizer, from_pretrained,
caches, exactness) are the real ones.
"""

import json
import sysconfig
from pathlib import Path

import torch
from tokenizers import ByteLevelBPETokenizer, Tokenizer
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

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
    """Byte-level BPE (pad, bos and eos specials) trained on a slice of the standard library."""
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(_stdlib_sample(max_chars), vocab_size=vocab_size, min_frequency=0,
                            special_tokens=SPECIAL, show_progress=False)
    return _fast(bpe._tokenizer)


def _fast(tokenizer: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token=SPECIAL[0], bos_token=SPECIAL[1],
                                   eos_token=SPECIAL[2], model_max_length=1024)


def renumbered_tokenizer(tokenizer: PreTrainedTokenizerFast, seed: int) -> PreTrainedTokenizerFast:
    """The same tokenizer (tokens, merges, specials) with its ids shuffled: token i becomes order[i]."""
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    order = torch.randperm(len(tokenizer), generator=torch.Generator().manual_seed(seed)).tolist()
    spec["model"]["vocab"] = {token: order[i] for token, i in spec["model"]["vocab"].items()}
    for added in spec["added_tokens"]:
        added["id"] = order[added["id"]]
    return _fast(Tokenizer.from_str(json.dumps(spec)))


def draft_over(source_dir: str, source_tokenizer, tokenizer, out_dir: str) -> str:
    """The model in source_dir (which reads source_tokenizer's ids) over another tokenizer: each
    token's embedding and output rows are the source's for the same string, zero for a string the
    source lacks; saved with that tokenizer."""
    source = AutoModelForCausalLM.from_pretrained(source_dir)
    config = LlamaConfig(**{**source.config.to_dict(), "vocab_size": len(tokenizer)})
    model = LlamaForCausalLM(config)
    state = source.state_dict()
    known = source_tokenizer.get_vocab()
    rows = {new: known[token] for token, new in tokenizer.get_vocab().items() if token in known}
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        weight = torch.zeros(len(tokenizer), state[name].shape[1])
        weight[list(rows)] = state[name][list(rows.values())]
        state[name] = weight
    model.load_state_dict(state)
    model.generation_config.eos_token_id = model.config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


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


def save_random_head(target_dir: str, out_dir: str, seed: int, taps: tuple[int, ...], draft_vocab: int | None = None,
                     std: float = 0.1) -> str:
    """A random EAGLE-3 head for the target in target_dir (tandem.services.head), saved as
    SpecForge saves one (no embeddings): a reduced draft vocabulary (draft_vocab) maps to every
    other target id."""
    from transformers import AutoConfig

    from tandem.services import head

    t = AutoConfig.from_pretrained(target_dir)
    vocab = draft_vocab or t.vocab_size
    config = head.HeadConfig(t.hidden_size, t.intermediate_size, t.num_attention_heads, t.num_key_value_heads,
                             t.hidden_size // t.num_attention_heads, t.rms_norm_eps, 10000.0, t.max_position_embeddings,
                             t.vocab_size, vocab, t.hidden_size, taps)
    torch.manual_seed(seed)
    module = head.Eagle3Head(config)
    with torch.no_grad():
        for p in module.parameters():
            if p.dim() > 1:
                p.normal_(0, std)
        if draft_vocab:
            step = t.vocab_size // draft_vocab
            used = torch.arange(0, step * draft_vocab, step)  # distinct target ids
            module.d2t.copy_(used - torch.arange(draft_vocab))
            module.t2d.zero_()
            module.t2d[used] = True
    head.save(module, out_dir)
    return out_dir

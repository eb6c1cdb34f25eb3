"""An EAGLE-3 head (Li et al. 2025): one decoder layer that drafts from the target's own hidden
states, as a module, in the files SpecForge and vLLM's `speculators` write.

Row t of the head reads two things: the target's hidden states after three of its layers (the
taps) at position t, side by side and projected from 3·H to H by `fc`, and the embedding of the
token at t + 1. It predicts the token at t + 2. Its attention's input is both halves side by
side (2·H wide), each RMS-normed (`input_layernorm` the embedding, `hidden_norm` the hidden
state); the hidden state is also the residual. A drafting step past the committed tokens has
no target features: it reads the head's own output of the step before (pre-norm) instead, which
is how EAGLE-3 trains it ("training-time test"). Logits cover a draft vocabulary of
`draft_vocab_size` tokens: draft id d is target id d + d2t[d].

The files: `config.json` (architectures ["LlamaForCausalLMEagle3"], the Llama sizes of the one
layer, `draft_vocab_size`, `target_hidden_size`, and the taps) and `model.safetensors`
(`midlayer.*`, `fc.weight` [H, 3·H], `norm.weight`, `lm_head.weight` [draft vocab, H], `d2t`
[draft vocab] int64 offsets, `t2d` [V] bool; `embed_tokens.weight` optional: SpecForge leaves
it out, and the head then reads the target's embeddings, as vLLM and SGLang do).

The taps are the part engines disagree on. vLLM and `speculators` state them at the top level
(`eagle_aux_hidden_state_layer_ids`) as the layers whose input is tapped: j is layer j − 1's
output, Hugging Face's hidden_states[j]. SGLang and SpecForge state them under `eagle_config`
as the layers whose output is tapped: i is layer i's output, vLLM's i + 1. `HeadConfig.taps`
holds vLLM's numbering, read from either key by its own convention (both present must agree),
and `save` writes both. A head run on other taps than it was trained on drafts worse, silently,
so `load` refuses one whose config states none, taps the target cannot have, and sizes that do
not fit the target, naming the field.
"""

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

ARCHITECTURE = "LlamaForCausalLMEagle3"
TAPS_KEY = "eagle_aux_hidden_state_layer_ids"


class HeadError(ValueError):
    """A head that does not fit its target: `field` names what is wrong."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class HeadConfig:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int
    taps: tuple[int, ...]  # vLLM's numbering: the hidden state entering each of these target layers

    @classmethod
    def from_dict(cls, c: dict) -> "HeadConfig":
        if ARCHITECTURE not in c.get("architectures", []):
            raise HeadError("architectures", f"a head's config.json names {ARCHITECTURE}, got {c.get('architectures')}")
        rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
        if rope.get("rope_type", rope.get("type", "default")) != "default":
            raise HeadError("rope_scaling", f"only the default rotary embedding is supported, got {rope}")
        for flag, plain in (("norm_before_residual", False), ("fc_norm", False), ("norm_output", True)):
            if bool(c.get(flag, plain)) != plain:
                raise HeadError(flag, f"heads with {flag}={c[flag]} are not supported")
        taps = _taps(c)
        hidden = c["hidden_size"]
        return cls(
            hidden, c["intermediate_size"], c["num_attention_heads"], c.get("num_key_value_heads") or
            c["num_attention_heads"], c.get("head_dim") or hidden // c["num_attention_heads"], c.get("rms_norm_eps", 1e-6),
            rope.get("rope_theta", c.get("rope_theta", 10000.0)), c.get("max_position_embeddings", 2048), c["vocab_size"],
            c.get("draft_vocab_size") or c["vocab_size"], c.get("target_hidden_size") or hidden, tuple(taps))

    def to_dict(self) -> dict:
        c = asdict(self)
        taps = c.pop("taps")
        return {"architectures": [ARCHITECTURE], "model_type": "llama", "num_hidden_layers": 1, **c,
                "tie_word_embeddings": False, TAPS_KEY: list(taps),
                "eagle_config": {TAPS_KEY: [t - 1 for t in taps], "use_aux_hidden_state": True}}

    def check(self, target) -> None:
        """Refuse a head that cannot read this target (a transformers config), naming the field."""
        layers = target.num_hidden_layers
        if len(self.taps) != 3 or list(self.taps) != sorted(set(self.taps)):
            raise HeadError(TAPS_KEY, f"need three increasing target layers, got {list(self.taps)}")
        if not all(0 <= t <= layers for t in self.taps):
            raise HeadError(TAPS_KEY, f"taps {list(self.taps)} (vLLM's numbering: the input of layer j) do not fit "
                            f"a target of {layers} layers: each must be in 0..{layers}")
        if self.target_hidden_size != target.hidden_size:
            raise HeadError("target_hidden_size", f"the head reads hidden states of width {self.target_hidden_size}; "
                            f"the target's are {target.hidden_size}")
        if self.vocab_size != target.vocab_size:
            raise HeadError("vocab_size", f"the head's vocabulary is {self.vocab_size} tokens; the target's "
                            f"{target.vocab_size}")
        if self.draft_vocab_size > self.vocab_size:
            raise HeadError("draft_vocab_size", f"{self.draft_vocab_size} is larger than the vocabulary "
                            f"({self.vocab_size})")


def _taps(c: dict) -> tuple[int, ...]:
    """The config's taps in vLLM's numbering, from whichever key states them (see the module's
    docstring). HeadError when neither does, or the two disagree."""
    top = c.get(TAPS_KEY)
    nested = (c.get("eagle_config") or {}).get(TAPS_KEY)
    from_nested = [i + 1 for i in nested] if nested else None  # the output of layer i is the input of i + 1
    if top and from_nested and list(top) != from_nested:
        raise HeadError(TAPS_KEY, f"{top} (vLLM's numbering: inputs) and eagle_config's {nested} (SGLang's: "
                        "outputs) name different layers")
    taps = top or from_nested
    if not taps:
        raise HeadError(TAPS_KEY, "the head's config states no tap layers: add the target layers whose input "
                        f"hidden states it was trained on as {TAPS_KEY} (vLLM's numbering; for a SpecForge head "
                        "on a target of L layers, by default 2, L//2 and L−3)")
    return tuple(int(t) for t in taps)


def rotary_inv_freq(c: HeadConfig) -> torch.Tensor:
    """[head_dim / 2] the default rotary embedding's frequencies."""
    return 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float32) / c.head_dim))


class _Attention(nn.Module):
    def __init__(self, c: HeadConfig) -> None:
        super().__init__()
        d, h, kv = c.head_dim, c.num_attention_heads, c.num_key_value_heads
        self.q_proj = nn.Linear(2 * c.hidden_size, h * d, bias=False)
        self.k_proj = nn.Linear(2 * c.hidden_size, kv * d, bias=False)
        self.v_proj = nn.Linear(2 * c.hidden_size, kv * d, bias=False)
        self.o_proj = nn.Linear(h * d, c.hidden_size, bias=False)


class _MLP(nn.Module):
    def __init__(self, c: HeadConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _Midlayer(nn.Module):
    def __init__(self, c: HeadConfig) -> None:
        super().__init__()
        self.self_attn = _Attention(c)
        self.mlp = _MLP(c)
        self.input_layernorm = nn.RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.hidden_norm = nn.RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(c.hidden_size, eps=c.rms_norm_eps)


class Eagle3Head(nn.Module):
    """The head's weights, named as the files name them, and a training forward (`unroll`);
    serving runs them through tandem.services.head_pass."""

    def __init__(self, config: HeadConfig, own_embeddings: bool = False) -> None:
        super().__init__()
        c = self.config = config
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size) if own_embeddings else None
        self.fc = nn.Linear(len(c.taps) * c.target_hidden_size, c.hidden_size, bias=False)
        self.midlayer = _Midlayer(c)
        self.norm = nn.RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(c.vocab_size, dtype=torch.bool))

    def draft_to_target(self) -> torch.Tensor:
        """[draft vocab] the target id of each draft id."""
        return torch.arange(self.config.draft_vocab_size, device=self.d2t.device) + self.d2t

    def unroll(self, embed: torch.Tensor, features: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """The training forward of EAGLE-3's training-time test, as serving runs it: features
        [B, T, 3·H] the target's at positions 0..T−1, embed [B, T + steps − 1, H] the embeddings of
        the tokens at positions 1..T + steps − 1 → per step k < steps the logits [B, T, draft vocab]
        at each row t for the token at t + k + 2. Step 0 reads the features and the token at t + 1;
        step k reads step k−1's output at the same row and the token at t + k + 1, sits at position
        t + k, and attends to step 0's rows up to t and to its own row's earlier steps, exactly as
        a drafting step past row t attends to the head's cache."""
        c, layer = self.config, self.midlayer
        B, T, _ = features.shape
        h, kv, d = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        hidden = self.fc(features)  # [B, T, H]
        inv_freq = rotary_inv_freq(c).to(embed.device)
        causal = torch.ones(T, T, dtype=torch.bool, device=embed.device).tril()
        keys, values, out = [], [], []
        for k in range(steps):
            x = torch.cat((layer.input_layernorm(embed[:, k:k + T]), layer.hidden_norm(hidden)), -1)  # [B, T, 2H]
            angles = torch.outer(torch.arange(k, T + k, device=embed.device).float(), inv_freq)  # [T, d/2]
            cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
            a = layer.self_attn
            q = _rotate(a.q_proj(x).view(B, T, h, d), cos, sin).transpose(1, 2)  # [B, h, T, d]
            keys.append(_rotate(a.k_proj(x).view(B, T, kv, d), cos, sin).transpose(1, 2).repeat_interleave(h // kv, 1))
            values.append(a.v_proj(x).view(B, T, kv, d).transpose(1, 2).repeat_interleave(h // kv, 1))
            scale = 1.0 / math.sqrt(d)
            first = (q @ keys[0].transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))  # [B, h, T, T]
            own = [(q * kk).sum(-1, keepdim=True) * scale for kk in keys[1:]]  # [B, h, T, 1] each
            weights = torch.cat([first, *own], -1).softmax(-1)
            att = weights[..., :T] @ values[0]
            for j, vv in enumerate(values[1:]):
                att = att + weights[..., T + j:T + j + 1] * vv
            hidden = hidden + a.o_proj(att.transpose(1, 2).reshape(B, T, h * d))
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
            out.append(self.lm_head(self.norm(hidden)))
        return out


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, heads, d] rotated at its rows' positions (cos, sin [T, d])."""
    half = x.shape[-1] // 2
    cos, sin = cos[:, None], sin[:, None]
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


def load(directory: str | Path, target_config) -> Eagle3Head:
    """The head in `directory`, checked against the target's transformers config. Raises HeadError
    naming the field that does not fit, FileNotFoundError when the files are missing."""
    directory = Path(directory)
    config = HeadConfig.from_dict(json.loads((directory / "config.json").read_text()))
    config.check(target_config)
    weights = load_file(directory / "model.safetensors")
    head = Eagle3Head(config, own_embeddings="embed_tokens.weight" in weights)
    expected = head.state_dict()
    for name, tensor in weights.items():
        if name not in expected:
            raise HeadError(name, "not a weight of an EAGLE-3 head (midlayer.*, fc, norm, lm_head, d2t, t2d, "
                            "embed_tokens)")
        if tensor.shape != expected[name].shape:
            raise HeadError(name, f"shape {list(tensor.shape)}; this config needs {list(expected[name].shape)}")
    missing = [n for n in expected if n not in weights and n not in ("d2t", "t2d")]
    if config.draft_vocab_size < config.vocab_size and "d2t" not in weights:
        missing.insert(0, "d2t")  # a reduced vocabulary needs its map; a full one is the identity
    if missing:
        raise HeadError(missing[0], "missing from model.safetensors")
    head.load_state_dict({**head.state_dict(), **{n: t.to(expected[n].dtype) for n, t in weights.items()}})
    targets = head.draft_to_target()
    if targets.min() < 0 or targets.max() >= config.vocab_size or targets.unique().numel() != targets.numel():
        raise HeadError("d2t", "draft id + d2t must map the draft vocabulary to distinct target ids")
    return head.eval()


def save(head: Eagle3Head, directory: str | Path) -> None:
    """Write the head as SpecForge and speculators do: config.json and model.safetensors."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(head.config.to_dict(), indent=2) + "\n")
    save_file({n: t.detach().contiguous() for n, t in head.state_dict().items()}, directory / "model.safetensors")

"""A lean forward pass for Llama-architecture models: the same function as Hugging Face's
`LlamaForCausalLM`, in a fraction of the operator calls.

A worker's forward pass covers a handful of tokens (one draft step, a verify block). At that
size it costs operator dispatch and weight reads, not arithmetic. Hugging Face's module tree
spends about a third of a one-token pass of the shipped target in Python and small ops
(benchmarks/forward_pass.py). This pass reads the same weights, loaded through
`from_pretrained`. Q, K and V are one matmul, gate and up are another, and RMSNorm is one
op. Keys and values go into a per-session buffer grown by doubling, so cropping a cache is
free. It keeps Hugging Face's order of floating-point operations where they are not fused.
Logits agree to ~1e-5 (tests/test_llama_pass.py), and greedy outputs match.

Models this pass does not cover exactly (`unsupported` says why) run through Hugging Face.
"""

import itertools
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from tandem.math import tree

# RoPE variants whose frequencies are fixed at load time (dynamic ones change with length).
STATIC_ROPE = ("default", "linear", "llama3")
# Queries × keys up to which one session's attention on the CPU takes three small products instead
# of the fused kernel (a verify block over a long context; a decode step over any context).
SMALL_ATTENTION = 16384


def to_column_major(w: torch.Tensor) -> torch.Tensor:
    """The same [out, in] values stored column-major, so that F.linear's weight.T is row-major:
    the operand layout MKL's sgemm runs fastest with for inputs of a few rows."""
    return w.t().contiguous().t()


def unsupported(model: torch.nn.Module) -> str | None:
    """Why `LlamaPass` cannot run this model exactly, or None when it can."""
    config = model.config
    if type(model).__name__ != "LlamaForCausalLM":
        return f"{type(model).__name__} is not LlamaForCausalLM"
    if config.hidden_act != "silu":
        return f"hidden_act {config.hidden_act!r}"
    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        return "attention or MLP biases"
    if getattr(config, "pretraining_tp", 1) != 1:
        return "pretraining_tp > 1"
    rope = model.model.rotary_emb.rope_type
    if rope not in STATIC_ROPE:
        return f"rope_type {rope!r}"
    return None


class KVBuffer:
    """Keys and values of one session: [layers, 2, kv_heads, capacity, head_dim]. Positions
    past the caller's cache_len are stale and get overwritten, so a crop costs nothing."""

    def __init__(self, data: torch.Tensor) -> None:
        self.data = data

    @property
    def capacity(self) -> int:
        return self.data.shape[3]

    @property
    def nbytes(self) -> int:
        return self.data.nelement() * self.data.element_size()

    def keep_path(self, start: int, nodes: list[int]) -> None:
        """After a tree's pass at start..: keep the keys and values of `nodes` (tree indices, a
        root-to-node path) at start, start+1, … and drop the other branches' (they are stale)."""
        self.data[:, :, :, start:start + len(nodes)] = self.data[:, :, :, [start + i for i in nodes]]

    def reserve(self, length: int, held: int) -> None:
        """Make room for `length` positions, copying the first `held` when it grows."""
        if length <= self.capacity:
            return
        grown = self.data.new_empty(*self.data.shape[:3], max(length, 2 * self.capacity), self.data.shape[4])
        grown[:, :, :, :held] = self.data[:, :, :, :held]
        self.data = grown


@dataclass
class Feed:
    """One session's part of a forward pass: tokens at positions start.. over the first `start`
    positions of its cache; logits wanted for the last `keep`. With `parents` (a token tree's,
    tandem.math.tree: node i under parents[i], −1 under the root, the last committed token), the
    tokens are the tree's last nodes, and the cache holds its earlier ones just before them,
    from the root's next position r = start − (earlier nodes) on: node i's keys and values sit
    at r + i, and it sees the committed tokens and its own ancestors, at position r + its depth − 1."""

    cache: Any  # the pass's: a KVBuffer, or a DynamicCache for Hugging Face's
    start: int
    tokens: list[int]
    keep: int
    parents: tuple[int, ...] | None = None

    @property
    def root(self) -> int:
        """Where a tree's first node sits in the cache (the committed tokens end there)."""
        return self.start - (len(self.parents) - len(self.tokens))

    def positions(self) -> list[int]:
        """The tokens' absolute positions (rotary embedding)."""
        if self.parents is None:
            return list(range(self.start, self.start + len(self.tokens)))
        return [self.root + d - 1 for d in tree.depths(self.parents)[-len(self.tokens):]]

    def visible(self, device: torch.device) -> torch.Tensor:
        """[n, start+n] bool on device: the keys each token may attend to."""
        n = len(self.tokens)
        allowed = torch.ones(n, self.start + n, dtype=torch.bool, device=device).tril(self.start)
        if self.parents is not None:
            allowed[:, self.root:] = torch.tensor(tree.ancestor_mask(self.parents)[-n:], device=device)
        return allowed


class LlamaPass:
    """The forward pass of one Llama model. Check `unsupported(model)` first."""

    name = "llama"
    batched = True  # forward_batch runs all feeds in one pass

    def __init__(self, model: torch.nn.Module, column_major: bool) -> None:
        c = model.config
        self.hidden, self.heads, self.kv_heads = c.hidden_size, c.num_attention_heads, c.num_key_value_heads
        self.head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.intermediate, self.eps = c.intermediate_size, c.rms_norm_eps
        layout = to_column_major if column_major else torch.Tensor.contiguous
        with torch.no_grad():
            self.layers = [self._layer(block, layout) for block in model.model.layers]
            self.embed = model.model.embed_tokens.weight.detach()  # [V, H]; rows are looked up
            self.norm = model.model.norm.weight.detach()
            self.head = layout(model.lm_head.weight.detach().clone())  # [V, H], its own copy even if tied
        rotary = model.model.rotary_emb
        self.inv_freq, self.rope_scale = rotary.inv_freq.detach().float(), rotary.attention_scaling
        self.dtype, self.device = self.embed.dtype, self.embed.device
        self._cos = self._sin = torch.empty(0, self.head_dim, dtype=self.dtype, device=self.device)

    @staticmethod
    def _layer(block, layout) -> dict[str, torch.Tensor]:
        a, m = block.self_attn, block.mlp
        return {
            "qkv": layout(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])),  # [(h+2kv)·d, H]
            "o": layout(a.o_proj.weight.detach()),
            "gate_up": layout(torch.cat([m.gate_proj.weight, m.up_proj.weight])),  # [2I, H]
            "down": layout(m.down_proj.weight.detach()),
            "attn_norm": block.input_layernorm.weight.detach(),
            "mlp_norm": block.post_attention_layernorm.weight.detach(),
        }

    def new_cache(self, length: int) -> KVBuffer:
        capacity = max(16, 1 << (length - 1).bit_length())
        return KVBuffer(torch.empty(len(self.layers), 2, self.kv_heads, capacity, self.head_dim,
                                    dtype=self.dtype, device=self.device))

    @staticmethod
    def cache_nbytes(cache: KVBuffer) -> int:
        return cache.nbytes

    @staticmethod
    def keep_path(cache: KVBuffer, start: int, nodes: list[int]) -> None:
        cache.keep_path(start, nodes)

    def forward(self, cache: KVBuffer, start: int, tokens: list[int], keep: int) -> torch.Tensor:
        """Run tokens at positions start.. over the cache's first `start` positions, writing
        theirs → logits [keep, V] of the last `keep` tokens. Call under inference_mode."""
        return self.forward_batch([Feed(cache, start, tokens, keep)])[0]

    def forward_batch(self, feeds: list["Feed"]) -> list[torch.Tensor]:
        """One pass for several sessions: their new tokens concatenated into one [T, H] input for
        the projections, the rotary embedding and the MLPs (T = all their tokens), attention per
        session against its own cache → each feed's logits [keep, V]. Call under inference_mode."""
        lengths = [len(f.tokens) for f in feeds]
        masks = []
        for f, n in zip(feeds, lengths):
            f.cache.reserve(f.start + n, held=f.start)
            masks.append(self._mask(f))
        cos, sin = self._rope(feeds)  # [T, 1, d] each
        tokens = [t for f in feeds for t in f.tokens]
        x = self.embed[torch.tensor(tokens, device=self.device)]  # [T, H]
        for index, layer in enumerate(self.layers):
            h = self._rms_norm(x, layer["attn_norm"])
            caches = [(f.cache.data[index], f.start) for f in feeds]
            x = x + self._attention(layer, h, caches, lengths, cos, sin, masks)
            gate, up = F.linear(self._rms_norm(x, layer["mlp_norm"]), layer["gate_up"]).split(self.intermediate, -1)
            x = x + F.linear(F.silu(gate) * up, layer["down"])
        if len(feeds) == 1:
            return [F.linear(self._rms_norm(x[-feeds[0].keep:], self.norm), self.head)]  # [keep, V]
        last = torch.cat([x[end - f.keep:end] for f, end in zip(feeds, itertools.accumulate(lengths))])  # [K, H]
        logits = F.linear(self._rms_norm(last, self.norm), self.head)  # [K, V], K = the keeps' sum
        return list(logits.split([f.keep for f in feeds]))

    def _small(self, n: int, length: int) -> bool:
        """Whether n queries over `length` keys take the three small products (else the fused kernel)."""
        return self.device.type == "cpu" and n * length <= SMALL_ATTENTION

    def _mask(self, feed: Feed) -> torch.Tensor | None:
        """What the feed's n queries may see (Feed.visible: in a chain, query i sees keys
        0..start+i), in the form their attention path takes. None for one query (it sees
        everything); for the small products an additive [group·n, L] bias in their row order, else
        a boolean [n, L] for the fused kernel."""
        start, n = feed.start, len(feed.tokens)
        if n == 1:
            return None
        allowed = feed.visible(self.device)  # [n, L]
        if not self._small(n, start + n):
            return allowed
        bias = torch.zeros(n, start + n, dtype=self.dtype, device=self.device).masked_fill_(~allowed, float("-inf"))
        return bias.repeat(self.heads // self.kv_heads, 1)  # [group·n, L]

    def _attention(self, layer, h, caches, lengths, cos, sin, masks) -> torch.Tensor:
        """h [T, H] → attention output [T, H]; caches: per feed, (its layer's [2, kv, capacity, d]
        buffer, its start). Per session: one copy of its new keys and values, its attention
        written straight into the output's rows."""
        d, heads, kv_heads = self.head_dim, self.heads, self.kv_heads
        q, k, v = F.linear(h, layer["qkv"]).split([heads * d, kv_heads * d, kv_heads * d], -1)  # [T, ·]
        q = _rotate(q.view(-1, heads, d), cos, sin) * d**-0.5  # [T, h, d], scaled once for every session
        k = _rotate(k.view(-1, kv_heads, d), cos, sin)  # [T, kv, d]
        new = torch.stack((k, v.view(-1, kv_heads, d))).transpose(1, 2)  # [2, kv, T, d]
        out = q.new_empty(q.shape[0], heads * d)  # [T, h·d]
        at = 0
        for (kv, start), n, mask in zip(caches, lengths, masks):
            end = start + n
            kv[:, :, start:end] = new[:, :, at:at + n]
            self._attend(q[at:at + n], kv[0, :, :end], kv[1, :, :end], mask, out[at:at + n])
            at += n
        return F.linear(out, layer["o"])  # [T, H]

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask, out: torch.Tensor) -> None:
        """One session's attention: scaled q [n, h, d] over keys and values [kv, L, d] → out
        [n, h·d]. A few queries on the CPU take three small products (each key head's query heads
        side by side, no copy of the keys), a tenth of the fused kernel's fixed cost there; long
        ones, and every device's, take the fused kernel, whose memory stays linear in L."""
        n, heads, d = q.shape
        kv_heads, length = keys.shape[0], keys.shape[1]
        if not self._small(n, length):
            att = F.scaled_dot_product_attention(q.transpose(0, 1)[None], keys[None], values[None], attn_mask=mask,
                                                 scale=1.0, enable_gqa=True)  # [1, h, n, d]
            out.copy_(att[0].transpose(0, 1).reshape(n, heads * d))
            return
        group = heads // kv_heads
        if n == 1:  # a decode step: the query row is already [kv, group, d], and so is its output row
            scores = torch.bmm(q.view(kv_heads, group, d), keys.transpose(1, 2))  # [kv, group, L]
            torch.bmm(_softmax(scores), values, out=out.view(kv_heads, group, d))
            return
        grouped = q.view(n, kv_heads, group, d).permute(1, 2, 0, 3).reshape(kv_heads, group * n, d)
        scores = torch.baddbmm(mask, grouped, keys.transpose(1, 2))  # [kv, group·n, L], masked
        att = torch.bmm(_softmax(scores), values)  # [kv, group·n, d]
        out.view(n, kv_heads, group, d).copy_(att.view(kv_heads, group, n, d).permute(2, 0, 1, 3))

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return F.rms_norm(x, (self.hidden,), weight, self.eps)
        # Hugging Face normalizes in float32 and multiplies by the weight in the model's dtype.
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * h.to(x.dtype)

    def _rope(self, feeds: list[Feed]) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [T, 1, d] at every feed's positions (start..start+n in a chain), from tables
        grown by doubling as positions advance."""
        end = max(f.start + len(f.tokens) for f in feeds)
        if end > self._cos.shape[0]:
            positions = torch.arange(max(64, 1 << (end - 1).bit_length()), device=self.device).float()
            freqs = torch.outer(positions, self.inv_freq.to(self.device))  # [P, d/2]
            emb = torch.cat((freqs, freqs), -1)
            self._cos = (emb.cos() * self.rope_scale).to(self.dtype)
            self._sin = (emb.sin() * self.rope_scale).to(self.dtype)
        if len(feeds) == 1 and feeds[0].parents is None:
            return self._cos[feeds[0].start:end, None], self._sin[feeds[0].start:end, None]
        # From a list: one small tensor, where an arange per feed cost ~0.1 ms each.
        at = torch.tensor([p for f in feeds for p in f.positions()], device=self.device)  # [T]
        return self._cos[at, None], self._sin[at, None]


def _softmax(scores: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dimension, computed in float32 whatever the model's dtype."""
    if scores.dtype == torch.float32:
        return scores.softmax(-1)
    return scores.softmax(-1, dtype=torch.float32).to(scores.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, as Hugging Face applies it: x·cos + rotate_half(x)·sin."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin

"""A lean forward pass for Llama-architecture models: the same function as Hugging Face's
`LlamaForCausalLM`, in a fraction of the operator calls.

A worker's forward pass covers a handful of tokens (one draft step, a verify block). At that
size it costs operator dispatch and weight reads, not arithmetic. Hugging Face's module tree
spends about a third of a one-token pass of the shipped target in Python and small ops
(benchmarks/forward_pass.py). This pass reads the same weights, loaded through
`from_pretrained`. Q, K and V are one matmul, gate and up are another, and RMSNorm is one
op. Keys and values live in one paged pool for every session (tandem.services.kv), and a pass's
attention over every session's keys takes one call per layer for each size of query block
(a decode step, a verify block, a tree), whatever the number of sessions; only a prefill
longer than MAX_BATCHED_QUERIES tokens runs its own fused-kernel call. It keeps Hugging Face's
order of floating-point operations where they are not fused. Logits agree to ~1e-5
(tests/test_llama_pass.py), and greedy outputs match.

Models this pass does not cover exactly (`unsupported` says why) run through Hugging Face.
"""

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from tandem.math import tree
from tandem.services.kv import BlockTable, KVPool

# RoPE variants whose frequencies are fixed at load time (dynamic ones change with length).
STATIC_ROPE = ("default", "linear", "llama3")
# Rows of a pass with at most this many new tokens share attention calls, padded to the most new
# tokens among them; a longer one (a prefill) runs alone in the fused kernel, whose memory stays
# linear in its length.
MAX_BATCHED_QUERIES = 64
# On the CPU, what one more attention call costs (a dozen operator calls, ~0.1 ms here), in the
# multiply-adds of padding queries it would save: rows join a call while their padding costs less.
# Elsewhere padding is nearly free and calls are kernel launches: one call takes all the rows.
CPU_CALL_MACS = 1_000_000


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


@dataclass
class Feed:
    """One session's part of a forward pass: tokens at positions start.. over the first `start`
    positions of its cache; logits wanted for the last `keep`. With `parents` (a token tree's,
    tandem.math.tree: node i under parents[i], −1 under the root, the last committed token), the
    tokens are the tree's last nodes, and the cache holds its earlier ones just before them,
    from the root's next position r = start − (earlier nodes) on: node i's keys and values sit
    at r + i, and it sees the committed tokens and its own ancestors, at position r + its depth − 1."""

    cache: Any  # the pass's: a kv.BlockTable, or a DynamicCache for Hugging Face's
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


@dataclass
class _Group:
    """Rows of a pass that share one attention call per layer: R sessions with at most n new
    tokens each, over at most L cache positions (in W ≥ L gathered from whole blocks)."""

    rows: int  # R
    queries: int  # n
    keys: int  # L
    width: int  # W
    span: tuple[int, int] | None  # the pass's tokens first..last when they are the group's queries as they stand
    blocks: Any  # [R·W/block] block ids, each row's in order (padded with block 0)
    tokens: Any  # [R·n] the pass's token behind each (row, query); padding repeats a row's last
    limit: Any  # [R·n] the last cache position each query sees (a padding query: 0)
    real: Any  # positions of the real queries among the R·n (None: all are)
    out: Any  # [the real queries] their rows in the pass's output
    # (the above: tensors on the device, places in the pass's _Indices before it sends them)
    trees: np.ndarray | None = None  # [R, n, L] what each query sees, where a row is a token tree
    hidden: torch.Tensor | None = None  # [R, 1, n, L] bool: a key the query may not see


@dataclass
class _Alone:
    """A long feed, attended in its own fused-kernel call: its tokens first..first+n, its keys at
    `slots` (None: a fresh chain, whose keys are its own new ones) under `mask` (None: causal)."""

    first: int
    n: int
    slots: Any  # a tensor (a place in the pass's _Indices before), or None
    mask: torch.Tensor | None


@dataclass
class _Plan:
    """What every layer of one pass needs, built once: where new keys go, who attends to what."""

    tokens: torch.Tensor  # [T] the token ids, feeds in order
    positions: torch.Tensor | None  # [T] their rotary positions (None: one chain, start..start+T)
    slots: torch.Tensor  # [T] the pool slot of each new token
    groups: list[_Group]
    alone: list[_Alone]
    keep: torch.Tensor  # [K] the tokens whose logits are wanted, feeds in order


class _Indices:
    """The integer arrays a pass needs, gathered on the host and sent to the device as one
    tensor (one copy per pass, not one per array): `add` returns where an array will be,
    `view` what is there once `send` has run."""

    def __init__(self) -> None:
        self._parts: list[np.ndarray] = []
        self._size = 0
        self._sent: torch.Tensor | None = None

    def add(self, values) -> slice:
        part = np.asarray(values, dtype=np.int64).reshape(-1)
        self._parts.append(part)
        self._size += part.size
        return slice(self._size - part.size, self._size)

    def send(self, device: torch.device) -> None:
        self._sent = torch.from_numpy(np.concatenate(self._parts)).to(device, non_blocking=True)

    def view(self, where: slice | None) -> torch.Tensor | None:
        return None if where is None else self._sent[where]


class LlamaPass:
    """The forward pass of one Llama model and its KV pool. Check `unsupported(model)` first."""

    name = "llama"
    batched = True  # forward_batch runs all feeds in one pass

    def __init__(self, model: torch.nn.Module, column_major: bool, max_cache_bytes: int = 2 << 30) -> None:
        c = model.config
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        rotary = model.model.rotary_emb
        self._shape(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, head_dim, c.intermediate_size,
                    c.rms_norm_eps, rotary.inv_freq.detach().float(), rotary.attention_scaling)
        layout = to_column_major if column_major else torch.Tensor.contiguous
        with torch.no_grad():
            self.layers = [self._layer(block, layout, self.weight_scale(model.dtype)) for block in model.model.layers]
            self.embed = model.model.embed_tokens.weight.detach()  # [V, H]; rows are looked up
            self.norm = model.model.norm.weight.detach()
            self.head = layout(model.lm_head.weight.detach().clone())  # [V, H], its own copy even if tied
        self._pool(max_cache_bytes)

    def _shape(self, hidden: int, heads: int, kv_heads: int, head_dim: int, intermediate: int, eps: float,
               inv_freq: torch.Tensor, rope_scale: float) -> None:
        """The sizes of the model's layers and its rotary embedding."""
        self.hidden, self.heads, self.kv_heads, self.head_dim = hidden, heads, kv_heads, head_dim
        self.intermediate, self.eps = intermediate, eps
        self.inv_freq, self.rope_scale = inv_freq, rope_scale

    def weight_scale(self, dtype: torch.dtype) -> float:
        """The queries' 1/√d goes into their weights in float32 (an op less per layer, rounding within
        float32's); a half-precision weight would round it visibly, so those scale the queries."""
        exact = dtype == torch.float32
        self.query_scale = 1.0 if exact else self.head_dim**-0.5
        return self.head_dim**-0.5 if exact else 1.0

    def _pool(self, max_cache_bytes: int) -> None:
        """The KV pool of self.layers, on the device and in the dtype of the embeddings."""
        self.dtype, self.device = self.embed.dtype, self.embed.device
        self._cos = self._sin = torch.empty(0, self.head_dim, dtype=self.dtype, device=self.device)
        self._keys = torch.arange(0, device=self.device)  # cache positions, grown as groups need
        self.pool = KVPool(len(self.layers), self.kv_heads, self.head_dim, self.dtype, self.device, max_cache_bytes)
        self.fused_groups = self.device.type != "cpu"  # a group's attention in the fused kernel (_attend)

    @staticmethod
    def _layer(block, layout, scale: float) -> dict[str, torch.Tensor]:
        a, m = block.self_attn, block.mlp
        return {
            # [(h+2kv)·d, H]; the queries come out times `scale` (the rotary embedding is linear)
            "qkv": layout(torch.cat([a.q_proj.weight * scale, a.k_proj.weight, a.v_proj.weight])),
            "o": layout(a.o_proj.weight.detach()),
            "gate_up": layout(torch.cat([m.gate_proj.weight, m.up_proj.weight])),  # [2I, H]
            "down": layout(m.down_proj.weight.detach()),
            "attn_norm": block.input_layernorm.weight.detach(),
            "mlp_norm": block.post_attention_layernorm.weight.detach(),
        }

    # --- caches: block tables in the pool ----------------------------------------------------

    @property
    def token_bytes(self) -> int:
        return self.pool.token_bytes

    @property
    def cache_bytes(self) -> int:
        return self.pool.used_bytes

    def new_cache(self) -> BlockTable:
        return BlockTable()

    def reserve(self, cache: BlockTable, tokens: int) -> bool:
        return self.pool.reserve(cache, tokens)

    def crop(self, cache: BlockTable, tokens: int) -> None:
        self.pool.crop(cache, tokens)

    def release(self, cache: BlockTable) -> None:
        self.pool.release(cache)

    def keep_paths(self, paths: list[tuple[BlockTable, int, list[int]]]) -> None:
        """After trees' passes: for each (cache, start, nodes), move the keys and values of the
        nodes (tree indices, a root-to-node path) at start + node to start, start+1, …; the other
        branches' are stale. One gather and one scatter for all of them."""
        source, target = [], []
        for cache, start, nodes in paths:
            source += [self.pool.slots(cache, start + i, start + i + 1)[0] for i in nodes]
            target += self.pool.slots(cache, start, start + len(nodes))
        if source:
            flat = self.pool.flat()  # [layers, 2, kv, S, d]
            index = torch.tensor([target, source], device=self.device)  # [2, moved]
            flat[:, :, :, index[0]] = flat[:, :, :, index[1]]

    # --- the pass ----------------------------------------------------------------------------

    def forward(self, cache: BlockTable, start: int, tokens: list[int], keep: int) -> torch.Tensor:
        """Run tokens at positions start.. over the cache's first `start` positions, writing
        theirs → logits [keep, V] of the last `keep` tokens. Call under inference_mode."""
        return self.forward_batch([Feed(cache, start, tokens, keep)])[0]

    def forward_batch(self, feeds: list["Feed"], exit_layer: int | None = None) -> list[torch.Tensor]:
        """One pass for several sessions: their new tokens concatenated into one [T, H] input for
        the projections, the rotary embedding, the attention and the MLPs (T = all their tokens),
        each attending to its own cache → each feed's logits [keep, V]. exit_layer K: the first K
        layers only, then the final norm and the head (self-drafting; the cache's other layers
        are left as they are). Call under inference_mode."""
        return self.forward_tapped(feeds, (), exit_layer)[0]

    def forward_tapped(self, feeds: list["Feed"], taps: tuple[int, ...],
                       exit_layer: int | None = None) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """forward_batch, also answering each feed's features [n, len(taps)·H]: the hidden states
        entering the layers numbered in taps (vLLM's numbering: tap i is layer i − 1's output),
        side by side, for every token it fed (an EAGLE head reads them, prompt included)."""
        for f in feeds:
            if not self.pool.reserve(f.cache, f.start + len(f.tokens)):
                raise MemoryError("the KV pool cannot hold this pass: reserve before it (ModelRuntime does)")
        plan = self._plan(feeds)
        cos, sin = self._rope(feeds, plan.positions)  # [T, 1, d] each
        x = self.embed[plan.tokens]  # [T, H]
        tapped = []
        for index, layer in enumerate(self.layers[:exit_layer]):
            if index in taps:
                tapped.append(x)
            h = self._rms_norm(x, layer["attn_norm"])
            x = x + self._attention(index, layer, h, cos, sin, plan)
            gate, up = F.linear(self._rms_norm(x, layer["mlp_norm"]), layer["gate_up"]).split(self.intermediate, -1)
            x = x + F.linear(F.silu(gate) * up, layer["down"])
        if len(self.layers) in taps:  # the last layer's output, before the final norm
            tapped.append(x)
        last = x.index_select(0, plan.keep)  # [K, H], K = the keeps' sum
        logits = F.linear(self._rms_norm(last, self.norm), self.head)  # [K, V]
        features = torch.cat(tapped, -1).split([len(f.tokens) for f in feeds]) if taps else []  # [n, taps·H] each
        return list(logits.split([f.keep for f in feeds])), list(features)

    def _plan(self, feeds: list[Feed]) -> _Plan:
        """Slots, attention groups and kept rows of a pass: plain Python and numpy, then one copy
        of their integers to the device (and one of each group's mask)."""
        ints = _Indices()
        lengths = [len(f.tokens) for f in feeds]
        firsts = [0, *itertools.accumulate(lengths)][:-1]
        tokens = ints.add([t for f in feeds for t in f.tokens])
        one_chain = len(feeds) == 1 and feeds[0].parents is None
        positions = None if one_chain else ints.add([p for f in feeds for p in f.positions()])
        slots = ints.add([s for f, n in zip(feeds, lengths) for s in self.pool.slots(f.cache, f.start, f.start + n)])
        keep = ints.add([t for f, first, n in zip(feeds, firsts, lengths)
                         for t in range(first + n - f.keep, first + n)])  # the rows whose logits are wanted
        alone = [self._alone(f, first, ints) for f, first, n in zip(feeds, firsts, lengths) if n > MAX_BATCHED_QUERIES]
        groups = [self._group([feeds[i] for i in rows], [firsts[i] for i in rows], ints)
                  for rows in self._grouped(feeds, lengths)]
        ints.send(self.device)
        for g in groups:
            g.blocks, g.tokens, g.limit, g.real, g.out = (ints.view(w) for w in (g.blocks, g.tokens, g.limit, g.real,
                                                                                 g.out))
            g.hidden = self._mask(g)
        for a in alone:
            a.slots = ints.view(a.slots)
        return _Plan(ints.view(tokens), ints.view(positions), ints.view(slots), groups, alone, ints.view(keep))

    def _grouped(self, feeds: list[Feed], lengths: list[int]) -> list[list[int]]:
        """The feeds of at most MAX_BATCHED_QUERIES tokens, by attention call: in order of their
        token counts, a feed joins the call before it when both need the same power of two of
        queries, or while the padding it adds to that call's rows costs less than a call of its
        own (CPU_CALL_MACS; on an accelerator, always). So a pass makes at most 7 calls."""
        budget = CPU_CALL_MACS if self.device.type == "cpu" else float("inf")
        per_query = 2 * self.heads * self.head_dim  # multiply-adds per query and key, scores and values
        calls: list[list[int]] = []
        widest = 0  # the current call's most tokens
        for i in sorted((i for i, n in enumerate(lengths) if n <= MAX_BATCHED_QUERIES), key=lengths.__getitem__):
            n, keys = lengths[i], feeds[i].start + lengths[i]
            same_bucket = calls and (n - 1).bit_length() == (lengths[calls[-1][0]] - 1).bit_length()
            if calls and (same_bucket or len(calls[-1]) * (n - widest) * keys * per_query <= budget):
                calls[-1].append(i)
            else:
                calls.append([i])
            widest = n
        return calls

    def _group(self, feeds: list[Feed], firsts: list[int], ints: _Indices) -> _Group:
        """One attention call's rows: their blocks and queries, padded to the longest (the index
        fields are places in `ints` until the plan sends them; `_mask` then makes the mask).
        Plain Python: for the few rows of a small pass, numpy's calls cost more than the work."""
        n = max(len(f.tokens) for f in feeds)
        keys = max(f.start + len(f.tokens) for f in feeds)
        width = self.pool.blocks_for(keys)
        blocks, tokens, limit, real = [], [], [], []
        for f, first in zip(feeds, firsts):
            n_r, used = len(f.tokens), self.pool.blocks_for(f.start + len(f.tokens))
            blocks += f.cache.blocks[:used] + [0] * (width - used)
            real += range(len(tokens), len(tokens) + n_r)
            # A query at cache position start + i sees keys 0..start+i; a padding query (a copy of
            # the row's last) sees key 0 only.
            tokens += [*range(first, first + n_r), *[first + n_r - 1] * (n - n_r)]
            limit += [*range(f.start, f.start + n_r), *[0] * (n - n_r)]
        trees = None
        if any(f.parents is not None for f in feeds):  # the tree's nodes see their ancestors only
            trees = np.arange(keys)[None, None, :] <= np.array(limit).reshape(-1, n, 1)
            for r, f in enumerate(feeds):
                if f.parents is not None:
                    n_r = len(f.tokens)
                    trees[r, :n_r, f.root:f.start + n_r] = tree.ancestor_mask(f.parents)[-n_r:]
        padded = len(real) < len(tokens)
        # Queries that are the pass's tokens as they stand (no padding, in order) are read and
        # written as a slice, not gathered and scattered.
        in_order = not padded and tokens == list(range(tokens[0], tokens[0] + len(tokens)))
        span = (tokens[0], tokens[0] + len(tokens)) if in_order else None
        return _Group(len(feeds), n, keys, width * self.pool.block_tokens, span, ints.add(blocks),
                      None if span else ints.add(tokens), ints.add(limit), ints.add(real) if padded else None,
                      None if span else ints.add([tokens[i] for i in real]), trees)

    def _mask(self, g: _Group) -> torch.Tensor:
        """[R, 1, n, L] bool: the keys each query of the group may not see (past its limit, or
        off its tree path)."""
        if g.trees is not None:
            return torch.from_numpy(~g.trees).to(self.device, non_blocking=True)[:, None]
        if self._keys.shape[0] < g.keys:
            self._keys = torch.arange(max(g.keys, 2 * self._keys.shape[0]), device=self.device)
        return (self._keys[:g.keys] > g.limit.view(g.rows, 1, g.queries, 1))

    def _alone(self, feed: Feed, first: int, ints: _Indices) -> _Alone:
        n = len(feed.tokens)
        if feed.start == 0 and feed.parents is None:
            return _Alone(first, n, None, None)
        return _Alone(first, n, ints.add(self.pool.slots(feed.cache, 0, feed.start + n)), feed.visible(self.device))

    def _attention(self, index: int, layer, h: torch.Tensor, cos, sin, plan: _Plan) -> torch.Tensor:
        """h [T, H] → attention output [T, H]. The new keys and values go into the pool in one
        scatter; each group of rows attends in one call, each long feed in one of its own."""
        d, heads, kv_heads = self.head_dim, self.heads, self.kv_heads
        qk, v = F.linear(h, layer["qkv"]).split([(heads + kv_heads) * d, kv_heads * d], -1)  # [T, ·]
        qk = _rotate(qk.view(-1, heads + kv_heads, d), cos, sin)  # [T, h+kv, d]: queries (scaled) and keys together
        q, k = qk[:, :heads], qk[:, heads:]
        if self.query_scale != 1.0:
            q = q * self.query_scale
        new = torch.stack((k, v.view(-1, kv_heads, d))).transpose(1, 2)  # [2, kv, T, d]
        flat = self.pool.flat(index)  # [2, kv, S, d]
        flat[:, :, plan.slots] = new
        out = q.new_empty(q.shape[0], heads * d)  # [T, h·d]
        for group in plan.groups:
            self._attend(q, self.pool.data[index], group, out)
        for feed in plan.alone:
            self._attend_alone(q, new, flat, feed, out)
        return F.linear(out, layer["o"])  # [T, H]

    def _attend(self, q: torch.Tensor, pool: torch.Tensor, g: _Group, out: torch.Tensor) -> None:
        """One group's attention: q [T, h, d] (scaled) over the layer's pool [2, kv, blocks,
        block, d] → the real queries' rows of out [T, h·d], against every row's gathered keys.
        On the CPU three batched products (each key head's query heads side by side), a tenth
        of the fused kernel's fixed cost at these sizes; elsewhere the fused kernel, masked."""
        kv_heads, d = self.kv_heads, self.head_dim
        group, (rows, n, length) = self.heads // kv_heads, (g.rows, g.queries, g.keys)
        gathered = pool.index_select(2, g.blocks).view(2, kv_heads, rows, g.width, d)
        kv = gathered[..., :length, :]  # [2, kv, R, L, d]
        queries = q[g.span[0]:g.span[1]] if g.span else q.index_select(0, g.tokens)
        queries = queries.view(rows, n, kv_heads, group, d)
        if self.fused_groups:
            att = F.scaled_dot_product_attention(
                queries.view(rows, n, -1, d).transpose(1, 2), kv[0].transpose(0, 1), kv[1].transpose(0, 1),
                attn_mask=~g.hidden, scale=1.0, enable_gqa=True)  # [R, h, n, d]
            att = att.transpose(1, 2).reshape(rows * n, -1)  # [R·n, h·d]
        else:
            queries = queries.permute(2, 0, 3, 1, 4).reshape(kv_heads, rows, group * n, d)
            scores = torch.matmul(queries, kv[0].transpose(-1, -2))  # [kv, R, group·n, L]
            scores.view(kv_heads, rows, group, n, length).masked_fill_(g.hidden, float("-inf"))
            att = torch.matmul(_softmax(scores), kv[1])  # [kv, R, group·n, d]
            att = att.view(kv_heads, rows, group, n, d).permute(1, 3, 0, 2, 4).reshape(rows * n, -1)  # [R·n, h·d]
        if g.span:
            out[g.span[0]:g.span[1]] = att
        else:
            out.index_copy_(0, g.out, att if g.real is None else att.index_select(0, g.real))

    def _attend_alone(self, q: torch.Tensor, new: torch.Tensor, flat: torch.Tensor, a: _Alone,
                      out: torch.Tensor) -> None:
        """A long feed's attention in the fused kernel: its queries over its keys (its own new
        ones for a fresh chain, else gathered from the pool)."""
        n, end = a.n, a.first + a.n
        kv = new[:, :, a.first:end] if a.slots is None else flat.index_select(2, a.slots)  # [2, kv, L, d]
        att = F.scaled_dot_product_attention(q[a.first:end].transpose(0, 1)[None], kv[0][None], kv[1][None],
                                             attn_mask=a.mask, is_causal=a.mask is None, scale=1.0,
                                             enable_gqa=True)  # [1, h, n, d]
        out[a.first:end] = att[0].transpose(0, 1).reshape(n, -1)

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return F.rms_norm(x, (self.hidden,), weight, self.eps)
        # Hugging Face normalizes in float32 and multiplies by the weight in the model's dtype.
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * h.to(x.dtype)

    def _rope(self, feeds: list[Feed], positions: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [T, 1, d] at every feed's positions (the plan's; None: one chain's,
        start..start+n), from tables grown by doubling as positions advance."""
        end = max(f.start + len(f.tokens) for f in feeds)
        if end > self._cos.shape[0]:
            table = torch.arange(max(64, 1 << (end - 1).bit_length()), device=self.device).float()
            freqs = torch.outer(table, self.inv_freq.to(self.device))  # [P, d/2]
            emb = torch.cat((freqs, freqs), -1)
            self._cos = (emb.cos() * self.rope_scale).to(self.dtype)
            self._sin = (emb.sin() * self.rope_scale).to(self.dtype)
        if positions is None:
            return self._cos[feeds[0].start:end, None], self._sin[feeds[0].start:end, None]
        return self._cos[positions, None], self._sin[positions, None]


def _softmax(scores: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dimension, computed in float32 whatever the model's dtype."""
    if scores.dtype == torch.float32:
        return scores.softmax(-1)
    return scores.softmax(-1, dtype=torch.float32).to(scores.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, as Hugging Face applies it: x·cos + rotate_half(x)·sin."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin

"""The EAGLE-3 head's forward pass for many sessions at once: tandem.services.llama's paged
attention (one pool, one attention call per layer for a batch) over the head's one layer.

A feed's rows each carry a hidden state beside their token: the target's features projected by
`fc` (rows over committed tokens) or the head's own output of the step before (drafting steps).
The pass answers, for the kept rows, the logits over the target's vocabulary (a reduced draft
vocabulary mapped to its target ids, the other ids at −inf: the draft never proposes them) and
the rows' outputs, which the next drafting step reads.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tandem.services.head import Eagle3Head, rotary_inv_freq
from tandem.services.llama import Feed, LlamaPass, to_column_major


@dataclass
class HeadFeed(Feed):
    hidden: torch.Tensor | None = None  # [n, H]: each token's hidden state (see the module's docstring)


class HeadPass(LlamaPass):
    name = "eagle3"

    def __init__(self, head: Eagle3Head, embed: torch.Tensor, column_major: bool, max_cache_bytes: int) -> None:
        """embed [V, H]: the head's own embeddings, or the target's when it has none."""
        c = head.config
        self._shape(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.intermediate_size,
                    c.rms_norm_eps, rotary_inv_freq(c), 1.0)
        layout = to_column_major if column_major else torch.Tensor.contiguous
        dtype = embed.dtype
        head = head.to(device=embed.device, dtype=dtype)
        m = head.midlayer
        with torch.no_grad():
            self.layers = [self._layer(m, layout, self.weight_scale(dtype))]
            self.hidden_norm = m.hidden_norm.weight.detach()
            self.fc = layout(head.fc.weight.detach())  # [H, 3H]
            self.embed = head.embed_tokens.weight.detach() if head.embed_tokens is not None else embed
            self.norm = head.norm.weight.detach()
            self.head = layout(head.lm_head.weight.detach())  # [draft vocab, H]
        self.vocab = c.vocab_size
        mapped = c.draft_vocab_size < c.vocab_size or bool(head.d2t.any())
        self.to_target = head.draft_to_target() if mapped else None  # [draft vocab] target ids
        self._pool(max_cache_bytes)

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """The target's features [n, 3H] → the head's hidden states [n, H]."""
        return F.linear(features.to(self.dtype), self.fc)

    def forward_batch(self, feeds: list[HeadFeed], exit_layer: int | None = None) -> list[tuple[torch.Tensor,
                                                                                                torch.Tensor]]:
        """One pass of the head for several sessions → per feed, for its last `keep` rows, the
        logits [keep, V] over the target's vocabulary and the rows' outputs [keep, H]."""
        for f in feeds:
            if not self.pool.reserve(f.cache, f.start + len(f.tokens)):
                raise MemoryError("the head's KV pool cannot hold this pass: reserve before it")
        plan = self._plan(feeds)
        cos, sin = self._rope(feeds, plan.positions)  # [T, 1, d] each
        layer = self.layers[0]
        hidden = torch.cat([f.hidden for f in feeds])  # [T, H]
        x = torch.cat((self._rms_norm(self.embed[plan.tokens], layer["attn_norm"]),
                       self._rms_norm(hidden, self.hidden_norm)), -1)  # [T, 2H]
        x = hidden + self._attention(0, layer, x, cos, sin, plan)
        gate, up = F.linear(self._rms_norm(x, layer["mlp_norm"]), layer["gate_up"]).split(self.intermediate, -1)
        x = x + F.linear(F.silu(gate) * up, layer["down"])
        last = x.index_select(0, plan.keep)  # [K, H]
        logits = F.linear(self._rms_norm(last, self.norm), self.head)  # [K, draft vocab]
        if self.to_target is not None:
            full = logits.new_full((logits.shape[0], self.vocab), float("-inf"))
            full[:, self.to_target] = logits
            logits = full  # [K, V]
        keeps = [f.keep for f in feeds]
        return list(zip(logits.split(keeps), last.split(keeps)))

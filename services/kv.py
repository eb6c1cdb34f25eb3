"""The KV pool: every session's keys and values in one tensor of fixed-size blocks, and a block
table per session (the paged layout of vLLM's PagedAttention).

A forward pass reads any set of sessions' keys and values with one gather of their blocks per
layer, and writes every new token's with one scatter, however many sessions it runs: its operator
calls do not grow with the batch. Blocks come from a free list and go back to it when a session
is cropped or released, so allocation and accounting are O(1) per block. The pool grows by
doubling up to its memory bound (a worker holding few sessions holds little memory), and never
past it: a session that finds no block left makes the caller evict another or refuse.
"""

from dataclasses import dataclass, field

import torch

DEFAULT_BLOCK_TOKENS = 16  # tokens per block: a session wastes half a block on average


@dataclass
class BlockTable:
    """One session's blocks: its token at cache position p is in slot p % block_tokens of block
    blocks[p // block_tokens]."""

    blocks: list[int] = field(default_factory=list)


class KVPool:
    """Keys and values of all sessions: [layers, 2, kv_heads, blocks, block_tokens, head_dim]."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device,
                 max_bytes: int, block_tokens: int = DEFAULT_BLOCK_TOKENS) -> None:
        self.block_tokens = block_tokens
        self._shape = (layers, 2, kv_heads)
        self.token_bytes = layers * 2 * kv_heads * head_dim * torch.empty(0, dtype=dtype).element_size()
        self.block_bytes = self.token_bytes * block_tokens
        self.max_blocks = max(1, max_bytes // self.block_bytes)
        self.data = torch.empty(*self._shape, 0, block_tokens, head_dim, dtype=dtype, device=device)
        self._free: list[int] = []
        self.used = 0  # blocks held by sessions

    @property
    def capacity(self) -> int:
        """Blocks allocated (free or used)."""
        return self.data.shape[3]

    @property
    def used_bytes(self) -> int:
        return self.used * self.block_bytes

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_tokens)

    def reserve(self, table: BlockTable, tokens: int) -> bool:
        """Give the table blocks for its first `tokens` positions → False, and nothing taken, when
        the pool is at its bound without enough free blocks."""
        needed = self.blocks_for(tokens) - len(table.blocks)
        if needed <= 0:
            return True
        if needed > len(self._free) and not self._grow(self.used + needed):
            return False
        table.blocks.extend(self._free.pop() for _ in range(needed))
        self.used += needed
        return True

    def crop(self, table: BlockTable, tokens: int) -> None:
        """Give back the blocks past the first `tokens` positions."""
        keep = self.blocks_for(tokens)
        if keep < len(table.blocks):
            self._free.extend(table.blocks[keep:])
            self.used -= len(table.blocks) - keep
            del table.blocks[keep:]

    def release(self, table: BlockTable) -> None:
        self.crop(table, 0)

    def slots(self, table: BlockTable, start: int, stop: int) -> list[int]:
        """The slots (block · block_tokens + offset) of cache positions start..stop−1."""
        size, blocks = self.block_tokens, table.blocks
        return [blocks[p // size] * size + p % size for p in range(start, stop)]

    def flat(self, layer: int | slice = slice(None)) -> torch.Tensor:
        """The pool (or one layer) as [..., 2, kv_heads, blocks · block_tokens, head_dim]: slots index it."""
        data = self.data[layer]
        return data.view(*data.shape[:-3], -1, data.shape[-1])

    def _grow(self, blocks: int) -> bool:
        """Make room for `blocks` used blocks, doubling up to the bound → False past it."""
        if blocks > self.max_blocks:
            return False
        capacity = min(self.max_blocks, max(blocks, 2 * self.capacity, 4))
        # Zeros, not garbage: a pass reads whole blocks, and a masked key's value still meets a zero
        # weight in the product (0 × NaN would be NaN).
        grown = self.data.new_zeros(*self._shape, capacity, *self.data.shape[4:])
        grown[:, :, :, :self.capacity] = self.data
        self._free.extend(range(capacity - 1, self.capacity - 1, -1))
        self.data = grown
        return True

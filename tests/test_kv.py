"""The paged KV pool (tandem.services.kv): blocks from a free list, O(1) accounting, growth that
keeps what the blocks hold, and a bound that holds."""

import torch

from tandem.services.kv import BlockTable, KVPool

LAYERS, KV_HEADS, HEAD_DIM, BLOCK = 2, 1, 4, 4
TOKEN_BYTES = LAYERS * 2 * KV_HEADS * HEAD_DIM * 4


def pool(max_blocks: int) -> KVPool:
    return KVPool(LAYERS, KV_HEADS, HEAD_DIM, torch.float32, torch.device("cpu"),
                  max_bytes=max_blocks * BLOCK * TOKEN_BYTES, block_tokens=BLOCK)


def test_blocks_are_reserved_cropped_and_released_with_exact_accounting():
    p = pool(8)
    a, b = BlockTable(), BlockTable()
    assert p.token_bytes == TOKEN_BYTES and p.used_bytes == 0
    assert p.reserve(a, 5) and len(a.blocks) == 2  # 5 tokens: two blocks of 4
    assert p.reserve(a, 8) and len(a.blocks) == 2  # still fits
    assert p.reserve(b, 1) and len(b.blocks) == 1
    assert not set(a.blocks) & set(b.blocks)
    assert p.used == 3 and p.used_bytes == 3 * BLOCK * TOKEN_BYTES
    p.crop(a, 4)
    assert len(a.blocks) == 1 and p.used == 2
    p.release(b)
    assert b.blocks == [] and p.used == 1
    assert p.slots(a, 0, 4) == [a.blocks[0] * BLOCK + i for i in range(4)]


def test_growth_keeps_every_blocks_contents_and_the_bound_holds():
    p = pool(6)
    a = BlockTable()
    assert p.reserve(a, 4)
    p.data[:, :, :, a.blocks[0]] = 7.0
    before = p.capacity
    b = BlockTable()
    assert p.reserve(b, 16)  # four more blocks: the pool doubles (or more) to hold them
    assert p.capacity > before and p.capacity <= 6
    assert (p.data[:, :, :, a.blocks[0]] == 7.0).all()
    c = BlockTable()
    assert p.reserve(c, 4) and p.used == 6
    assert not p.reserve(c, 8) and len(c.blocks) == 1  # past the bound: refused, nothing taken
    p.release(b)
    assert p.reserve(c, 8)  # freed blocks are reused


def test_a_pool_holds_at_least_one_block_and_reads_zeros_where_nothing_was_written():
    p = pool(0)
    assert p.max_blocks == 1
    a = BlockTable()
    assert p.reserve(a, BLOCK) and not p.reserve(a, BLOCK + 1)
    assert (p.flat()[:, :, :, p.slots(a, 0, BLOCK)] == 0).all()

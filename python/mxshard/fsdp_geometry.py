# SPDX-License-Identifier: MIT
"""Pure geometry of FSDP2's dim-0 shards of an [R, C] weight and of the
quantized planes' blocks (no torch, no state: small functions of integers).

FSDP2 (`fully_shard`) cuts dim 0 as torch.chunk does: every rank gets
S = ceil(R / W) rows but the last ones, which get fewer or none.

        C columns                    row plane (1x32 MXFP8, 1x16 NVFP4): a block lies in
   r=0  +------------------------+   one row, so no shard boundary ever cuts one
        |  rank 0                |
   r=S  +------------------------+   column plane (32x1 MXFP8, 16x1 NVFP4) and 16x16
        |  rank 1                |   tiles: a block of `h` rows is cut by every boundary
  r=2S  +------------------------+   that is not a multiple of h; its amax needs both
        |  rank 2 (R - 2S rows)  |   ranks (the packed MAX reduction)
   r=R  +------------------------+

A plane's blocks form "block rows" of height h (1 for row planes, 32 or 16
for column planes and tiles: its format's block_height, mxshard.formats).
Rank k touches block rows [floor(r0/h), ceil(r1/h)); a block row touched by
two ranks is SHARED and its exponents / amaxes go through the reduction.
"""
from __future__ import annotations

__all__ = ["chunk_rows", "rank_rows", "is_even", "touched_block_rows", "shared_block_rows", "max_touched",
           "PLANE_ROW", "PLANE_COL"]

PLANE_ROW = "row"
PLANE_COL = "col"


def chunk_rows(rows: int, world: int) -> int:
    """S: the rows of every full FSDP2 shard (the padded shard size), ceil(rows / world)."""
    if rows < 0 or world < 1:
        raise ValueError(f"chunk_rows: rows={rows}, world={world}")
    return -(-rows // world)


def rank_rows(rows: int, world: int, rank: int):
    """(r0, r1): the rows [r0, r1) rank `rank` holds under FSDP2's dim-0 sharding (torch.chunk's
    pieces, then empty ones): r0 = r1 = rows for a rank past the last piece."""
    if not 0 <= rank < world:
        raise ValueError(f"rank_rows: rank {rank} outside a world of {world}")
    s = chunk_rows(rows, world)
    return min(rank * s, rows), min((rank + 1) * s, rows)


def is_even(rows: int, world: int) -> bool:
    """Every rank holds exactly chunk_rows() rows (FSDP2 then accepts all-gather inputs of any
    shape; unevenly sharded parameters must all-gather inputs of the padded shard's shape)."""
    return rows % world == 0


def touched_block_rows(r0: int, r1: int, h: int):
    """(b0, b1): the block rows of height h that rows [r0, r1) touch ((b, b) when empty)."""
    if r1 <= r0:
        b = r0 // h
        return b, b
    return r0 // h, -(-r1 // h)


def max_touched(rows: int, world: int, h: int) -> int:
    """The most block rows any rank touches (the padded count of a per-rank scale window)."""
    return max(b1 - b0 for b0, b1 in (touched_block_rows(*rank_rows(rows, world, k), h) for k in range(world)))


def shared_block_rows(rows: int, world: int, h: int):
    """Sorted block rows (height h) that two or more ranks touch: the block row of every inner
    shard boundary that is not a multiple of h."""
    out = set()
    for k in range(world - 1):
        _, b = rank_rows(rows, world, k)
        if 0 < b < rows and b % h:
            out.add(b // h)
    return sorted(out)

# SPDX-License-Identifier: MIT
"""mxshard.fsdp_geometry: FSDP2's dim-0 shards and the blocks they cut,
checked against torch.chunk (when torch is here) and against a brute-force
walk over every row (pure Python, always)."""
import random

import pytest

from mxshard import fsdp_geometry as G
from mxshard.formats import MXFP8, NVFP4


def _brute_touch(rows, world, h):
    """Per block row, the set of ranks whose rows touch it."""
    owners = {}
    for k in range(world):
        r0, r1 = G.rank_rows(rows, world, k)
        for r in range(r0, r1):
            owners.setdefault(r // h, set()).add(k)
    return owners


@pytest.mark.parametrize("rows,world", [(1, 1), (1, 2), (1, 4), (3, 4), (7, 3), (33, 2), (64, 2), (64, 3),
                                        (100, 8), (96, 2), (4097, 8)])
def test_rank_rows_are_torch_chunk_pieces_then_empty(rows, world):
    s = G.chunk_rows(rows, world)
    covered = []
    for k in range(world):
        r0, r1 = G.rank_rows(rows, world, k)
        assert 0 <= r0 <= r1 <= rows and r1 - r0 <= s
        covered += list(range(r0, r1))
    assert covered == list(range(rows))
    assert G.is_even(rows, world) == all(G.rank_rows(rows, world, k)[1] - G.rank_rows(rows, world, k)[0] == s
                                         for k in range(world))
    try:
        import torch
    except ImportError:
        return
    pieces = torch.arange(rows).chunk(world)
    for k in range(world):
        r0, r1 = G.rank_rows(rows, world, k)
        got = pieces[k].tolist() if k < len(pieces) else []
        assert got == list(range(r0, r1))


def test_rank_rows_rejects_bad_arguments():
    with pytest.raises(ValueError):
        G.rank_rows(10, 2, 2)
    with pytest.raises(ValueError):
        G.chunk_rows(10, 0)


@pytest.mark.parametrize("seed", range(40))
def test_shared_block_rows_are_the_block_rows_two_ranks_touch(seed):
    rnd = random.Random(seed)
    rows, world, h = rnd.randint(1, 300), rnd.randint(1, 9), rnd.choice([1, 16, 32])
    owners = _brute_touch(rows, world, h)
    assert G.shared_block_rows(rows, world, h) == sorted(b for b, ks in owners.items() if len(ks) > 1)
    assert G.max_touched(rows, world, h) == max(
        len([b for b, ks in owners.items() if k in ks]) for k in range(world))
    for k in range(world):
        b0, b1 = G.touched_block_rows(*G.rank_rows(rows, world, k), h)
        assert list(range(b0, b1)) == sorted(b for b, ks in owners.items() if k in ks)


def test_row_planes_are_never_cut_and_aligned_shards_cut_no_column_block():
    assert G.shared_block_rows(4096, 8, MXFP8.block_height("row")) == []
    assert G.shared_block_rows(4096, 8, MXFP8.block_height("col")) == []        # 512 rows per rank
    assert G.shared_block_rows(96, 2, MXFP8.block_height("col")) == [1]         # 48: cuts block row 1
    assert G.shared_block_rows(4096, 8, NVFP4.block_height("row", "16x16")) == []
    assert G.shared_block_rows(40, 2, NVFP4.block_height("col", "1x16")) == [1]  # 20: cuts rows 16..31
    assert NVFP4.block_height("row", "1x16") == 1

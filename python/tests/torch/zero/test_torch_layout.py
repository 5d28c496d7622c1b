# SPDX-License-Identifier: MIT
"""ShardedOptimizer's item / bucket geometry (mxshard/torch/zero/items.py):
random item shapes (0-d, 1-D, 1-row, rows < world, 3-D), worlds 1..8 and
bucket sizes; checked against references written here from FSDP2's dim-0
rule (rank k holds rows [k*ch, min(R, (k+1)*ch)), ch = ceil(R / world)),
not from the module's own helpers."""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from mxshard.torch.zero import items as IT  # noqa: E402


def random_items(rng, n):
    out = []
    for i in range(n):
        kind = rng.choice(["zero_d", "one_d", "one_row", "few_rows", "matrix", "three_d"])
        if kind == "zero_d":
            shape = ()
        elif kind == "one_d":
            shape = (int(rng.integers(1, 60)),)
        elif kind == "one_row":
            shape = (1, int(rng.integers(1, 90)))
        elif kind == "few_rows":     # fewer rows than most worlds
            shape = (int(rng.integers(1, 5)), int(rng.integers(1, 40)))
        elif kind == "matrix":
            shape = (int(rng.integers(1, 70)), int(rng.integers(1, 90)))
        else:
            shape = tuple(int(x) for x in rng.integers(1, 7, size=3))
        out.append(IT.Item(f"p{i}", shape, torch.float32))
    return out


def ref_rows(rows, world, rank):
    ch = -(-rows // world)
    return min(rank * ch, rows), min((rank + 1) * ch, rows)


def check_item(it):
    rows = it.shape[0] if it.shape else 1
    assert it.rows == rows and it.numel == math.prod(it.shape) and it.rows * it.cols == it.numel


def check_packing(items, geoms, bucket_size):
    """Consecutive items in model order, each once; a bucket holds at most bucket_size elements
    unless it is one item; the next bucket's first item would not have fitted."""
    flat = [it for g in geoms for it in g.items]
    assert [id(it) for it in flat] == [id(it) for it in items]
    assert [g.index for g in geoms] == list(range(len(geoms)))
    for i, g in enumerate(geoms):
        assert g.items, "an empty bucket"
        n = sum(it.numel for it in g.items)
        assert n <= bucket_size or len(g.items) == 1, (n, bucket_size)
        if i + 1 < len(geoms):
            assert n + geoms[i + 1].items[0].numel > bucket_size, "a bucket closed before it was full"


def check_bucket(g, world):
    """Offsets / shard size; every element of every item owned by exactly one rank, at the rows
    FSDP2 gives it; views and chunks of the same buffers agree (same storage); padding is the
    tail of each item's chunk and nothing else."""
    assert g.world == world
    at = 0
    for pos, it in enumerate(g.items):
        assert g.offsets[pos] == at
        at += -(-it.rows // world) * it.cols
    assert g.shard == at
    S = g.shard
    # full tensors with distinct values (element index + 1); every rank's shard filled by view
    fulls = [torch.arange(1, it.numel + 1, dtype=torch.float64).reshape(it.shape) for it in g.items]
    buf = torch.zeros(world * S, dtype=torch.float64)
    owner = [torch.full((it.numel,), -1, dtype=torch.int64) for it in g.items]
    views_total = 0
    for r in range(world):
        shard = buf[r * S:(r + 1) * S]
        claimed = torch.zeros(S, dtype=torch.bool)
        for pos, it in enumerate(g.items):
            r0, r1 = ref_rows(it.rows, world, r)
            assert g.rows_of(pos, r) == (r0, r1)
            v = g.view(shard, pos, r)
            assert tuple(v.shape) == (r1 - r0,) + it.shape[1:], (it.shape, world, r, tuple(v.shape))
            assert v.numel() == 0 or v.data_ptr() == shard.data_ptr() + g.offsets[pos] * shard.element_size()
            assert v.is_contiguous()
            v.copy_(fulls[pos].reshape((it.rows,) + it.shape[1:])[r0:r1])
            views_total += v.numel()
            lo, hi = g.offsets[pos], g.offsets[pos] + v.numel()
            assert not claimed[lo:hi].any(), "two items' views overlap"
            claimed[lo:hi] = True
            seg = owner[pos][r0 * it.cols:r1 * it.cols]
            assert (seg == -1).all(), "an element owned by two ranks"
            seg.fill_(r)
        # what no view claims is padding: each item's chunk past its rows on this rank
        pad = torch.ones(S, dtype=torch.bool)
        for pos, it in enumerate(g.items):
            r0, r1 = ref_rows(it.rows, world, r)
            pad[g.offsets[pos]:g.offsets[pos] + (r1 - r0) * it.cols] = False
        assert torch.equal(~claimed, pad)
        assert (shard[pad] == 0).all(), "a view wrote into padding"
    assert views_total == sum(it.numel for it in g.items)
    for pos, it in enumerate(g.items):
        assert (owner[pos] >= 0).all(), f"{it.name}: an element owned by no rank"
        # the rank of element e is e's row // ch
        ch = -(-it.rows // world)
        want = torch.arange(it.numel) // it.cols // ch
        assert torch.equal(owner[pos], want)
        # chunks: [world, ch*C] over the rank-major buffer: rank r's chunk is its shard's segment
        c = g.chunks(buf, pos)
        assert tuple(c.shape) == (world, ch * it.cols)
        for r in range(world):
            r0, r1 = ref_rows(it.rows, world, r)
            seg = buf[r * S + g.offsets[pos]:r * S + g.offsets[pos] + ch * it.cols]
            assert torch.equal(c[r], seg)
            assert c.numel() == 0 or c[r].data_ptr() == seg.data_ptr()
            # the chunk's first rows are this rank's view, the rest padding
            assert torch.equal(c[r][:(r1 - r0) * it.cols], fulls[pos].reshape(-1)[r0 * it.cols:r1 * it.cols])
            assert (c[r][(r1 - r0) * it.cols:] == 0).all()
        # reassembled from every rank's view: the full tensor
        parts = [g.view(buf[r * S:(r + 1) * S], pos, r) for r in range(world)]
        assert torch.equal(torch.cat(parts).reshape(it.shape), fulls[pos])


def check_add_rows(g, world, rng):
    """items.add_rows adds a full tensor into its rank-major chunks exactly as a row-by-row
    reference does (padding untouched), on top of what the buffer held."""
    S = g.shard
    base = torch.from_numpy(rng.standard_normal(world * S))
    for pos, it in enumerate(g.items):
        full = torch.from_numpy(rng.standard_normal(it.numel)).reshape(it.shape)
        got = base.clone()
        IT.add_rows(g.chunks(got, pos), full, it.rows, it.cols, world)
        want = base.clone()
        ch = -(-it.rows // world)
        flat = full.reshape(-1)
        for r in range(world):
            r0, r1 = ref_rows(it.rows, world, r)
            o = r * S + g.offsets[pos]
            want[o:o + (r1 - r0) * it.cols] += flat[r0 * it.cols:r1 * it.cols]
            assert (r1 - r0) <= ch
        assert torch.equal(got, want), (it.shape, world)


@pytest.mark.parametrize("seed", range(12))
def test_random_geometries(seed):
    rng = np.random.default_rng(seed)
    items = random_items(rng, int(rng.integers(1, 25)))
    for it in items:
        check_item(it)
    for world in range(1, 9):
        bucket_size = int(rng.choice([1, 50, 500, 3000, 10 ** 9]))
        geoms = IT.buckets(items, bucket_size, world)
        check_packing(items, geoms, bucket_size)
        for g in geoms:
            check_bucket(g, world)
            check_add_rows(g, world, rng)


@pytest.mark.parametrize("shape", [(), (1,), (1, 7), (3, 5), (2, 2, 3), (9,), (8, 4)])
def test_small_items_in_every_world(shape):
    """0-d, 1-row and rows < world items: ranks past the last row hold nothing, every element once."""
    it = IT.Item("x", shape, torch.float32)
    check_item(it)
    for world in range(1, 9):
        (g,) = IT.buckets([it], 10, world)
        check_bucket(g, world)
        check_add_rows(g, world, np.random.default_rng(world))
        holders = [r for r in range(world) if g.rows_of(0, r)[1] > g.rows_of(0, r)[0]]
        ch = -(-it.rows // world)
        assert holders == list(range(-(-it.rows // ch)))   # ceil(rows / ch) ranks hold rows, in order
        assert all(g.view(torch.zeros(g.shard), 0, r).numel() == 0 for r in range(world) if r not in holders)


def test_packing_rules_and_offsets():
    def sizes(ns, bucket_size, world=1):
        its = [IT.Item(f"p{i}", (n,), torch.float32) for i, n in enumerate(ns)]
        return [[int(it.name[1:]) for it in g.items] for g in IT.buckets(its, bucket_size, world)]
    # model order; a bucket closes before exceeding; a big item alone
    assert sizes([10, 10, 10], 20) == [[0, 1], [2]]
    assert sizes([5, 100, 5], 20) == [[0], [1], [2]]
    assert sizes([3], 1) == [[0]]
    assert sizes([4, 4, 4, 4], 8) == [[0, 1], [2, 3]]
    items = [IT.Item("w", (5, 4), torch.float32), IT.Item("s", (), torch.float32),
             IT.Item("b", (3,), torch.bfloat16), IT.Item("v", (1, 8), torch.float32)]
    (g,) = IT.buckets(items, 1000, 2)
    # ch*C per item: w ceil(5/2)*4 = 12, s 1*1, b 2*1, v 1*8
    assert g.offsets == [0, 12, 13, 15] and g.shard == 23
    assert [g.rows_of(p, 1) for p in range(4)] == [(3, 5), (1, 1), (2, 3), (1, 1)]
    (g3,) = IT.buckets(items, 1000, 3)
    assert g3.offsets == [0, 8, 9, 10] and g3.shard == 18


def test_collect_rejections_and_fingerprint():
    from torch import nn
    with pytest.raises(ValueError, match="trainable parameters"):
        IT.collect(nn.Module())
    with pytest.raises(ValueError, match="trainable parameters"):
        IT.collect(nn.Linear(3, 3).requires_grad_(False))
    m = nn.Module()
    m.a = nn.Parameter(torch.zeros(3, dtype=torch.float64))
    with pytest.raises(TypeError, match="float64"):
        IT.collect(m)
    m = nn.Module()
    m.a = nn.Parameter(torch.zeros(0, 3))
    with pytest.raises(ValueError, match="at least one element"):
        IT.collect(m)
    m = nn.Module()
    m.a, m.f = nn.Parameter(torch.zeros(2, 3)), nn.Parameter(torch.zeros(4), requires_grad=False)
    m.s = nn.Parameter(torch.zeros(()))
    m.t = m.a    # tied: once
    items, frozen, names = IT.collect(m)
    assert [it.name for it in items] == ["a", "s"] and [n for n, _ in frozen] == ["f"]
    assert set(names) == {"a", "s"} and items[1].rows == 1 and items[1].shape == ()
    ok = [IT.Item("a", (3,), torch.float32)]
    f1 = IT.fingerprint(ok, [10, 2])
    assert f1 == IT.fingerprint([IT.Item("a", (3,), torch.float32)], [10, 2]) and 0 <= f1 < 2 ** 63
    g = IT.Item("a", (3,), torch.float32)
    g.group = 1
    for other in (IT.fingerprint(ok, [11, 2]), IT.fingerprint(ok, [10, 3]),
                  IT.fingerprint([IT.Item("a", (4,), torch.float32)], [10, 2]),
                  IT.fingerprint([IT.Item("b", (3,), torch.float32)], [10, 2]),
                  IT.fingerprint([IT.Item("a", (3,), torch.bfloat16)], [10, 2]),
                  IT.fingerprint([g], [10, 2]), IT.fingerprint(ok, [10, 2, ("lr", 0.1)])):
        assert other != f1

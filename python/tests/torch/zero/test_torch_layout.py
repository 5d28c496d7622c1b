# SPDX-License-Identifier: MIT
"""ShardedOptimizer's bucket/shard geometry (mxshard/torch/zero/layout.py): pure
functions, tested without torch (the module is loaded from its file)."""
import importlib.util
import os
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))  # python/ (from python/tests/torch/zero)
_spec = importlib.util.spec_from_file_location(
    "_mxs_torch_layout", os.path.join(PKG, "mxshard", "torch", "zero", "layout.py"))
LY = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = LY  # dataclasses look their module up
_spec.loader.exec_module(LY)


def random_items(rng, n):
    items = []
    for i in range(n):
        kind = rng.choice(["mx_both", "mx_row", "dense"], p=[0.3, 0.3, 0.4])
        if kind == "dense":
            shape = tuple(int(x) for x in rng.integers(1, 60, size=rng.integers(1, 3)))
            dtype = str(rng.choice(LY.DENSE_DTYPES))
        else:
            shape = (int(rng.integers(1, 70)), int(rng.integers(1, 90)))
            dtype = "mxfp8:padded:ceil"
        items.append(LY.ItemSpec(f"p{i}", kind, shape, dtype, int(rng.integers(0, 3))))
    return items


def check_plan(plan):
    items = plan.items
    seen = set()
    for b in plan.buckets:
        # bucket-internal order and the contiguous segments
        keys = [(LY.KINDS.index(items[p.item].kind),
                 LY.DENSE_DTYPES.index(items[p.item].dtype) if items[p.item].kind == "dense" else -1,
                 items[p.item].group) for p in b.items]
        assert keys == sorted(keys)
        off = 0
        for p in b.items:
            assert p.offset == off and p.numel == items[p.item].numel
            off += p.numel
            seen.add(p.item)
        assert off == b.numel
        assert b.n_pad % (plan.dp * plan.align) == 0 and b.n_pad >= max(b.numel, 1)
        assert b.n_pad < max(b.numel, 1) + plan.dp * plan.align and b.shard * plan.dp == b.n_pad
        mx = [p for p in b.items if items[p.item].kind != "dense"]
        both = [p for p in b.items if items[p.item].kind == "mx_both"]
        assert b.row == ((0, mx[-1].end) if mx else (0, 0))
        assert b.col == ((0, both[-1].end) if both else (0, 0))
        for dt, lo, hi in b.dense:
            sel = [p for p in b.items if items[p.item].kind == "dense" and items[p.item].dtype == dt]
            assert (lo, hi) == (sel[0].offset, sel[-1].end)
            assert sum(p.numel for p in sel) == hi - lo  # contiguous
        # every flat index owned by exactly one rank; ranges tile [0, n_pad)
        owners = np.full(b.n_pad, -1)
        for r in range(plan.dp):
            lo, hi = LY.rank_range(b, r)
            assert (owners[lo:hi] == -1).all()
            owners[lo:hi] = r
        assert (owners >= 0).all()
        for f in range(0, b.n_pad, max(1, b.n_pad // 17)):
            assert LY.owner(b, f) == owners[f]
        # item_shards: each item's elements covered exactly once over the ranks, at the right place
        cover = {p.item: np.zeros(p.numel, int) for p in b.items}
        runs_cover = np.zeros(b.n_pad, int)
        for r in range(plan.dp):
            lo, hi = LY.rank_range(b, r)
            owned = np.zeros(b.shard, bool)
            for p, start, length, pos in LY.item_shards(b, r):
                if length:
                    assert lo + pos == p.offset + start and 0 <= pos and pos + length <= b.shard
                    cover[p.item][start:start + length] += 1
                    owned[pos:pos + length] = True
                else:
                    assert start == pos == 0
            # views (group runs) cover exactly the rank's owned item elements, one group each, merged
            runs = LY.group_runs(plan, b, r)
            got = np.zeros(b.shard, bool)
            for i, (a, z, g) in enumerate(runs):
                assert a < z and not got[a:z].any()
                got[a:z] = True
                for p, start, length, pos in LY.item_shards(b, r):
                    if length and pos < z and pos + length > a:
                        assert items[p.item].group == g
                if i:
                    pa, pz, pg = runs[i - 1]
                    assert pz <= a and not (pz == a and pg == g), "adjacent runs of one group not merged"
            assert (got == owned).all()
            runs_cover[lo:lo + b.shard] += got
        for v in cover.values():
            assert (v == 1).all()
        assert runs_cover.sum() == b.numel
        # segment pieces tile each segment
        for lo, hi in [b.row, b.col] + [(x[1], x[2]) for x in b.dense]:
            pieces = LY.segment_pieces(b, lo, hi)
            assert sum(e - s for s, e in pieces) == hi - lo
    assert seen == set(range(len(items)))


@pytest.mark.parametrize("seed", range(12))
def test_random_plans(seed):
    rng = np.random.default_rng(seed)
    items = random_items(rng, int(rng.integers(1, 25)))
    for dp in range(1, 9):
        bucket_size = int(rng.choice([1, 50, 500, 3000, 10 ** 9]))
        align = int(rng.choice([1, 4, 32, 128]))
        plan = LY.make_plan(items, bucket_size, dp, align)
        check_plan(plan)
        # locate / shard_to_items are inverse
        for i in rng.choice(len(items), size=min(4, len(items)), replace=False):
            for e in {0, items[i].numel - 1, items[i].numel // 2}:
                b, r, pos = LY.locate(plan, int(i), e)
                assert any(it == i and s <= e < s + n and pos == sp + e - s
                           for it, s, n, sp in LY.shard_to_items(plan, b, r))


def test_packing_rules():
    # reverse model order; a bucket closes before exceeding; a big item alone
    assert LY.pack([10, 10, 10], 20) == [[2, 1], [0]]
    assert LY.pack([5, 100, 5], 20) == [[2], [1], [0]]
    assert LY.pack([3], 1) == [[0]]
    assert LY.pack([4, 4, 4, 4], 8) == [[3, 2], [1, 0]]
    items = [LY.ItemSpec("d", "dense", (8,), "float32", 1), LY.ItemSpec("w", "mx_row", (4, 4), "mxfp8", 0),
             LY.ItemSpec("h", "dense", (3,), "bfloat16", 0), LY.ItemSpec("v", "mx_both", (2, 8), "mxfp8", 0)]
    plan = LY.make_plan(items, 1000, 2, 8)
    (b,) = plan.buckets
    # both first, then row, then dense by dtype (float32 before bfloat16)
    assert [p.item for p in b.items] == [3, 1, 0, 2]
    assert b.row == (0, 32) and b.col == (0, 16) and b.dense == (("float32", 32, 40), ("bfloat16", 40, 43))
    assert b.n_pad == 48 and b.shard == 24
    assert LY.group_runs(plan, b, 0) == [(0, 24, 0)]
    assert LY.group_runs(plan, b, 1) == [(0, 8, 0), (8, 16, 1), (16, 19, 0)]


def test_rejections_and_fingerprint():
    ok = [LY.ItemSpec("a", "dense", (3,), "float32")]
    with pytest.raises(ValueError, match="empty model"):
        LY.make_plan([], 10, 1)
    with pytest.raises(ValueError, match="bucket_size"):
        LY.make_plan(ok, 0, 1)
    with pytest.raises(ValueError, match="dp"):
        LY.make_plan(ok, 10, 0)
    with pytest.raises(ValueError, match="dtype"):
        LY.make_plan([LY.ItemSpec("a", "dense", (3,), "float64")], 10, 1)
    with pytest.raises(ValueError, match="kind"):
        LY.make_plan([LY.ItemSpec("a", "sparse", (3,), "float32")], 10, 1)
    with pytest.raises(ValueError, match="2-D"):
        LY.make_plan([LY.ItemSpec("a", "mx_row", (3,), "mxfp8")], 10, 1)
    with pytest.raises(ValueError, match="no elements"):
        LY.make_plan([LY.ItemSpec("a", "dense", (0, 3), "float32")], 10, 1)
    p1 = LY.make_plan(ok, 10, 2)
    assert LY.fingerprint(p1) == LY.fingerprint(LY.make_plan(list(ok), 10, 2))
    for other in (LY.make_plan(ok, 11, 2), LY.make_plan(ok, 10, 3),
                  LY.make_plan([LY.ItemSpec("a", "dense", (4,), "float32")], 10, 2),
                  LY.make_plan(ok, 10, 2, extra=(("lr", 0.1),))):
        assert LY.fingerprint(other) != LY.fingerprint(p1)
        assert LY.first_difference(LY.describe(p1), LY.describe(other)) is not None
    assert LY.first_difference(LY.describe(p1), LY.describe(p1)) is None
    assert 0 <= LY.fingerprint(p1) < 2 ** 63

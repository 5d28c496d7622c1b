# SPDX-License-Identifier: MIT
"""ShardedOptimizer with NVFP4Linear weights: a gloo group of 2 processes
(started from a forkserver that imported torch once; spawned where CUDA
works) runs every case of torch_nvfp4_cases.plan(); the world-of-one
references, the DP=1 load of the group's checkpoint, the bucket geometry and
the input checks run here. Skips without torch, gloo or the host library. A
rank that hangs or dies fails the tests within DEADLINE (its process is
killed), it never blocks the run."""
import pytest

import torch_harness as H
from conftest import gloo_or_skip

WORLD = 2
DEADLINE = 90  # seconds for the group; a hang fails the tests (children killed), never blocks CI


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("nvfp4"))


@pytest.fixture(scope="module")
def results(root):
    gloo_or_skip(host_lib=True)
    import torch_nvfp4_cases as N
    return H.spawn_groups((WORLD,), N.worker, N.plan(root), ["torch_nvfp4_cases"], DEADLINE)


def _case(res, cid):
    return H.case_results(res, cid)


def _world_of_one():
    gloo_or_skip(host_lib=True)
    import torch.distributed as dist
    if dist.is_initialized():
        pytest.skip("torch.distributed is initialised in the test process")
    import torch_nvfp4_cases as N
    return N


@pytest.mark.parametrize("cid,kw", [("exact", {}), ("exact_odd_align", {"align": 3, "bucket_size": 1200,
                                                                         "steps": 2})])
def test_group_bytes_equal_across_ranks_and_world_of_one(results, cid, kw):
    """Every rank ends with the same primaries (data, scales, amax), dense values and masters,
    and they equal a world of one fed the group's mean gradients."""
    N = _world_of_one()
    out = _case(results, cid)
    r0, r1 = out[(WORLD, 0)], out[(WORLD, 1)]
    assert r0["model"] == r1["model"] and r0["masters"] == r1["masters"], "ranks hold different bytes"
    assert r0["buffers"] == 48 and r0["buckets"] > 1
    assert r0["nv_split"] >= 1, "no NVFP4 weight split between the ranks"
    per = r0["per_step"]
    assert per["all_reduce_nvfp4"] == per["all_gather_nvfp4_row"] >= 1 and per["all_gather_nvfp4_stage"] >= 1
    one = N.case_exact(0, 1, as_world=WORLD, **kw)
    assert one["masters"] == r0["masters"], "the group's masters differ from the world of one's"
    assert one["model"] == r0["model"], "the group's primaries / dense values differ from the world of one's"


def test_rank_local_failure_raises_on_every_rank(results):
    out = _case(results, "failure")
    for (w, r), o in out.items():
        for k in ("inner", "partial", "replaced"):
            assert o[k] == ("local" if r == 1 else "remote"), (w, r, k, o)


def test_checkpoint_resume_same_dp_and_dp1(results, root):
    _case(results, "ckpt")
    N = _world_of_one()
    N.resume_as_one(root).close()


def test_no_hang(results):
    assert not results["hung"], f"ranks (world, rank) never finished: {results['hung']}"
    print(f"gloo group of {WORLD}: {results['seconds']:.1f} s")


# ---- in this process ---------------------------------------------------------------

def test_world_of_one_round_through_none_and_without_mx():
    N = _world_of_one()
    r = N.case_exact(0, 1, round_through=None, with_mx=False, steps=2, bucket_size=10 ** 6)
    assert r["buckets"] == 1 and r["per_step"] == {}


def test_layout_even_offsets_and_shards():
    """NVFP4 items at even offsets (a gap after an odd one), shards a multiple of 2 even with an
    odd align; buckets without NVFP4 items are laid out as before (no gaps, padding to dp*align)."""
    gloo_or_skip()
    from mxshard.torch.zero import layout as LY
    items = [LY.ItemSpec("a", "mx_row", (3, 5), "mxfp8:padded:ceil"),
             LY.ItemSpec("b", "nv_both", (3, 3), "nvfp4:1x16:padded"),
             LY.ItemSpec("c", "nv_row", (5, 7), "nvfp4:16x16:compact"),
             LY.ItemSpec("d", "nv_row", (2, 2), "nvfp4:1x16:padded"),
             LY.ItemSpec("e", "dense", (7,), "float32")]
    for dp, align in ((1, 1), (2, 3), (3, 1), (4, 128)):
        p = LY.make_plan(items, 10 ** 6, dp, align)
        (b,) = p.buckets
        off = {p.items[q.item].name: q.offset for q in b.items}
        assert [p.items[q.item].name for q in b.items] == ["a", "b", "d", "c", "e"]   # reverse model order
        assert off == {"a": 0, "b": 16, "d": 26, "c": 30, "e": 65}, off   # gaps: 15 -> 16, 25 -> 26
        assert b.nv == (16, 65) and b.nv_col == (16, 25) and b.row == (0, 15)
        assert LY.nv_bytes(*b.nv) == 5 + 2 + 18   # ceil(9/2) + ceil(4/2) + ceil(35/2)
        assert b.shard % 2 == 0 and b.n_pad % (dp * align) == 0 and b.n_pad >= b.numel == 72
    q = LY.make_plan([items[0], items[4]], 10 ** 6, 2, 3).buckets[0]
    assert q.n_pad == 24 and not q.has_nv   # unchanged: round_up(22, 2*3)


def test_param_groups_and_repr():
    _world_of_one()
    import torch
    from torch import nn
    from mxshard.torch import NVFP4Linear, ShardedOptimizer
    m = nn.Sequential(NVFP4Linear(8, 4, planes="both", block="16x16"), NVFP4Linear(4, 2))
    o = ShardedOptimizer(m, lambda g: torch.optim.SGD(g, lr=0.1), param_groups=[{"params": [m[0]], "lr": 0.5}])
    kinds = {it.name: it.kind for it in o.items}
    assert kinds == {"0.weight": "nv_both", "0.bias": "dense", "1.weight": "nv_row", "1.bias": "dense"}, kinds
    assert "nv_both" in repr(o) and "nvamax=8" in repr(o)
    assert len(o.param_groups) == 2 and o.param_groups[0]["lr"] == 0.5
    with pytest.raises(ValueError, match="already managed"):
        ShardedOptimizer(m, lambda g: torch.optim.SGD(g, lr=0.1))
    o.close()

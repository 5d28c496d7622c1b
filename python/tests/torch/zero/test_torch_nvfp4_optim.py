# SPDX-License-Identifier: MIT
"""ShardedOptimizer with NVFP4Linear weights: a gloo group of 2 and one of 3 processes
(started concurrently from a forkserver that imported torch once; spawned where CUDA works)
run every case of torch_nvfp4_cases.plan(); the world-of-one references, the DP=1 load of the
groups' checkpoints, the bucket geometry and the input checks run here. Skips without torch,
gloo or the host library. A rank that hangs or dies fails the tests within DEADLINE (its
process is killed), it never blocks the run."""
import pytest

import torch_harness as H
from conftest import gloo_or_skip

WORLDS = (2, 3)
DEADLINE = 150  # seconds for the groups; a hang fails the tests (children killed), never blocks CI


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("nvfp4"))


@pytest.fixture(scope="module")
def results(root):
    gloo_or_skip(host_lib=True)
    import torch_nvfp4_cases as N
    return H.spawn_groups(WORLDS, N.worker, N.plan(root), ["torch_nvfp4_cases"], DEADLINE)


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
    """Every rank ends with the same planes (data, scales, amax), dense values and masters (the
    cases compared the masters with a one-process AdamW's after every step), and they equal a
    world of one fed the group's mean gradients; collectives per step are the formula."""
    N = _world_of_one()
    out = _case(results, cid)
    for w in WORLDS:
        r0 = out[(w, 0)]
        for r in range(1, w):
            assert out[(w, r)]["model"] == r0["model"] and out[(w, r)]["masters"] == r0["masters"], \
                f"world {w}: ranks 0 and {r} hold different bytes"
        # 6 "row" NVFP4 weights x (row_data, row_scale, amax) + 6 "both" x 5 buffers
        assert r0["buffers"] == 48 and r0["buckets"] > 1
        assert r0["nv_split"] >= 1, "no NVFP4 weight split between the ranks"
        nb = r0["buckets"]
        assert r0["per_step"] == {"all_reduce_grad": nb, "all_reduce_norm": 1, "all_reduce_max": 1,
                                  "all_gather": nb}, r0["per_step"]
        one = N.case_exact(0, 1, as_world=w, **kw)
        assert one["per_step"] == {}
        assert one["masters"] == r0["masters"], f"world {w}: the group's masters differ from the world of one's"
        assert one["model"] == r0["model"], \
            f"world {w}: the group's planes / dense values differ from the world of one's"


def test_odd_shapes_raise_not_implemented_on_every_rank(results):
    """The flat layout's odd NVFP4 shapes: FSDP2's shard rule's clear NotImplementedError on every
    rank (none hangs, none a RemoteError), for the model and for each breaking module alone; the
    ones the rule accepts build and train; at least one breaks at each world and 3 breaks others
    than 2 ((65, 7): ceil(7/3) * 65 is odd, ceil(7/2) * 65 even)."""
    out = _case(results, "odd")
    for (w, r), o in out.items():
        assert o["model"] == "local", (w, r, o)
        assert all(v == ("local" if i in o["bad"] else "built") for i, v in o["each"].items()), (w, r, o)
        assert len(o["each"]) == 12
    assert 7 not in out[(2, 0)]["bad"] and 7 in out[(3, 0)]["bad"]
    assert set(out[(2, 0)]["bad"]) == {0, 3, 5, 10} and set(out[(3, 0)]["bad"]) == {5, 7}


def test_rank_local_failure_raises_on_every_rank(results):
    out = _case(results, "failure")
    for (w, r), o in out.items():
        for k in ("inner", "partial", "replaced"):
            assert o[k] == ("local" if r == 1 else "remote"), (w, r, k, o)


def test_checkpoint_resume_same_dp_and_dp1(results, root):
    out = _case(results, "ckpt")
    N = _world_of_one()
    for w in WORLDS:
        assert all(out[(w, r)]["keys"] == out[(w, 0)]["keys"] for r in range(w))
        N.resume_as_one(root, w).close()


def test_no_hang(results):
    assert not results["hung"], f"ranks (world, rank) never finished: {results['hung']}"
    print(f"gloo groups of {WORLDS}: {results['seconds']:.1f} s")


# ---- in this process ---------------------------------------------------------------

def test_world_of_one_round_through_none_and_without_mx():
    """A world of one takes every shape of the flat layout's tests (one rank holds every row):
    masters equal the one-process AdamW's, planes the quantize of the masters without rounding."""
    N = _world_of_one()
    r = N.case_exact(0, 1, round_through=None, with_mx=False, steps=2, bucket_size=10 ** 6, modules=N.NV_MODULES)
    assert r["buckets"] == 1 and r["per_step"] == {} and r["nv_split"] == 0 and r["buffers"] == 48


def test_geometry_keeps_every_nvfp4_packing():
    """(The flat layout's even offsets and shards.) opt.buckets: items in model order at
    consecutive offsets of FSDP2's padded chunks, every row held by one rank, every NVFP4 item's
    rank rows starting at a byte of its packed plane; at worlds 1..5 the shard rule
    (NVFP4.check_shards) refuses exactly the NVFP4 items whose rank rows would break the packing."""
    N = _world_of_one()
    import torch
    from mxshard.torch import ShardedOptimizer
    from mxshard.torch.zero import items as IT
    for modules in (N.NV_EVEN, N.NV_MODULES):
        m = N.build_model(modules=modules)
        o = ShardedOptimizer(m, lambda g: torch.optim.SGD(g, lr=0.1), bucket_size=700)
        assert N.check_geometry(o.buckets, 1) == 0
        assert [it.name for g in o.buckets for it in g.items] == [it.name for it in o.items]
        assert [(it.bucket, it.offset) for it in o.items] == \
            [(g.index, off) for g in o.buckets for off in g.offsets]
        assert len(o.buckets) > 1 and all(g.shard == sum(it.numel for it in g.items) for g in o.buckets)
        items = o._items
        o.close()
        refused = set()
        for world in range(1, 6):
            geoms = IT.buckets(items, 700, world)
            for g in geoms:
                for it in g.items:
                    if not it.kind.startswith("nvfp4"):
                        continue
                    kept = N.packing_kept(it.rows, it.cols, world)
                    try:
                        it.module.fmt.check_shards(it.rows, it.cols, world, it.name)
                        assert kept, (it.name, it.shape, world)
                    except NotImplementedError as e:
                        assert not kept and str(e).startswith("mxshard: use an even in_features"), (it.name, world)
                        refused.add((it.name, world))
            # the geometry of the items the rule accepts (the refused ones left out)
            N.check_geometry([IT.BucketGeometry(g.index, [it for it in g.items if (it.name, world) not in refused],
                                                world) for g in geoms], world)
        if modules is N.NV_EVEN:
            assert not {w for _, w in refused} & {1, 2, 3}, refused
        else:
            assert {w for _, w in refused} >= {2, 3} and not {w for _, w in refused} & {1}


def test_param_groups_and_repr():
    _world_of_one()
    import torch
    from torch import nn
    from mxshard.torch import NVFP4Linear, ShardedOptimizer
    m = nn.Sequential(NVFP4Linear(8, 4, planes="both", block="16x16"), NVFP4Linear(4, 2))
    o = ShardedOptimizer(m, lambda g: torch.optim.SGD(g, lr=0.1), param_groups=[{"params": [m[0]], "lr": 0.5}])
    kinds = {it.name: it.kind for it in o.items}
    assert kinds == {"0.weight": "nvfp4_both", "0.bias": "dense", "1.weight": "nvfp4_row", "1.bias": "dense"}, kinds
    assert repr(o) == "ShardedOptimizer(world=1, rank=0, 1 buckets, 4 items, inner=SGD, steps=0)"
    assert len(o.param_groups) == 2 and o.param_groups[0]["lr"] == 0.5 and o.param_groups[1]["lr"] == 0.1
    views = {o.buckets[b].items[pos].name: v for v, b, pos in o._views}
    assert [p is views["0.weight"] for p in o.param_groups[0]["params"]] == [True]
    assert {id(p) for p in o.param_groups[1]["params"]} == {id(views[n]) for n in ("0.bias", "1.weight", "1.bias")}
    with pytest.raises(ValueError, match="close the ShardedOptimizer that trains 0 first"):
        ShardedOptimizer(m, lambda g: torch.optim.SGD(g, lr=0.1))
    o.close()

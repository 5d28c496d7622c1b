# SPDX-License-Identifier: MIT
"""Data-parallel habits beside FSDP2 (run by the groups of torch_fsdp_cases.plan_a, at a world of 2,
on CPU tensors): torch.distributed collectives into converted weights (hand-written data
parallel's syncs, parameter averaging), DistributedDataParallel with ZeroRedundancyOptimizer, and
convert() after DDP. Each returns a small summary or raises."""
import torch
import torch.distributed as dist
from torch import nn

import mxshard.torch as mxt
from converted_checks import bytes_fresh


def _net(seed, policy="row"):
    torch.manual_seed(seed)
    return mxt.convert(nn.Sequential(nn.Linear(64, 96), nn.GELU(), nn.Linear(96, 40)), policy)


def case_collectives_into_weights(rank, world):
    """dist.broadcast(p), dist.broadcast(p.data) and dist.all_reduce(p.data) into converted weights
    whose bytes were made (a forward first): the masters took the values, but the layers kept
    their old bytes (the collectives' schemas mark no tensor as written, so no write was counted)
    and the ranks' forwards differed. Each now leaves the bytes the quantize of the new master."""
    m = _net(rank, {"0": "row", "2": "both"})   # different values on each rank
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(7))
    m(x)
    out = {}
    for how in ("broadcast(p)", "broadcast(p.data)", "all_reduce(p.data)"):
        for p in m.parameters():
            if how == "broadcast(p)":
                with torch.no_grad():
                    dist.broadcast(p, 0)
            elif how == "broadcast(p.data)":
                dist.broadcast(p.data, 0)
            else:
                dist.all_reduce(p.data)
        out[how] = [bytes_fresh(m[0]), bytes_fresh(m[2])]
    y = m(x)
    ys = [torch.empty_like(y) for _ in range(world)]
    dist.all_gather(ys, y.detach())
    out["same_forward"] = all(torch.equal(ys[0], t) for t in ys)
    return out


def case_zero_redundancy(rank, world, bucket_view=False):
    """DistributedDataParallel + ZeroRedundancyOptimizer(AdamW) on a converted model, the same
    batch on every rank: the masters and the forward equal a one-process AdamW run bit for bit on
    every rank. ZeRO broadcasts each parameter a rank does not own (those kept their old bytes), or,
    with parameters_as_bucket_view=True, writes a bucket the parameters are views of (`.data` set
    to the view: the master was cloned out of it, so it never saw the broadcasts)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel
    g = torch.Generator().manual_seed(11)
    data = [(torch.randn(8, 64, generator=g), torch.randn(8, 40, generator=g)) for _ in range(3)]
    ref = _net(0, {"0": "row", "2": "both"})
    ro = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    for x, y in data:
        ((ref(x) - y) ** 2).mean().backward()
        ro.step()
        ro.zero_grad()
    m = _net(0, {"0": "row", "2": "both"})
    d = DistributedDataParallel(m)
    o = ZeroRedundancyOptimizer(d.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-2,
                                parameters_as_bucket_view=bucket_view)
    for x, y in data:
        ((d(x) - y) ** 2).mean().backward()
        o.step()
        o.zero_grad()
    same = [torch.equal(a.detach().view(torch.int32), b.detach().view(torch.int32))
            for a, b in zip(m.parameters(), ref.parameters())]
    x = torch.randn(4, 64, generator=g)
    with torch.no_grad():
        fwd = torch.equal(m(x), ref(x))
    return {"masters": same, "forward": fwd, "fresh": [bytes_fresh(m[0]), bytes_fresh(m[2])]}


def case_convert_after_ddp(rank, world):
    """convert() of a model already wrapped in DistributedDataParallel: DDP's reducer held the
    replaced nn.Linear weights, and the converted weights' gradients were never averaged (the
    ranks drifted apart, or DDP asked about unused parameters). Every rank raises, saying to
    convert first."""
    from torch.nn.parallel import DistributedDataParallel
    torch.manual_seed(0)
    d = DistributedDataParallel(nn.Sequential(nn.Linear(64, 96), nn.GELU(), nn.Linear(96, 40)))
    try:
        mxt.convert(d, "row")
    except ValueError as e:
        return {"raised": str(e)[:75]}
    return {"raised": None}


def case_save_checkpoint_split_paths(rank, world, root):
    """save_checkpoint where each rank gives its own folder: both returned, and neither folder held
    a loadable checkpoint. Every rank raises now, before anything is written."""
    m = _net(0)
    with mxt.ShardedOptimizer(m, lambda g: torch.optim.AdamW(g, lr=1e-2)) as o:
        try:
            mxt.save_checkpoint(f"{root}/split_{rank}", m, o)
        except mxt.CheckpointError as e:
            import os
            return {"raised": str(e)[:50], "written": os.path.exists(f"{root}/split_{rank}/.metadata")}
    return {"raised": None}

import os, sys, copy
import torch, torch.nn as nn
import torch.distributed as dist
import torch.multiprocessing as mp
import mxshard.torch as mxt

def model(seed=0):
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(40, 70), nn.GELU(), nn.LayerNorm(70), nn.Linear(70, 34), nn.GELU(), nn.Linear(34, 10))
    m = mxt.convert(m, {"0": "row", "3": "both"})
    return mxt.convert(m, {"5": "both"}, format="nvfp4", block=__import__("os").environ.get("BLK", "1x16"))

def data(step):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(16, 40, generator=g)

def ref_run(steps, max_norm=None):
    m = model()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    for s in range(steps):
        m(data(s)).pow(2).mean().backward()
        if max_norm: torch.nn.utils.clip_grad_norm_(m.parameters(), max_norm)
        opt.step(); opt.zero_grad()
    return {n: p.detach().clone() for n, p in m.named_parameters()}, m

def run(rank, world, port, steps, q, bs):
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    m = model()
    opt = mxt.ShardedOptimizer(m, lambda g: torch.optim.AdamW(g, lr=1e-2), bucket_size=bs)
    for s in range(steps):
        m(data(s)).pow(2).mean().backward()
        opt.step(); opt.zero_grad()
    # full masters
    out = {}
    for v, b, pos in opt._views:
        it = opt._geoms[b].items[pos]
        t = v.contiguous()
        if world > 1:
            parts = [None] * world
            dist.all_gather_object(parts, t)
            t = torch.cat(parts)
        out[it.name] = t.reshape(it.shape)
    y = m(data(99)).detach()
    q.put((rank, {k: v.numpy().copy() for k, v in out.items()}, y.numpy().copy(), dict(opt.collectives), dict(opt.setup_collectives)))
    opt.close()
    if world > 1: dist.destroy_process_group()

if __name__ == "__main__":
    steps = 3
    torch.set_num_threads(1)
    ref, rm = ref_run(steps)
    yref = rm(data(99)).detach()
    for world, bs in ((1, 10**9), (2, 2500), (4, 3000), (3, 3000)):
        q = mp.get_context("spawn").Queue()
        port = 29600 + world
        ps = [mp.get_context("spawn").Process(target=run, args=(r, world, port, steps, q, bs)) for r in range(world)]
        [p.start() for p in ps]
        res = [q.get(timeout=120) for _ in ps]
        [p.join() for p in ps]
        for rank, out, y, coll, setup in sorted(res, key=lambda x: x[0]):
            bad = [n for n in ref if not torch.equal(ref[n].float().reshape(out[n].shape), torch.from_numpy(out[n]))]
            y = torch.from_numpy(y)
            print(f"world {world} rank {rank}: masters differ: {bad}; y equal: {torch.equal(y, yref)} maxdiff {(y-yref).abs().max():.3g}; per-run collectives {dict(coll)} setup {dict(setup)}")

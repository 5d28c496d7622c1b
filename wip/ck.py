import os, sys
import torch, torch.nn as nn
import torch.distributed as dist
import torch.multiprocessing as mp
sys.argv = ["x"]
exec(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "smoke.py")).read().split("def ref_run")[0])

def full(opt, world):
    out = {}
    for v, b, pos in opt._views:
        it = opt._geoms[b].items[pos]
        t = v.contiguous()
        if world > 1:
            parts = [None] * world
            dist.all_gather_object(parts, t)
            t = torch.cat(parts)
        out[it.name] = t.reshape(it.shape).numpy().copy()
    st = {}
    for v, s in opt.inner.state.items():
        pass
    return out

def run(rank, world, port, q, mode, path):
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    m = model()
    opt = mxt.ShardedOptimizer(m, lambda g: torch.optim.AdamW(g, lr=1e-2), bucket_size=2500)
    if mode == "save":
        for s in range(2):
            m(data(s)).pow(2).mean().backward(); opt.step(); opt.zero_grad()
        mxt.save_checkpoint(path, m, opt)
    else:
        mxt.load_checkpoint(path, m, opt)
    f = full(opt, world)
    y0 = m(data(99)).detach().numpy().copy()
    m(data(2)).pow(2).mean().backward(); opt.step(); opt.zero_grad()
    f2 = full(opt, world)
    q.put((rank, f, y0, f2, opt.steps))
    opt.close()
    if world > 1: dist.destroy_process_group()

def go(world, mode, path, port):
    ctx = mp.get_context("spawn"); q = ctx.Queue()
    ps = [ctx.Process(target=run, args=(r, world, port, q, mode, path)) for r in range(world)]
    [p.start() for p in ps]
    res = sorted([q.get(timeout=120) for _ in ps], key=lambda x: x[0])
    [p.join() for p in ps]
    return res[0]

if __name__ == "__main__":
    path = "/tmp/thin/ckpt"
    import shutil; shutil.rmtree(path, ignore_errors=True)
    base = go(2, "save", path, 29700)
    for w in (1, 2, 4):
        r = go(w, "load", path, 29710 + w)
        same = all((base[1][k] == r[1][k]).all() for k in base[1])
        ysame = (base[2] == r[2]).all()
        same2 = all((base[3][k] == r[3][k]).all() for k in base[3])
        print(f"load at world {w}: masters equal {same}, forward equal {ysame}, after one more step equal {same2}, steps {r[4]} vs {base[4]}")

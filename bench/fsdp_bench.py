# SPDX-License-Identifier: MIT
"""FSDP2 with mxshard weights against FSDP2 in BF16 and against ShardedOptimizer:
bytes on the wire, per-rank memory in bytes per parameter, and the step time.

    python bench/fsdp_bench.py memory --worlds 1,2,4,8        # gloo ranks on the CPU (any machine)
    python bench/fsdp_bench.py step --hidden 2048 --blocks 24  # one GPU, NCCL world of one (~1B model)
    torchrun --standalone --nproc_per_node=2 bench/fsdp_bench.py step ...   # two GPUs

The model: an embedding, `blocks` residual MLP blocks (LayerNorm, fc1 d->h,
fc2 h->d), a dense head; every block its own fully_shard, the root another,
MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32). Variants:

    fsdp-bf16      plain FSDP2: the weights travel as BF16
    fsdp-mx-row    convert(): fc1 and fc2 row-only MXFP8
    fsdp-mx-both   fc1 "both", fc2 row-only
    fsdp-nv-row    fc1 and fc2 row-only NVFP4 1x16
    sharded-row    ShardedOptimizer, fc1 and fc2 row-only MXFP8Linear (memory only)

memory: per rank, after one step (optimizer state allocated), the bytes of
each kind of tensor the rank holds, divided by the model's parameter count:
master, optimizer state, gradients (the sharded ones FSDP2 keeps after the
reduce-scatter; ShardedOptimizer's gradient buffer), mxshard's own
(fragments, scales, packed buffers; ShardedOptimizer's replicated
primaries), and the transient unsharded weights of the largest block. Also
the bytes this rank put on all-gathers and all-reduces in one step, counted
at torch.distributed.

step: median and min of the step time (forward, backward, optimizer) over
--steps after --warmup, CUDA events, peak memory.
"""
import argparse
import contextlib
import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
import mxshard.torch as mxt  # noqa: E402

VARIANTS = ("fsdp-bf16", "fsdp-mx-row", "fsdp-mx-both", "fsdp-nv-row", "sharded-row")


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, h, bias=False)
        self.fc2 = nn.Linear(h, d, bias=False)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class Model(nn.Module):
    def __init__(self, vocab, d, h, blocks):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, h) for _ in range(blocks))
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, tok):
        x = self.emb(tok)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def build(variant, args, device):
    torch.manual_seed(0)
    m = Model(args.vocab, args.hidden, args.ffn, args.blocks).to(device)
    if variant == "fsdp-mx-row":
        mxt.convert(m, {"blocks.*.fc*": "row"})
    elif variant == "fsdp-mx-both":
        mxt.convert(m, {"blocks.*.fc1": "both", "blocks.*.fc2": "row"})
    elif variant == "fsdp-nv-row":
        mxt.convert(m, {"blocks.*.fc*": "row"}, format="nvfp4")
    elif variant == "sharded-row":
        m = m.to(torch.bfloat16)
        mxt.convert(m, {"blocks.*.fc*": "row"})
        return m, mxt.ShardedOptimizer(m, lambda g: torch.optim.AdamW(g, lr=1e-4))
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))  # explicit: the default is the GPU's
    for b in m.blocks:
        fully_shard(b, mesh=mesh, mp_policy=mp)
    fully_shard(m, mesh=mesh, mp_policy=mp)
    return m, torch.optim.AdamW(m.parameters(), lr=1e-4)


@contextlib.contextmanager
def wire_bytes():
    """Bytes this rank hands to all-gathers and all-reduces (torch.distributed level)."""
    names = ("all_gather_into_tensor", "all_reduce", "all_gather")
    orig = {n: getattr(dist, n) for n in names}
    out = {"all_gather": 0, "all_reduce": 0, "all_reduce_calls": 0}

    def nbytes(t):
        return t.numel() * t.element_size()

    def wrap(n, f):
        def g(*a, **k):
            if n == "all_gather_into_tensor":
                out["all_gather"] += nbytes(k.get("input_tensor", a[1] if len(a) > 1 else None))
            elif n == "all_gather":
                out["all_gather"] += nbytes(k.get("tensor", a[1] if len(a) > 1 else None))
            else:
                out["all_reduce"] += nbytes(a[0] if a else k["tensor"])
                out["all_reduce_calls"] += 1
            return f(*a, **k)
        return g
    for n in names:
        setattr(dist, n, wrap(n, orig[n]))
    try:
        yield out
    finally:
        for n in names:
            setattr(dist, n, orig[n])


def _bytes(ts):
    seen, total = set(), 0
    for t in ts:
        if t is None or not isinstance(t, torch.Tensor):
            continue
        t = getattr(t, "_local_tensor", t)
        t = getattr(t, "_data", t)
        key = (t.data_ptr(), t.numel())
        if key in seen or t.numel() == 0:
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total


def _unit_bytes(m):
    quant = [x for x in m.modules() if mxt.is_param_linear(x)]
    if not quant:
        return 0
    ts = []
    for u in quant[0]._group.units.values():
        ts += list(u.send_data.values()) + list(u.send_scale.values()) + list(u.scales.values())
        ts += [u.wb.packed] + [getattr(u, "amax", None)]
    return _bytes(ts)


def _largest_block_gather(m, args, tok):
    """Bytes of the unsharded weights FSDP2 materialises for one block (the transient)."""
    from torch.distributed.fsdp import FSDPModule
    b = m.blocks[0]
    if not isinstance(b, FSDPModule):
        return 0
    b.unshard()
    total = 0
    for mod in (b.fc1, b.fc2):
        w = mod._parameters["weight"]
        if mxt.is_param_linear(mod):
            for p in w._box.planes.values():
                total += _bytes([p.row_data, p.row_scale, p.col_data, p.col_scale])
            total += _bytes([w._box.scratch])
        else:
            total += w.numel() * w.element_size()
    b.reshard()
    return total


def memory_rank(variant, args):
    rank, world = dist.get_rank(), dist.get_world_size()
    m, opt = build(variant, args, torch.device("cpu"))
    n_params = sum(p.numel() for p in Model(args.vocab, args.hidden, args.ffn, args.blocks).parameters())
    g = torch.Generator().manual_seed(rank)
    tok = torch.randint(0, args.vocab, (2, 16), generator=g)
    with wire_bytes() as wire:
        F.cross_entropy(m(tok).float().reshape(-1, args.vocab), tok.reshape(-1)).backward()
        if variant != "sharded-row":
            grads = _bytes(p.grad for p in m.parameters())
        opt.step()
    if variant == "sharded-row":
        bk = opt._buckets  # the optimizer's own buffers (mxshard.torch.zero.build)
        masters = _bytes(b.master for b in bk)
        grads = _bytes([b.grad for b in bk] + [b.grad_shard for b in bk if not b.shard_is_view])
        state = _bytes(t for st in opt.inner.state.values() for t in st.values()
                       if isinstance(t, torch.Tensor) and t.dim())
        extra = _bytes(list(m.buffers()) + list(m.parameters()))  # replicated primaries + dense params
        transient = 0
    else:
        masters = _bytes(p for p in m.parameters())
        state = _bytes(t for st in opt.state.values() for t in st.values() if isinstance(t, torch.Tensor) and t.dim())
        extra = _unit_bytes(m)
        transient = _largest_block_gather(m, args, tok)
    out = {"variant": variant, "world": world, "rank": rank, "params": n_params, "master": masters, "optim": state,
           "grads": grads, "mxshard": extra, "transient_block": transient, "wire": wire}
    if variant == "sharded-row":
        opt.close()
    return out


def _rank_main(rank, world, port, args, q):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        q.put([memory_rank(v, args) for v in args.variants])
    finally:
        dist.destroy_process_group()


def run_memory(args):
    import torch.multiprocessing as mp
    rows = []
    for world in args.worlds:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        procs = [ctx.Process(target=_rank_main, args=(r, world, port, args, q)) for r in range(world)]
        for p in procs:
            p.start()
        got = [q.get(timeout=900) for _ in procs]
        for p in procs:
            p.join()
        for per_variant in zip(*got):
            rows.append(max(per_variant, key=lambda r: r["master"] + r["optim"] + r["grads"] + r["mxshard"]))
        print(f"fsdp_bench: world {world} done", file=sys.stderr, flush=True)
    print("| world | variant | master | optimizer | gradients | mxshard / primaries | persistent | transient block "
          "| all-gather B/param/step | all-reduce B/step (calls) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        n = r["params"]
        pers = r["master"] + r["optim"] + r["grads"] + r["mxshard"]
        print(f"| {r['world']} | {r['variant']} | {r['master'] / n:.3f} | {r['optim'] / n:.3f} | {r['grads'] / n:.3f} | "
              f"{r['mxshard'] / n:.3f} | {pers / n:.3f} | {r['transient_block'] / 1e6:.2f} MB | "
              f"{r['wire']['all_gather'] / n:.3f} | {r['wire']['all_reduce']} ({r['wire']['all_reduce_calls']}) |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


def run_step(args):
    local = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29561")
    dist.init_process_group("nccl", device_id=dev)
    world = dist.get_world_size()
    tok = torch.randint(0, args.vocab, (args.batch, args.seq), device=dev)
    for variant in args.variants:
        if variant == "sharded-row":
            continue
        torch.cuda.empty_cache()
        m, opt = build(variant, args, dev)
        n = sum(p.numel() for p in m.parameters()) * world if variant != "sharded-row" else 0
        times = []
        for i in range(args.warmup + args.steps):
            if i == 1:  # the training peak: after the first step allocated the optimizer state
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            F.cross_entropy(m(tok).float().reshape(-1, args.vocab), tok.reshape(-1)).backward()
            opt.step()
            opt.zero_grad()
            b.record()
            torch.cuda.synchronize()
            if i >= args.warmup:
                times.append(a.elapsed_time(b))
        peak = torch.cuda.max_memory_allocated() / 2 ** 30
        if dist.get_rank() == 0:
            print(f"| {variant} | {world} | {n / 1e9:.2f} B | {args.batch * args.seq} | {statistics.median(times):.1f} | "
                  f"{min(times):.1f} | {peak:.2f} |", flush=True)
        if args.profile and dist.get_rank() == 0:
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(2):
                    F.cross_entropy(m(tok).float().reshape(-1, args.vocab), tok.reshape(-1)).backward()
                    opt.step()
                    opt.zero_grad()
                torch.cuda.synchronize()
            ka = prof.key_averages()
            print(f"profile {variant} (2 steps): by device time", file=sys.stderr)
            print(ka.table(sort_by="self_cuda_time_total", row_limit=12, max_name_column_width=60), file=sys.stderr)
            print(f"profile {variant} (2 steps): by host time", file=sys.stderr)
            print(ka.table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=60), file=sys.stderr)
        del m, opt
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=["memory", "step"])
    ap.add_argument("--worlds", default="1,2,4,8")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--ffn", type=int, default=1024)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", default=None)
    ap.add_argument("--profile", action="store_true", help="step: torch.profiler tables of 2 steps per variant")
    args = ap.parse_args()
    args.worlds = [int(w) for w in args.worlds.split(",")]
    args.variants = [v for v in args.variants.split(",") if v]
    t0 = time.time()
    if args.mode == "memory":
        run_memory(args)
    else:
        if int(os.environ.get("RANK", 0)) == 0:
            print("| variant | world | params | tokens | step ms (median) | step ms (min) | peak GiB |")
            print("|---|---|---|---|---|---|---|")
        run_step(args)
    print(f"fsdp_bench: {time.time() - t0:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()

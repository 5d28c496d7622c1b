# SPDX-License-Identifier: MIT
"""FSDP2 with mxshard weights against FSDP2 in BF16 and against ShardedOptimizer:
bytes on the wire, per-rank memory in bytes per parameter, and the step time.

    python bench/fsdp_bench.py memory --worlds 1,2,4,8        # gloo ranks on the CPU (any machine)
    torchrun --standalone --nproc_per_node=1 bench/fsdp_bench.py step --vocab 32000 --hidden 2048 \
        --ffn 8192 --blocks 24                                  # one GPU, NCCL world of one (~1B MLP model)
    torchrun ... bench/fsdp_bench.py step --model llama        # the ~1B Llama-like model (its defaults)
    torchrun ... bench/fsdp_bench.py step --model llama --compile --variants fsdp-bf16,fsdp-mx-row
    torchrun ... bench/fsdp_bench.py step --model llama --cprofile 3 --cprofile-out /tmp/cp --json s.json
    torchrun --standalone --nproc_per_node=2 bench/fsdp_bench.py step ...   # two GPUs

Models (bench/fsdp_models.py, which also says what each variant converts): `--model mlp` (default:
an embedding, `blocks` residual MLP blocks (LayerNorm, fc1 d->h, fc2 h->d), a dense head) or
`--model llama` (fused qkv, RoPE, SDPA causal, RMSNorm, SwiGLU with separate gate and up
(`--fuse-gate-up`: one), defaults d 2048, ffn 5632, 16 heads, 16 blocks, vocab 32000: 0.95 B
parameters; converted: qkv, o, gate, up, down). Every block its own fully_shard, the root another,
MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32). Variants:

    fsdp-bf16      plain FSDP2: the weights travel as BF16
    fsdp-mx-row    convert(): every block linear row-only MXFP8
    fsdp-mx-both   the linears reading the normalised input (fc1; qkv, gate, up) "both", the others row-only
    fsdp-nv-row    every block linear row-only NVFP4 1x16
    sharded-row    ShardedOptimizer over the row-only MXFP8 converted model (memory only)

memory: per rank, after one step (optimizer state allocated), the bytes of
each kind of tensor the rank holds, divided by the model's parameter count:
master, optimizer state, gradients (the sharded ones FSDP2 keeps after the
reduce-scatter; ShardedOptimizer's gradient buffers, opt.buffer_bytes()["grad"]),
mxshard's own (fragments, scales, packed buffers; under ShardedOptimizer the
replicated planes of each converted weight, its Parameter(GatheredWeight)'s
weight._box.planes: row / col data and scales and amax, plus the replicated
dense parameters and buffers), and the transient unsharded weights of the
largest block. ShardedOptimizer's master is opt.buffer_bytes()["master"]. Also
the bytes this rank put on all-gathers and all-reduces in one step, counted
at torch.distributed.

step: a training step (forward, cross entropy, backward, clip_grad_norm_ (--clip: 1.0 for llama by
default, off for mlp), AdamW, zero_grad) of each variant, built in the same process one after the
other. Per variant: median and min of the step time over --steps after --warmup (CUDA events;
perf_counter on the CPU), peak memory, and the host time: `host CPU ms` is time.process_time of the
process (every thread: the autograd device thread where a CUDA backward runs included) over the
timed steps, per step; `main thread ms` time.thread_time of the main thread; `issue ms` the wall
time until the step's Python returns (before the synchronisation); `host ms per weight` host CPU ms
divided by the number of block linears the converting variants convert (BF16's too, the same
count); `extra ... vs BF16` (host ms - BF16's host ms) / converted weights, BF16 measured earlier in
the same run. On CUDA the primary context is set to blocking synchronisation (bench/fsdp_hostcpu.py;
--spin: not), so a wait for the GPU costs no CPU time. On a machine without a GPU (or --device cpu)
the step runs on CPU tensors over gloo (a smoke check). --compile: each block
`block.compile(backend=--compile-backend)` in place before fully_shard (the first step's wall time,
the compile included, and dynamo's graph / graph-break counts go in --json; the recompile limit is
raised to 8 per block). --cprofile N: N more steps of each variant under cProfile on rank 0 after
the timed ones: the top 25 functions by tottime and cumtime, mxshard's functions summed per
function, tottime per kind of code (mxshard, torch fsdp, ...), all per step (stderr; in --json;
--cprofile-out PREFIX: PREFIX-<variant>.md and .prof). --profile: torch.profiler tables of 2 steps.
--json: everything above per variant. MXS_BENCH_PYTHON=<tree>/python runs this bench against
another tree's mxshard package. bench/fsdp_project.py projects the step to DP 8-512 from these
numbers and the bytes.
"""
import argparse
import contextlib
import gc
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
# MXS_BENCH_PYTHON: the python/ folder of another tree (its mxshard package, this bench)
sys.path.insert(0, os.environ.get("MXS_BENCH_PYTHON") or os.path.join(os.path.dirname(HERE), "python"))
sys.path.insert(0, HERE)
import mxshard.torch as mxt  # noqa: E402
import fsdp_hostcpu as hostcpu  # noqa: E402
import fsdp_models as models  # noqa: E402
from fsdp_models import Block, Model  # noqa: E402,F401  (importers of fsdp_bench.Model)

VARIANTS = ("fsdp-bf16", "fsdp-mx-row", "fsdp-mx-both", "fsdp-nv-row", "sharded-row")


def build(variant, args, device):
    torch.manual_seed(0)
    m = models.make(args).to(device)
    pol, fmt = models.policy(args.model, variant)
    if variant == "sharded-row":
        m = m.to(torch.bfloat16)
        mxt.convert(m, pol)
        return m, mxt.ShardedOptimizer(m, lambda g: torch.optim.AdamW(g, lr=1e-4))
    if pol is not None:
        mxt.convert(m, pol, format=fmt)
    if getattr(args, "compile", False):
        for b in m.blocks:  # each block compiled in place, before fully_shard
            b.compile(backend=args.compile_backend)
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
    for mod in [x for x in b.modules() if isinstance(x, nn.Linear)]:
        w = mod._parameters["weight"]
        if mxt.is_param_linear(mod):
            for p in w._box.planes.values():
                total += _bytes([p.row_data, p.row_scale, p.col_data, p.col_scale])
            total += _bytes([w._box.scratch])
        else:
            total += w.numel() * w.element_size()
    b.reshard()
    return total


def _sharded_model_bytes(m):
    """What the model holds under ShardedOptimizer: every converted weight's replicated planes
    (its Parameter(GatheredWeight)'s weight._box.planes; "both" holds one primary under both
    keys, counted once), the dense parameters and the buffers."""
    from mxshard.torch.fsdp.gathered import GatheredWeight
    ts = list(m.buffers()) + [p for p in m.parameters() if not isinstance(p, GatheredWeight)]
    for mod in m.modules():
        w = mod._parameters.get("weight") if mxt.is_param_linear(mod) else None
        if isinstance(w, GatheredWeight):
            for p in w._box.planes.values():
                ts += [p.row_data, p.row_scale, p.col_data, p.col_scale, getattr(p, "amax", None)]
    return _bytes(ts)


def memory_rank(variant, args):
    rank, world = dist.get_rank(), dist.get_world_size()
    m, opt = build(variant, args, torch.device("cpu"))
    n_params = sum(p.numel() for p in models.make_meta(args).parameters())
    g = torch.Generator().manual_seed(rank)
    tok = torch.randint(0, args.vocab, (2, 16), generator=g)
    with wire_bytes() as wire:
        F.cross_entropy(m(tok).float().reshape(-1, args.vocab), tok.reshape(-1)).backward()
        if variant != "sharded-row":
            grads = _bytes(p.grad for p in m.parameters())
        opt.step()
    if variant == "sharded-row":
        buf = opt.buffer_bytes()  # the optimizer's own buffers: fp32 master shards, gradient buffers
        masters, grads = buf["master"], buf["grad"]
        state = _bytes(t for st in opt.inner.state.values() for t in st.values()
                       if isinstance(t, torch.Tensor) and t.dim())
        extra = _sharded_model_bytes(m)  # replicated planes + dense params and buffers
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


def _step_fn(m, opt, tok, args):
    """One training step: forward, cross entropy, backward, clip_grad_norm_ (llama by default),
    AdamW step, zero_grad."""
    params = [p for p in m.parameters()]

    def one():
        F.cross_entropy(m(tok).float().reshape(-1, args.vocab), tok.reshape(-1)).backward()
        if args.clip:
            torch.nn.utils.clip_grad_norm_(params, args.clip)
        opt.step()
        opt.zero_grad()
    return one


def _compile_stats():
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return {}
    return {"unique_graphs": int(counters["stats"].get("unique_graphs", 0)),
            "graph_breaks": int(sum(counters["graph_break"].values())),
            "recompiles": int(counters["recompiles"].get("recompiles", 0)) if "recompiles" in counters else None}


def _step_variant(variant, args, dev, tok, n_linears, rows):
    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    rank, world = dist.get_rank(), dist.get_world_size()
    gc.collect()   # the previous variant's model and optimizer (reference cycles) before this one's peak
    if cuda:
        torch.cuda.empty_cache()
    cstats0 = _compile_stats() if args.compile else None
    m, opt = build(variant, args, dev)
    n = sum(p.numel() for p in m.parameters()) * world
    conv = sum(1 for x in m.modules() if mxt.is_param_linear(x))
    one = _step_fn(m, opt, tok, args)
    times, issue, first = [], [], None
    p0 = t0 = None
    for i in range(args.warmup + args.steps):
        if i == 1 and cuda:  # the training peak: after the first step allocated the optimizer state
            sync()
            torch.cuda.reset_peak_memory_stats()
        if i == args.warmup:
            sync()
            p0, t0 = time.process_time(), time.thread_time()
        w0 = time.perf_counter()
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
        one()
        w1 = time.perf_counter()
        if cuda:
            b.record()
        sync()
        ms = a.elapsed_time(b) if cuda else (time.perf_counter() - w0) * 1e3
        if i == 0:
            first = time.perf_counter() - w0
        if i >= args.warmup:
            times.append(ms)
            issue.append((w1 - w0) * 1e3)
    host = (time.process_time() - p0) * 1e3 / args.steps
    main_t = (time.thread_time() - t0) * 1e3 / args.steps
    peak = torch.cuda.max_memory_allocated() / 2 ** 30 if cuda else None
    label = variant + (" (compiled)" if args.compile else "")
    base = next((r for r in rows if r["variant"] == "fsdp-bf16" and r["compile"] == bool(args.compile)), None)
    row = {"variant": variant, "label": label, "model": args.model, "compile": bool(args.compile), "world": world,
           "params": n, "tokens": args.batch * args.seq, "converted": conv, "linears_convertible": n_linears,
           "step_ms_median": statistics.median(times), "step_ms_min": min(times), "step_ms": times,
           "host_ms": host, "main_thread_ms": main_t, "issue_ms_median": statistics.median(issue),
           "host_ms_per_weight": host / max(n_linears, 1), "first_step_s": first, "peak_gib": peak}
    row["extra_host_ms_per_weight"] = (host - base["host_ms"]) / max(conv, 1) if base and conv else None
    row["ratio_to_bf16"] = row["step_ms_median"] / base["step_ms_median"] if base else None
    if args.compile:
        row["compile_stats"] = {k: (v - cstats0[k] if v is not None else None) for k, v in _compile_stats().items()}
    if rank == 0:
        ex = f"{row['extra_host_ms_per_weight']:.3f}" if row["extra_host_ms_per_weight"] is not None else "-"
        pk = f"{peak:.2f}" if peak is not None else "-"
        print(f"| {label} | {world} | {n / 1e9:.2f} B | {args.batch * args.seq} | {row['step_ms_median']:.1f} | "
              f"{min(times):.1f} | {pk} | {host:.1f} | {main_t:.1f} | {row['issue_ms_median']:.1f} | {conv} | "
              f"{row['host_ms_per_weight']:.3f} | {ex} |", flush=True)
    if args.cprofile:
        import cProfile
        sync()
        pr = cProfile.Profile() if rank == 0 else None
        if pr:
            pr.enable()
        for _ in range(args.cprofile):
            one()
        sync()
        if pr:
            pr.disable()
            text, row["cprofile"] = hostcpu.summary(pr, args.cprofile)
            text = f"## cProfile {label}, {args.model}, {args.cprofile} steps (ms per step)\n\n{text}\n"
            print(text, file=sys.stderr, flush=True)
            if args.cprofile_out:
                tag = variant + ("-compiled" if args.compile else "")
                with open(f"{args.cprofile_out}-{tag}.md", "w") as f:
                    f.write(text)
                pr.dump_stats(f"{args.cprofile_out}-{tag}.prof")
    if args.profile and rank == 0:
        from torch.profiler import ProfilerActivity, profile
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=acts) as prof:
            for _ in range(2):
                one()
            sync()
        ka = prof.key_averages()
        if cuda:
            print(f"profile {variant} (2 steps): by device time", file=sys.stderr)
            print(ka.table(sort_by="self_cuda_time_total", row_limit=12, max_name_column_width=60), file=sys.stderr)
        print(f"profile {variant} (2 steps): by host time", file=sys.stderr)
        print(ka.table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=60), file=sys.stderr)
    rows.append(row)
    del m, opt, one
    gc.collect()


def run_step(args):
    local = int(os.environ.get("LOCAL_RANK", 0))
    kind = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29561")
    if kind == "cuda":
        note = "blocking sync: off (--spin)" if args.spin else hostcpu.blocking_sync(local)
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=dev)
        name = torch.cuda.get_device_name(dev)
    else:
        note, dev, name = "cpu", torch.device("cpu"), "cpu"
        torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
        dist.init_process_group("gloo")
    if args.compile:
        import torch._dynamo.config as cfg
        for k in ("recompile_limit", "cache_size_limit"):  # blocks share the code of forward
            if hasattr(cfg, k):
                setattr(cfg, k, max(getattr(cfg, k), 8 * args.blocks))
    g = torch.Generator().manual_seed(1234)
    tok = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g).to(dev)
    n_linears = len(models.convertible(args.model, models.make_meta(args)))
    if dist.get_rank() == 0:
        print(f"fsdp_bench step: {models.describe(args)}, {args.batch}x{args.seq} tokens, convertible linears "
              f"{n_linears}, compile {args.compile_backend if args.compile else 'off'}, clip {args.clip}, "
              f"{kind} ({name}), {note}", file=sys.stderr, flush=True)
    rows = []
    for variant in args.variants:
        if variant == "sharded-row":
            continue
        _step_variant(variant, args, dev, tok, n_linears, rows)
    if args.json and dist.get_rank() == 0:
        meta = {"argv": sys.argv, "model": models.describe(args), "device": name, "torch": torch.__version__,
                "python": sys.version.split()[0], "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                "sync": note, "compile_backend": args.compile_backend if args.compile else None, "clip": args.clip,
                "steps": args.steps, "warmup": args.warmup, "batch": args.batch, "seq": args.seq}
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=["memory", "step"])
    ap.add_argument("--model", choices=["mlp", "llama"], default="mlp")
    ap.add_argument("--worlds", default="1,2,4,8")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--vocab", type=int, default=None, help="default 512 (mlp), 32000 (llama)")
    ap.add_argument("--hidden", type=int, default=None, help="default 256 (mlp), 2048 (llama)")
    ap.add_argument("--ffn", type=int, default=None, help="default 1024 (mlp), 5632 (llama)")
    ap.add_argument("--blocks", type=int, default=None, help="default 4 (mlp), 16 (llama)")
    ap.add_argument("--heads", type=int, default=16, help="llama")
    ap.add_argument("--fuse-gate-up", action="store_true", help="llama: one gate_up linear instead of gate, up")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--clip", type=float, default=None, help="step: clip_grad_norm_ max norm, 0 off "
                    "(default 1.0 for llama, off for mlp)")
    ap.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                    help="step: cuda (NCCL) when there is a GPU, else cpu (gloo)")
    ap.add_argument("--compile", action="store_true", help="step: torch.compile each block (in place, "
                    "before fully_shard)")
    ap.add_argument("--compile-backend", default="inductor")
    ap.add_argument("--spin", action="store_true", help="step: leave CUDA's default (spinning) synchronisation")
    ap.add_argument("--json", default=None)
    ap.add_argument("--profile", action="store_true", help="step: torch.profiler tables of 2 steps per variant")
    ap.add_argument("--cprofile", type=int, default=0, metavar="N",
                    help="step: cProfile N more steps of each variant on rank 0 (tables on stderr, in --json)")
    ap.add_argument("--cprofile-out", default=None, metavar="PREFIX", help="step: PREFIX-<variant>.md and .prof")
    args = ap.parse_args()
    llama = args.model == "llama"
    for k, dm, dl in (("vocab", 512, 32000), ("hidden", 256, 2048), ("ffn", 1024, 5632), ("blocks", 4, 16)):
        if getattr(args, k) is None:
            setattr(args, k, dl if llama else dm)
    if args.clip is None:
        args.clip = 1.0 if llama else 0.0
    args.worlds = [int(w) for w in args.worlds.split(",")]
    args.variants = [v for v in args.variants.split(",") if v]
    t0 = time.time()
    if args.mode == "memory":
        run_memory(args)
    else:
        if int(os.environ.get("RANK", 0)) == 0:
            print("| variant | world | params | tokens | step ms (median) | step ms (min) | peak GiB | host CPU ms/step "
                  "| main thread ms/step | issue ms/step | converted | host ms per weight | extra host ms per "
                  "converted weight vs BF16 |")
            print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        run_step(args)
    print(f"fsdp_bench: {time.time() - t0:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()

# SPDX-License-Identifier: MIT
"""Train a small GPT with sharded FP32 masters and MXFP8 primaries (or BF16
weights, the baseline), checkpoint, resume under another DP size.

    python examples/train/train.py --config small --variant mxfp8 --steps 300 \
        --dp 1 --out-json /tmp/mx.json [--save-at 150 --ckpt-dir /tmp/ck] \
        [--resume /tmp/ck/step150.safetensors] [--save-final /tmp/final.safetensors]

--dp N > 1 spawns N processes (or runs under torchrun when RANK/WORLD_SIZE are
set). Backend: nccl when every rank has its own GPU, else gloo (ranks may
share one GPU, or run on the CPU). See examples/train/README.md.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import socket
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
_PY = os.path.join(os.path.dirname(os.path.dirname(HERE)), "python")
if os.path.isdir(os.path.join(_PY, "mxshard")) and _PY not in sys.path:
    sys.path.insert(1, _PY)

CONFIGS = {
    # name: model, global batch (sequences), attention impl, master-init device
    "tiny": dict(vocab=64, seq=32, d=64, layers=2, heads=2, batch=8, attn="math", init="cpu"),
    "small": dict(vocab=256, seq=256, d=512, layers=4, heads=8, batch=32, attn="math", init="cpu"),
    "1b": dict(vocab=512, seq=1024, d=2048, layers=20, heads=16, batch=8, attn="sdpa", init="device"),
}
DEFAULT_BIDIR = "h0.qkv,h0.fc2"   # a few bidirectional weights; the rest row-only


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="small", choices=sorted(CONFIGS))
    for k in ("vocab", "seq", "d", "layers", "heads", "batch"):
        p.add_argument(f"--{k}", type=int, default=None)
    p.add_argument("--attn", choices=("math", "sdpa"), default=None)
    p.add_argument("--variant", default="mxfp8", choices=("mxfp8", "bf16"))
    p.add_argument("--bidir", default=DEFAULT_BIDIR,
                   help="comma list of bidirectional linears ('*' = all, '' = none)")
    p.add_argument("--dp", type=int, default=1)
    p.add_argument("--backend", default="auto", choices=("auto", "nccl", "gloo"))
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--min-lr-frac", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--wd", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--data-seed", type=int, default=4321)
    p.add_argument("--markov-alpha", type=float, default=0.03)
    p.add_argument("--scale-layout", default="padded", choices=("compact", "padded"))
    p.add_argument("--rounding", default="ceil", choices=("ceil", "floor"))
    p.add_argument("--round-through", default="none", choices=("none", "bf16"))
    p.add_argument("--wb-mode", default="fused", choices=("fused", "strict"))
    p.add_argument("--save-at", type=int, action="append", default=[],
                   help="save a checkpoint after this many optimizer steps (repeatable)")
    p.add_argument("--ckpt-dir", default="/tmp/mxshard-train-ckpt")
    p.add_argument("--save-final", default=None, help="checkpoint path written after the last step")
    p.add_argument("--resume", default=None, help="checkpoint to resume from (any DP size)")
    p.add_argument("--reload-only", action="store_true",
                   help="with --resume: reload, write back, compare primaries, exit (no training)")
    p.add_argument("--out-json", default=None)
    p.add_argument("--deterministic", type=int, default=None,
                   help="1: deterministic kernels (default for tiny/small), 0: off")
    p.add_argument("--no-phase-sync", action="store_true",
                   help="do not synchronize between phases (the breakdown is then meaningless)")
    p.add_argument("--log-every", type=int, default=25)
    p.add_argument("--verify", type=int, default=1,
                   help="1: at the end (and after a reload) compare every primary with a whole-tensor "
                        "quantize of the gathered master")
    p.add_argument("--warm-steps", type=int, default=3, help="steps left out of the timing medians")
    a = p.parse_args(argv)
    cfg = dict(CONFIGS[a.config])
    for k in ("vocab", "seq", "d", "layers", "heads", "batch", "attn"):
        if getattr(a, k) is not None:
            cfg[k] = getattr(a, k)
    a.cfg = cfg
    if a.deterministic is None:
        a.deterministic = 1 if a.config in ("tiny", "small") else 0
    return a


def lr_at(a, step):
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    prog = (step - a.warmup) / max(1, a.steps - a.warmup)
    prog = min(max(prog, 0.0), 1.0)
    return a.lr * (a.min_lr_frac + (1 - a.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * prog)))


# ---- process setup ------------------------------------------------------------

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None):
    a = parse(argv)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:     # torchrun
        a.dp = int(os.environ["WORLD_SIZE"])
        return worker(int(os.environ["RANK"]), a, None)
    if a.dp == 1:
        return worker(0, a, None)
    import torch.multiprocessing as mp
    port = _free_port()
    mp.spawn(worker, args=(a, port), nprocs=a.dp, join=True)
    return 0


def worker(rank, a, port):
    if a.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch
    import torch.distributed as dist
    world = a.dp
    if a.device == "auto":
        use_cuda = torch.cuda.is_available()
    else:
        use_cuda = a.device == "cuda"
    ndev = torch.cuda.device_count() if use_cuda else 0
    if use_cuda:
        device = torch.device("cuda", rank % ndev)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    backend = None
    if world > 1:
        backend = a.backend
        if backend == "auto":
            backend = "nccl" if use_cuda and ndev >= world else "gloo"
        init = "env://" if port is None else f"tcp://127.0.0.1:{port}"
        if backend == "gloo" and port is not None:
            # all ranks on this host: gloo over loopback (no dependence on hostname resolution)
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        kw = dict(backend=backend, init_method=init, rank=rank, world_size=world)
        if backend == "nccl":
            kw["device_id"] = device
        if os.environ.get("MXS_TRAIN_PG_TIMEOUT_S"):
            # a hung collective then fails with torch's watchdog report (op, sequence number, sizes)
            from datetime import timedelta
            kw["timeout"] = timedelta(seconds=float(os.environ["MXS_TRAIN_PG_TIMEOUT_S"]))
        dist.init_process_group(**kw)
    if a.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
        if use_cuda:
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    counter = install_collective_counter(dist) if world > 1 else None
    try:
        res = run(rank, world, backend, device, a, counter)
    except BaseException:
        if world == 1:
            raise
        # Say it now. mp.spawn prints a rank's traceback only after that process has EXITED, and
        # its peers stay blocked in their next collective; over NCCL the exit of a rank that leaves
        # the group this way can take minutes (the teardown of a clean DP=2 NCCL run took ~130 s on
        # 2 H200s), so the run looked like a silent stall. Over NCCL skip that teardown: exit now
        # (mp.spawn / torchrun then end the other ranks). gloo: unchanged (re-raise).
        import traceback
        sys.stdout.flush()
        sys.stderr.write(f"[rank {rank}] failed:\n{traceback.format_exc()}")
        sys.stderr.flush()
        if backend == "nccl":
            os._exit(1)
        raise
    t_end = time.perf_counter()
    if world > 1:
        dist.barrier()
        t_bar = time.perf_counter()
        dist.destroy_process_group()
        sys.stderr.write(f"[rank {rank}] teardown: barrier {t_bar - t_end:.2f} s, destroy_process_group "
                         f"{time.perf_counter() - t_bar:.2f} s\n")   # one write: lines of ranks don't mix
        sys.stderr.flush()
    if rank == 0 and a.out_json:
        with open(a.out_json, "w") as f:
            json.dump(res, f, indent=1)
    if backend == "nccl":
        # everything is written: skip the interpreter / CUDA / NCCL teardown (see above)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


def install_collective_counter(dist):
    """Counts every torch.distributed collective this process issues, with its
    dtype and op (the package's calls included: it looks dist.* up at call time)."""
    from collections import Counter
    counts = Counter()
    for name in ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast"):
        orig = getattr(dist, name)

        def wrap(*args, _orig=orig, _name=name, **kw):
            t = args[0] if args else None
            if isinstance(t, list):
                t = args[1] if len(args) > 1 else None
            op = kw.get("op", args[1] if _name == "all_reduce" and len(args) > 1 else None)
            dt = str(getattr(t, "dtype", "?")).replace("torch.", "")
            key = f"{_name}:{dt}" + (f":{op}".replace("RedOpType.", "") if op is not None else "")
            counts[key] += 1
            return _orig(*args, **kw)
        setattr(dist, name, wrap)
    return counts


# ---- the run --------------------------------------------------------------------

def run(rank, world, backend, device, a, counter):
    import torch
    import ckpt
    from data import MarkovSource
    from model import GPTConfig, forward_loss, param_specs
    from shard import Comm, Layout, init_full_master
    from store import PHASES, Store, Timer

    cfg = a.cfg
    gcfg = GPTConfig(vocab=cfg["vocab"], seq=cfg["seq"], d=cfg["d"], layers=cfg["layers"],
                     heads=cfg["heads"], attn=cfg["attn"])
    G = cfg["batch"]
    if G % world:
        raise SystemExit(f"global batch {G} is not divisible by dp {world}")
    bidir = set(x for x in a.bidir.split(",") if x)
    specs = param_specs(gcfg, a.variant, bidir)
    layout = Layout(specs, world)
    comm = Comm(rank, world, backend, device)
    src = MarkovSource(gcfg.vocab, a.data_seed, a.markov_alpha)
    is_cuda = device.type == "cuda"

    def log(*x):
        if rank == 0:
            print(f"[{a.variant} dp={world}]", *x, flush=True)

    log(f"config {a.config} {cfg}; params {layout.total:,} (mxfp8 linears {layout.n_mx:,}, "
        f"bidirectional {layout.n_both:,}, dense {layout.n_dense:,}); shard {layout.shard:,} per rank; "
        f"backend {backend}; device {device}")
    log(f"Markov source: vocab {gcfg.vocab}, entropy rate {src.entropy_rate:.4f} nats/token (the loss floor)")

    t_setup = time.perf_counter()
    store = Store(layout, comm, device, a.variant, scale_layout=a.scale_layout, rounding=a.rounding,
                  round_through=None if a.round_through == "none" else a.round_through, wb_mode=a.wb_mode,
                  weight_decay=a.wd)
    timer = Timer(device, enabled=not a.no_phase_sync)
    res = {"config": a.config, "cfg": cfg, "variant": a.variant, "dp": world, "backend": backend,
           "device": str(device), "device_name": torch.cuda.get_device_name(device) if is_cuda else "cpu",
           "torch": torch.__version__, "params": layout.total, "n_mx": layout.n_mx, "n_both": layout.n_both,
           "n_dense": layout.n_dense, "entropy_floor": src.entropy_rate, "bidir": sorted(bidir),
           "steps": a.steps, "lr": a.lr, "seed": a.seed, "deterministic": bool(a.deterministic),
           "scale_layout": a.scale_layout, "rounding": a.rounding, "round_through": a.round_through,
           "wb_mode": a.wb_mode, "gemm": "dequantize to bf16 + torch.matmul (no FP8 GEMM)",
           "grad_sync": ("reduce_scatter_tensor" if comm.direct and world > 1 else
                         "all_reduce + slice (gloo has no reduce-scatter)" if world > 1 else "none (dp=1)")}

    start_step = 0
    if a.resume:
        tens, meta = ckpt.load(a.resume)
        start_step = load_state(store, layout, tens, meta, a)
        res["resumed_from"] = {"path": a.resume, "step": start_step, "saved_dp": int(meta["dp"])}
    else:
        full = init_full_master(layout, a.seed, device if cfg["init"] == "device" else "cpu")
        store.master.copy_(full[store.lo:store.hi].to(device))
        del full
    timer.start()
    store.writeback(timer)          # the primaries of the starting masters
    timer.t.clear()
    store.assert_pointers()
    res["dequant_check"] = store.dequant_check()
    if res["dequant_check"] is not None:
        log("dequantize (mxshard) vs a torch decode of the same bytes:", res["dequant_check"])
    if a.resume:
        res["reload_check"] = compare_primaries(store, tens, comm)
        log("reload: primaries written back from the reloaded masters vs the saved primaries:",
            res["reload_check"])
        if store.variant == "mxfp8" and a.verify:
            res["reload_whole_tensor_check"] = verify_primaries(store, layout, comm, a)
        del tens
        if a.reload_only:
            return res
    res["setup_s"] = time.perf_counter() - t_setup
    res["buffer_bytes"] = store.buffer_bytes()
    if is_cuda:
        torch.cuda.synchronize(device)
        res["mem_after_setup"] = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)

    # data: the whole global batch of a step is a function of (seed, step)
    per = G // world
    T = gcfg.seq
    denom = G * T
    losses = []
    steps_t = []
    from collections import Counter
    step_torch, step_comm = Counter(), Counter()   # collectives issued inside training steps only
    save_at = set(a.save_at)
    batches = {}

    def get_batch(s):
        if s not in batches:
            batches.clear()
            batches[s] = src.batch(s, G, T)[rank * per:(rank + 1) * per].to(device, non_blocking=True)
        return batches[s]

    for step in range(start_step, a.steps):
        x = get_batch(step)
        lr = lr_at(a, step)
        timer.t = {}
        c0 = dict(counter) if counter is not None else {}
        k0 = dict(comm.counts)
        timer.start()
        t0 = time.perf_counter()
        store.begin_step()
        loss = forward_loss(gcfg, store, x, denom)
        loss.backward()
        store.collect_dense_grads()
        timer.stop("fwd_bwd")
        store.grad_sync()
        timer.stop("grad_sync")
        store.optim(lr)
        timer.stop("optim")
        store.writeback(timer)
        timer.sync()
        steps_t.append(dict(timer.t, step=(time.perf_counter() - t0) * 1e3))
        store.assert_pointers()
        lt = loss.detach().float().reshape(1)
        comm.all_reduce_sum(lt)
        lv = float(lt.item())
        losses.append([step, lv, lv.hex()])
        if counter is not None:
            step_torch.update({k: v - c0.get(k, 0) for k, v in counter.items()})
        step_comm.update({k: v - k0.get(k, 0) for k, v in comm.counts.items()})
        if rank == 0 and (step % a.log_every == 0 or step == a.steps - 1):
            st = steps_t[-1]
            log(f"step {step:5d} loss {lv:.4f} lr {lr:.2e} | " +
                " ".join(f"{k} {st.get(k, 0):.2f}" for k in PHASES) + f" | step {st['step']:.1f} ms")
        if step + 1 in save_at:
            path = os.path.join(a.ckpt_dir, f"{a.variant}-dp{world}-step{step + 1}.safetensors")
            save_state(store, layout, comm, a, step + 1, path, rank)
            res.setdefault("saved", []).append({"step": step + 1, "path": path})
            log(f"saved checkpoint at step {step + 1}: {path}")
    if store.variant == "mxfp8" and a.verify:
        res["whole_tensor_check"] = verify_primaries(store, layout, comm, a)
        log("primaries vs a whole-tensor quantize of the gathered master:", res["whole_tensor_check"])
    if a.save_final:
        save_state(store, layout, comm, a, a.steps, a.save_final, rank)
        res["final_path"] = a.save_final
    res["losses"] = losses
    res["final_loss"] = losses[-1][1] if losses else None
    # tail mean of the last 10% of steps (smoother than one step)
    tail = [l[1] for l in losses[-max(1, len(losses) // 10):]]
    res["final_loss_tail_mean"] = sum(tail) / len(tail) if tail else None
    use = steps_t[a.warm_steps:] if len(steps_t) > a.warm_steps else steps_t
    res["timing_ms_median"] = {k: statistics.median([s.get(k, 0.0) for s in use]) for k in PHASES + ("step",)} \
        if use else {}
    res["timing_ms_mean"] = {k: statistics.fmean([s.get(k, 0.0) for s in use]) for k in PHASES + ("step",)} \
        if use else {}
    n = max(1, len(steps_t))
    res["collectives_per_step_comm"] = {k: v / n for k, v in step_comm.items() if v}
    if counter is not None:
        res["collectives_per_step_torch"] = {k: v / n for k, v in step_torch.items() if v}
    if is_cuda:
        res["peak_mem_train"] = torch.cuda.max_memory_allocated(device)
        res["peak_reserved_train"] = torch.cuda.max_memory_reserved(device)
    res["pointers_unchanged"] = True
    res["writeback_bucket"] = ({"packed_bytes": int(store.bucket.packed_bytes), "items": store.bucket.n_items}
                               if store.bucket is not None else None)
    log(f"final loss {res['final_loss']}; floor {src.entropy_rate:.4f}; median ms/step "
        f"{res['timing_ms_median'].get('step', 0):.2f}")
    return res


# ---- checkpoints ------------------------------------------------------------------

def save_state(store, layout, comm, a, step, path, rank):
    """Collective: the full FP32 master and Adam state (gathered), the MXFP8
    primaries (every rank holds them whole after the gather), metadata."""
    import torch
    import ckpt
    full = {k: comm.all_gather_flat(v)[:layout.total] for k, v in
            (("master", store.master), ("adam.m", store.opt.m), ("adam.v", store.opt.v))}
    if rank == 0:
        tens = dict(full)
        tens.update(store.weight_tensors())
        meta = {"format": "mxshard-train-v1", "step": str(step), "dp": str(layout.dp),
                "adam_t": str(store.opt.t), "variant": a.variant, "config": json.dumps(a.cfg),
                "table": json.dumps(layout.table()), "total": str(layout.total),
                "scale_layout": a.scale_layout, "rounding": a.rounding, "round_through": a.round_through,
                "wb_mode": a.wb_mode, "bidir": a.bidir, "steps": str(a.steps), "lr": repr(a.lr),
                "seed": str(a.seed), "data_seed": str(a.data_seed),
                "adam": json.dumps({"b1": store.opt.b1, "b2": store.opt.b2, "eps": store.opt.eps,
                                    "wd": store.opt.wd})}
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = path + ".tmp"
        ckpt.save(tens, meta, tmp)
        os.replace(tmp, path)
    comm.barrier()
    del full
    torch.cuda.empty_cache() if torch.cuda.is_available() else None


def load_state(store, layout, tens, meta, a):
    """Masters and Adam state of this rank's range from a checkpoint of any DP
    size; the parameter table must match by name, shape, kind and offset."""
    if meta.get("format") != "mxshard-train-v1":
        raise SystemExit(f"not a mxshard-train checkpoint: {meta.get('format')}")
    saved = {t["name"]: t for t in json.loads(meta["table"])}
    for s in layout.specs:
        t = saved.get(s.name)
        if t is None or tuple(t["shape"]) != tuple(s.shape) or t["kind"] != s.kind or t["offset"] != s.offset:
            raise SystemExit(f"checkpoint parameter table differs at {s.name}: {t} vs {s}")
    if int(meta["total"]) != layout.total:
        raise SystemExit("checkpoint total size differs")
    for k in ("scale_layout", "rounding", "round_through"):
        if meta[k] != getattr(a, k.replace("-", "_")):
            raise SystemExit(f"checkpoint {k}={meta[k]} but this run has {getattr(a, k)}")
    for key, dst in (("master", store.master), ("adam.m", store.opt.m), ("adam.v", store.opt.v)):
        full = tens[key]
        lo, hi = store.lo, min(store.hi, layout.total)
        dst.zero_()
        if hi > lo:
            dst[:hi - lo].copy_(full[lo:hi].to(dst.device))
    store.opt.t = int(meta["adam_t"])
    return int(meta["step"])


def verify_primaries(store, layout, comm, a):
    """The library invariant inside the loop: every primary (data and scales of
    each present plane) equals mxshard.quantize of the whole gathered master
    (bf16-rounded first when round-through is on)."""
    import torch
    import mxshard
    full = comm.all_gather_flat(store.master)
    bad = checked = 0
    err2 = ref2 = 0.0
    for s in layout.specs:
        w = store.primaries.get(s.name)
        if w is None:
            continue
        src = full[s.offset:s.offset + s.numel].view(s.shape)
        if a.round_through == "bf16":
            src = src.to(torch.bfloat16)
        ref = mxshard.MXFP8Weight.empty(*s.shape, planes=w.planes, layout=a.scale_layout, device=src.device)
        mxshard.quantize(ref, src.contiguous(), rounding=a.rounding)
        for pn in ("row_data", "row_scale", "col_data", "col_scale"):
            x, y = getattr(w, pn), getattr(ref, pn)
            if x is None:
                continue
            checked += 1
            bad += int((x.reshape(-1) != y.reshape(-1)).sum())
        m = full[s.offset:s.offset + s.numel].view(s.shape)
        q = w.dequantize(plane="row", dtype="f32")
        err2 += float(((q - m) ** 2).sum())
        ref2 += float((m ** 2).sum())
    return {"planes": checked, "mismatched_bytes": bad, "identical": bad == 0 and checked > 0,
            "weight_rel_rms_err": (err2 / ref2) ** 0.5 if ref2 > 0 else None}


def compare_primaries(store, tens, comm):
    """Byte comparison of every MXFP8 plane (data and scales) and every bf16
    weight: written back from the reloaded masters vs saved in the file."""
    import torch
    now = store.weight_tensors()
    planes = mism = nbytes = 0
    missing = []
    for k, v in now.items():
        if k not in tens:
            missing.append(k)
            continue
        a = v.detach().contiguous().view(torch.uint8).reshape(-1).cpu()
        b = tens[k].contiguous().view(torch.uint8).reshape(-1)
        planes += 1
        nbytes += a.numel()
        mism += int((a != b).sum()) if a.numel() == b.numel() else max(a.numel(), b.numel())
    return {"planes": planes, "bytes": nbytes, "mismatched_bytes": mism, "missing": missing,
            "identical": mism == 0 and not missing and planes > 0}


if __name__ == "__main__":
    sys.exit(main())

# SPDX-License-Identifier: MIT
"""Train a small GPT with mxshard.torch: the block linears as MXFP8 primaries
(mxshard.torch.convert), FP32 masters sharded by mxshard.torch.ShardedOptimizer
around torch.optim.AdamW, checkpoints through mxshard.torch.save_checkpoint /
load_checkpoint (torch.distributed.checkpoint; resume under any DP size), or
the BF16 baseline (same model and optimizer, no convert).

    python examples/train/train.py --config small --variant mxfp8 --steps 300 \
        --dp 1 --out-json /tmp/mx.json [--save-at 150 --ckpt-dir /tmp/ck] \
        [--resume /tmp/ck/mxfp8-dp1-step150] [--save-final /tmp/final] [--export /tmp/m.safetensors]

--dp N > 1 spawns N processes with torch.multiprocessing (or run it under
`torchrun --nproc_per_node=N`: RANK/WORLD_SIZE set). Backend: nccl when every
rank has its own GPU, else gloo (ranks may share one GPU, or run on the CPU).
--trace-collectives DIR writes, per rank, every torch.distributed call with a
sequence number, the CUDA stream and a timestamp (DIR/collectives-rank<r>.log,
flushed line by line, so a stall shows where each rank stopped).
MXS_TRAIN_PG_TIMEOUT_S=S: the process group's timeout (a hang ends with
torch's watchdog report). See examples/train/README.md.
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
    # name: model, global batch (sequences), attention impl, where the initial weights are drawn
    "tiny": dict(vocab=64, seq=32, d=64, layers=2, heads=2, batch=8, attn="math", init="cpu"),
    "small": dict(vocab=256, seq=256, d=512, layers=4, heads=8, batch=32, attn="math", init="cpu"),
    "1b": dict(vocab=512, seq=1024, d=2048, layers=20, heads=16, batch=8, attn="sdpa", init="device"),
}
DEFAULT_BIDIR = "h.0.qkv,h.0.fc2"   # a few bidirectional weights; the rest row-only
PHASES = ("fwd_bwd", "grad_sync", "optim", "writeback")


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="small", choices=sorted(CONFIGS))
    for k in ("vocab", "seq", "d", "layers", "heads", "batch"):
        p.add_argument(f"--{k}", type=int, default=None)
    p.add_argument("--attn", choices=("math", "sdpa"), default=None)
    p.add_argument("--variant", default="mxfp8", choices=("mxfp8", "bf16"))
    p.add_argument("--bidir", default=DEFAULT_BIDIR,
                   help="comma list of fnmatch patterns of bidirectional linears ('*' = all, '' = none)")
    p.add_argument("--dp", type=int, default=1)
    p.add_argument("--backend", default="auto", choices=("auto", "nccl", "gloo"))
    p.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--min-lr-frac", type=float, default=0.1)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--wd", type=float, default=0.1)
    p.add_argument("--max-grad-norm", type=float, default=None, help="clip the global gradient norm (default off)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--data-seed", type=int, default=4321)
    p.add_argument("--markov-alpha", type=float, default=0.03)
    p.add_argument("--scale-layout", default="padded", choices=("compact", "padded", "swizzled"))
    p.add_argument("--rounding", default="ceil", choices=("ceil", "floor"))
    p.add_argument("--round-through", default="none", choices=("none", "bf16"))
    p.add_argument("--bucket-size", type=int, default=40_000_000, help="ShardedOptimizer bucket size (elements)")
    p.add_argument("--no-overlap", action="store_true", help="reduce gradients in step(), not from the hooks")
    p.add_argument("--grad-dtype", default="float32", choices=("float32", "bfloat16"),
                   help="ShardedOptimizer grad_dtype: the gradient buffers' dtype (bfloat16: 2 bytes per parameter)")
    p.add_argument("--save-at", type=int, action="append", default=[],
                   help="save a checkpoint after this many optimizer steps (repeatable)")
    p.add_argument("--ckpt-dir", default="/tmp/mxshard-train-ckpt")
    p.add_argument("--save-final", default=None, help="checkpoint directory written after the last step")
    p.add_argument("--export", default=None, help="safetensors file of the final model (export_safetensors)")
    p.add_argument("--resume", default=None, help="checkpoint directory to resume from (any DP size)")
    p.add_argument("--reload-only", action="store_true", help="with --resume: load (and its checks), exit")
    p.add_argument("--out-json", default=None)
    p.add_argument("--deterministic", type=int, default=None,
                   help="1: deterministic kernels (default for tiny/small), 0: off")
    p.add_argument("--no-phase-sync", action="store_true",
                   help="do not synchronize between phases (the breakdown is then meaningless)")
    p.add_argument("--log-every", type=int, default=25)
    p.add_argument("--verify", type=int, default=1,
                   help="1: at the end (and after a reload) compare every primary with a whole-tensor "
                        "quantize of the gathered master, every dense parameter with the cast master")
    p.add_argument("--warm-steps", type=int, default=3, help="steps left out of the timing medians")
    p.add_argument("--trace-collectives", default=None, metavar="DIR",
                   help="per-rank log of every collective (sequence number, CUDA stream, timestamp)")
    p.add_argument("--trace-sync", action="store_true",
                   help="with --trace-collectives: synchronize the device after every collective and log it")
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


# ---- processes --------------------------------------------------------------------

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None):
    a = parse(argv)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:     # torchrun
        a.dp = int(os.environ["WORLD_SIZE"])
        a.launcher = "torchrun"
        return worker(int(os.environ["RANK"]), a, None)
    if a.dp == 1:
        a.launcher = "single"
        return worker(0, a, None)
    import torch.multiprocessing as mp
    a.launcher = "mp.spawn"
    mp.spawn(worker, args=(a, _free_port()), nprocs=a.dp, join=True)
    return 0


def worker(rank, a, port):
    if a.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch
    import torch.distributed as dist
    world = a.dp
    use_cuda = torch.cuda.is_available() if a.device == "auto" else a.device == "cuda"
    ndev = torch.cuda.device_count() if use_cuda else 0
    if use_cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)) % ndev)
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
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")   # all ranks on this host: loopback
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
    trace = Trace(a.trace_collectives, rank, a.trace_sync, device) if a.trace_collectives else None
    counter = install_collective_hooks(dist, trace) if world > 1 or trace else None
    try:
        res = run(rank, world, backend, device, a, counter, trace)
    except BaseException:
        if world == 1:
            raise
        # Say it now: mp.spawn prints a rank's traceback only once that process has EXITED, and
        # its peers stay blocked in their next collective; over NCCL such an exit can take
        # minutes, which looks like a silent stall. Over NCCL skip that teardown (exit now).
        import traceback
        sys.stdout.flush()
        sys.stderr.write(f"[rank {rank}] failed:\n{traceback.format_exc()}")
        sys.stderr.flush()
        if trace:
            trace.mark("FAILED")
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
    if trace:
        trace.mark("exit")
    if rank == 0 and a.out_json:
        os.makedirs(os.path.dirname(os.path.abspath(a.out_json)), exist_ok=True)
        with open(a.out_json, "w") as f:
            json.dump(res, f, indent=1)
    if backend == "nccl":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)     # everything is written: skip the interpreter / CUDA / NCCL teardown
    return 0


# ---- collective counter and trace -------------------------------------------------

_TRACED = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast", "barrier",
           "all_gather_object", "gather_object", "broadcast_object_list", "scatter_object_list", "gather",
           "scatter", "reduce_scatter", "all_to_all_single")
_COUNTED = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast")


class Trace:
    """One rank's collective log: `seq t rank step what details`, one line per
    event, flushed at once (a stalled rank's last line is on disk)."""

    def __init__(self, folder, rank, sync, device):
        os.makedirs(folder, exist_ok=True)
        self.path = os.path.join(folder, f"collectives-rank{rank}.log")
        self.f = open(self.path, "w", buffering=1)
        self.rank, self.sync, self.device = rank, sync, device
        self.seq = 0
        self.step = "setup"
        self.t0 = time.time()
        self.f.write(f"# rank {rank} pid {os.getpid()} device {device} epoch {self.t0:.6f}\n")

    def _line(self, seq, what):
        self.f.write(f"{seq:6d} {time.time() - self.t0:11.6f} r{self.rank} step={self.step} {what}\n")

    def mark(self, what):
        self._line(-1, f"MARK {what}")

    def stream(self):
        import torch
        if self.device.type != "cuda":
            return "cpu"
        s = torch.cuda.current_stream(self.device)
        return f"{s.stream_id}/0x{s.cuda_stream:x}"

    def issue(self, name, detail):
        self.seq += 1
        self._line(self.seq, f"{name} {detail} stream={self.stream()}")
        return self.seq

    def done(self, seq, name, async_op, work):
        self._line(seq, f"{name} returned{' (async: work)' if async_op else ''}")
        if self.sync and self.device.type == "cuda":
            import torch
            torch.cuda.synchronize(self.device)
            self._line(seq, f"{name} device-synced")
        if async_op and work is not None:
            return _TracedWork(work, self, seq, name)
        return work


class _TracedWork:
    """A Work handle that logs its wait()."""

    def __init__(self, work, trace, seq, name):
        self._w, self._t, self._seq, self._name = work, trace, seq, name

    def wait(self, *args, **kw):
        r = self._w.wait(*args, **kw)
        self._t._line(self._seq, f"{self._name} wait-done")
        return r

    def __getattr__(self, k):
        return getattr(self._w, k)


def _describe(name, args, kw):
    t = args[0] if args else kw.get("tensor", kw.get("output_tensor"))
    if isinstance(t, list):
        t = t[0] if t and hasattr(t[0], "dtype") else (args[1] if len(args) > 1 else None)
    dt = str(getattr(t, "dtype", "-")).replace("torch.", "")
    n = t.numel() if hasattr(t, "numel") else "-"
    dev = getattr(t, "device", "-")
    op = kw.get("op", args[1] if name == "all_reduce" and len(args) > 1 else None)
    op = str(op).replace("RedOpType.", "") if op is not None else ("SUM" if name == "all_reduce" else None)
    return dt, op, f"dtype={dt} numel={n} device={dev}" + (f" op={op}" if op else "")


def install_collective_hooks(dist, trace):
    """Wraps torch.distributed's collectives (the library looks them up at call
    time, so its calls are seen too): a Counter by 'name:dtype[:op]', and the
    trace when one is given."""
    from collections import Counter
    counts = Counter()
    for name in _TRACED:
        orig = getattr(dist, name, None)
        if orig is None:
            continue

        def wrap(*args, _orig=orig, _name=name, **kw):
            dt, op, detail = _describe(_name, args, kw)
            if _name in _COUNTED:
                counts[f"{_name}:{dt}" + (f":{op}" if op else "")] += 1
            if trace is None:
                return _orig(*args, **kw)
            seq = trace.issue(_name, detail + (" async" if kw.get("async_op") else ""))
            r = _orig(*args, **kw)
            return trace.done(seq, _name, kw.get("async_op", False), r)
        setattr(dist, name, wrap)
    return counts


# ---- the run --------------------------------------------------------------------

class Timer:
    """Phase times in ms; synchronizes the device at each boundary (enabled)."""

    def __init__(self, device, enabled=True):
        self.device, self.enabled = device, enabled
        self.t = {}

    def _sync(self):
        if self.enabled and self.device.type == "cuda":
            import torch
            torch.cuda.synchronize(self.device)

    def start(self):
        self._sync()
        self.t0 = time.perf_counter()

    def stop(self, phase):
        self._sync()
        t1 = time.perf_counter()
        self.t[phase] = self.t.get(phase, 0.0) + (t1 - self.t0) * 1e3
        self.t0 = t1


def run(rank, world, backend, device, a, counter, trace):
    import torch
    import torch.distributed as dist
    import mxshard.torch as mxt
    import ckpt
    from compare import verify_weights
    from data import MarkovSource
    from model import GPTConfig, build, decay_names, parse_bidir

    cfg = a.cfg
    gcfg = GPTConfig(vocab=cfg["vocab"], seq=cfg["seq"], d=cfg["d"], layers=cfg["layers"], heads=cfg["heads"],
                     attn=cfg["attn"])
    G = cfg["batch"]
    if G % world:
        raise SystemExit(f"global batch {G} is not divisible by dp {world}")
    bidir = parse_bidir(a.bidir)
    src = MarkovSource(gcfg.vocab, a.data_seed, a.markov_alpha)
    is_cuda = device.type == "cuda"

    def log(*x):
        if rank == 0:
            print(f"[{a.variant} dp={world}]", *x, flush=True)

    t_setup = time.perf_counter()
    model = build(gcfg, a.variant, bidir, device, a.seed, init_device=device if cfg["init"] == "device" else "cpu",
                  layout=a.scale_layout, rounding=a.rounding)
    decay = decay_names(gcfg)
    others = [n for n, _ in model.named_parameters() if n not in decay]
    opt = mxt.ShardedOptimizer(
        model, lambda groups: torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=a.wd),
        param_groups=[{"params": decay, "weight_decay": a.wd}, {"params": others, "weight_decay": 0.0}],
        bucket_size=a.bucket_size, grad_reduce="sum", max_grad_norm=a.max_grad_norm,
        round_through=None if a.round_through == "none" else a.round_through, rounding=a.rounding,
        overlap=not a.no_overlap, grad_dtype=getattr(torch, a.grad_dtype))
    kinds = {}
    for it in opt.items:
        kinds[it.kind] = kinds.get(it.kind, 0) + math.prod(it.shape)
    n_total = sum(kinds.values())
    n_mx = kinds.get("mxfp8_row", 0) + kinds.get("mxfp8_both", 0)
    log(f"config {a.config} {cfg}; params {n_total:,} (mxfp8 linears {n_mx:,}, bidirectional "
        f"{kinds.get('mxfp8_both', 0):,}); {len(opt.buckets)} bucket(s); backend {backend}; device {device}; "
        f"launcher {a.launcher}")
    log(f"Markov source: vocab {gcfg.vocab}, entropy rate {src.entropy_rate:.4f} nats/token (the loss floor)")
    res = {"config": a.config, "cfg": cfg, "variant": a.variant, "dp": world, "backend": backend,
           "launcher": a.launcher, "device": str(device),
           "device_name": torch.cuda.get_device_name(device) if is_cuda else "cpu", "torch": torch.__version__,
           "params": n_total, "n_mx": n_mx, "n_both": kinds.get("mxfp8_both", 0), "n_dense": kinds.get("dense", 0),
           "entropy_floor": src.entropy_rate, "bidir": sorted(bidir) if a.variant == "mxfp8" else [],
           "steps": a.steps, "lr": a.lr, "seed": a.seed, "deterministic": bool(a.deterministic),
           "scale_layout": a.scale_layout, "rounding": a.rounding, "round_through": a.round_through,
           "buckets": len(opt.buckets), "overlap": not a.no_overlap,
           "gemm": "dequantize to bf16 + torch.matmul (no FP8 GEMM)",
           "grad_sync": "none (dp=1)" if world == 1 else
           ("all_reduce + slice (gloo has no reduce-scatter)" if backend == "gloo" else "reduce_scatter_tensor")}

    start_step = 0
    if a.resume:
        t0 = time.perf_counter()
        if trace:
            trace.mark(f"load_checkpoint {a.resume}")
        start_step, extra = ckpt.load(a.resume, model, opt, a)
        if trace:
            trace.mark("load_checkpoint done")
        res["resumed_from"] = {"path": a.resume, "step": start_step, "saved_dp": extra.get("dp")}
        # load_checkpoint rebuilt the primaries from the masters and compared them byte for byte with the
        # saved ones (it raises on a mismatch): reaching this line is the check
        res["reload_check"] = {"identical": True, "by": "mxshard.torch.load_checkpoint",
                               "load_s": time.perf_counter() - t0}
        log(f"resumed from {a.resume} (step {start_step}, saved at dp={extra.get('dp')}): primaries rebuilt from "
            f"the masters byte-identical to the saved ones")
        if a.verify:
            res["reload_whole_tensor_check"] = verify_weights(model, opt, a.round_through)
        if a.reload_only:
            opt.close()
            return res
    res["setup_s"] = time.perf_counter() - t_setup
    if is_cuda:
        torch.cuda.synchronize(device)
        res["mem_after_setup"] = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)

    timer = Timer(device, enabled=not a.no_phase_sync)
    opt.inner.register_step_pre_hook(lambda *_: timer.stop("grad_sync"))   # reductions + norm done
    opt.inner.register_step_post_hook(lambda *_: timer.stop("optim"))
    per = G // world
    T = gcfg.seq
    denom = G * T
    losses, steps_t = [], []
    from collections import Counter
    step_torch, step_lib = Counter(), Counter()   # collectives issued inside training steps only
    save_at = set(a.save_at)

    for step in range(start_step, a.steps):
        if trace:
            trace.step = step
        x = src.batch(step, G, T)[rank * per:(rank + 1) * per].to(device)
        lr = lr_at(a, step)
        for g in opt.param_groups:
            g["lr"] = lr
        c0 = dict(counter) if counter is not None else {}
        l0 = dict(opt.collectives)
        timer.t = {}
        timer.start()
        t0 = time.perf_counter()
        loss = model(x, denom)
        loss.backward()
        timer.stop("fwd_bwd")
        opt.step()
        timer.stop("writeback")
        opt.zero_grad()
        if is_cuda:
            torch.cuda.synchronize(device)
        steps_t.append(dict(timer.t, step=(time.perf_counter() - t0) * 1e3))
        lt = loss.detach().float().reshape(1)
        if world > 1:
            lt = lt.cpu() if backend == "gloo" else lt
            dist.all_reduce(lt)
        lv = float(lt.item())
        losses.append([step, lv, lv.hex()])
        if counter is not None:
            step_torch.update({k: v - c0.get(k, 0) for k, v in counter.items()})
        step_lib.update({k: v - l0.get(k, 0) for k, v in opt.collectives.items()})
        if step == start_step and is_cuda:
            res["mem_after_first_step"] = torch.cuda.memory_allocated(device)
        if step % a.log_every == 0 or step == a.steps - 1:
            st = steps_t[-1]
            log(f"step {step:5d} loss {lv:.4f} lr {lr:.2e} | " +
                " ".join(f"{k} {st.get(k, 0):.2f}" for k in PHASES) + f" | step {st['step']:.1f} ms")
        if step + 1 in save_at:
            path = os.path.join(a.ckpt_dir, f"{a.variant}-dp{world}-step{step + 1}")
            save(model, opt, a, world, step + 1, path, trace)
            res.setdefault("saved", []).append({"step": step + 1, "path": path})
            log(f"saved checkpoint at step {step + 1}: {path}")
    if trace:
        trace.step = "end"
    if a.verify:
        res["whole_tensor_check"] = verify_weights(model, opt, a.round_through)
        log("primaries vs a whole-tensor quantize of the gathered master:", res["whole_tensor_check"])
    if a.save_final:
        save(model, opt, a, world, a.steps, a.save_final, trace)
        res["final_path"] = a.save_final
    if a.export:
        try:
            ckpt.export(a.export, model)
            res["export"] = a.export
        except ImportError as e:     # the safetensors package is missing: every rank gets here
            res["export_error"] = str(e)
            log(f"export skipped: {e}")
        if world > 1:
            dist.barrier()
    res["losses"] = losses
    res["final_loss"] = losses[-1][1] if losses else None
    tail = [l[1] for l in losses[-max(1, len(losses) // 10):]]      # mean of the last 10% of steps
    res["final_loss_tail_mean"] = sum(tail) / len(tail) if tail else None
    use = steps_t[a.warm_steps:] if len(steps_t) > a.warm_steps else steps_t
    keys = PHASES + ("step",)
    res["timing_ms_median"] = {k: statistics.median([s.get(k, 0.0) for s in use]) for k in keys} if use else {}
    res["timing_ms_mean"] = {k: statistics.fmean([s.get(k, 0.0) for s in use]) for k in keys} if use else {}
    n = max(1, len(steps_t))
    res["collectives_per_step_lib"] = {k: v / n for k, v in step_lib.items() if v}
    if counter is not None:
        res["collectives_per_step_torch"] = {k: v / n for k, v in step_torch.items() if v}
    res["buffer_bytes"] = buffer_bytes(opt)
    if is_cuda:
        res["peak_mem_train"] = torch.cuda.max_memory_allocated(device)
        res["peak_reserved_train"] = torch.cuda.max_memory_reserved(device)
    res["pointers_unchanged"] = True     # ShardedOptimizer.step() checks every step (raises otherwise)
    if trace:
        res["trace"] = trace.path
    log(f"final loss {res['final_loss']}; floor {src.entropy_rate:.4f}; median ms/step "
        f"{res['timing_ms_median'].get('step', 0):.2f}")
    opt.close()
    return res


def save(model, opt, a, world, step, path, trace):
    import ckpt
    if trace:
        trace.mark(f"save_checkpoint {path}")
    ckpt.save(path, model, opt, step, a, world)
    if trace:
        trace.mark("save_checkpoint done")


def buffer_bytes(opt):
    """This rank's storage: the optimizer's buffers and the inner optimizer's state."""
    import torch
    out = dict(opt.buffer_bytes())
    st = 0
    for s in opt.inner.state.values():
        for v in s.values():
            if isinstance(v, torch.Tensor):
                st += v.numel() * v.element_size()
    out["inner_state"] = st
    out["weights"] = sum(out.get(k, 0) for k in ("rowbuf", "colbuf", "rowscale", "colscale", "dense"))
    return out


if __name__ == "__main__":
    sys.exit(main())

# SPDX-License-Identifier: MIT
"""mxshard.torch on one GPU (or CPU): what a training step costs.

    python bench/torch_step.py                 # all three parts, markdown to stdout
    python bench/torch_step.py --parts memory  # one part
    python bench/torch_step.py --json out.json

Parts (issue 15, item 5):

  step     host overhead of ShardedOptimizer.step() for a 200-parameter model
           (100 converted MXFP8 linears with bias, 256x256, each weight a replicated
           GatheredWeight under the optimizer: the GPU work is small, so the
           wall time is mostly host time). Reported: step() wall time, the GPU
           time of the same step (CUDA events), and the host time per parameter.
  overlap  backward with the gradient hooks launching each bucket's reduction
           (overlap=True) against no hooks (overlap=False, every reduction in
           step()): backward time, step time, and their sum. On a world of one
           the reduction is a local copy, so this measures what the hooks cost,
           not what overlap saves; on DP>1 run it under torchrun.
  memory   peak memory of forward+backward of one layer: nn.Linear in BF16
           against a converted MXFP8 linear row-only and bidirectional, same
           shape and batch, its weight.grad added into an fp32 buffer by a
           post-accumulate-grad hook (what ShardedOptimizer's hook does with it:
           into its bucket); weight bytes, gradient bytes, and the transient peak.

A world of one uses torch.distributed with NCCL on CUDA (gloo on CPU), so the
same collectives run as under DP.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import mxshard.torch as mxt
from torch_layer import grad_into_buffer   # (bench/ is on sys.path: the script's folder)


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _init(dev):
    if dist.is_initialized():
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    if dev.type == "cuda":
        dist.init_process_group("nccl", device_id=dev)
    else:
        dist.init_process_group("gloo")


class Stack(nn.Module):
    def __init__(self, n, d, dev):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(d, d, device=dev) for _ in range(n))

    def forward(self, x):
        for m in self.layers:
            x = x + m(x)
        return x


def _model(n, d, dev, bucket_size, overlap):
    torch.manual_seed(0)
    m = Stack(n, d, dev)
    mxt.convert(m, lambda name, mod: "both" if name.endswith("0") else "row")
    opt = mxt.ShardedOptimizer(m, lambda g: torch.optim.AdamW(g, lr=1e-4, foreach=True), bucket_size=bucket_size,
                               overlap=overlap, max_grad_norm=1.0)
    return m, opt


def part_step(dev, args):
    n, d = 100, 256
    m, opt = _model(n, d, dev, args.bucket_size, True)
    x = torch.randn(64, d, device=dev, dtype=torch.bfloat16)
    n_params = sum(1 for p in m.parameters() if p.requires_grad)   # a converted weight is a Parameter too
    walls, gpus = [], []
    for i in range(args.warmup + args.iters):
        m(x).float().square().mean().backward()
        _sync(dev)
        if dev.type == "cuda":
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
        t0 = time.perf_counter()
        opt.step()
        t1 = time.perf_counter()
        if dev.type == "cuda":
            e1.record()
        _sync(dev)
        if i >= args.warmup:
            walls.append(t1 - t0)
            if dev.type == "cuda":
                gpus.append(e0.elapsed_time(e1) * 1e-3)
        opt.zero_grad()
    w = statistics.median(walls)
    g = statistics.median(gpus) if gpus else float("nan")
    return {"params": n_params, "buckets": len(opt.buckets),
            "step_wall_us": w * 1e6, "step_gpu_span_us": g * 1e6, "host_us_per_param": w * 1e6 / n_params,
            "collectives_per_step": {k: v // (args.warmup + args.iters) for k, v in opt.collectives.items()
                                     if not k.startswith("setup")}}


def part_overlap(dev, args):
    out = {}
    n, d = 24, args.overlap_dim
    for overlap in (False, True):
        m, opt = _model(n, d, dev, args.bucket_size, overlap)
        x = torch.randn(args.tokens, d, device=dev, dtype=torch.bfloat16)
        bw, st = [], []
        for i in range(args.warmup + args.iters):
            loss = m(x).float().square().mean()
            _sync(dev)
            t0 = time.perf_counter()
            loss.backward()
            _sync(dev)
            t1 = time.perf_counter()
            opt.step()
            _sync(dev)
            t2 = time.perf_counter()
            opt.zero_grad()
            if i >= args.warmup:
                bw.append(t1 - t0)
                st.append(t2 - t1)
        key = "hooks" if overlap else "no_hooks"
        out[key] = {"backward_ms": statistics.median(bw) * 1e3, "step_ms": statistics.median(st) * 1e3,
                    "sum_ms": (statistics.median(bw) + statistics.median(st)) * 1e3}
        del m, opt
    out["shape"] = f"{n} x MXFP8 linear {d}x{d}, {args.tokens} tokens"
    return out


def plane_bytes(primary):
    """Bytes of a quantized primary's planes (row / col data and scales, amax)."""
    ts = [getattr(primary, k, None) for k in ("row_data", "row_scale", "col_data", "col_scale", "amax")]
    return sum(t.numel() * t.element_size() for t in ts if isinstance(t, torch.Tensor))


def part_memory(dev, args):
    """One layer's forward + backward with a given output gradient (no loss
    temporaries): the persistent bytes (weight storage: the quantized planes of
    a converted linear, as ShardedOptimizer replicates them, its fp32 master
    left out (the optimizer's shard); the gradient buffer a training step keeps:
    .grad in bf16 for nn.Linear, the FP32 buffer a post-accumulate-grad hook
    adds a converted linear's weight.grad into, as ShardedOptimizer's bucket)
    and the transient peak above the inputs, outputs and persistent state
    (dequantized weight, the fp32 weight.grad before the hook adds it into the
    buffer)."""
    d, tokens = args.mem_dim, args.tokens
    rows = {}
    if dev.type != "cuda":
        return {"note": "CPU: no allocator statistics"}
    for kind in ("bf16", "row", "both"):
        torch.manual_seed(0)
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated(dev)
        lin = nn.Linear(d, d, bias=False, device=dev)
        if kind == "bf16":
            lin = lin.to(torch.bfloat16)
            weight = d * d * 2
        else:
            lin = mxt.convert(nn.Sequential(lin), kind)[0]
            grad_into_buffer(lin)   # what the optimizer's bucket buffer holds for it
            weight = plane_bytes(lin.primary)   # made now: resident from here on
            master = lin.weight.numel() * lin.weight.element_size()
        torch.cuda.empty_cache()
        static = torch.cuda.memory_allocated(dev) - base
        if kind != "bf16":
            static -= master   # the fp32 master: the optimizer's shard under ShardedOptimizer, not the model's
        x = torch.randn(tokens, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
        gy = torch.randn(tokens, d, device=dev, dtype=torch.bfloat16)
        for it in range(2):  # the second pass: nn.Linear's .grad exists, as in training
            _sync(dev)
            torch.cuda.reset_peak_memory_stats(dev)
            before = torch.cuda.memory_allocated(dev)
            y = lin(x)
            y.backward(gy)
            _sync(dev)
            peak = torch.cuda.max_memory_allocated(dev) - before
            after = torch.cuda.memory_allocated(dev) - before
            x.grad = None
            del y
        grad = d * d * (2 if kind == "bf16" else 4)
        io = 2 * tokens * d * 2  # y and x.grad, bf16
        rows[kind] = {"weight_MiB": weight / 2**20, "grad_buffer_MiB": grad / 2**20,
                      "persistent_MiB": (static + (grad if kind == "bf16" else 0)) / 2**20,
                      "transient_peak_MiB": max(peak - io, 0) / 2**20, "fwd_bwd_peak_MiB": peak / 2**20,
                      "left_after_MiB": after / 2**20}
        del lin, x, gy
    rows["shape"] = f"{d}x{d} weight, {tokens} tokens, bf16 activations"
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--parts", default="step,overlap,memory")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--bucket-size", type=int, default=40_000_000)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--overlap-dim", type=int, default=2048)
    ap.add_argument("--mem-dim", type=int, default=8192)
    ap.add_argument("--json")
    args = ap.parse_args()
    dev = torch.device(args.device)
    if dev.type == "cuda":
        dev = torch.device("cuda", dev.index if dev.index is not None else torch.cuda.current_device())
        torch.cuda.set_device(dev)
    _init(dev)
    res = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
           "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__}
    for p in args.parts.split(","):
        t0 = time.perf_counter()
        res[p] = {"step": part_step, "overlap": part_overlap, "memory": part_memory}[p](dev, args)
        print(f"# {p}: {json.dumps(res[p])}  ({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)
    print(f"## mxshard.torch on {res['device']}, {res['date']}, torch {res['torch']}")
    if "step" in res:
        s = res["step"]
        print(f"\nstep(): {s['params']} parameters, {s['buckets']} bucket(s): wall {s['step_wall_us']:.0f} us, "
              f"GPU span {s['step_gpu_span_us']:.0f} us, {s['host_us_per_param']:.2f} us per parameter; "
              f"collectives per step {s['collectives_per_step']}")
    if "overlap" in res:
        o = res["overlap"]
        print(f"\n| overlap ({o['shape']}) | backward ms | step ms | sum ms |\n|---|---|---|---|")
        for k in ("no_hooks", "hooks"):
            print(f"| {k} | {o[k]['backward_ms']:.2f} | {o[k]['step_ms']:.2f} | {o[k]['sum_ms']:.2f} |")
    if "memory" in res and dev.type == "cuda":
        mm = res["memory"]
        print(f"\n| memory ({mm['shape']}) | weight MiB | gradient buffer MiB | transient peak MiB "
              f"(above inputs, y, x.grad) |\n|---|---|---|---|")
        for k in ("bf16", "row", "both"):
            r = mm[k]
            print(f"| {k} | {r['weight_MiB']:.1f} | {r['grad_buffer_MiB']:.1f} | {r['transient_peak_MiB']:.1f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

# SPDX-License-Identifier: MIT
"""mxshard from PyTorch: FP32 master shards -> MXFP8 primaries, one MAX
all-reduce per bucket, through torch.distributed.

    pip install ./python        # or PYTHONPATH=python
    export MXSHARD_LIBDIR=$PWD/build/src/host:$PWD/build/cuda
    torchrun --standalone --nproc_per_node=2 examples/torch_writeback.py
    torchrun --standalone --nproc_per_node=2 examples/torch_writeback.py --device cpu   # gloo, host library

A bucket of linear weights (most row-only, some bidirectional) lives in one
contiguous data buffer per plane (mxshard.BucketBuffers, Megatron-style);
the flat FP32 master buffer is cut into one contiguous range per rank,
ignoring weight boundaries. Every step: an optimizer-like update of the
local master shard, then BucketWriteback.run(): partial -> all_reduce(MAX)
-> apply -> one byte all-gather per plane. The script checks every rank's
primaries against a whole-tensor quantize, checks that no storage moved,
and prints the per-step host time of each phase.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist

import mxshard


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=50, help="4 weights per layer (+1 head): 50 -> 201 weights")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--layout", default="padded", choices=["padded", "swizzled", "compact"])
    args = ap.parse_args()

    if "RANK" not in os.environ:  # plain `python examples/torch_writeback.py`: a world of one
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29517")
    local = int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
    if args.device == "cuda":
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    # a transformer-ish bucket: qkv, proj, fc1, fc2 per layer (+ an odd-sized head)
    h = args.hidden
    shapes, planes = [], []
    for layer in range(args.layers):
        for i, (r, c) in enumerate([(3 * h, h), (h, h), (4 * h, h), (h, 4 * h)]):
            shapes.append((r, c))
            planes.append("both" if (layer == 0 and i < 2) else "row")  # a few bidirectional weights
    shapes.append((1000, h + 7))
    planes.append("row")
    bb = mxshard.BucketBuffers(shapes, planes, layout=args.layout, device=device)
    lo, hi = mxshard.BucketBuffers.shard_range(bb.numel, world, rank)

    g = torch.Generator().manual_seed(0)  # the same full master on every rank (as after a checkpoint load)
    full = torch.randn(bb.numel, generator=g) * 0.02
    master = full[lo:hi].clone().to(device)  # this rank's FP32 master shard
    wb = mxshard.BucketWriteback(bb.shard_items(master, lo, hi), round_through="bf16", group=dist.group.WORLD)
    ptrs = [t.data_ptr() for t in (bb.data["row"], bb.data["col"], bb.scales["row"], bb.scales["col"])
            if t is not None]

    phases = {k: 0.0 for k in ("partial", "all_reduce", "status", "apply", "gather")}
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for step in range(args.steps):
        # the "optimizer": an elementwise update of this rank's shard only
        # (replayed on the full buffer at the end for the check)
        master.mul_(1.0 - 1e-3 * (step + 1)).add_(1e-4 * (step % 7 - 3))
        sync()
        t = [time.perf_counter()]
        # == wb.run(): spelled out to time each phase on the host
        wb.partial()
        t.append(time.perf_counter())
        wb.all_reduce()
        t.append(time.perf_counter())
        if wb.status() != 0:  # one 1-byte copy + sync: this one waits for the GPU
            raise RuntimeError("another rank failed before the reduction (group status byte set)")
        t.append(time.perf_counter())
        wb.apply()
        t.append(time.perf_counter())
        wb.gather()
        t.append(time.perf_counter())
        sync()
        if step >= 3:  # warm-up excluded
            for k, a, b in zip(phases, t, t[1:]):
                phases[k] += b - a

    for step in range(args.steps):
        full.mul_(1.0 - 1e-3 * (step + 1)).add_(1e-4 * (step % 7 - 3))
    # every rank: whole-tensor quantize on the host == what the writeback left
    bad = 0
    for i, ((r, c), p) in enumerate(zip(shapes, planes)):
        x = full[bb.offsets[i]:bb.offsets[i] + r * c].reshape(r, c).to(torch.bfloat16)
        ref = mxshard.MXFP8Weight.empty(r, c, planes=p, layout=args.layout, device="cpu").quantize_(x)
        w = bb.weights[i]
        for pn in ("row", "col"):
            if getattr(w, f"{pn}_data") is not None:
                bad += int(not torch.equal(getattr(w, f"{pn}_data").cpu(), getattr(ref, f"{pn}_data")))
                bad += int(not torch.equal(getattr(w, f"{pn}_scale").cpu(), getattr(ref, f"{pn}_scale")))
    moved = ptrs != [t.data_ptr() for t in (bb.data["row"], bb.data["col"], bb.scales["row"], bb.scales["col"])
                     if t is not None]
    # the high-precision backward override of a row-only weight, and TE's buffer names
    wt = bb.weights[2].dequantize(dtype="bf16")
    te = bb.weights[0].te_buffers()

    n = max(args.steps - 3, 1)
    host_us = {k: v / n * 1e6 for k, v in phases.items()}
    host_no_wait = sum(v for k, v in host_us.items() if k != "status")
    summary = torch.tensor([bad, int(moved)], device=device)
    dist.all_reduce(summary)
    if rank == 0:
        print(f"torch_writeback: {len(shapes)} weights ({sum(p == 'both' for p in planes)} bidirectional), "
              f"{bb.numel / 1e6:.1f} M elements, world {world}, {device.type}, layout {args.layout}")
        print("  TE buffers of weight 0: " + ", ".join(f"{k} {tuple(v.shape)}" for k, v in te.items()
                                                        if v is not None))
        print(f"  dequantized weight 2 for backward: {tuple(wt.shape)} {wt.dtype}")
        print("  per-step host time (us): " + ", ".join(f"{k} {v:.1f}" for k, v in host_us.items()))
        what = "host overhead excluding the status wait (GPU time)" if device.type == "cuda" else \
            "host time without the status read (host path: includes the CPU compute)"
        print(f"  {what}: {host_no_wait:.1f} us per bucket writeback")
        print(f"  mismatching planes vs whole-tensor quantize (all ranks): {int(summary[0])}; "
              f"storage moved: {bool(summary[1])}")
        print("torch_writeback: " + ("OK" if int(summary.sum()) == 0 else "FAIL"))
    ok = int(summary.sum()) == 0
    wb.close()
    dist.destroy_process_group()
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()

# SPDX-License-Identifier: MIT
"""Train your own model under FSDP2 with MXFP8 (or NVFP4) weights: fully_shard,
torch.optim and DCP as usual; the weights travel as MXFP8 bytes.

    pip install .                                                       # builds and bundles the libraries
    torchrun --standalone --nproc_per_node=2 examples/torch_fsdp.py     # NCCL, one GPU per rank
    python examples/torch_fsdp.py --device cpu --nproc 3                # 3 gloo ranks on the CPU
    python examples/torch_fsdp.py --format nvfp4                        # NVFP4 weights

The recipe (the model is an ordinary nn.Module with fp32 parameters):

    mxt.convert(model, {"blocks.*.fc1": "both", "blocks.*.fc2": "row"})
    for block in model.blocks: fully_shard(block, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=...)     # any torch.optim optimizer, schedulers as usual
    ... loss.backward(); clip_grad_norm_(model.parameters(), 1.0); opt.step(); opt.zero_grad()

At the end it prints the loss, the bytes this rank sent on FSDP2's
all-gathers against what bf16 weights would have sent, the collectives
mxshard added (at most one small all-reduce per step) and, with --save, a
DCP checkpoint of model and optimizer (get_state_dict: plain tensors).
"""
import argparse
import gc
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import mxshard.torch as mxt


class TinyLM(nn.Module):
    """Next-token model over a window of tokens: embeddings, residual MLP blocks, a dense head."""

    def __init__(self, vocab, window, d, hidden, blocks):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.mix = nn.Linear(window * d, d)
        self.blocks = nn.ModuleList(_Block(d, hidden) for _ in range(blocks))
        self.head = nn.Linear(d, vocab)

    def forward(self, ctx):
        h = self.mix(self.emb(ctx).flatten(1))
        for b in self.blocks:
            h = b(h)
        return self.head(h)


class _Block(nn.Module):
    def __init__(self, d, hidden):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, d)

    def forward(self, h):
        return h + self.fc2(F.silu(self.fc1(self.norm(h))))


def data(step, rank, n, vocab, window, device):
    """This rank's batch: the next token is a fixed function of the last two, with 5 % noise."""
    g = torch.Generator().manual_seed(10_000 * step + rank)
    ctx = torch.randint(0, vocab, (n, window), generator=g)
    y = (3 * ctx[:, -1] + ctx[:, -2]) % vocab
    y = torch.where(torch.rand(n, generator=g) < 0.05, torch.randint(0, vocab, (n,), generator=g), y)
    return ctx.to(device), y.to(device)


class _WireBytes:
    """Counts the bytes this rank hands to all_gather_into_tensor (FSDP2's parameter all-gathers)."""

    def __enter__(self):
        self.bytes, self._orig = 0, dist.all_gather_into_tensor

        def counted(output_tensor, input_tensor, *a, **k):
            self.bytes += input_tensor.numel() * input_tensor.element_size()
            return self._orig(output_tensor, input_tensor, *a, **k)
        dist.all_gather_into_tensor = counted
        return self

    def __exit__(self, *exc):
        dist.all_gather_into_tensor = self._orig


def run(args):
    if args.device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    ok = train(args, device)
    # FSDP2's modules are reference cycles that hold the process group: free
    # them now, while the group is alive. Left to the interpreter's exit,
    # gloo's teardown can abort the process ("terminate called without an
    # active exception") after a run that went well.
    gc.collect()
    dist.barrier()   # no rank tears down while another still talks to it
    dist.destroy_process_group()
    return ok


def train(args, device):
    """Build, shard, train and (with --save) checkpoint; True when the loss fell."""
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # every rank builds the same initial model

    model = TinyLM(args.vocab, args.window, args.d, args.hidden, args.blocks).to(device)   # fp32 masters
    mxt.convert(model, {"blocks.*.fc1": "both", "blocks.*.fc2": "row", "mix": "row"}, format=args.format,
                layout=args.layout)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    mesh = init_device_mesh(device.type, (world,))   # explicit: FSDP2's default is the GPU's if there is one
    for b in model.blocks:
        fully_shard(b, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 5))
    if rank == 0:
        n = sum(p.numel() for p in model.parameters())
        print(f"torch_fsdp: {world} rank(s) on {device.type}, {n} parameters, {args.format} weights", flush=True)

    first = last = None
    t0 = time.perf_counter()
    with _WireBytes() as wire:
        for step in range(args.steps):
            ctx, y = data(step, rank, args.batch, args.vocab, args.window, device)
            loss = F.cross_entropy(model(ctx).float(), y)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad()
            lv = loss.detach().clone()
            dist.all_reduce(lv)
            lv = lv.item() / world
            first = lv if first is None else first
            last = lv
            if rank == 0 and (step % max(1, args.steps // 8) == 0 or step == args.steps - 1):
                norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
                print(f"step {step:4d}  loss {lv:.4f}  grad-norm {float(norm):.3f}", flush=True)
    seconds = (time.perf_counter() - t0) / max(1, args.steps)

    quant = [m for m in model.modules() if mxt.is_param_linear(m)]
    extras = dict(quant[0]._group.collectives) if quant else {}
    if args.save:
        msd, osd = get_state_dict(model, opt)
        import torch.distributed.checkpoint as dcp
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=args.save)
    if rank == 0:
        print(f"torch_fsdp: loss {first:.4f} -> {last:.4f} in {args.steps} steps ({seconds * 1e3:.1f} ms/step); "
              f"all-gather bytes sent by rank 0: {wire.bytes}; mxshard collectives: {extras}"
              + (f"; checkpoint: {args.save}" if args.save else ""), flush=True)
    ok = last < first
    if not ok:
        print(f"torch_fsdp: rank {rank}: FAILED (loss {first} -> {last})", file=sys.stderr)
    return ok


def _spawned(rank, world, port, args):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    if not run(args):
        sys.exit(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--nproc", type=int, default=1, help="spawn this many ranks (without torchrun)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=64, help="sequences per rank per step")
    ap.add_argument("--vocab", type=int, default=48)
    ap.add_argument("--window", type=int, default=4)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=192)
    ap.add_argument("--blocks", type=int, default=2)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--format", default="mxfp8", choices=["mxfp8", "nvfp4"])
    ap.add_argument("--layout", default="padded", choices=["padded", "swizzled", "compact"])
    ap.add_argument("--save", default=None, help="write a DCP checkpoint (model + optimizer) into this directory")
    args = ap.parse_args()
    if "RANK" in os.environ:  # torchrun
        sys.exit(0 if run(args) else 1)
    import socket
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_spawned, args=(args.nproc, port, args), nprocs=args.nproc, start_method="spawn")


if __name__ == "__main__":
    main()

# SPDX-License-Identifier: MIT
"""Train your own model with MXFP8 primaries under a sharded optimizer.

    pip install .                                                 # builds and bundles the libraries
    torchrun --standalone --nproc_per_node=2 examples/torch_sharded.py            # NCCL on 2 GPUs
    python examples/torch_sharded.py --device cpu --nproc 3                         # 3 gloo ranks on CPU
    python examples/torch_sharded.py                                                # a world of one

The model is an ordinary nn.Module (an MLP language model over a window of
previous tokens: embeddings, residual MLP blocks with LayerNorm, a dense
head). Three lines make it an MXFP8 model under a ZeRO-1 optimizer:

    mxt.convert(model, {"blocks.*.up": "both", "blocks.*": "row"})   # the head stays dense
    opt = mxt.ShardedOptimizer(model, lambda groups: torch.optim.AdamW(groups, lr=...))
    ... loss.backward(); opt.step(); opt.zero_grad()

After every step the script checks that no primary moved in memory and
prints the loss; at the end it checks that every rank holds the same
primaries (a hash gathered from all ranks) and that the loss fell.
"""
import argparse
import hashlib
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import mxshard.torch as mxt


class WindowLM(nn.Module):
    """Predicts token t from the `window` tokens before it."""

    def __init__(self, vocab=64, window=8, d=64, hidden=256, blocks=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.inp = nn.Linear(window * d, hidden)
        self.blocks = nn.ModuleList(nn.ModuleDict({"norm": nn.LayerNorm(hidden),
                                                   "up": nn.Linear(hidden, 2 * hidden),
                                                   "down": nn.Linear(2 * hidden, hidden)}) for _ in range(blocks))
        self.norm = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, ctx):
        h = self.inp(self.emb(ctx).flatten(1))
        for b in self.blocks:
            h = h + b["down"](F.gelu(b["up"](b["norm"](h))))
        return self.head(self.norm(h))


def batch(step, rank, world, n, vocab, window, device):
    """This rank's slice of global batch `step` from a fixed noisy rule: the
    next token is a fixed permutation of the token two places back, with 10 %
    uniform noise (the best loss is about 0.1 * ln(vocab) + 0.33 nats)."""
    perm = torch.randperm(vocab, generator=torch.Generator().manual_seed(7))
    g = torch.Generator().manual_seed(1000 + step)
    ctx = torch.randint(0, vocab, (n * world, window), generator=g)
    y = perm[ctx[:, -2]]
    noise = torch.rand(n * world, generator=g) < 0.1
    y = torch.where(noise, torch.randint(0, vocab, (n * world,), generator=g), y)
    lo = rank * n
    return ctx[lo:lo + n].to(device), y[lo:lo + n].to(device)


def run(args):
    if args.device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # every rank builds the same initial model

    # a bf16 model (a converted linear computes in compute_dtype, bf16 by default, and returns its
    # input's dtype); the optimizer keeps FP32 masters of everything
    model = WindowLM(args.vocab, args.window, args.d, args.hidden, args.blocks).to(device, torch.bfloat16)
    mxt.convert(model, {"blocks.*.up": "both", "blocks.*": "row", "inp": "row"}, layout=args.layout)
    # the converted weights are Parameters like any other: one list names them all
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "emb" not in n]
    opt = mxt.ShardedOptimizer(
        model, lambda groups: torch.optim.AdamW(groups, lr=args.lr, weight_decay=0.0),
        param_groups=[{"params": decay, "weight_decay": 0.05}],
        bucket_size=args.bucket_size, max_grad_norm=1.0)
    if rank == 0:
        print(f"torch_sharded: {world} rank(s) on {device.type}; {opt}", flush=True)

    storage = [b.data_ptr() for b in model.buffers()]
    first = last = None
    t0 = time.perf_counter()
    for step in range(args.steps):
        ctx, y = batch(step, rank, world, args.batch, args.vocab, args.window, device)
        loss = F.cross_entropy(model(ctx).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        assert [b.data_ptr() for b in model.buffers()] == storage, "a primary moved"
        lv = loss.detach().clone()
        dist.all_reduce(lv)
        lv = lv.item() / world
        first = lv if first is None else first
        last = lv
        if rank == 0 and (step % max(1, args.steps // 10) == 0 or step == args.steps - 1):
            print(f"step {step:4d}  loss {lv:.4f}  grad-norm {opt.last_grad_norm:.3f}", flush=True)

    # every rank holds the same primaries
    h = hashlib.sha256()
    for b in model.buffers():
        h.update(b.cpu().numpy().tobytes())
    mine = torch.tensor(list(h.digest()[:8]), dtype=torch.int64, device=device)
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine)
    same = all(torch.equal(e, every[0]) for e in every)
    if rank == 0:
        per_step = (time.perf_counter() - t0) / max(1, args.steps)
        print(f"torch_sharded: loss {first:.4f} -> {last:.4f} in {args.steps} steps ({per_step * 1e3:.1f} ms/step); "
              f"primaries identical on all ranks: {same}; collectives: {dict(opt.collectives)}", flush=True)
    opt.close()  # releases what holds on to the process group, before the group goes
    dist.destroy_process_group()
    ok = same and last < first
    if not ok:
        print(f"torch_sharded: rank {rank}: FAILED (same={same}, loss {first} -> {last})", file=sys.stderr)
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
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=64, help="sequences per rank per step")
    ap.add_argument("--vocab", type=int, default=64)
    ap.add_argument("--window", type=int, default=8)
    ap.add_argument("--d", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--blocks", type=int, default=2)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--layout", default="padded", choices=["padded", "swizzled", "compact"])
    ap.add_argument("--bucket-size", type=int, default=40_000, help="elements per bucket")
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

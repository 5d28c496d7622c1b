# SPDX-License-Identifier: MIT
"""Host time per function of two converted linears (2048 -> 8192 -> 2048, row-only MXFP8, 8192
bf16 tokens), forward + backward, 10 steps under cProfile after 3 warm-up steps: under FSDP2
(`fsdp`: convert() + fully_shard, a world of one over NCCL) or without it (`local`: the same
convert()ed linears, mxt.MXFP8Linear's class, in one process: each one's quantized primary made
from its master once and kept while the master holds still, as ShardedOptimizer's replicated
planes are kept between steps). Where the FSDP2 step's host time goes (bench/RESULTS.md run 15).

    torchrun --standalone --nproc_per_node=1 bench/fsdp_host_profile.py fsdp|local
    python bench/fsdp_host_profile.py local --device cpu --tokens 64 --dims 128,256   # a smoke check (gloo)
"""
import argparse
import cProfile
import io
import os
import pstats

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

import mxshard.torch as mxt

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("mode", choices=["fsdp", "local"])
ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: gloo, a smoke check")
ap.add_argument("--tokens", type=int, default=8192)
ap.add_argument("--dims", default="2048,8192", help="d,h: the linears d -> h -> d")
args = ap.parse_args()
for k, v in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29571"), ("RANK", "0"), ("WORLD_SIZE", "1")):
    os.environ.setdefault(k, v)
cuda = args.device == "cuda"
dist.init_process_group("nccl" if cuda else "gloo")
if cuda:
    torch.cuda.set_device(0)
dev = torch.device(args.device)
sync = torch.cuda.synchronize if cuda else (lambda: None)
fsdp = args.mode == "fsdp"
d, h = (int(v) for v in args.dims.split(","))
m = nn.Sequential(nn.Linear(d, h, bias=False), nn.Linear(h, d, bias=False)).to(dev)
mxt.convert(m, {"0": "row", "1": "row"})
if fsdp:
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh(dev.type, (1,))  # explicit: the default is the GPU's
    for c in m:
        fully_shard(c, mesh=mesh)
    fully_shard(m, mesh=mesh)
x = torch.randn(args.tokens, d, device=dev, dtype=torch.bfloat16)


def step():
    m(x).float().sum().backward()


for _ in range(3):
    step()
sync()
pr = cProfile.Profile()
pr.enable()
for _ in range(10):
    step()
sync()
pr.disable()
for key, n in (("tottime", 25), ("cumulative", 30)):
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats(key).print_stats(n)
    print(s.getvalue()[:7000])
dist.destroy_process_group()

# SPDX-License-Identifier: MIT
"""Host time per function of two converted linears (2048 -> 8192 -> 2048, row-only MXFP8, 8192
bf16 tokens), forward + backward, 10 steps under cProfile after 3 warm-up steps: under FSDP2
(`fsdp`: convert(fsdp=True) + fully_shard, a world of one over NCCL) or as MXFP8Linear (`local`).
Where the FSDP2 step's host time goes (bench/RESULTS.md run 15).

    torchrun --standalone --nproc_per_node=1 bench/fsdp_host_profile.py fsdp|local
"""
import cProfile
import io
import pstats
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

import mxshard.torch as mxt

dist.init_process_group("nccl")
torch.cuda.set_device(0)
fsdp = sys.argv[1] == "fsdp"
m = nn.Sequential(nn.Linear(2048, 8192, bias=False), nn.Linear(8192, 2048, bias=False)).cuda()
mxt.convert(m, {"0": "row", "1": "row"}, fsdp=fsdp)
if fsdp:
    for c in m:
        fully_shard(c)
    fully_shard(m)
x = torch.randn(8192, 2048, device="cuda", dtype=torch.bfloat16)


def step():
    m(x).float().sum().backward()


for _ in range(3):
    step()
torch.cuda.synchronize()
pr = cProfile.Profile()
pr.enable()
for _ in range(10):
    step()
torch.cuda.synchronize()
pr.disable()
for key, n in (("tottime", 25), ("cumulative", 30)):
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats(key).print_stats(n)
    print(s.getvalue()[:7000])
dist.destroy_process_group()

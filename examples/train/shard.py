# SPDX-License-Identifier: MIT
"""The flat parameter layout, its data-parallel sharding, the collectives and
AdamW on a flat shard.

Layout. Every parameter has a fixed place in ONE flat FP32 master vector of
`total` elements, in this order: the bidirectional MXFP8 linears, the
row-only MXFP8 linears, then the dense (BF16) parameters (embeddings, layer
norms, the output head). The vector is padded to `n_pad = dp * shard` and
rank r owns the contiguous range [r*shard, (r+1)*shard): shard boundaries
ignore parameter boundaries, so a weight can be split across ranks and a rank
can own none of it. Everything a rank keeps of the optimizer (master, Adam m
and v, its gradient shard) is that one range.

Collectives (class Comm). With the NCCL backend the tensors stay on the GPU:
reduce_scatter_tensor for gradients, all_reduce(MAX, uint8) for the block
exponents, all_gather_into_tensor for primaries. The gloo backend (used when
several ranks share one GPU, or on CPU) has no reduce-scatter, so gradients
are all-reduced and each rank keeps its slice (same sums, dp times the
traffic); gloo collectives are run on CPU copies of the tensors, which works
with every torch version whatever gloo's CUDA support is. bf16 payloads are
gathered as their raw bytes (a byte gather is exact for any dtype). Every
collective is counted by kind.
"""
from __future__ import annotations

import math
import os
import zlib
from collections import Counter
from dataclasses import dataclass

import torch
import torch.distributed as dist

KIND_BOTH, KIND_ROW, KIND_DENSE = "mx_both", "mx_row", "dense"
KIND_ORDER = {KIND_BOTH: 0, KIND_ROW: 1, KIND_DENSE: 2}


@dataclass
class ParamSpec:
    name: str
    shape: tuple
    kind: str           # mx_both | mx_row | dense
    decay: bool         # AdamW weight decay applies
    init: str           # "normal:<std>" | "ones" | "zeros"
    linear: bool = False  # a [out, in] linear weight (goes through WeightLinear)
    offset: int = 0     # flat offset in the master vector (set by Layout)

    @property
    def numel(self) -> int:
        return int(math.prod(self.shape))


class Layout:
    """Offsets of every parameter and each rank's range; identical on every rank."""

    def __init__(self, specs, dp: int, align: int = 128):
        specs = sorted(specs, key=lambda s: KIND_ORDER[s.kind])  # stable: module order inside a kind
        off = 0
        for s in specs:
            s.offset = off
            off += s.numel
        self.specs = specs
        self.by_name = {s.name: s for s in specs}
        self.total = off
        self.dp = dp
        unit = dp * align
        self.n_pad = max(unit, -(-off // unit) * unit)
        self.shard = self.n_pad // dp
        self.n_both = sum(s.numel for s in specs if s.kind == KIND_BOTH)
        self.n_mx = sum(s.numel for s in specs if s.kind != KIND_DENSE)
        self.n_dense = self.total - self.n_mx

    def rank_range(self, r: int):
        return r * self.shard, (r + 1) * self.shard

    def owned(self, r: int, lo: int, hi: int):
        """Rank r's part of the flat range [lo, hi): (start, end), possibly empty."""
        a, b = self.rank_range(r)
        s, e = max(lo, a), min(hi, b)
        return (s, e) if e > s else (s, s)

    def shard_of(self, r: int, spec: ParamSpec):
        """(start, len) inside the parameter that rank r owns, and the offset of
        that piece inside the rank's shard vector."""
        s, e = self.owned(r, spec.offset, spec.offset + spec.numel)
        if e <= s:
            return 0, 0, 0
        return s - spec.offset, e - s, s - r * self.shard

    def decay_segments(self, r: int):
        """Merged ranges, relative to rank r's shard, of the parameters with weight decay."""
        segs = []
        for s in self.specs:
            if not s.decay:
                continue
            a, b = self.owned(r, s.offset, s.offset + s.numel)
            if b <= a:
                continue
            a, b = a - r * self.shard, b - r * self.shard
            if segs and segs[-1][1] == a:
                segs[-1][1] = b
            else:
                segs.append([a, b])
        return [tuple(x) for x in segs]

    def table(self):
        return [{"name": s.name, "shape": list(s.shape), "kind": s.kind, "offset": s.offset,
                 "decay": s.decay, "init": s.init, "linear": s.linear} for s in self.specs]


def init_full_master(layout: Layout, seed: int, device) -> torch.Tensor:
    """The full flat FP32 master at step 0, a pure function of (seed, parameter
    name, parameter shape): identical for every DP size. Small models are
    drawn on the CPU (bit-identical everywhere); `device` may be a GPU for
    large ones (fast, reproducible on the same GPU type)."""
    full = torch.zeros(layout.n_pad, dtype=torch.float32, device=device)
    for s in layout.specs:
        v = full[s.offset:s.offset + s.numel]
        if s.init == "ones":
            v.fill_(1.0)
        elif s.init == "zeros":
            v.zero_()
        else:
            std = float(s.init.split(":")[1])
            g = torch.Generator(device=full.device).manual_seed(seed * 100_003 + zlib.crc32(s.name.encode()))
            v.normal_(0.0, std, generator=g)
    return full


class Comm:
    """The collectives of the training loop, counted by kind."""

    def __init__(self, rank: int, world: int, backend: str | None, device):
        self.rank, self.world, self.backend = rank, world, backend
        self.device = device
        self.counts = Counter()
        # direct: the collectives on the tensors themselves (NCCL). MXS_TRAIN_DIRECT_COLLECTIVES=1
        # takes that path on gloo too (CPU tensors; a recent torch): how the NCCL code is tested on a CPU.
        self.direct = backend == "nccl" or os.environ.get("MXS_TRAIN_DIRECT_COLLECTIVES") == "1"
        self.via_cpu = backend == "gloo" and not self.direct

    def _to(self, t):
        return t.cpu() if self.via_cpu and t.device.type != "cpu" else t

    def _all_reduce(self, t: torch.Tensor, op, name: str):
        """In-place all-reduce, through a CPU copy on gloo (see via_cpu)."""
        self.counts[name] += 1
        if self.world == 1:
            return
        if self.via_cpu and t.device.type != "cpu":
            c = t.cpu()
            dist.all_reduce(c, op=op)
            t.copy_(c)
        else:
            dist.all_reduce(t, op=op)

    def all_reduce_max_u8(self, packed: torch.Tensor):
        """The one exponent reduction of a bucket writeback (uint8 MAX, in place)."""
        assert packed.dtype == torch.uint8
        self._all_reduce(packed, dist.ReduceOp.MAX, "all_reduce_max_u8")

    def all_reduce_sum(self, t: torch.Tensor):
        self._all_reduce(t, dist.ReduceOp.SUM, "all_reduce_sum")

    def reduce_scatter_sum(self, full: torch.Tensor, out: torch.Tensor):
        """out (this rank's shard) = sum over ranks of full[rank*n:(rank+1)*n].
        gloo: all-reduce + slice (gloo has no reduce-scatter)."""
        n = out.numel()
        assert full.numel() == n * self.world
        if self.world == 1:
            out.copy_(full)
            return
        if self.direct:
            self.counts["reduce_scatter_sum"] += 1
            dist.reduce_scatter_tensor(out, full, op=dist.ReduceOp.SUM)
        else:
            self.counts["all_reduce_sum(as reduce_scatter)"] += 1
            c = full.cpu() if full.device.type != "cpu" else full
            dist.all_reduce(c, op=dist.ReduceOp.SUM)
            out.copy_(c[self.rank * n:(self.rank + 1) * n])

    def all_gather_bytes(self, out: torch.Tensor, inp: torch.Tensor, kind: str):
        """out = concat over ranks of inp (same size everywhere), as raw bytes.
        out may contain inp (the in-place gather of a parameter buffer)."""
        self.counts[f"all_gather:{kind}"] += 1
        if self.world == 1:
            if out.data_ptr() != inp.data_ptr():
                out.copy_(inp)
            return
        ob = out.view(torch.uint8) if out.dtype != torch.uint8 else out
        ib = inp.view(torch.uint8) if inp.dtype != torch.uint8 else inp
        if self.via_cpu:
            ic = ib.cpu() if ib.device.type != "cpu" else ib.clone()
            parts = [torch.empty_like(ic) for _ in range(self.world)]
            dist.all_gather(parts, ic)
            ob.copy_(torch.cat(parts).to(ob.device))
        else:
            dist.all_gather_into_tensor(ob, ib)

    def all_gather_flat(self, shard: torch.Tensor) -> torch.Tensor:
        """The full vector from every rank's equal-size shard (checkpointing)."""
        out = torch.empty(shard.numel() * self.world, dtype=shard.dtype, device=shard.device)
        self.all_gather_bytes(out, shard, "checkpoint")
        return out

    def barrier(self):
        if self.world > 1:
            dist.barrier()


class RegionGather:
    """All-gather of one parameter buffer that holds the flat range [lo, hi).

    If the buffer spans the whole padded flat vector (full span: lo = 0,
    hi = n_pad) every rank's part is one equal chunk and the gather runs in
    place. Otherwise the parts are unequal (a region that starts or ends inside
    a rank's range), so each rank copies its part into an equal-size staging
    chunk, one all_gather_into_tensor moves them, and each rank copies the
    other ranks' parts into place. Either way: one collective per buffer."""

    def __init__(self, layout: Layout, comm: Comm, buf: torch.Tensor, lo: int, hi: int, kind: str):
        self.layout, self.comm, self.buf, self.lo, self.hi, self.kind = layout, comm, buf, lo, hi, kind
        assert buf.numel() == hi - lo, (buf.numel(), lo, hi)
        self.full_span = lo == 0 and hi == layout.n_pad
        self.parts = [layout.owned(r, lo, hi) for r in range(layout.dp)]
        self.chunk = max(e - s for s, e in self.parts)
        self.active = layout.dp > 1 and hi > lo
        if self.active and not self.full_span and self.chunk > 0:
            self.send = torch.zeros(self.chunk, dtype=buf.dtype, device=buf.device)
            self.recv = torch.zeros(self.chunk * layout.dp, dtype=buf.dtype, device=buf.device)

    def run(self):
        if not self.active or self.chunk == 0:
            return
        r = self.comm.rank
        if self.full_span:
            a, b = self.layout.rank_range(r)
            self.comm.all_gather_bytes(self.buf, self.buf[a:b], self.kind)
            return
        s, e = self.parts[r]
        self.send[:e - s].copy_(self.buf[s - self.lo:e - self.lo])
        self.comm.all_gather_bytes(self.recv, self.send, self.kind)
        for q, (s, e) in enumerate(self.parts):
            if q != r and e > s:
                self.buf[s - self.lo:e - self.lo].copy_(self.recv[q * self.chunk:q * self.chunk + e - s])

    def staging_bytes(self) -> int:
        if not self.active or self.full_span or self.chunk == 0:
            return 0
        return (self.send.numel() + self.recv.numel()) * self.buf.element_size()


class AdamW:
    """AdamW on this rank's flat FP32 shard, elementwise, deterministic.

        m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
        p = p (1 - lr wd)                       (decayed parameters only)
        p = p - (lr / (1-b1^t)) m / (sqrt(v / (1-b2^t)) + eps)

    Every operation is elementwise, so a parameter element gets the same
    arithmetic whichever rank owns it (given the same gradient). The shard is
    processed in chunks of `chunk` elements so the one temporary stays small.
    Weight decay applies to the shard's `decay_segments` [(lo, hi), ...]."""

    def __init__(self, master: torch.Tensor, decay_segments, betas=(0.9, 0.95), eps=1e-8,
                 weight_decay=0.1, chunk=1 << 24):
        self.p = master
        self.m = torch.zeros_like(master)
        self.v = torch.zeros_like(master)
        self.segments = list(decay_segments)
        self.b1, self.b2 = betas
        self.eps = eps
        self.wd = weight_decay
        self.t = 0
        self.chunk = chunk
        self.tmp = torch.empty(min(chunk, master.numel()), dtype=master.dtype, device=master.device)

    def step(self, g: torch.Tensor, lr: float):
        self.t += 1
        b1, b2 = self.b1, self.b2
        bc1 = 1.0 - b1 ** self.t
        bc2 = 1.0 - b2 ** self.t
        if self.wd != 0.0:
            for lo, hi in self.segments:
                self.p[lo:hi].mul_(1.0 - lr * self.wd)
        n = self.p.numel()
        for lo in range(0, n, self.chunk):
            hi = min(n, lo + self.chunk)
            p, m, v, gg, tmp = self.p[lo:hi], self.m[lo:hi], self.v[lo:hi], g[lo:hi], self.tmp[:hi - lo]
            m.mul_(b1).add_(gg, alpha=1.0 - b1)
            v.mul_(b2).addcmul_(gg, gg, value=1.0 - b2)
            torch.div(v, bc2, out=tmp)
            tmp.sqrt_().add_(self.eps)
            p.addcdiv_(m, tmp, value=-lr / bc1)

    def state(self):
        return {"m": self.m, "v": self.v, "t": self.t}

# SPDX-License-Identifier: MIT
"""ShardedOptimizer's writeback: from the fp32 master shards to the model's
replicated weights, with FSDP2's engine (fsdp.units.WeightUnit: the library's
sharded writeback of a rank's rows).

    every converted weight    WeightUnit over this rank's rows of its master: partial
    ONE all_reduce(MAX, int32) of every shared entry of every weight, + a status entry (a rank
                              that failed, in the inner step or here: every rank raises)
    every converted weight    apply: fragments + scale windows (its send buffers)
    per bucket ONE all_gather of one byte buffer per rank: each converted weight's sends (every
                              plane it has) and each dense item's rows cast to its dtype
    then                      assemble: each plane's primary (the GatheredWeight's box, the same
                              objects rebound: the GEMM plans stay); dense rows into p.data

A world of one issues no collective (the send buffer is the gathered one).
"""
from __future__ import annotations

import torch

from ... import _lib as L
from ..fsdp.units import WeightUnit, apply_reduced, pack_partials, scratch_bytes, shared_entry_count

__all__ = ["Refresh"]

_FAILED = 1


def _aligned(n):
    """Pieces start at multiples of 16 bytes (a dense piece is viewed as its dtype)."""
    return -(-n // 16) * 16


class _Piece:
    """One tensor in a bucket's per-rank send buffer: [at, at + n) bytes."""

    __slots__ = ("at", "n", "src", "out")

    def __init__(self, at, n, src):
        self.at, self.n, self.src, self.out = at, n, src, None


class Refresh:
    """The prepared writeback of every bucket (built once; tensors bound at construction)."""

    def __init__(self, geoms, masters, metas, world, rank, device):
        """geoms: the BucketGeometry list; masters: per bucket its [S] fp32 master shard; metas:
        {item name: the WeightMeta its unit quantizes with}."""
        self.world, self.rank, self.device = world, rank, device
        self.units = []            # (item, unit) in model order
        self.buckets = []          # per bucket: (send buffer, [(item, unit or None, pieces by plane)])
        for g, master in zip(geoms, masters):
            at = 0
            layout = []
            for pos, it in enumerate(g.items):
                local = g.view(master, pos, rank)
                if it.module is not None:
                    u = WeightUnit(metas[it.name], local, world, rank)
                    self.units.append((it, u))
                    planes = {}
                    for p in u.planes:
                        ps = []
                        for t in u.send(p):
                            ps.append(_Piece(at, t.numel(), t))
                            at = _aligned(at + t.numel())
                        planes[p] = ps
                    layout.append((it, u, planes))
                else:
                    es = torch.empty(0, dtype=it.dtype).element_size()
                    ch = -(-it.rows // world)
                    piece = _Piece(at, ch * it.cols * es, local)
                    at = _aligned(at + piece.n)
                    layout.append((it, None, piece))
            send = torch.zeros(max(at, 1), dtype=torch.uint8, device=device)
            for it, u, planes in layout:
                if u is None:   # the gathered rows of a dense item (every rank's chunk, padded)
                    planes.out = torch.empty(world, planes.n, dtype=torch.uint8, device=device)
                    continue
                for ps in planes.values():
                    for pc in ps:   # the gathered bytes of this send: the primary's storage (replicated)
                        pc.out = torch.empty(world * pc.n, dtype=torch.uint8, device=device)
            self.buckets.append((send, layout, at, _copies(send, layout, at, world, device)))
        self.counts = [shared_entry_count(u.spec, u.rows, u.cols, world) for _, u in self.units]
        self.scratch = {id(u): {p: torch.empty(scratch_bytes(u.spec, u.rows, u.cols), dtype=torch.uint8,
                                               device=device) for p in u.planes} for _, u in self.units}

    # ---- the step's writeback --------------------------------------------------------------

    def run(self, comm, err=None):
        """Partial -> ONE MAX all-reduce (with every rank's status) -> apply -> per bucket one
        all_gather -> the model's planes and dense values. `err`: this rank's failure so far (the
        inner step's): it travels in the status entry. Returns the primaries by item name;
        raises this rank's error, or RemoteError when another rank failed."""
        n = sum(self.counts)
        wire = torch.zeros(n + 1, dtype=torch.int32, device=self.device)
        units = [u for _, u in self.units]
        if err is None:
            try:
                pack_partials(units, self.counts, wire)
            except Exception as e:  # noqa: BLE001 - every rank learns of it through the status entry
                err = e
        if err is not None:
            wire.zero_()
            wire[n] = _FAILED
        if comm.active:
            comm.all_reduce(wire, "all_reduce_max", op="max")
        if err is not None:
            raise err
        if int(wire[n]) != 0:
            raise L.remote_error("ShardedOptimizer writeback (another rank failed)")
        apply_reduced(units, self.counts, wire, [u.local._version for u in units])
        out = {}
        for send, layout, _, (ins, srcs, sizes, outs) in self.buckets:
            if ins:   # every send of the bucket into its buffer: one multi-tensor copy
                torch._foreach_copy_(ins, srcs)
            if comm.active:
                got = torch.empty(self.world * send.numel(), dtype=torch.uint8, device=self.device)
                comm.all_gather_into(got, send, "all_gather")
            else:
                got = send
            if sizes:   # every piece out of the gathered [world, B] bytes: one copy kernel
                torch.split_with_sizes_copy(got.view(self.world, -1), sizes, dim=1, out=outs)
            dense_dst, dense_src = [], []
            for it, u, planes in layout:
                if u is None:
                    ch = -(-it.rows // self.world)
                    dense_src.append(planes.out.view(it.dtype).view(self.world * ch, it.cols)[:it.rows])
                    dense_dst.append(it.param.data.view(it.rows, it.cols))
                    continue
                prims = {}
                for p, ps in planes.items():
                    prims[p] = u.assemble(p, tuple(pc.out for pc in ps), self.scratch[id(u)][p])
                out[it.name] = prims
            if dense_dst:
                with torch.no_grad():
                    torch._foreach_copy_(dense_dst, dense_src)
        return out


def _copies(send, layout, end, world, device):
    """The bucket's prepared copies: (send views, their sources) of the copy in, and (sizes, outs)
    of torch.split_with_sizes_copy out of the gathered [world, B] bytes (a gap between pieces, the
    alignment, goes to a scratch output)."""
    ins, srcs, pieces = [], [], []
    for it, u, planes in layout:
        if u is None:
            src = planes.src.reshape(-1)
            if src.numel():
                ins.append(send[planes.at:planes.at + planes.n].view(it.dtype)[:src.numel()])
                srcs.append(src)
            pieces.append((planes.at, planes.n, planes.out))
            continue
        for p, ps in planes.items():
            for pc, t in zip(ps, u.send(p)):
                ins.append(send[pc.at:pc.at + pc.n])
                srcs.append(t.reshape(-1))
                pieces.append((pc.at, pc.n, pc.out.view(world, pc.n)))
    sizes, outs, at = [], [], 0
    for a, n, o in sorted(pieces, key=lambda x: x[0]):
        if a > at:
            sizes.append(a - at)
            outs.append(torch.empty(world, a - at, dtype=torch.uint8, device=device))
        sizes.append(n)
        outs.append(o)
        at = a + n
    if pieces and end > at:   # (the buffer's aligned tail: the sizes cover all of it)
        sizes.append(end - at)
        outs.append(torch.empty(world, end - at, dtype=torch.uint8, device=device))
    return ins, srcs, sizes, outs

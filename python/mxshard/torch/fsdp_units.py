# SPDX-License-Identifier: MIT
"""WeightUnit: one converted weight's quantized bytes on one rank, made by the
library's sharded writeback from this rank's rows of the master.

    rank k holds rows [r0, r1) of the [R, C] master (FSDP2's dim-0 shard; all of it in a world of one)

    partial   the library's partial exponents / block amaxes of the shard (BucketWriteback /
              NVFP4BucketWriteback of one item, group=None: no collective of its own)
    entries   the packed entries other ranks also write ("shared"), widened to int32, for the
              model's ONE MAX all-reduce (FSDPGroup.refresh):
                 evenly sharded   the blocks two ranks touch (column planes and 16x16 tiles cut by
                                  a boundary that is not a multiple of the block height) + NVFP4's
                                  tensor amax; a row-only MXFP8 weight has none
                 unevenly         every entry of the weight: FSDP2 then all-gathers inputs of the
                                  padded shard's shape only, so the scales cannot travel with
                                  the data and every rank takes them from the reduction
    apply     the library casts the shard into FRAGMENTS (this rank's bytes of each data plane,
              the first rows of a padded [S, C] send buffer) and writes complete COMPACT scale
              planes (correct for every block this rank touches; all of them when uneven)
    send      the all-gather inputs of one plane: (data [S, C] bytes, this rank's scale window)
              when evenly sharded, (data,) when not
    assemble  after the all-gather: the [R, C] plane (a view of the gathered bytes), its scales
              in the module's layout (convert_scales into FSDP2-managed scratch)

The master's values reach the bytes only through the library's writeback (the
format's rules live there); this module moves bytes and picks entries.
"""
from __future__ import annotations

import math

import torch

from .. import _arrays as A
from ..ops import convert_scales
from ..weight import MXFP8Weight
from ..writeback import BucketWriteback
from . import fsdp_geometry as G

__all__ = ["WeightUnit", "shared_entry_count", "scratch_bytes"]

_RT = {"bf16": "bf16", "none": None}


# ---- pure geometry of one weight's planes ---------------------------------------------------

def _planes(spec):
    return ("row", "col") if spec.planes == "both" else ("row",)


def _mx_region(plane, rows, cols):
    """(block rows, entries per block row) of an MXFP8 plane's COMPACT exponent region."""
    if plane == "row":
        return rows, A.ceil_div(cols, 32)
    return A.ceil_div(rows, 32), cols


def shared_entry_count(spec, rows, cols, world):
    """How many packed entries of this weight travel in the model's reduction (pure: every rank
    computes the same number)."""
    if spec.format != "mxfp8":
        raise NotImplementedError("NVFP4 under FSDP2")
    n = 0
    for p in _planes(spec):
        nbr, per = _mx_region(p, rows, cols)
        if not G.is_even(rows, world):
            n += nbr * per
        else:
            n += len(G.shared_block_rows(rows, world, G.block_height("mxfp8", p))) * per
    return n


def _scale_window(plane, rows, world, rank):
    """(b0, b1, T): the COMPACT scale rows (block rows) rank `rank` sends for `plane` and the
    padded count every rank sends (evenly sharded weights)."""
    h = G.block_height("mxfp8", plane)
    b0, b1 = G.touched_block_rows(*G.rank_rows(rows, world, rank), h)
    return b0, b1, G.max_touched(rows, world, h)


def _send_scale_bytes(spec, rows, cols, world):
    """Bytes of the scale input of one gather (the larger plane's window; 0 when uneven)."""
    if not G.is_even(rows, world):
        return 0
    out = 0
    for p in _planes(spec):
        _, per = _mx_region(p, rows, cols)
        out = max(out, _scale_window(p, rows, world, 0)[2] * per)
    return out


def scratch_bytes(spec, rows, cols):
    """Bytes of the per-weight scratch FSDP2 allocates and frees with the unsharded weight: the
    largest scale plane in the module's layout."""
    return max(math.prod(A.scale_shape(rows, cols, p, spec.layout)) for p in _planes(spec))


# ---- the unit ------------------------------------------------------------------------------

class WeightUnit:
    """The quantized state of one weight on this rank (see the module docstring). Built for a
    given master storage, world and rank; `matches()` says whether it still fits."""

    def __init__(self, meta, local, world, rank):
        spec = meta.spec
        if spec.format != "mxfp8":
            raise NotImplementedError("NVFP4 under FSDP2")
        R, C = meta.rows, meta.cols
        r0, r1 = G.rank_rows(R, world, rank)
        if tuple(local.shape) != (r1 - r0, C):
            raise ValueError(f"mxshard: {meta.name}: this rank holds a master of shape {tuple(local.shape)}, "
                             f"FSDP2's dim-0 shard of [{R}, {C}] over {world} ranks is [{r1 - r0}, {C}] (rank "
                             f"{rank}); quantized weights need fully_shard's default Shard(0) placement")
        if not local.is_contiguous():
            raise ValueError(f"mxshard: {meta.name}: the master shard is not contiguous")
        self.meta, self.spec, self.world, self.rank = meta, spec, world, rank
        self.rows, self.cols, self.r0, self.r1 = R, C, r0, r1
        self.S = G.chunk_rows(R, world)
        self.even = G.is_even(R, world)
        # the scales travel beside the data only when FSDP2 takes inputs of any shape (evenly sharded)
        # and gathers them all (a world of one copies the first input alone)
        self.scales_travel = self.even and world > 1
        self.planes = _planes(spec)
        dev = local.device
        self.device = dev
        self._key = self._storage_key(local)
        u8 = torch.uint8
        # this rank's bytes of each data plane: the first rows of a padded [S, C] send buffer
        self.send_data = {p: torch.zeros(self.S, C, dtype=u8, device=dev) for p in self.planes}
        frags = {p: self.send_data[p].view(-1)[:(r1 - r0) * C] for p in self.planes}
        # complete COMPACT scale planes (the library writes every block's scale)
        self.scales = {p: torch.zeros(A.scale_shape(R, C, p, "compact"), dtype=u8, device=dev) for p in self.planes}
        self.primary = MXFP8Weight(R, C, layout="compact", **{f"{p}_scale": self.scales[p] for p in self.planes})
        self.local = local
        item = (self.primary, local.reshape(-1), r0 * C, (r1 - r0) * C,
                (frags.get("row"), frags.get("col")))
        self.wb = BucketWriteback([item], rounding=spec.rounding, round_through=_RT[spec.round_through],
                                  mode="fused", gather=False)
        nscale = _send_scale_bytes(spec, R, C, world)
        self.send_scale = {p: torch.zeros(max(nscale, 1), dtype=u8, device=dev) for p in self.planes} \
            if self.scales_travel else {}
        self.shared = self._shared_positions()
        self.n_shared = int(self.shared.numel())
        self.reduced = None  # the reduced shared entries of the last refresh (int32)
        self.version = None  # the master's version the bytes were made from (None: never)
        self.cached = None   # a world of one: the whole primary (FSDPGroup.local_primary)

    # -- identity

    @staticmethod
    def _storage_key(local):
        return (local.data_ptr(), tuple(local.shape), local.dtype, local.device)

    def matches(self, local, world, rank):
        """Built for this very master storage, world and rank."""
        return (world, rank) == (self.world, self.rank) and self._storage_key(local) == self._key

    def fresh(self, local):
        """The bytes were made from the master's current values."""
        return self.version is not None and self.version == local._version

    # -- the entries that travel

    def _shared_positions(self):
        """Byte positions in the packed buffer of the shared entries (a LongTensor)."""
        (row_off, col_off), = self.wb.slots()
        idx = []
        for p in self.planes:
            off = row_off if p == "row" else col_off
            nbr, per = _mx_region(p, self.rows, self.cols)
            if not self.even:
                idx.append(torch.arange(off, off + nbr * per))
                continue
            for b in G.shared_block_rows(self.rows, self.world, G.block_height("mxfp8", p)):
                idx.append(torch.arange(off + b * per, off + (b + 1) * per))
        pos = torch.cat(idx) if idx else torch.zeros(0, dtype=torch.long)
        if pos.numel() != shared_entry_count(self.spec, self.rows, self.cols, self.world):
            raise AssertionError("mxshard: shared entry count differs from its geometry")
        return pos.to(self.device)

    def partial(self):
        self.wb.partial()

    def entries(self):
        """The shared entries after partial, as int32 (this rank's partial values)."""
        return self.wb.packed[self.shared].to(torch.int32)

    def set_entries(self, reduced):
        """Writes the reduced shared entries back (and a clear status byte) before apply."""
        self.reduced = reduced.clone()
        self.wb.packed[self.shared] = reduced.to(torch.uint8)
        self.wb.packed[self.wb.status_offset] = 0

    def apply(self, version):
        """The cast of the shard into the fragments, complete scales; then this rank's scale
        windows into the send buffers. `version`: the master's version these bytes come from."""
        self.wb.apply()
        for p, buf in self.send_scale.items():
            b0, b1, _ = _scale_window(p, self.rows, self.world, self.rank)
            win = self.scales[p][b0:b1].reshape(-1)
            buf[:win.numel()].copy_(win)
        self.version = version
        self.cached = None

    # -- the all-gather of one plane

    def send(self, plane):
        """FSDP2's all-gather inputs for `plane` (same count, shapes and dtypes for every plane): the
        data and this rank's scale window when evenly sharded over several ranks, else the data."""
        if self.scales_travel:
            return (self.send_data[plane], self.send_scale[plane])
        return (self.send_data[plane],)

    def compact_scales(self, plane, outputs):
        """The complete COMPACT scales of `plane` from the gathered outputs (even) or from the
        reduction (uneven) or the unit itself (a world of one). A view when it can be one."""
        if not self.scales_travel:
            return self.scales[plane]
        nbr, per = _mx_region(plane, self.rows, self.cols)
        g = outputs[1].view(self.world, -1)
        T = _scale_window(plane, self.rows, self.world, 0)[2]
        if plane == "row":  # every rank sends its S rows: the concatenation is the plane
            return g[:, :T * per].contiguous().view(-1)[:nbr * per].view(nbr, per)
        out = torch.empty(nbr, per, dtype=torch.uint8, device=g.device)
        for k in range(self.world):  # a shared block row comes from each toucher, with equal bytes
            b0, b1, _ = _scale_window(plane, self.rows, self.world, k)
            out[b0:b1] = g[k, :(b1 - b0) * per].view(b1 - b0, per)
        return out

    def assemble(self, plane, outputs, scratch):
        """The gathered [R, C] primary of `plane` (an MXFP8Weight in the module's layout): data a
        view of the all-gather output, scales converted into `scratch` (uint8, scratch_bytes)."""
        R, C = self.rows, self.cols
        data = outputs[0].view(-1)[:R * C].view(R, C)
        shape = A.scale_shape(R, C, plane, self.spec.layout)
        scale = scratch[:math.prod(shape)].view(shape)
        convert_scales(R, C, plane, self.compact_scales(plane, outputs), "compact", self.spec.layout, out=scale)
        return MXFP8Weight(R, C, layout=self.spec.layout, **{f"{plane}_data": data, f"{plane}_scale": scale})

    def local_primary(self):
        """A world of one: the whole weight's primary (both planes it has) from the fragments."""
        R, C = self.rows, self.cols
        kw = {}
        for p in self.planes:
            shape = A.scale_shape(R, C, p, self.spec.layout)
            kw[f"{p}_data"] = self.send_data[p]
            kw[f"{p}_scale"] = convert_scales(R, C, p, self.scales[p], "compact", self.spec.layout,
                                              out=torch.empty(shape, dtype=torch.uint8, device=self.device))
        return MXFP8Weight(R, C, layout=self.spec.layout, **kw)

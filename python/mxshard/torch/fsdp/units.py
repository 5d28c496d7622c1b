# SPDX-License-Identifier: MIT
"""WeightUnit: one converted weight's quantized bytes on one rank, made by the
library's sharded writeback from this rank's rows of the master.

    rank k holds rows [r0, r1) of the [R, C] master (FSDP2's dim-0 shard; all of it in a world of one)

    partial   the library's partial exponents (MXFP8) / block amaxes (NVFP4) of the shard
              (BucketWriteback / NVFP4BucketWriteback of one item, group=None: no collective)
    entries   the packed entries other ranks also write ("shared"), widened to int32, for the
              model's ONE MAX all-reduce (FSDPGroup.refresh):
                 evenly sharded   the blocks two ranks touch (column planes and 16x16 tiles cut by
                                  a boundary that is not a multiple of the block height) and
                                  NVFP4's tensor amax; a row-only MXFP8 weight has none
                 unevenly         every entry of the weight: FSDP2 then all-gathers inputs of the
                                  padded shard's shape only, so the scales cannot travel with
                                  the data and every rank takes them from the reduction
    apply     the library casts the shard into FRAGMENTS (this rank's bytes of each data plane /
              NVFP4 column stage, at the front of a padded send buffer) and writes complete
              COMPACT scale planes (right for every block this rank touches; all when uneven)
    send      the all-gather inputs of one plane: (data, this rank's scale window) when evenly
              sharded over several ranks, (data,) otherwise
    assemble  after the all-gather: the [R, C] primary of that plane in the module's layout

The master's values reach the bytes only through the library's writeback (the
format's rules live there); this module moves bytes and picks entries, by the
packed layout of contract sections 4.2 (MXFP8) and 9.8 (NVFP4).
"""
from __future__ import annotations

import math

import torch

from ... import fsdp_geometry as G
from ...nvfp4 import nvfp4_stage_to_col

__all__ = ["WeightUnit", "shared_entry_count", "scratch_bytes", "check_supported", "pack_partials",
           "apply_reduced"]

_RT = {"bf16": "bf16", "f16": "f16", "none": None}
_U8 = torch.uint8
_MASTER_DTYPES = (torch.float32, torch.bfloat16, torch.float16)   # what the library's writeback reads


# ---- pure geometry of one weight: the format value's (spec.fmt, mxshard.formats) -------------

def _planes(spec):
    return ("row", "col") if spec.planes == "both" else ("row",)


def shared_entry_count(spec, rows, cols, world):
    """How many packed entries of this weight travel in the model's reduction (pure: every rank
    computes the same number): NVFP4's tensor amax, and the cut blocks (all blocks when uneven)."""
    fmt = spec.fmt
    n = fmt.amax_entries(world)
    for _, h, nbr, per, _, _ in fmt.regions(rows, cols, spec.planes, spec.block):
        if not G.is_even(rows, world):
            n += nbr * per
        else:
            n += len(G.shared_block_rows(rows, world, h)) * per
    return n


def _scale_window(fmt, plane, rows, world, rank):
    """(b0, b1, T): the compact scale indices rank `rank` sends for `plane` (rows of the compact
    plane, or its columns for NVFP4's column plane [cols, ceil(rows/16)]) and the padded count
    every rank sends."""
    h = fmt.scale_height(plane)
    b0, b1 = G.touched_block_rows(*G.rank_rows(rows, world, rank), h)
    return b0, b1, G.max_touched(rows, world, h)


def _send_scale_bytes(spec, rows, cols, world):
    """Bytes of the scale input of one gather (the larger plane's window, padded)."""
    fmt = spec.fmt
    return max(G.max_touched(rows, world, fmt.scale_height(p)) * fmt.window_unit(rows, cols, p) for p in _planes(spec))


def scratch_bytes(spec, rows, cols):
    """Bytes of the per-weight scratch FSDP2 allocates and frees with the unsharded weight: a
    plane's scales in the module's layout, and for NVFP4 room for a compacted or transposed
    data plane (and the stage it comes from)."""
    return spec.fmt.scratch_bytes(rows, cols, spec.planes, spec.layout)


def check_supported(spec, rows, cols, world, name):
    """What the library's writeback cannot do on FSDP2's shards (Format.check_shards: NVFP4 needs
    every shard to start at an even element). Raises the same error on every rank."""
    spec.fmt.check_shards(rows, cols, world, name)


# ---- the unit ------------------------------------------------------------------------------

class WeightUnit:
    """The quantized state of one weight on this rank (see the module docstring). Built for a
    given master storage, world and rank; `matches()` says whether it still fits."""

    def __init__(self, meta, local, world, rank):
        spec = meta.spec
        R, C = meta.rows, meta.cols
        r0, r1 = G.rank_rows(R, world, rank)
        if tuple(local.shape) != (r1 - r0, C):
            raise ValueError(f"mxshard: {meta.name}: this rank holds a master of shape {tuple(local.shape)}, "
                             f"FSDP2's dim-0 shard of [{R}, {C}] over {world} ranks is [{r1 - r0}, {C}] (rank "
                             f"{rank}); quantized weights need fully_shard's default Shard(0) placement")
        if not local.is_contiguous():
            raise ValueError(f"mxshard: {meta.name}: the master shard is not contiguous")
        if local.dtype not in _MASTER_DTYPES:
            raise ValueError(f"mxshard: keep {meta.name}.weight in float32, bfloat16 or float16 (e.g. model.float(), "
                             f"or leave {meta.name} out of convert()): its master is {local.dtype}, which the "
                             f"{spec.fmt.name} writeback does not read (model.double() casts it)")
        fmt = self.fmt = spec.fmt
        fmt.check_shards(R, C, world, meta.name)
        self.meta, self.spec, self.world, self.rank = meta, spec, world, rank
        self.rows, self.cols, self.r0, self.r1 = R, C, r0, r1
        self.even = G.is_even(R, world)
        # the scales travel beside the data only when FSDP2 takes inputs of any shape (evenly
        # sharded) and gathers them all (a world of one copies the first input alone)
        self.scales_travel = self.even and world > 1
        self.planes = _planes(spec)
        dev = self.device = local.device
        self._key = self._storage_key(local)
        self.local = local
        self.scales = {p: torch.zeros(fmt.scale_shape(R, C, p, "compact"), dtype=_U8, device=dev)
                       for p in self.planes}
        dshape = fmt.data_send_shape(R, C, world)
        # the data planes this rank sends: "row", and "col" (MXFP8's column plane, NVFP4 1x16's
        # column stage); a 16x16 NVFP4 weight sends its row plane for both (finish's source)
        self.send_data = {p: torch.zeros(dshape, dtype=_U8, device=dev)
                          for p in fmt.send_sources(spec.planes, spec.block)}
        # the library's writeback of this rank's rows into the fragments and the compact scales
        self.primary, self.wb = fmt.fsdp_writeback(
            R, C, self.scales, local.reshape(-1), r0 * C, (r1 - r0) * C, self.send_data, block=spec.block,
            rounding=spec.rounding, round_through=_RT[spec.round_through])
        self.amax = self.primary.amax if fmt.has_amax else None   # NVFP4's tensor amax (every plane's)
        nscale = _send_scale_bytes(spec, R, C, world)
        self.send_scale = {p: torch.zeros(max(nscale, 1), dtype=_U8, device=dev) for p in self.planes} \
            if self.scales_travel else {}
        # per plane sent: this rank's scale window (b0, b1, T) and whether the compact plane is
        # transposed (the window a range of its columns)
        self.windows = {p: _scale_window(fmt, p, R, world, rank) + (fmt.scales_transposed(p),)
                        for p in self.send_scale}
        self.shared = self._shared_positions()
        self.n_shared = int(self.shared.numel())
        self.assembly = {}   # plane -> _Assembly (prepared at the plane's first gather)
        self.reduced = None  # the reduced shared entries of the last refresh (int32)
        self.version = None  # the master's version the bytes were made from (None: never)
        self.made = 0        # how many times apply() made the bytes (refreshes of the same version included)
        self.cached = None   # a world of one: the whole primary (FSDPGroup.local_primary)

    # -- identity

    @staticmethod
    def _storage_key(local):
        return (local.data_ptr(), tuple(local.shape), local.dtype, local.device)

    def matches(self, local, world, rank):
        """Built for this very master storage, world and rank."""
        return (world, rank) == (self.world, self.rank) and self._storage_key(local) == self._key

    def fresh(self, local):
        """The bytes were made from the master's current values (its version counter, and the
        writes counted on its WeightMeta: see master)."""
        return self.version is not None and self.version == (local._version, self.meta.writes_to(local))

    # -- the entries that travel

    def _shared_positions(self):
        """Entry positions in the packed buffer of the shared entries (a LongTensor)."""
        spec, R, C = self.spec, self.rows, self.cols
        offs, amax = self.fmt.slot_offsets(self.wb, self.world)
        idx = [torch.tensor([amax])] if amax is not None else []
        for region, h, nbr, per, row_step, col_step in self.fmt.regions(R, C, spec.planes, spec.block):
            off = offs[region]
            rows_of_blocks = range(nbr) if not self.even else G.shared_block_rows(R, self.world, h)
            for b in rows_of_blocks:
                idx.append(off + b * row_step + torch.arange(per) * col_step)
        pos = torch.cat(idx) if idx else torch.zeros(0, dtype=torch.long)
        if pos.numel() != shared_entry_count(spec, R, C, self.world):
            raise AssertionError("mxshard: shared entry count differs from its geometry")
        return pos.to(self.device)

    def partial(self):
        self.wb.partial()

    def entries(self):
        """The shared entries after partial, as int32 (this rank's partial values)."""
        view = self.fmt.entry_view(self.wb)   # uint8 (MXFP8), int16 / int32 patterns (NVFP4)
        e = view[self.shared].to(torch.int32)
        return e & 0xFFFF if view.dtype == torch.int16 else e

    def set_entries(self, reduced):
        """Writes the reduced shared entries back (and a clear status) before apply."""
        self.reduced = reduced.clone()
        view = self.fmt.entry_view(self.wb)
        view[self.shared] = reduced.to(view.dtype)
        self.fmt.clear_status(self.wb)

    def apply(self, version):
        """The cast of the shard into the fragments, complete scales; then this rank's scale
        windows into the send buffers. `version`: the master's version these bytes come from. The
        group's status was read from the reduction (FSDPGroup.refresh): no status read here (on
        CUDA: no synchronisation per weight)."""
        self.wb.apply(check_status=False)
        for p, buf in self.send_scale.items():
            b0, b1, T, transposed = self.windows[p]
            sc = self.scales[p]
            if transposed:                  # [unit, T]: this rank's columns first (_Assembly's index)
                buf[:sc.shape[0] * T].view(sc.shape[0], T)[:, :b1 - b0].copy_(sc[:, b0:b1])
            else:                           # [T, unit]: this rank's rows first
                buf[:(b1 - b0) * sc.shape[1]].view(b1 - b0, sc.shape[1]).copy_(sc[b0:b1])
        self.version = (version, self.meta.writes_to(self.local))
        self.made += 1
        self.cached = None

    # -- the all-gather of one plane

    def _data_source(self, plane):
        return plane if plane in self.send_data else "row"

    def send(self, plane):
        """FSDP2's all-gather inputs for `plane` (same count, shapes and dtypes for every plane): the
        data and this rank's scale window when evenly sharded over several ranks, else the data."""
        data = self.send_data[self._data_source(plane)]
        if self.scales_travel:
            return (data, self.send_scale[plane])
        return (data,)

    def assemble(self, plane, outputs, scratch):
        """The gathered [R, C] primary of `plane` in the module's layout: data a view of the
        all-gather output (or rebuilt in `scratch`), scales converted into `scratch`. Through
        the plane's prepared _Assembly: built at its first gather, tensors bound per gather."""
        a = self.assembly.get(plane)
        if a is None:
            a = self.assembly[plane] = _Assembly(self, plane)
        return a.bind(outputs, scratch)

    def local_primary(self):
        """A world of one: the whole weight's primary (every plane it has) from the fragments."""
        R, C = self.rows, self.cols
        planes = {}
        for p in self.planes:
            outs = (self.send_data[self._data_source(p)],)
            scratch = torch.empty(scratch_bytes(self.spec, R, C), dtype=_U8, device=self.device)
            planes[p] = self.assemble(p, outs, scratch)
        if len(planes) == 1:
            return planes["row"]
        r, c = planes["row"], planes["col"]
        return self.fmt.weight(R, C, layout=self.spec.layout, block=self.spec.block, amax=self.amax,
                               row_data=r.row_data, row_scale=r.row_scale, col_data=c.col_data, col_scale=c.col_scale)


# ---- the ONE reduction of many units (FSDP2's refresh, ShardedOptimizer's writeback) ---------

def pack_partials(units, counts, wire):
    """Every unit's partial, then its `count` shared entries into `wire` in unit order: the
    payload of the model's one MAX all-reduce (its last entry, the status, is the caller's)."""
    at = 0
    for u, c in zip(units, counts):
        u.partial()
        if c:
            wire[at:at + c] = u.entries()
        at += c


def apply_reduced(units, counts, wire, versions):
    """After the reduction: every unit's reduced entries back, then its apply (bytes of the master
    version in `versions`)."""
    at = 0
    for u, c, v in zip(units, counts, versions):
        if c:
            u.set_entries(wire[at:at + c])
        at += c
        u.apply(v)


# ---- the prepared assembly of one plane ------------------------------------------------------

class _Assembly:
    """What assembling one plane of one weight needs that depends on the geometry only, built
    once (the cuBLASLt pattern: a prepared object, tensors bound per call): the scale layouts'
    shapes and the library's codes, one gather index that takes the complete COMPACT scales out
    of the all-gather output (no loop over ranks), the copies that compact NVFP4's uneven
    fragments, and the primary object itself, whose planes are rebound at every gather (so the
    GEMM plan made for it is rebound too, gemm.paths, not rebuilt)."""

    def __init__(self, unit, plane):
        u, fmt, spec, R, C = unit, unit.fmt, unit.spec, unit.rows, unit.cols
        self.unit, self.plane = u, plane
        self.shape = fmt.scale_shape(R, C, plane, spec.layout)
        self.nsc = math.prod(self.shape)
        self.convert = fmt.scale_conversion(R, C, plane, "compact", spec.layout)
        names = self.names = (f"{plane}_data", f"{plane}_scale")
        # NVFP4: the gathered primary's own tensor amax, set from the unit's at each gather (an alias of
        # the unit's would move under a gathered weight FSDP2 keeps unsharded while a refresh runs:
        # old codes with the new amax, values of neither quantize)
        with torch.inference_mode(False):   # (a first gather may run inside inference mode)
            self._amax = amax = u.amax.clone() if u.amax is not None else None
        self._amax_at = None   # the unit's `made` the copy was taken at (one copy per refresh, not per gather; a
                               # refresh of the same version, after masters_changed or an unseen write, too)
        layout, block = spec.layout, spec.block
        self.build = lambda data, scale: fmt.weight(R, C, layout=layout, block=block, amax=amax,
                                                    **dict(zip(names, (data, scale))))
        self.primary = None
        # the scale window every rank sends: T indices of `unit` bytes ([unit, T] when transposed)
        self.window = (G.max_touched(R, u.world, fmt.scale_height(plane)), fmt.window_unit(R, C, plane))
        self.transposed = fmt.scales_transposed(plane)
        self.index = self._scale_index() if u.scales_travel else None
        # the gathered data: the plane's bytes (total), or a row-major stage of them that the
        # library transposes into the plane (a transposed plane: NVFP4's column plane)
        self.total, self.data_shape = fmt.plane_bytes(R, C), fmt.data_shape(R, C, plane)
        self.from_stage = fmt.transposed(plane)
        # every rank's fragment fills its send buffer (MXFP8; NVFP4 evenly sharded), so the
        # gathered buffers are the plane; else copies compact the fragments (NVFP4, uneven)
        S = G.chunk_rows(R, u.world)
        fills = math.prod(fmt.data_send_shape(R, C, u.world)) == fmt.fragment_bytes(0, S * C)
        self.segments = None if fills else self._packed_segments()

    # -- geometry, once

    def _scale_index(self):
        """(rank, row of its window) per index of the compact plane's window axis (the block row
        of a shared one from the first rank that touches it, equal bytes either way), as index
        tensors into the gathered windows viewed [world, T, unit] (NVFP4's column plane: [world,
        unit, T], its windows travel as [unit, T], see send_scale_window)."""
        u = self.unit
        ks, ts = [], []
        seen = 0
        for k in range(u.world):
            b0, b1, _ = _scale_window(u.fmt, self.plane, u.rows, u.world, k)
            for b in range(max(b0, seen), b1):
                ks.append(k)
                ts.append(b - b0)
            seen = max(seen, b1)
        dev = u.device
        return torch.tensor(ks, dtype=torch.long, device=dev), torch.tensor(ts, dtype=torch.long, device=dev)

    def _packed_segments(self):
        """NVFP4 on uneven shards: [(first rank, ranks, dst byte offset, bytes per rank)] copies
        that put every rank's fragment at its place in the packed plane: the full shards in one
        copy, the short one in another (empty ranks send nothing)."""
        u, fb = self.unit, self.unit.fmt.fragment_bytes
        full = [k for k in range(u.world) if G.rank_rows(u.rows, u.world, k)[1] - G.rank_rows(u.rows, u.world, k)[0]
                == G.chunk_rows(u.rows, u.world)]
        segs = []
        if full:
            nb = fb(0, G.chunk_rows(u.rows, u.world) * u.cols)
            segs.append((0, len(full), 0, nb))
        for k in range(len(full), u.world):
            r0, r1 = G.rank_rows(u.rows, u.world, k)
            if r1 > r0:
                segs.append((k, 1, fb(0, r0 * u.cols), fb(r0 * u.cols, (r1 - r0) * u.cols)))
        return segs

    # -- per gather

    def compact_scales(self, outputs):
        """The complete COMPACT scales of the plane: gathered (one index per window row, one
        kernel), or the unit's own (from the reduction when uneven; a world of one)."""
        u = self.unit
        if self.index is None:
            return u.scales[self.plane]
        ks, ts = self.index
        t, unit = self.window
        g = outputs[1].view(u.world, -1)
        n = g.shape[1]
        if self.transposed:
            w = g.as_strided((u.world, unit, t), (n, t, 1))
            return w[ks, :, ts].t().contiguous()         # [unit (columns), block rows]
        w = g.as_strided((u.world, t, unit), (n, unit, 1))
        return w[ks, ts]                                  # [block rows, unit]

    def _packed(self, outputs, scratch):
        """The gathered plane's bytes (or its stage): a view of the all-gather output when every
        rank's fragment fills its send buffer, else the fragments compacted into scratch."""
        if self.segments is None:
            return outputs[0].view(-1)[:self.total], scratch
        g = outputs[0].view(self.unit.world, -1)
        dst, rest = scratch[:self.total], scratch[self.total:]
        for k, nk, off, nb in self.segments:
            dst[off:off + nk * nb].view(nk, nb).copy_(g[k:k + nk, :nb])
        return dst, rest

    def bind(self, outputs, scratch):
        scale, rest = scratch[:self.nsc].view(self.shape), scratch[self.nsc:]
        self.convert.run(self.compact_scales(outputs), scale)   # (contiguous uint8 planes of the layouts' sizes)
        packed, rest = self._packed(outputs, rest)
        if not self.from_stage:
            return self._rebind(packed.view(self.data_shape), scale)
        data = rest[:self.total].view(self.data_shape)
        return nvfp4_stage_to_col(self._rebind(data, scale), packed)

    def _rebind(self, data, scale):
        """The primary object of this plane, built (and checked) at the first gather; later
        gathers bind its plane's tensors, which have the same shapes, dtypes and device by
        construction."""
        w = self.primary
        if w is None:
            w = self.primary = self.build(data, scale)
        else:
            setattr(w, self.names[0], data)
            setattr(w, self.names[1], scale)
        if self._amax is not None and self._amax_at != self.unit.made:
            self._amax.copy_(self.unit.amax)
            self._amax_at = self.unit.made
        return w

# SPDX-License-Identifier: MIT
"""NVFP4BucketWriteback: sharded masters -> NVFP4 primaries with ONE packed
MAX all-reduce per bucket (block amaxes and tensor amaxes), byte all-gathers
of the row-wise planes and column stages, then finish's local transpose
(docs/contract.md section 9.8; <mxshard/nvfp4_writeback.h>).

    wb = NVFP4BucketWriteback([(w0, m0, start0), (w1, m1, start1, len1), ...],
                              round_through="bf16")   # once
    for step in ...:
        optimizer.step()        # updates the master shards in place
        wb.run(group)           # partial -> all_reduce(MAX) -> apply -> gather -> finish

The weight and the whole-tensor operations are nvfp4.py's; the group setup,
the byte gathers and the collective sequence are _bucket.py's (BucketBase,
shared with MXFP8's BucketWriteback).
"""
from __future__ import annotations

import ctypes
from collections import namedtuple

import numpy as np

from . import _arrays as A
from . import _lib as L
from . import collectives as C
from ._bucket import BucketBase, add_region, build_then_setup, item_shard, merged_regions, run_group_protocol
from ._plumbing import zeros as _zeros
from .nvfp4 import NVFP4Weight, _packed_bytes, _weight_arrs, nvfp4_fragment_bytes, nvfp4_struct

__all__ = ["NVFP4BucketWriteback", "NVFP4WritebackItem"]

NVFP4WritebackItem = namedtuple("NVFP4WritebackItem", "primary master start length col_stage row_fragment "
                                "stage_fragment", defaults=(None, None, None, None))


def _as_item(x, i):
    if isinstance(x, NVFP4WritebackItem):
        return x
    if isinstance(x, dict):
        return NVFP4WritebackItem(**x)
    if isinstance(x, (tuple, list)) and 3 <= len(x) <= 7:
        return NVFP4WritebackItem(*x)
    raise TypeError(f"item {i}: expected (primary, master, start[, length[, col_stage[, row_fragment[, "
                    f"stage_fragment]]]]), got {type(x).__name__}")


def _needs_stage(w: NVFP4Weight):
    """A column-wise plane needs a stage unless 16x16 with a row-wise plane
    (then finish transposes the gathered row-wise plane)."""
    return w.has_col and not (w.block == L.NVFP4_16X16 and w.has_row)


def _col_to_fragment(w: NVFP4Weight, stage, frags):
    """Whether the item's column-wise values go to a fragment (contract 9.8):
    a stage fragment, or (16x16 without a stage) a row fragment. finish()
    skips it; the caller gathers, then nvfp4_stage_to_col."""
    return "stage" in frags or (stage is None and not _needs_stage(w) and "row" in frags)


def _wire_plan(entry_bytes):
    """How the packed entries travel in the ONE all-reduce (MAX): neither gloo
    nor NCCL reduces 16-bit integers (nor uint32 on gloo), so
      4-byte entries  in place, viewed as int32: f32 patterns of amaxes >= 0
                      and the status entry 0x01010101 are all below 2^31, so
                      int32 order is their order;
      2-byte entries  widened to int32 (exact for every uint16), reduced, and
                      narrowed back: 4 bytes per block on the wire.
    Returns (view_in_place, wire_elem_dtype_name)."""
    return (entry_bytes == 4, "int32")


class NVFP4BucketWriteback(BucketBase):
    """One bucket of NVFP4 weights written back together: sharded masters ->
    NVFP4 primaries, every rank ending with data, scales and amax equal to a
    whole-tensor quantize_nvfp4 of the full master.

    items: (primary, master, start[, length[, col_stage[, row_fragment[, stage_fragment]]]])
        primary    NVFP4Weight (numpy arrays, CPU tensors or CUDA tensors)
        master     this rank's shard: `length` f32/bf16/f16 elements, element
                   0 is flat index `start`; boundaries even (a boundary may be
                   rows*cols), else RangeError before any collective
        length     defaults to master's size; 0 = this rank owns nothing
        col_stage  optional ceil(rows*cols/2)-byte stage for the column-wise
                   plane; allocated (one buffer per bucket) when needed
        row_fragment, stage_fragment
                   optional (FSDP): nvfp4_fragment_bytes(start, length)-byte
                   outputs that receive the shard's bytes [start//2,
                   ceil(end/2)) of the row-wise plane / of the column stage
                   instead (contract 9.8); the primary's row_data (col_data)
                   may then be None. run() gathers neither and finish()
                   skips the items whose column values are in fragments:
                   gather them, then nvfp4_stage_to_col
    round_through: 'bf16' (default: TE's master cast, 2-byte entries), None
        or 'f16' (4-byte entries);
    group: optional torch.distributed group: validates across ranks now (a
        rank whose items fail makes every rank raise here);
    gather: run() all-gathers the row-wise planes and the stages, then runs
        finish (default True);
    raw16: what a uint16/int16 master holds, 'bf16' (default) or 'f16'.

    Each run(): partial -> ONE all_reduce(MAX) -> status check -> apply ->
    byte all-gathers (row-wise plane, column stage) -> finish.
    """

    def __init__(self, items, round_through="bf16", group=None, gather=True, raw16="bf16"):
        self._closed = True
        self._fault = None  # tests: a rank-local failure before partial's C call
        self._setups = {}
        self._gather_enabled = bool(gather)
        build_then_setup(self, group,
                          lambda: self._build([_as_item(x, i) for i, x in enumerate(items)], round_through, raw16))

    # ---- build --------------------------------------------------------------

    def _build(self, items, round_through, raw16):
        n = len(items)
        arrs, stage_need, per = [], 0, []
        for i, it in enumerate(items):
            w = it.primary
            if not isinstance(w, NVFP4Weight):
                raise TypeError(f"item {i}: primary must be an NVFP4Weight, got {type(w).__name__}")
            m, mdt, start, length = item_shard(i, it, w, raw16)
            frags = {}
            for pn, f, has in (("row", it.row_fragment, w.has_row), ("stage", it.stage_fragment, w.has_col)):
                if f is None:
                    continue
                fa = A.check_bytes(A.arr(f, f"item {i} {pn}_fragment").writable(), "fragment")
                if not has:
                    raise ValueError(f"item {i}: {pn}_fragment given but the primary has no "
                                     f"{'row' if pn == 'row' else 'column'}-wise plane")
                need = nvfp4_fragment_bytes(start, length)
                if fa.numel != need:
                    raise ValueError(f"item {i}: {pn}_fragment has {fa.numel} bytes, the shard [{start}, "
                                     f"{start + length}) needs {need}")
                frags[pn] = fa
                arrs.append(fa)
            if w.has_row and w.row_data is None and "row" not in frags:
                raise ValueError(f"item {i}: the row-wise plane has neither data nor a fragment")
            stage = None
            if it.col_stage is not None:
                if not w.has_col:
                    raise ValueError(f"item {i}: col_stage given but the primary has no column-wise plane")
                stage = A.check_bytes(A.arr(it.col_stage, f"item {i} col_stage").writable(), "stage")
                if stage.numel != _packed_bytes(w.numel):
                    raise ValueError(f"item {i}: col_stage has {stage.numel} bytes, the {w.rows}x{w.cols} "
                                     f"weight needs {_packed_bytes(w.numel)}")
                arrs.append(stage)
            elif _needs_stage(w) and "stage" not in frags:
                stage_need += _packed_bytes(w.numel)
            if w.has_col and w.col_data is None and not _col_to_fragment(w, it.col_stage, frags):
                raise ValueError(f"item {i}: the column-wise plane has no data and its values go to no fragment")
            arrs += _weight_arrs(w)
            if length > 0:
                arrs.append(m)
            per.append((w, m, mdt, start, length, stage, frags))
        kinds = {a.kind for a in arrs}
        if len(kinds) > 1:
            raise ValueError("NVFP4BucketWriteback: mix of numpy arrays and torch tensors")
        self.device = A.same_device(arrs, "NVFP4BucketWriteback")
        self._keep_arrays(arrs)
        self.is_torch = kinds == {"torch"}
        self.is_cuda = self.device != "cpu"
        # CUDA tensors: <mxshard/cuda_nvfp4.h>'s phases (UnsupportedError when the library lacks them)
        self._cu = L.nvfp4_cuda("NVFP4BucketWriteback", need=L._NVFP4_CUDA_WB) if self.is_cuda else None
        # one stage buffer for every item that needs one: one gather for all of them
        self._stage_buf = _zeros((max(stage_need, 1),), self.device if self.is_torch else None)
        citems = (L.Nvfp4WbItem * max(n, 1))()
        self._keep, self._stages, self._frags, at = [], [], [], 0
        for i, (w, m, mdt, start, length, stage, frags) in enumerate(per):
            if stage is None and _needs_stage(w) and "stage" not in frags:
                nb = _packed_bytes(w.numel)
                stage = A.arr(self._stage_buf[at:at + nb], f"item {i} col_stage")
                at += nb
            c = citems[i]
            c.primary = nvfp4_struct(w)
            c.master = m.ptr if length > 0 else None
            c.master_dtype = mdt
            c.start, c.len = start, length
            c.col_stage = stage.ptr if stage is not None else None
            c.row_fragment = self._fragment_ptr(frags.get("row"))
            c.stage_fragment = self._fragment_ptr(frags.get("stage"))
            self._stages.append(stage)
            self._frags.append(frags)
            self._keep.append((w, m.obj, stage.obj if stage is not None else None,
                               tuple(f.obj for f in frags.values())))
        b = L.Nvfp4WbBatch()
        b.items = ctypes.cast(citems, ctypes.POINTER(L.Nvfp4WbItem))
        b.n_items = n
        b.round_through = A.round_through_code(round_through)
        nv = L.nvfp4_host()
        plan = L.Nvfp4WbPlan()
        st = nv.wb_make_plan(ctypes.byref(b), ctypes.byref(plan), None)
        if st != 0:
            self._raise_plan_error(nv, st, citems, per)
        self.n_items, self.items, self._primaries = n, items, [p[0] for p in per]
        self._citems, self._batch, self.plan = citems, b, plan
        self.entry_bytes = int(plan.entry_bytes)
        self.packed_count = int(plan.packed_count)
        self.packed_bytes = int(plan.packed_bytes)
        self.status_offset = int(plan.status_offset)
        # allocated as entries, so aligned to entry_bytes; used as bytes
        edt = "uint16" if self.entry_bytes == 2 else "uint32"
        if self.is_torch:
            t = A.torch_mod()
            self.packed = t.zeros(self.packed_count, dtype=getattr(t, edt), device=self.device).view(t.uint8)
            pptr = self.packed.data_ptr()
        else:
            self.packed = np.zeros(self.packed_count, dtype=edt).view(np.uint8)
            pptr = self.packed.ctypes.data
        if self.is_cuda:
            self._tdev = t.device(self.device)
            self._status_dev = self.packed[self.status_offset:self.status_offset + 1]
            self._status_host = t.zeros(1, dtype=t.uint8, pin_memory=True)
        else:
            self._packed_np = self.packed.numpy() if self.is_torch else self.packed
        self._bp, self._pp = ctypes.byref(b), ctypes.byref(plan)
        self._packed_ptr = ctypes.c_void_p(pptr)
        self._nv = nv
        self._wire = None
        self._cuda_bucket = None
        if self.is_cuda and all(getattr(self._cu, n, None) is not None for n in L._NVFP4_CUDA_BUCKET):
            self._prepare_cuda()
        self._closed = False

    def _prepare_cuda(self):
        """The prepared bucket (mxs_cuda_nvfp4_wb_prepare): every phase one
        kernel for any number of items, with no per-call validation. The batch
        never changes after construction (its buffers are fixed), so it is
        prepared once; a library without the bucket calls runs the unprepared
        ones."""
        t = A.torch_mod()
        cu = self._cu
        ws = ctypes.c_int64(0)
        L.check(cu.prepare_bytes(self._bp, ctypes.byref(ws)), "mxs_cuda_nvfp4_wb_prepare_bytes")
        self._workspace = t.empty(max(int(ws.value), 16), dtype=t.uint8, device=self.device)
        size = int(cu.bucket_size())
        self._bucket_mem = (ctypes.c_uint64 * ((size + 7) // 8))()
        bptr = ctypes.addressof(self._bucket_mem)
        with t.cuda.device(self._tdev):
            L.check(cu.prepare(bptr, self._bp, self._pp, self._packed_ptr.value, self._workspace.data_ptr(),
                               int(ws.value), self._stream()), "mxs_cuda_nvfp4_wb_prepare")
        self._cuda_bucket = ctypes.c_void_p(bptr)

    @staticmethod
    def _raise_plan_error(nv, st, citems, per):
        """The plan's error, named after the first item that fails on its own
        (with the even rule spelt out), else the batch's (overlaps)."""
        for i, (w, _m, _dt, start, length, _s, _f) in enumerate(per):
            si = nv.wb_item_check(ctypes.byref(citems[i]))
            if si == 0:
                continue
            where = f"NVFP4BucketWriteback item {i}"
            if si == L.status_code("MXS_ERR_RANGE"):
                where += (f": the shard [{start}, {start + length}) of the {w.rows}x{w.cols} weight has an odd "
                          f"boundary; two elements share a byte, so a non-empty NVFP4 shard must start at an even "
                          f"flat index and end at an even one or at rows*cols ({w.numel}): place weights at even "
                          f"bucket offsets and pad the bucket to a multiple of 2*nranks")
            raise L.status_error(si, where)
        raise L.status_error(st, "mxs_nvfp4_wb_make_plan")

    # ---- the protocol -------------------------------------------------------

    def _check_open(self):
        if self._closed:
            raise ValueError("NVFP4BucketWriteback: build a new writeback: this one was closed")

    def _mark_failed(self):
        """Zero the packed buffer, every byte of the status entry 1."""
        if self.is_cuda:
            self.packed.zero_()
            self.packed[self.packed_bytes - self.entry_bytes:] = 1
        else:
            self._packed_np[:] = 0
            self._packed_np[self.packed_bytes - self.entry_bytes:] = 1

    def partial(self):
        """Step 2: zero the packed buffer and write this rank's partial block
        amaxes. On failure the buffer is marked failed (zeros, status entry
        1) and the error raised: the caller must still run its reduction."""
        try:
            self._check_open()
            if self._fault is not None:
                raise self._fault
            if self._cuda_bucket is not None:
                L.check(self._cu.bucket_partial(self._cuda_bucket, self._stream()), "mxs_cuda_nvfp4_wb_bucket_partial")
            elif self.is_cuda:
                st = self._cu.wb_partial(self._bp, self._pp, self._packed_ptr, self._stream())
                L.check(st, "mxs_cuda_nvfp4_wb_partial")
            else:
                L.check(self._nv.wb_partial(self._bp, self._pp, self._packed_ptr), "mxs_host_nvfp4_wb_partial")
        except Exception:
            if not self._closed:
                self._mark_failed()
            raise

    def slots(self):
        """Where each item's entries sit in `packed` (mxs_nvfp4_wb_slot): per item a dict of ENTRY
        indices row_entry, col_entry, tile_entry, amax_entry (-1: region absent). Within a
        region, the COMPACT order of contract 9.8: 1x16 row blocks (m, k) at m*ceil(cols/16) + k,
        column blocks (column c, block b) at c*ceil(rows/16) + b, 16x16 tiles (R, C) at
        R*ceil(cols/16) + C."""
        if self._closed:
            raise ValueError("NVFP4BucketWriteback: closed")
        slots = (L.Nvfp4WbSlot * max(self.n_items, 1))()
        plan = L.Nvfp4WbPlan()
        L.check(self._nv.wb_make_plan(self._bp, ctypes.byref(plan), slots), "mxs_nvfp4_wb_make_plan")
        names = ("row_entry", "col_entry", "tile_entry", "amax_entry")
        return [{n: int(getattr(slots[i], n)) for n in names} for i in range(self.n_items)]

    def status(self):
        """The group status byte (after the reduction: nonzero when any rank
        failed). CUDA: one 1-byte copy + stream sync."""
        if self.is_cuda:
            self._status_host.copy_(self._status_dev, non_blocking=True)
            A.torch_mod().cuda.current_stream(self._tdev).synchronize()
            return int(self._status_host[0])
        return int(self._packed_np[self.status_offset])

    def entries(self):
        """The packed buffer as its entries: a uint16 or uint32 view (numpy
        on the host, torch on a GPU)."""
        if self.is_cuda:
            t = A.torch_mod()
            return self.packed.view(t.uint16 if self.entry_bytes == 2 else t.uint32)
        return self._packed_np.view(np.uint16 if self.entry_bytes == 2 else np.uint32)

    def apply(self, check_status=True):
        """Step 4, after the MAX reduction: RemoteError when the status byte
        is set; else global amaxes, every scale, and the cast of this rank's
        shards into the row-wise planes and the column stages.
        check_status=False: the caller already knows the group's verdict (it
        reduced the status entry itself): no status read (on CUDA, no copy to
        the host and no stream synchronisation)."""
        self._check_open()
        if check_status and self.status() != 0:
            raise L.remote_error("NVFP4BucketWriteback.apply")
        if self._cuda_bucket is not None:
            L.check(self._cu.bucket_apply(self._cuda_bucket, self._stream()), "mxs_cuda_nvfp4_wb_bucket_apply")
        elif self.is_cuda:
            L.check(self._cu.wb_apply(self._bp, self._pp, self._packed_ptr, self._stream()), "mxs_cuda_nvfp4_wb_apply")
        else:
            L.check(self._nv.wb_apply(self._bp, self._pp, self._packed_ptr), "mxs_host_nvfp4_wb_apply")

    def finish(self):
        """Step 6, after the gather: the column-wise data planes from the
        gathered stages (or, 16x16 with both planes, the row-wise planes).
        Items whose column values went to fragments are skipped (gather the
        fragments, then nvfp4_stage_to_col)."""
        self._check_open()
        if self._cuda_bucket is not None:
            L.check(self._cu.bucket_finish(self._cuda_bucket, self._stream()), "mxs_cuda_nvfp4_wb_bucket_finish")
        elif self.is_cuda:
            L.check(self._cu.wb_finish(self._bp, self._pp, self._stream()), "mxs_cuda_nvfp4_wb_finish")
        else:
            L.check(self._nv.wb_finish(self._bp, self._pp), "mxs_host_nvfp4_wb_finish")

    def _wire_tensors(self):
        if self._wire is None:
            t = A.torch_mod()
            pt = self.packed if self.is_torch else t.from_numpy(self._packed_np)
            in_place, wdt = _wire_plan(self.entry_bytes)
            if in_place:
                self._wire = (pt.view(getattr(t, wdt)), None)
            else:
                self._wire = (t.zeros(self.packed_count, dtype=getattr(t, wdt), device=pt.device), pt.view(t.uint16))
        return self._wire

    def all_reduce(self, group=None):
        """Step 3 through torch.distributed: ONE all_reduce(MAX) of the packed
        entries (see _wire_plan for the element type on the wire)."""
        wire, narrow = self._wire_tensors()
        if narrow is not None:
            wire.copy_(narrow)
        C.all_reduce_max(wire, group)
        if narrow is not None:
            narrow.copy_(wire)

    def run(self, group=None, gather=None, error=None):
        """partial -> all_reduce(MAX, group) -> status check -> apply ->
        all-gathers -> finish. Without torch.distributed initialised and
        group None: a world of one. Raises the local error (after joining the
        collectives) or RemoteError when another rank failed. With
        gather=False the caller gathers, then calls finish(). error: an
        exception this rank already has (e.g. from its optimizer step): the
        rank skips partial, marks its buffer failed, joins the all-reduce and
        raises it; the other ranks raise RemoteError (as BucketWriteback.run)."""
        if self.is_cuda and not self._closed:
            t = A.torch_mod()
            if self._tdev.index is not None and self._tdev.index != t.cuda.current_device():
                with t.cuda.device(self._tdev):
                    return self.run(group, gather, error)
        partial = self.partial if error is None else (lambda: self._fail_with(error))
        if run_group_protocol(self, group, gather, "NVFP4BucketWriteback", partial, self.apply):
            self.finish()

    def _fail_with(self, error):
        """run(error=...)'s partial: the buffer marked failed, then the error raised."""
        if not self._closed:
            self._mark_failed()
        raise error

    # ---- the gathered byte ranges (BucketBase's group setup reads them) ----

    def _plane_regions(self):
        """Per (buffer, storage): this rank's written byte intervals, merged:
        [start/2, ceil((start+len)/2)) of each row-wise plane and stage
        written in place (fragments are the caller's to gather)."""
        regions, order = {}, []
        for i in range(self.n_items if not self._closed else 0):
            w, c = self._primaries[i], self._citems[i]
            bufs = []
            if w.has_row and "row" not in self._frags[i]:
                bufs.append(("row", A.arr(w.row_data, f"item {i} row_data")))
            if self._stages[i] is not None and "stage" not in self._frags[i]:
                bufs.append(("stage", self._stages[i]))
            for kind, a in bufs:
                add_region(regions, order, kind, a, i, c.len > 0,
                            lambda off: (off + c.start // 2, off + (c.start + c.len + 1) // 2))
        return merged_regions(regions, order)

    # ---- lifetime -------------------------------------------------------------

    def close(self):
        """Releases the group setups (their gather schedules hold the process group)."""
        self._setups.clear()
        if self._cuda_bucket is not None:
            L.check(self._cu.bucket_release(self._cuda_bucket), "mxs_cuda_nvfp4_wb_bucket_release")
            self._cuda_bucket = None
        self._closed = True

    def __repr__(self):
        return (f"NVFP4BucketWriteback({self.n_items} items, {self.packed_count} x {self.entry_bytes} B entries)"
                if not self._closed else "NVFP4BucketWriteback(closed)")

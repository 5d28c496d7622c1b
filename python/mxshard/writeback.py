# SPDX-License-Identifier: MIT
"""Bucket writeback: sharded masters -> MXFP8 primaries with ONE packed MAX
all-reduce per bucket, then one byte all-gather per present plane.

    wb = BucketWriteback([(w0, m0, start0), (w1, m1, start1, len1), ...],
                         rounding="ceil", round_through="bf16")   # once
    for step in ...:
        optimizer.step()        # updates the master shards in place
        wb.run(group)           # partial -> all_reduce(MAX) -> apply -> gather

Built once: every argument is checked, the plan is made (and, for CUDA
tensors, the bucket prepared on the device); each run() is a few ctypes calls
with pre-built arguments plus the collectives. Masters' VALUES may change
between runs; their storage (and the primaries') must not move.

The group setup (the plan checked across ranks) and the byte all-gathers are
_bucket.py's BucketBase, shared with NVFP4BucketWriteback.

Group status byte: the packed buffer ends with one status byte. A rank that
fails before the reduction zero-fills its buffer, sets the byte to 1, still
joins the all-reduce, then raises its own error; every other rank sees the
byte, skips apply and raises RemoteError. Nobody hangs in a collective.
"""
from __future__ import annotations

import ctypes
from collections import namedtuple

import numpy as np

from . import _arrays as A
from . import _lib as L
from . import collectives as C
from ._bucket import BucketBase, add_region, build_then_setup, item_shard, merged_regions, run_group_protocol
from .ops import tensor_struct
from .weight import MXFP8Weight

WritebackItem = namedtuple("WritebackItem", "primary master start length row_fragment col_fragment",
                           defaults=(None, None, None))


def _as_item(x, i):
    if isinstance(x, WritebackItem):
        return x
    if isinstance(x, dict):
        return WritebackItem(**x)
    if isinstance(x, (tuple, list)):
        if len(x) == 5:  # (primary, master, start, length, (row_fragment, col_fragment))
            frags = x[4] if x[4] is not None else (None, None)
            if not isinstance(frags, (tuple, list)) or len(frags) != 2:
                raise ValueError(f"item {i}: fragments must be a (row_fragment, col_fragment) pair")
            return WritebackItem(x[0], x[1], x[2], x[3], frags[0], frags[1])
        if 3 <= len(x) <= 4:
            return WritebackItem(*x)
    raise TypeError(f"item {i}: expected (primary, master, start[, length[, (row_fragment, col_fragment)]]), "
                    f"got {type(x).__name__}")


class BucketWriteback(BucketBase):
    """One bucket of weights written back together (see the module doc).

    items: (primary, master, start[, length[, (row_fragment, col_fragment)]])
        primary   MXFP8Weight (numpy / CPU tensor / CUDA tensor buffers)
        master    this rank's master shard: `length` f32/bf16/f16 elements;
                  element 0 is flat index `start` of the weight
        length    defaults to master's size; 0 = this rank owns nothing
        fragments optional len-byte outputs per plane (FSDP); then the bytes
                  do not go into the primary and run() does not gather them
    rounding: 'ceil' (default, TE) or 'floor' (OCP);
    round_through: None, 'bf16' (TE's behaviour) or 'f16';
    mode: 'fused' (default) or 'strict';
    group: optional torch.distributed group: checks the plan across ranks now
        (a rank whose items fail the checks makes every rank raise here);
    gather: run() all-gathers the data planes (default True);
    raw16: what a uint16/int16 master holds, 'bf16' (default) or 'f16'
        (numpy has no bfloat16; ml_dtypes.bfloat16 arrays need no hint).
    """

    def __init__(self, items, rounding="ceil", round_through=None, mode="fused", group=None, gather=True,
                 raw16="bf16"):
        self._closed = True
        self._fault = None
        self._keep = []
        self._cuda_bucket = None
        self._setups = {}
        self._gather_enabled = bool(gather)
        build_then_setup(self, group, lambda: self._build([_as_item(x, i) for i, x in enumerate(items)], rounding,
                                                          round_through, mode, raw16))

    # ---- build --------------------------------------------------------------

    def _build(self, items, rounding, round_through, mode, raw16):
        n = len(items)
        self.n_items = n
        self.items = items
        arrs, planes_of = [], []
        citems = (L.WbItem * max(n, 1))()
        self._primaries = []
        for i, it in enumerate(items):
            w = it.primary
            if not isinstance(w, MXFP8Weight):
                raise TypeError(f"item {i}: primary must be an MXFP8Weight, got {type(w).__name__}")
            m, mdt, start, length = item_shard(i, it, w, raw16)
            frags = {}
            for pn, f in (("row", it.row_fragment), ("col", it.col_fragment)):
                if f is None:
                    continue
                fa = A.check_bytes(A.arr(f, f"item {i} {pn}_fragment").writable(), "fragment")
                if not getattr(w, f"has_{pn}"):
                    raise ValueError(f"item {i}: {pn}_fragment given but the primary has no {pn}-wise plane")
                if fa.numel != length:
                    raise ValueError(f"item {i}: {pn}_fragment has {fa.numel} bytes, the shard length is {length}")
                frags[pn] = fa
                arrs.append(fa)
            w.buffer_arrs()   # (the buffers as they are now, their sizes checked: not written past)
            for pn in ("row", "col"):
                if not getattr(w, f"has_{pn}"):
                    continue
                arrs.append(A.arr(getattr(w, f"{pn}_scale"), f"item {i} {pn}_scale").writable())
                d = getattr(w, f"{pn}_data")
                if d is None and pn not in frags:
                    raise ValueError(f"item {i}: the {pn}-wise plane has neither data nor a fragment")
                if d is not None:
                    arrs.append(A.arr(d, f"item {i} {pn}_data").writable())
            if length > 0:
                arrs.append(m)
            planes_of.append(frags)
            c = citems[i]
            c.primary = tensor_struct(w)
            c.master = m.ptr if length > 0 else None
            c.master_dtype = mdt
            c.start, c.len = start, length
            c.row_fragment = self._fragment_ptr(frags.get("row"))
            c.col_fragment = self._fragment_ptr(frags.get("col"))
            self._keep.append((w, it.master, it.row_fragment, it.col_fragment))
            self._primaries.append(w)
        kinds = {a.kind for a in arrs}
        if len(kinds) > 1:
            raise ValueError("BucketWriteback: mix of numpy arrays and torch tensors")
        self.device = A.same_device(arrs, "BucketWriteback")
        self.is_torch = kinds == {"torch"}
        self.is_cuda = self.device != "cpu"
        self._frags = planes_of
        self._citems = citems
        b = L.WbBatch()
        b.items = ctypes.cast(citems, ctypes.POINTER(L.WbItem))
        b.n_items = n
        b.rounding = A.rounding_code(rounding)
        b.round_through = A.round_through_code(round_through)
        b.mode = A.mode_code(mode)
        self._batch = b
        plan = L.WbPlan()
        host = L.host_lib()
        L.check(host.make_plan(ctypes.byref(b), ctypes.byref(plan), None), "mxs_wb_make_plan")
        self.plan = plan
        self.packed_bytes = plan.packed_bytes
        self.status_offset = plan.status_offset
        if self.is_torch:
            t = A.torch_mod()
            self.packed = t.zeros(plan.packed_bytes, dtype=t.uint8, device=self.device)
            pptr = self.packed.data_ptr()
        else:
            self.packed = np.zeros(plan.packed_bytes, dtype=np.uint8)
            pptr = self.packed.ctypes.data
        self._bp = ctypes.byref(b)
        self._pp = ctypes.byref(plan)
        self._packed_ptr = ctypes.c_void_p(pptr)
        if self.is_cuda:
            self._prepare_cuda()
        else:
            self._host = host
            self._packed_status_np = (self.packed.numpy() if self.is_torch else self.packed)
        self._keep_arrays(arrs)
        self._closed = False

    def _prepare_cuda(self):
        t = A.torch_mod()
        cu = L.cuda_lib()
        self._cu = cu
        ws = ctypes.c_int64(0)
        L.check(cu.prepare_bytes(self._bp, ctypes.byref(ws)), "mxs_cuda_wb_prepare_bytes")
        self._workspace = t.empty(max(int(ws.value), 1), dtype=t.uint8, device=self.device)
        size = int(cu.bucket_size())
        self._bucket_mem = (ctypes.c_uint64 * ((size + 7) // 8))()
        bptr = ctypes.addressof(self._bucket_mem)
        dev = t.device(self.device)
        with t.cuda.device(dev):
            stream = t.cuda.current_stream(dev).cuda_stream
            L.check(cu.prepare(bptr, self._bp, self._pp, self._packed_ptr.value, self._workspace.data_ptr(),
                               int(ws.value), stream), "mxs_cuda_wb_prepare")
        self._cuda_bucket = ctypes.c_void_p(bptr)
        self._tdev = t.device("cuda", dev.index if dev.index is not None else t.cuda.current_device())
        self._status_dev = self.packed[self.status_offset:self.status_offset + 1]
        self._status_host = t.zeros(1, dtype=t.uint8, pin_memory=True)
        self._status_host_np = self._status_host.numpy()

    # ---- the protocol -------------------------------------------------------

    def _mark_failed(self):
        """Zero the packed buffer, status byte 1 (this rank failed)."""
        if self.is_torch:
            self.packed.zero_()
            self.packed[self.status_offset] = 1
        else:
            self.packed[:] = 0
            self.packed[self.status_offset] = 1

    def partial(self, stream=None):
        """Step 2: zero the packed buffer and write this rank's partial
        exponents (FUSED: also cast the blocks wholly inside each shard). On
        failure the buffer is marked failed (zeros, status byte 1) and the
        error raised: the caller must still run its reduction."""
        try:
            if self._closed:
                raise ValueError("BucketWriteback: build a new writeback: this one was closed")
            if self._fault is not None:  # tests: a rank-local failure before the C call
                raise self._fault
            if self.is_cuda:
                st = self._cu.bucket_partial(self._cuda_bucket, stream or self._stream())
                where = "mxs_cuda_wb_bucket_partial"
            else:
                st = self._host.wb_partial(self._bp, self._pp, self._packed_ptr)
                where = "mxs_host_wb_partial"
            if st != 0:
                raise L.status_error(st, where)
        except Exception:
            self._mark_failed()
            raise

    def slots(self):
        """Where each item's exponents sit in `packed`: a list of (row_offset,
        col_offset) byte offsets (mxs_wb_slot; -1 for an absent plane). Within
        a region, the COMPACT order: row-wise (m, k) at m*ceil(cols/32) + k,
        column-wise (block row b, column c) at b*cols + c."""
        if self._closed:
            raise ValueError("BucketWriteback: closed")
        slots = (L.WbSlot * max(self.n_items, 1))()
        plan = L.WbPlan()
        L.check(L.host_lib().make_plan(self._bp, ctypes.byref(plan), slots), "mxs_wb_make_plan")
        return [(int(slots[i].row_offset), int(slots[i].col_offset)) for i in range(self.n_items)]

    def status(self):
        """The group status byte of the packed buffer (after the reduction:
        nonzero when any rank failed). CUDA: one 1-byte copy + stream sync."""
        if self.is_cuda:
            self._status_host.copy_(self._status_dev, non_blocking=True)
            A.torch_mod().cuda.current_stream(self._tdev).synchronize()
            return int(self._status_host_np[0])
        return int(self._packed_status_np[self.status_offset])

    def apply(self, stream=None, check_status=True):
        """Step 4 (after the MAX reduction of `packed`): RemoteError when the
        status byte is set; else the reduced exponents -> every primary's
        scales, and the cast of this rank's shards. check_status=False: the
        caller already knows the group's verdict (it reduced the status byte
        itself): no status read (on CUDA, no copy to the host, no sync)."""
        if self._closed:
            raise ValueError("BucketWriteback: build a new writeback: this one was closed")
        if check_status and self.status() != 0:
            raise L.remote_error("BucketWriteback.apply")
        self._apply(stream)

    def _apply(self, stream=None):
        if self.is_cuda:
            st = self._cu.bucket_apply(self._cuda_bucket, stream or self._stream())
            where = "mxs_cuda_wb_bucket_apply"
        else:
            st = self._host.wb_apply(self._bp, self._pp, self._packed_ptr)
            where = "mxs_host_wb_apply"
        if st != 0:
            raise L.status_error(st, where)

    def _comm_packed(self):
        if self.is_torch:
            return self.packed
        t = A.torch_mod()
        if not hasattr(self, "_packed_t"):
            self._packed_t = t.from_numpy(self.packed)
        return self._packed_t

    def all_reduce(self, group=None):
        """Step 3 through torch.distributed: ONE all_reduce(MAX) of the whole
        packed buffer (uint8)."""
        C.all_reduce_max(self._comm_packed(), group)

    def run(self, group=None, gather=None, error=None):
        """partial -> all_reduce(MAX, group) -> status check -> apply -> one
        byte all-gather per present plane. Without torch.distributed (or
        not initialised) and group None: a world of one (no collectives).
        Raises the local error (after joining the collectives) or
        RemoteError when another rank failed. error: an exception this rank
        already has (e.g. from its optimizer step): the rank skips partial,
        sets its status byte, joins the all-reduce and raises it; the other
        ranks raise RemoteError."""
        t = A.torch_mod()
        stream = None
        if self.is_cuda:
            if self._tdev.index != t.cuda.current_device():
                with t.cuda.device(self._tdev):
                    return self.run(group, gather, error)
            stream = self._stream()
        run_group_protocol(self, group, gather, "BucketWriteback", lambda: self._partial_or(stream, error),
                            lambda: self._apply_open(stream))

    def _partial_or(self, stream, error):
        if error is not None:
            self._mark_failed()
            raise error
        self.partial(stream)

    def _apply_open(self, stream):
        if self._closed:
            raise ValueError("BucketWriteback: closed")
        self._apply(stream)

    # ---- the gathered byte ranges (BucketBase's group setup reads them) ----------

    def _plane_regions(self):
        """Per (plane, storage): this rank's written byte intervals (merged)."""
        regions = {}
        order = []
        for i, it in enumerate(self.items if not self._closed else []):
            w = self._primaries[i]
            c = self._citems[i]
            for pn in ("row", "col"):
                if not getattr(w, f"has_{pn}") or pn in self._frags[i]:
                    continue
                a = A.arr(getattr(w, f"{pn}_data"), f"item {i} {pn}_data")
                add_region(regions, order, pn, a, i, c.len > 0, lambda off: (off + c.start, off + c.start + c.len))
        return merged_regions(regions, order)

    # ---- lifetime -------------------------------------------------------------

    def close(self):
        """Releases the prepared CUDA bucket (nothing to free on the host) and
        the group setups (their gather schedules hold the process group)."""
        if self._cuda_bucket is not None:
            self._cu.bucket_release(self._cuda_bucket)
            self._cuda_bucket = None
        self._setups.clear()
        self._closed = True

    def __repr__(self):
        return (f"BucketWriteback({self.n_items} items, {self.packed_bytes} packed bytes, device={self.device})"
                if not self._closed else "BucketWriteback(closed)")

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
from .weight import MXFP8Weight, tensor_struct

WritebackItem = namedtuple("WritebackItem", "primary master start length row_fragment col_fragment",
                           defaults=(None, None, None))


_dist = C.dist


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


def _gkey(group):
    """Setups are per process group; None is the default group."""
    if group is None:
        dist = _dist()
        group = dist.group.WORLD if dist is not None else None
    return id(group)


def _is_int16(a):
    return str(a.dtype).replace("torch.", "") in ("uint16", "int16")


def _nbytes(flat):
    return int(flat.size) if isinstance(flat, np.ndarray) else int(flat.numel())


class _Storage:
    """A plane's byte buffer as one flat uint8 torch tensor over the whole
    storage (for the collectives) and this array's byte offset in it."""

    @staticmethod
    def of(a: A.Arr):
        if a.kind == "torch":
            t = A.torch_mod()
            st = a.obj.untyped_storage()
            base = st.data_ptr()
            flat = t.empty(0, dtype=t.uint8, device=a.obj.device).set_(st)
            return base, flat, a.ptr - base
        root = a.obj
        while isinstance(root.base, np.ndarray):
            root = root.base
        if not root.flags.c_contiguous:
            raise ValueError(f"{a.name}: its root array is not contiguous; cannot gather into it")
        base = root.ctypes.data
        return base, root.reshape(-1).view(np.uint8), a.ptr - base


def _build_then_setup(wb, group, build):
    """build(); with a group, the collective group setup follows and a local build error is raised
    only there, after every rank learnt of it (each rank raises)."""
    err = None
    try:
        build()
    except Exception as e:  # noqa: BLE001 - re-raised after the group learnt of it
        if group is None:
            raise
        err = e
    if group is not None:
        wb._setup_group(group, local_error=err)


def _item_shard(i, it, w, raw16):
    """Item i's master shard checked against its rows x cols primary `w`: returns (master Arr,
    its dtype code, start, length)."""
    m = A.arr(it.master, f"item {i} master")
    mdt = A.float_dtype(m, raw16 if _is_int16(m) else None)
    length = m.numel if it.length is None else int(it.length)
    start = int(it.start)
    if length < 0 or start < 0 or start + length > w.rows * w.cols:
        raise ValueError(f"item {i}: shard [{start}, {start + length}) lies outside the "
                         f"{w.rows}x{w.cols} weight")
    if m.numel != length:
        raise ValueError(f"item {i}: master has {m.numel} elements, the shard length is {length}")
    return m, mdt, start, length


def _add_region(regions, order, plane, a, first, written, interval):
    """Notes item `first`'s buffer `a` of `plane` under its storage in `regions` (first sight:
    appended to `order`) and, when `written`, the byte interval interval(offset of `a` in its
    storage) this rank writes there."""
    base, flat, off = _Storage.of(a)
    key = (plane, base)
    if key not in regions:
        regions[key] = {"flat": flat, "iv": [], "first": first}
        order.append(key)
    if written:
        regions[key]["iv"].append(interval(off))


def _merged_regions(regions, order):
    """The _plane_regions() list: per (plane, storage) in `order`, its intervals sorted and merged."""
    out = []
    for key in order:
        r = regions[key]
        merged = []
        for lo, hi in sorted(r["iv"]):
            if merged and lo <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], hi)
            else:
                merged.append([lo, hi])
        out.append({"plane": key[0], "first": r["first"], "flat": r["flat"], "iv": merged})
    return out


def _run_group_protocol(wb, group, gather, name, partial, apply):
    """The collective sequence of run() shared by BucketWriteback and NVFP4BucketWriteback:
    the group setup (once per group), partial() -> wb.all_reduce(MAX) -> local error ->
    status check (RemoteError) -> apply() -> the byte gathers -> apply's error. Without
    torch.distributed initialised and group None: a world of one (no collectives). Returns True
    when the planes are complete here (gathered, or a world of one)."""
    dist = _dist()
    distributed = dist is not None and dist.is_initialized()
    if group is not None and not distributed:
        raise ValueError("run(group): torch.distributed is not initialised")
    setup = None
    if distributed:
        setup = wb._setups.get(_gkey(group))
        if setup is None:
            setup = wb._setup_group(group)
    err = None
    try:
        partial()
    except Exception as e:  # noqa: BLE001 - raised after the all-reduce
        err = e
    if distributed:
        wb.all_reduce(group)
    if err is not None:
        raise err
    if wb.status() != 0:
        raise L.remote_error(f"{name}.run")
    try:
        apply()
    except Exception as e:  # noqa: BLE001 - join the gathers first, then raise
        err = e
    do_gather = distributed and (gather if gather is not None else wb._gather_enabled)
    if do_gather:
        wb._gather(setup, group)
    if err is not None:
        raise err
    return do_gather or not distributed


class _WithClose:
    """`with` support for the writebacks: leaving the block calls close()."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class BucketWriteback(_WithClose):
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
        _build_then_setup(self, group, lambda: self._build([_as_item(x, i) for i, x in enumerate(items)], rounding,
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
            m, mdt, start, length = _item_shard(i, it, w, raw16)
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
        self._arrs = arrs
        self._closed = False

    def _fragment_ptr(self, fa):
        """A fragment's address for the C item. An empty fragment (an empty shard) has none in
        torch or numpy (data_ptr 0), but the C API takes NULL for "no fragment": it gets the
        address of a private byte instead (len = 0: nothing is ever written there)."""
        if fa is None:
            return None
        if fa.ptr:
            return fa.ptr
        if not hasattr(self, "_empty_frag"):
            t = A.torch_mod()
            self._empty_frag = (t.zeros(1, dtype=t.uint8, device=fa.obj.device) if fa.kind == "torch"
                                else np.zeros(1, dtype=np.uint8))
        return A.arr(self._empty_frag, "empty fragment").ptr

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

    def _stream(self):
        t = A.torch_mod()
        return t.cuda.current_stream(self._tdev).cuda_stream

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
                raise ValueError("BucketWriteback: closed")
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
            raise ValueError("BucketWriteback: closed")
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
            stream = t.cuda.current_stream(self._tdev).cuda_stream
        _run_group_protocol(self, group, gather, "BucketWriteback", lambda: self._partial_or(stream, error),
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

    # ---- group setup and the plane gathers --------------------------------------

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
                _add_region(regions, order, pn, a, i, c.len > 0, lambda off: (off + c.start, off + c.start + c.len))
        return _merged_regions(regions, order)

    def _setup_group(self, group, local_error=None):
        """Collective (all_gather of small int64 vectors): every rank learns
        whether all ranks built the bucket, whether their plans agree, and
        each rank's written intervals per plane buffer. Returns the gather
        schedule."""
        dist = _dist()
        t = A.torch_mod()
        world = dist.get_world_size(group)
        rank = dist.get_rank(group)
        backend = str(dist.get_backend(group))
        comm_dev = t.device("cuda", t.cuda.current_device()) if "nccl" in backend else t.device("cpu")
        ok = local_error is None
        regions = self._plane_regions() if ok and self._gather_enabled else []
        fp = int(self.plan.fingerprint) if ok else 0
        fp = fp - (1 << 64) if fp >= (1 << 63) else fp
        n_iv = sum(len(r["iv"]) for r in regions)
        extras = C.agree(ok, [fp, self.packed_bytes if ok else 0, len(regions)], "BucketWriteback setup", group,
                         comm_dev, extra=[n_iv],
                         remote=lambda bad: f"BucketWriteback setup (ranks {bad} failed to build the bucket)",
                         mismatch=lambda bad: "BucketWriteback setup (ranks differ in plan fingerprint, packed size "
                                              "or plane buffers)")
        if local_error is not None:
            raise local_error
        body = []
        for r in regions:
            body += [r["first"], _nbytes(r["flat"]), len(r["iv"])]
        for r in regions:
            for lo, hi in r["iv"]:
                body += [lo, hi]
        width = max(3 * len(regions) + 2 * max(e[0] for e in extras), 1)
        body += [0] * (width - len(body))
        bodies = C.all_gather_i64(body, group, comm_dev)
        sched = []
        for g, r in enumerate(regions):
            metas = [(b[3 * g], b[3 * g + 1], b[3 * g + 2]) for b in bodies]
            if len(set((m[0], m[1]) for m in metas)) != 1:
                raise L.status_error(L.host_lib().codes.get("MXS_ERR_PLAN_MISMATCH", 9),
                                     "BucketWriteback setup (plane buffers differ between ranks)")
            per_rank = []
            for rr, b in enumerate(bodies):
                pos = 3 * len(regions) + 2 * sum(bodies[rr][3 * k + 2] for k in range(g))
                per_rank.append([(b[pos + 2 * k], b[pos + 2 * k + 1]) for k in range(metas[rr][2])])
            sched.append(self._schedule(r, per_rank, rank, world))
        # gloo: list all_gather (every torch version has it); others: all_gather_into_tensor
        setup = {"group": group, "sched": sched, "world": world, "rank": rank, "list": "gloo" in backend}
        self._setups[_gkey(group)] = setup
        return setup

    def _schedule(self, region, per_rank, rank, world):
        t = A.torch_mod()
        flat = region["flat"]
        if isinstance(flat, np.ndarray):
            flat = t.from_numpy(flat)
        lens = [sum(hi - lo for lo, hi in iv) for iv in per_rank]
        S = max(lens) if lens else 0
        if S == 0:
            return None
        # fast path: one interval per rank, equal length, rank r at base + r*S: in place
        if all(len(iv) == 1 for iv in per_rank) and len(set(lens)) == 1:
            base = per_rank[0][0][0]
            if all(per_rank[r][0][0] == base + r * S for r in range(world)):
                out = flat[base:base + world * S]
                return {"kind": "inplace", "out": out, "chunks": list(out.chunk(world)),
                        "inp": flat[base + rank * S:base + (rank + 1) * S]}
        # general path: pack my intervals, gather padded chunks, scatter the others'
        send = t.empty(S, dtype=t.uint8, device=flat.device)
        recv = t.empty(world * S, dtype=t.uint8, device=flat.device)
        pack, unpack = [], []
        pos = 0
        for lo, hi in per_rank[rank]:
            pack.append((send[pos:pos + hi - lo], flat[lo:hi]))
            pos += hi - lo
        for r in range(world):
            if r == rank:
                continue
            pos = r * S
            for lo, hi in per_rank[r]:
                unpack.append((flat[lo:hi], recv[pos:pos + hi - lo]))
                pos += hi - lo
        return {"kind": "padded", "send": send, "recv": recv, "chunks": list(recv.chunk(world)), "pack": pack,
                "unpack": unpack}

    def _gather(self, setup, group):
        for s in setup["sched"]:
            if s is None:
                continue
            if s["kind"] == "inplace":
                out, inp = s["out"], s["inp"]
            else:
                for dst, src in s["pack"]:
                    dst.copy_(src)
                out, inp = s["recv"], s["send"]
            C.all_gather_bytes(out, inp, group, s["chunks"] if setup["list"] else None)
            if s["kind"] == "padded":
                for dst, src in s["unpack"]:
                    dst.copy_(src)

    def gather(self, group=None):
        """Step 5 alone: one byte all-gather per present plane buffer."""
        setup = self._setups.get(_gkey(group)) or self._setup_group(group)
        self._gather(setup, group)

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

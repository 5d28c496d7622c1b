# SPDX-License-Identifier: MIT
"""What the two bucket writebacks share, one floor below them (writeback.py:
BucketWriteback for MXFP8, nvfp4_writeback.py: NVFP4BucketWriteback): the
collective sequence of run(), the group setup that checks the plan across
ranks, and the byte all-gathers of the planes each rank wrote.

A writeback class derives from BucketBase and gives it:
    _build(...)         its items checked, the plan made (plan.fingerprint, packed_bytes)
    _plane_regions()    per (plane, storage): the byte intervals this rank writes
    partial / all_reduce / status / apply, close
BucketBase then supplies _setup_group (the [ok, fingerprint] agreement and the
gather schedule), gather() and the `with` protocol.
"""
from __future__ import annotations

import numbers

import numpy as np

from . import _arrays as A
from . import _lib as L
from . import collectives as C
from ._plumbing import current_stream

__all__ = ["BucketBase", "Storage", "gkey", "build_then_setup", "item_shard", "add_region", "merged_regions",
           "run_group_protocol"]

_dist = C.dist


def gkey(group):
    """Setups are per process group; None is the default group."""
    if group is None:
        dist = _dist()
        group = dist.group.WORLD if dist is not None else None
    return id(group)


def _is_int16(a):
    return str(a.dtype).replace("torch.", "") in ("uint16", "int16")


def _nbytes(flat):
    return int(flat.size) if isinstance(flat, np.ndarray) else int(flat.numel())


class Storage:
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


def build_then_setup(wb, group, build):
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


def item_shard(i, it, w, raw16):
    """Item i's master shard checked against its rows x cols primary `w`: returns (master Arr,
    its dtype code, start, length)."""
    m = A.arr(it.master, f"item {i} master")
    mdt = A.float_dtype(m, raw16 if _is_int16(m) else None)
    for what, v in (("start", it.start), ("length", it.length)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Integral)):
            raise TypeError(f"item {i}: give the shard's {what} as an int (an element index), got {v!r}")
    length = m.numel if it.length is None else int(it.length)
    start = int(it.start)
    if length < 0 or start < 0 or start + length > w.rows * w.cols:
        raise ValueError(f"item {i}: shard [{start}, {start + length}) lies outside the "
                         f"{w.rows}x{w.cols} weight")
    if m.numel != length:
        raise ValueError(f"item {i}: master has {m.numel} elements, the shard length is {length}")
    return m, mdt, start, length


def add_region(regions, order, plane, a, first, written, interval):
    """Notes item `first`'s buffer `a` of `plane` under its storage in `regions` (first sight:
    appended to `order`) and, when `written`, the byte interval interval(offset of `a` in its
    storage) this rank writes there."""
    base, flat, off = Storage.of(a)
    key = (plane, base)
    if key not in regions:
        regions[key] = {"flat": flat, "iv": [], "first": first}
        order.append(key)
    if written:
        regions[key]["iv"].append(interval(off))


def merged_regions(regions, order):
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


def run_group_protocol(wb, group, gather, name, partial, apply):
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
        setup = wb._setups.get(gkey(group))
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


class BucketBase:
    """The group setup, the plane gathers and `with` support of a bucket writeback (see the
    module doc for what a subclass gives it)."""

    def __enter__(self):
        return self

    def _stream(self):
        """torch's current stream on this bucket's CUDA device (the raw handle)."""
        return current_stream(self._tdev)

    def __exit__(self, *exc):
        self.close()

    def _keep_arrays(self, arrs):
        """Keeps every array the C items point into alive, whatever the caller reassigns since (a
        weight's row_data set to another array: the old one stays until the bucket goes). Moving an
        array's storage in place (Tensor.set_, resize_) after the build is not checked per call
        (a pointer check per array costs more than the whole Python side of a run): build a new
        bucket instead; numpy refuses to resize an array the bucket holds."""
        self._arrs = arrs

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
        regions = []
        if local_error is None and self._gather_enabled:
            try:   # (a root array it cannot gather into: this rank's error, told to the others first)
                regions = self._plane_regions()
            except Exception as e:  # noqa: BLE001 - re-raised after the agreement below
                local_error = e
        ok = local_error is None
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
        self._setups[gkey(group)] = setup
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
        setup = self._setups.get(gkey(group)) or self._setup_group(group)
        self._gather(setup, group)

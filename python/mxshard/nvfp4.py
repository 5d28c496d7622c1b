# SPDX-License-Identifier: MIT
"""NVFP4 primaries: E2M1 elements (two per byte), one E4M3 scale per block of
16 elements (1x16 or 16x16 tiles), one f32 global amax (docs/contract.md
section 9), and their sharded writeback with ONE packed MAX reduction.

    plane        data (uint8, packed, even index low)   scales (uint8, E4M3)
    row-wise     row_data  rows x cols, r*cols + c      row_scale  S[M][K], M = rows, K = ceil(cols/16)
    column-wise  col_data  TRANSPOSED, c*rows + r       col_scale  S[M][K], M = cols, K = ceil(rows/16)

A data plane holds ceil(rows*cols/2) bytes: shape [rows, cols/2] (column-wise
[cols, rows/2]) when that row length is even, as Transformer Engine's
NVFP4Tensor, else flat. Scales are [M, K] (COMPACT) or [round_up(M,128),
round_up(K,4)] (PADDED: TE's scale_inv shape; SWIZZLED: the same bytes in
cuBLAS's block-scaled order). `amax` is a float32 tensor of one element.

CPU arrays (numpy, CPU tensors) go to the host library. CUDA tensors go to
libmxshard_cuda's mxs_cuda_nvfp4_* entry points (<mxshard/cuda_nvfp4.h>) on
torch's current stream, or raise UnsupportedError when the loaded library
does not export the one a call needs.
"""
from __future__ import annotations

import ctypes
from collections import namedtuple

import numpy as np

from . import _arrays as A
from . import _lib as L
from .ops import (_check_has_plane, _convert_scales_args, _dequantize_out, _dequantize_plane, _quantize_src,
                  current_stream)
from .weight import _PlaneProps, _ptr, _zeros
from .writeback import BucketWriteback as _MX
from .writeback import (_WithClose, _add_region, _build_then_setup, _dist, _item_shard, _merged_regions,
                        _run_group_protocol)

__all__ = ["NVFP4Weight", "NVFP4BucketWriteback", "NVFP4WritebackItem", "quantize_nvfp4", "dequantize_nvfp4",
           "convert_nvfp4_scales", "nvfp4_scale_shape", "nvfp4_data_shape", "nvfp4_stage_to_col",
           "nvfp4_fragment_bytes"]

_BLOCKS = {"1x16": L.NVFP4_1X16, "16x16": L.NVFP4_16X16}
BLOCK_STR = {v: k for k, v in _BLOCKS.items()}


def _block_code(b):
    if isinstance(b, int) and not isinstance(b, bool) and b in BLOCK_STR:
        return b
    if isinstance(b, str) and b.lower() in _BLOCKS:
        return _BLOCKS[b.lower()]
    raise ValueError(f"block: {b!r} is not '1x16' or '16x16'")


# ---- geometry: allocation shapes (the byte counts come from the C library) ----

def nvfp4_scale_shape(rows, cols, plane, layout):
    """The 2-D shape of an NVFP4 scale plane: [M, K] (compact) or
    [round_up(M,128), round_up(K,4)] (padded, swizzled), with M = rows,
    K = ceil(cols/16) row-wise and M = cols, K = ceil(rows/16) column-wise
    (the row-wise plane of the transpose, as TE allocates it)."""
    rows, cols = A.check_shape(rows, cols)
    p = A.dirs_code(plane, allow_both=False)
    M, K = (rows, A.ceil_div(cols, L.NVFP4_BLOCK)) if p == L.ROWWISE else (cols, A.ceil_div(rows, L.NVFP4_BLOCK))
    return (M, K) if A.layout_code(layout) == L.COMPACT else (A.round_up(M, 128), A.round_up(K, 4))


def nvfp4_data_shape(rows, cols, plane):
    """The shape a data plane is allocated with: [rows, cols/2] row-wise and
    [cols, rows/2] column-wise (TE's) when that row length is even, else the
    flat [ceil(rows*cols/2)] (rows share bytes)."""
    rows, cols = A.check_shape(rows, cols)
    p = A.dirs_code(plane, allow_both=False)
    outer, inner = (rows, cols) if p == L.ROWWISE else (cols, rows)
    return (outer, inner // 2) if inner % 2 == 0 else ((rows * cols + 1) // 2,)


def _packed_bytes(n):
    return (n + 1) // 2


def nvfp4_fragment_bytes(start, length):
    """Bytes of a fragment of the shard [start, start+length) (FSDP): its
    byte range [start//2, ceil((start+length)/2)) of a packed plane, 0 for an
    empty shard (mxs_nvfp4_fragment_bytes)."""
    return (start + length + 1) // 2 - start // 2 if length > 0 else 0


# ---- the weight -----------------------------------------------------------------

def _check_data(a: A.Arr):
    """A packed E2M1 plane: 1-byte integers, or torch.float4_e2m1fn_x2."""
    if a.kind == "torch" and str(a.dtype) == "torch.float4_e2m1fn_x2":
        return a
    return A.check_bytes(a, "packed E2M1 data")


def _check_amax(a: A.Arr):
    ok = a.dtype == np.float32 if a.kind == "numpy" else a.dtype == A.torch_mod().float32
    if not ok or a.numel != 1:
        raise ValueError(f"{a.name}: expected a float32 array of 1 element, got {a.dtype} with {a.numel}")
    return a


class NVFP4Weight(_PlaneProps):
    """A rows x cols NVFP4 tensor: row-wise and/or column-wise planes, one
    block shape ('1x16' or '16x16'), one scale layout, one global amax.

    Buffers are numpy arrays (``device=None``) or torch tensors. Build one
    with :meth:`empty` (exactly the planes asked for) or :meth:`from_buffers`
    (views into your own storage: any shape of the right byte count). A
    present plane's data may be None (FSDP: the rank keeps only fragments,
    NVFP4WritebackItem's row_fragment / stage_fragment); such a weight serves
    the writeback only."""

    def __init__(self, rows, cols, *, block="1x16", layout="padded", row_data=None, row_scale=None,
                 col_data=None, col_scale=None, amax=None):
        rows, cols = A.check_shape(rows, cols)
        self.rows, self.cols = rows, cols
        self.block = _block_code(block)
        self.layout = A.layout_code(layout)
        dirs = (L.ROWWISE if row_scale is not None else 0) | (L.COLWISE if col_scale is not None else 0)
        if dirs == 0:
            raise ValueError("NVFP4Weight: give the scales of at least one plane (row_scale and/or col_scale)")
        if amax is None:
            raise ValueError("NVFP4Weight: amax (a float32 array of 1 element) is required")
        self.dirs = dirs
        self.row_data, self.row_scale, self.col_data, self.col_scale = row_data, row_scale, col_data, col_scale
        self.amax = amax
        arrs = [_check_amax(A.arr(amax, "amax"))]
        nv = L.nvfp4_host()
        st = L.Nvfp4Tensor()  # the shape alone: the byte counts come from the library
        st.rows, st.cols, st.dirs, st.scale_layout, st.block = rows, cols, dirs, self.layout, self.block
        dbytes = nv.data_bytes(ctypes.byref(st))
        if dbytes < 0:
            raise L.status_error(L.status_code("MXS_ERR_OVERFLOW"), f"NVFP4Weight {rows}x{cols}")
        for plane, data, scale in ((L.ROWWISE, row_data, row_scale), (L.COLWISE, col_data, col_scale)):
            pn = A.PLANES_STR[plane]
            if scale is None:
                if data is not None:
                    raise ValueError(f"NVFP4Weight: {pn}_data given without its scales")
                continue
            s = A.check_bytes(A.arr(scale, f"{pn}_scale"), "E4M3 scale")
            need = nv.scale_bytes(ctypes.byref(st), plane)
            if s.numel != need:
                raise ValueError(f"{pn}_scale: {s.numel} bytes, the {A.LAYOUT_STR[self.layout]} layout of a "
                                 f"{rows}x{cols} NVFP4 tensor needs {need}")
            arrs.append(s)
            if data is None:  # FSDP: the plane's bytes live in fragments (writeback only)
                continue
            d = _check_data(A.arr(data, f"{pn}_data"))
            if d.numel != dbytes:
                raise ValueError(f"{pn}_data: {d.numel} bytes, a packed {rows}x{cols} NVFP4 plane needs {dbytes}")
            arrs.append(d)
        self.device = A.same_device(arrs, "NVFP4Weight")
        self.is_torch = arrs[0].kind == "torch"
        if any(a.kind != arrs[0].kind for a in arrs):
            raise ValueError("NVFP4Weight: mix of numpy arrays and torch tensors")

    # ---- construction ------------------------------------------------------

    @classmethod
    def empty(cls, rows, cols, planes="row", block="1x16", layout="padded", device=None):
        """Allocates exactly the planes `planes` ('row', 'col', 'both') names:
        data, scales and amax zero."""
        rows, cols = A.check_shape(rows, cols)
        dirs = A.dirs_code(planes)
        kw = {}
        for plane in (L.ROWWISE, L.COLWISE):
            if dirs & plane:
                pn = A.PLANES_STR[plane]
                kw[f"{pn}_data"] = _zeros(nvfp4_data_shape(rows, cols, plane), device)
                kw[f"{pn}_scale"] = _zeros(nvfp4_scale_shape(rows, cols, plane, layout), device)
        kw["amax"] = _zeros((1,), device, "float32")
        return cls(rows, cols, block=block, layout=layout, **kw)

    @classmethod
    def from_buffers(cls, rows, cols, *, block="1x16", layout="padded", row_data=None, row_scale=None,
                     col_data=None, col_scale=None, amax=None):
        """Wraps existing buffers (no copy): any shape of the right size."""
        return cls(rows, cols, block=block, layout=layout, row_data=row_data, row_scale=row_scale,
                   col_data=col_data, col_scale=col_scale, amax=amax)

    # ---- properties (planes, has_row, has_col, shape: _PlaneProps) ----------

    @property
    def block_shape(self):
        return BLOCK_STR[self.block]

    @property
    def numel(self):
        return self.rows * self.cols

    def amax_value(self):
        """The global amax as a Python float (a device sync for CUDA)."""
        return float(self.amax.reshape(-1)[0])

    def storage_bytes(self):
        """Bytes of data + scales of the present planes + 4 (the amax):
        mxs_nvfp4_storage_bytes."""
        return int(L.nvfp4_host().storage_bytes(ctypes.byref(self.descriptor())))

    def fp4_view(self, plane="row"):
        """The plane's data as torch.float4_e2m1fn_x2 (torch buffers, when
        torch has it); otherwise the uint8 array."""
        p = A.dirs_code(plane, allow_both=False)
        d = self.row_data if p == L.ROWWISE else self.col_data
        if d is None:
            raise ValueError(f"the {A.PLANES_STR[p]}-wise plane is absent (or its data is in fragments)")
        t = A.torch_mod()
        if self.is_torch and hasattr(t, "float4_e2m1fn_x2"):
            return d.view(t.float4_e2m1fn_x2)
        return d

    def te_buffers(self):
        """The buffers under Transformer Engine's NVFP4Tensor names (None for
        an absent plane); both amaxes are this tensor's one amax."""
        return {"rowwise_data": self.row_data, "rowwise_scale_inv": self.row_scale,
                "columnwise_data": self.col_data, "columnwise_scale_inv": self.col_scale,
                "amax_rowwise": self.amax if self.has_row else None,
                "amax_columnwise": self.amax if self.has_col else None}

    def descriptor(self):
        """The C mxs_nvfp4_tensor over these buffers (pointers borrowed)."""
        return nvfp4_struct(self)

    # ---- operations --------------------------------------------------------

    def quantize_(self, src, round_through=None, src_dtype=None):
        """Copy-back: quantize the whole rows x cols `src` into exactly this
        weight's planes and its amax (in place). Returns self."""
        return quantize_nvfp4(self, src, round_through=round_through, src_dtype=src_dtype)

    def dequantize(self, plane=None, dtype="bf16", out=None):
        """One plane back to the rows x cols weight (row-major, the
        column-wise plane transposed back)."""
        return dequantize_nvfp4(self, plane=plane, dtype=dtype, out=out)

    def with_layout(self, layout):
        """A new weight sharing these data planes and amax, its scales
        converted to `layout` (e.g. 'swizzled' for cuBLAS)."""
        layout = A.layout_code(layout)
        kw = {}
        for plane in (L.ROWWISE, L.COLWISE):
            if self.dirs & plane:
                pn = A.PLANES_STR[plane]
                kw[f"{pn}_data"] = getattr(self, f"{pn}_data")
                kw[f"{pn}_scale"] = convert_nvfp4_scales(self.rows, self.cols, pn, getattr(self, f"{pn}_scale"),
                                                         self.layout, layout)
        return NVFP4Weight(self.rows, self.cols, block=self.block, layout=layout, amax=self.amax, **kw)

    def __repr__(self):
        return (f"NVFP4Weight({self.rows}x{self.cols}, planes={self.planes}, block={self.block_shape}, "
                f"layout={A.LAYOUT_STR[self.layout]}, device={self.device}, {'torch' if self.is_torch else 'numpy'})")


def nvfp4_struct(w: NVFP4Weight) -> L.Nvfp4Tensor:
    t = L.Nvfp4Tensor()
    t.rows, t.cols, t.dirs, t.scale_layout, t.block = w.rows, w.cols, w.dirs, w.layout, w.block
    t.row_data, t.row_scale = _ptr(w.row_data), _ptr(w.row_scale)
    t.col_data, t.col_scale = _ptr(w.col_data), _ptr(w.col_scale)
    t.amax = _ptr(w.amax)
    return t


def _weight_arrs(w, writable=True):
    if not isinstance(w, NVFP4Weight):
        raise TypeError(f"expected an NVFP4Weight, got {type(w).__name__}")
    out = [A.arr(w.amax, "amax")]
    for pn in ("row", "col"):
        if getattr(w, f"{pn}_scale") is not None:
            out.append(A.arr(getattr(w, f"{pn}_scale"), f"{pn}_scale"))
            if getattr(w, f"{pn}_data") is not None:  # None: in fragments (the C checks refuse it where needed)
                out.append(A.arr(getattr(w, f"{pn}_data"), f"{pn}_data"))
    return [a.writable() for a in out] if writable else out


# ---- whole-tensor operations -------------------------------------------------------

def quantize_nvfp4(primary: NVFP4Weight, src, round_through=None, src_dtype=None):
    """Copy-back: quantize the whole rows x cols `src` (f32, bf16 or f16) into
    exactly the planes `primary` has (its block shape and layout) and its
    amax. round_through='bf16' rounds every value to bf16 first (TE's master
    cast). In place; returns `primary`."""
    rt = A.round_through_code(round_through)
    s, dt, dev = _quantize_src(primary, src, src_dtype, _weight_arrs, "quantize_nvfp4")
    t = nvfp4_struct(primary)
    if dev == "cpu":
        L.check(L.nvfp4_host().quantize(ctypes.byref(t), s.ptr, dt, rt), "mxs_host_nvfp4_quantize")
    else:
        cu = L.nvfp4_cuda("quantize_nvfp4", need=("quantize",))
        L.check(cu.quantize(ctypes.byref(t), s.ptr, dt, rt, current_stream(dev)), "mxs_cuda_nvfp4_quantize")
    return primary


def dequantize_nvfp4(primary: NVFP4Weight, plane=None, dtype="bf16", out=None):
    """One plane of `primary` back to `dtype` ('bf16', 'f16', 'f32') as the
    rows x cols weight: x' = e2m1(q) * (d * amax / 2688) per block (TE's
    dequantize). plane: 'row' or 'col' (default: row when present). Returns out."""
    if not isinstance(primary, NVFP4Weight):
        raise TypeError(f"expected an NVFP4Weight, got {type(primary).__name__}")
    p, dt = _dequantize_plane(primary, plane, dtype)
    ins = _weight_arrs(primary, writable=False)
    _check_has_plane(primary, p, "dequantize_nvfp4")
    out, o, dev = _dequantize_out(primary, out, dt, ins, "dequantize_nvfp4")
    t = nvfp4_struct(primary)
    if dev == "cpu":
        L.check(L.nvfp4_host().dequantize(ctypes.byref(t), p, o.ptr, dt), "mxs_host_nvfp4_dequantize")
    else:
        cu = L.nvfp4_cuda("dequantize_nvfp4", need=("dequantize",))
        L.check(cu.dequantize(ctypes.byref(t), p, o.ptr, dt, current_stream(dev)), "mxs_cuda_nvfp4_dequantize")
    return out


def convert_nvfp4_scales(rows, cols, plane, src, from_layout, to_layout, out=None):
    """One NVFP4 scale plane of a rows x cols tensor from `from_layout` to
    `to_layout` ('compact', 'padded', 'swizzled'); padding becomes 0x00.
    Returns out (allocated in the target's shape when None)."""
    rows, cols, p, fl, tl, s, out, o, dev = _convert_scales_args(
        rows, cols, plane, src, from_layout, to_layout, out, nvfp4_scale_shape, "NVFP4 scale plane",
        "convert_nvfp4_scales")
    if dev == "cpu":
        L.check(L.nvfp4_host().convert_scales(rows, cols, p, fl, s.ptr, tl, o.ptr), "mxs_host_nvfp4_convert_scales")
    else:
        cu = L.nvfp4_cuda("convert_nvfp4_scales", need=("convert_scales",))
        L.check(cu.convert_scales(rows, cols, p, fl, s.ptr, tl, o.ptr, current_stream(dev)),
                "mxs_cuda_nvfp4_convert_scales")
    return out


def nvfp4_stage_to_col(primary: NVFP4Weight, stage):
    """Finish's transpose on its own (FSDP: after gathering the stage
    fragments of a writeback into a full stage): primary.col_data from
    `stage`, ceil(rows*cols/2) bytes holding the column-wise values in
    row-major nibble order - for a 16x16 weight also its gathered row-wise
    plane. Writes only primary.col_data (mxs_host_nvfp4_stage_to_col on CPU
    arrays, mxs_cuda_nvfp4_stage_to_col on torch's current stream for CUDA
    tensors). Returns `primary`."""
    if not isinstance(primary, NVFP4Weight):
        raise TypeError(f"expected an NVFP4Weight, got {type(primary).__name__}")
    if not primary.has_col or primary.col_data is None:
        raise ValueError("nvfp4_stage_to_col: the primary has no column-wise data plane")
    s = A.check_bytes(A.arr(stage, "stage"), "stage")
    if s.numel != _packed_bytes(primary.numel):
        raise ValueError(f"stage: {s.numel} bytes, the {primary.rows}x{primary.cols} weight needs "
                         f"{_packed_bytes(primary.numel)}")
    d = A.arr(primary.col_data, "col_data").writable()
    if s.kind != d.kind:
        raise ValueError("nvfp4_stage_to_col: mix of numpy arrays and torch tensors")
    dev = A.same_device([s, d], "nvfp4_stage_to_col")
    t = nvfp4_struct(primary)
    if dev == "cpu":
        L.check(L.nvfp4_host().stage_to_col(ctypes.byref(t), s.ptr), "mxs_host_nvfp4_stage_to_col")
    else:
        cu = L.nvfp4_cuda("nvfp4_stage_to_col", need=("stage_to_col",))
        L.check(cu.stage_to_col(ctypes.byref(t), s.ptr, current_stream(dev)), "mxs_cuda_nvfp4_stage_to_col")
    return primary


# ---- the sharded writeback -------------------------------------------------------

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


class NVFP4BucketWriteback(_WithClose):
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

    # the group setup and the byte gathers are BucketWriteback's, unchanged:
    # they only see this class's _plane_regions() byte intervals
    _setup_group = _MX._setup_group
    _allgather_i64 = staticmethod(_MX._allgather_i64)
    _schedule = _MX._schedule
    _gather = _MX._gather
    gather = _MX.gather

    def __init__(self, items, round_through="bf16", group=None, gather=True, raw16="bf16"):
        self._closed = True
        self._fault = None  # tests: a rank-local failure before partial's C call
        self._setups = {}
        self._gather_enabled = bool(gather)
        _build_then_setup(self, group,
                          lambda: self._build([_as_item(x, i) for i, x in enumerate(items)], round_through, raw16))

    # ---- build --------------------------------------------------------------

    def _build(self, items, round_through, raw16):
        n = len(items)
        arrs, stage_need, per = [], 0, []
        for i, it in enumerate(items):
            w = it.primary
            if not isinstance(w, NVFP4Weight):
                raise TypeError(f"item {i}: primary must be an NVFP4Weight, got {type(w).__name__}")
            m, mdt, start, length = _item_shard(i, it, w, raw16)
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

    def _fragment_ptr(self, fa):
        """A fragment's address for the C item. An empty fragment (an empty
        shard) may have none (a torch data_ptr of 0), but NULL means "no
        fragment": it gets the address of a private byte instead (len = 0:
        nothing is ever written there)."""
        if fa is None:
            return None
        if fa.ptr:
            return fa.ptr
        if not hasattr(self, "_empty_frag"):
            t = A.torch_mod()
            self._empty_frag = (t.zeros(1, dtype=t.uint8, device=fa.obj.device) if fa.kind == "torch"
                                else np.zeros(1, dtype=np.uint8))
        return A.arr(self._empty_frag, "empty fragment").ptr

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
            raise ValueError("NVFP4BucketWriteback: closed")

    def _stream(self):
        return A.torch_mod().cuda.current_stream(self._tdev).cuda_stream

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
        dist = _dist()
        wire, narrow = self._wire_tensors()
        if narrow is not None:
            wire.copy_(narrow)
        dist.all_reduce(wire, op=dist.ReduceOp.MAX, group=group)
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
        if _run_group_protocol(self, group, gather, "NVFP4BucketWriteback", partial, self.apply):
            self.finish()

    def _fail_with(self, error):
        """run(error=...)'s partial: the buffer marked failed, then the error raised."""
        if not self._closed:
            self._mark_failed()
        raise error

    # ---- the gathered byte ranges (BucketWriteback's group setup reads them) ----

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
                _add_region(regions, order, kind, a, i, c.len > 0,
                            lambda off: (off + c.start // 2, off + (c.start + c.len + 1) // 2))
        return _merged_regions(regions, order)

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

# SPDX-License-Identifier: MIT
"""NVFP4 primaries: E2M1 elements (two per byte), one E4M3 scale per block of
16 elements (1x16 or 16x16 tiles), one f32 global amax (docs/contract.md
section 9). Their sharded writeback with ONE packed MAX reduction:
nvfp4_writeback.py (NVFP4BucketWriteback).

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

import numpy as np

from . import _arrays as A
from . import _lib as L
from ._plumbing import (PlaneProps, check_has_plane, convert_scales_args, current_stream, dequantize_out,
                        dequantize_plane, quantize_src)
from ._plumbing import ptr as _ptr
from ._plumbing import zeros as _zeros

__all__ = ["NVFP4Weight", "quantize_nvfp4", "dequantize_nvfp4", "convert_nvfp4_scales", "nvfp4_scale_shape",
           "nvfp4_data_shape", "nvfp4_stage_to_col", "nvfp4_fragment_bytes"]

_BLOCKS = {"1x16": L.NVFP4_1X16, "16x16": L.NVFP4_16X16}
BLOCK_STR = {v: k for k, v in _BLOCKS.items()}


def _block_code(b):
    if isinstance(b, int) and not isinstance(b, bool) and b in BLOCK_STR:
        return b
    if isinstance(b, str) and b.lower() in _BLOCKS:
        return _BLOCKS[b.lower()]
    raise ValueError(f"block: {b!r} is not '1x16' or '16x16'")


# ---- geometry: allocation shapes and packed entries (the C library's rules) ----

def nvfp4_scale_shape(rows, cols, plane, layout):
    """The 2-D shape of an NVFP4 scale plane: [M, K] (compact) or
    [round_up(M,128), round_up(K,4)] (padded, swizzled), with M = rows,
    K = ceil(cols/16) row-wise and M = cols, K = ceil(rows/16) column-wise
    (the row-wise plane of the transpose, as TE allocates it;
    mxs_nvfp4_scale_shape)."""
    rows, cols = A.check_shape(rows, cols)
    outer, inner = ctypes.c_int64(), ctypes.c_int64()
    L.check(L.nvfp4_host().scale_shape(rows, cols, A.dirs_code(plane, allow_both=False), A.layout_code(layout),
                                       ctypes.byref(outer), ctypes.byref(inner)), "mxs_nvfp4_scale_shape")
    return (outer.value, inner.value)


def nvfp4_wb_region(rows, cols, plane, block="1x16"):
    """Where an NVFP4 weight's `plane` block amaxes sit in a writeback's packed
    buffer, from the plan's slot (mxs_nvfp4_wb_region_make; 16x16: the tiles,
    for either plane): (height, block_rows, per_row, row_step, col_step), block
    (b, j) at b*row_step + j*col_step."""
    rows, cols = A.check_shape(rows, cols)
    out = L.WbRegion()
    L.check(L.nvfp4_host().wb_region(rows, cols, A.dirs_code(plane, allow_both=False), _block_code(block),
                                     ctypes.byref(out)), "mxs_nvfp4_wb_region_make")
    return A.region_tuple(out)


def nvfp4_data_shape(rows, cols, plane):
    """The shape a data plane is allocated with: [rows, cols/2] row-wise and
    [cols, rows/2] column-wise (TE's) when that row length is even, else the
    flat [ceil(rows*cols/2)] (rows share bytes)."""
    rows, cols = A.check_shape(rows, cols)
    p = A.dirs_code(plane, allow_both=False)
    if rows * cols > A._INT64_MAX:   # (64-bit index math: the library's limit)
        raise L.status_error(L.status_code("MXS_ERR_OVERFLOW"), f"nvfp4_data_shape {rows}x{cols}")
    outer, inner = (rows, cols) if p == L.ROWWISE else (cols, rows)
    return (outer, inner // 2) if inner % 2 == 0 else ((rows * cols + 1) // 2,)


def _packed_bytes(n):
    return (n + 1) // 2


def nvfp4_fragment_bytes(start, length):
    """Bytes of a fragment of the shard [start, start+length) (FSDP): its
    byte range [start//2, ceil((start+length)/2)) of a packed plane, 0 for an
    empty shard (mxs_nvfp4_fragment_bytes)."""
    for n, v in (("start", start), ("length", length)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 0:
            raise ValueError(f"nvfp4_fragment_bytes: give {n} as an int >= 0, got {v!r}")
    if start + length > A._INT64_MAX:
        raise L.status_error(L.status_code("MXS_ERR_OVERFLOW"), f"nvfp4_fragment_bytes [{start}, {start}+{length})")
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


class NVFP4Weight(PlaneProps):
    """A rows x cols NVFP4 tensor: row-wise and/or column-wise planes, one
    block shape ('1x16' or '16x16'), one scale layout, one global amax.

    Buffers are numpy arrays (``device=None``) or torch tensors. Build one
    with :meth:`empty` (exactly the planes asked for) or :meth:`from_buffers`
    (views into your own storage: any shape of the right byte count). A
    present plane's data may be None (FSDP: the rank keeps only fragments,
    NVFP4WritebackItem's row_fragment / stage_fragment); such a weight serves
    the writeback only."""

    C_STRUCT = L.Nvfp4Tensor  # its C descriptor

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
        self.device, self.is_torch = A.device_and_kind(self.buffer_arrs(), "NVFP4Weight")

    def buffer_arrs(self):
        """The buffers as they are now (amax first), each checked against the shape, block, layout
        and planes (the constructor's checks; every operation runs them again, so that a buffer
        reassigned since, to one too small, raises instead of being written past its end)."""
        rows, cols = self.rows, self.cols
        arrs = [_check_amax(A.arr(self.amax, "amax"))]
        nv = L.nvfp4_host()
        st = L.Nvfp4Tensor()  # the shape alone: the byte counts come from the library
        st.rows, st.cols, st.dirs, st.scale_layout, st.block = rows, cols, self.dirs, self.layout, self.block
        dbytes = nv.data_bytes(ctypes.byref(st))
        if dbytes < 0:
            raise L.status_error(L.status_code("MXS_ERR_OVERFLOW"), f"NVFP4Weight {rows}x{cols}")
        for plane in (L.ROWWISE, L.COLWISE):
            pn = A.PLANES_STR[plane]
            data, scale = getattr(self, f"{pn}_data"), getattr(self, f"{pn}_scale")
            if scale is None:
                if self.dirs & plane:
                    raise ValueError(f"NVFP4Weight: give {pn}_scale back: the weight has a {pn}-wise plane")
                if data is not None:
                    raise ValueError(f"NVFP4Weight: {pn}_data given without its scales")
                continue
            if not self.dirs & plane:
                raise ValueError(f"NVFP4Weight: build a new weight for a {pn}-wise plane: this one has none")
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
        return arrs

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

    # ---- properties (planes, has_row, has_col, shape: PlaneProps) ----------

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
    out = w.buffer_arrs()   # (checked as they are now; a data plane None: in fragments, the C checks say)
    return [a.writable() for a in out] if writable else out


# ---- whole-tensor operations -------------------------------------------------------

def quantize_nvfp4(primary: NVFP4Weight, src, round_through=None, src_dtype=None):
    """Copy-back: quantize the whole rows x cols `src` (f32, bf16 or f16) into
    exactly the planes `primary` has (its block shape and layout) and its
    amax. round_through='bf16' rounds every value to bf16 first (TE's master
    cast). In place; returns `primary`."""
    rt = A.round_through_code(round_through)
    s, dt, dev = quantize_src(primary, src, src_dtype, _weight_arrs, "quantize_nvfp4")
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
    p, dt = dequantize_plane(primary, plane, dtype)
    ins = _weight_arrs(primary, writable=False)
    check_has_plane(primary, p, "dequantize_nvfp4")
    out, o, dev = dequantize_out(primary, out, dt, ins, "dequantize_nvfp4")
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
    rows, cols, p, fl, tl, s, out, o, dev = convert_scales_args(
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

# SPDX-License-Identifier: MIT
"""MXFP8Weight: one MXFP8 primary in Transformer Engine's buffer shapes.

    plane        data                   scales (uint8, E8M0)
    row-wise     row_data [rows, cols]  row_scale  PADDED/SWIZZLED [round_up(rows,128), round_up(ceil(cols/32),4)]
                                                   COMPACT        [rows, ceil(cols/32)]
    column-wise  col_data [rows, cols]  col_scale  PADDED/SWIZZLED [round_up(ceil(rows/32),4), round_up(cols,128)]
                 (not transposed)                  COMPACT        [ceil(rows/32), cols]

PADDED is TE's MXFP8Tensor layout (`_rowwise_data`, `_rowwise_scale_inv`,
`_columnwise_data`, `_columnwise_scale_inv`); SWIZZLED holds the same bytes
in the 128x4-tile order cuBLAS block-scaled GEMMs read (the shape stays the
PADDED one). Exactly the planes asked for are allocated; an absent plane's
attributes are None. The operations (quantize, dequantize, convert_scales)
are ops.py's, one floor below; the methods here call them.
"""
from __future__ import annotations

import numpy as np

from . import _arrays as A
from . import _lib as L
from ._plumbing import PlaneProps
from ._plumbing import zeros as _zeros
from .ops import convert_scales, dequantize, quantize, tensor_struct


class MXFP8Weight(PlaneProps):
    """A rows x cols MXFP8 tensor: row-wise and/or column-wise planes.

    Buffers are numpy arrays (``device=None``) or torch tensors (``device``
    given: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, a torch.device). Build one with
    :meth:`empty` (allocates exactly the planes asked for) or
    :meth:`from_buffers` (views into your own storage, e.g. a bucket's
    contiguous parameter buffer)."""

    C_STRUCT = L.Tensor  # its C descriptor (ops.py recognises an MXFP8Weight by it)

    def __init__(self, rows, cols, *, layout="padded", row_data=None, row_scale=None, col_data=None,
                 col_scale=None):
        rows, cols = A.check_shape(rows, cols)
        self.rows, self.cols = rows, cols
        self.layout = A.layout_code(layout)
        dirs = (L.ROWWISE if row_scale is not None else 0) | (L.COLWISE if col_scale is not None else 0)
        if dirs == 0:
            raise ValueError("MXFP8Weight: give the scales of at least one plane (row_scale and/or col_scale)")
        self.dirs = dirs
        self.row_data, self.row_scale, self.col_data, self.col_scale = row_data, row_scale, col_data, col_scale
        self.device, self.is_torch = A.device_and_kind(self.buffer_arrs(), "MXFP8Weight")

    def buffer_arrs(self):
        """The buffers as they are now, each checked against the shape, layout and planes (the
        constructor's checks; every operation runs them again, so that a buffer reassigned since,
        to one too small, raises instead of being written past its end): [Arr] of the present ones."""
        rows, cols = self.rows, self.cols
        arrs = []
        for plane in (L.ROWWISE, L.COLWISE):
            pn = A.PLANES_STR[plane]
            data, scale = getattr(self, f"{pn}_data"), getattr(self, f"{pn}_scale")
            if scale is None:
                if self.dirs & plane:
                    raise ValueError(f"MXFP8Weight: give {pn}_scale back: the weight has a {pn}-wise plane")
                if data is not None:
                    raise ValueError(f"MXFP8Weight: {pn}_data given without its scales")
                continue
            if not self.dirs & plane:
                raise ValueError(f"MXFP8Weight: build a new weight for a {pn}-wise plane: this one has none")
            s = A.check_bytes(A.arr(scale, f"{pn}_scale"), "E8M0 scale")
            need = int(np.prod(A.scale_shape(rows, cols, plane, self.layout)))
            if s.numel != need:
                raise ValueError(f"{pn}_scale: {s.numel} bytes, the {A.LAYOUT_STR[self.layout]} layout of a "
                                 f"{rows}x{cols} tensor needs {need}")
            arrs.append(s)
            if data is not None:  # None: FSDP fragments elsewhere (writeback only)
                d = A.check_bytes(A.arr(data, f"{pn}_data"), "E4M3 data")
                if d.numel != rows * cols:
                    raise ValueError(f"{pn}_data: {d.numel} bytes, a {rows}x{cols} tensor needs {rows * cols}")
                arrs.append(d)
        return arrs

    # ---- construction ------------------------------------------------------

    @classmethod
    def empty(cls, rows, cols, planes="row", layout="padded", device=None):
        """Allocates exactly the planes `planes` ('row', 'col', 'both') names,
        data uninitialised-to-zero, scales zero."""
        rows, cols = A.check_shape(rows, cols)
        dirs = A.dirs_code(planes)
        kw = {}
        for plane in (L.ROWWISE, L.COLWISE):
            if not dirs & plane:
                continue
            pn = A.PLANES_STR[plane]
            sshape = A.scale_shape(rows, cols, plane, layout)
            kw[f"{pn}_data"] = _zeros((rows, cols), device)
            kw[f"{pn}_scale"] = _zeros(sshape, device)
        return cls(rows, cols, layout=layout, **kw)

    @classmethod
    def from_buffers(cls, rows, cols, *, layout="padded", row_data=None, row_scale=None, col_data=None,
                     col_scale=None):
        """Wraps existing buffers (no copy): any shape of the right size (a
        flat slice of a bucket buffer, or TE's 2-D shapes)."""
        return cls(rows, cols, layout=layout, row_data=row_data, row_scale=row_scale, col_data=col_data,
                   col_scale=col_scale)

    # ---- properties (planes, has_row, has_col, shape: PlaneProps) ----------

    def fp8_view(self, plane="row"):
        """The plane's data as a torch.float8_e4m3fn view (torch buffers), or
        as an ml_dtypes float8_e4m3fn view when ml_dtypes is installed (numpy);
        otherwise the uint8 array."""
        plane = A.dirs_code(plane, allow_both=False)
        d = self.row_data if plane == L.ROWWISE else self.col_data
        if d is None:
            raise ValueError(f"the {A.PLANES_STR[plane]}-wise plane is absent (or its data is in fragments)")
        if self.is_torch:
            t = A.torch_mod()
            return d.view(t.float8_e4m3fn)
        try:
            import ml_dtypes  # noqa: F401  (optional)
            return d.view(ml_dtypes.float8_e4m3fn)
        except ImportError:
            return d

    @property
    def row_data_fp8(self):
        return self.fp8_view("row")

    @property
    def col_data_fp8(self):
        return self.fp8_view("col")

    def te_buffers(self):
        """The buffers under Transformer Engine's MXFP8Tensor names (None for
        an absent plane): rowwise_data, rowwise_scale_inv, columnwise_data,
        columnwise_scale_inv. The data is uint8 (TE's own storage dtype)."""
        return {"rowwise_data": self.row_data, "rowwise_scale_inv": self.row_scale,
                "columnwise_data": self.col_data, "columnwise_scale_inv": self.col_scale}

    def descriptor(self):
        """The C mxs_tensor over these buffers (pointers borrowed)."""
        return tensor_struct(self)

    # ---- operations --------------------------------------------------------

    def quantize_(self, src, rounding="ceil", src_dtype=None):
        """Copy-back: quantize the whole rows x cols `src` into exactly this
        weight's planes (in place). Returns self."""
        quantize(self, src, rounding=rounding, src_dtype=src_dtype)
        return self

    def dequantize(self, plane=None, dtype="bf16", out=None):
        """One plane back to bf16/f16/f32 (rows x cols). plane: 'row' (the
        default when present) or 'col'."""
        return dequantize(self, plane=plane, dtype=dtype, out=out)

    def with_layout(self, layout):
        """A new weight sharing these data planes, its scales converted to
        `layout` (e.g. 'swizzled' for cuBLAS)."""
        layout = A.layout_code(layout)
        kw = {}
        for plane in (L.ROWWISE, L.COLWISE):
            if not self.dirs & plane:
                continue
            pn = A.PLANES_STR[plane]
            kw[f"{pn}_data"] = getattr(self, f"{pn}_data")
            kw[f"{pn}_scale"] = convert_scales(self.rows, self.cols, pn, getattr(self, f"{pn}_scale"),
                                               self.layout, layout)
        return MXFP8Weight(self.rows, self.cols, layout=layout, **kw)

    def __repr__(self):
        return (f"MXFP8Weight({self.rows}x{self.cols}, planes={self.planes}, "
                f"layout={A.LAYOUT_STR[self.layout]}, device={self.device}, "
                f"{'torch' if self.is_torch else 'numpy'})")

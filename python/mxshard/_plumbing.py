# SPDX-License-Identifier: MIT
"""What the two formats' modules share, one floor below them: buffer pointers
and allocation, the plane properties of a weight, torch's current stream, and
the argument checks of quantize / dequantize / convert_scales.

MXFP8 (weight.py, ops.py) and NVFP4 (nvfp4.py) both import this module and
neither imports the other; formats.py, above them all, names each format's
weight class and operations.
"""
from __future__ import annotations

import numpy as np

from . import _arrays as A
from . import _lib as L


class PlaneProps:
    """The plane and shape properties of a weight with rows, cols and dirs
    (MXFP8Weight, NVFP4Weight)."""

    @property
    def planes(self):
        return A.PLANES_STR[self.dirs]

    @property
    def has_row(self):
        return bool(self.dirs & L.ROWWISE)

    @property
    def has_col(self):
        return bool(self.dirs & L.COLWISE)

    @property
    def shape(self):
        return (self.rows, self.cols)


# ---- buffers ----------------------------------------------------------------

def zeros(shape, device, dtype="uint8"):
    """Zeros of `dtype` (a name numpy and torch share): numpy for device None, else torch on `device`."""
    if device is None:
        return np.zeros(shape, dtype=dtype)
    t = A.torch_mod()
    if t is None:
        import torch as t  # noqa: F811  (device= asks for torch tensors)
    return t.zeros(shape, dtype=getattr(t, dtype), device=device)


def ptr(x):
    """The address of a numpy array or torch tensor; None for None (an absent buffer)."""
    if x is None:
        return None
    if isinstance(x, np.ndarray):
        return x.ctypes.data
    return x.data_ptr()


def current_stream(device):
    """torch's current CUDA stream of `device` ('cuda:N', 'cuda' or a torch.device), as a c_void_p
    value (the raw handle torch keeps per device: no Stream object, a few µs less per library
    call)."""
    t = A.torch_mod()
    if isinstance(device, str):
        _, _, i = device.partition(":")
        index = int(i) if i else None
    else:
        index = device.index
    return t._C._cuda_getCurrentRawStream(index if index is not None else t.cuda.current_device())


# ---- the argument checks of the whole-tensor operations (either format) ---------

def quantize_src(primary, src, src_dtype, weight_arrs, name):
    """quantize's checks of `src` against `primary` (MXFP8 or NVFP4; weight_arrs(primary) checks its
    type and buffers): returns (src Arr, its dtype code, the device of them all)."""
    s = A.arr(src, "src")
    dt = A.float_dtype(s, src_dtype)
    outs = weight_arrs(primary)
    if s.numel != primary.rows * primary.cols:
        raise ValueError(f"src: {s.numel} elements, the primary is {primary.rows}x{primary.cols}")
    if len(s.shape) == 2 and tuple(s.shape) != (primary.rows, primary.cols):
        raise ValueError(f"src: give a {primary.rows}x{primary.cols} (or flat) source, as the primary's rows and "
                         f"columns; got {s.shape[0]}x{s.shape[1]} (transpose it first if that is the layout)")
    return s, dt, A.same_device(outs + [s], name)


def dequantize_plane(primary, plane, dtype):
    """dequantize's (plane code, dtype code): plane None = row when present, else col."""
    if plane is None:
        plane = "row" if primary.has_row else "col"
    return A.dirs_code(plane, allow_both=False), A.dtype_code(dtype)


def check_has_plane(primary, p, name):
    if not primary.dirs & p:
        raise ValueError(f"{name}: the primary has no {A.PLANES_STR[p]}-wise plane (it is {primary.planes})")


def dequantize_out(primary, out, dt, ins, name):
    """dequantize's output: `out` (allocated rows x cols like the primary when None) checked
    against dt and the primary's size. Returns (out, its writable Arr, the device of them all)."""
    if out is None:
        out = float_empty(primary.is_torch, primary.device if primary.is_torch else None,
                          (primary.rows, primary.cols), dt)
    o = A.arr(out, "out").writable()
    A.float_dtype(o, dt)
    if o.numel != primary.rows * primary.cols:
        raise ValueError(f"out: {o.numel} elements, the primary is {primary.rows}x{primary.cols}")
    return out, o, A.same_device(ins + [o], name)


def float_empty(like_torch, device, shape, dt):
    if like_torch:
        t = A.torch_mod()
        tdt = {L.F32: t.float32, L.BF16: t.bfloat16, L.F16: t.float16}[dt]
        return t.empty(shape, dtype=tdt, device=device)
    if dt == L.F32:
        return np.empty(shape, np.float32)
    if dt == L.F16:
        return np.empty(shape, np.float16)
    try:
        import ml_dtypes
        return np.empty(shape, ml_dtypes.bfloat16)
    except ImportError:
        return np.empty(shape, np.uint16)  # raw bf16 bits


def convert_scales_args(rows, cols, plane, src, from_layout, to_layout, out, shape_of, what, name):
    """convert_scales' checks (MXFP8 or NVFP4: shape_of(rows, cols, plane, layout) is the scale
    plane's shape, `what` names it in errors); allocates `out` when None. Returns (rows, cols,
    plane code, from code, to code, src Arr, out, out Arr, the device)."""
    rows, cols = A.check_shape(rows, cols)
    p = A.dirs_code(plane, allow_both=False)
    fl, tl = A.layout_code(from_layout), A.layout_code(to_layout)
    s = A.check_bytes(A.arr(src, "src"), "scale")
    need_src = int(np.prod(shape_of(rows, cols, p, fl)))
    if s.numel != need_src:
        raise ValueError(f"src: {s.numel} bytes, the {A.LAYOUT_STR[fl]} {what} needs {need_src}")
    shape = shape_of(rows, cols, p, tl)
    if out is None:
        if s.kind == "torch":
            t = A.torch_mod()
            out = t.empty(shape, dtype=t.uint8, device=src.device)
        else:
            out = np.empty(shape, np.uint8)
    o = A.check_bytes(A.arr(out, "out").writable(), "scale")
    if o.numel != int(np.prod(shape)):
        raise ValueError(f"out: {o.numel} bytes, the {A.LAYOUT_STR[tl]} {what} needs {int(np.prod(shape))}")
    return rows, cols, p, fl, tl, s, out, o, A.same_device([s, o], name)

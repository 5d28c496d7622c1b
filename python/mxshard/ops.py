# SPDX-License-Identifier: MIT
"""quantize / dequantize / convert_scales on numpy arrays and torch tensors.

CPU arrays (numpy, CPU tensors) go to the host library; CUDA tensors to the
CUDA library, enqueued on torch's current stream of their device. Every
argument is checked (dtype, device, contiguity, alignment, size) before the C
call; a C status other than MXS_OK raises the matching MxsError."""
from __future__ import annotations

import ctypes

import numpy as np

from . import _arrays as A
from . import _lib as L
from .weight import MXFP8Weight, tensor_struct


def current_stream(device):
    """torch's current CUDA stream of `device` ('cuda:N'), as a c_void_p value."""
    t = A.torch_mod()
    return t.cuda.current_stream(t.device(device)).cuda_stream


def _weight_arrs(w: MXFP8Weight, need_data=True):
    if not isinstance(w, MXFP8Weight):
        raise TypeError(f"expected an MXFP8Weight, got {type(w).__name__}")
    out = []
    for pn in ("row", "col"):
        s = getattr(w, f"{pn}_scale")
        if s is None:
            continue
        out.append(A.arr(s, f"{pn}_scale").writable())
        d = getattr(w, f"{pn}_data")
        if d is None:
            if need_data:
                raise ValueError(f"the {pn}-wise plane has no data buffer")
            continue
        out.append(A.arr(d, f"{pn}_data").writable())
    return out


def quantize(primary: MXFP8Weight, src, rounding="ceil", src_dtype=None):
    """Copy-back: quantize the whole rows x cols `src` (f32, bf16 or f16) into
    exactly the planes `primary` has, scales in its layout. In place; returns
    `primary`. CUDA tensors: asynchronous on the current stream."""
    r = A.rounding_code(rounding)
    s, dt, dev = _quantize_src(primary, src, src_dtype, _weight_arrs, "quantize")
    t = tensor_struct(primary)
    if dev == "cpu":
        L.check(L.host_lib().quantize(ctypes.byref(t), s.ptr, dt, r), "mxs_host_quantize")
    else:
        L.check(L.cuda_lib().quantize(ctypes.byref(t), s.ptr, dt, r, current_stream(dev)), "mxs_cuda_quantize")
    return primary


def _quantize_src(primary, src, src_dtype, weight_arrs, name):
    """quantize's checks of `src` against `primary` (MXFP8 or NVFP4; weight_arrs(primary) checks its
    type and buffers): returns (src Arr, its dtype code, the device of them all)."""
    s = A.arr(src, "src")
    dt = A.float_dtype(s, src_dtype)
    outs = weight_arrs(primary)
    if s.numel != primary.rows * primary.cols:
        raise ValueError(f"src: {s.numel} elements, the primary is {primary.rows}x{primary.cols}")
    return s, dt, A.same_device(outs + [s], name)


def _dequantize_plane(primary, plane, dtype):
    """dequantize's (plane code, dtype code): plane None = row when present, else col."""
    if plane is None:
        plane = "row" if primary.has_row else "col"
    return A.dirs_code(plane, allow_both=False), A.dtype_code(dtype)


def _check_has_plane(primary, p, name):
    if not primary.dirs & p:
        raise ValueError(f"{name}: the primary has no {A.PLANES_STR[p]}-wise plane (it is {primary.planes})")


def _dequantize_out(primary, out, dt, ins, name):
    """dequantize's output: `out` (allocated rows x cols like the primary when None) checked
    against dt and the primary's size. Returns (out, its writable Arr, the device of them all)."""
    if out is None:
        out = _float_empty(primary.is_torch, primary.device if primary.is_torch else None,
                           (primary.rows, primary.cols), dt)
    o = A.arr(out, "out").writable()
    A.float_dtype(o, dt)
    if o.numel != primary.rows * primary.cols:
        raise ValueError(f"out: {o.numel} elements, the primary is {primary.rows}x{primary.cols}")
    return out, o, A.same_device(ins + [o], name)


def _float_empty(like_torch, device, shape, dt):
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


def dequantize(primary: MXFP8Weight, plane=None, dtype="bf16", out=None):
    """One plane of `primary` back to `dtype` ('bf16', 'f16', 'f32'), rows x
    cols. plane: 'row' or 'col' (default: row when present). numpy bf16 is
    ml_dtypes.bfloat16 when installed, else uint16 bit patterns. Returns out."""
    p, dt = _dequantize_plane(primary, plane, dtype)
    ins = _weight_arrs(primary, need_data=False)
    _check_has_plane(primary, p, "dequantize")
    if getattr(primary, f"{A.PLANES_STR[p]}_data") is None:
        raise ValueError(f"dequantize: the {A.PLANES_STR[p]}-wise plane has no data buffer")
    out, o, dev = _dequantize_out(primary, out, dt, ins, "dequantize")
    t = tensor_struct(primary)
    if dev == "cpu":
        L.check(L.host_lib().dequantize(ctypes.byref(t), p, o.ptr, dt), "mxs_host_dequantize")
    else:
        L.check(L.cuda_lib().dequantize(ctypes.byref(t), p, o.ptr, dt, current_stream(dev)), "mxs_cuda_dequantize")
    return out


def _convert_scales_args(rows, cols, plane, src, from_layout, to_layout, out, shape_of, what, name):
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


def convert_scales(rows, cols, plane, src, from_layout, to_layout, out=None):
    """One scale plane of a rows x cols tensor from `from_layout` to
    `to_layout` ('compact', 'padded', 'swizzled'). Returns out (allocated in
    the target's shape when None)."""
    rows, cols, p, fl, tl, s, out, o, dev = _convert_scales_args(rows, cols, plane, src, from_layout, to_layout,
                                                                 out, A.scale_shape, "plane", "convert_scales")
    _convert_scales_call(rows, cols, p, fl, s.ptr, tl, o.ptr, dev)
    return out


def _convert_scales_call(rows, cols, p, fl, src_ptr, tl, out_ptr, dev):
    """The C library's convert_scales on `dev` ('cpu' or a CUDA device; its current stream)."""
    if dev == "cpu":
        L.check(L.host_lib().convert_scales(rows, cols, p, fl, src_ptr, tl, out_ptr), "mxs_host_convert_scales")
    else:
        L.check(L.cuda_lib().convert_scales(rows, cols, p, fl, src_ptr, tl, out_ptr, current_stream(dev)),
                "mxs_cuda_convert_scales")


def convert_scales_built(rows, cols, plane, src, from_layout, to_layout, out):
    """convert_scales for internal callers whose tensors are right by construction: contiguous
    uint8 torch tensors of the two layouts' sizes on one device (mxshard.torch's FSDP2 assembly,
    once per gathered weight). The C library still validates what it is given; the Python-side
    checks (about 0.15 ms per call) are skipped. Returns out."""
    dev = "cpu" if out.device.type == "cpu" else str(out.device)
    _convert_scales_call(rows, cols, A.dirs_code(plane, allow_both=False), A.layout_code(from_layout),
                         src.data_ptr(), A.layout_code(to_layout), out.data_ptr(), dev)
    return out


def scale_bytes(rows, cols, plane, layout):
    """Bytes of one scale plane (the C library's mxs_scale_bytes)."""
    rows, cols = A.check_shape(rows, cols)
    t = L.Tensor()
    t.rows, t.cols, t.dirs, t.scale_layout = rows, cols, L.BOTH, A.layout_code(layout)
    n = L.host_lib().scale_bytes(ctypes.byref(t), A.dirs_code(plane, allow_both=False))
    if n < 0:
        raise L.status_error(3, "mxs_scale_bytes")  # only overflow is left after the checks above
    return n

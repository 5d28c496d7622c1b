# SPDX-License-Identifier: MIT
"""MXFP8's operations: quantize / dequantize / convert_scales on numpy arrays
and torch tensors.

CPU arrays (numpy, CPU tensors) go to the host library; CUDA tensors to the
CUDA library, enqueued on torch's current stream of their device. Every
argument is checked (dtype, device, contiguity, alignment, size) before the C
call; a C status other than MXS_OK raises the matching MxsError.

This module sits below weight.py (MXFP8Weight's methods call these functions)
and does not import it: a primary is recognised by its C descriptor
(is_mxfp8_weight)."""
from __future__ import annotations

import ctypes

from . import _arrays as A
from . import _lib as L
from ._plumbing import (PlaneProps, check_has_plane, convert_scales_args, current_stream, dequantize_out,
                        dequantize_plane, ptr, quantize_src)

__all__ = ["quantize", "dequantize", "convert_scales", "convert_scales_built", "ScaleConversion", "scale_bytes",
           "tensor_struct", "current_stream"]


def is_mxfp8_weight(w):
    """Whether `w` is an MXFP8Weight: a weight whose C descriptor is mxs_tensor (weight.py, one
    floor up, sets it; this module does not import it)."""
    return isinstance(w, PlaneProps) and w.C_STRUCT is L.Tensor


def tensor_struct(w) -> L.Tensor:
    """The C mxs_tensor over an MXFP8Weight's buffers (pointers borrowed)."""
    t = L.Tensor()
    t.rows, t.cols, t.dirs, t.scale_layout = w.rows, w.cols, w.dirs, w.layout
    t.row_data = ptr(w.row_data)
    t.row_scale = ptr(w.row_scale)
    t.col_data = ptr(w.col_data)
    t.col_scale = ptr(w.col_scale)
    return t


def _weight_arrs(w, need_data=True, writable=True):
    """The weight's buffers as they are now, checked (MXFP8Weight.buffer_arrs); writable for an
    operation that writes them."""
    if not is_mxfp8_weight(w):
        raise TypeError(f"expected an MXFP8Weight, got {type(w).__name__}")
    if need_data:
        for pn in ("row", "col"):
            if getattr(w, f"{pn}_scale") is not None and getattr(w, f"{pn}_data") is None:
                raise ValueError(f"the {pn}-wise plane has no data buffer")
    out = w.buffer_arrs()
    return [a.writable() for a in out] if writable else out


def quantize(primary, src, rounding="ceil", src_dtype=None):
    """Copy-back: quantize the whole rows x cols `src` (f32, bf16 or f16) into
    exactly the planes `primary` has, scales in its layout. In place; returns
    `primary`. CUDA tensors: asynchronous on the current stream."""
    r = A.rounding_code(rounding)
    s, dt, dev = quantize_src(primary, src, src_dtype, _weight_arrs, "quantize")
    t = tensor_struct(primary)
    if dev == "cpu":
        L.check(L.host_lib().quantize(ctypes.byref(t), s.ptr, dt, r), "mxs_host_quantize")
    else:
        L.check(L.cuda_lib().quantize(ctypes.byref(t), s.ptr, dt, r, current_stream(dev)), "mxs_cuda_quantize")
    return primary


def dequantize(primary, plane=None, dtype="bf16", out=None):
    """One plane of `primary` back to `dtype` ('bf16', 'f16', 'f32'), rows x
    cols. plane: 'row' or 'col' (default: row when present). numpy bf16 is
    ml_dtypes.bfloat16 when installed, else uint16 bit patterns. Returns out."""
    p, dt = dequantize_plane(primary, plane, dtype)
    ins = _weight_arrs(primary, need_data=False, writable=False)   # (read only: read-only buffers are fine)
    check_has_plane(primary, p, "dequantize")
    if getattr(primary, f"{A.PLANES_STR[p]}_data") is None:
        raise ValueError(f"dequantize: the {A.PLANES_STR[p]}-wise plane has no data buffer")
    out, o, dev = dequantize_out(primary, out, dt, ins, "dequantize")
    t = tensor_struct(primary)
    if dev == "cpu":
        L.check(L.host_lib().dequantize(ctypes.byref(t), p, o.ptr, dt), "mxs_host_dequantize")
    else:
        L.check(L.cuda_lib().dequantize(ctypes.byref(t), p, o.ptr, dt, current_stream(dev)), "mxs_cuda_dequantize")
    return out


def convert_scales(rows, cols, plane, src, from_layout, to_layout, out=None):
    """One scale plane of a rows x cols tensor from `from_layout` to
    `to_layout` ('compact', 'padded', 'swizzled'). Returns out (allocated in
    the target's shape when None)."""
    rows, cols, p, fl, tl, s, out, o, dev = convert_scales_args(rows, cols, plane, src, from_layout, to_layout,
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


class ScaleConversion:
    """convert_scales prepared for one geometry (rows, cols, plane, from_layout, to_layout), for
    internal callers whose tensors are right by construction: run(src, out) with contiguous uint8
    torch tensors of the two layouts' sizes on one device (mxshard.torch's FSDP2 assembly, once
    per gathered weight). The C library still validates what it is given; the Python-side checks
    and the option decoding are done once, here."""

    __slots__ = ("rows", "cols", "codes")

    def __init__(self, rows, cols, plane, from_layout, to_layout):
        self.rows, self.cols = A.check_shape(rows, cols)
        self.codes = (A.dirs_code(plane, allow_both=False), A.layout_code(from_layout), A.layout_code(to_layout))

    def run(self, src, out):
        p, fl, tl = self.codes
        dev = "cpu" if out.device.type == "cpu" else str(out.device)
        _convert_scales_call(self.rows, self.cols, p, fl, src.data_ptr(), tl, out.data_ptr(), dev)
        return out


def convert_scales_built(rows, cols, plane, src, from_layout, to_layout, out):
    """ScaleConversion(rows, cols, plane, from_layout, to_layout).run(src, out): one call."""
    return ScaleConversion(rows, cols, plane, from_layout, to_layout).run(src, out)


def scale_bytes(rows, cols, plane, layout):
    """Bytes of one scale plane (the C library's mxs_scale_bytes)."""
    rows, cols = A.check_shape(rows, cols)
    t = L.Tensor()
    t.rows, t.cols, t.dirs, t.scale_layout = rows, cols, L.BOTH, A.layout_code(layout)
    n = L.host_lib().scale_bytes(ctypes.byref(t), A.dirs_code(plane, allow_both=False))
    if n < 0:
        raise L.status_error(3, "mxs_scale_bytes")  # only overflow is left after the checks above
    return n

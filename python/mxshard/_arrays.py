# SPDX-License-Identifier: MIT
"""numpy arrays and torch tensors seen the same way: pointer, size, device,
dtype, contiguity. Every check here runs before any C call.

torch is never imported by this module: a torch tensor can only exist when
the caller imported torch already, so sys.modules tells."""
from __future__ import annotations

import ctypes
import sys

import numpy as np

from . import _lib as L


def torch_mod():
    return sys.modules.get("torch")


def is_torch(x):
    t = sys.modules.get("torch")
    return t is not None and isinstance(x, t.Tensor)


class Arr:
    """What mxshard needs to know of one array argument."""

    __slots__ = ("obj", "name", "kind", "device", "ptr", "nbytes", "numel", "itemsize", "dtype", "shape")

    def __init__(self, obj, name):
        self.obj = obj
        self.name = name
        if isinstance(obj, np.ndarray):
            self.kind = "numpy"
            self.device = "cpu"
            if not obj.flags.c_contiguous:
                raise ValueError(f"{name}: the array must be C-contiguous")
            self.ptr = obj.ctypes.data
            self.nbytes = obj.nbytes
            self.numel = obj.size
            self.itemsize = obj.itemsize
            self.dtype = obj.dtype
            self.shape = tuple(obj.shape)
        elif is_torch(obj):
            if type(obj) is not torch_mod().Tensor and hasattr(obj, "__tensor_flatten__"):
                inner, _ = obj.__tensor_flatten__()   # a wrapper subclass of one tensor (a converted weight's
                if len(inner) == 1:                   # master, or a copy of it): the values are the inner one's
                    obj = self.obj = getattr(obj, inner[0])
            self.kind = "torch"
            dev = obj.device
            self.device = "cpu" if dev.type == "cpu" else f"{dev.type}:{dev.index if dev.index is not None else 0}"
            if dev.type not in ("cpu", "cuda"):
                if dev.type == "meta":
                    raise ValueError(f"{name}: materialise the model first (model.to_empty(device=...), then load or "
                                     f"initialise the weights): its tensors are on the meta device, which holds no "
                                     f"values to quantize or multiply by")
                raise ValueError(f"{name}: tensors on {dev.type} are not supported (cpu or cuda only)")
            if not obj.is_contiguous():
                raise ValueError(f"{name}: the tensor must be contiguous")
            if obj.requires_grad and obj.grad_fn is not None:
                raise ValueError(f"{name}: a non-leaf tensor that requires grad; pass .detach()")
            self.ptr = obj.data_ptr()
            self.itemsize = obj.element_size()
            self.numel = obj.numel()
            self.nbytes = self.numel * self.itemsize
            self.dtype = obj.dtype
            self.shape = tuple(obj.shape)
        else:
            raise TypeError(f"{name}: expected a numpy.ndarray or a torch.Tensor, got {type(obj).__name__}")
        if self.numel > 0 and self.ptr % self.itemsize != 0:
            raise ValueError(f"{name}: data pointer 0x{self.ptr:x} is not aligned to its element size "
                             f"({self.itemsize} bytes)")

    @property
    def is_cuda(self):
        return self.device != "cpu"

    def writable(self):
        if self.kind == "numpy" and not self.obj.flags.writeable:
            raise ValueError(f"{self.name}: the array is read-only")
        return self


def arr(obj, name):
    return Arr(obj, name)


# ---- dtypes ---------------------------------------------------------------

_DTYPE_NAMES = {
    "f32": L.F32, "float32": L.F32, "fp32": L.F32, "float": L.F32,
    "bf16": L.BF16, "bfloat16": L.BF16,
    "f16": L.F16, "float16": L.F16, "fp16": L.F16, "half": L.F16,
}
DTYPE_STR = {L.F32: "f32", L.BF16: "bf16", L.F16: "f16"}


def dtype_code(d, name="dtype"):
    """'f32' / 'bf16' / 'f16' (or numpy / torch dtypes, or the MXS ints) -> MXS_F32/BF16/F16."""
    if d is None:
        return None
    if isinstance(d, int) and not isinstance(d, bool):
        if d in (L.F32, L.BF16, L.F16):
            return d
    else:
        s = str(d).replace("torch.", "").lower()
        if s in _DTYPE_NAMES:
            return _DTYPE_NAMES[s]
    raise ValueError(f"{name}: {d!r} is not f32, bf16 or f16")


def float_dtype(a: Arr, explicit=None):
    """The MXS dtype of a float input/output array. Raw 16-bit integer arrays
    (numpy has no bfloat16) are accepted when `explicit` names bf16 or f16."""
    ex = dtype_code(explicit, f"{a.name} dtype") if explicit is not None else None
    if a.kind == "numpy":
        nm = a.dtype.name
        if nm == "float32":
            found = L.F32
        elif nm == "float16":
            found = L.F16
        elif nm == "bfloat16":  # ml_dtypes
            found = L.BF16
        elif nm in ("uint16", "int16"):
            if ex in (L.BF16, L.F16):
                return ex
            raise ValueError(f"{a.name}: a {nm} array holds raw 16-bit patterns: say which with "
                             f"dtype='bf16' or dtype='f16'")
        else:
            raise ValueError(f"{a.name}: dtype {nm} is not float32, bfloat16 or float16")
    else:
        t = torch_mod()
        m = {t.float32: L.F32, t.bfloat16: L.BF16, t.float16: L.F16}
        found = m.get(a.dtype)
        if found is None:
            if a.dtype in (t.int16, getattr(t, "uint16", t.int16)) and ex in (L.BF16, L.F16):
                return ex
            raise ValueError(f"{a.name}: dtype {a.dtype} is not float32, bfloat16 or float16")
    if ex is not None and ex != found:
        raise ValueError(f"{a.name}: dtype is {DTYPE_STR[found]} but {DTYPE_STR[ex]} was asked for")
    return found


def check_bytes(a: Arr, what="uint8"):
    """A byte array: numpy uint8 (or int8); torch uint8, int8, float8_e4m3fn or float8_e8m0fnu."""
    if a.kind == "numpy":
        ok = a.dtype.itemsize == 1 and a.dtype.kind in "ui" or a.dtype.name in ("float8_e4m3fn", "float8_e8m0fnu")
    else:
        t = torch_mod()
        names = ("uint8", "int8", "float8_e4m3fn", "float8_e8m0fnu")
        ok = any(getattr(t, n, None) == a.dtype for n in names)
    if not ok:
        raise ValueError(f"{a.name}: expected a 1-byte {what} array, got {a.dtype}")
    return a


def same_device(arrs, what):
    devs = {a.device for a in arrs if a is not None}
    if len(devs) > 1:
        raise ValueError(f"{what}: arguments are on different devices ({', '.join(sorted(devs))})")
    return devs.pop() if devs else "cpu"


def device_and_kind(arrs, what):
    """(device, is_torch) of a weight's buffers: one device, and all numpy arrays or all torch tensors."""
    device = same_device(arrs, what)
    if any(a.kind != arrs[0].kind for a in arrs):
        raise ValueError(f"{what}: mix of numpy arrays and torch tensors")
    return device, arrs[0].kind == "torch"


# ---- options ----------------------------------------------------------------

def rounding_code(r):
    if r in (L.ROUND_CEIL, "ceil", "CEIL", None):
        return L.ROUND_CEIL
    if r in (L.ROUND_FLOOR, "floor", "FLOOR"):
        return L.ROUND_FLOOR
    raise ValueError(f"rounding: {r!r} is not 'ceil' or 'floor'")


_LAYOUTS = {"compact": L.COMPACT, "padded": L.PADDED, "swizzled": L.SWIZZLED}
LAYOUT_STR = {v: k for k, v in _LAYOUTS.items()}


def layout_code(x):
    if isinstance(x, int) and x in LAYOUT_STR:
        return x
    if isinstance(x, str) and x.lower() in _LAYOUTS:
        return _LAYOUTS[x.lower()]
    raise ValueError(f"layout: {x!r} is not 'compact', 'padded' or 'swizzled'")


_PLANES = {"row": L.ROWWISE, "rowwise": L.ROWWISE, "col": L.COLWISE, "colwise": L.COLWISE,
           "column": L.COLWISE, "both": L.BOTH, "rowcol": L.BOTH}
PLANES_STR = {L.ROWWISE: "row", L.COLWISE: "col", L.BOTH: "both"}


def dirs_code(x, allow_both=True):
    if isinstance(x, int) and not isinstance(x, bool) and x in PLANES_STR:
        c = x
    elif isinstance(x, str) and x.lower() in _PLANES:
        c = _PLANES[x.lower()]
    else:
        raise ValueError(f"planes: {x!r} is not 'row', 'col' or 'both'")
    if c == L.BOTH and not allow_both:
        raise ValueError("plane: one plane ('row' or 'col') is needed here, not 'both'")
    return c


def mode_code(m):
    if m in (L.WB_FUSED, "fused", None):
        return L.WB_FUSED
    if m in (L.WB_STRICT, "strict"):
        return L.WB_STRICT
    raise ValueError(f"mode: {m!r} is not 'fused' or 'strict'")


def round_through_code(x):
    if x in (None, False, "none", "f32", "float32"):
        return L.F32
    return dtype_code(x, "round_through")


# ---- geometry: the C library's rules (tensor.h, writeback.h) -----------------

def scale_shape(rows, cols, plane, layout):
    """The 2-D shape of a scale plane, as Transformer Engine allocates it
    (PADDED) and as COMPACT stores it: [M, K] row-wise, the k-major [K, M]
    column-wise (mxs_scale_shape). SWIZZLED has the PADDED shape (same bytes,
    128x4-tile order)."""
    rows, cols = check_shape(rows, cols)
    outer, inner = ctypes.c_int64(), ctypes.c_int64()
    L.check(L.host_lib().scale_shape(rows, cols, dirs_code(plane, allow_both=False), layout_code(layout),
                                     ctypes.byref(outer), ctypes.byref(inner)), "mxs_scale_shape")
    return (outer.value, inner.value)


def region_tuple(region):
    """A WbRegion as (height, block_rows, per_row, row_step, col_step)."""
    return (region.height, region.block_rows, region.per_row, region.row_step, region.col_step)


def wb_region(rows, cols, plane):
    """Where an MXFP8 weight's `plane` exponents sit in a writeback's packed
    buffer, from the plan's slot (mxs_wb_region_make): (height, block_rows,
    per_row, row_step, col_step); block (b, j) - block row b of `height`
    weight rows, its j-th block - is at b*row_step + j*col_step."""
    rows, cols = check_shape(rows, cols)
    out = L.WbRegion()
    L.check(L.host_lib().wb_region(rows, cols, dirs_code(plane, allow_both=False), ctypes.byref(out)),
            "mxs_wb_region_make")
    return region_tuple(out)


def check_shape(rows, cols):
    for n, v in (("rows", rows), ("cols", cols)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
            raise TypeError(f"{n} must be an int, got {type(v).__name__}")
        if v < 1:
            raise ValueError(f"{n} must be >= 1, got {v}")
        if v > _INT64_MAX:  # ctypes would wrap it silently
            raise ValueError(f"{n} must fit in int64, got {v}")
    return int(rows), int(cols)


_INT64_MAX = (1 << 63) - 1

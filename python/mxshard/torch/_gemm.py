# SPDX-License-Identifier: MIT
"""The GEMMs of a quantized linear, in one place (MXFP8Linear, NVFP4Linear and
the FSDP2 linears of mxshard.torch.fsdp_linear all call these).

    y  = x  @ W^T + b      linear_fwd(x, primary, b, dt)            W: the row plane
    gx = gy @ W            linear_dgrad(gy, primary, plane, dt)     W: the plane the module's dgrad reads
    gw = gy^T @ x          linear_wgrad(gy2, x2, acc=None|fp32 [out, in], dtype=...)

`primary` is an mxshard.MXFP8Weight or NVFP4Weight holding at least the plane
asked for; dt is the compute dtype (the dtype of the weight operand as the
GEMM sees it, of the GEMMs and of the outputs). The weight operand is the
plane's dequantized values, bit for bit (`dequant` below): whatever path a
GEMM takes, it must read exactly these values.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..nvfp4 import NVFP4Weight, dequantize_nvfp4
from ..ops import dequantize as _mx_dequantize

__all__ = ["dequant", "linear_fwd", "linear_dgrad", "linear_wgrad"]

_CODES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}


def dequant(primary, plane, dtype):
    """The [out, in] weight of `plane` ("row" | "col") of `primary` in `dtype` (a torch dtype):
    a new tensor on the primary's device."""
    code = _CODES[dtype]
    if isinstance(primary, NVFP4Weight):
        return dequantize_nvfp4(primary, plane=plane, dtype=code)
    return _mx_dequantize(primary, plane=plane, dtype=code)


def linear_fwd(x, primary, b, dt):
    """x @ deq(row)^T + b; x and b already in dt."""
    w = dequant(primary, "row", dt)
    return F.linear(x, w, b)


def linear_dgrad(gy, primary, plane, dt):
    """gy @ deq(plane); gy already in dt."""
    w = dequant(primary, plane, dt)
    return torch.matmul(gy, w)


def linear_wgrad(gy2, x2, acc=None, dtype=None):
    """gy2^T @ x2 for 2-D gy2 [tokens, out], x2 [tokens, in] (both in the compute dtype).
    acc given (a float32 [out, in] tensor): adds the product into it and returns it; else returns
    the product in `dtype` (default: the inputs' dtype)."""
    g = torch.matmul(gy2.t(), x2)
    if acc is not None:
        acc.add_(g)
        return acc
    return g if dtype is None or g.dtype == dtype else g.to(dtype)

# SPDX-License-Identifier: MIT
"""NVFP4Linear: an nn.Linear whose weight exists only as an NVFP4 primary.

    y = x @ W^T + b,   W = dequantize(row plane)                  (forward)
    dgrad = gy @ W,    W = dequantize(row plane)  planes="row"
                       W = dequantize(col plane)  planes="both"   (16x1 blocks down `out`, the reduced dim)
    main_grad += gy^T @ x                                         (fp32 [out, in], flattened batch dims)

The weight is an mxshard.NVFP4Weight (`self.primary`, docs/contract.md
section 9) whose planes are the module's buffers in Transformer Engine's
NVFP4Tensor shapes: `row_data` (uint8, packed E2M1, [out, in/2] or flat when
`in` is odd), `row_scale` (uint8 E4M3), `col_data` (the TRANSPOSED plane,
[in, out/2] or flat), `col_scale`, and `amax` (float32 [1], the tensor's
global amax, used by both planes). block: "1x16" (one scale per 16 elements
of each plane) or "16x16" (one per 16x16 tile, stored repeated; both planes
then decode to the same values). Dequantize: x' = e2m1(q) * (d * amax / 2688).

Everything else - the autograd path (the dequantized weight is transient),
the fp32 initial master, main_grad, rebind_primary_, .to() - is
MXFP8Linear's (mxshard.torch.zero.linear._QuantLinear). Quantize (set_master_,
construction) rounds through nothing; the optimizer's writeback rounds the
master through bf16 by default (TE's master cast).
"""
from __future__ import annotations

import torch

from ... import _lib as L
from ... import formats as _formats
from ..fsdp.linear import NVFP4ParamLinear
from ..options import _BLOCKS, _LAYOUTS, _PLANES, _check_choice, _dtype_code, _require_library
from .linear import _QuantLinear

__all__ = ["NVFP4Linear", "is_nvfp4"]


class NVFP4Linear(_QuantLinear):
    """y = x @ W^T + b with W held only as an NVFP4 primary (see the module docstring).

    planes: "row" (row-only; the backward dequantizes the row plane) or "both"
    (the backward reads the column-wise plane). block: "1x16" or "16x16".
    layout: the scale layout, "compact" | "padded" (TE) | "swizzled"
    (cuBLAS). compute_dtype: the dtype of the dequantized weight, of the GEMMs
    and of the output.

    A freshly built module initialises like nn.Linear (kaiming-uniform weight,
    uniform bias) and keeps that fp32 weight as its initial master until
    release_master_init()."""

    fmt = _formats.NVFP4
    format = fmt.name
    _BUFS = fmt.buffers
    _FIXED = ("amax",)

    def __init__(self, in_features, out_features, bias=True, *, planes="row", block="1x16", layout="padded",
                 device=None, compute_dtype=torch.bfloat16):
        super().__init__()
        self._construct(in_features, out_features, bias, device, compute_dtype, planes=planes, layout=layout,
                        block=block)

    def _check_format(self, planes, layout, block):
        self.planes = _check_choice("planes", planes, _PLANES, "NVFP4Linear")
        self.layout = _check_choice("layout", layout, _LAYOUTS, "NVFP4Linear")
        self.block = _check_choice("block", block, _BLOCKS, "NVFP4Linear")

    @classmethod
    def _require(cls, device):
        """The library and its NVFP4 entry points (host, or CUDA quantize + dequantize)."""
        _require_library(device, cls.__name__)
        if device.type == "cpu":
            L.nvfp4_host()
        else:
            L.nvfp4_cuda("NVFP4Linear", need=("quantize", "dequantize"))

    def _empty_primary(self, device):
        return self.fmt.empty(self.out_features, self.in_features, planes=self.planes, block=self.block,
                              layout=self.layout, device=device)

    def _primary_from_buffers(self):
        return self.fmt.weight(self.out_features, self.in_features, block=self.block, layout=self.layout,
                               **{n: self._buffers.get(n) for n in self._BUFS})

    def _dequant(self, plane, dtype=None):
        return self.fmt.dequantize(self.primary, plane=plane, dtype=dtype or _dtype_code(self.compute_dtype))

    def _quantize(self, w):
        self.fmt.quantize(self.primary, w)

    def rebind_primary_(self, row_data=None, row_scale=None, col_data=None, col_scale=None, amax=None):
        """Moves the present planes and the amax into the given tensors (uint8
        planes and a float32 [1] amax of the same shapes and device, e.g. views
        into an optimizer's bucket buffers): the current bytes are copied into
        them, then the module buffers and self.primary point to them. Arguments
        left None keep their current storage. Everything is checked before
        anything is written."""
        return self._rebind(dict(row_data=row_data, row_scale=row_scale, col_data=col_data, col_scale=col_scale,
                                 amax=amax))

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, planes={self.planes}, block={self.block}, layout={self.layout}, "
                f"compute_dtype={self.compute_dtype}")


def is_nvfp4(module) -> bool:
    """True for a linear whose weight is NVFP4: convert()'s NVFP4ParamLinear, or the NVFP4Linear
    ShardedOptimizer holds its storage in."""
    return isinstance(module, (NVFP4Linear, NVFP4ParamLinear))

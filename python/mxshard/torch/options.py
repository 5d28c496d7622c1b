# SPDX-License-Identifier: MIT
"""The options of a converted linear, checked in one place (convert() and MXFP8Linear /
NVFP4Linear(in, out, ...) use these; `who` names the caller in messages)."""
from __future__ import annotations

import torch

from .. import _lib as L
from ..formats import MXFP8, NVFP4

_PLANES = ("row", "both")
_LAYOUTS = ("compact", "padded", "swizzled")
_ROUNDINGS = MXFP8.roundings    # ("ceil", "floor")
_BLOCKS = NVFP4.blocks          # ("1x16", "16x16")
_COMPUTE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


# ---- option checks (one definition each; `who` names the class in messages) -----

def _check_features(name, v, who="MXFP8Linear"):
    if not isinstance(v, int) or isinstance(v, bool):
        raise TypeError(f"{who}: pass {name} as an int, got {type(v).__name__}")
    if v < 1:
        raise ValueError(f"{who}: pass {name} >= 1 (a quantized weight needs rows and columns), got {v}")
    return v


def _check_choice(name, v, allowed, who="MXFP8Linear"):
    if not isinstance(v, str) or v not in allowed:
        raise ValueError(f"{who}: {name}={v!r} is not one of {', '.join(map(repr, allowed))}")
    return v


def _check_compute_dtype(dt, who="MXFP8Linear"):
    if dt not in _COMPUTE_DTYPES:
        raise ValueError(f"{who}: compute_dtype={dt!r} is not torch.float32, torch.bfloat16 or "
                         f"torch.float16")
    return dt


def _check_device(device, who="MXFP8Linear"):
    device = torch.device(device) if device is not None else torch.empty(0).device
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"{who}: device {device} is not supported (cpu or cuda tensors only)")
    return device


def _require_library(device, who="MXFP8Linear"):
    """Loads the library `device`'s tensors need; a clear LibraryNotFoundError otherwise."""
    which = "host library libmxshard_host (CPU tensors)" if device.type == "cpu" else \
        "CUDA library libmxshard_cuda (CUDA tensors)"
    try:
        L.host_lib() if device.type == "cpu" else L.cuda_lib()
    except L.LibraryNotFoundError as e:
        raise L.LibraryNotFoundError(f"{who} on {device} needs the {which}:\n{e}") from e


def _dtype_code(dt):
    return {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}[dt]

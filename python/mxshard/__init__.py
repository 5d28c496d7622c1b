# SPDX-License-Identifier: MIT
"""mxshard from Python: MXFP8 and NVFP4 primary weights under sharded optimizers.

ctypes bindings over the C ABI: the host library (libmxshard_host: numpy
arrays and CPU tensors) and the CUDA library (libmxshard_cuda: CUDA tensors,
on torch's current stream). The libraries load on first use; see
docs/python.md for where they are looked for.

    w = mxshard.MXFP8Weight.empty(4096, 4096, planes="row", device="cuda")
    mxshard.quantize(w, bf16_weight)              # copy-back into its planes
    x = w.dequantize(dtype="bf16")
    wb = mxshard.BucketWriteback(items, round_through="bf16")
    wb.run(group)                                 # one all-reduce per bucket

A format is a value (mxshard.formats): MXFP8 and NVFP4 each own their weight
class, operations, writeback and plane geometry.

    fmt = mxshard.formats.get("nvfp4")            # or mxshard.NVFP4
    w = fmt.empty(4096, 4096, planes="both", device="cuda")
    fmt.quantize(w, bf16_weight)
"""
from ._lib import (LibraryNotFoundError, MxsError, RemoteError, InvalidArgumentError, ShapeError,
                   SizeOverflowError, AbsentPlaneError, RangeError, BufferSizeError, CudaError, NcclError,
                   PlanMismatchError, UnsupportedError, AliasingError, ReduceError, error_class)
from ._arrays import scale_shape
from .weight import MXFP8Weight
from .ops import quantize, dequantize, convert_scales, scale_bytes
from .writeback import BucketWriteback, WritebackItem
from .buffers import BucketBuffers
from .nvfp4 import (NVFP4Weight, quantize_nvfp4, dequantize_nvfp4, convert_nvfp4_scales, nvfp4_scale_shape,
                    nvfp4_data_shape, nvfp4_stage_to_col, nvfp4_fragment_bytes)
from .nvfp4_writeback import NVFP4BucketWriteback, NVFP4WritebackItem
from . import formats
from .formats import Format, MXFP8, NVFP4

__version__ = "0.2.0"

__all__ = [
    "MXFP8Weight", "BucketWriteback", "WritebackItem", "BucketBuffers",
    "quantize", "dequantize", "convert_scales", "scale_bytes", "scale_shape",
    "library_info", "host_version", "cuda_version",
    "MxsError", "RemoteError", "LibraryNotFoundError", "InvalidArgumentError", "ShapeError",
    "SizeOverflowError", "AbsentPlaneError", "RangeError", "BufferSizeError", "CudaError", "NcclError",
    "PlanMismatchError", "UnsupportedError", "AliasingError", "ReduceError", "error_class",
    "NVFP4Weight", "NVFP4BucketWriteback", "NVFP4WritebackItem", "quantize_nvfp4", "dequantize_nvfp4",
    "convert_nvfp4_scales", "nvfp4_scale_shape", "nvfp4_data_shape", "nvfp4_stage_to_col", "nvfp4_fragment_bytes",
    "formats", "Format", "MXFP8", "NVFP4",
]


def host_version():
    """MXS_VERSION_CODE the host library was built with (MAJOR*10000+MINOR*100+PATCH)."""
    from ._lib import host_lib
    return host_lib().version


def cuda_version():
    """MXS_VERSION_CODE of the CUDA library (None when it has no version symbol)."""
    from ._lib import cuda_lib
    return cuda_lib().version


def library_info(cuda=False):
    """Paths and versions of the loaded libraries, and what the install bundles.

    Loads the host library; the CUDA library only with ``cuda=True`` (then
    ``cuda`` and ``cuda_version`` are added). ``bundled``: whether this
    install carries its own libraries in ``mxshard/lib/`` (``pip install .``
    at the repository root); then ``bundled_dir`` is that directory,
    ``bundled_cuda`` the bundled CUDA library's path (None when it was not
    built), ``bundled_sm_archs`` its architectures and ``bundled_note`` why
    it was not built. Without a bundle these are None / [] / "". The
    environment variables (docs/python.md) come first, so ``host`` may name
    another file than the bundled one.
    """
    import os
    from ._lib import host_lib, cuda_lib, bundle_info
    h = host_lib()
    b = bundle_info()
    info = {"host": h.path, "host_version": h.version, "bundled": b is not None,
            "bundled_dir": None, "bundled_cuda": None, "bundled_sm_archs": [], "bundled_note": ""}
    if b is not None:
        info.update(bundled_dir=b["dir"], bundled_cuda=os.path.join(b["dir"], b["cuda"]) if b["cuda"] else None,
                    bundled_sm_archs=b["sm_archs"], bundled_note=b["cuda_note"])
    if cuda:
        c = cuda_lib()
        info.update(cuda=c.path, cuda_version=c.version)
    return info

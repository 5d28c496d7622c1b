# SPDX-License-Identifier: MIT
"""Loading the C libraries with ctypes, the C structs they take, and errors.

Lookup order for each library (the first hit wins, see docs/python.md):

  1. an environment variable naming the file: MXSHARD_HOST_LIB / MXSHARD_CUDA_LIB;
  2. MXSHARD_LIBDIR (a directory, or several separated by os.pathsep);
  3. the package's own directory (mxshard/ and mxshard/lib/: the libraries
     that `pip install .` at the repository root bundles in mxshard/lib/,
     described by mxshard/_build_info.py, see bundle_info());
  4. the install prefix: sys.prefix/lib, sys.prefix/lib64 (a venv or conda
     prefix that `meson install --prefix` wrote into);
  5. `pkg-config --variable=libdir mxshard-host` (host library; then the
     prefix of the header-only `mxshard`) or `mxshard-cuda` (CUDA library);
  6. the system loader's own search (LD_LIBRARY_PATH, ld.so.cache).

A library that is not found raises LibraryNotFoundError (an ImportError)
naming every place searched.
"""
from __future__ import annotations

import ctypes
import glob
import os
import subprocess
import sys
import threading

__all__ = [
    "MxsError", "RemoteError", "LibraryNotFoundError", "host_lib", "cuda_lib", "bundle_info",
    "Tensor", "WbItem", "WbBatch", "WbPlan", "WbSlot", "WbRegion", "status_error", "check",
]

# ---- enums (include/mxshard/*.h) ------------------------------------------

ROWWISE, COLWISE, BOTH = 1, 2, 3
COMPACT, PADDED, SWIZZLED = 0, 1, 2
F32, BF16, F16 = 0, 1, 2
ROUND_CEIL, ROUND_FLOOR = 0, 1
WB_FUSED, WB_STRICT = 0, 1
BLOCK = 32


# ---- structs ----------------------------------------------------------------

class Tensor(ctypes.Structure):
    """struct mxs_tensor (tensor.h)."""
    _fields_ = [
        ("rows", ctypes.c_int64),
        ("cols", ctypes.c_int64),
        ("dirs", ctypes.c_uint),
        ("scale_layout", ctypes.c_int),
        ("row_data", ctypes.c_void_p),
        ("row_scale", ctypes.c_void_p),
        ("col_data", ctypes.c_void_p),
        ("col_scale", ctypes.c_void_p),
    ]


class WbItem(ctypes.Structure):
    """struct mxs_wb_item (writeback.h)."""
    _fields_ = [
        ("primary", Tensor),
        ("master", ctypes.c_void_p),
        ("master_dtype", ctypes.c_int),
        ("start", ctypes.c_int64),
        ("len", ctypes.c_int64),
        ("row_fragment", ctypes.c_void_p),
        ("col_fragment", ctypes.c_void_p),
    ]


class WbBatch(ctypes.Structure):
    """struct mxs_wb_batch (writeback.h)."""
    _fields_ = [
        ("items", ctypes.POINTER(WbItem)),
        ("n_items", ctypes.c_int64),
        ("rounding", ctypes.c_int),
        ("round_through", ctypes.c_int),
        ("mode", ctypes.c_int),
    ]


class WbPlan(ctypes.Structure):
    """struct mxs_wb_plan (writeback.h): packed_bytes includes the trailing
    group status byte at status_offset (= packed_bytes - 1)."""
    _fields_ = [
        ("n_items", ctypes.c_int64),
        ("packed_bytes", ctypes.c_int64),
        ("row_region_bytes", ctypes.c_int64),
        ("fingerprint", ctypes.c_uint64),
        ("status_offset", ctypes.c_int64),
        ("local_hash", ctypes.c_uint64),
    ]


class WbSlot(ctypes.Structure):
    """struct mxs_wb_slot (writeback.h)."""
    _fields_ = [("row_offset", ctypes.c_int64), ("col_offset", ctypes.c_int64)]


class WbRegion(ctypes.Structure):
    """struct mxs_wb_region (writeback.h): where a weight's block entries sit in a packed
    buffer, from its slot: block (b, j) at b*row_step + j*col_step (MXFP8 and NVFP4)."""
    _fields_ = [
        ("height", ctypes.c_int64),
        ("block_rows", ctypes.c_int64),
        ("per_row", ctypes.c_int64),
        ("row_step", ctypes.c_int64),
        ("col_step", ctypes.c_int64),
    ]


# which -> (ctypes value computed here) for mxs_host_struct_size(which)
def _layout_facts():
    return {
        0: ctypes.sizeof(Tensor),
        1: ctypes.sizeof(WbItem),
        2: ctypes.sizeof(WbBatch),
        3: ctypes.sizeof(WbPlan),
        4: ctypes.sizeof(WbSlot),
        5: ctypes.sizeof(ctypes.c_int),
        6: ctypes.sizeof(WbRegion),
        10: WbItem.master.offset,
        11: WbItem.start.offset,
        12: WbItem.row_fragment.offset,
        13: WbBatch.rounding.offset,
        14: WbPlan.fingerprint.offset,
        15: Tensor.row_data.offset,
        16: WbPlan.status_offset.offset,
        17: WbPlan.local_hash.offset,
    }


# ---- errors -----------------------------------------------------------------

class LibraryNotFoundError(ImportError):
    """A mxshard shared library could not be found or loaded."""


class MxsError(RuntimeError):
    """A C call returned a status other than MXS_OK.

    ``status`` is the numeric mxs_status, ``name`` its enum name
    (e.g. ``"MXS_ERR_RANGE"``), ``text`` the library's mxs_status_str().
    """

    def __init__(self, status, name, text, where=""):
        self.status = int(status)
        self.name = name
        self.text = text
        self.where = where
        super().__init__(f"{where}: {text}" if where else text)


class RemoteError(MxsError):
    """Another rank of the group failed (its status byte was set); this rank
    skipped apply. Its primaries hold the previous step's scales (and, in
    FUSED mode, this step's bytes of the blocks wholly inside its shards)."""


class InvalidArgumentError(MxsError):
    """MXS_ERR_INVALID_ARGUMENT."""


class ShapeError(MxsError):
    """MXS_ERR_SHAPE."""


class SizeOverflowError(MxsError):
    """MXS_ERR_OVERFLOW: a size or index overflows int64."""


class AbsentPlaneError(MxsError):
    """MXS_ERR_ABSENT_PLANE."""


class RangeError(MxsError):
    """MXS_ERR_RANGE."""


class BufferSizeError(MxsError):
    """MXS_ERR_BUFFER_SIZE."""


class CudaError(MxsError):
    """MXS_ERR_CUDA."""


class NcclError(MxsError):
    """MXS_ERR_NCCL."""


class PlanMismatchError(MxsError):
    """MXS_ERR_PLAN_MISMATCH."""


class UnsupportedError(MxsError):
    """MXS_ERR_UNSUPPORTED."""


class AliasingError(MxsError):
    """MXS_ERR_ALIASING."""


class ReduceError(MxsError):
    """MXS_ERR_REDUCE."""


ERROR_CLASSES = {
    "MXS_ERR_INVALID_ARGUMENT": InvalidArgumentError,
    "MXS_ERR_SHAPE": ShapeError,
    "MXS_ERR_OVERFLOW": SizeOverflowError,
    "MXS_ERR_ABSENT_PLANE": AbsentPlaneError,
    "MXS_ERR_RANGE": RangeError,
    "MXS_ERR_BUFFER_SIZE": BufferSizeError,
    "MXS_ERR_CUDA": CudaError,
    "MXS_ERR_NCCL": NcclError,
    "MXS_ERR_PLAN_MISMATCH": PlanMismatchError,
    "MXS_ERR_UNSUPPORTED": UnsupportedError,
    "MXS_ERR_ALIASING": AliasingError,
    "MXS_ERR_REDUCE": ReduceError,
    "MXS_ERR_REMOTE": RemoteError,
}


def _error_class(name):
    return ERROR_CLASSES.get(name, MxsError)


# ---- library lookup -------------------------------------------------------

_HOST_NAMES = ("libmxshard_host.so", "libmxshard_host.so.*", "libmxshard_host.dylib")
_CUDA_NAMES = ("libmxshard_cuda.so", "libmxshard_cuda.so.*", "libmxshard_cuda.dylib")


def _pkgconfig_libdir(pkg):
    return _pkgconfig_var(pkg, "libdir")


def _pkgconfig_var(pkg, var):
    try:
        r = subprocess.run(["pkg-config", f"--variable={var}", pkg], capture_output=True, text=True,
                           timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    d = r.stdout.strip()
    return d if r.returncode == 0 and d else None


def bundle_info():
    """What `pip install .` (meson, -Dpython=true) bundled in mxshard/lib/, from
    the generated mxshard/_build_info.py: a new dict with version, dir (the
    absolute directory), host and cuda (file names; cuda None when not built),
    sm_archs (the CUDA library's architectures) and cuda_note (why there is no
    CUDA library); None for a package without bundled libraries (the
    pure-Python install of python/). Loads no library."""
    try:
        from ._build_info import BUILD
    except ImportError:
        return None
    info = dict(BUILD)
    info["dir"] = os.path.join(os.path.dirname(os.path.abspath(__file__)), info.pop("lib_dir"))
    info["sm_archs"] = list(info["sm_archs"])
    return info


def _candidates(env_file, names, pkgs):
    """Yields (description, path-or-None-for-soname) in lookup order."""
    here = os.path.dirname(os.path.abspath(__file__))
    f = os.environ.get(env_file)
    if f:
        yield f"${env_file}={f}", f
    dirs = []
    for d in filter(None, os.environ.get("MXSHARD_LIBDIR", "").split(os.pathsep)):
        dirs.append((f"$MXSHARD_LIBDIR ({d})", d))
    dirs.append(("package directory", here))
    dirs.append(("package lib/ directory", os.path.join(here, "lib")))
    for sub in ("lib", "lib64"):
        dirs.append((f"install prefix ({sys.prefix}/{sub})", os.path.join(sys.prefix, sub)))

    def in_dir(kind, d):
        for n in names:
            hits = sorted(glob.glob(os.path.join(d, n))) if "*" in n else [os.path.join(d, n)]
            if not hits:
                yield f"{kind}: {n}", os.path.join(d, n)
            for h in hits:
                yield f"{kind}: {os.path.basename(h)}", h

    for kind, d in dirs:
        yield from in_dir(kind, d)
    for pkg in pkgs:  # only asked when everything above failed
        d = _pkgconfig_libdir(pkg)
        if not d:  # a .pc without libdir (the header-only mxshard.pc): its prefix's lib dirs
            pre = _pkgconfig_var(pkg, "prefix")
            for sub in (["lib", "lib64"] + glob.glob(os.path.join(pre, "lib", "*-linux-gnu")) if pre else []):
                sd = os.path.join(pre, sub)
                yield from in_dir(f"pkg-config {pkg} prefix ({sd})", sd)
            if pre:
                continue
        if d:
            yield from in_dir(f"pkg-config {pkg} libdir ({d})", d)
        else:
            yield f"pkg-config {pkg}: not found", None
    for n in names:
        if "*" not in n:
            yield f"system loader: {n}", n


def _load(what, env_file, names, pkgs, note=""):
    tried = []
    for desc, path in _candidates(env_file, names, pkgs):
        if path is None:
            tried.append(desc)
            continue
        if os.sep in path and not os.path.exists(path):
            tried.append(f"{desc} (absent)")
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append(f"{desc} ({e})")
    raise LibraryNotFoundError(
        f"mxshard: cannot load {what}. Build it (meson setup build && meson compile -C build) and set "
        f"MXSHARD_LIBDIR to the directory holding it (or {env_file} to the file).{note} Searched:\n  "
        + "\n  ".join(tried))


_P = ctypes.c_void_p
_I64 = ctypes.c_int64
_PI64 = ctypes.POINTER(ctypes.c_int64)
_INT = ctypes.c_int


def _proto(lib, name, restype, argtypes, required=True):
    fn = getattr(lib, name, None)
    if fn is None:
        if required:
            raise LibraryNotFoundError(f"mxshard: {lib._name} has no symbol {name} (an older build?)")
        return None
    fn.restype = restype
    fn.argtypes = argtypes
    return fn


class _Host:
    """The host library and its prototypes."""

    def __init__(self):
        self.lib, self.path = _load("the host library libmxshard_host", "MXSHARD_HOST_LIB", _HOST_NAMES,
                                    ("mxshard-host", "mxshard"))
        L = self.lib
        self.version = _proto(L, "mxs_host_version", _INT, [])()
        self.status_str = _proto(L, "mxs_status_str", ctypes.c_char_p, [_INT])
        self.struct_size = _proto(L, "mxs_host_struct_size", ctypes.c_size_t, [_INT])
        self.quantize = _proto(L, "mxs_host_quantize", _INT, [ctypes.POINTER(Tensor), _P, _INT, _INT])
        self.dequantize = _proto(L, "mxs_host_dequantize", _INT, [ctypes.POINTER(Tensor), _INT, _P, _INT])
        self.convert_scales = _proto(L, "mxs_host_convert_scales", _INT, [_I64, _I64, _INT, _INT, _P, _INT, _P])
        self.scale_bytes = _proto(L, "mxs_scale_bytes", _I64, [ctypes.POINTER(Tensor), _INT])
        self.scale_shape = _proto(L, "mxs_host_scale_shape", _INT, [_I64, _I64, _INT, _INT, _PI64, _PI64])
        self.wb_region = _proto(L, "mxs_host_wb_region", _INT, [_I64, _I64, _INT, ctypes.POINTER(WbRegion)])
        self.make_plan = _proto(L, "mxs_wb_make_plan", _INT,
                                [ctypes.POINTER(WbBatch), ctypes.POINTER(WbPlan), ctypes.POINTER(WbSlot)])
        self.wb_partial = _proto(L, "mxs_host_wb_partial", _INT, [ctypes.POINTER(WbBatch), ctypes.POINTER(WbPlan), _P])
        self.wb_apply = _proto(L, "mxs_host_wb_apply", _INT, [ctypes.POINTER(WbBatch), ctypes.POINTER(WbPlan), _P])
        self._self_check()
        # status codes: read the enum names from the library's own text
        self.status_names = {}
        for code in range(0, 64):
            text = self.status_str(code).decode()
            name = text.split(":", 1)[0].strip()
            if name.startswith("MXS_"):
                self.status_names[code] = name
        self.codes = {n: c for c, n in self.status_names.items()}

    def _self_check(self):
        bad = []
        for which, mine in _layout_facts().items():
            theirs = self.struct_size(which)
            if theirs != mine:
                bad.append(f"fact {which}: C {theirs}, ctypes {mine}")
        if bad:
            raise LibraryNotFoundError(
                f"mxshard: {self.path} does not match this package's struct layouts ({'; '.join(bad)}): "
                "the library and the Python package come from different versions")


class _Cuda:
    """The CUDA library and its prototypes (prepared-bucket API of cuda.h)."""

    def __init__(self):
        b = bundle_info()
        note = ""
        if b is not None and not b["cuda"]:
            note = f" This install bundles no CUDA library: {b['cuda_note']}."
        self.lib, self.path = _load("the CUDA library libmxshard_cuda", "MXSHARD_CUDA_LIB", _CUDA_NAMES,
                                    ("mxshard-cuda",), note)
        L = self.lib
        vfn = _proto(L, "mxs_cuda_version", _INT, [], required=False)
        self.version = vfn() if vfn else None
        self.quantize = _proto(L, "mxs_cuda_quantize", _INT, [ctypes.POINTER(Tensor), _P, _INT, _INT, _P])
        self.dequantize = _proto(L, "mxs_cuda_dequantize", _INT, [ctypes.POINTER(Tensor), _INT, _P, _INT, _P])
        self.convert_scales = _proto(L, "mxs_cuda_convert_scales", _INT,
                                     [_I64, _I64, _INT, _INT, _P, _INT, _P, _P])
        self.bucket_size = _proto(L, "mxs_cuda_wb_bucket_size", ctypes.c_size_t, [])
        self.prepare_bytes = _proto(L, "mxs_cuda_wb_prepare_bytes", _INT,
                                    [ctypes.POINTER(WbBatch), ctypes.POINTER(_I64)])
        self.prepare = _proto(L, "mxs_cuda_wb_prepare", _INT,
                              [_P, ctypes.POINTER(WbBatch), ctypes.POINTER(WbPlan), _P, _P, _I64, _P])
        self.bucket_partial = _proto(L, "mxs_cuda_wb_bucket_partial", _INT, [_P, _P])
        self.bucket_apply = _proto(L, "mxs_cuda_wb_bucket_apply", _INT, [_P, _P])
        self.bucket_release = _proto(L, "mxs_cuda_wb_bucket_release", _INT, [_P])


_lock = threading.RLock()  # re-entrant: cuda_lib() loads the host library under it
_host = None
_cuda = None


def host_lib():
    """The loaded host library (loads it on first use)."""
    global _host
    if _host is None:
        with _lock:
            if _host is None:
                _host = _Host()
    return _host


def cuda_lib():
    """The loaded CUDA library (loads it on first use)."""
    global _cuda
    if _cuda is None:
        with _lock:
            if _cuda is None:
                host_lib()  # status texts come from the host library
                _cuda = _Cuda()
    return _cuda


def status_error(status, where=""):
    """The exception for a nonzero mxs_status."""
    h = host_lib()
    text = h.status_str(int(status)).decode()
    name = h.status_names.get(int(status), f"MXS_STATUS_{int(status)}")
    return _error_class(name)(status, name, text, where)


def check(status, where=""):
    if status != 0:
        raise status_error(status, where)


def remote_error(where=""):
    """RemoteError with the library's text for MXS_ERR_REMOTE (or a fallback)."""
    h = host_lib()
    code = h.codes.get("MXS_ERR_REMOTE")
    if code is not None:
        return RemoteError(code, "MXS_ERR_REMOTE", h.status_str(code).decode(), where)
    return RemoteError(-1, "MXS_ERR_REMOTE", "MXS_ERR_REMOTE: another rank of the group failed; apply skipped", where)


def error_class(name):
    """The exception class raised for status `name` (e.g. "MXS_ERR_RANGE")."""
    return _error_class(name)


# ==== NVFP4 (include/mxshard/nvfp4.h, nvfp4_quantize.h, nvfp4_wbplan.h, nvfp4_writeback.h) ====
#
# Kept apart from the MXFP8 part above: the NVFP4 prototypes bind on first
# use (nvfp4_host()), after their own struct-layout check (facts 20-40 of
# mxs_host_struct_size), so a library without NVFP4 still serves MXFP8.

NVFP4_1X16, NVFP4_16X16 = 0, 1
NVFP4_BLOCK = 16


class Nvfp4Tensor(ctypes.Structure):
    """struct mxs_nvfp4_tensor (nvfp4.h)."""
    _fields_ = [
        ("rows", ctypes.c_int64),
        ("cols", ctypes.c_int64),
        ("dirs", ctypes.c_uint),
        ("scale_layout", ctypes.c_int),
        ("block", ctypes.c_int),
        ("row_data", ctypes.c_void_p),
        ("row_scale", ctypes.c_void_p),
        ("col_data", ctypes.c_void_p),
        ("col_scale", ctypes.c_void_p),
        ("amax", ctypes.c_void_p),
    ]


class Nvfp4WbItem(ctypes.Structure):
    """struct mxs_nvfp4_wb_item (nvfp4_wbplan.h)."""
    _fields_ = [
        ("primary", Nvfp4Tensor),
        ("master", ctypes.c_void_p),
        ("master_dtype", ctypes.c_int),
        ("start", ctypes.c_int64),
        ("len", ctypes.c_int64),
        ("col_stage", ctypes.c_void_p),
        ("row_fragment", ctypes.c_void_p),    # FSDP: the shard's row-wise bytes go here (optional)
        ("stage_fragment", ctypes.c_void_p),  # FSDP: the shard's stage bytes go here (optional)
    ]


class Nvfp4WbBatch(ctypes.Structure):
    """struct mxs_nvfp4_wb_batch (nvfp4_wbplan.h)."""
    _fields_ = [
        ("items", ctypes.POINTER(Nvfp4WbItem)),
        ("n_items", ctypes.c_int64),
        ("round_through", ctypes.c_int),
    ]


class Nvfp4WbPlan(ctypes.Structure):
    """struct mxs_nvfp4_wb_plan (nvfp4_wbplan.h): packed_count entries of
    entry_bytes (2: uint16, 4: uint32); the last entry is the status entry,
    its last byte at status_offset."""
    _fields_ = [
        ("n_items", ctypes.c_int64),
        ("entry_bytes", ctypes.c_int64),
        ("packed_count", ctypes.c_int64),
        ("packed_bytes", ctypes.c_int64),
        ("fingerprint", ctypes.c_uint64),
        ("status_offset", ctypes.c_int64),
        ("local_hash", ctypes.c_uint64),
    ]


class Nvfp4WbSlot(ctypes.Structure):
    """struct mxs_nvfp4_wb_slot (nvfp4_wbplan.h): entry indices, -1 absent."""
    _fields_ = [("row_entry", ctypes.c_int64), ("col_entry", ctypes.c_int64), ("tile_entry", ctypes.c_int64),
                ("amax_entry", ctypes.c_int64)]


def _nvfp4_layout_facts():
    return {
        20: ctypes.sizeof(Nvfp4Tensor),
        21: ctypes.sizeof(Nvfp4WbItem),
        22: ctypes.sizeof(Nvfp4WbBatch),
        23: ctypes.sizeof(Nvfp4WbPlan),
        24: ctypes.sizeof(Nvfp4WbSlot),
        30: Nvfp4Tensor.block.offset,
        31: Nvfp4Tensor.row_data.offset,
        32: Nvfp4Tensor.amax.offset,
        33: Nvfp4WbItem.master.offset,
        34: Nvfp4WbItem.start.offset,
        35: Nvfp4WbItem.col_stage.offset,
        36: Nvfp4WbBatch.round_through.offset,
        37: Nvfp4WbPlan.packed_count.offset,
        38: Nvfp4WbPlan.fingerprint.offset,
        39: Nvfp4WbPlan.status_offset.offset,
        40: Nvfp4WbPlan.local_hash.offset,
    }


# the CUDA entry points of <mxshard/cuda_nvfp4.h> (cuda/mxs_nvfp4.cu), each bound
# when the loaded CUDA library exports it
_NVFP4_CUDA_OPS = ("quantize", "dequantize", "convert_scales")
_NVFP4_CUDA_WB = ("wb_partial", "wb_apply", "wb_finish")
_NVFP4_CUDA_BUCKET = ("bucket_size", "prepare_bytes", "prepare", "bucket_partial", "bucket_apply", "bucket_finish",
                      "bucket_release")


class _Nvfp4Host:
    """The NVFP4 prototypes of the host library."""

    def __init__(self, host):
        L = host.lib
        self.host = host
        bad = []
        for which, mine in _nvfp4_layout_facts().items():
            theirs = host.struct_size(which)
            if theirs != mine:
                bad.append(f"fact {which}: C {theirs}, ctypes {mine}")
        if bad:
            raise LibraryNotFoundError(
                f"mxshard: {host.path} does not match this package's NVFP4 struct layouts ({'; '.join(bad)}): "
                "the library predates NVFP4 or comes from another version")
        T, Pl = ctypes.POINTER(Nvfp4Tensor), ctypes.POINTER(Nvfp4WbPlan)
        B = ctypes.POINTER(Nvfp4WbBatch)
        self.tensor_check = _proto(L, "mxs_nvfp4_tensor_check", _INT, [T])
        self.data_bytes = _proto(L, "mxs_nvfp4_data_bytes", _I64, [T])
        self.scale_bytes = _proto(L, "mxs_nvfp4_scale_bytes", _I64, [T, _INT])
        self.storage_bytes = _proto(L, "mxs_nvfp4_storage_bytes", _I64, [T])
        self.scale_shape = _proto(L, "mxs_host_nvfp4_scale_shape", _INT, [_I64, _I64, _INT, _INT, _PI64, _PI64])
        self.wb_region = _proto(L, "mxs_host_nvfp4_wb_region", _INT,
                                [_I64, _I64, _INT, _INT, ctypes.POINTER(WbRegion)])
        self.quantize = _proto(L, "mxs_host_nvfp4_quantize", _INT, [T, _P, _INT, _INT])
        self.dequantize = _proto(L, "mxs_host_nvfp4_dequantize", _INT, [T, _INT, _P, _INT])
        self.convert_scales = _proto(L, "mxs_host_nvfp4_convert_scales", _INT,
                                     [_I64, _I64, _INT, _INT, _P, _INT, _P])
        self.wb_item_check = _proto(L, "mxs_nvfp4_wb_item_check", _INT, [ctypes.POINTER(Nvfp4WbItem)])
        self.wb_make_plan = _proto(L, "mxs_nvfp4_wb_make_plan", _INT, [B, Pl, ctypes.POINTER(Nvfp4WbSlot)])
        self.wb_partial = _proto(L, "mxs_host_nvfp4_wb_partial", _INT, [B, Pl, _P])
        self.wb_apply = _proto(L, "mxs_host_nvfp4_wb_apply", _INT, [B, Pl, _P])
        self.wb_finish = _proto(L, "mxs_host_nvfp4_wb_finish", _INT, [B, Pl])
        self.stage_to_col = _proto(L, "mxs_host_nvfp4_stage_to_col", _INT, [T, _P])


class _Nvfp4Cuda:
    """The NVFP4 prototypes of the CUDA library (<mxshard/cuda_nvfp4.h>: the
    host signatures plus the cudaStream_t); None for a symbol it lacks."""

    def __init__(self, cuda):
        L = cuda.lib
        self.cuda = cuda
        T, Pl = ctypes.POINTER(Nvfp4Tensor), ctypes.POINTER(Nvfp4WbPlan)
        B = ctypes.POINTER(Nvfp4WbBatch)
        self.quantize = _proto(L, "mxs_cuda_nvfp4_quantize", _INT, [T, _P, _INT, _INT, _P], required=False)
        self.dequantize = _proto(L, "mxs_cuda_nvfp4_dequantize", _INT, [T, _INT, _P, _INT, _P], required=False)
        self.convert_scales = _proto(L, "mxs_cuda_nvfp4_convert_scales", _INT,
                                     [_I64, _I64, _INT, _INT, _P, _INT, _P, _P], required=False)
        # the prepared bucket (one kernel per phase for any number of items)
        self.bucket_size = _proto(L, "mxs_cuda_nvfp4_wb_bucket_size", ctypes.c_size_t, [], required=False)
        self.prepare_bytes = _proto(L, "mxs_cuda_nvfp4_wb_prepare_bytes", _INT, [B, ctypes.POINTER(ctypes.c_int64)],
                                    required=False)
        self.prepare = _proto(L, "mxs_cuda_nvfp4_wb_prepare", _INT, [_P, B, Pl, _P, _P, _I64, _P], required=False)
        self.bucket_partial = _proto(L, "mxs_cuda_nvfp4_wb_bucket_partial", _INT, [_P, _P], required=False)
        self.bucket_apply = _proto(L, "mxs_cuda_nvfp4_wb_bucket_apply", _INT, [_P, _P], required=False)
        self.bucket_finish = _proto(L, "mxs_cuda_nvfp4_wb_bucket_finish", _INT, [_P, _P], required=False)
        self.bucket_release = _proto(L, "mxs_cuda_nvfp4_wb_bucket_release", _INT, [_P], required=False)
        self.wb_partial = _proto(L, "mxs_cuda_nvfp4_wb_partial", _INT, [B, Pl, _P, _P], required=False)
        self.wb_apply = _proto(L, "mxs_cuda_nvfp4_wb_apply", _INT, [B, Pl, _P, _P], required=False)
        self.wb_finish = _proto(L, "mxs_cuda_nvfp4_wb_finish", _INT, [B, Pl, _P], required=False)
        self.stage_to_col = _proto(L, "mxs_cuda_nvfp4_stage_to_col", _INT, [T, _P, _P], required=False)


_nvfp4_host = None
_nvfp4_cuda = None


def nvfp4_host():
    """The NVFP4 prototypes of the host library (binds them on first use)."""
    global _nvfp4_host
    if _nvfp4_host is None:
        with _lock:
            if _nvfp4_host is None:
                _nvfp4_host = _Nvfp4Host(host_lib())
    return _nvfp4_host


def nvfp4_cuda(where, need=_NVFP4_CUDA_OPS):
    """The NVFP4 prototypes of the CUDA library; UnsupportedError when the
    loaded CUDA library lacks one of `need` (e.g. a build before NVFP4)."""
    global _nvfp4_cuda
    if _nvfp4_cuda is None:
        with _lock:
            if _nvfp4_cuda is None:
                _nvfp4_cuda = _Nvfp4Cuda(cuda_lib())
    missing = [f"mxs_cuda_nvfp4_{n}" for n in need if getattr(_nvfp4_cuda, n) is None]
    if missing:
        raise unsupported_error(
            f"{where}: NVFP4 on CUDA tensors needs {', '.join(missing)}, which {_nvfp4_cuda.cuda.path} does not "
            "export; use CPU tensors or numpy arrays (host library), or a newer libmxshard_cuda")
    return _nvfp4_cuda


def unsupported_error(where):
    """UnsupportedError (MXS_ERR_UNSUPPORTED) with the library's text."""
    code = host_lib().codes.get("MXS_ERR_UNSUPPORTED")
    if code is not None:
        return status_error(code, where)
    return UnsupportedError(-1, "MXS_ERR_UNSUPPORTED", "MXS_ERR_UNSUPPORTED", where)


def status_code(name):
    """The numeric mxs_status of `name` (e.g. "MXS_ERR_RANGE")."""
    return host_lib().codes[name]

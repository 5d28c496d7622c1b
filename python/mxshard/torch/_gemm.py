# SPDX-License-Identifier: MIT
"""The GEMMs of a quantized linear, in one place (MXFP8Linear, NVFP4Linear and
the FSDP2 linears of mxshard.torch.fsdp all call these).

    y  = x  @ W^T + b      linear_fwd(x, primary, b, dt)            W: the row plane
    gx = gy @ W            linear_dgrad(gy, primary, plane, dt)     W: the plane the module's dgrad reads
    gw = gy^T @ x          linear_wgrad(gy2, x2, acc=None|fp32 [out, in], dtype=...)

`primary` is an mxshard.MXFP8Weight or NVFP4Weight holding at least the plane
asked for; dt is the compute dtype (the dtype of the weight operand as the
GEMM sees it, of the GEMMs and of the outputs). The weight operand is the
plane's dequantized values, bit for bit (`dequant` below): whatever path a
GEMM takes, it reads exactly these values.

Paths of linear_fwd / linear_dgrad (`choose_path` decides; `path_counts`
counts what ran, with the reason):

    fused     Triton GEMM that loads the plane's E4M3 / packed E2M1 bytes and
              block scales and up-converts them in registers before bf16/f16
              tensor-core MMAs (mxshard.torch._mxgemm_triton): no weight copy.
              CUDA, bf16/f16, up to FUSED_MAX_TOKENS rows of x / gy.
    chunked   the plane dequantized by the same Triton up-conversion in chunks
              of at most CHUNK_BYTES (and never the whole weight at once), each
              chunk one cuBLAS GEMM writing its slice of the output. CUDA, more
              tokens than that, or float32.
    dequant   the library's dequantize of the whole plane + torch matmul: the
              reference. CPU tensors, and wherever a Triton path does not apply
              (no Triton, an NVFP4 plane with an odd row length, no tokens,
              compute capability < 8.0).

The measured rule (bench/torch_layer.py --parts sweep on the H200,
bench/RESULTS.md run 14): FUSED_MAX_TOKENS and CHUNK_BYTES below.
Compute capability >= 10.0 `torch._scaled_mm` with MX block scales is not
used (no such device to test the operand preparation on).

linear_wgrad accumulates in fp32 inside the GEMM: acc += gy^T x with the
exact products of the bf16/f16 inputs summed in fp32 (CUDA: cuBLAS with an fp32
C, `addmm(..., out_dtype=float32)`; CPU: the same products, upcast to fp32, by
addmm_), so no bf16 rounding of the gradient comes first.
"""
from __future__ import annotations

import collections
import contextlib

import torch
import torch.nn.functional as F

from .. import _lib as L
from ..nvfp4 import NVFP4Weight, dequantize_nvfp4
from ..ops import dequantize as _mx_dequantize

__all__ = ["dequant", "linear_fwd", "linear_dgrad", "linear_wgrad", "plane_operand", "choose_path", "forced_path",
           "path_counts", "FUSED_MAX_TOKENS", "CHUNK_BYTES"]

_CODES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}

# The measured rule (bench/torch_layer.py sweep on the H200, bench/RESULTS.md run 14): the fused
# kernel up to this many tokens (rows of x for the forward, of gy for dgrad): at 16 and 64 tokens
# it beat the chunked path for every format and plane (4096x4096: 144-207 µs against 166-378 µs),
# at 256 it lost for the NVFP4 forward and the MXFP8 column-plane dgrad. Above it, dequantized
# chunks of at most CHUNK_BYTES + cuBLAS: 32 MiB had the least time over the table's six shapes
# (sum of fwd+dgrad time / bf16: 8 MiB 10.8, 16 MiB 8.9, 32 MiB 7.7). The library's whole-plane
# dequantize is not a candidate: it holds a full-size copy of the weight.
FUSED_MAX_TOKENS = {"fwd": 64, "dgrad": 64}
CHUNK_BYTES = 32 << 20
_CHUNK_ALIGN = 128  # chunk edges: a multiple of every block (32, 16) and of the dequantize tile

# (op, path, reason) -> calls; the tests read it to see which path ran and why
path_counts = collections.Counter()
_forced = None


@contextlib.contextmanager
def forced_path(path):
    """Within the block, linear_fwd / linear_dgrad take `path` ('fused', 'chunked',
    'dequant') wherever it applies (tests, benchmarks); elsewhere the usual fallback,
    with its reason."""
    global _forced
    if path not in ("fused", "chunked", "dequant"):
        raise ValueError(f"forced_path: {path!r} is not 'fused', 'chunked' or 'dequant'")
    old, _forced = _forced, path
    try:
        yield
    finally:
        _forced = old


_kernels_mod = None
_kernels_err = None


def _kernels():
    """mxshard.torch._mxgemm_triton, or None (the import error kept in _kernels_err)."""
    global _kernels_mod, _kernels_err
    if _kernels_mod is None and _kernels_err is None:
        try:
            from . import _mxgemm_triton as k
            _kernels_mod = k
        except Exception as e:  # no triton, or one that cannot load here
            _kernels_err = f"{type(e).__name__}: {e}"
    return _kernels_mod


def dequant(primary, plane, dtype):
    """The [out, in] weight of `plane` ("row" | "col") of `primary` in `dtype` (a torch dtype):
    a new tensor on the primary's device."""
    code = _CODES[dtype]
    if isinstance(primary, NVFP4Weight):
        return dequantize_nvfp4(primary, plane=plane, dtype=code)
    return _mx_dequantize(primary, plane=plane, dtype=code)


# ---- the plane as the kernels read it -----------------------------------------------------

def _bytes(t):
    t = t.reshape(-1)
    return t if t.dtype == torch.uint8 else t.view(torch.uint8)


def _round_up(a, b):
    return (a + b - 1) // b * b


def plane_operand(primary, plane):
    """The PlaneOperand of `plane` ('row' | 'col'): P = W for MXFP8 planes and the NVFP4 row
    plane, P = W^T for the NVFP4 column plane (stored transposed); the scale geometry of
    docs/format.md sections 4 and 6.5."""
    k = _kernels()
    rows, cols = primary.rows, primary.cols
    fp4 = isinstance(primary, NVFP4Weight)
    data = _bytes(getattr(primary, f"{plane}_data"))
    scale = _bytes(getattr(primary, f"{plane}_scale"))
    block = L.NVFP4_BLOCK if fp4 else L.BLOCK
    colwise_mx = plane == "col" and not fp4          # MXFP8 column plane: blocks down the rows
    R, C = (cols, rows) if (fp4 and plane == "col") else (rows, cols)
    M, Kb = (cols, -(-rows // block)) if plane == "col" else (rows, -(-cols // block))
    Mp, Kp = _round_up(M, 128), _round_up(Kb, 4)
    layout = primary.layout
    if colwise_mx:
        s_m, s_k = 1, (M if layout == L.COMPACT else Mp)
    else:
        s_m, s_k = (Kb if layout == L.COMPACT else Kp), 1
    return k.PlaneOperand(data=data, scale=scale, amax=primary.amax.reshape(-1) if fp4 else scale, R=R, C=C,
                          fp4=fp4, block=block, scale_c=not colwise_mx, swizzled=layout == L.SWIZZLED,
                          s_m=s_m, s_k=s_k, s_kp=Kp)


def _plane_row_len(primary, plane):
    """Elements per stored row of the plane (P's C)."""
    return primary.rows if isinstance(primary, NVFP4Weight) and plane == "col" else primary.cols


def choose_path(op, primary, plane, tokens, dt, device):
    """('fused' | 'chunked' | 'dequant', reason) for GEMM `op` ('fwd' | 'dgrad') reading
    `plane` of `primary` with `tokens` rows of x / gy in compute dtype `dt` on `device`."""
    forced = _forced
    if device.type != "cuda" and forced in (None, "dequant"):
        return "dequant", "CPU tensors: the library's dequantize + torch matmul (the reference)"
    if forced == "dequant":
        return "dequant", "forced"
    if _kernels() is None:
        return "dequant", f"Triton is not available ({_kernels_err})"
    if device.type != "cuda" and not _kernels().INTERPRET:
        return "dequant", "CPU tensors and TRITON_INTERPRET unset (the Triton kernels run on CUDA)"
    if tokens == 0:
        return "dequant", "no tokens"
    if isinstance(primary, NVFP4Weight) and _plane_row_len(primary, plane) % 2:
        return "dequant", "NVFP4 plane with an odd row length (rows start inside a byte)"
    if device.type == "cuda" and torch.cuda.get_device_capability(device)[0] < 8:
        return "dequant", "compute capability < 8.0 (Triton's bf16 tensor-core dot)"
    if dt == torch.float32:
        return "chunked", "float32 compute dtype (the fused kernel multiplies bf16/f16)"
    if forced is not None:
        return forced, "forced"
    if tokens <= FUSED_MAX_TOKENS[op]:
        return "fused", f"tokens <= {FUSED_MAX_TOKENS[op]} (measured rule)"
    return "chunked", f"tokens > {FUSED_MAX_TOKENS[op]} (measured rule)"


def _count(op, path, reason):
    path_counts[(op, path, reason)] += 1


def _chunk(extent, other, dt):
    """Rows of a chunk of `extent` rows of `other` elements: at most CHUNK_BYTES, a
    multiple of _CHUNK_ALIGN, and fewer than all of them whenever there are more than
    _CHUNK_ALIGN (no full-size copy of the weight)."""
    per_row = other * dt.itemsize
    n = max(_CHUNK_ALIGN, CHUNK_BYTES // per_row // _CHUNK_ALIGN * _CHUNK_ALIGN)
    if extent > _CHUNK_ALIGN:
        n = min(n, _round_up(-(-extent // 2), _CHUNK_ALIGN))
    return n


# ---- the GEMMs ----------------------------------------------------------------------------

def linear_fwd(x, primary, b, dt):
    """x @ deq(row)^T + b; x and b already in dt."""
    K, N = primary.cols, primary.rows
    x2 = x.reshape(-1, K)
    path, why = choose_path("fwd", primary, "row", x2.shape[0], dt, x.device)
    _count("fwd", path, why)
    if path == "dequant":
        w = dequant(primary, "row", dt)
        return F.linear(x, w, b)
    kern = _kernels()
    op = plane_operand(primary, "row")
    if path == "fused":
        y2 = kern.qgemm(x2, op, True, dt, bias=b)
    else:
        y2 = torch.empty(x2.shape[0], N, dtype=dt, device=x.device)
        step = _chunk(N, K, dt)
        for n0 in range(0, N, step):
            n1 = min(N, n0 + step)
            w = kern.plane_dequant(op, n0, n1, 0, K, dt)
            if b is None:
                torch.mm(x2, w.t(), out=y2[:, n0:n1])
            else:
                torch.addmm(b[n0:n1], x2, w.t(), out=y2[:, n0:n1])
            del w
    return y2.reshape(*x.shape[:-1], N)


def linear_dgrad(gy, primary, plane, dt):
    """gy @ deq(plane); gy already in dt."""
    K, N = primary.cols, primary.rows
    gy2 = gy.reshape(-1, N)
    path, why = choose_path("dgrad", primary, plane, gy2.shape[0], dt, gy.device)
    _count("dgrad", path, why)
    if path == "dequant":
        w = dequant(primary, plane, dt)
        return torch.matmul(gy, w)
    kern = _kernels()
    op = plane_operand(primary, plane)
    trans = isinstance(primary, NVFP4Weight) and plane == "col"  # the NVFP4 column plane is P = W^T
    if path == "fused":
        gx2 = kern.qgemm(gy2, op, trans, dt)
    else:
        gx2 = torch.empty(gy2.shape[0], K, dtype=dt, device=gy.device)
        step = _chunk(K, N, dt)
        for c0 in range(0, K, step):
            c1 = min(K, c0 + step)
            if trans:   # P[c0:c1, :] = W[:, c0:c1]^T
                w = kern.plane_dequant(op, c0, c1, 0, N, dt)
                torch.mm(gy2, w.t(), out=gx2[:, c0:c1])
            else:       # P[:, c0:c1] = W[:, c0:c1]
                w = kern.plane_dequant(op, 0, N, c0, c1, dt)
                torch.mm(gy2, w, out=gx2[:, c0:c1])
            del w
    return gx2.reshape(*gy.shape[:-1], K)


def linear_wgrad(gy2, x2, acc=None, dtype=None):
    """gy2^T @ x2 for 2-D gy2 [tokens, out], x2 [tokens, in] (both in the compute dtype).
    acc given (a float32 [out, in] tensor): acc += the product, accumulated in fp32 inside the
    GEMM (the exact products of the inputs summed in fp32, no rounding of the product to the
    inputs' dtype first); returns acc. Else returns the product in `dtype` (default: the
    inputs' dtype); dtype=float32 is the fp32 accumulation without an acc."""
    exact = gy2.dtype in (torch.bfloat16, torch.float16)   # their products are exact in fp32
    if acc is not None:
        if acc.dtype != torch.float32:
            raise ValueError(f"linear_wgrad: acc must be float32, got {acc.dtype}")
        if acc.is_cuda and exact:
            try:
                torch.addmm(acc, gy2.t(), x2, out_dtype=torch.float32, out=acc)
                _count("wgrad", "addmm fp32", "CUDA, bf16/f16 inputs")
                return acc
            except RuntimeError as e:  # a torch without addmm(out_dtype=) for these inputs
                _count("wgrad", "upcast addmm_", f"addmm(out_dtype=float32): {str(e)[:120]}")
        else:
            _count("wgrad", "upcast addmm_", "CPU tensors or float32 inputs")
        acc.addmm_(gy2.t().float(), x2.float())
        return acc
    if dtype == torch.float32:
        if gy2.is_cuda and exact:
            try:
                return torch.mm(gy2.t(), x2, out_dtype=torch.float32)
            except RuntimeError as e:
                _count("wgrad", "upcast mm", f"mm(out_dtype=float32): {str(e)[:120]}")
        return torch.mm(gy2.t().float(), x2.float())
    g = torch.matmul(gy2.t(), x2)
    return g if dtype is None or g.dtype == dtype else g.to(dtype)

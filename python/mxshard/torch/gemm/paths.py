# SPDX-License-Identifier: MIT
"""The GEMMs of a quantized linear, in one place (convert()'s linears, under every loop,
call these).

    y  = x  @ W^T + b      linear_fwd(x, primary, b, dt)            W: the row plane
    gx = gy @ W            linear_dgrad(gy, primary, plane, dt)     W: the plane the module's dgrad reads
    gw = gy^T @ x          linear_wgrad(gy2, x2, dtype=...)

`primary` is an mxshard.MXFP8Weight or NVFP4Weight holding at least the plane
asked for; dt is the compute dtype (the dtype of the weight operand as the
GEMM sees it, of the GEMMs and of the outputs). The weight operand is the
plane's dequantized values, bit for bit (`dequant` below): whatever path a
GEMM takes, it reads exactly these values.

Paths of linear_fwd / linear_dgrad (`choose_path` decides; `path_counts`
counts what ran, with the reason, in eager runs):

    fused     Triton GEMM that loads the plane's E4M3 / packed E2M1 bytes and
              block scales and up-converts them in registers before bf16/f16
              tensor-core MMAs (mxshard.torch.gemm.triton): no weight copy.
              CUDA, bf16/f16.
    chunked   the plane dequantized by the same Triton up-conversion, in one
              chunk when its compute-dtype copy fits in CHUNK_BYTES, else in
              equal chunks of at most CHUNK_BYTES, each chunk one cuBLAS GEMM
              writing its slice of the output. CUDA.
    dequant   the library's dequantize of the whole plane + torch matmul: the
              reference, and a candidate of the measured rule on CUDA. CPU
              tensors, and wherever a Triton path does not apply (no Triton, an
              NVFP4 plane with an odd row length, no tokens, compute capability
              < 8.0).

The measured rule (RULE below): per format and GEMM (fwd, dgrad of the row
plane, dgrad of the column plane), on a grid of weight sizes x token counts,
the path with the least max(host µs, GPU µs) per call, measured by
bench/torch_layer.py --parts sweep on the H200 (bench/RESULTS.md run 14b); a
GEMM takes the grid point nearest to it in log2(out*in) and log2(tokens).
Compute capability >= 10.0 `torch._scaled_mm` with MX block scales is not used
(no such device to test the operand preparation on).

Host time: everything a path needs that depends only on the weight (the
PlaneOperand, the chunk bounds, each chunk's prepared Triton launch and its
specialisation key) is built once per (primary, plane, dtype) and kept while
the primary's tensors are the same objects at the same addresses; Triton
kernels are launched through their compiled handle (gemm.triton's
FAST_LAUNCH).

linear_wgrad with dtype=float32 (a float32 weight's gradient) sums the exact
products of the bf16/f16 inputs in fp32 inside the GEMM (CUDA: cuBLAS with
`mm(..., out_dtype=float32)`; CPU: the same products, upcast to fp32), so no
bf16 rounding of the gradient comes first.
"""
from __future__ import annotations

import collections
import contextlib
import weakref

import torch
import torch.nn.functional as F

from ... import _lib as L
from ... import formats as _formats

__all__ = ["dequant", "output_dtype", "linear_fwd", "linear_dgrad", "linear_wgrad", "plane_operand", "choose_path", "forced_path",
           "path_counts", "RULE", "RULE_ELEMS", "RULE_TOKENS", "CHUNK_BYTES"]

_CODES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}

# ---- the measured rule ------------------------------------------------------------------------
#
# RULE[(format, gemm)][i][j]: the path ('F' fused, 'C' chunked, 'D' dequant) of GEMM `gemm`
# ('fwd', 'dgrad row', 'dgrad col') for a weight of about 2^RULE_ELEMS[i] elements (out * in)
# and about 2^RULE_TOKENS[j] tokens (rows of x / gy): the least max(host µs, GPU µs) per call of
# the three paths there (host: 10 calls issued back to back while the GPU sleeps; GPU: the same
# calls' kernels back to back), chunked then fused preferred within 10 % (host noise is ~5 µs
# and neither holds a full-size copy); square weights, bf16, padded scales, NVFP4 1x16.
#
# Measured by bench/torch_layer.py --parts sweep on the H200, 2026-12-01 (bench/RESULTS.md run
# 14b, bench/results/2026-12-01-run14b-layer.md: all 150 points). What it rests on, host / GPU µs
# per call (bf16 cuBLAS for scale: 15-50 host):
#   * chunked, one chunk (one Triton dequantize + one cuBLAS GEMM): 50-125 host, the least GPU
#     time of the three nearly everywhere (4096^2 at 2048 tokens: 115 GPU against bf16's 89, the
#     library path's 171, the fused kernel's 497-784); 4 chunks (8192^2): 200-350 host;
#   * dequant (the library's dequantize): 100-220 host (its Python checks + ctypes) and 1.0-4.7x
#     chunked's GPU time (its kernel moves ~0.6 TB/s, the Triton one ~1.6): picked nowhere;
#   * fused: 60-115 host, one launch; it wins where the chunked path's host time is the larger -
#     8192^2 at 16 tokens (4 chunks: 230-320 host against fused's 160-230 GPU) - and in a few
#     host-bound small cells where the two are within noise; from 256 tokens on its GPU time is
#     2.5-7x chunked's (no pipelining, the up-conversion redone for every M tile);
#   * 2^25.8-element weights (14336x4096) take the 2^26 row.
RULE_ELEMS = (18, 20, 22, 24, 26)        # 512^2 .. 8192^2
RULE_TOKENS = (4, 8, 11, 13, 14)         # 16, 256, 2048, 8192, 16384
RULE = {
    ('mxfp8', 'fwd'): ('CCFCC', 'CCCCC', 'CCCCC', 'CCCCC', 'FCCCC'),
    ('mxfp8', 'dgrad row'): ('CCCCC', 'FCCCC', 'CCCCC', 'CCCCC', 'FCCCC'),
    ('mxfp8', 'dgrad col'): ('CCCCC', 'CCCCC', 'CCCCC', 'CCCCC', 'CCCCC'),
    ('nvfp4', 'fwd'): ('CCCCC', 'CFCCC', 'CCCCC', 'CCCCC', 'FCCCC'),
    ('nvfp4', 'dgrad row'): ('CCFCC', 'CCCCC', 'CCCCC', 'CCCCC', 'FCCCC'),
    ('nvfp4', 'dgrad col'): ('CCCCC', 'FCCCC', 'CCCCC', 'CCCCC', 'FCCCC'),
}
_PATHS = {"F": "fused", "C": "chunked", "D": "dequant"}

# The dequantized weight in flight at once: at most this many bytes (one chunk when the whole
# plane's compute-dtype copy fits, else equal chunks no larger). Run 14's sweep: 32 MiB had the
# least time of 8 / 16 / 32 MiB; the whole plane at once was 3-6 % faster on 8192^2 and
# 14336x4096 but is the full-size copy issue 25 removes.
CHUNK_BYTES = 32 << 20
_CHUNK_ALIGN = 128  # chunk edges: a multiple of every block (32, 16) and of the dequantize tile


def _mid(grid):
    """Boundaries between neighbouring grid points, halfway in log2."""
    return tuple(2.0 ** ((a + b) / 2) for a, b in zip(grid, grid[1:]))


_ELEMS_MID, _TOKENS_MID = _mid(RULE_ELEMS), _mid(RULE_TOKENS)


def _nearest(v, mids):
    i = 0
    for m in mids:
        if v < m:
            break
        i += 1
    return i


_rule_reasons = {}


def _rule_path(fmt, gemm, elems, tokens):
    """(path, reason) of the measured rule for a GEMM of `tokens` rows on a weight of `elems`."""
    i, j = _nearest(elems, _ELEMS_MID), _nearest(tokens, _TOKENS_MID)
    key = (fmt, gemm, i, j)
    r = _rule_reasons.get(key)
    if r is None:
        r = (_PATHS[RULE[(fmt, gemm)][i][j]],
             f"measured rule: {fmt} {gemm}, ~2^{RULE_ELEMS[i]} weight elements, ~2^{RULE_TOKENS[j]} tokens")
        _rule_reasons[key] = r
    return r


def set_rule(rule=None, chunk_bytes=None):
    """Replace the rule table (and CHUNK_BYTES): the benchmark applies what its sweep measured."""
    global CHUNK_BYTES
    if rule is not None:
        RULE.update(rule)
    if chunk_bytes is not None:
        CHUNK_BYTES = chunk_bytes
    _rule_reasons.clear()
    _plans.clear()


# (op, path, reason) -> calls; the tests read it to see which path ran and why
path_counts = collections.Counter()


def _tally(key):
    """path_counts[key] += 1, in eager runs: under torch.compile a Python counter that the forward
    bumps is state dynamo guards on, and every call would recompile (torch.compile'd graphs
    count nothing)."""
    if not torch.compiler.is_compiling():
        path_counts[key] += 1
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
    """mxshard.torch.gemm.triton, or None (the import error kept in _kernels_err)."""
    global _kernels_mod, _kernels_err
    if _kernels_mod is None and _kernels_err is None:
        try:
            from . import triton as k
            _kernels_mod = k
        except Exception as e:  # no triton, or one that cannot load here
            _kernels_err = f"{type(e).__name__}: {e}"
    return _kernels_mod


def dequant(primary, plane, dtype):
    """The [out, in] weight of `plane` ("row" | "col") of `primary` in `dtype` (a torch dtype):
    a new tensor on the primary's device."""
    code = _CODES[dtype]
    return _formats.of(primary).dequantize(primary, plane=plane, dtype=code)


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
    fmt = _formats.of(primary)
    data = _bytes(getattr(primary, f"{plane}_data"))
    scale = _bytes(getattr(primary, f"{plane}_scale"))
    block = fmt.block_elems
    trans = fmt.transposed(plane)                    # NVFP4's column plane: P = W^T
    colwise_mx = plane == "col" and not trans        # MXFP8 column plane: blocks down the rows
    R, C = (cols, rows) if trans else (rows, cols)
    M, Kb = (cols, -(-rows // block)) if plane == "col" else (rows, -(-cols // block))
    Mp, Kp = _round_up(M, 128), _round_up(Kb, 4)
    layout = primary.layout
    if colwise_mx:
        s_m, s_k = 1, (M if layout == L.COMPACT else Mp)
    else:
        s_m, s_k = (Kb if layout == L.COMPACT else Kp), 1
    return k.PlaneOperand(data=data, scale=scale, amax=primary.amax.reshape(-1) if fmt.has_amax else scale, R=R,
                          C=C, fp4=fmt.packed, block=block, scale_c=not colwise_mx, swizzled=layout == L.SWIZZLED,
                          s_m=s_m, s_k=s_k, s_kp=Kp)


def _plane_row_len(fmt, primary, plane):
    """Elements per stored row of the plane (P's C)."""
    return primary.rows if fmt.transposed(plane) else primary.cols


def _chunk(extent, other, dt):
    """Rows per chunk of `extent` rows of `other` elements: all of them when they fit in
    CHUNK_BYTES, else equal chunks of a multiple of _CHUNK_ALIGN rows, at most CHUNK_BYTES
    each (or _CHUNK_ALIGN rows, where one such row block is larger)."""
    per_row = other * dt.itemsize
    if extent * per_row <= CHUNK_BYTES:
        return extent
    cap = max(_CHUNK_ALIGN, CHUNK_BYTES // per_row // _CHUNK_ALIGN * _CHUNK_ALIGN)
    n = -(-extent // cap)
    return min(cap, _round_up(-(-extent // n), _CHUNK_ALIGN))


class _Plan:
    """What the GEMMs of one plane in one compute dtype need that depends on the weight only,
    built once per primary (kept while its tensors are the same objects at the same addresses):
    the PlaneOperand, per chunk axis the chunks [(start, stop, DequantLaunch)], the paths
    chosen so far per (op, tokens), and whether the plane is stored transposed (P = W^T)."""

    __slots__ = ("names", "ts", "ptrs", "dt", "op", "_chunks", "routes", "trans")

    def __init__(self, primary, plane, dt, names, ts, trans):
        self.names, self.ts, self.trans = names, ts, trans
        self.ptrs = tuple(t.data_ptr() for t in ts)
        self.dt = dt
        self.op = plane_operand(primary, plane)
        self._chunks = [None, None]
        self.routes = {}

    def fresh(self, primary):
        """The primary still holds the same tensors at the same addresses."""
        for n, t, p in zip(self.names, self.ts, self.ptrs):
            if getattr(primary, n) is not t or t.data_ptr() != p:
                return False
        return True

    def rebind(self, primary, plane):
        """The same primary object with new tensors of the same shapes (FSDP2's assembly binds
        each gather's planes into one primary per plane, fsdp.units): the operand and the
        chunks' launches take the new tensors; the geometry and the routes are kept."""
        ts = tuple(getattr(primary, n) for n in self.names)
        self.ts, self.ptrs = ts, tuple(t.data_ptr() for t in ts)
        op = self.op
        amax = primary.amax.reshape(-1) if op.fp4 else None
        data, scale = _bytes(ts[0]), _bytes(ts[1])
        self.op = op.bound(data, scale, amax if op.fp4 else scale)
        for c in self._chunks:
            for _, _, launch in c or ():
                launch.rebind(self.op)

    def route(self, op, primary, plane, tokens, device):
        """choose_path's (path, reason, path_counts key) for (op, tokens), remembered."""
        r = self.routes.get((op, tokens))
        if r is None:
            if len(self.routes) >= 256:
                self.routes.clear()
            path, why = choose_path(op, primary, plane, tokens, self.dt, device)
            r = self.routes[(op, tokens)] = (path, why, (op, path, why))
        return r

    def chunks(self, axis):
        """axis 0: chunks of P's rows (P[r0:r1, :]); 1: of its columns (P[:, c0:c1])."""
        c = self._chunks[axis]
        if c is None:
            op, dt = self.op, self.dt
            d = _kernels().DequantLaunch
            if axis == 0:
                step = _chunk(op.R, op.C, dt)
                c = [(a, min(op.R, a + step), d(op, a, min(op.R, a + step), 0, op.C, dt)) for a in range(0, op.R, step)]
            else:
                step = _chunk(op.C, op.R, dt)
                c = [(a, min(op.C, a + step), d(op, 0, op.R, a, min(op.C, a + step), dt)) for a in range(0, op.C, step)]
            self._chunks[axis] = c
        return c


_plans = weakref.WeakKeyDictionary()   # primary -> {(plane, dtype): _Plan}
_PLAN_CACHE = True                     # False: a new plan every call (the benchmark's "run 14" emulation)
_NAMES = {(p, amax): (f"{p}_data", f"{p}_scale") + (("amax",) if amax else ()) for p in ("row", "col")
          for amax in (False, True)}


def _plan(primary, plane, dt):
    if _PLAN_CACHE:
        try:
            d = _plans.get(primary)
            if d is None:
                d = _plans[primary] = {}
        except TypeError:   # not hashable / weakly referenceable: no cache
            d = None
        if d is not None:
            p = d.get((plane, dt))
            if p is not None:
                if not p.fresh(primary):
                    p.rebind(primary, plane)
                return p
    fmt = _formats.of(primary)
    names = _NAMES[(plane, fmt.has_amax)]
    p = _Plan(primary, plane, dt, names, tuple(getattr(primary, n) for n in names), fmt.transposed(plane))
    if _PLAN_CACHE and d is not None:
        d[(plane, dt)] = p
    return p


def _decide(op, primary, plane, tokens, dt, device):
    """(path, reason, path_counts key, plan or None): the remembered choice of the primary's plan
    on the usual CUDA path, else choose_path's."""
    if _forced is None and tokens and _kernels_mod is not None and device.type == "cuda":
        plan = _plan(primary, plane, dt)
        return plan.route(op, primary, plane, tokens, device) + (plan,)
    path, why = choose_path(op, primary, plane, tokens, dt, device)
    return path, why, (op, path, why), None


_capability = {}


def _cc_major(device):
    i = device.index if device.index is not None else torch.cuda.current_device()
    c = _capability.get(i)
    if c is None:
        c = _capability[i] = torch.cuda.get_device_capability(i)[0]
    return c


_CPU_REASON = "CPU tensors: the library's dequantize + torch matmul (the reference)"
_GEMM_NAME = {("fwd", "row"): "fwd", ("dgrad", "row"): "dgrad row", ("dgrad", "col"): "dgrad col"}


def choose_path(op, primary, plane, tokens, dt, device):
    """('fused' | 'chunked' | 'dequant', reason) for GEMM `op` ('fwd' | 'dgrad') reading
    `plane` of `primary` with `tokens` rows of x / gy in compute dtype `dt` on `device`."""
    forced = _forced
    cuda = device.type == "cuda"
    if not cuda and forced in (None, "dequant"):
        return "dequant", _CPU_REASON
    if forced == "dequant":
        return "dequant", "forced"
    k = _kernels()
    if k is None:
        return "dequant", f"Triton is not available ({_kernels_err})"
    if not cuda and not k.INTERPRET:
        return "dequant", "CPU tensors and TRITON_INTERPRET unset (the Triton kernels run on CUDA)"
    if tokens == 0:
        return "dequant", "no tokens"
    fmt = _formats.of(primary)
    if fmt.packed and _plane_row_len(fmt, primary, plane) % 2:
        return "dequant", "NVFP4 plane with an odd row length (rows start inside a byte)"
    if cuda and _cc_major(device) < 8:
        return "dequant", "compute capability < 8.0 (Triton's bf16 tensor-core dot)"
    if forced is not None:
        if forced == "fused" and dt == torch.float32:
            return "chunked", "float32 compute dtype (the fused kernel multiplies bf16/f16)"
        return forced, "forced"
    path, why = _rule_path(fmt.name, _GEMM_NAME[(op, plane)], primary.rows * primary.cols,
                           tokens)
    if path == "fused" and dt == torch.float32:
        return "chunked", "float32 compute dtype (the fused kernel multiplies bf16/f16)"
    return path, why


def _count(op, path, reason):
    _tally((op, path, reason))


# ---- the GEMMs ----------------------------------------------------------------------------

def output_dtype(x):
    """The dtype nn.Linear returns for input x: autocast's inside autocast, else x's own (a
    converted linear computes in its compute dtype and hands back this one)."""
    dev = x.device.type
    return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype


def linear_fwd(x, primary, b, dt):
    """x @ deq(row)^T + b; x and b already in dt."""
    K, N = primary.cols, primary.rows
    path, _, key, plan = _decide("fwd", primary, "row", x.numel() // K, dt, x.device)
    _tally(key)
    if path == "dequant":
        return F.linear(x, dequant(primary, "row", dt), b)
    if plan is None:
        plan = _plan(primary, "row", dt)
    if path == "fused":
        return _kernels().qgemm(x.reshape(-1, K), plan.op, True, dt, bias=b).reshape(*x.shape[:-1], N)
    chunks = plan.chunks(0)                       # P = W: chunks of its rows, slices of y's columns
    if len(chunks) == 1:
        return F.linear(x, chunks[0][2].run(), b)
    x2 = x.reshape(-1, K)
    y2 = torch.empty(x2.shape[0], N, dtype=dt, device=x.device)
    for n0, n1, launch in chunks:
        w = launch.run()
        if b is None:
            torch.mm(x2, w.t(), out=y2[:, n0:n1])
        else:
            torch.addmm(b[n0:n1], x2, w.t(), out=y2[:, n0:n1])
        del w
    return y2.reshape(*x.shape[:-1], N)


def linear_dgrad(gy, primary, plane, dt):
    """gy @ deq(plane); gy already in dt."""
    K, N = primary.cols, primary.rows
    path, _, key, plan = _decide("dgrad", primary, plane, gy.numel() // N, dt, gy.device)
    _tally(key)
    if path == "dequant":
        return torch.matmul(gy, dequant(primary, plane, dt))
    if plan is None:
        plan = _plan(primary, plane, dt)
    trans = plan.trans                            # the NVFP4 column plane is P = W^T
    if path == "fused":
        return _kernels().qgemm(gy.reshape(-1, N), plan.op, trans, dt).reshape(*gy.shape[:-1], K)
    # P = W^T: chunks of P's rows; P = W: of its columns; either way slices of gx's columns
    chunks = plan.chunks(0 if trans else 1)
    if len(chunks) == 1:
        w = chunks[0][2].run()
        return torch.matmul(gy, w.t() if trans else w)
    gy2 = gy.reshape(-1, N)
    gx2 = torch.empty(gy2.shape[0], K, dtype=dt, device=gy.device)
    for c0, c1, launch in chunks:
        w = launch.run()
        torch.mm(gy2, w.t() if trans else w, out=gx2[:, c0:c1])
        del w
    return gx2.reshape(*gy.shape[:-1], K)


_WGRAD_ADDMM = ("wgrad", "addmm fp32", "CUDA, bf16/f16 inputs")


def input_and_bias_grads(gy, dt, need_gx, need_gb, primary_of, plane):
    """The backward's shared part for a quantized linear: gy cast to dt, gx = gy @ deq(plane) when
    need_gx (primary_of() gives the primary: only then is it fetched), gb = the sum of gy over the
    tokens when need_gb. Returns (gy2 [tokens, out], gx, gb)."""
    gy = gy.to(dt)
    gx = linear_dgrad(gy, primary_of(), plane, dt) if need_gx else None
    gy2 = gy.reshape(-1, gy.shape[-1])
    return gy2, gx, (gy2.sum(0) if need_gb else None)


def linear_wgrad(gy2, x2, dtype=None):
    """gy2^T @ x2 for 2-D gy2 [tokens, out], x2 [tokens, in] (both in the compute dtype), in
    `dtype` (default: the inputs' dtype); dtype=float32 sums the exact products in fp32 inside
    the GEMM (no rounding of the product to the inputs' dtype first)."""
    exact = gy2.dtype in (torch.bfloat16, torch.float16)   # their products are exact in fp32
    if dtype == torch.float32:
        if gy2.is_cuda and exact:
            try:
                return torch.mm(gy2.t(), x2, out_dtype=torch.float32)
            except RuntimeError as e:
                _count("wgrad", "upcast mm", f"mm(out_dtype=float32): {str(e)[:120]}")
        return torch.mm(gy2.t().float(), x2.float())
    g = torch.matmul(gy2.t(), x2)
    return g if dtype is None or g.dtype == dtype else g.to(dtype)

# SPDX-License-Identifier: MIT
"""Triton kernels that read a quantized weight plane directly (mxshard.torch.gemm.paths' fast paths).

    plane_dequant(op, r0, r1, c0, c1, dtype)   P[r0:r1, c0:c1] dequantized (a chunk for cuBLAS)
    dequant_launch(op, r0, r1, c0, c1, dtype)  the same, prepared once: .run() allocates + launches
    qgemm(a, op, trans, dtype, bias=None)      a @ B, B[k, n] = P[n, k] (trans) or P[k, n]

Launches (FAST_LAUNCH): `kernel[grid](...)` runs Triton's Python dispatch on every call
(binding, specialisation key, cache lookup, launch metadata: ~10-20 µs of host time). The
first call of each specialisation goes through it; its CompiledKernel is kept under a key
that determines Triton's specialisation of the same arguments (per runtime int: == 1, % 16,
32/64 bit; per tensor: dtype, 16-byte alignment; the constexprs, warps, stages, device), and
later calls with that key launch it directly (`CompiledKernel.run`, the C launcher).
Launch hooks (a profiler's launch_enter_hook) and TRITON_INTERPRET take Triton's path.

`op` is a PlaneOperand: one stored plane seen as a matrix P[R][C] with its data
bytes, scale bytes and scale geometry. MXFP8 planes and NVFP4 row planes are
P = W [out, in]; an NVFP4 column plane is stored transposed, P = W^T [in, out].

Both kernels load P through ONE helper, `_plane_tile`, a second implementation
of the library's dequantize rule (docs/contract.md 1.5 and 9.3), bit for bit:

    MXFP8   x' = fl32(e4m3(q) * 2^(e-127))                    e: the E8M0 byte of q's block
    NVFP4   x' = fl32(e2m1(n) * fl32(fl32(d * amax) * fl32(1/2688)))   d: the E4M3 scale
    then    bf16 (round to nearest even, on the bits: mxs_bf16_from_f32), f16 (cvt.rn), or f32;
            NaN results carry the library's bits (E4M3 NaN: its sign | 0x7FC00000, else 0x7FC00000).

Element values are built from their bits without a branch: an E4M3 byte q
placed as f32 bits sign | (q & 0x7F) << 20 is exactly e4m3(q) * 2^-120 (the
subnormal codes land on f32 subnormals with the same factor), and an E2M1
nibble n as sign | (n & 7) << 22 is e2m1(n) * 2^-126; one exact multiply by
2^120 / 2^126 gives the value (Triton emits plain mul.f32: no flush to zero).
python/tests/torch/gemm/test_torch_gemm.py checks every E4M3 code x every E8M0 byte and
every E2M1 code x every E4M3 scale x a set of amaxes against mxshard.dequantize.

Scale entry (m, k) of a block, as mxs_scale_geom_offset: compact / padded are
m * s_m + k * s_k (row-wise m*K + k, m*Kp + k; MXFP8 column-wise k*M + m,
k*Mp + m), swizzled ((m/128) * (Kp/4) + k/4) * 512 + (m%32) * 16 + ((m%128)/32) * 4 + k%4.
The block of element (r, c) of P is (m, k) = (r, c / B) when the blocks run
along P's rows (`scale_c`: MXFP8 row planes, every NVFP4 plane), (c, r / 32) for
an MXFP8 column plane.
"""
from __future__ import annotations

import collections
import os
from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl

__all__ = ["INTERPRET", "FAST_LAUNCH", "PlaneOperand", "plane_dequant", "dequant_launch", "qgemm", "gemm_config",
           "launch_counts"]

# TRITON_INTERPRET=1 (read by triton.jit when this module is imported): the kernels run in
# Triton's interpreter on CPU tensors (the CPU tests); otherwise compiled, on CUDA tensors.
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

_INTERP = tl.constexpr(INTERPRET)
_OUT_CODE = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}

# Launch compiled kernels directly once Triton has compiled them (see the module doc);
# MXS_TRITON_FAST_LAUNCH=0 (or setting this False) keeps Triton's dispatch for every call.
FAST_LAUNCH = not INTERPRET and os.environ.get("MXS_TRITON_FAST_LAUNCH", "1") not in ("", "0")
# (kernel, "fast" | "triton") -> launches: the tests and the benchmark read it
launch_counts = collections.Counter()


@dataclass(frozen=True)
class PlaneOperand:
    """One stored plane as the kernels read it: P[R][C], row-major data (packed
    E2M1 when fp4, even flat index in the low nibble), scale entry (m, k) at
    m*s_m + k*s_k (or swizzled with Kp = s_kp), blocks of `block` elements along
    P's rows (scale_c) or down its columns."""
    data: torch.Tensor      # uint8, flat
    scale: torch.Tensor     # uint8, flat
    amax: torch.Tensor      # float32 [1] (NVFP4); MXFP8: the scale tensor (never read)
    R: int
    C: int
    fp4: bool
    block: int
    scale_c: bool
    swizzled: bool
    s_m: int
    s_k: int
    s_kp: int
    spec: tuple = field(default=(), compare=False)   # _spec of (data, scale, amax, C, s_m, s_k, s_kp)

    def __post_init__(self):
        if not self.spec:
            object.__setattr__(self, "spec", _spec_of((self.data, self.scale, self.amax, self.C, self.s_m, self.s_k,
                                                       self.s_kp)))

    def bound(self, data, scale, amax):
        """The same plane geometry over other tensors of the same shapes (a primary rebound to a new
        gather's planes): a copy whose three tensors and their part of `spec` are replaced. (Built
        from the fields directly: dataclasses.replace re-runs every field's setter, tens of µs per
        gathered weight.)"""
        op = object.__new__(PlaneOperand)
        d = op.__dict__
        d.update(self.__dict__)
        d["data"], d["scale"], d["amax"] = data, scale, amax
        d["spec"] = (_spec(data), _spec(scale), _spec(amax)) + self.spec[3:]
        return op


# ---- launching ---------------------------------------------------------------------------

_I32 = (-(1 << 31), 1 << 31)


def _spec(v):
    """What Triton's specialisation of one runtime argument depends on (triton 3.6,
    native_specialize_impl): a tensor's dtype and 16-byte alignment; an int's == 1
    (a constant), % 16 == 0 and 32/64-bit type."""
    if isinstance(v, torch.Tensor):
        return (v.dtype, v.data_ptr() % 16 == 0)
    if v == 1:
        return 1
    return (v % 16 == 0) + (0 if _I32[0] <= v < _I32[1] else 2) + 4


def _spec_of(args):
    return tuple(_spec(v) for v in args)


_knobs = None


def _hooked():
    """A launch hook is installed (a profiler): Triton's own launch path then. (Triton 3.6's
    hooks are HookChains, empty unless something added a hook; older ones None or a function.)"""
    global _knobs
    if _knobs is None:
        _knobs = getattr(triton, "knobs", False)
    if not _knobs:
        return False
    r = _knobs.runtime
    for h in (r.launch_enter_hook, r.launch_exit_hook):
        if h is not None and getattr(h, "calls", True):
            return True
    return False


class _Fast:
    """One @triton.jit kernel launched through the CompiledKernel of each specialisation."""

    def __init__(self, fn, name):
        self.fn = fn
        self.name = name
        self.compiled = {}   # key -> (launcher, function, packed_metadata)

    def __call__(self, grid, key, args, num_warps, num_stages):
        """kernel[grid](*args) (args: every parameter in order, constexprs included, as
        Triton's JIT passes them to the launcher); `key`: the specialisation key of the
        runtime arguments (the caller's _spec's) + the constexprs."""
        fast = FAST_LAUNCH
        if fast:
            dev = torch._C._cuda_getDevice()
            k = self.compiled.get((dev, key))
            if k is not None and not _hooked():
                k[0](grid[0], grid[1], grid[2], torch._C._cuda_getCurrentRawStream(dev), k[1], k[2], None, None, None,
                     *args)
                launch_counts[(self.name, "fast")] += 1
                return
        ck = self.fn[grid](*args, num_warps=num_warps, num_stages=num_stages)
        launch_counts[(self.name, "triton")] += 1
        if fast and ck is not None and not hasattr(ck, "result"):
            run = ck.run   # loads the binary (the JIT launch above already did)
            self.compiled[(dev, key)] = (run, ck.function, ck.packed_metadata)


# ---- the dequantize rule, in registers ---------------------------------------------------

@triton.jit
def _f32_bits(u):
    return u.to(tl.float32, bitcast=True)


@triton.jit
def _block_mult(s, amax, FP4: tl.constexpr):
    """The f32 factor of each block from its scale byte s (int32): MXFP8 2^(e-127)
    (0x00 -> 2^-127, a subnormal; 0xFF -> NaN); NVFP4 fl32(fl32(d * amax) * fl32(1/2688))."""
    if FP4:
        d = _f32_bits(((s & 0x80) << 24) | ((s & 0x7F) << 20)) * 1.329227995784916e+36  # e4m3(s), * 2^120
        d = tl.where((s & 0x7F) == 0x7F, float("nan"), d)
        return (d * amax) * 0.00037202381645329297  # fl32(1/2688) = 0x39C30C31
    bits = tl.where(s == 0, 0x00400000, tl.where(s == 255, 0x7FC00000, s << 23))
    return _f32_bits(bits)


@triton.jit
def _to_out(v, OUT: tl.constexpr):
    """f32 -> the output dtype (0 f32, 1 bf16, 2 f16); NaNs keep the bits given (the
    library's: mxs_bf16_from_f32 gives (u >> 16) | 0x40, mxs_f16_from_f32 sign | 0x7E00 |
    mantissa bits for the canonical NaNs used here)."""
    if OUT == 0:
        r = v
    elif OUT == 1:
        u = v.to(tl.uint32, bitcast=True)
        isnan = (u & 0x7FFFFFFF) > 0x7F800000
        h = tl.where(isnan, (u >> 16) | 0x40, (u + 0x7FFF + ((u >> 16) & 1)) >> 16)
        r = h.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        u = v.to(tl.uint32, bitcast=True)
        isnan = (u & 0x7FFFFFFF) > 0x7F800000
        nan16 = ((u >> 16) & 0x8000) | 0x7E00 | ((u >> 13) & 0x3FF)
        h = tl.where(isnan, nan16, v.to(tl.float16).to(tl.uint16, bitcast=True).to(tl.uint32))
        r = h.to(tl.uint16).to(tl.float16, bitcast=True)
    return r


@triton.jit
def _plane_tile(q_ptr, s_ptr, amax, r0, c0, r_end, c_end, C, s_m, s_k, s_kp,
                TR: tl.constexpr, TC: tl.constexpr, FP4: tl.constexpr, BLOCK: tl.constexpr,
                SCALE_C: tl.constexpr, SWIZZLED: tl.constexpr, OUT: tl.constexpr):
    """P[r0:r0+TR, c0:c0+TC] dequantized, as a [TR, TC] tensor of the output dtype;
    elements outside r < r_end, c < c_end are 0. r0 and c0 are multiples of BLOCK
    (of 32 for SCALE_C=False); FP4 needs an even C."""
    rows = r0 + tl.arange(0, TR)
    cols = c0 + tl.arange(0, TC)
    rmask = rows < r_end
    mask = rmask[:, None] & (cols[None, :] < c_end)
    row_off = rows.to(tl.int64) * C
    if FP4:
        half = c0 // 2 + tl.arange(0, TC // 2)
        bmask = rmask[:, None] & (half[None, :] * 2 < c_end)
        b = tl.load(q_ptr + (row_off // 2)[:, None] + half[None, :], mask=bmask, other=0).to(tl.int32)
        n = tl.reshape(tl.join(b & 15, b >> 4), (TR, TC))  # the even flat index in the low nibble
        x = _f32_bits(((n & 8) << 28) | ((n & 7) << 22)) * 8.507059173023462e+37  # e2m1(n) * 2^-126, * 2^126
    else:
        q = tl.load(q_ptr + row_off[:, None] + cols[None, :], mask=mask, other=0).to(tl.int32)
        x = _f32_bits(((q & 0x80) << 24) | ((q & 0x7F) << 20)) * 1.329227995784916e+36  # e4m3(q) * 2^-120, * 2^120
    if SCALE_C:
        sm = rows
        sk = c0 // BLOCK + tl.arange(0, TC // BLOCK)
        smask = rmask[:, None] & (sk[None, :] * BLOCK < c_end)
        if SWIZZLED:
            soff = ((sm // 128) * (s_kp // 4))[:, None] * 512 + (sk // 4)[None, :] * 512 + \
                ((sm % 32) * 16 + ((sm % 128) // 32) * 4)[:, None] + (sk % 4)[None, :]
        else:
            soff = sm.to(tl.int64)[:, None] * s_m + sk[None, :] * s_k
        s = tl.load(s_ptr + soff, mask=smask, other=0).to(tl.int32)
        f = _block_mult(s, amax, FP4)
        f = tl.reshape(tl.broadcast_to(f[:, :, None], (TR, TC // BLOCK, BLOCK)), (TR, TC))
    else:
        sm = cols
        sk = r0 // BLOCK + tl.arange(0, TR // BLOCK)
        smask = (sk[:, None] * BLOCK < r_end) & (cols[None, :] < c_end)
        if SWIZZLED:
            soff = ((sm // 128) * (s_kp // 4))[None, :] * 512 + (sk // 4)[:, None] * 512 + \
                ((sm % 32) * 16 + ((sm % 128) // 32) * 4)[None, :] + (sk % 4)[:, None]
        else:
            soff = sm.to(tl.int64)[None, :] * s_m + sk[:, None] * s_k
        s = tl.load(s_ptr + soff, mask=smask, other=0).to(tl.int32)
        f = _block_mult(s, amax, FP4)
        f = tl.reshape(tl.broadcast_to(f[:, None, :], (TR // BLOCK, BLOCK, TC)), (TR, TC))
    v = x * f
    if FP4:
        v = tl.where(v != v, _f32_bits(tl.full((TR, TC), 0x7FC00000, tl.int32)), v)  # NVFP4: every NaN is 0x7FC00000
    else:
        qnan = (q & 0x7F) == 0x7F
        nan_bits = tl.where(qnan, ((q & 0x80) << 24) | 0x7FC00000, 0x7FC00000)
        v = tl.where(qnan | (v != v), _f32_bits(nan_bits), v)  # the code 0x7F (x any scale), or the scale 0xFF
    v = tl.where(mask, v, 0.0)
    return _to_out(v, OUT)


# ---- kernels -----------------------------------------------------------------------------

@triton.jit
def _dequant_kernel(q_ptr, s_ptr, amax_ptr, out_ptr, r0, c0, r_end, c_end, C, s_m, s_k, s_kp, out_stride,
                    TR: tl.constexpr, TC: tl.constexpr, FP4: tl.constexpr, BLOCK: tl.constexpr,
                    SCALE_C: tl.constexpr, SWIZZLED: tl.constexpr, OUT: tl.constexpr):
    pr = tl.program_id(0)
    pc = tl.program_id(1)
    if FP4:
        amax = tl.load(amax_ptr).to(tl.float32)
    else:
        amax = 0.0
    tr0 = r0 + pr * TR
    tc0 = c0 + pc * TC
    w = _plane_tile(q_ptr, s_ptr, amax, tr0, tc0, r_end, c_end, C, s_m, s_k, s_kp, TR, TC, FP4, BLOCK, SCALE_C,
                    SWIZZLED, OUT)
    rows = tr0 + tl.arange(0, TR)
    cols = tc0 + tl.arange(0, TC)
    off = (rows - r0).to(tl.int64)[:, None] * out_stride + (cols - c0)[None, :]
    tl.store(out_ptr + off, w, mask=(rows < r_end)[:, None] & (cols < c_end)[None, :])


@triton.jit
def _dot(a, b, acc):
    if _INTERP:  # Triton 3.6's interpreter multiplies bf16 operands as raw bits: give it their exact f32
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    return tl.dot(a, b, acc)


@triton.jit
def _k_step(acc, a_rows, rm, rk, k0, M, N, K, sak, q_ptr, s_ptr, amax, pid_n, C, s_m, s_k, s_kp,
            TRANS: tl.constexpr, FP4: tl.constexpr, BLOCK: tl.constexpr, SCALE_C: tl.constexpr,
            SWIZZLED: tl.constexpr, OUT: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """acc += A[:, k0:k0+BK] @ B[k0:k0+BK, n tile]."""
    a = tl.load(a_rows + (k0 + rk)[None, :] * sak, mask=(rm[:, None] < M) & ((k0 + rk)[None, :] < K), other=0.0)
    if TRANS:
        w = _plane_tile(q_ptr, s_ptr, amax, pid_n * BN, k0, N, K, C, s_m, s_k, s_kp, BN, BK, FP4, BLOCK, SCALE_C,
                        SWIZZLED, OUT)
        return _dot(a, tl.trans(w), acc)
    w = _plane_tile(q_ptr, s_ptr, amax, k0, pid_n * BN, K, N, C, s_m, s_k, s_kp, BK, BN, FP4, BLOCK, SCALE_C,
                    SWIZZLED, OUT)
    return _dot(a, w, acc)


@triton.jit
def _qgemm_kernel(a_ptr, q_ptr, s_ptr, amax_ptr, bias_ptr, c_ptr, M, N, K, sam, sak, scm, scn,
                  C, s_m, s_k, s_kp,
                  TRANS: tl.constexpr, FP4: tl.constexpr, BLOCK: tl.constexpr, SCALE_C: tl.constexpr,
                  SWIZZLED: tl.constexpr, OUT: tl.constexpr, HAS_BIAS: tl.constexpr, INTERP: tl.constexpr,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
    """C[M, N] = A[M, K] @ B (+ bias[N]); B[k, n] = P[n, k] (TRANS) or P[k, n]; fp32 accumulate."""
    pid = tl.program_id(0)
    grid_m = tl.cdiv(M, BM)
    grid_n = tl.cdiv(N, BN)
    group = GROUP_M * grid_n
    first_m = (pid // group) * GROUP_M
    gm = min(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % gm
    pid_n = (pid % group) // gm
    if FP4:
        amax = tl.load(amax_ptr).to(tl.float32)
    else:
        amax = 0.0
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    a_rows = a_ptr + rm.to(tl.int64)[:, None] * sam
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    if INTERP:  # the interpreter cannot take a tensor as a range() bound (numpy >= 2.4)
        k0 = 0
        while k0 < K:
            acc = _k_step(acc, a_rows, rm, rk, k0, M, N, K, sak, q_ptr, s_ptr, amax, pid_n, C, s_m, s_k, s_kp,
                          TRANS, FP4, BLOCK, SCALE_C, SWIZZLED, OUT, BN, BK)
            k0 += BK
    else:
        for k0 in range(0, K, BK):
            acc = _k_step(acc, a_rows, rm, rk, k0, M, N, K, sak, q_ptr, s_ptr, amax, pid_n, C, s_m, s_k, s_kp,
                          TRANS, FP4, BLOCK, SCALE_C, SWIZZLED, OUT, BN, BK)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    out = acc.to(c_ptr.dtype.element_ty)
    tl.store(c_ptr + rm.to(tl.int64)[:, None] * scm + rn[None, :] * scn, out, mask=(rm[:, None] < M) & (rn[None, :] < N))


# ---- launchers ---------------------------------------------------------------------------

_fast_dequant = _Fast(_dequant_kernel, "dequant")
_fast_qgemm = _Fast(_qgemm_kernel, "qgemm")

# The dequantize tile (rows, columns, warps) on a GPU: the fastest of bench/torch_layer.py's
# candidates on the H200 (bench/RESULTS.md run 14b; 8192x8192 planes, µs for MXFP8 row / col,
# NVFP4 row / col: 32x128 4 warps 104.5 / 101.4 / 87.4 / 87.1, 64x128 4w 101.2 / 100.1 / 84.6 /
# 84.3, 32x256 4w 94.6 / 92.3 / 81.8 / 81.5, 64x256 8w 103.1 / 108.6 / 93.4 / 93.2).
DEQUANT_TILE = (32, 256, 4)


def _dequant_tile(rows, cols):
    if INTERPRET:  # the interpreter runs one program at a time, in Python: few, large tiles
        TC = min(256, max(32, triton.next_power_of_2(cols)))
        return min((1 << 16) // TC, max(32, triton.next_power_of_2(rows))), TC, 4
    return DEQUANT_TILE


class DequantLaunch:
    """P[r0:r1, c0:c1] of `op` in `dtype`, prepared once (grid, arguments, specialisation key):
    run() allocates the [r1-r0, c1-c0] output (or takes `out`, rows `out_stride` apart),
    launches, returns it."""

    __slots__ = ("rows", "cols", "dtype", "device", "grid", "pre", "post", "key", "warps")

    def __init__(self, op, r0, r1, c0, c1, dtype, out_stride=None):
        rows, cols = r1 - r0, c1 - c0
        TR, TC, warps = _dequant_tile(rows, cols)
        self.rows, self.cols, self.dtype, self.device = rows, cols, dtype, op.data.device
        self.grid = (triton.cdiv(rows, TR), triton.cdiv(cols, TC), 1)
        self.pre = (op.data, op.scale, op.amax)
        self.post = (r0, c0, r1, c1, op.C, op.s_m, op.s_k, op.s_kp, cols if out_stride is None else out_stride,
                     TR, TC, op.fp4, op.block, op.scale_c, op.swizzled, _OUT_CODE[dtype])
        self.warps = warps
        # a fresh output (torch's allocations are aligned) has the same specialisation every time
        self.key = op.spec[:3] + ((dtype, True),) + _spec_of(self.post[:9]) + self.post[9:] + (warps,)

    def rebind(self, op):
        """The same geometry over `op`'s tensors (a primary rebound to a new gather's planes)."""
        self.pre = (op.data, op.scale, op.amax)
        self.key = op.spec[:3] + self.key[3:]

    def run(self, out=None):
        if out is None:
            out = torch.empty(self.rows, self.cols, dtype=self.dtype, device=self.device)
            key = self.key
        else:
            key = self.key[:3] + (_spec(out),) + self.key[4:]
        _fast_dequant(self.grid, key, self.pre + (out,) + self.post, self.warps, 1)
        return out


def dequant_launch(op: PlaneOperand, r0, r1, c0, c1, dtype):
    """A DequantLaunch of P[r0:r1, c0:c1] (r0, c0: multiples of 32, c0 even; r1 - r0, c1 - c0 >= 1)."""
    return DequantLaunch(op, r0, r1, c0, c1, dtype)


def plane_dequant(op: PlaneOperand, r0, r1, c0, c1, dtype, out=None):
    """P[r0:r1, c0:c1] in `dtype` as a new (or the given: rows x cols of unit column stride)
    [r1-r0, c1-c0] tensor. r0, c0: multiples of 32 (and c0 even, r1 - r0, c1 - c0 >= 1)."""
    return DequantLaunch(op, r0, r1, c0, c1, dtype, None if out is None else out.stride(0)).run(out)


# Tile configurations (BM, BN, BK, warps, stages) by the number of rows of A: first choices,
# not tuned (bench/RESULTS.md run 14: at 16-64 rows, 64 CTAs of 4 warps stream a 4096x4096
# plane in ~145 µs, far from its ~5 µs of bytes; at 2048 rows the 128x128x64 tiles run 5.5x
# cuBLAS's bf16 time). gemm.paths' measured rule decides where this kernel runs.
_CONFIGS = (
    (16, dict(BM=16, BN=64, BK=128, num_warps=4, num_stages=4)),
    (32, dict(BM=32, BN=64, BK=128, num_warps=4, num_stages=4)),
    (64, dict(BM=64, BN=64, BK=128, num_warps=4, num_stages=4)),
    (None, dict(BM=128, BN=128, BK=64, num_warps=8, num_stages=3)),
)


def gemm_config(M):
    if INTERPRET:  # one program at a time, in Python: few, large tiles
        return dict(BM=min(64, max(16, triton.next_power_of_2(M))), BN=128, BK=256, num_warps=4, num_stages=1)
    for upto, cfg in _CONFIGS:
        if upto is None or M <= upto:
            return dict(cfg)


def qgemm(a, op: PlaneOperand, trans, dtype, bias=None, out=None, config=None):
    """a [M, K] (dtype, any strides) @ B -> [M, N] in dtype; B[k, n] = P[n, k] if trans
    else P[k, n]; fp32 accumulation, + bias [N] (dtype) in fp32 before the one rounding."""
    M, K = a.shape
    N = op.R if trans else op.C
    if out is None:
        out = torch.empty(M, N, dtype=dtype, device=a.device)
    cfg = config or gemm_config(M)
    BM, BN, BK = cfg["BM"], cfg["BN"], cfg["BK"]
    grid = (triton.cdiv(M, BM) * triton.cdiv(N, BN), 1, 1)
    rt = (M, N, K, a.stride(0), a.stride(1), out.stride(0), out.stride(1))
    b = bias if bias is not None else out
    const = (trans, op.fp4, op.block, op.scale_c, op.swizzled, _OUT_CODE[dtype], bias is not None, INTERPRET, BM, BN,
             BK, 8)
    key = (_spec(a), op.spec[:3], _spec(b), _spec(out), _spec_of(rt), op.spec[3:], const, cfg["num_warps"],
           cfg["num_stages"])
    _fast_qgemm(grid, key, (a, op.data, op.scale, op.amax, b, out) + rt + (op.C, op.s_m, op.s_k, op.s_kp) + const,
                cfg["num_warps"], cfg["num_stages"])
    return out

# SPDX-License-Identifier: MIT
"""An independent numpy reference of the MXFP8 rules (docs: formats,
roundings, layouts), written from the rules, not from the C code: E4M3 by
exact scaling and numpy's round-half-even, E8M0 from frexp, block amax with
NaN ignored, scale placement from the layout formulas. Checked against the
oracle vectors in tests/vectors/ by test_reference.py."""
import numpy as np

F32, BF16, F16 = "f32", "bf16", "f16"

# the 128 non-negative E4M3 codes and their values (0x7F is NaN)
_E4M3_POS = np.array([(2.0 ** ((q >> 3) - 7)) * (1 + (q & 7) / 8) if (q >> 3) else (q & 7) * 2.0 ** -9
                      for q in range(128)], dtype=np.float64)
_E4M3_POS[0x7F] = np.nan


def e4m3_from_f32(x):
    """f32 array -> E4M3 codes: round to nearest even, satfinite, NaN -> 0x7F."""
    x = np.asarray(x, dtype=np.float32)
    a = np.abs(x.astype(np.float64))
    sign = np.signbit(x).astype(np.uint8) << 7
    finite = np.isfinite(a)
    af = np.where(finite, a, 0.0)
    _, e = np.frexp(af)  # af = m * 2^e, m in [0.5, 1)
    q_exp = np.maximum(e - 1, -6) - 3  # quantum: 2^(exp-3) for normals, 2^-9 below 2^-6
    quantum = np.ldexp(1.0, q_exp)
    v = np.rint(af / quantum) * quantum  # exact scaling; rint rounds half to even
    v = np.minimum(v, 448.0)
    code = np.searchsorted(_E4M3_POS[:0x7F], v).astype(np.uint8)
    code = np.where(finite, code, 0x7E).astype(np.uint8)  # +-inf -> +-448
    code = code | sign
    return np.where(np.isnan(x), 0x7F, code).astype(np.uint8)


def e4m3_to_f32(q):
    q = np.asarray(q, dtype=np.uint8)
    v = _E4M3_POS[q & 0x7F]
    return np.where(q & 0x80, -v, v).astype(np.float32)


def e8m0_up(v):
    """Smallest 2^(e-127) >= |v| (0 -> 0, >= 2^127 or inf -> 254, NaN -> 255)."""
    a = np.abs(np.asarray(v, dtype=np.float32).astype(np.float64))
    m, e = np.frexp(np.where(np.isfinite(a), a, 0.0))
    ceil_log2 = np.where(m == 0.5, e - 1, e)
    out = np.clip(ceil_log2 + 127, 0, 254)
    out = np.where(a == 0, 0, out)
    out = np.where(np.isinf(a), 254, out)
    return np.where(np.isnan(a), 255, out).astype(np.uint8)


def e8m0_down(v):
    """Largest 2^(e-127) <= |v| (below 2^-127 -> 0, inf -> 254, NaN -> 255)."""
    a = np.abs(np.asarray(v, dtype=np.float32).astype(np.float64))
    m, e = np.frexp(np.where(np.isfinite(a), a, 0.0))
    out = np.clip(e - 1 + 127, 0, 254)
    out = np.where(a == 0, 0, out)
    out = np.where(np.isinf(a), 254, out)
    return np.where(np.isnan(a), 255, out).astype(np.uint8)


def e8m0_from_amax(amax, rounding):
    amax = np.asarray(amax, dtype=np.float32)
    if rounding == "floor":
        d = e8m0_down(amax).astype(np.int32)
        return np.where(d == 255, 255, np.maximum(d - 8, 0)).astype(np.uint8)
    return e8m0_up(amax * np.float32(1.0 / 448.0))


def quant_mult(e):
    """2^(127-e) in f32 (2^-127 for e = 254)."""
    e = np.asarray(e, dtype=np.int64)
    return np.ldexp(np.float32(1.0), (127 - e).astype(np.int32)).astype(np.float32)


def bf16_round(x):
    """f32 -> nearest-even bf16, back as f32."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    out = r.astype(np.uint32).view(np.float32)
    return np.where(np.isnan(x), x, out).astype(np.float32)


def bf16_bits_to_f32(b):
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x):
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    return np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), r).astype(np.uint16)


def widen(src, dtype):
    if dtype == BF16:
        return bf16_bits_to_f32(src)
    return np.asarray(src).astype(np.float32)


def round_through(x, to):
    if to == BF16:
        return bf16_round(x)
    if to == F16:
        return x.astype(np.float16).astype(np.float32)
    return x


# ---- layouts ------------------------------------------------------------------

def _ceil(a, b):
    return -(-a // b)


def geom(rows, cols, plane):
    M = rows if plane == "row" else cols
    K = _ceil(cols if plane == "row" else rows, 32)
    return M, K, _ceil(M, 128) * 128, _ceil(K, 4) * 4


def scale_plane_bytes(rows, cols, plane, layout):
    M, K, Mp, Kp = geom(rows, cols, plane)
    return M * K if layout == "compact" else Mp * Kp


def place(S, rows, cols, plane, layout):
    """Logical S[M][K] (uint8) -> the plane's bytes in `layout`, padding 0."""
    M, K, Mp, Kp = geom(rows, cols, plane)
    m, k = np.meshgrid(np.arange(M), np.arange(K), indexing="ij")
    if layout == "compact":
        off = (k * M + m) if plane == "col" else (m * K + k)
        out = np.zeros(M * K, np.uint8)
    elif layout == "padded":
        off = (k * Mp + m) if plane == "col" else (m * Kp + k)
        out = np.zeros(Mp * Kp, np.uint8)
    else:
        off = ((m // 128) * (Kp // 4) + k // 4) * 512 + (m % 32) * 16 + ((m % 128) // 32) * 4 + k % 4
        out = np.zeros(Mp * Kp, np.uint8)
    out[off.ravel()] = S.ravel()
    return out


def unplace(buf, rows, cols, plane, layout):
    """Inverse of place: the logical S[M][K] from a plane's bytes."""
    M, K, Mp, Kp = geom(rows, cols, plane)
    m, k = np.meshgrid(np.arange(M), np.arange(K), indexing="ij")
    if layout == "compact":
        off = (k * M + m) if plane == "col" else (m * K + k)
    elif layout == "padded":
        off = (k * Mp + m) if plane == "col" else (m * Kp + k)
    else:
        off = ((m // 128) * (Kp // 4) + k // 4) * 512 + (m % 32) * 16 + ((m % 128) // 32) * 4 + k % 4
    return np.asarray(buf).reshape(-1)[off]


# ---- quantize -----------------------------------------------------------------

def _amax(a):
    a = np.abs(a)
    return np.where(np.isnan(a), 0, a).max(axis=-1).astype(np.float32)


def quantize(x, planes, layout, rounding):
    """x: rows x cols f32 (already widened/rounded). Returns {plane: (data, scale_bytes)}."""
    rows, cols = x.shape
    out = {}
    if planes in ("row", "both"):
        K = _ceil(cols, 32)
        xp = np.zeros((rows, K * 32), np.float32)
        xp[:, :cols] = x
        blocks = xp.reshape(rows, K, 32)
        e = e8m0_from_amax(_amax(blocks), rounding)  # rows x K
        q = e4m3_from_f32(blocks * quant_mult(e)[:, :, None]).reshape(rows, K * 32)[:, :cols]
        out["row"] = (np.ascontiguousarray(q), place(e, rows, cols, "row", layout))
    if planes in ("col", "both"):
        K = _ceil(rows, 32)
        xp = np.zeros((K * 32, cols), np.float32)
        xp[:rows] = x
        blocks = xp.T.reshape(cols, K, 32)  # m = c, k = row group
        e = e8m0_from_amax(_amax(blocks), rounding)  # cols x K
        q = e4m3_from_f32(blocks * quant_mult(e)[:, :, None]).reshape(cols, K * 32)[:, :rows].T
        out["col"] = (np.ascontiguousarray(q), place(e, rows, cols, "col", layout))
    return out


def dequantize(data, scale, rows, cols, plane, layout):
    """-> f32 rows x cols."""
    S = unplace(scale, rows, cols, plane, layout)  # M x K
    r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    e = S[r, c // 32] if plane == "row" else S[c, r // 32]
    factor = np.ldexp(np.float32(1.0), (e.astype(np.int32) - 127)).astype(np.float32)
    factor = np.where(e == 0, np.float32(2.0 ** -127), factor).astype(np.float32)
    v = e4m3_to_f32(np.asarray(data).reshape(rows, cols)) * factor
    return np.where(e == 255, np.float32(np.nan), v).astype(np.float32)

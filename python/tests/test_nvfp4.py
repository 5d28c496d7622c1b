# SPDX-License-Identifier: MIT
"""NVFP4 from Python (mxshard.nvfp4): the E2M1 oracle vectors through
quantize/dequantize, quantize/dequantize/convert against an independent numpy
reference of the format rules (docs/contract.md section 9, written here from
the rules, not from the C code), rejections before any write, and
NVFP4BucketWriteback over 2 and 3 gloo processes (one process group per world
size) against a whole-tensor quantize, with exactly one MAX all-reduce per
bucket per update."""
import datetime
import os
import traceback

import numpy as np
import pytest

import mxshard
import reference as ref
from conftest import VECTORS
from torch_harness import spawn_ranks

LAYOUTS = ["compact", "padded", "swizzled"]
F32 = np.float32
FLT_MAX = np.finfo(np.float32).max
FLT_MIN = np.finfo(np.float32).tiny
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])

# ---- the reference: the rules of docs/contract.md section 9 in numpy -----------------


def ref_e2m1(x):
    """f32 -> E2M1 code: nearest of the 8 magnitudes, a tie to the even code,
    saturating at 6 (inf included), the sign kept (-0 -> 0x8), NaN -> 0x7."""
    x = np.asarray(x, np.float32)
    with np.errstate(invalid="ignore"):  # signalling NaNs among the oracle inputs
        a = np.abs(x.astype(np.float64))
    a = np.where(np.isnan(a), 0.0, np.minimum(a, 6.0))
    dist = np.abs(a[..., None] - E2M1)
    cand = dist == dist.min(-1, keepdims=True)
    even = cand & (np.arange(8) % 2 == 0)
    idx = np.where(cand.sum(-1) > 1, np.argmax(even, -1), np.argmax(cand, -1))
    code = idx.astype(np.uint8) | (np.signbit(x).astype(np.uint8) << 3)
    return np.where(np.isnan(x), 7, code).astype(np.uint8)


def ref_e2m1_value(q):
    q = np.asarray(q, np.uint8)
    v = E2M1[q & 7].astype(np.float32)
    return np.where(q & 8, -v, v).astype(np.float32)


def _abs0(x):  # |x| with NaN -> 0 (a NaN never raises an amax)
    return np.abs(np.where(np.isnan(x), F32(0), x)).astype(np.float32)


def ref_s_enc(amax):
    with np.errstate(all="ignore"):
        return F32(1) if not amax > 0 else F32(min(F32(2688) / max(F32(amax), FLT_MIN), FLT_MAX))


def ref_block_scale(bamax, s):
    with np.errstate(all="ignore"):
        k = F32(s * (F32(1) / F32(6)))
        v = (np.asarray(bamax, np.float32) * k).astype(np.float32)
    v = np.where(np.isnan(v) | (v > FLT_MAX), FLT_MAX, v).astype(np.float32)
    return ref.e4m3_from_f32(v)


def ref_encode_mult(code, s):
    d = ref.e4m3_to_f32(code)
    with np.errstate(all="ignore"):
        dec = F32(F32(1) / s)
        e = (F32(1) / (d * dec)).astype(np.float32)
    return np.where(d > 0, np.minimum(e, FLT_MAX), FLT_MAX).astype(np.float32)


def ref_place(S, layout):
    """S[M][K] -> the bytes of a scale plane in `layout` (padding 0)."""
    M, K = S.shape
    if layout == "compact":
        return S.reshape(-1).copy()
    Mp, Kp = -(-M // 128) * 128, -(-K // 4) * 4
    if layout == "padded":
        out = np.zeros((Mp, Kp), np.uint8)
        out[:M, :K] = S
        return out.reshape(-1)
    out = np.zeros(Mp * Kp, np.uint8)
    m, k = np.meshgrid(np.arange(M), np.arange(K), indexing="ij")
    off = ((m // 128) * (Kp // 4) + k // 4) * 512 + (m % 32) * 16 + ((m % 128) // 32) * 4 + k % 4
    out[off] = S
    return out


def ref_unplace(buf, M, K, layout):
    buf = np.asarray(buf).reshape(-1)
    if layout == "compact":
        return buf.reshape(M, K)
    Kp = -(-K // 4) * 4
    if layout == "padded":
        return buf.reshape(-1, Kp)[:M, :K]
    m, k = np.meshgrid(np.arange(M), np.arange(K), indexing="ij")
    return buf[((m // 128) * (Kp // 4) + k // 4) * 512 + (m % 32) * 16 + ((m % 128) // 32) * 4 + k % 4]


def ref_pack(q):
    q = np.asarray(q, np.uint8).reshape(-1)
    if q.size % 2:
        q = np.append(q, np.uint8(0))
    return (q[0::2] | (q[1::2] << 4)).astype(np.uint8)


def ref_unpack(b, n):
    b = np.asarray(b, np.uint8).reshape(-1)
    return np.stack([b & 15, b >> 4], -1).reshape(-1)[:n]


def ref_quantize(x, planes, block, layout):
    """{plane: (packed data, scale bytes)}, amax of the rows x cols f32 x."""
    x = np.asarray(x, np.float32)
    rows, cols = x.shape
    amax = F32(_abs0(x).max())
    s = ref_s_enc(amax)
    R, C = -(-rows // 16), -(-cols // 16)
    if block == "16x16":
        xp = np.zeros((R * 16, C * 16), np.float32)
        xp[:rows, :cols] = _abs0(x)
        tile = ref_block_scale(xp.reshape(R, 16, C, 16).max((1, 3)), s)
    out = {}
    for pn in (["row", "col"] if planes == "both" else [planes]):
        xt = x if pn == "row" else x.T
        M, N = xt.shape
        K = -(-N // 16)
        if block == "1x16":
            xp = np.zeros((M, K * 16), np.float32)
            xp[:, :N] = _abs0(xt)
            sc = ref_block_scale(xp.reshape(M, K, 16).max(-1), s)
        else:
            m = np.arange(M)
            sc = tile[m // 16, :] if pn == "row" else tile[:, m // 16].T
        e = np.repeat(ref_encode_mult(sc, s), 16, axis=1)[:, :N]
        with np.errstate(all="ignore"):
            q = ref_e2m1((xt * e).astype(np.float32))
        out[pn] = (ref_pack(q), ref_place(np.ascontiguousarray(sc), layout))
    return out, amax


def ref_dequantize(data, scale, amax, rows, cols, plane, layout):
    """f32 rows x cols: e2m1(q) * fl32(fl32(d * amax) * fl32(1/2688)); NaN -> 0x7FC00000."""
    M, N = (rows, cols) if plane == "row" else (cols, rows)
    K = -(-N // 16)
    d = ref.e4m3_to_f32(ref_unplace(scale, M, K, layout))
    with np.errstate(all="ignore"):
        f = ((d * F32(amax)).astype(np.float32) * (F32(1) / F32(2688))).astype(np.float32)
        v = (ref_e2m1_value(ref_unpack(data, M * N)).reshape(M, N) * np.repeat(f, 16, 1)[:, :N]).astype(np.float32)
    v = np.where(np.isnan(v), np.uint32(0x7FC00000).view(np.float32), v)
    return v if plane == "row" else np.ascontiguousarray(v.T)


def _bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


def make_src(rng, shape, specials=True):
    x = (rng.standard_normal(shape) * np.exp2(rng.integers(-12, 12, size=shape))).astype(np.float32)
    if specials and x.size > 8:
        flat = x.reshape(-1)
        idx = rng.choice(flat.size, size=5, replace=False)
        flat[idx] = [0.0, -0.0, np.nan, 3e-41, -1e-6]
    return x


def as_dtype(x, dtype):
    """(what to pass, src_dtype, its f32 value)."""
    if dtype == "f32":
        return x, None, x
    if dtype == "f16":
        h = np.nan_to_num(x, nan=1.0).clip(-6e4, 6e4).astype(np.float16)
        return h, None, h.astype(np.float32)
    b = ref.f32_to_bf16_bits(x)
    return b, "bf16", ref.bf16_bits_to_f32(b)


def assert_weight(w, want, amax):
    planes, got_amax = want
    for pn in ("row", "col"):
        if pn not in planes:
            assert getattr(w, f"{pn}_data") is None and getattr(w, f"{pn}_scale") is None
            continue
        data, scale = planes[pn]
        assert np.array_equal(_np(getattr(w, f"{pn}_data")).reshape(-1), data), f"{pn} data"
        assert np.array_equal(_np(getattr(w, f"{pn}_scale")).reshape(-1), scale), f"{pn} scales"
    assert _bits(_np(w.amax))[0] == _bits(amax if amax is not None else got_amax)


def _np(a):
    return a.detach().cpu().numpy() if hasattr(a, "detach") else np.asarray(a)


# ---- the reference itself, and the oracle vectors through the API ------------------------


def _vectors(name):
    rows = [ln.split() for ln in open(os.path.join(VECTORS, name)) if ln.strip() and not ln.startswith("#")]
    return rows


def test_reference_e2m1_matches_oracle():
    v = _vectors("e2m1_from_f32.txt")
    x = np.array([int(a, 16) for a, _ in v], np.uint32).view(np.float32)
    assert np.array_equal(ref_e2m1(x), np.array([int(b, 16) for _, b in v], np.uint8))
    d = _vectors("e2m1_to_f32.txt")
    assert np.array_equal(_bits(ref_e2m1_value(np.array([int(a, 16) for a, _ in d], np.uint8))),
                          np.array([int(b, 16) for _, b in d], np.uint32))


def test_oracle_e2m1_through_quantize():
    """Every oracle input the element rule can meet through quantize: each
    1x16 block holds 6.0 (block amax 6 -> scale 1.0) and up to 15 inputs,
    one block holds 2688 (S_enc = 1), so the multiplier is exactly 1 and every
    nibble is E2M1(input). That is every input with |x| <= 6 (and NaNs);
    inputs in (6, 6.3) have their own block (scale still 1.0)."""
    v = _vectors("e2m1_from_f32.txt")
    x = np.array([int(a, 16) for a, _ in v], np.uint32).view(np.float32)
    want = np.array([int(b, 16) for _, b in v], np.uint8)
    a = np.abs(x)
    small = np.isnan(x) | (a <= 6)
    mid = (a > 6) & (a < 6.3)
    xs, ws = x[small], want[small]
    nb = -(-xs.size // 15)
    pad = nb * 15 - xs.size
    body = np.concatenate([xs, np.zeros(pad, np.float32)]).reshape(nb, 15)
    blocks = np.concatenate([np.full((nb, 1), 6.0, np.float32), body], 1)
    solo = np.zeros((int(mid.sum()), 16), np.float32)
    solo[:, 0] = x[mid]
    top = np.zeros((1, 16), np.float32)
    top[0, 0] = 2688.0
    src = np.ascontiguousarray(np.concatenate([top, blocks, solo]))
    w = mxshard.NVFP4Weight.empty(*src.shape, planes="row", layout="compact")
    mxshard.quantize_nvfp4(w, src)
    assert w.amax[0] == 2688.0
    assert np.all(w.row_scale[1:] == 0x38)  # E4M3 1.0 everywhere but the 2688 block
    q = ref_unpack(w.row_data, src.size).reshape(src.shape)
    assert np.array_equal(q[1:1 + nb, 1:].reshape(-1)[:xs.size], ws)
    assert np.all(q[1:1 + nb, 0] == 7)
    assert np.array_equal(q[1 + nb:, 0], want[mid])
    assert xs.size + solo.shape[0] > 60000  # the vectors really went through


def test_oracle_e2m1_through_dequantize():
    """All 16 codes decode as the oracle: scale 1.0, amax 2688 -> factor 1."""
    d = _vectors("e2m1_to_f32.txt")
    codes = np.array([int(a, 16) for a, _ in d], np.uint8)
    w = mxshard.NVFP4Weight.empty(1, 16, planes="row", layout="compact")
    w.row_data[...] = ref_pack(codes).reshape(w.row_data.shape)
    w.row_scale[...] = 0x38
    w.amax[0] = 2688.0
    out = mxshard.dequantize_nvfp4(w, dtype="f32")
    assert np.array_equal(_bits(out).reshape(-1), np.array([int(b, 16) for _, b in d], np.uint32))


def test_infinity_and_zero_tensors():
    """amax = inf: S_enc = 0; the infinity's block gets 448 and e = 0 (its
    elements become NaN -> +6), finite blocks scale 0 and saturate."""
    x = np.zeros((2, 32), np.float32)
    x[0, 3], x[0, 5], x[1, 20], x[1, 21] = np.inf, 1.0, -2.0, 0.0
    w = mxshard.NVFP4Weight.empty(2, 32, planes="both", layout="compact")
    mxshard.quantize_nvfp4(w, x)
    assert_weight(w, ref_quantize(x, "both", "1x16", "compact"), None)
    assert np.isinf(w.amax[0]) and w.row_scale[0, 0] == 0x7E and w.row_scale[1, 1] == 0x00
    q = ref_unpack(w.row_data, 64).reshape(2, 32)
    assert q[0, 3] == 7 and q[0, 5] == 0 and q[1, 20] == 0xF and q[1, 21] == 0
    z = mxshard.NVFP4Weight.empty(5, 7, planes="both", block="16x16")
    mxshard.quantize_nvfp4(z, np.zeros((5, 7), np.float32))
    assert z.amax[0] == 0 and not z.row_data.any() and not z.row_scale.any() and not z.col_data.any()


# ---- whole-tensor quantize / dequantize / convert vs the reference ---------------------

SHAPES = [(1, 1), (3, 7), (16, 16), (17, 33), (33, 1), (1, 50), (40, 70), (65, 97), (130, 18)]


@pytest.mark.parametrize("shape", SHAPES)
def test_quantize_dequantize_match_reference(rng, shape):
    for planes in ("row", "col", "both"):
        for block in ("1x16", "16x16"):
            layout = LAYOUTS[rng.integers(3)]
            dtype = ["f32", "bf16", "f16"][rng.integers(3)]
            rt = [None, "bf16", "f16"][rng.integers(3)]
            src, sdt, wide = as_dtype(make_src(rng, shape), dtype)
            w = mxshard.NVFP4Weight.empty(*shape, planes=planes, block=block, layout=layout)
            assert w.quantize_(src, round_through=rt, src_dtype=sdt) is w
            x = ref.round_through(wide, rt) if rt else wide
            want = ref_quantize(x, planes, block, layout)
            assert_weight(w, want, None)
            for pn in want[0]:
                data, scale = want[0][pn]
                exp = ref_dequantize(data, scale, want[1], *shape, pn, layout)
                got = mxshard.dequantize_nvfp4(w, plane=pn, dtype="f32")
                assert got.shape == shape and np.array_equal(_bits(got), _bits(exp)), pn
                h = w.dequantize(plane=pn, dtype="f16")
                assert np.array_equal(h, exp.astype(np.float16))
                b = w.dequantize(plane=pn, dtype="bf16")
                assert np.array_equal(np.asarray(b).view(np.uint16), ref.f32_to_bf16_bits(exp))


def test_16x16_planes_share_tiles(rng):
    """16x16: the column-wise plane is the nibble transpose of the row-wise
    one and its scales the row-wise scales transposed."""
    x = make_src(rng, (48, 32), specials=False)
    w = mxshard.NVFP4Weight.empty(48, 32, planes="both", block="16x16", layout="compact")
    mxshard.quantize_nvfp4(w, x)
    qr = ref_unpack(w.row_data, 48 * 32).reshape(48, 32)
    qc = ref_unpack(w.col_data, 48 * 32).reshape(32, 48)
    assert np.array_equal(qr.T, qc)
    assert np.array_equal(np.repeat(w.row_scale[::16].T, 16, axis=0), w.col_scale)


def test_torch_cpu_tensors_equal_numpy(rng):
    torch = pytest.importorskip("torch")
    x = make_src(rng, (37, 45))
    for block in ("1x16", "16x16"):
        a = mxshard.NVFP4Weight.empty(37, 45, planes="both", block=block, layout="swizzled")
        b = mxshard.NVFP4Weight.empty(37, 45, planes="both", block=block, layout="swizzled", device="cpu")
        assert b.is_torch and b.amax.dtype == torch.float32 and b.row_data.dtype == torch.uint8
        mxshard.quantize_nvfp4(a, x.astype(np.float16))
        mxshard.quantize_nvfp4(b, torch.from_numpy(x).to(torch.float16))
        for pn in ("row", "col"):
            assert np.array_equal(getattr(a, f"{pn}_data"), getattr(b, f"{pn}_data").numpy())
            assert np.array_equal(getattr(a, f"{pn}_scale"), getattr(b, f"{pn}_scale").numpy())
        assert a.amax[0] == b.amax.item()
        tb = torch.from_numpy(x).to(torch.bfloat16)
        mxshard.quantize_nvfp4(b, tb)
        mxshard.quantize_nvfp4(a, ref.f32_to_bf16_bits(x), src_dtype="bf16")
        assert np.array_equal(a.row_data, b.row_data.numpy())
        d = mxshard.dequantize_nvfp4(b, plane="col", dtype="bf16")
        assert d.dtype == torch.bfloat16 and d.shape == (37, 45)
        if hasattr(torch, "float4_e2m1fn_x2"):
            assert b.fp4_view("row").dtype == torch.float4_e2m1fn_x2


def test_shapes_sizes_and_te_names():
    w = mxshard.NVFP4Weight.empty(100, 200, planes="both")
    assert w.row_data.shape == (100, 100) and w.col_data.shape == (200, 50)   # TE's [rows, cols/2], [cols, rows/2]
    assert w.row_scale.shape == (128, 16) and w.col_scale.shape == (256, 8)   # [round_up(M,128), round_up(K,4)]
    assert w.amax.shape == (1,) and w.amax.dtype == np.float32
    odd = mxshard.NVFP4Weight.empty(3, 7, planes="both", layout="compact")
    assert odd.row_data.shape == (11,) and odd.col_data.shape == (11,)        # rows share bytes: flat
    assert odd.row_scale.shape == (3, 1) and odd.col_scale.shape == (7, 1)
    assert mxshard.nvfp4_scale_shape(3, 7, "col", "swizzled") == (128, 4)
    assert mxshard.nvfp4_data_shape(4, 7, "col") == (7, 2)
    assert w.storage_bytes() == 2 * 10000 + 128 * 16 + 256 * 8 + 4
    assert set(w.te_buffers()) == {"rowwise_data", "rowwise_scale_inv", "columnwise_data", "columnwise_scale_inv",
                                   "amax_rowwise", "amax_columnwise"}
    r = mxshard.NVFP4Weight.empty(10, 20)
    assert r.col_data is None and r.col_scale is None and r.te_buffers()["amax_columnwise"] is None
    assert "16x16" in repr(mxshard.NVFP4Weight.empty(2, 2, block="16x16"))


def test_cuda_symbols_missing_raise_unsupported(monkeypatch):
    """A CUDA library without the NVFP4 entry points: UnsupportedError naming them."""
    import types
    from mxshard import _lib as L
    fake = types.SimpleNamespace(quantize=None, dequantize=object(), convert_scales=None, wb_partial=None,
                                 wb_apply=None, wb_finish=None, cuda=types.SimpleNamespace(path="libfake.so"))
    monkeypatch.setattr(L, "_nvfp4_cuda", fake)
    with pytest.raises(mxshard.UnsupportedError, match="mxs_cuda_nvfp4_quantize.*libfake.so"):
        L.nvfp4_cuda("quantize_nvfp4", need=("quantize",))
    with pytest.raises(mxshard.UnsupportedError, match="mxs_cuda_nvfp4_wb_partial"):
        L.nvfp4_cuda("NVFP4BucketWriteback", need=L._NVFP4_CUDA_WB)
    assert L.nvfp4_cuda("dequantize_nvfp4", need=("dequantize",)) is fake


def test_struct_layouts_checked():
    from mxshard import _lib as L
    nv = L.nvfp4_host()
    for which, mine in L._nvfp4_layout_facts().items():
        assert nv.host.struct_size(which) == mine != 0


def test_convert_scales(rng):
    for rows, cols, pn in [(1, 1, "row"), (130, 70, "row"), (130, 70, "col"), (5, 300, "col")]:
        M, N = (rows, cols) if pn == "row" else (cols, rows)
        S = rng.integers(0, 0x7F, size=(M, -(-N // 16)), dtype=np.uint8)
        src = ref_place(S, "compact")
        for to in LAYOUTS:
            out = mxshard.convert_nvfp4_scales(rows, cols, pn, src, "compact", to)
            assert out.shape == mxshard.nvfp4_scale_shape(rows, cols, pn, to)
            assert np.array_equal(out.reshape(-1), ref_place(S, to))
            back = mxshard.convert_nvfp4_scales(rows, cols, pn, out, to, "compact")
            assert np.array_equal(back.reshape(-1), src)
    x = make_src(rng, (40, 70))
    w = mxshard.NVFP4Weight.empty(40, 70, planes="both", layout="padded")
    mxshard.quantize_nvfp4(w, x)
    s = w.with_layout("swizzled")
    assert s.row_data is w.row_data and s.amax is w.amax
    assert_weight(s, ref_quantize(x, "both", "1x16", "swizzled"), None)


# ---- rejections: before any write --------------------------------------------------------


def test_bad_inputs_rejected_before_writing():
    w = mxshard.NVFP4Weight.empty(8, 40, planes="both")
    for a in (w.row_data, w.row_scale, w.col_data, w.col_scale):
        a[...] = 0xAB
    w.amax[0] = 5.0
    snap = [a.copy() for a in (w.row_data, w.row_scale, w.col_data, w.col_scale, w.amax)]
    x = np.ones((8, 40), np.float32)
    bad = [
        (ValueError, lambda: mxshard.quantize_nvfp4(w, np.ones(319, np.float32))),
        (ValueError, lambda: mxshard.quantize_nvfp4(w, np.ones((8, 40), np.float64))),
        (ValueError, lambda: mxshard.quantize_nvfp4(w, np.ones((8, 40), np.uint16))),  # raw bits need src_dtype
        (ValueError, lambda: mxshard.quantize_nvfp4(w, x, round_through="f64")),
        (ValueError, lambda: mxshard.quantize_nvfp4(w, np.ones((40, 8), np.float32).T)),  # not contiguous
        (TypeError, lambda: mxshard.quantize_nvfp4(object(), x)),
        (TypeError, lambda: mxshard.quantize_nvfp4(w, [1.0] * 320)),
        (ValueError, lambda: mxshard.dequantize_nvfp4(w, plane="both")),
        (ValueError, lambda: mxshard.dequantize_nvfp4(w, dtype="f64")),
        (ValueError, lambda: mxshard.dequantize_nvfp4(w, out=np.empty(319, np.float32))),
        (ValueError, lambda: mxshard.convert_nvfp4_scales(8, 40, "row", w.row_scale[:10], "padded", "compact")),
        (ValueError, lambda: mxshard.convert_nvfp4_scales(0, 40, "row", w.row_scale, "padded", "compact")),
    ]
    for exc, fn in bad:
        with pytest.raises(exc):
            fn()
        for a, b in zip((w.row_data, w.row_scale, w.col_data, w.col_scale, w.amax), snap):
            assert np.array_equal(a, b), "a rejected call wrote"
    r = mxshard.NVFP4Weight.empty(8, 40, planes="row")
    with pytest.raises(ValueError, match="no col-wise plane"):
        mxshard.dequantize_nvfp4(r, plane="col")
    ro = np.ones((8, 40), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        mxshard.dequantize_nvfp4(r, dtype="f32", out=ro)


def test_aliasing_rejected():
    buf = np.zeros(4096, np.uint8)
    w = mxshard.NVFP4Weight.from_buffers(8, 40, row_data=buf[1536:1696], row_scale=buf[:512],
                                         amax=np.zeros(1, np.float32))
    with pytest.raises(mxshard.AliasingError):
        mxshard.quantize_nvfp4(w, buf[256:1536].view(np.float32))  # src over the scales
    with pytest.raises(mxshard.AliasingError):
        mxshard.dequantize_nvfp4(w, dtype="f32", out=buf[1600:2880].view(np.float32))
    assert not buf.any()


def test_bad_weights_rejected():
    ok = dict(row_data=np.zeros(160, np.uint8), row_scale=np.zeros((128, 4), np.uint8),
              amax=np.zeros(1, np.float32))
    mxshard.NVFP4Weight.from_buffers(8, 40, **ok)
    cases = [
        (ValueError, dict(ok, amax=None), "amax"),
        (ValueError, dict(ok, amax=np.zeros(2, np.float32)), "1 element"),
        (ValueError, dict(ok, amax=np.zeros(1, np.float64)), "float32"),
        (ValueError, dict(ok, row_data=np.zeros(161, np.uint8)), "needs 160"),
        (ValueError, dict(ok, row_scale=np.zeros((8, 3), np.uint8)), "needs 512"),
        (ValueError, dict(ok, row_scale=np.zeros((128, 4), np.float32)), "1-byte"),
        (ValueError, dict(ok, col_data=np.zeros(160, np.uint8)), "without its scales"),
        (ValueError, dict(row_data=ok["row_data"], amax=ok["amax"]), "at least one plane"),
    ]
    for exc, kw, msg in cases:
        with pytest.raises(exc, match=msg):
            mxshard.NVFP4Weight.from_buffers(8, 40, **kw)
    # no row data (FSDP: the rank keeps fragments): a writeback-only weight
    fsdp = mxshard.NVFP4Weight.from_buffers(8, 40, **dict(ok, row_data=None))
    with pytest.raises(mxshard.AbsentPlaneError):
        mxshard.quantize_nvfp4(fsdp, np.zeros((8, 40), np.float32))
    with pytest.raises(mxshard.AbsentPlaneError):
        mxshard.dequantize_nvfp4(fsdp)
    with pytest.raises(ValueError, match="fragments"):
        fsdp.fp4_view()
    with pytest.raises(ValueError, match="block"):
        mxshard.NVFP4Weight.empty(8, 40, block="2x16")
    with pytest.raises(ValueError, match="layout"):
        mxshard.NVFP4Weight.empty(8, 40, layout="tiled")
    with pytest.raises(ValueError):
        mxshard.NVFP4Weight.empty(0, 40)
    with pytest.raises(mxshard.SizeOverflowError):
        mxshard.NVFP4Weight.from_buffers(1 << 62, 1 << 10, **ok)
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="mix"):
        mxshard.NVFP4Weight.from_buffers(8, 40, **dict(ok, amax=torch.zeros(1)))


# ---- the writeback in one process ------------------------------------------------------------


def _whole(x, rows, cols, planes, block, layout, rt):
    w = mxshard.NVFP4Weight.empty(rows, cols, planes=planes, block=block, layout=layout)
    return mxshard.quantize_nvfp4(w, np.ascontiguousarray(np.asarray(x, np.float32).reshape(rows, cols)),
                                  round_through=rt)


def weights_equal(w, r):
    for pn in ("row", "col"):
        a, b = getattr(w, f"{pn}_data"), getattr(r, f"{pn}_data")
        assert (a is None) == (b is None)
        if a is not None:
            assert np.array_equal(_np(a).reshape(-1), _np(b).reshape(-1)), f"{pn} data differs"
            assert np.array_equal(_np(getattr(w, f"{pn}_scale")).reshape(-1),
                                  _np(getattr(r, f"{pn}_scale")).reshape(-1)), f"{pn} scales differ"
    assert _bits(_np(w.amax))[0] == _bits(_np(r.amax))[0], "amax differs"


def test_writeback_world_of_one_and_simulated_ranks(rng):
    """run() without torch.distributed (a world of one), and 3 simulated
    ranks driven step by step: partial, MAX over the entries, apply, copy of
    each rank's byte ranges (the gather), finish."""
    for rt in ("bf16", None):
        cases = [(17, 33, "both", "1x16", "padded"), (16, 48, "both", "16x16", "swizzled"),
                 (5, 9, "col", "16x16", "compact"), (40, 7, "row", "1x16", "compact")]
        xs = [make_src(rng, (r, c)) for r, c, *_ in cases]
        ws = [mxshard.NVFP4Weight.empty(r, c, planes=p, block=b, layout=lay) for r, c, p, b, lay in cases]
        wb = mxshard.NVFP4BucketWriteback([(w, x.reshape(-1), 0) for w, x in zip(ws, xs)], round_through=rt)
        assert wb.entry_bytes == (2 if rt == "bf16" else 4)
        wb.run()
        for w, x, (r, c, p, b, lay) in zip(ws, xs, cases):
            weights_equal(w, _whole(x, r, c, p, b, lay, rt))
        # 3 simulated ranks, even cuts
        world = 3
        ranks = []
        for k in range(world):
            items, prim = [], []
            for (r, c, p, b, lay), x in zip(cases, xs):
                n = r * c
                cut = [0] + [min(n, 2 * (n * j // (2 * world))) for j in range(1, world)] + [n]
                w = mxshard.NVFP4Weight.empty(r, c, planes=p, block=b, layout=lay)
                items.append((w, x.reshape(-1)[cut[k]:cut[k + 1]].copy(), cut[k]))
                prim.append((w, cut[k], cut[k + 1]))
            ranks.append((mxshard.NVFP4BucketWriteback(items, round_through=rt), prim))
        for wbk, _ in ranks:
            wbk.partial()
        red = np.maximum.reduce([wbk.entries() for wbk, _ in ranks])
        for wbk, _ in ranks:
            wbk.entries()[...] = red
            wbk.apply()
        for i in range(len(cases)):  # the gather: every rank's bytes [start/2, ceil(end/2))
            for src_wb, src_p in ranks:
                w0, lo, hi = src_p[i]
                for dst_wb, dst_p in ranks:
                    w1 = dst_p[i][0]
                    bl, bh = lo // 2, (hi + 1) // 2
                    if w0.has_row:
                        w1.row_data.reshape(-1)[bl:bh] = w0.row_data.reshape(-1)[bl:bh]
                    if src_wb._stages[i] is not None:
                        dst_wb._stages[i].obj[bl:bh] = src_wb._stages[i].obj[bl:bh]
        for wbk, prim in ranks:
            wbk.finish()
            for (w, _, _), x, (r, c, p, b, lay) in zip(prim, xs, cases):
                weights_equal(w, _whole(x, r, c, p, b, lay, rt))


def test_writeback_rejections_single_process():
    w = mxshard.NVFP4Weight.empty(3, 7, planes="both")
    m = np.ones(21, np.float32)
    with pytest.raises(mxshard.RangeError, match="odd boundary"):
        mxshard.NVFP4BucketWriteback([(w, m[:5], 5)])
    with pytest.raises(mxshard.RangeError, match="odd boundary"):
        mxshard.NVFP4BucketWriteback([(w, m[:5], 0)])
    mxshard.NVFP4BucketWriteback([(w, m[:11], 10)])           # ends at rows*cols = 21: fine
    mxshard.NVFP4BucketWriteback([(w, m[:0], 5)])             # empty: any start
    with pytest.raises(ValueError, match="outside"):
        mxshard.NVFP4BucketWriteback([(w, m[:4], 18)])
    with pytest.raises(ValueError, match="shard length"):
        mxshard.NVFP4BucketWriteback([(w, m, 0, 20)])
    with pytest.raises(TypeError, match="NVFP4Weight"):
        mxshard.NVFP4BucketWriteback([(mxshard.MXFP8Weight.empty(3, 7), m, 0)])
    with pytest.raises(ValueError, match="col_stage"):
        mxshard.NVFP4BucketWriteback([(mxshard.NVFP4Weight.empty(3, 7), m, 0, 21, np.zeros(11, np.uint8))])
    with pytest.raises(ValueError, match="needs 11"):
        mxshard.NVFP4BucketWriteback([(w, m, 0, 21, np.zeros(10, np.uint8))])
    with pytest.raises(mxshard.AliasingError):
        mxshard.NVFP4BucketWriteback([(w, m, 0), (w, m, 0)])
    with pytest.raises(mxshard.AliasingError):
        mxshard.NVFP4BucketWriteback([(w, w.col_scale.reshape(-1)[:84].view(np.float32), 0)])
    with pytest.raises(ValueError, match="round_through"):
        mxshard.NVFP4BucketWriteback([(w, m, 0)], round_through="f8")
    wb = mxshard.NVFP4BucketWriteback([(w, m, 0)])
    wb.close()
    with pytest.raises(ValueError, match="closed"):
        wb.run()


def test_cuda_tensors_routed_or_unsupported(rng):
    """CUDA tensors: byte-equal to the host path through mxs_cuda_nvfp4_*,
    or UnsupportedError when the loaded CUDA library lacks them."""
    from conftest import cuda_or_skip
    torch = cuda_or_skip()
    from mxshard import _lib as L
    cu = L.cuda_lib().lib
    has = {n: getattr(cu, f"mxs_cuda_nvfp4_{n}", None) is not None for n in L._NVFP4_CUDA_OPS + L._NVFP4_CUDA_WB}
    x = make_src(rng, (33, 40))
    for block in ("1x16", "16x16"):
        host = mxshard.quantize_nvfp4(mxshard.NVFP4Weight.empty(33, 40, planes="both", block=block,
                                                                layout="swizzled"), x, round_through="bf16")
        g = mxshard.NVFP4Weight.empty(33, 40, planes="both", block=block, layout="swizzled", device="cuda")
        if not has["quantize"]:
            with pytest.raises(mxshard.UnsupportedError, match="mxs_cuda_nvfp4_quantize"):
                mxshard.quantize_nvfp4(g, torch.from_numpy(x).cuda())
            continue
        mxshard.quantize_nvfp4(g, torch.from_numpy(x).cuda(), round_through="bf16")
        weights_equal(g, host)
        if has["dequantize"]:
            for pn in ("row", "col"):
                d = mxshard.dequantize_nvfp4(g, plane=pn, dtype="f32")
                assert np.array_equal(_bits(_np(d)), _bits(mxshard.dequantize_nvfp4(host, plane=pn, dtype="f32")))
        if has["convert_scales"]:
            c = mxshard.convert_nvfp4_scales(33, 40, "col", g.col_scale, "swizzled", "compact")
            assert np.array_equal(_np(c), mxshard.convert_nvfp4_scales(33, 40, "col", host.col_scale, "swizzled",
                                                                       "compact"))
        # the writeback, a world of one on the GPU: two shards of one rank (even cut)
        g2 = mxshard.NVFP4Weight.empty(33, 40, planes="both", block=block, layout="swizzled", device="cuda")
        m = torch.from_numpy(x.reshape(-1)).cuda()
        items = [(g2, m[:600], 0)]
        if not all(has[n] for n in L._NVFP4_CUDA_WB):
            with pytest.raises(mxshard.UnsupportedError, match="mxs_cuda_nvfp4_wb"):
                mxshard.NVFP4BucketWriteback(items)
            continue
        for _ in range(2):
            g2.amax.zero_()
            wb = mxshard.NVFP4BucketWriteback([(g2, m, 0)], round_through="bf16")
            wb.run()
            torch.cuda.synchronize()
            weights_equal(g2, host)


def test_cuda_prepared_bucket_many_items(rng):
    """A CUDA NVFP4BucketWriteback runs the prepared bucket (one kernel per
    phase for any number of items): 40 weights of odd shapes, every block and
    layout, bytes equal to the host quantize, twice on the same buffers."""
    from conftest import cuda_or_skip
    torch = cuda_or_skip()
    from mxshard import _lib as L
    cu = L.cuda_lib().lib
    if getattr(cu, "mxs_cuda_nvfp4_wb_prepare", None) is None:
        pytest.skip("libmxshard_cuda without the NVFP4 prepared bucket")
    shapes = [(int(rng.integers(1, 70)), 8 * int(rng.integers(1, 40)) - int(rng.integers(0, 2))) for _ in range(40)]
    blocks, layouts = ("1x16", "16x16"), ("compact", "padded", "swizzled")
    ws = [mxshard.NVFP4Weight.empty(r, c, planes=("row", "both")[i % 2], block=blocks[(i // 2) % 2],
                                    layout=layouts[i % 3], device="cuda") for i, (r, c) in enumerate(shapes)]
    for update in range(2):
        masters = [rng.standard_normal(r * c).astype(np.float32) * (1 + update) for r, c in shapes]
        wb = mxshard.NVFP4BucketWriteback([(w, torch.from_numpy(m).cuda(), 0) for w, m in zip(ws, masters)],
                                          round_through="bf16")
        assert wb._cuda_bucket is not None, "the prepared bucket is used"
        wb.run()
        torch.cuda.synchronize()
        for w, m, (r, c), i in zip(ws, masters, shapes, range(len(ws))):
            ref = mxshard.NVFP4Weight.empty(r, c, planes=("row", "both")[i % 2], block=blocks[(i // 2) % 2],
                                            layout=layouts[i % 3])
            mxshard.quantize_nvfp4(ref, m.reshape(r, c), round_through="bf16")
            weights_equal(w, ref)
        wb.close()


# ---- fragments (FSDP) ----------------------------------------------------------------------

_POISON = 0xA5


def _poisoned(n, kind):
    if kind == "numpy":
        return np.full(n, _POISON, np.uint8)
    import torch
    return torch.full((n,), _POISON, dtype=torch.uint8)


def _fsdp_item(rng, spec, x, lo, hi, kind):
    """One rank's FSDP item: a primary whose data planes are None (or kept,
    poisoned: the fragment wins) and fragments for every present plane.
    Returns (item, primary, kept data planes)."""
    rows, cols, planes, block, layout = spec
    dev = None if kind == "numpy" else "cpu"
    w = mxshard.NVFP4Weight.empty(rows, cols, planes=planes, block=block, layout=layout, device=dev)
    keep = {}
    for pn in ("row", "col"):
        d = getattr(w, f"{pn}_data")
        if d is not None and rng.integers(3) == 0:
            d[...] = _POISON
            keep[pn] = d
    w = mxshard.NVFP4Weight.from_buffers(rows, cols, block=block, layout=layout, row_data=keep.get("row"),
                                         row_scale=w.row_scale, col_data=keep.get("col"), col_scale=w.col_scale,
                                         amax=w.amax)
    nb = mxshard.nvfp4_fragment_bytes(lo, hi - lo)
    shard = x.reshape(-1)[lo:hi].copy()
    if kind != "numpy":
        import torch
        shard = torch.from_numpy(shard)
    stage = _poisoned((rows * cols + 1) // 2, kind) if w.has_col and rng.integers(3) == 0 else None
    item = mxshard.NVFP4WritebackItem(w, shard, lo, hi - lo, col_stage=stage,
                                      row_fragment=_poisoned(nb, kind) if w.has_row else None,
                                      stage_fragment=_poisoned(nb, kind) if w.has_col else None)
    return item, keep


def _check_fragment_gather(spec, x, rt, per_rank):
    """per_rank: (item, start, stop) of each rank: the gathered row fragments
    are the whole-tensor quantize's row-wise plane, nvfp4_stage_to_col of the
    gathered stage fragments its column-wise plane; every rank's scales and
    amax are the whole tensor's."""
    rows, cols, planes, block, layout = spec
    whole = _whole(x, rows, cols, planes, block, layout, rt)
    nbytes = (rows * cols + 1) // 2
    for pn, frag in (("row", "row_fragment"), ("col", "stage_fragment")):
        if getattr(whole, f"{pn}_data") is None:
            continue
        full = np.full(nbytes, _POISON, np.uint8)
        for it, lo, hi in per_rank:
            f = _np(getattr(it, frag))
            assert f.size == mxshard.nvfp4_fragment_bytes(lo, hi - lo)
            full[lo // 2:lo // 2 + f.size] = f
        if pn == "row":
            assert np.array_equal(full, _np(whole.row_data).reshape(-1)), "gathered row fragments"
        else:
            col = mxshard.NVFP4Weight.empty(rows, cols, planes="col", block=block, layout=layout)
            assert mxshard.nvfp4_stage_to_col(col, full) is col
            assert np.array_equal(_np(col.col_data).reshape(-1), _np(whole.col_data).reshape(-1)), "stage -> col"
    for it, _, _ in per_rank:
        w = it.primary
        for pn in ("row", "col"):
            if getattr(w, f"{pn}_scale") is not None:
                assert np.array_equal(_np(getattr(w, f"{pn}_scale")).reshape(-1),
                                      _np(getattr(whole, f"{pn}_scale")).reshape(-1)), f"{pn} scales"
        assert _bits(_np(w.amax))[0] == _bits(_np(whole.amax))[0], "amax"


def test_writeback_fragments_simulated_ranks(rng):
    """FSDP through NVFP4BucketWriteback on 1..4 simulated ranks (random even
    cuts, empty shards included), numpy arrays and CPU tensors: the fragments
    receive the shard's bytes, kept data planes and stages stay untouched (the
    fragment wins), the bucket gathers none of them, finish skips them; the
    gathered fragments == the whole-tensor quantize_nvfp4."""
    specs = [(17, 33, "both", "1x16", "padded"), (16, 48, "both", "16x16", "swizzled"),
             (5, 9, "col", "16x16", "compact"), (40, 7, "row", "1x16", "compact"), (1, 1, "both", "1x16", "padded"),
             (3, 7, "both", "16x16", "compact"), (9, 30, "col", "1x16", "swizzled")]
    for trial in range(8):
        kind = "torch" if trial % 2 else "numpy"
        if kind == "torch":
            pytest.importorskip("torch")
        rt = ("bf16", None, "f16")[trial % 3]
        world = 1 + trial % 4
        xs = [make_src(rng, spec[:2]) for spec in specs]
        cuts = []
        for r, c, *_ in specs:
            n = r * c
            cuts.append([0] + sorted(min(n, 2 * int(v)) for v in rng.integers(0, n // 2 + 1, world - 1)) + [n])
        ranks = []
        for k in range(world):
            made = [_fsdp_item(rng, spec, x, cut[k], cut[k + 1], kind) for spec, x, cut in zip(specs, xs, cuts)]
            wb = mxshard.NVFP4BucketWriteback([it for it, _ in made], round_through=rt)
            assert wb._plane_regions() == [], "fragments: nothing for the bucket to gather"
            ranks.append((wb, made))
        for wb, _ in ranks:
            wb.partial()
        red = np.maximum.reduce([wb.entries() for wb, _ in ranks])
        for wb, _ in ranks:
            wb.entries()[...] = red
            wb.apply()
            wb.finish()
        for i, (spec, x) in enumerate(zip(specs, xs)):
            per_rank = [(made[i][0], cuts[i][k], cuts[i][k + 1]) for k, (_, made) in enumerate(ranks)]
            _check_fragment_gather(spec, x, rt, per_rank)
            for _, made in ranks:  # the fragment wins: kept planes and given stages untouched
                it, keep = made[i]
                for d in list(keep.values()) + ([it.col_stage] if it.col_stage is not None else []):
                    assert (_np(d) == _POISON).all(), "a replaced plane was written"
        for wb, _ in ranks:
            wb.close()


def test_writeback_fragment_rejections():
    w = mxshard.NVFP4Weight.empty(3, 7, planes="both")
    row = mxshard.NVFP4Weight.empty(3, 7, planes="row")
    fsdp = mxshard.NVFP4Weight.from_buffers(3, 7, row_scale=w.row_scale, col_scale=w.col_scale, amax=w.amax)
    m = np.ones(11, np.float32)
    f6 = np.zeros(6, np.uint8)
    with pytest.raises(ValueError, match="no column-wise plane"):
        mxshard.NVFP4BucketWriteback([mxshard.NVFP4WritebackItem(row, m, 10, stage_fragment=f6)])
    with pytest.raises(ValueError, match="needs 6"):
        mxshard.NVFP4BucketWriteback([mxshard.NVFP4WritebackItem(w, m, 10, row_fragment=np.zeros(5, np.uint8))])
    with pytest.raises(ValueError, match="neither data nor a fragment"):
        mxshard.NVFP4BucketWriteback([mxshard.NVFP4WritebackItem(fsdp, m, 10, stage_fragment=f6)])
    with pytest.raises(ValueError, match="no data"):
        mxshard.NVFP4BucketWriteback([mxshard.NVFP4WritebackItem(fsdp, m, 10, row_fragment=f6)])
    with pytest.raises(mxshard.RangeError, match="odd boundary"):
        mxshard.NVFP4BucketWriteback([mxshard.NVFP4WritebackItem(w, m[:10], 11, row_fragment=f6)])
    with pytest.raises(mxshard.AliasingError):  # the fragment over the master
        mxshard.NVFP4BucketWriteback([mxshard.NVFP4WritebackItem(w, m, 10, row_fragment=m.view(np.uint8)[:6])])
    with pytest.raises(mxshard.AliasingError):  # two fragments share bytes
        mxshard.NVFP4BucketWriteback([mxshard.NVFP4WritebackItem(fsdp, m, 10, row_fragment=f6, stage_fragment=f6)])
    # an empty shard: 0-byte fragments, nothing written; the scales complete
    e = mxshard.NVFP4BucketWriteback([mxshard.NVFP4WritebackItem(fsdp, m[:0], 5, row_fragment=f6[:0],
                                                                 stage_fragment=np.zeros(0, np.uint8))])
    e.run()
    assert e._plane_regions() == []


def test_stage_to_col(rng):
    """nvfp4_stage_to_col == the column-wise plane of quantize_nvfp4, from the
    column values in row-major order (1x16: the stage; 16x16: the row-wise
    plane too), numpy and CPU tensors; bad input rejected before writing."""
    for rows, cols in ((17, 33), (16, 48), (1, 1), (3, 7), (32, 8)):
        x = make_src(rng, (rows, cols))
        for block in ("1x16", "16x16"):
            w = _whole(x, rows, cols, "both", block, "padded", "bf16")
            n = rows * cols
            colq = ref_unpack(_np(w.col_data).reshape(-1), n).reshape(cols, rows)
            stage = ref_pack(colq.T.reshape(-1))  # the column values, row-major
            if block == "16x16":
                assert np.array_equal(stage, _np(w.row_data).reshape(-1))
            g = mxshard.NVFP4Weight.empty(rows, cols, planes="col", block=block)
            mxshard.nvfp4_stage_to_col(g, stage)
            assert np.array_equal(_np(g.col_data).reshape(-1), _np(w.col_data).reshape(-1))
            torch = pytest.importorskip("torch")
            gt = mxshard.NVFP4Weight.empty(rows, cols, planes="both", block=block, device="cpu")
            mxshard.nvfp4_stage_to_col(gt, torch.from_numpy(stage))
            assert np.array_equal(_np(gt.col_data).reshape(-1), _np(w.col_data).reshape(-1))
            assert not _np(gt.row_data).any(), "only col_data is written"
    g = mxshard.NVFP4Weight.empty(3, 7, planes="both")
    with pytest.raises(ValueError, match="needs 11"):
        mxshard.nvfp4_stage_to_col(g, np.zeros(10, np.uint8))
    with pytest.raises(ValueError, match="no column-wise"):
        mxshard.nvfp4_stage_to_col(mxshard.NVFP4Weight.empty(3, 7, planes="row"), np.zeros(11, np.uint8))
    with pytest.raises(mxshard.AliasingError):
        mxshard.nvfp4_stage_to_col(g, g.col_data)
    with pytest.raises(TypeError):
        mxshard.nvfp4_stage_to_col(mxshard.MXFP8Weight.empty(3, 7, planes="both"), np.zeros(11, np.uint8))
    assert not g.col_data.any()


def test_cuda_fragments_and_stage_to_col(rng):
    """CUDA tensors: fragments through the (prepared) bucket and
    nvfp4_stage_to_col on the GPU == the host's bytes."""
    from conftest import cuda_or_skip
    torch = cuda_or_skip()
    from mxshard import _lib as L
    cu = L.cuda_lib().lib
    if getattr(cu, "mxs_cuda_nvfp4_stage_to_col", None) is None:
        pytest.skip("libmxshard_cuda without mxs_cuda_nvfp4_stage_to_col")
    specs = [(33, 40, "both", "1x16", "swizzled"), (32, 64, "both", "16x16", "padded"),
             (7, 9, "col", "1x16", "compact")]
    world = 3
    for _ in range(2):
        xs = [make_src(rng, spec[:2]) for spec in specs]
        cuts = [[0, 2 * (r * c // 6), 2 * (r * c // 3), r * c] for r, c, *_ in specs]
        host, gpu = [], []
        for k in range(world):
            hm = [_fsdp_item(np.random.default_rng(k), s, x, cut[k], cut[k + 1], "numpy") for s, x, cut in
                  zip(specs, xs, cuts)]
            host.append([it for it, _ in hm])
            dev = []
            for it in host[-1]:
                w = it.primary
                cuda = lambda a: None if a is None else torch.from_numpy(np.ascontiguousarray(a)).cuda()  # noqa: E731
                gw = mxshard.NVFP4Weight.from_buffers(w.rows, w.cols, block=w.block, layout=w.layout,
                                                      row_data=cuda(w.row_data), row_scale=cuda(w.row_scale),
                                                      col_data=cuda(w.col_data), col_scale=cuda(w.col_scale),
                                                      amax=cuda(w.amax))
                dev.append(mxshard.NVFP4WritebackItem(gw, cuda(it.master), it.start, it.length, cuda(it.col_stage),
                                                      cuda(it.row_fragment), cuda(it.stage_fragment)))
            gpu.append(dev)
        for side in (host, gpu):
            wbs = [mxshard.NVFP4BucketWriteback(items, round_through="bf16") for items in side]
            for wb in wbs:
                wb.partial()
            red = np.maximum.reduce([_np(wb.entries()) for wb in wbs])
            for wb in wbs:
                wb.entries()[...] = torch.from_numpy(red).cuda() if wb.is_cuda else red
                wb.apply()
                wb.finish()
            torch.cuda.synchronize()
            for wb in wbs:
                wb.close()
        for hk, gk in zip(host, gpu):
            for h, g in zip(hk, gk):
                for name in ("row_fragment", "stage_fragment", "col_stage"):
                    if getattr(h, name) is not None:
                        assert np.array_equal(_np(getattr(g, name)), _np(getattr(h, name))), name
                weights_equal(g.primary, h.primary)
        for i, (spec, x) in enumerate(zip(specs, xs)):
            _check_fragment_gather(spec, x, "bf16", [(host[k][i], cuts[i][k], cuts[i][k + 1]) for k in range(world)])
            r, c = spec[:2]
            stage = np.zeros((r * c + 1) // 2, np.uint8)
            for k in range(world):
                f = _np(host[k][i].stage_fragment) if host[k][i].stage_fragment is not None else None
                if f is not None:
                    stage[cuts[i][k] // 2:cuts[i][k] // 2 + f.size] = f
            if spec[2] != "row":
                gc = mxshard.NVFP4Weight.empty(r, c, planes="col", block=spec[3], device="cuda")
                mxshard.nvfp4_stage_to_col(gc, torch.from_numpy(stage).cuda())
                hc = mxshard.NVFP4Weight.empty(r, c, planes="col", block=spec[3])
                mxshard.nvfp4_stage_to_col(hc, stage)
                torch.cuda.synchronize()
                assert np.array_equal(_np(gc.col_data).reshape(-1), _np(hc.col_data).reshape(-1))


# ---- the writeback over gloo: 2 and 3 processes -------------------------------------------


class _Count:
    """Counts torch.distributed.all_reduce / all_gather calls (what the package calls)."""

    def __init__(self):
        import torch.distributed as dist
        self.dist, self.calls = dist, {"all_reduce": 0, "all_gather": 0, "all_gather_into_tensor": 0}
        self.orig = {k: getattr(dist, k) for k in self.calls}
        self.reduced = []  # (op, dtype, numel) of each all_reduce

    def __enter__(self):
        for k in self.calls:
            def wrap(*a, _k=k, **kw):
                self.calls[_k] += 1
                if _k == "all_reduce":
                    self.reduced.append((kw.get("op"), a[0].dtype, a[0].numel()))
                return self.orig[_k](*a, **kw)
            setattr(self.dist, k, wrap)
        return self

    def __exit__(self, *exc):
        for k, f in self.orig.items():
            setattr(self.dist, k, f)

    @property
    def any(self):
        return sum(self.calls.values())


def _bucket(rank, world, seed, kind):
    """A random bucket: weights at even bucket offsets, the bucket padded to a
    multiple of 2*world, rank chunks (equal, or random even cuts); some row
    planes in one shared storage (a Megatron-style buffer); a replicated
    weight; a weight only rank 0 owns. Returns (items, specs, full masters)."""
    import torch
    g = np.random.default_rng(seed)
    n_w = int(g.integers(3, 6))
    specs = []
    for _ in range(n_w):
        rows, cols = int(g.integers(1, 40)), int(g.integers(1, 40))
        planes = ["row", "col", "both"][g.integers(3)]
        block, layout = ["1x16", "16x16"][g.integers(2)], LAYOUTS[g.integers(3)]
        specs.append((rows, cols, planes, block, layout))
    offs, end = [], 0
    for r, c, *_ in specs:
        end += end & 1                       # mxs_nvfp4_bucket_place
        offs.append(end)
        end += r * c
    total = -(-end // (2 * world)) * (2 * world)  # mxs_nvfp4_bucket_elems
    if g.integers(2):
        cuts = [total * k // world for k in range(world + 1)]
    else:
        cuts = [0] + sorted(2 * int(v) for v in g.integers(0, total // 2 + 1, world - 1)) + [total]
    lo, hi = cuts[rank], cuts[rank + 1]
    mdt = [torch.float32, torch.bfloat16, torch.float16][g.integers(3)]
    shared = kind == "torch" and g.integers(2)
    row_store = torch.zeros(sum((r * c + 1) // 2 for r, c, *_ in specs) + 8, dtype=torch.uint8)
    items, weights, at = [], [], 0
    for (rows, cols, planes, block, layout), off in zip(specs, offs):
        dev = None if kind == "numpy" else "cpu"
        w = mxshard.NVFP4Weight.empty(rows, cols, planes=planes, block=block, layout=layout, device=dev)
        if shared and w.has_row:
            nb = (rows * cols + 1) // 2
            w = mxshard.NVFP4Weight.from_buffers(rows, cols, block=block, layout=layout,
                                                 row_data=row_store[at:at + nb], row_scale=w.row_scale,
                                                 col_data=w.col_data, col_scale=w.col_scale, amax=w.amax)
            at += nb
        s, e = max(lo, off), min(hi, off + rows * cols)
        start, length = (s - off, e - s) if e > s else (0, 0)
        items.append([w, None, start, length])
        weights.append(w)
    rep = mxshard.NVFP4Weight.empty(20, 18, planes="both", block="16x16",
                                    device=None if kind == "numpy" else "cpu")
    lonely = mxshard.NVFP4Weight.empty(9, 11, planes="col", device=None if kind == "numpy" else "cpu")
    specs += [(20, 18, "both", "16x16", "padded"), (9, 11, "col", "1x16", "padded")]
    items += [[rep, None, 0, 360], [lonely, None, 0, 99 if rank == 0 else 0]]
    return items, specs, mdt


def _fill(items, specs, mdt, step, kind):
    """This update's full masters (in the master dtype) and each rank's shard."""
    import torch
    fulls = []
    for i, ((rows, cols, *_), it) in enumerate(zip(specs, items)):
        gen = torch.Generator().manual_seed(1000 * step + i)
        x = torch.randn(rows * cols, generator=gen) * torch.exp2(torch.randint(-8, 8, (rows * cols,), generator=gen))
        x = x.to(mdt)
        fulls.append(x)
        shard = x[it[2]:it[2] + it[3]].clone()
        if kind == "numpy":  # bf16 as raw uint16 bits (the package's raw16="bf16")
            shard = shard.view(torch.int16).numpy().view(np.uint16) if mdt == torch.bfloat16 else shard.numpy()
        if it[1] is None:
            it[1] = shard
        else:
            it[1][...] = shard
    return fulls


def case_random(rank, world, seeds=(0, 1, 2, 3)):
    import torch
    import torch.distributed as dist
    out = []
    for seed in seeds:
        kind = "numpy" if seed % 4 == 3 else "torch"
        rt = ["bf16", None, "f16"][seed % 3]
        items, specs, mdt = _bucket(rank, world, 100 * world + seed, kind)
        _fill(items, specs, mdt, 0, kind)
        with _Count() as setup_c:
            wb = mxshard.NVFP4BucketWriteback([tuple(it) for it in items], round_through=rt, group=dist.group.WORLD)
        assert setup_c.calls["all_reduce"] == 0
        for step in range(2):
            fulls = _fill(items, specs, mdt, step, kind)
            with _Count() as c:
                wb.run(dist.group.WORLD)
            assert c.calls["all_reduce"] == 1, c.calls
            assert c.reduced == [(dist.ReduceOp.MAX, torch.int32, wb.packed_count)], c.reduced
            for it, spec, x in zip(items, specs, fulls):
                weights_equal(it[0], _whole(x.float().numpy(), *spec, rt))
        out.append((seed, wb.entry_bytes, c.calls["all_gather"]))
    return out


def case_odd(rank, world):
    """Odd shard boundaries: rejected before any collective (no group: no
    collective at all; with a group: only the setup exchange, every rank raises)."""
    import torch.distributed as dist
    w = mxshard.NVFP4Weight.empty(5, 9, planes="both")
    bad_start = 11 if rank == world - 1 else 0
    m = np.ones(6, np.float32)
    with _Count() as c:
        try:
            mxshard.NVFP4BucketWriteback([(w, m, 1 + 2 * rank)])
            raise AssertionError("odd start accepted")
        except mxshard.RangeError as e:
            assert "odd boundary" in str(e) and "even flat index" in str(e)
    assert c.any == 0, c.calls
    with _Count() as c:
        try:
            mxshard.NVFP4BucketWriteback([(w, m, bad_start)], group=dist.group.WORLD)
            raise AssertionError("no error")
        except mxshard.RangeError:
            got = "local"
            assert rank == world - 1
        except mxshard.RemoteError:
            got = "remote"
            assert rank != world - 1
    assert c.calls["all_reduce"] == 0
    assert not w.row_data.any() and not w.row_scale.any() and w.amax[0] == 0
    return got


def case_failure(rank, world):
    """A rank-local failure (before partial's C call, then inside the C
    partial) raises on every rank, nothing is applied anywhere, and the next
    run works."""
    import torch.distributed as dist
    n = 40 * 30
    cuts = [2 * (n * k // (2 * world)) for k in range(world)] + [n]
    w = mxshard.NVFP4Weight.empty(40, 30, planes="both")
    full = np.arange(n, dtype=np.float32) / 7
    m = full[cuts[rank]:cuts[rank + 1]].copy()
    wb = mxshard.NVFP4BucketWriteback([(w, m, cuts[rank])], group=dist.group.WORLD)
    got = []
    for failing, how in ((world - 1, "fault"), (0, "c")):
        saved = None
        if rank == failing:
            if how == "fault":
                wb._fault = ValueError("injected rank-local failure")
            else:
                saved = wb._citems[0].len
                wb._citems[0].len = saved - 2  # the batch no longer matches its plan
        with _Count() as c:
            try:
                wb.run()
                raise AssertionError("run() did not raise")
            except mxshard.RemoteError:
                got.append("remote")
                assert rank != failing
            except (ValueError, mxshard.PlanMismatchError):
                got.append("local")
                assert rank == failing
        assert c.calls["all_reduce"] == 1 and c.calls["all_gather"] == 0, c.calls
        assert not w.row_data.any() and not w.col_scale.any() and w.amax[0] == 0, "applied after a failure"
        wb._fault = None
        if saved is not None:
            wb._citems[0].len = saved
    wb.run()
    weights_equal(w, _whole(full, 40, 30, "both", "1x16", "padded", "bf16"))
    return got


def case_mismatch(rank, world):
    import torch.distributed as dist
    w = mxshard.NVFP4Weight.empty(10, 10 + 2 * rank)
    try:
        mxshard.NVFP4BucketWriteback([(w, np.ones(4, np.float32), 0)], group=dist.group.WORLD)
    except mxshard.PlanMismatchError:
        return "mismatch"
    raise AssertionError("no error")


def case_fragments(rank, world):
    """FSDP over gloo: every rank keeps fragments only (CPU tensors): run()
    makes ONE all_reduce and no gather (the fragments are the caller's); the
    fragments all-gathered by hand == the whole-tensor quantize_nvfp4, the
    column-wise plane through nvfp4_stage_to_col; two updates."""
    import torch.distributed as dist
    specs = [(17, 33, "both", "1x16", "padded"), (16, 40, "both", "16x16", "swizzled"),
             (5, 9, "col", "1x16", "compact"), (21, 3, "row", "16x16", "compact")]
    rng = np.random.default_rng(7)  # the same masters and choices on every rank
    ranks_rng = np.random.default_rng(100 + rank)
    for step in range(2):
        xs = [make_src(rng, spec[:2]) for spec in specs]
        cuts = [[2 * (r * c * k // (2 * world)) for k in range(world)] + [r * c] for r, c, *_ in specs]
        made = [_fsdp_item(ranks_rng, spec, x, cut[rank], cut[rank + 1], "torch") for spec, x, cut in
                zip(specs, xs, cuts)]
        items = [it for it, _ in made]
        wb = mxshard.NVFP4BucketWriteback(items, round_through="bf16", group=dist.group.WORLD)
        with _Count() as c:
            wb.run(dist.group.WORLD)
        assert c.calls["all_reduce"] == 1 and c.calls["all_gather"] == 0 and c.calls["all_gather_into_tensor"] == 0, \
            c.calls
        got = [None] * world
        dist.all_gather_object(got, [(it.row_fragment, it.stage_fragment) for it in items])
        for i, (spec, x) in enumerate(zip(specs, xs)):
            per_rank = []
            for k in range(world):
                it = items[i]._replace(row_fragment=got[k][i][0], stage_fragment=got[k][i][1])
                per_rank.append((it if k != rank else items[i], cuts[i][k], cuts[i][k + 1]))
            _check_fragment_gather(spec, x.astype(np.float32), "bf16", per_rank)
        wb.close()
    return "fragments"


CASES = {"random": case_random, "odd": case_odd, "failure": case_failure, "mismatch": case_mismatch,
         "fragments": case_fragments}


def _worker(rank, world, port, cases, q):
    import torch.distributed as dist
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=30))
        for name in cases:
            q.put((rank, name, "ok", CASES[name](rank, world)))
    except BaseException:  # noqa: BLE001 - the parent reports it
        q.put((rank, "?", "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _spawn(world, cases, timeout=90):
    pytest.importorskip("torch")
    return spawn_ranks(world, _worker, lambda r, port: (r, world, port, cases), world * len(cases), timeout,
                       stop_on_error=True)


@pytest.mark.parametrize("world", [2, 3])
def test_gloo_writeback(world):
    res = _spawn(world, ["random", "odd", "failure", "mismatch", "fragments"])
    for r in range(world):
        assert [e for _, e, _ in res[(r, "random")]] == [2, 4, 4, 2]
        assert res[(r, "odd")] == ("local" if r == world - 1 else "remote")
        assert res[(r, "failure")] == [("local" if r == world - 1 else "remote"), ("local" if r == 0 else "remote")]
        assert res[(r, "mismatch")] == "mismatch"
        assert res[(r, "fragments")] == "fragments"

# SPDX-License-Identifier: MIT
"""What the NVFP4 tests share (test_nvfp4.py, test_nvfp4_writeback.py,
test_nvfp4_gloo.py): an independent numpy reference of the format rules
(docs/contract.md section 9, written here from the rules, not from the C
code), the random sources they quantize, the whole-tensor quantize every
writeback is compared with, and the FSDP items with their fragment-gather
check."""
import numpy as np

import mxshard
import reference as ref

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


# ---- sources and their bytes ---------------------------------------------------------------


def _bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


def make_src(rng, shape, specials=True):
    x = (rng.standard_normal(shape) * np.exp2(rng.integers(-12, 12, size=shape))).astype(np.float32)
    if specials and x.size > 8:
        flat = x.reshape(-1)
        idx = rng.choice(flat.size, size=5, replace=False)
        flat[idx] = [0.0, -0.0, np.nan, 3e-41, -1e-6]
    return x


def _np(a):
    return a.detach().cpu().numpy() if hasattr(a, "detach") else np.asarray(a)


# ---- the whole-tensor quantize a writeback must equal ---------------------------------------


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

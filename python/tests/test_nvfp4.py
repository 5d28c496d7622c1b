# SPDX-License-Identifier: MIT
"""NVFP4 from Python (mxshard.nvfp4): the E2M1 oracle vectors through
quantize/dequantize, quantize/dequantize/convert against the independent numpy
reference of the format rules (nvfp4_harness.py), rejections before any
write, and CUDA tensors byte-equal to the host path (quantize, the writeback,
fragments; scripts/gpu-torch.sh runs this file on a GPU). The writeback in
one process: test_nvfp4_writeback.py; over gloo processes: test_nvfp4_gloo.py."""
import os

import numpy as np
import pytest

import mxshard
import reference as ref
from conftest import VECTORS
from nvfp4_harness import (LAYOUTS, _bits, _check_fragment_gather, _fsdp_item, _np, make_src, ref_dequantize, ref_e2m1,
                           ref_e2m1_value, ref_pack, ref_place, ref_quantize, ref_unpack, weights_equal)


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


# ---- CUDA tensors: the host path's bytes ----------------------------------------------------


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

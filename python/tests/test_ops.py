# SPDX-License-Identifier: MIT
"""quantize / dequantize / convert_scales on numpy arrays (host library)
against the numpy reference, and the checks that run before any C call."""
import itertools

import numpy as np
import pytest

import mxshard
import reference as ref

SHAPES = [(1, 1), (1, 33), (33, 1), (32, 32), (40, 70), (65, 97), (129, 31), (7, 300), (257, 64)]
LAYOUTS = ["compact", "padded", "swizzled"]
PLANES = ["row", "col", "both"]


def make_src(rng, shape, dtype, specials=True):
    x = (rng.standard_normal(shape) * np.exp2(rng.integers(-20, 20, size=shape))).astype(np.float32)
    if specials and x.size > 8:
        flat = x.reshape(-1)
        idx = rng.choice(flat.size, size=min(6, flat.size), replace=False)
        flat[idx] = [0.0, -0.0, np.nan, 1e30, -3e-42, 448.0][:len(idx)]
    if dtype == "f32":
        return x, x
    if dtype == "f16":
        h = np.nan_to_num(x, nan=1.0).clip(-6e4, 6e4).astype(np.float16)
        return h, h.astype(np.float32)
    b = ref.f32_to_bf16_bits(x)
    return b, ref.bf16_bits_to_f32(b)


def quantize_case(rng, shape, planes, layout, dtype, rounding):
    src, wide = make_src(rng, shape, dtype)
    w = mxshard.MXFP8Weight.empty(*shape, planes=planes, layout=layout)
    mxshard.quantize(w, src, rounding=rounding, src_dtype=dtype if dtype == "bf16" else None)
    want = ref.quantize(wide, planes, layout, rounding)
    for pn, (data, scale) in want.items():
        assert np.array_equal(getattr(w, f"{pn}_data"), data), f"{pn} data"
        assert np.array_equal(getattr(w, f"{pn}_scale").reshape(-1), scale), f"{pn} scales"
    for pn in ("row", "col"):
        if pn not in want:
            assert getattr(w, f"{pn}_data") is None and getattr(w, f"{pn}_scale") is None
    return w


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("planes", PLANES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_quantize_matches_reference(rng, shape, planes, layout):
    for dtype, rounding in itertools.product(["f32", "bf16", "f16"], ["ceil", "floor"]):
        quantize_case(rng, shape, planes, layout, dtype, rounding)


def test_te_shapes():
    w = mxshard.MXFP8Weight.empty(100, 200, planes="both")
    assert w.row_data.shape == (100, 200) and w.col_data.shape == (100, 200)
    assert w.row_scale.shape == (128, 8)      # [round_up(rows,128), round_up(ceil(cols/32),4)]
    assert w.col_scale.shape == (4, 256)      # [round_up(ceil(rows/32),4), round_up(cols,128)]
    c = mxshard.MXFP8Weight.empty(100, 200, planes="both", layout="compact")
    assert c.row_scale.shape == (100, 7) and c.col_scale.shape == (4, 200)
    r = mxshard.MXFP8Weight.empty(100, 200, planes="row")
    assert r.col_data is None and r.col_scale is None and r.planes == "row"
    for rows, cols, pn, lay in itertools.product([1, 31, 200], [1, 65], ["row", "col"], LAYOUTS):
        assert np.prod(mxshard.scale_shape(rows, cols, pn, lay)) == mxshard.scale_bytes(rows, cols, pn, lay)


@pytest.mark.parametrize("shape", [(1, 1), (40, 70), (65, 97), (33, 1)])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_dequantize_matches_reference(rng, shape, layout):
    src, wide = make_src(rng, shape, "f32")
    w = mxshard.MXFP8Weight.empty(*shape, planes="both", layout=layout)
    mxshard.quantize(w, src)
    for pn in ("row", "col"):
        want = ref.dequantize(getattr(w, f"{pn}_data"), getattr(w, f"{pn}_scale"), *shape, pn, layout)
        got = w.dequantize(plane=pn, dtype="f32")
        assert got.dtype == np.float32 and got.shape == shape
        assert np.array_equal(np.isnan(got), np.isnan(want))
        ok = ~np.isnan(want)
        assert np.array_equal(got[ok].view(np.uint32), want[ok].view(np.uint32))
        h = w.dequantize(plane=pn, dtype="f16")
        with np.errstate(over="ignore"):
            assert np.array_equal(h[ok], want[ok].astype(np.float16))
        b = w.dequantize(plane=pn, dtype="bf16")
        bits = b.view(np.uint16) if b.dtype != np.uint16 else b
        assert np.array_equal(bits[ok], ref.f32_to_bf16_bits(want)[ok])


@pytest.mark.parametrize("shape", [(1, 1), (40, 70), (300, 129), (33, 1)])
@pytest.mark.parametrize("plane", ["row", "col"])
def test_convert_scales_built_equals_convert_scales(rng, shape, plane):
    """The unchecked internal path (FSDP2 assembly) writes the same bytes as the checked one, out
    poisoned first, for every layout pair."""
    from conftest import torch_or_skip
    from mxshard.ops import convert_scales_built
    torch = torch_or_skip()
    M, K, _, _ = ref.geom(*shape, plane)
    S = rng.integers(0, 255, size=(M, K)).astype(np.uint8)
    for a, b in itertools.product(LAYOUTS, LAYOUTS):
        src = torch.from_numpy(ref.place(S, *shape, plane, a).copy())
        want = mxshard.convert_scales(*shape, plane, src, a, b)
        out = torch.full(tuple(mxshard.scale_shape(*shape, plane, b)), 0x5A, dtype=torch.uint8)
        assert convert_scales_built(*shape, plane, src, a, b, out) is out
        assert torch.equal(out, want), (a, b)


@pytest.mark.parametrize("shape", [(1, 1), (40, 70), (300, 129)])
@pytest.mark.parametrize("plane", ["row", "col"])
def test_convert_scales_all_pairs(rng, shape, plane):
    M, K, _, _ = ref.geom(*shape, plane)
    S = rng.integers(0, 255, size=(M, K)).astype(np.uint8)
    for a, b in itertools.product(LAYOUTS, LAYOUTS):
        src = ref.place(S, *shape, plane, a)
        # source padding is ignored: fill it with junk
        junk = np.where(ref.place(np.ones_like(S), *shape, plane, a) == 1, src, 0xAB).astype(np.uint8)
        out = mxshard.convert_scales(*shape, plane, junk, a, b)
        assert out.shape == mxshard.scale_shape(*shape, plane, b)
        assert np.array_equal(out.reshape(-1), ref.place(S, *shape, plane, b))


def test_with_layout_swizzled(rng):
    src, _ = make_src(rng, (130, 70), "f32")
    w = mxshard.MXFP8Weight.empty(130, 70, planes="both", layout="padded").quantize_(src)
    s = w.with_layout("swizzled")
    ws = mxshard.MXFP8Weight.empty(130, 70, planes="both", layout="swizzled").quantize_(src)
    assert np.array_equal(s.row_scale, ws.row_scale) and np.array_equal(s.col_scale, ws.col_scale)
    assert s.row_data is w.row_data


# ---- rejections: each raises, nothing written -----------------------------------

def _snapshot(w):
    return [None if a is None else a.copy() for a in (w.row_data, w.row_scale, w.col_data, w.col_scale)]


def _unchanged(w, snap):
    for a, b in zip((w.row_data, w.row_scale, w.col_data, w.col_scale), snap):
        assert (a is None and b is None) or np.array_equal(a, b)


def _filled(shape, planes="both", layout="padded"):
    w = mxshard.MXFP8Weight.empty(*shape, planes=planes, layout=layout)
    for a in (w.row_data, w.row_scale, w.col_data, w.col_scale):
        if a is not None:
            a[...] = 0x5A
    return w


@pytest.mark.parametrize("case", ["dtype", "size", "noncontig", "misaligned", "int_rounding", "readonly",
                                  "bf16_raw_unnamed", "type"])
def test_quantize_rejections(case):
    w = _filled((40, 70))
    snap = _snapshot(w)
    src = np.ones((40, 70), np.float32)
    kw = {}
    if case == "dtype":
        src = src.astype(np.float64)
    elif case == "size":
        src = src[:39]
    elif case == "noncontig":
        src = np.ones((40, 140), np.float32)[:, ::2]
    elif case == "misaligned":
        buf = np.zeros(40 * 70 * 4 + 4, np.uint8)
        src = buf[1:1 + 40 * 70 * 4].view(np.uint8)
        src = np.frombuffer(buf.data, dtype=np.float32, count=40 * 70, offset=1)
    elif case == "int_rounding":
        kw = {"rounding": "nearest"}
    elif case == "readonly":
        w.row_data.flags.writeable = False
    elif case == "bf16_raw_unnamed":
        src = np.zeros((40, 70), np.uint16)
    elif case == "type":
        src = [[1.0] * 70] * 40
    with pytest.raises((ValueError, TypeError)):
        mxshard.quantize(w, src, **kw)
    w.row_data.flags.writeable = True
    _unchanged(w, snap)


def test_weight_construction_rejections():
    with pytest.raises(ValueError):
        mxshard.MXFP8Weight(40, 70, row_data=np.zeros((40, 70), np.uint8), row_scale=np.zeros(10, np.uint8))
    with pytest.raises(ValueError):
        mxshard.MXFP8Weight(40, 70)
    with pytest.raises(ValueError):
        mxshard.MXFP8Weight.empty(0, 70)
    with pytest.raises(ValueError):
        mxshard.MXFP8Weight.empty(4, 7, planes="diag")
    with pytest.raises(ValueError):
        mxshard.MXFP8Weight.empty(4, 7, layout="tiled")
    with pytest.raises(ValueError):
        mxshard.MXFP8Weight(40, 70, row_data=np.zeros((40, 70), np.float32),
                            row_scale=np.zeros((128, 4), np.uint8))


def test_dequantize_rejections():
    w = _filled((40, 70), planes="row")
    snap = _snapshot(w)
    with pytest.raises(ValueError):
        w.dequantize(plane="col")
    with pytest.raises(ValueError):
        w.dequantize(dtype="f64")
    with pytest.raises(ValueError):
        w.dequantize(out=np.zeros((40, 69), np.float32), dtype="f32")
    with pytest.raises(ValueError):
        w.dequantize(out=np.zeros((40, 70), np.float16), dtype="f32")
    _unchanged(w, snap)


def test_dequantize_aliasing_is_a_c_error():
    """out overlapping the data plane it reads: the library's MXS_ERR_ALIASING,
    raised as AliasingError carrying mxs_status_str, and out is unchanged."""
    buf = np.zeros(40 * 70 * 4 + 4096, np.uint8)
    row_data = buf[:2800].reshape(40, 70)
    row_scale = np.zeros((128, 4), np.uint8)
    w = mxshard.MXFP8Weight(40, 70, row_data=row_data, row_scale=row_scale)
    out = np.frombuffer(buf.data, dtype=np.float32, count=2800, offset=0).reshape(40, 70)
    row_data[...] = 0x38
    before = buf.copy()
    with pytest.raises(mxshard.AliasingError) as ei:
        w.dequantize(dtype="f32", out=out)
    assert "MXS_ERR_ALIASING" in str(ei.value) and ei.value.name == "MXS_ERR_ALIASING"
    assert isinstance(ei.value, mxshard.MxsError)
    assert np.array_equal(buf, before)


def test_convert_scales_rejections():
    src = np.zeros(mxshard.scale_shape(40, 70, "row", "compact"), np.uint8)
    with pytest.raises(ValueError):
        mxshard.convert_scales(40, 70, "row", src[:-1], "compact", "padded")
    with pytest.raises(ValueError):
        mxshard.convert_scales(40, 70, "both", src, "compact", "padded")
    with pytest.raises(ValueError):
        mxshard.convert_scales(40, 70, "row", src, "compact", "padded", out=np.zeros(3, np.uint8))
    with pytest.raises(ValueError):
        mxshard.convert_scales(40, 70, "row", src.astype(np.float32), "compact", "padded")
    # in-place over itself: the C aliasing check
    buf = np.zeros(512, np.uint8)
    with pytest.raises(mxshard.AliasingError):
        mxshard.convert_scales(40, 70, "row", buf[:120], "compact", "padded", out=buf[:512])


def test_status_texts_and_classes():
    from mxshard import _lib
    h = _lib.host_lib()
    assert h.status_names[0] == "MXS_OK"
    for code, name in h.status_names.items():
        if code == 0:
            continue
        e = _lib.status_error(code, "where")
        assert e.name == name and e.status == code and name in str(e)
        assert isinstance(e, mxshard.MxsError)
    assert mxshard.error_class("MXS_ERR_REMOTE") is mxshard.RemoteError


def test_library_lookup_error_names_what_was_searched(tmp_path, monkeypatch):
    import subprocess
    import sys
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("MXSHARD_")}
    env["MXSHARD_LIBDIR"] = str(tmp_path)
    env["PKG_CONFIG_PATH"] = str(tmp_path)
    env["LD_LIBRARY_PATH"] = str(tmp_path)
    code = ("import mxshard\n"
            "try:\n    mxshard.library_info()\nexcept ImportError as e:\n    print('ERR', e)\n")
    root = __import__("os").path.dirname(__import__("os").path.dirname(__file__))
    r = subprocess.run([sys.executable, "-c", code], cwd=str(tmp_path), env=dict(env, PYTHONPATH=root),
                       capture_output=True, text=True, timeout=60)
    assert "ERR" in r.stdout, r.stdout + r.stderr
    assert "MXSHARD_LIBDIR" in r.stdout and str(tmp_path) in r.stdout and "pkg-config" in r.stdout


def test_version():
    v = mxshard.host_version()
    assert v == 10000 * int(mxshard.__version__.split(".")[0]) + 100 * int(mxshard.__version__.split(".")[1]) \
        + int(mxshard.__version__.split(".")[2])

# SPDX-License-Identifier: MIT
"""mxshard.torch.gemm.paths: the GEMM paths of the quantized linears.

The Triton kernels (mxshard.torch.gemm.triton) run compiled on a GPU, else
on CPU tensors in Triton's interpreter (TRITON_INTERPRET=1, set here before the
kernels are imported). Skips without torch, the host library or Triton.

* The up-conversion is the library's dequantize, bit for bit: every E4M3 code
  x every E8M0 byte (MXFP8, both planes), every E2M1 code x every E4M3 scale x
  a set of amaxes from 0 through subnormal-producing to inf (NVFP4, both
  planes), in f32, bf16 and f16; and the plane dequantized in chunks, every
  layout, plane, format and block shape, shapes off the block and tile grids.
* The GEMMs (fused, chunked, dequant) against the exact product of the same
  operands. Every path sums exact products (bf16 x bf16 and f16 x f16 fit
  fp32's 24 bits) in fp32, in its own order, then rounds once to the compute
  dtype, so per element
      |y - y_exact| <= K * 2^-24 * (|x| @ |W|^T) + 2 u |y_exact|
  with K the reduced length (the classic bound (K-1) u32 sum|x_i w_i|, rounded
  up) and u = 2^-8 (bf16) or 2^-11 (f16) the unit roundoff of the final
  rounding, doubled because Triton's interpreter truncates that conversion
  (the GPU rounds to nearest, half of it).
* Which path ran and why (`_gemm.path_counts`), the fallbacks, the chunks, the
  measured rule's lookup, the per-primary plans (rebuilt when the primary's
  tensors change), the launch keys (Triton's specialisation of the same
  arguments) and, on a GPU, the direct launches (bit-identical to Triton's own).
* wgrad: fp32 accumulation of the exact products into main_grad.

CPU time (CI: <= 30 s on 2 cores): the interpreter costs ~0.1 s per launch, so
the exhaustive up-conversion tests run in full and the others spread their
cases over the dtypes / a covering subset of the weights there (every format,
plane, layout, block and odd shape still runs); on a GPU every case runs.
"""
import os

import numpy as np
import pytest

# the interpreter evaluates with numpy, which warns where the rule overflows to inf or makes NaN on purpose
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

torch = pytest.importorskip("torch", reason="torch is not installed")
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton", reason="Triton is not installed (the fused GEMM paths need it)")

import mxshard  # noqa: E402

from conftest import host_lib_or_skip  # noqa: E402

host_lib_or_skip(module_level=True)

from mxshard.torch.gemm import paths as _gemm  # noqa: E402

K = _gemm._kernels()
if K is None:  # pragma: no cover - depends on the machine
    pytest.skip(f"mxshard.torch.gemm.triton does not load: {_gemm._kernels_err}", allow_module_level=True)
if K.INTERPRET:  # the interpreter's check of every int32 add for overflow is half its time: off
    import dataclasses

    from triton.runtime import interpreter as _interp
    _ib = getattr(_interp, "interpreter_builder", None)
    if _ib is not None and hasattr(_ib.options, "sanitize_overflow"):
        _ib.options = dataclasses.replace(_ib.options, sanitize_overflow=False)
DEV = "cpu" if K.INTERPRET else "cuda"
if DEV == "cuda":
    try:
        mxshard.library_info(cuda=True)
    except mxshard.LibraryNotFoundError as e:  # pragma: no cover
        pytest.skip(f"libmxshard_cuda not found: {str(e).splitlines()[0]}", allow_module_level=True)

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@pytest.fixture(autouse=True)
def fp32_accumulation(monkeypatch):
    """The bounds below assume fp32 accumulation in every GEMM; torch lets cuBLAS reduce split-K
    partial sums in bf16 / f16 by default (allow_*_reduced_precision_reduction), which it does for
    some shapes (seen on the H200: 7 x 300 @ 300 x 128): off within these tests."""
    if DEV == "cuda":
        m = torch.backends.cuda.matmul
        monkeypatch.setattr(m, "allow_bf16_reduced_precision_reduction", False)
        monkeypatch.setattr(m, "allow_fp16_reduced_precision_reduction", False)
    yield
LAYOUTS = ("compact", "padded", "swizzled")
INT = {4: torch.int32, 2: torch.int16}


def bits(t):
    return t.contiguous().view(INT[t.element_size()])


def same_bits(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(bits(a), bits(b))


def plane_matrix(w, plane, dtype):
    """The library's dequantize of `plane`, as P (the NVFP4 column plane is stored transposed)."""
    d = _gemm.dequant(w, plane, dtype)
    return d.t().contiguous() if isinstance(w, mxshard.NVFP4Weight) and plane == "col" else d


def kernel_plane(w, plane, dtype):
    op = _gemm.plane_operand(w, plane)
    return K.plane_dequant(op, 0, op.R, 0, op.C, dtype)


def compact_to(layout, rows, cols, plane, compact, nvfp4=False):
    conv = mxshard.convert_nvfp4_scales if nvfp4 else mxshard.convert_scales
    return conv(rows, cols, plane, compact, "compact", layout).reshape(-1)


# ---- the up-conversion, exhaustively -------------------------------------------------------

@pytest.mark.parametrize("layout", ("compact", "swizzled"))
def test_mxfp8_upconversion_is_dequantize_for_every_code_and_scale(layout):
    # row plane: element (r, c) = code c, its block's scale byte r; column plane: code r, scale byte c
    n = 256
    w = mxshard.MXFP8Weight.empty(n, n, planes="both", layout=layout, device=DEV)
    codes = torch.arange(n, dtype=torch.uint8)
    w.row_data.copy_(codes[None, :].expand(n, n).reshape(w.row_data.shape))
    w.col_data.copy_(codes[:, None].expand(n, n).reshape(w.col_data.shape))
    row_compact = codes[:, None].expand(n, n // 32).contiguous()            # [rows, K]: m = r
    col_compact = codes[None, :].expand(n // 32, n).contiguous()            # [K, cols]: m = c
    w.row_scale.copy_(compact_to(layout, n, n, "row", row_compact.to(DEV)).reshape(w.row_scale.shape))
    w.col_scale.copy_(compact_to(layout, n, n, "col", col_compact.to(DEV)).reshape(w.col_scale.shape))
    for plane in ("row", "col"):
        for dt in DTYPES:
            assert same_bits(kernel_plane(w, plane, dt), plane_matrix(w, plane, dt)), (plane, dt)


NVFP4_AMAXES = (0.0, 2.0 ** -149, 1e-38, 7.9e-36, 1e-30, 2.0 ** -20, 1.0, 2688.0, 1e30, 3.4028234663852886e38,
                float("inf"), float("nan"))


def test_nvfp4_upconversion_is_dequantize_for_every_code_scale_and_amax():
    # P row r: the 16 codes, its scale byte r (row plane: P = W; column plane: P = W^T)
    codes = torch.arange(16, dtype=torch.uint8)
    packed = (codes[0::2] | (codes[1::2] << 4)).repeat(256, 1)              # [256, 8]
    scales = torch.arange(256, dtype=torch.uint8)[:, None]
    row = mxshard.NVFP4Weight.empty(256, 16, planes="row", layout="padded", device=DEV)
    row.row_data.copy_(packed.reshape(row.row_data.shape))
    row.row_scale.copy_(compact_to("padded", 256, 16, "row", scales.to(DEV), nvfp4=True).reshape(row.row_scale.shape))
    col = mxshard.NVFP4Weight.empty(16, 256, planes="col", layout="swizzled", device=DEV)
    col.col_data.copy_(packed.reshape(col.col_data.shape))
    col.col_scale.copy_(compact_to("swizzled", 16, 256, "col", scales.to(DEV), nvfp4=True)
                        .reshape(col.col_scale.shape))
    for amax in NVFP4_AMAXES:
        for w, plane in ((row, "row"), (col, "col")):
            w.amax.fill_(amax)
            for dt in DTYPES:
                assert same_bits(kernel_plane(w, plane, dt), plane_matrix(w, plane, dt)), (amax, plane, dt)


# ---- planes, layouts, shapes, chunks -------------------------------------------------------

MX_SHAPES = [(1, 1), (33, 1), (1, 65), (130, 260)]                   # (rows = out, cols = in)
NV_SHAPES = [(1, 2), (17, 48), (130, 258)]                             # even row lengths of the row plane...
NV_COL_SHAPES = [(2, 1), (258, 17)]                                    # ...and of the transposed column plane


def spread(rows, cols, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=g) * torch.exp2(torch.randint(-8, 9, (rows, cols), generator=g).float())


def mx_weight(rows, cols, planes, layout, seed):
    w = mxshard.MXFP8Weight.empty(rows, cols, planes=planes, layout=layout, device=DEV)
    mxshard.quantize(w, spread(rows, cols, seed).to(DEV))
    return w


def nv_weight(rows, cols, planes, layout, block, seed):
    w = mxshard.NVFP4Weight.empty(rows, cols, planes=planes, block=block, layout=layout, device=DEV)
    mxshard.quantize_nvfp4(w, spread(rows, cols, seed).to(DEV))
    return w


def all_weights():
    """(weight, planes to read) over every format, plane set, layout, block and shape above."""
    out = []
    for i, (layout, (r, c)) in enumerate((lay, s) for lay in LAYOUTS for s in MX_SHAPES):
        out.append((mx_weight(r, c, "both", layout, i), ("row", "col")))
    for i, (layout, block) in enumerate((lay, b) for lay in LAYOUTS for b in ("1x16", "16x16")):
        for j, (r, c) in enumerate(NV_SHAPES):
            out.append((nv_weight(r, c, "row", layout, block, 10 * i + j), ("row",)))
        for j, (r, c) in enumerate(NV_COL_SHAPES):
            out.append((nv_weight(r, c, "col", layout, block, 10 * i + j + 5), ("col",)))
    return out


def covering(items, n_groups):
    """The interpreter's share of `items`: every n-th one (with a GPU: all)."""
    return items if not K.INTERPRET else items[::n_groups]


def test_kernel_dequantize_equals_the_library_on_every_plane_layout_block_and_shape():
    # interpreter: every 3rd weight (MX_SHAPES has 4 shapes x 3 layouts, the NVFP4 list 5 x 6: the
    # stride walks across layouts, blocks and shapes, each format, layout and block still in it)
    for w, planes in covering(all_weights(), 3):
        for plane in planes:  # (every dtype: the exhaustive tests above)
            assert same_bits(kernel_plane(w, plane, torch.bfloat16), plane_matrix(w, plane, torch.bfloat16)), (w, plane)


def test_chunks_are_slices_of_the_plane():
    w = mx_weight(300, 400, "both", "swizzled", 7)
    n = nv_weight(260, 300, "both", "compact", "1x16", 8)
    for wt, plane in ((w, "row"), (w, "col"), (n, "row"), (n, "col")):
        op = _gemm.plane_operand(wt, plane)
        full = plane_matrix(wt, plane, torch.bfloat16)
        for r0, r1, c0, c1 in ((0, op.R, 128, op.C), (128, op.R, 0, op.C), (128, 256, 128, 256), (0, 1, 0, 1)):
            got = K.plane_dequant(op, r0, r1, c0, c1, torch.bfloat16)
            assert same_bits(got, full[r0:r1, c0:c1]), (wt, plane, r0, r1, c0, c1)


def test_chunks_hold_at_most_chunk_bytes_and_one_when_the_copy_fits():
    cap = _gemm.CHUNK_BYTES
    for extent in (1, 129, 256, 4096, 14336):
        for other in (1, 4096, 1 << 20):
            for dt in (torch.bfloat16, torch.float32):
                n = _gemm._chunk(extent, other, dt)
                per_row = other * dt.itemsize
                if extent * per_row <= cap:
                    assert n == extent                          # the copy fits: one chunk
                    continue
                assert n % 128 == 0 and n < extent
                assert n == 128 or n * per_row <= cap
                k = -(-extent // n)
                assert extent - (k - 1) * n > 0 and n - (extent - (k - 1) * n) < 128 * k  # about equal
    assert _gemm._chunk(256, 1 << 20, torch.bfloat16) == 128   # one block row each: nothing smaller exists


# ---- the GEMMs -------------------------------------------------------------------------------

def within_bound(y, x, w_t, dt, b=None):
    """y (dt) vs x @ w_t (+ b), exact in f64, per element: the bound of the module docstring,
    with 2u|b| more where a bias is added (a path may round x @ w_t before adding it)."""
    xd, wd = x.double().cpu(), w_t.double().cpu()
    exact = xd @ wd
    k = xd.shape[-1]
    u = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11, torch.float32: 2.0 ** -24}[dt]
    bias = b.double().cpu().abs() if b is not None else 0.0
    if b is not None:
        exact = exact + b.double().cpu()
    bound = k * 2.0 ** -24 * (xd.abs() @ wd.abs()) + 2 * u * (exact.abs() + bias) + 2.0 ** -140
    err = (y.double().cpu() - exact).abs()
    return bool(torch.all(err <= bound)), float((err - bound).max())


def run_paths(w, planes, lead, dt, with_bias, seed):
    for path in ("fused", "chunked", "dequant"):
        run_paths_forced(w, planes, lead, dt, with_bias, seed, path)


def run_paths_forced(w, planes, lead, dt, with_bias, seed, path):
    g = torch.Generator().manual_seed(seed)
    N, Kin = w.rows, w.cols
    x = torch.randn(*lead, Kin, generator=g).to(dt).to(DEV)
    gy = torch.randn(*lead, N, generator=g).to(dt).to(DEV)
    b = torch.randn(N, generator=g).to(dt).to(DEV) if with_bias else None
    w_row = _gemm.dequant(w, "row" if "row" in planes else "col", dt)
    _gemm.path_counts.clear()
    with _gemm.forced_path(path):
        if "row" in planes:
            y = _gemm.linear_fwd(x, w, b, dt)
            assert y.shape == (*lead, N) and y.dtype == dt
            ok, over = within_bound(y.reshape(-1, N), x.reshape(-1, Kin), w_row.t(), dt, b)
            assert ok, (over, path, "fwd", dt, lead, w)
        for plane in planes:
            gx = _gemm.linear_dgrad(gy, w, plane, dt)
            assert gx.shape == (*lead, Kin) and gx.dtype == dt
            ok, over = within_bound(gx.reshape(-1, Kin), gy.reshape(-1, N), _gemm.dequant(w, plane, dt), dt)
            assert ok, (over, path, "dgrad", plane, dt, lead, w)
    ran = {p for (_, p, _) in _gemm.path_counts}
    want = "chunked" if (dt == torch.float32 and path == "fused") else path
    assert ran == {want}, (path, dict(_gemm.path_counts))


@pytest.mark.parametrize("dt", (torch.bfloat16, torch.float16, torch.float32), ids=str)
def test_gemm_paths_match_the_exact_product_within_the_fp32_bound(dt):
    # interpreter: the five cases spread over the three dtypes (each case once, each dtype with an
    # MXFP8 and an NVFP4 weight); with a GPU every case in every dtype
    cases = [(mx_weight(97, 65, "both", "padded", 1), ("row", "col"), (3, 5), True),
             (mx_weight(1, 33, "both", "compact", 2), ("row", "col"), (1,), False),
             (mx_weight(130, 1, "row", "swizzled", 3), ("row",), (2, 1, 3), True),
             (nv_weight(66, 98, "both", "swizzled", "1x16", 4), ("row", "col"), (17,), True),
             (nv_weight(48, 34, "both", "padded", "16x16", 5), ("row", "col"), (2, 9), False)]
    pick = {torch.bfloat16: (0, 3), torch.float16: (1, 4), torch.float32: (2, 3)}[dt]
    for i, (w, planes, lead, bias) in enumerate(cases):
        if K.INTERPRET and i not in pick:
            continue
        run_paths(w, planes, lead, dt, bias, 100 + i)


def test_fused_gemm_reads_exactly_the_dequantized_weight():
    # identity activations: every output is one weight value (x 1, + zeros): exact in fp32 and in dt
    for w, plane in ((mx_weight(70, 96, "both", "swizzled", 11), "col"),
                     (nv_weight(64, 96, "row", "compact", "1x16", 12), "row")):
        for dt in (torch.bfloat16, torch.float16):
            _gemm.path_counts.clear()
            with _gemm.forced_path("fused"):
                y = _gemm.linear_fwd(torch.eye(w.cols, dtype=dt, device=DEV), w, None, dt)
                gx = _gemm.linear_dgrad(torch.eye(w.rows, dtype=dt, device=DEV), w, plane, dt)
            assert {p for (_, p, _) in _gemm.path_counts} == {"fused"}
            assert torch.equal(y, _gemm.dequant(w, "row", dt).t())
            assert torch.equal(gx, _gemm.dequant(w, plane, dt))


# ---- the choice, and saying so ----------------------------------------------------------------

def test_fallbacks_say_why():
    cpu = torch.device("cpu")
    w = mxshard.MXFP8Weight.empty(64, 64, planes="row", layout="padded", device="cpu")
    assert _gemm.choose_path("fwd", w, "row", 16, torch.bfloat16, cpu) == \
        ("dequant", "CPU tensors: the library's dequantize + torch matmul (the reference)")
    odd = mxshard.NVFP4Weight.empty(4, 33, planes="both", layout="padded", device="cpu")
    with _gemm.forced_path("fused"):
        if K.INTERPRET:
            assert _gemm.choose_path("fwd", odd, "row", 4, torch.bfloat16, cpu)[1].startswith("NVFP4 plane with an odd")
            assert _gemm.choose_path("dgrad", odd, "col", 4, torch.bfloat16, cpu) == ("fused", "forced")  # W^T: rows 4
            assert _gemm.choose_path("fwd", w, "row", 0, torch.bfloat16, cpu) == ("dequant", "no tokens")
            assert _gemm.choose_path("fwd", w, "row", 8, torch.float32, cpu)[0] == "chunked"
    # an odd NVFP4 row length runs the reference path and counts it
    x = torch.randn(3, 33, dtype=torch.bfloat16)
    _gemm.path_counts.clear()
    with _gemm.forced_path("fused"):
        y = _gemm.linear_fwd(x, odd, None, torch.bfloat16)
    assert torch.equal(y, torch.nn.functional.linear(x, _gemm.dequant(odd, "row", torch.bfloat16)))
    ((op, path, why),) = _gemm.path_counts
    assert (op, path) == ("fwd", "dequant") and why
    with pytest.raises(ValueError):
        with _gemm.forced_path("cublas"):
            pass


def test_no_triton_falls_back_with_the_import_error(monkeypatch):
    monkeypatch.setattr(_gemm, "_kernels_mod", None)
    monkeypatch.setattr(_gemm, "_kernels_err", "ImportError: no triton")
    w = mxshard.MXFP8Weight.empty(64, 64, planes="row", layout="padded", device=DEV)
    with _gemm.forced_path("fused"):
        path, why = _gemm.choose_path("fwd", w, "row", 16, torch.bfloat16, torch.device(DEV))
    assert path == "dequant" and why == "Triton is not available (ImportError: no triton)"


def test_rule_takes_the_nearest_grid_point(monkeypatch):
    letters = "FCD"
    # a table where every cell is different: (i, j) -> letters[(i + 2 j) % 3]
    table = {k: tuple("".join(letters[(i + 2 * j) % 3] for j in range(len(_gemm.RULE_TOKENS)))
                      for i in range(len(_gemm.RULE_ELEMS))) for k in _gemm.RULE}
    monkeypatch.setattr(_gemm, "RULE", table)
    _gemm._rule_reasons.clear()
    try:
        for (fmt, gemm) in table:
            for i, e in enumerate(_gemm.RULE_ELEMS):
                for j, t in enumerate(_gemm.RULE_TOKENS):
                    want = _gemm._PATHS[letters[(i + 2 * j) % 3]]
                    for elems in (2 ** e, int(2 ** (e - 0.49)) + 1, int(2 ** (e + 0.49))):
                        for tokens in (2 ** t, int(2 ** (t - 0.49)) + 1, int(2 ** (t + 0.49))):
                            ii = 0 if elems < 2 ** _gemm.RULE_ELEMS[0] else i
                            jj = 0 if tokens < 2 ** _gemm.RULE_TOKENS[0] else j
                            if (ii, jj) != (i, j):
                                continue
                            path, why = _gemm._rule_path(fmt, gemm, elems, tokens)
                            assert path == want and why.startswith("measured rule"), (fmt, gemm, elems, tokens)
            # beyond the grid: its edge
            assert _gemm._rule_path(fmt, gemm, 1, 1)[0] == _gemm._PATHS[table[(fmt, gemm)][0][0]]
            assert _gemm._rule_path(fmt, gemm, 1 << 40, 1 << 30)[0] == _gemm._PATHS[table[(fmt, gemm)][-1][-1]]
    finally:
        _gemm._rule_reasons.clear()


def test_rule_table_is_complete():
    assert set(_gemm.RULE) == {(f, g) for f in ("mxfp8", "nvfp4") for g in ("fwd", "dgrad row", "dgrad col")}
    for rows in _gemm.RULE.values():
        assert len(rows) == len(_gemm.RULE_ELEMS)
        assert all(len(r) == len(_gemm.RULE_TOKENS) and set(r) <= set("FCD") for r in rows)


@pytest.mark.skipif(DEV != "cuda", reason="the measured rule applies to CUDA tensors")
def test_cuda_choice_is_the_rule():
    d = torch.device("cuda")
    for fmt, make in (("mxfp8", lambda n: mx_weight(n, n, "both", "padded", 3)),
                      ("nvfp4", lambda n: nv_weight(n, n, "both", "padded", "1x16", 3))):
        for i, e in enumerate(_gemm.RULE_ELEMS[:3]):     # (the larger weights: the same lookup)
            w = make(2 ** (e // 2))
            for j, t in enumerate(_gemm.RULE_TOKENS):
                for op, plane, gemm in (("fwd", "row", "fwd"), ("dgrad", "row", "dgrad row"),
                                        ("dgrad", "col", "dgrad col")):
                    want = _gemm._PATHS[_gemm.RULE[(fmt, gemm)][i][j]]
                    path, why = _gemm.choose_path(op, w, plane, 2 ** t, torch.bfloat16, d)
                    assert (path, why.startswith("measured rule")) == (want, True), (fmt, gemm, e, t)
                    p32, _ = _gemm.choose_path(op, w, plane, 2 ** t, torch.float32, d)
                    assert p32 == ("chunked" if want == "fused" else want)


# ---- plans and launches ----------------------------------------------------------------------

def test_plans_are_kept_per_primary_and_rebound_when_its_tensors_change():
    """One plan per primary and plane: kept while the primary holds the same tensors, and rebound
    (not rebuilt) when it holds new ones (FSDP2's assembly binds every gather's planes into one
    primary object per plane): the product is then the new bytes', on both kernel paths."""
    w = mx_weight(130, 96, "both", "padded", 21)
    other = mx_weight(130, 96, "both", "padded", 22)
    x = torch.randn(5, 96).to(torch.bfloat16).to(DEV)
    for path in ("chunked", "fused"):
        with _gemm.forced_path(path):
            y0 = _gemm.linear_fwd(x, w, None, torch.bfloat16)
            y1 = _gemm.linear_fwd(x, other, None, torch.bfloat16)
            assert not torch.equal(y0, y1)
            plan = _gemm._plans[w][("row", torch.bfloat16)]
            assert torch.equal(_gemm.linear_fwd(x, w, None, torch.bfloat16), y0)
            assert _gemm._plans[w][("row", torch.bfloat16)] is plan                  # kept
            old = (w.row_data, w.row_scale)
            w.row_data, w.row_scale = other.row_data.clone(), other.row_scale.clone()   # new tensors, new values
            assert torch.equal(_gemm.linear_fwd(x, w, None, torch.bfloat16), y1)    # the new bytes
            assert _gemm._plans[w][("row", torch.bfloat16)] is plan                  # rebound
            w.row_scale.data = w.row_scale.clone()                                   # same object, new storage
            w.row_data.zero_()                                                       # in place: read at launch
            assert torch.equal(_gemm.linear_fwd(x, w, None, torch.bfloat16), torch.zeros_like(y0))
            assert _gemm._plans[w][("row", torch.bfloat16)] is plan
            w.row_data, w.row_scale = old
            assert torch.equal(_gemm.linear_fwd(x, w, None, torch.bfloat16), y0)
    n = len(_gemm._plans)
    del w, plan
    import gc
    gc.collect()
    assert len(_gemm._plans) == n - 1                                             # no reference kept


def test_a_bound_operand_is_the_operand_of_the_new_tensors():
    """PlaneOperand.bound (the rebind's fast copy) equals the operand built from the new tensors,
    its specialisation key included, for aligned and unaligned tensors of both formats."""
    k = _gemm._kernels()
    if k is None:
        pytest.skip("Triton is not available")
    for w, plane in ((mx_weight(130, 96, "both", "padded", 31), "col"), (mx_weight(64, 64, "row", "swizzled", 32), "row")):
        op = _gemm.plane_operand(w, plane)
        for shift in (0, 1):   # an unaligned view changes the data's part of the key
            data = torch.zeros(op.data.numel() + 1, dtype=torch.uint8, device=op.data.device)[shift:shift + op.data.numel()]
            b = op.bound(data, op.scale.clone(), op.amax)
            ref = k.PlaneOperand(**{f: getattr(b, f) for f in ("data", "scale", "amax", "R", "C", "fp4", "block",
                                                               "scale_c", "swizzled", "s_m", "s_k", "s_kp")})
            assert b == ref and b.spec == ref.spec and b.data is data, (plane, shift)
            assert op.data is not data   # the original is untouched


def test_several_chunks_give_the_product():
    # 128-row chunks (the smallest) of 300 x 260 weights: every chunk loop, every format and plane
    _gemm.set_rule(chunk_bytes=128 * 300 * 2)
    try:
        cases = (mx_weight(300, 260, "both", "swizzled", 31), nv_weight(300, 260, "both", "compact", "1x16", 32))
        for i, w in enumerate(cases):
            _gemm.path_counts.clear()
            run_paths_forced(w, ("row", "col"), (7,), torch.bfloat16, True, 300 + i, "chunked")
            assert len(_gemm._plans[w][("row", torch.bfloat16)].chunks(0)) == 3
    finally:
        _gemm.set_rule(chunk_bytes=32 << 20)


def test_launch_keys_determine_tritons_specialisation():
    try:
        from triton._C.libtriton import native_specialize_impl
        from triton.backends.compiler import BaseBackend
    except ImportError:  # pragma: no cover - another Triton
        pytest.skip("this Triton has no native_specialize_impl")

    def triton_spec(v):
        return native_specialize_impl(BaseBackend, v, False, True, True)
    ints = [0, 1, 2, 15, 16, 17, 31, 32, 48, -1, -16, -17, (1 << 31) - 16, (1 << 31) - 1, 1 << 31, (1 << 31) + 16,
            -(1 << 31), -(1 << 31) - 16, 1 << 40, (1 << 40) + 1]
    buf = torch.empty(256, dtype=torch.uint8)
    tensors = [buf, buf[1:], buf[16:], buf[8:], buf.view(torch.bfloat16), buf[2:].view(torch.bfloat16),
               buf.view(torch.float32), torch.empty(8, dtype=torch.float16), torch.empty(3, dtype=torch.float32)]
    vals = ints + tensors
    for a in vals:
        for b in vals:
            if isinstance(a, torch.Tensor) != isinstance(b, torch.Tensor):
                continue   # an argument's kind is fixed by its position
            assert (K._spec(a) == K._spec(b)) == (triton_spec(a) == triton_spec(b)), (a, b)


@pytest.mark.skipif(DEV != "cuda", reason="direct launches of compiled kernels: a GPU")
def test_direct_launches_equal_tritons_launches(monkeypatch):
    w = nv_weight(300, 258, "both", "swizzled", "1x16", 41)
    m = mx_weight(300, 258, "both", "compact", 42)
    x = torch.randn(33, 258, device="cuda").to(torch.bfloat16)
    gy = torch.randn(33, 300, device="cuda").to(torch.bfloat16)

    def run():
        out = []
        for path in ("fused", "chunked"):
            with _gemm.forced_path(path):
                for wt in (w, m):
                    out.append(_gemm.linear_fwd(x, wt, None, torch.bfloat16))
                    out += [_gemm.linear_dgrad(gy, wt, p, torch.bfloat16) for p in ("row", "col")]
        return out
    monkeypatch.setattr(K, "FAST_LAUNCH", False)
    ref = run()
    monkeypatch.setattr(K, "FAST_LAUNCH", True)
    run()                                  # compiled handles kept
    K.launch_counts.clear()
    got = run()
    assert all(torch.equal(a, b) for a, b in zip(ref, got))
    assert K.launch_counts[("qgemm", "fast")] > 0 and K.launch_counts[("dequant", "fast")] > 0
    assert K.launch_counts[("qgemm", "triton")] == 0 and K.launch_counts[("dequant", "triton")] == 0
    # an unaligned activation is another specialisation: Triton's path once, then its own handle
    # (bit-identical to itself; against the aligned one only within the bound: another
    # specialisation may sum the same exact products in another order, seen on the H200)
    xs = torch.randn(33 * 258 + 1, device="cuda").to(torch.bfloat16)[1:].view(33, 258)
    K.launch_counts.clear()
    with _gemm.forced_path("fused"):
        a = _gemm.linear_fwd(xs, m, None, torch.bfloat16)
        b = _gemm.linear_fwd(xs, m, None, torch.bfloat16)
    assert K.launch_counts[("qgemm", "triton")] == 1 and K.launch_counts[("qgemm", "fast")] == 1
    assert torch.equal(a, b)
    ok, over = within_bound(a, xs, _gemm.dequant(m, "row", torch.bfloat16).t(), torch.bfloat16)
    assert ok, over


# ---- wgrad -------------------------------------------------------------------------------------

@pytest.mark.parametrize("dt", (torch.bfloat16, torch.float16, torch.float32), ids=str)
def test_wgrad_sums_exact_products_in_fp32(dt):
    g = torch.Generator().manual_seed(5)
    gy = (torch.randn(300, 40, generator=g) * 3).to(dt)
    x = torch.randn(300, 56, generator=g).to(dt)
    g32 = _gemm.linear_wgrad(gy.to(DEV), x.to(DEV), dtype=torch.float32)
    assert g32.dtype == torch.float32
    if DEV == "cpu":   # the CPU definition, bit for bit
        assert torch.equal(g32, torch.mm(gy.t().float(), x.float()))
    exact = gy.double().t() @ x.double()
    bound = 301 * 2.0 ** -24 * (gy.double().abs().t() @ x.double().abs())
    assert torch.all((g32.double().cpu() - exact).abs() <= bound)
    if dt != torch.float32:  # no rounding of the product to dt first
        rounded = (gy.t() @ x).double()
        assert (g32.double().cpu() - exact).abs().max() < (rounded - exact).abs().max()
    assert _gemm.linear_wgrad(gy.to(DEV), x.to(DEV)).dtype == dt


def test_interpreter_or_gpu_is_what_ran():
    # the suite exercised the kernels on CPU tensors (interpreter) or CUDA ones, as announced
    assert DEV == ("cpu" if K.INTERPRET else "cuda")
    assert np.float32(1) / np.float32(2688) == np.float32(0.00037202381645329297)

# SPDX-License-Identifier: MIT
"""mxshard.torch._gemm: the GEMM paths of the quantized linears.

The Triton kernels (mxshard.torch._mxgemm_triton) run compiled on a GPU, else
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
* Which path ran and why (`_gemm.path_counts`), the fallbacks, the chunks.
* wgrad: fp32 accumulation of the exact products into main_grad.
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

try:
    mxshard.host_version()
except mxshard.LibraryNotFoundError as e:  # pragma: no cover - depends on the machine
    pytest.skip(f"libmxshard_host not found: {str(e).splitlines()[0]}", allow_module_level=True)

from mxshard.torch import _gemm  # noqa: E402

K = _gemm._kernels()
if K is None:  # pragma: no cover - depends on the machine
    pytest.skip(f"mxshard.torch._mxgemm_triton does not load: {_gemm._kernels_err}", allow_module_level=True)
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


def test_kernel_dequantize_equals_the_library_on_every_plane_layout_block_and_shape():
    for w, planes in all_weights():
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


def test_chunk_never_holds_the_whole_weight():
    for extent in (129, 256, 4096, 14336):
        for other in (1, 4096, 1 << 20):
            n = _gemm._chunk(extent, other, torch.bfloat16)
            assert n % 128 == 0 and n < extent
            assert n == 128 or n * other * 2 <= _gemm.CHUNK_BYTES
    assert _gemm._chunk(128, 1 << 20, torch.bfloat16) == 128   # one block row: nothing smaller exists


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
    g = torch.Generator().manual_seed(seed)
    N, Kin = w.rows, w.cols
    x = torch.randn(*lead, Kin, generator=g).to(dt).to(DEV)
    gy = torch.randn(*lead, N, generator=g).to(dt).to(DEV)
    b = torch.randn(N, generator=g).to(dt).to(DEV) if with_bias else None
    w_row = _gemm.dequant(w, "row" if "row" in planes else "col", dt)
    for path in ("fused", "chunked", "dequant"):
        _gemm.path_counts.clear()
        with _gemm.forced_path(path):
            if "row" in planes:
                y = _gemm.linear_fwd(x, w, b, dt)
                assert y.shape == (*lead, N) and y.dtype == dt
                ok, over = within_bound(y.reshape(-1, N), x.reshape(-1, Kin), w_row.t(), dt, b)
                assert ok, (w, path, "fwd", dt, lead, over)
            for plane in planes:
                gx = _gemm.linear_dgrad(gy, w, plane, dt)
                assert gx.shape == (*lead, Kin) and gx.dtype == dt
                ok, over = within_bound(gx.reshape(-1, Kin), gy.reshape(-1, N), _gemm.dequant(w, plane, dt), dt)
                assert ok, (w, path, "dgrad", plane, dt, lead, over)
        ran = {p for (_, p, _) in _gemm.path_counts}
        want = "chunked" if (dt == torch.float32 and path == "fused") else path
        assert ran == {want}, (path, dict(_gemm.path_counts))


@pytest.mark.parametrize("dt", (torch.bfloat16, torch.float16, torch.float32), ids=str)
def test_gemm_paths_match_the_exact_product_within_the_fp32_bound(dt):
    cases = [(mx_weight(97, 65, "both", "padded", 1), ("row", "col"), (3, 5), True),
             (mx_weight(1, 33, "both", "compact", 2), ("row", "col"), (1,), False),
             (mx_weight(130, 1, "row", "swizzled", 3), ("row",), (2, 1, 3), True),
             (nv_weight(66, 98, "both", "swizzled", "1x16", 4), ("row", "col"), (17,), True),
             (nv_weight(48, 34, "both", "padded", "16x16", 5), ("row", "col"), (2, 9), False)]
    for i, (w, planes, lead, bias) in enumerate(cases):
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


@pytest.mark.skipif(DEV != "cuda", reason="the measured rule applies to CUDA tensors")
def test_cuda_rule_takes_fused_then_chunked():
    w = mx_weight(256, 256, "row", "padded", 3)
    d = torch.device("cuda")
    for op in ("fwd", "dgrad"):
        lim = _gemm.FUSED_MAX_TOKENS[op]
        if lim > 0:
            assert _gemm.choose_path(op, w, "row", lim, torch.bfloat16, d)[0] == "fused"
        assert _gemm.choose_path(op, w, "row", lim + 1, torch.bfloat16, d)[0] == "chunked"
    assert _gemm.choose_path("fwd", w, "row", 8, torch.float32, d)[0] == "chunked"


# ---- wgrad -------------------------------------------------------------------------------------

@pytest.mark.parametrize("dt", (torch.bfloat16, torch.float16, torch.float32), ids=str)
def test_wgrad_accumulates_exact_products_in_fp32(dt):
    g = torch.Generator().manual_seed(5)
    gy = (torch.randn(300, 40, generator=g) * 3).to(dt)
    x = torch.randn(300, 56, generator=g).to(dt)
    acc0 = torch.randn(40, 56, generator=g)
    acc = acc0.clone().to(DEV)
    out = _gemm.linear_wgrad(gy.to(DEV), x.to(DEV), acc=acc)
    assert out is acc and acc.dtype == torch.float32
    if DEV == "cpu":   # the CPU definition, bit for bit
        assert torch.equal(acc, acc0.clone().addmm_(gy.t().float(), x.float()))
    exact = acc0.double() + gy.double().t() @ x.double()
    bound = 301 * 2.0 ** -24 * (acc0.double().abs() + gy.double().abs().t() @ x.double().abs())
    assert torch.all((acc.double().cpu() - exact).abs() <= bound)
    if dt != torch.float32:  # no rounding of the product to dt first
        rounded = acc0.double() + (gy.t() @ x).double()
        assert (acc.double().cpu() - exact).abs().max() < (rounded - exact).abs().max()
    g32 = _gemm.linear_wgrad(gy.to(DEV), x.to(DEV), dtype=torch.float32)
    assert g32.dtype == torch.float32
    assert torch.all((g32.double().cpu() - gy.double().t() @ x.double()).abs() <= bound)
    assert _gemm.linear_wgrad(gy.to(DEV), x.to(DEV)).dtype == dt
    with pytest.raises(ValueError, match="float32"):
        _gemm.linear_wgrad(gy.to(DEV), x.to(DEV), acc=torch.zeros(40, 56, dtype=torch.bfloat16, device=DEV))


def test_interpreter_or_gpu_is_what_ran():
    # the suite exercised the kernels on CPU tensors (interpreter) or CUDA ones, as announced
    assert DEV == ("cpu" if K.INTERPRET else "cuda")
    assert np.float32(1) / np.float32(2688) == np.float32(0.00037202381645329297)

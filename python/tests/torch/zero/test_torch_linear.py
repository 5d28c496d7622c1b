# SPDX-License-Identifier: MIT
"""mxshard.torch.zero.linear: MXFP8Linear (forward from the row plane, backward from
the row or column-wise plane, wgrad into an fp32 main_grad: fp32 sums of the
exact products), convert(), the master / storage calls. On CPU the GEMMs are
the reference path (dequantize + torch); on CUDA they are compared within the
fp32 bound (python/tests/torch/gemm/test_torch_gemm.py tests the paths themselves). Skips without torch or the host library; the CUDA
cases skip without a GPU and libmxshard_cuda."""
import copy
import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

import mxshard  # noqa: E402
from mxshard import _lib  # noqa: E402

from conftest import host_lib_or_skip  # noqa: E402

host_lib_or_skip(module_level=True)

import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from conftest import cuda_or_skip  # noqa: E402
from mxshard.torch.gemm import paths as _gemm  # noqa: E402
import mxshard.torch as mxt  # noqa: E402
from mxshard.torch.zero.linear import MXFP8Linear, is_mxfp8  # noqa: E402
from mxshard.torch.convert import convert  # noqa: E402

LAYOUTS = ("compact", "padded", "swizzled")
PLANES = ("row", "both")
DTYPES = (torch.float32, torch.bfloat16)
SEEDS = (0, 1, 2)
# fixed edge shapes (in, out) plus random ones from a seeded generator
_gen = np.random.default_rng(20240615)
SHAPES = [(1, 1), (1, 65), (33, 1), (33, 65), (64, 32)] + \
         [(int(a), int(b)) for a, b in _gen.integers(1, 160, size=(3, 2))]


def deq(m, plane, dtype):
    code = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}[dtype]
    return mxshard.dequantize(m.primary, plane=plane, dtype=code)


def bits(t):
    """Bit patterns, so that equality is bitwise (NaN-safe, -0 != +0)."""
    return t.contiguous().view({4: torch.int32, 2: torch.int16, 1: torch.uint8}[t.element_size()])


def same(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(bits(a), bits(b))


def close(y, exact, abs_prod, k, dtype):
    """|y - exact| <= k 2^-24 (|a| @ |b|) + 2u |exact|: fp32 sums of exact products in any order,
    one rounding to dtype (u = 2^-8 bf16; fp32: none); python/tests/torch/gemm/test_torch_gemm.py derives it."""
    u = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11, torch.float32: 0.0}[dtype]
    e = exact.cpu()
    return bool(torch.all((y.double().cpu() - e).abs() <= k * 2.0 ** -24 * abs_prod.cpu() + 2 * u * e.abs()))


def make(inf, outf, planes, layout, dtype, seed, bias=True, device="cpu"):
    torch.manual_seed(seed)
    return MXFP8Linear(inf, outf, bias=bias, planes=planes, layout=layout, compute_dtype=dtype, device=device)


# ---- forward -------------------------------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("planes", PLANES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_forward_is_linear_of_row_plane(layout, planes, dtype):
    for k, ((inf, outf), seed) in enumerate(zip(SHAPES, itertools.cycle(SEEDS))):
        m = make(inf, outf, planes, layout, dtype, seed, bias=k % 2 == 0)
        g = torch.Generator().manual_seed(seed + 100 * k)
        lead = [(), (3,), (2, 5)][k % 3]
        x = torch.randn(*lead, inf, generator=g)
        y = m(x)
        w = deq(m, "row", dtype)
        b = m.bias.to(dtype) if m.bias is not None else None
        # computed in the compute dtype, returned in the input's (as nn.Linear; issue 34 item 12)
        assert y.shape == (*lead, outf) and y.dtype == x.dtype
        assert same(y, F.linear(x.to(dtype), w, b).to(x.dtype)), (inf, outf, lead)
        ref = torch.matmul(x.to(torch.float64), w.double().t()) + (b.double() if b is not None else 0)
        tol = 1e-5 if dtype == torch.float32 else 3e-2
        assert torch.allclose(y.double(), ref, rtol=tol, atol=tol * max(1.0, ref.abs().max().item()))
        # the row plane holds the fp32 initial master (up to MXFP8 rounding: 3 mantissa bits)
        wi = m.master_init()
        assert torch.all((deq(m, "row", torch.float32) - wi).abs() <= wi.abs() * 0.0625 + 2.0 ** -120)
        with torch.no_grad():
            assert same(m(x), y)


def test_forward_casts_and_validates():
    m = make(40, 24, "row", "padded", torch.bfloat16, 0)
    x = torch.randn(4, 40, dtype=torch.float16)
    y = m(x)
    assert y.dtype == torch.float16   # the input's dtype, as nn.Linear returns
    assert same(y, F.linear(x.to(torch.bfloat16), deq(m, "row", torch.bfloat16),
                            m.bias.to(torch.bfloat16)).to(torch.float16))
    with torch.autocast("cpu", dtype=torch.bfloat16):   # inside autocast: autocast's dtype, as nn.Linear
        assert m(x).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="in_features=40"):
        m(torch.randn(4, 41))
    with pytest.raises(ValueError, match="last dim"):
        m(torch.randn(()))
    with pytest.raises(ValueError, match="floating"):
        m(torch.ones(4, 40, dtype=torch.int64))
    with pytest.raises(TypeError):
        m(np.ones((4, 40), np.float32))


def test_constructor_validates():
    for kw in (dict(in_features=0, out_features=4), dict(in_features=4, out_features=0),
               dict(in_features=4, out_features=4, planes="col"), dict(in_features=4, out_features=4, planes="Row"),
               dict(in_features=4, out_features=4, layout="te"), dict(in_features=4, out_features=4, rounding="up"),
               dict(in_features=4, out_features=4, compute_dtype=torch.float64),
               dict(in_features=4, out_features=4, compute_dtype="bf16"),
               dict(in_features=4, out_features=4, device="meta")):
        with pytest.raises(ValueError):
            MXFP8Linear(**kw)
    with pytest.raises(TypeError):
        MXFP8Linear(4.0, 4)
    with pytest.raises(TypeError):
        MXFP8Linear(4, 4, bias="yes")


def test_missing_library_is_a_clear_error(monkeypatch):
    def absent():
        raise _lib.LibraryNotFoundError("mxshard: cannot load the host library libmxshard_host (test)")
    m = make(8, 8, "row", "padded", torch.float32, 0)
    monkeypatch.setattr(_lib, "host_lib", absent)
    with pytest.raises(mxshard.LibraryNotFoundError, match="MXFP8Linear on cpu needs the host library"):
        MXFP8Linear(8, 8)
    with pytest.raises(mxshard.LibraryNotFoundError, match="libmxshard_host"):
        m(torch.randn(2, 8))
    with pytest.raises(mxshard.LibraryNotFoundError):
        convert(nn.Sequential(nn.Linear(4, 4)))


# ---- backward ------------------------------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("planes", PLANES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_backward_planes_main_grad_hook(layout, planes, dtype):
    bw_plane = "col" if planes == "both" else "row"
    for k, ((inf, outf), seed) in enumerate(zip(SHAPES[:6], itertools.cycle(SEEDS))):
        m = make(inf, outf, planes, layout, dtype, seed)
        g = torch.Generator().manual_seed(7 + k)
        m.set_master_(torch.randn(outf, inf, generator=g) * torch.exp2(torch.randint(-6, 7, (outf, inf), generator=g)))
        calls = []
        m._mxs_grad_hook = lambda: calls.append(m.main_grad.clone())
        lead = [(5,), (2, 3)][k % 2]
        expect_main = torch.zeros(outf, inf)
        expect_bias = torch.zeros(outf)
        for step in range(2):
            x = torch.randn(*lead, inf, generator=g).requires_grad_(True)
            gy = torch.randn(*lead, outf, generator=g).to(dtype)
            y = m(x)
            y.backward(gy)
            w = deq(m, bw_plane, dtype)
            assert same(x.grad, torch.matmul(gy, w).to(torch.float32)), (inf, outf, step)
            gy2, x2 = gy.reshape(-1, outf), x.detach().to(dtype).reshape(-1, inf)
            expect_main.addmm_(gy2.t().float(), x2.float())   # fp32 sums of the exact products
            expect_bias += gy2.sum(0).to(torch.float32)
            assert m.main_grad.dtype == torch.float32 and same(m.main_grad, expect_main)
            assert same(m.bias.grad, expect_bias)
            assert len(calls) == step + 1 and same(calls[-1], expect_main)  # the hook sees the updated main_grad
        for n in ("row_data", "row_scale", "col_data", "col_scale"):
            t = getattr(m, n)
            assert t is None or (t.grad is None and not t.requires_grad and t.dtype == torch.uint8)
        assert [n for n, _ in m.named_parameters()] == ["bias"]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_both_uses_the_column_plane(dtype):
    m = make(70, 40, "both", "padded", dtype, 3)
    # kaiming-uniform blocks all share one amax exponent (both planes then decode alike): use
    # per-element magnitudes spread over several binades so the row and column blocks differ
    w = torch.randn(40, 70) * torch.exp2(torch.randint(-6, 7, (40, 70)).float())
    m.set_master_(w)
    x = torch.randn(6, 70, requires_grad=True)
    gy = torch.randn(6, 40).to(dtype)
    m(x).backward(gy)
    by_col = torch.matmul(gy, deq(m, "col", dtype)).float()
    by_row = torch.matmul(gy, deq(m, "row", dtype)).float()
    assert same(x.grad, by_col)
    assert not torch.equal(by_col, by_row)  # random data: the planes' blocks differ
    # a row-only module with the same master reads the row plane
    r = make(70, 40, "row", "padded", dtype, 3).set_master_(w)
    assert same(r.row_data, m.row_data)
    assert not torch.equal(deq(m, "col", dtype), deq(m, "row", dtype))
    x2 = x.detach().clone().requires_grad_(True)
    r(x2).backward(gy)
    assert same(x2.grad, by_row)


def test_wgrad_without_any_input_requiring_grad():
    m = make(16, 8, "row", "compact", torch.float32, 0, bias=False)
    x = torch.randn(3, 16)
    calls = []
    m._mxs_grad_hook = lambda: calls.append(1)
    m(x).sum().backward()
    assert same(m.main_grad, torch.ones(3, 8).t() @ x) and calls == [1]
    m.main_grad.zero_()
    own = m.main_grad
    m(x).sum().backward()  # an existing main_grad is accumulated into, not replaced
    assert m.main_grad is own and same(own, torch.ones(3, 8).t() @ x)
    m.main_grad = torch.zeros(8, 16, dtype=torch.float16)   # float32 or bfloat16 only
    with pytest.raises(ValueError, match="main_grad"):
        m(x).sum().backward()


@pytest.mark.parametrize("planes", PLANES)
def test_autograd_grad_wrt_input_leaves_main_grad(planes):
    """torch.autograd.grad(loss, x) (saliency, an input-gradient penalty) and
    backward(inputs=[x]) return x's gradient and leave main_grad, the gradient
    hook and the bias' .grad alone, as they leave .grad alone in torch; a
    retained graph's loss.backward() after them accumulates exactly what a plain
    backward does. The token standing for the weight is neither a parameter nor
    in the state dict."""
    m = make(24, 12, planes, "padded", torch.float32, 1)
    calls = []
    m._mxs_grad_hook = lambda: calls.append(1)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 24, generator=g, requires_grad=True)
    gy = torch.randn(4, 12, generator=g)
    ref = make(24, 12, planes, "padded", torch.float32, 1)
    xr = x.detach().clone().requires_grad_(True)
    ref(xr).backward(gy)
    y = m(x)
    gx, = torch.autograd.grad(y, x, gy, retain_graph=True)
    assert same(gx, xr.grad)
    assert m.main_grad is None and calls == [] and m.bias.grad is None
    y.backward(gy, inputs=[x], retain_graph=True)
    assert m.main_grad is None and calls == [] and m.bias.grad is None and same(x.grad, xr.grad)
    x.grad = None
    y.backward(gy)   # a plain backward of the same graph: the weight gradient, bit-identical
    assert same(m.main_grad, ref.main_grad) and calls == [1] and same(m.bias.grad, ref.bias.grad)
    assert same(x.grad, xr.grad)
    # x requires no grad (the token alone carries the graph): autograd.grad wrt the bias only
    y = m(x.detach())
    gb, = torch.autograd.grad(y, m.bias, gy)
    assert same(gb, gy.sum(0)) and same(m.main_grad, ref.main_grad) and calls == [1]
    assert [n for n, _ in m.named_parameters()] == ["bias"]
    assert not any("token" in k for k in m.state_dict()) and "_mxs_token" not in m._buffers


@pytest.mark.parametrize("planes", PLANES)
def test_double_backward_raises(planes):
    """create_graph=True through a quantized linear (a gradient penalty) raises, saying to keep
    the layer dense, and leaves main_grad alone; create_graph=False works as before."""
    m = make(24, 12, planes, "padded", torch.float32, 1)
    x = torch.randn(4, 24, requires_grad=True)
    with pytest.raises(RuntimeError) as e:
        torch.autograd.grad(m(x).pow(2).sum(), x, create_graph=True)
    assert str(e.value).startswith(f"mxshard: keep layers that need double backward (create_graph=True: gradient "
                                   f"penalties, Hessian-vector products, MAML) dense: leave {m._who} out of "
                                   f"convert()'s policy"), e.value
    assert m.main_grad is None
    with pytest.raises(RuntimeError, match="^mxshard: keep layers that need double backward"):
        m(x).pow(2).sum().backward(create_graph=True)
    assert m.main_grad is None
    gx, = torch.autograd.grad(m(x).pow(2).sum(), x)
    assert gx.shape == x.shape and m.main_grad is None


def test_only_the_input_is_kept_for_backward(monkeypatch):
    import weakref
    made = []
    dequant = _gemm.dequant

    def spy(primary, plane, dtype):
        t = dequant(primary, plane, dtype)
        made.append((plane, weakref.ref(t)))
        return t

    monkeypatch.setattr(_gemm, "dequant", spy)   # the GEMMs' dequantize (the CPU path)
    m = make(48, 96, "both", "padded", torch.bfloat16, 0)
    x = torch.randn(4, 48, dtype=torch.bfloat16, requires_grad=True)
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = m(x)
    assert len(saved) == 1 and saved[0].shape == x.shape and saved[0].data_ptr() == x.data_ptr()
    # the forward's dequantized weight is transient: gone once the forward returned
    assert [p for p, _ in made] == ["row"] and made[0][1]() is None
    y.sum().backward()
    assert [p for p, _ in made] == ["row", "col"] and made[1][1]() is None


# ---- master, storage, state ------------------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("planes", PLANES)
def test_set_master_equals_quantize(layout, planes):
    for rounding, (inf, outf) in zip(("ceil", "floor", "ceil"), [(33, 65), (1, 1), (97, 40)]):
        m = MXFP8Linear(inf, outf, planes=planes, layout=layout, rounding=rounding, compute_dtype=torch.float32)
        w = torch.randn(outf, inf, generator=torch.Generator().manual_seed(inf)) * 3
        m.set_master_(w)
        ref = mxshard.MXFP8Weight.empty(outf, inf, planes=planes, layout=layout, device="cpu")
        mxshard.quantize(ref, w, rounding=rounding)
        for n in ("row_data", "row_scale", "col_data", "col_scale"):
            a, b = getattr(m, n), getattr(ref, n)
            assert (a is None) == (b is None) and (a is None or torch.equal(a, b)), n
        assert same(m.master_init(), w)  # the kept copy follows set_master_
        m.release_master_init()
        assert same(m.master_init(), deq(m, "row", torch.float32))
    row_before = m.row_data.clone()
    for bad in (torch.randn(inf, outf), torch.randn(outf, inf, dtype=torch.float64), torch.randn(outf * inf)):
        with pytest.raises(ValueError):
            m.set_master_(bad)
    assert torch.equal(m.row_data, row_before)


def test_rebind_primary():
    m = make(70, 40, "both", "padded", torch.bfloat16, 5)
    x = torch.randn(3, 70)
    y0 = m(x)
    names = ("row_data", "row_scale", "col_data", "col_scale")
    shapes = {n: tuple(getattr(m, n).shape) for n in names}
    sizes = [int(np.prod(shapes[n])) for n in names]
    bucket = torch.full((sum(sizes) + 7,), 0xAB, dtype=torch.uint8)
    views, off = {}, 3
    for n, s in zip(names, sizes):
        views[n] = bucket[off:off + s].view(shapes[n])
        off += s
    old = {n: getattr(m, n).clone() for n in names}
    # rejected before any write: one good tensor and one bad
    rs = shapes["row_scale"]
    for bad in ({"row_scale": views["row_scale"][:-1]},                          # shape
                {"row_scale": views["row_scale"].view(torch.int8)},               # dtype
                {"row_scale": torch.zeros(rs[::-1], dtype=torch.uint8).t()},      # not contiguous
                {"row_scale": views["row_data"].reshape(-1)[:rs[0] * rs[1]].view(rs)},  # overlaps row_data
                {"row_scale": np.zeros(rs, np.uint8)},                            # not a tensor
                {"col_data": views["row_data"]}):                                 # the same storage twice
        with pytest.raises((ValueError, TypeError)):
            m.rebind_primary_(row_data=views["row_data"], **bad)
        assert torch.all(bucket == 0xAB) and m.row_data.data_ptr() != views["row_data"].data_ptr()
    r = make(8, 8, "row", "padded", torch.float32, 0)
    with pytest.raises(ValueError, match="no such plane"):
        r.rebind_primary_(col_data=torch.zeros(8, 8, dtype=torch.uint8))
    # the real thing
    p = m.rebind_primary_(**views)
    for n in names:
        assert getattr(m, n).data_ptr() == views[n].data_ptr() == getattr(m.primary, n).data_ptr()
        assert m._buffers[n] is views[n] and torch.equal(views[n], old[n])
    assert p is m.primary
    assert bucket[:3].tolist() == [0xAB] * 3 and bucket[-4:].tolist() == [0xAB] * 4
    assert same(m(x), y0)
    m.set_master_(torch.randn(40, 70))  # quantize writes into the bucket now
    assert torch.equal(views["row_data"], m.row_data) and not torch.equal(views["row_data"], old["row_data"])
    sd = m.state_dict()
    assert sd["row_data"].data_ptr() == views["row_data"].data_ptr()


@pytest.mark.parametrize("planes", PLANES)
def test_state_dict_round_trip(planes):
    a = make(33, 65, planes, "swizzled", torch.float32, 1)
    b = make(33, 65, planes, "swizzled", torch.float32, 2)
    keys = {"bias", "row_data", "row_scale"} | ({"col_data", "col_scale"} if planes == "both" else set())
    sd = a.state_dict()
    assert set(sd) == keys
    assert not torch.equal(a.row_data, b.row_data)
    ptrs = {n: b._buffers[n].data_ptr() for n in keys - {"bias"}}
    b.load_state_dict(sd)
    for n in keys:
        assert same(getattr(a, n), getattr(b, n)), n
    assert {n: b._buffers[n].data_ptr() for n in ptrs} == ptrs  # loaded in place: storage never moves
    x = torch.randn(2, 4, 33, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    ya, yb = a(x), b(x2)
    assert same(ya, yb)
    g = torch.randn_like(ya)
    ya.backward(g)
    yb.backward(g)
    assert same(x.grad, x2.grad) and same(a.main_grad, b.main_grad)


def test_no_high_precision_weight_after_release():
    m = make(64, 96, "both", "padded", torch.bfloat16, 0)

    def floats(mod):
        seen = dict(mod.named_parameters())
        seen.update((n, t) for n, t in mod.named_buffers())
        seen.update((n, t) for n, t in vars(mod).items() if isinstance(t, torch.Tensor))
        return sorted(n for n, t in seen.items() if t.is_floating_point())

    assert floats(m) == ["_master_init", "bias"]
    m.release_master_init()
    assert floats(m) == ["bias"]
    m(torch.randn(5, 64)).sum().backward()
    # (the weight's 0-element stand-in in the autograd graph holds no weight)
    assert floats(m) == ["_mxs_token", "bias", "main_grad"] and m._mxs_token.numel() == 0
    assert sorted(n for n, t in m.named_buffers()) == ["col_data", "col_scale", "row_data", "row_scale"]
    assert all(t.dtype == torch.uint8 for t in m.buffers())
    assert "planes=both" in repr(m) and "layout=padded" in repr(m) and "in_features=64" in repr(m)


# ---- convert ---------------------------------------------------------------------

class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc1 = nn.Linear(d, 2 * d)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(2 * d, d, bias=False)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Net(nn.Module):
    def __init__(self, d=24):
        super().__init__()
        self.inp = nn.Linear(7, d)
        self.blocks = nn.ModuleList([Block(d), Block(d)])
        self.head = nn.Linear(d, 3)

    def forward(self, x):
        x = self.inp(x)
        for b in self.blocks:
            x = x + b(x)
        return self.head(x)


def linear_names(model):
    return {n: ("mx-" + m.planes if is_mxfp8(m) else "dense")
            for n, m in model.named_modules() if isinstance(m, (nn.Linear, MXFP8Linear))}


def pdeq(m, dtype):
    """The row plane a convert()ed linear (MXFP8ParamLinear) multiplies by."""
    return mxt.dequantized_weight(m, dtype)


def test_convert_policies():
    torch.manual_seed(0)
    net = Net()
    out = convert(copy.deepcopy(net), "row")
    assert set(linear_names(out).values()) == {"mx-row"}
    assert set(linear_names(convert(copy.deepcopy(net), "dense")).values()) == {"dense"}
    pol = {"blocks.*.fc1": "both", "blocks.1.*": "dense", "*fc2": "row", "inp": "row"}
    got = linear_names(convert(copy.deepcopy(net), pol))
    assert got == {"inp": "mx-row", "blocks.0.fc1": "mx-both", "blocks.0.fc2": "mx-row",
                   "blocks.1.fc1": "mx-both", "blocks.1.fc2": "dense", "head": "dense"}
    seen = []

    def fn(name, mod):
        seen.append(name)
        return {"head": None, "inp": "dense"}.get(name, "both")
    got = linear_names(convert(copy.deepcopy(net), fn, skip=["*.1.fc2"]))
    assert got == {"inp": "dense", "blocks.0.fc1": "mx-both", "blocks.0.fc2": "mx-both",
                   "blocks.1.fc1": "mx-both", "blocks.1.fc2": "dense", "head": "dense"}
    assert "blocks.1.fc2" not in seen and "head" in seen
    got = linear_names(convert(copy.deepcopy(net), "both", skip="head"))
    assert got["head"] == "dense" and got["inp"] == "mx-both"
    for bad in ("rows", 3, None, {"inp": "fp8"}, {1: "row"}, lambda n, m: "bad", lambda n, m: True):
        model = copy.deepcopy(net)
        with pytest.raises(ValueError):
            convert(model, bad)
        assert set(linear_names(model).values()) == {"dense"}  # nothing swapped
    for kw in (dict(layout="te"), dict(compute_dtype=torch.float64), dict(rounding="x"), dict(skip=[3])):
        with pytest.raises(ValueError):
            convert(copy.deepcopy(net), "row", **kw)


def test_convert_forward_and_master_init():
    torch.manual_seed(1)
    net = Net()
    orig = copy.deepcopy(net)
    for dtype in DTYPES:
        model = convert(copy.deepcopy(net), "both", layout="compact", compute_dtype=dtype, rounding="floor")
        for name, mod in model.named_modules():
            if not is_mxfp8(mod):
                continue
            lin = orig.get_submodule(name)
            assert (mod.in_features, mod.out_features, mod.layout, mod.rounding, mod.compute_dtype) == \
                (lin.in_features, lin.out_features, "compact", "floor", dtype)
            assert same(mod.weight.detach()._data, lin.weight.detach())  # the master: the original weight, bitwise
            assert (mod.bias is None) == (lin.bias is None)
            if lin.bias is not None:
                assert same(mod.bias.detach(), lin.bias.detach())
            ref = copy.deepcopy(lin).to(dtype)
            with torch.no_grad():
                ref.weight.copy_(pdeq(mod, dtype))
            x = torch.randn(2, 3, lin.in_features)
            assert same(mod(x), ref(x.to(dtype)).float()), name
    # the model trains end to end: every MXFP8 weight is a Parameter and gets its .grad
    model = convert(copy.deepcopy(net), {"blocks.*": "both", "*": "row"}, compute_dtype=torch.float32)
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in net.parameters())
    model(torch.randn(4, 7)).sum().backward()
    for mod in model.modules():
        if is_mxfp8(mod):
            assert mod.weight.grad is not None and mod.weight.grad.abs().sum() > 0


def test_convert_same_bias_parameter_and_edge_cases():
    lin = nn.Linear(5, 6)
    seq = nn.Sequential(lin, nn.Sequential(nn.ReLU(), nn.Linear(6, 2)))
    bias = lin.bias
    convert(seq, "row")
    assert is_mxfp8(seq[0]) and seq[0].bias is bias and is_mxfp8(seq[1][1])
    # the root itself
    root = nn.Linear(4, 4)
    w0 = root.weight.detach().clone()
    new = convert(root, "row")
    # (the master takes the values; the replaced linear lets go of its weight: test_torch_convert_habits.py)
    assert is_mxfp8(new) and same(new.weight.detach()._data, w0) and root.weight.numel() == 0
    assert convert(root, "dense") is root
    # a module used under two names stays one module
    shared = nn.Linear(4, 4)
    two = nn.ModuleDict({"a": shared, "b": shared})
    convert(two, "row")
    assert is_mxfp8(two["a"]) and two["a"] is two["b"]
    two = nn.ModuleDict({"a": shared, "b": shared})
    with pytest.raises(ValueError, match="different policies"):
        convert(two, {"a": "row"})
    # a tied weight cannot be converted
    tied = nn.ModuleDict({"emb": nn.Embedding(10, 4), "head": nn.Linear(4, 10, bias=False)})
    tied["head"].weight = tied["emb"].weight
    with pytest.raises(ValueError, match="tied"):
        convert(tied, "row")
    assert type(tied["head"]) is nn.Linear
    # (a policy that then converts nothing: strict=False, convert raises otherwise)
    assert is_mxfp8(convert(tied, {"head": "dense", "*": "row"}, strict=False)["head"]) is False
    # subclasses of nn.Linear (MultiheadAttention's out_proj) are left alone
    mha = nn.MultiheadAttention(8, 2)
    convert(mha, "row", strict=False)
    assert type(mha.out_proj) is not MXFP8Linear
    assert not is_mxfp8(nn.Linear(2, 2)) and not is_mxfp8(None)
    # the module's training flag is kept
    ev = nn.Sequential(nn.Linear(3, 3)).eval()
    assert convert(ev, "row")[0].training is False


def test_module_to_keeps_planes_and_fp32_master():
    m = make(40, 24, "row", "padded", torch.bfloat16, 0)
    rd = m.row_data.clone()
    m.to(torch.float16)  # floating-point tensors only: the bias; planes stay uint8, the master fp32
    assert m.row_data.dtype == torch.uint8 and torch.equal(m.row_data, rd)
    assert m.bias.dtype == torch.float16 and m.master_init().dtype == torch.float32
    x = torch.randn(2, 40)
    y = m(x)
    assert same(y, F.linear(x.to(torch.bfloat16), deq(m, "row", torch.bfloat16), m.bias.to(torch.bfloat16)).float())
    assert m.primary.row_data is m.row_data


# ---- CUDA ------------------------------------------------------------------------

@pytest.mark.parametrize("planes", PLANES)
def test_cuda_matches_cpu_planes_and_linear(planes):
    cuda_or_skip()
    for layout, dtype in (("padded", torch.bfloat16), ("swizzled", torch.float32), ("compact", torch.bfloat16)):
        c = make(97, 65, planes, layout, dtype, 4)
        g = copy.deepcopy(c).cuda()
        g.set_master_(c.master_init().cuda())  # quantized on the GPU from the same master
        for n in ("row_data", "row_scale", "col_data", "col_scale"):
            a, b = getattr(c, n), getattr(g, n)
            assert (a is None) == (b is None) and (a is None or torch.equal(a, b.cpu())), n
        assert g.primary.device.startswith("cuda") and same(deq(g, "row", dtype).cpu(), deq(c, "row", dtype))
        x = torch.randn(3, 5, 97, device="cuda", requires_grad=True)
        gy = torch.randn(3, 5, 65, device="cuda").to(dtype)
        _gemm.path_counts.clear()
        y = g(x)
        # the GEMMs on CUDA are Triton's or cuBLAS's, each summing exact products in fp32 in its
        # own order: within that bound of the exact product of the same operands
        y_ref = F.linear(x.detach().to(dtype).double(), deq(g, "row", dtype).double(), g.bias.to(dtype).double())
        assert close(y, y_ref, x.detach().to(dtype).double().abs() @ deq(g, "row", dtype).double().abs().t(), 97, dtype)
        y.backward(gy)
        w = deq(g, "col" if planes == "both" else "row", dtype)
        assert close(x.grad, gy.double() @ w.double(), gy.double().abs() @ w.double().abs(), 65, dtype)
        want = {_gemm.choose_path(op, g.primary, pl, 15, dtype, x.device)[0]     # the measured rule's choices
                for op, pl in (("fwd", "row"), ("dgrad", "col" if planes == "both" else "row"))}
        assert {p for (op, p, _) in _gemm.path_counts if op != "wgrad"} == want
        assert g.main_grad.is_cuda and g.main_grad.dtype == torch.float32
        gy2, x2 = gy.reshape(-1, 65).double(), x.detach().to(dtype).reshape(-1, 97).double()
        assert close(g.main_grad, gy2.t() @ x2, gy2.abs().t() @ x2.abs(), 15, torch.float32)
        with pytest.raises(ValueError, match="input on cpu"):
            g(torch.randn(2, 97))

# SPDX-License-Identifier: MIT
"""MXFP8Linear(in, out, ...) (convert()'s MXFP8ParamLinear built directly; the removed
ShardedOptimizer linear's tests moved onto it): forward from the row plane, backward from
the row or column-wise plane, wgrad into weight.grad (fp32 sums of the exact products),
convert(), the master and its writes; under ShardedOptimizer (a world of one) the same
rules read the replicated planes and the gradient lands in the optimizer's bucket. On CPU the GEMMs are
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
from mxshard.torch import MXFP8Linear, is_mxfp8  # noqa: E402
from mxshard.torch.convert import convert  # noqa: E402

LAYOUTS = ("compact", "padded", "swizzled")
PLANES = ("row", "both")
DTYPES = (torch.float32, torch.bfloat16)
SEEDS = (0, 1, 2)
# fixed edge shapes (in, out) plus random ones from a seeded generator
_gen = np.random.default_rng(20240615)
SHAPES = [(1, 1), (1, 65), (33, 1), (33, 65), (64, 32)] + \
         [(int(a), int(b)) for a, b in _gen.integers(1, 160, size=(3, 2))]


CODE = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}


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


def make(inf, outf, planes, layout, dtype, seed, bias=True, device="cpu", rounding="ceil"):
    torch.manual_seed(seed)
    return MXFP8Linear(inf, outf, bias=bias, planes=planes, layout=layout, compute_dtype=dtype, device=device,
                       rounding=rounding)


def set_master(m, w):
    """The removed set_master_: write the master (the bytes follow at the next use)."""
    with torch.no_grad():
        m.weight.copy_(w)
    return m


def whole_quantize(m):
    """The whole-tensor quantize of m's master rounded through bf16 (its spec)."""
    ref = mxshard.MXFP8Weight.empty(m.out_features, m.in_features, planes=m.planes, layout=m.layout,
                                    device=m.weight.device)
    return mxshard.quantize(ref, m.weight.detach()._data.to(torch.bfloat16), rounding=m.rounding)


def under_optimizer(m):
    """m inside a model under ShardedOptimizer (a world of one): (model, opt)."""
    model = nn.Sequential(m)
    return model, mxt.ShardedOptimizer(model, lambda g: torch.optim.SGD(g, lr=0.0))


def bucket_grad(opt, name):
    """The gradient ShardedOptimizer's bucket holds for item `name` (world of one: all rows)."""
    for g, grad in zip(opt.buckets, opt._grad):
        for pos, it in enumerate(g.items):
            if it.name == name:
                return g.view(grad, pos, 0).reshape(it.shape)
    raise KeyError(name)


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
        # the row plane holds the fp32 master (up to MXFP8 rounding: 3 mantissa bits), exactly its
        # whole-tensor quantize (through bf16)
        wi = m.weight.detach()._data
        assert torch.all((deq(m, "row", torch.float32) - wi).abs() <= wi.abs() * 0.0625 + 2.0 ** -120)
        assert same(deq(m, "row", torch.float32), mxshard.dequantize(whole_quantize(m), plane="row", dtype="f32"))
        with torch.no_grad():
            assert same(m(x), y)
        if k < 3:   # the same forward under ShardedOptimizer: its replicated row plane, the same bytes
            model, opt = under_optimizer(m)
            assert same(model(x), y) and same(mxt.dequantized_weight(m, dtype), w)
            assert same(mxshard.dequantize(m.weight._box.planes["row"], plane="row", dtype=CODE[dtype]), w)
            opt.close()


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
    for kw in (dict(in_features=4, out_features=4, planes="col"), dict(in_features=4, out_features=4, planes="Row"),
               dict(in_features=4, out_features=4, layout="te"), dict(in_features=4, out_features=4, rounding="up"),
               dict(in_features=4, out_features=4, compute_dtype=torch.float64),
               dict(in_features=4, out_features=4, compute_dtype="bf16")):
        with pytest.raises(ValueError):
            MXFP8Linear(**kw)
    with pytest.raises(TypeError):
        MXFP8Linear(4.0, 4)
    with pytest.raises(ValueError, match="pass in_features >= 1"):
        MXFP8Linear(0, 4)
    with pytest.raises(ValueError, match="pass out_features >= 1"):
        MXFP8Linear(4, 0)
    with pytest.raises(TypeError, match="pass bias=True or False"):
        MXFP8Linear(4, 4, bias="yes")


def test_missing_library_is_a_clear_error(monkeypatch):
    def absent():
        raise _lib.LibraryNotFoundError("mxshard: cannot load the host library libmxshard_host (test)")
    m = make(8, 8, "row", "padded", torch.float32, 0)
    monkeypatch.setattr(_lib, "host_lib", absent)
    with pytest.raises(mxshard.LibraryNotFoundError, match="on cpu needs the host library"):
        MXFP8Linear(8, 8)
    with pytest.raises(mxshard.LibraryNotFoundError):
        convert(nn.Sequential(nn.Linear(4, 4)))


# ---- backward ------------------------------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("planes", PLANES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_backward_planes_weight_grad_hook(layout, planes, dtype):
    bw_plane = "col" if planes == "both" else "row"
    for k, ((inf, outf), seed) in enumerate(zip(SHAPES[:6], itertools.cycle(SEEDS))):
        m = make(inf, outf, planes, layout, dtype, seed)
        g = torch.Generator().manual_seed(7 + k)
        set_master(m, torch.randn(outf, inf, generator=g) * torch.exp2(torch.randint(-6, 7, (outf, inf), generator=g)))
        calls = []
        m.weight.register_post_accumulate_grad_hook(lambda p: calls.append(p.grad.clone()))
        lead = [(5,), (2, 3)][k % 2]
        expect_w = torch.zeros(outf, inf)
        expect_bias = torch.zeros(outf)
        for step in range(2):
            x = torch.randn(*lead, inf, generator=g).requires_grad_(True)
            gy = torch.randn(*lead, outf, generator=g).to(dtype)
            y = m(x)
            y.backward(gy)
            w = deq(m, bw_plane, dtype)
            assert same(x.grad, torch.matmul(gy, w).to(torch.float32)), (inf, outf, step)
            gy2, x2 = gy.reshape(-1, outf), x.detach().to(dtype).reshape(-1, inf)
            expect_w += torch.mm(gy2.t().float(), x2.float())   # fp32 sums of the exact products
            expect_bias += gy2.sum(0).to(torch.float32)
            assert m.weight.grad.dtype == torch.float32 and same(m.weight.grad, expect_w)
            assert same(m.bias.grad, expect_bias)
            assert len(calls) == step + 1 and same(calls[-1], expect_w)  # the hook sees the accumulated grad
        p = m.primary
        for n in ("row_data", "row_scale", "col_data", "col_scale"):
            t = getattr(p, n, None)
            assert t is None or (t.grad is None and not t.requires_grad and t.dtype == torch.uint8)
        assert [n for n, _ in m.named_parameters()] == ["weight", "bias"] and not list(m.named_buffers())


@pytest.mark.parametrize("planes", PLANES)
def test_backward_under_sharded_optimizer_reads_its_planes_and_fills_its_bucket(planes):
    """The optimizer's linear: x.grad from its replicated dgrad plane, the weight gradient (fp32
    sums of the exact products) in its bucket, the Parameter's .grad a HeldGrad."""
    from mxshard.torch.zero.held_grad import HeldGrad
    m = make(70, 40, planes, "padded", torch.bfloat16, 3)
    set_master(m, torch.randn(40, 70) * torch.exp2(torch.randint(-6, 7, (40, 70)).float()))
    model, opt = under_optimizer(m)
    x = torch.randn(6, 70, requires_grad=True)
    gy = torch.randn(6, 40).to(torch.bfloat16)
    model(x).backward(gy)
    plane = "col" if planes == "both" else "row"
    w = mxshard.dequantize(m.weight._box.planes[plane], plane=plane, dtype="bf16")
    assert same(x.grad, torch.matmul(gy, w).float())
    assert same(bucket_grad(opt, "0.weight"), torch.mm(gy.t().float(), x.detach().to(torch.bfloat16).float()))
    assert same(bucket_grad(opt, "0.bias"), gy.sum(0).float())
    assert isinstance(m.weight.grad, HeldGrad)
    opt.close()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_both_uses_the_column_plane(dtype):
    m = make(70, 40, "both", "padded", dtype, 3)
    # kaiming-uniform blocks all share one amax exponent (both planes then decode alike): use
    # per-element magnitudes spread over several binades so the row and column blocks differ
    w = torch.randn(40, 70) * torch.exp2(torch.randint(-6, 7, (40, 70)).float())
    set_master(m, w)
    x = torch.randn(6, 70, requires_grad=True)
    gy = torch.randn(6, 40).to(dtype)
    m(x).backward(gy)
    by_col = torch.matmul(gy, deq(m, "col", dtype)).float()
    by_row = torch.matmul(gy, deq(m, "row", dtype)).float()
    assert same(x.grad, by_col)
    assert not torch.equal(by_col, by_row)  # random data: the planes' blocks differ
    # a row-only module with the same master reads the row plane
    r = set_master(make(70, 40, "row", "padded", dtype, 3), w)
    assert same(r.primary.row_data, m.primary.row_data)
    assert not torch.equal(deq(m, "col", dtype), deq(m, "row", dtype))
    x2 = x.detach().clone().requires_grad_(True)
    r(x2).backward(gy)
    assert same(x2.grad, by_row)


def test_wgrad_without_any_input_requiring_grad():
    m = make(16, 8, "row", "compact", torch.float32, 0, bias=False)
    x = torch.randn(3, 16)
    calls = []
    m.weight.register_post_accumulate_grad_hook(lambda p: calls.append(1))
    m(x).sum().backward()
    assert same(m.weight.grad, torch.ones(3, 8).t() @ x) and calls == [1]
    m.weight.grad.zero_()
    own = m.weight.grad
    m(x).sum().backward()  # an existing .grad is accumulated into, not replaced
    assert m.weight.grad is own and same(own, torch.ones(3, 8).t() @ x)


@pytest.mark.parametrize("planes", PLANES)
def test_autograd_grad_wrt_input_leaves_weight_grad(planes):
    """torch.autograd.grad(loss, x) and backward(inputs=[x]) return x's gradient and leave the
    weight's and the bias' .grad and the gradient hook alone, as with nn.Linear; a retained graph's
    loss.backward() after them accumulates exactly what a plain backward does."""
    m = make(24, 12, planes, "padded", torch.float32, 1)
    calls = []
    m.weight.register_post_accumulate_grad_hook(lambda p: calls.append(1))
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 24, generator=g, requires_grad=True)
    gy = torch.randn(4, 12, generator=g)
    ref = make(24, 12, planes, "padded", torch.float32, 1)
    xr = x.detach().clone().requires_grad_(True)
    ref(xr).backward(gy)
    y = m(x)
    gx, = torch.autograd.grad(y, x, gy, retain_graph=True)
    assert same(gx, xr.grad)
    assert m.weight.grad is None and calls == [] and m.bias.grad is None
    y.backward(gy, inputs=[x], retain_graph=True)
    assert m.weight.grad is None and calls == [] and m.bias.grad is None and same(x.grad, xr.grad)
    x.grad = None
    y.backward(gy)   # a plain backward of the same graph: the weight gradient, bit-identical
    assert same(m.weight.grad, ref.weight.grad) and calls == [1] and same(m.bias.grad, ref.bias.grad)
    assert same(x.grad, xr.grad)
    y = m(x.detach())
    gb, = torch.autograd.grad(y, m.bias, gy)
    assert same(gb, gy.sum(0)) and same(m.weight.grad, ref.weight.grad) and calls == [1]
    assert [n for n, _ in m.named_parameters()] == ["weight", "bias"] and set(m.state_dict()) == {"weight", "bias"}


@pytest.mark.parametrize("planes", PLANES)
def test_double_backward_raises(planes):
    """create_graph=True raises, saying to keep the layer dense, and leaves .grad alone (the message
    on both paths: test_torch_one_weight.py test_double_backward_says_to_keep_the_layer_dense)."""
    m = make(24, 12, planes, "padded", torch.float32, 1)
    x = torch.randn(4, 24, requires_grad=True)
    with pytest.raises(RuntimeError, match="^mxshard: keep layers that need double backward"):
        torch.autograd.grad(m(x).pow(2).sum(), x, create_graph=True)
    assert m.weight.grad is None
    with pytest.raises(RuntimeError, match="^mxshard: keep layers that need double backward"):
        m(x).pow(2).sum().backward(create_graph=True)
    assert m.weight.grad is None
    gx, = torch.autograd.grad(m(x).pow(2).sum(), x)
    assert gx.shape == x.shape and m.weight.grad is None


def test_only_the_input_is_kept_for_backward(monkeypatch):
    import weakref
    made = []
    dequant = _gemm.dequant

    def spy(primary, plane, dtype):
        t = dequant(primary, plane, dtype)
        made.append((plane, weakref.ref(t)))
        return t

    m = make(48, 96, "both", "padded", torch.bfloat16, 0)
    m.primary   # (quantized now, outside the spy)
    monkeypatch.setattr(_gemm, "dequant", spy)   # the GEMMs' dequantize (the CPU path)
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
def test_written_master_equals_quantize(layout, planes):
    for rounding, (inf, outf) in zip(("ceil", "floor", "ceil"), [(33, 65), (1, 1), (97, 40)]):
        m = make(inf, outf, planes, layout, torch.float32, 0, rounding=rounding)
        w = torch.randn(outf, inf, generator=torch.Generator().manual_seed(inf)) * 3
        set_master(m, w)
        ref = mxshard.MXFP8Weight.empty(outf, inf, planes=planes, layout=layout, device="cpu")
        mxshard.quantize(ref, w.to(torch.bfloat16), rounding=rounding)   # round_through="bf16"
        for n in ("row_data", "row_scale", "col_data", "col_scale"):
            a, b = getattr(m.primary, n, None), getattr(ref, n, None)
            assert (a is None) == (b is None) and (a is None or torch.equal(a, b)), n
        assert same(m.weight.detach()._data, w)   # the master is what was written
    row_before = m.primary.row_data.clone()
    for bad in (torch.randn(inf + 1, outf), torch.randn(outf * inf + 1)):
        with pytest.raises(RuntimeError):
            set_master(m, bad)
    assert torch.equal(m.primary.row_data, row_before)


def test_optimizer_rebinds_the_same_planes_each_step():
    """(The removed rebind_primary_: the optimizer's storage.) Under ShardedOptimizer the
    replicated planes are the same objects after a step, with the new bytes: the whole-tensor
    quantize of the new master; the forward uses them."""
    m = make(70, 40, "both", "padded", torch.bfloat16, 5)
    model = nn.Sequential(m)
    opt = mxt.ShardedOptimizer(model, lambda g: torch.optim.SGD(g, lr=0.5))
    planes = dict(m.weight._box.planes)
    old = planes["row"].row_data.clone()
    x = torch.randn(3, 70)
    model(x).square().sum().backward()
    opt.step()
    assert all(m.weight._box.planes[k] is v for k, v in planes.items())
    assert not torch.equal(planes["row"].row_data, old)
    master = opt.state_dict()["masters"]["0.weight"]
    ref = mxshard.MXFP8Weight.empty(40, 70, planes="both", layout="padded", device="cpu")
    mxshard.quantize(ref, master.to(torch.bfloat16), rounding="ceil")
    assert torch.equal(planes["row"].row_data, ref.row_data) and torch.equal(planes["col"].col_data, ref.col_data)
    assert same(model(x), F.linear(x.to(torch.bfloat16), mxshard.dequantize(ref, plane="row", dtype="bf16"),
                                   m.bias.to(torch.bfloat16)).float())
    opt.close()


@pytest.mark.parametrize("planes", PLANES)
def test_state_dict_round_trip(planes):
    a = make(33, 65, planes, "swizzled", torch.float32, 1)
    b = make(33, 65, planes, "swizzled", torch.float32, 2)
    sd = a.state_dict()
    assert set(sd) == {"weight", "bias"} and type(sd["weight"]) is torch.Tensor
    assert not torch.equal(a.primary.row_data, b.primary.row_data)
    ptr = b.weight.detach()._data.data_ptr()
    b.load_state_dict(sd)
    for n in ("weight", "bias"):
        assert same(getattr(a, n).detach(), getattr(b, n).detach()), n
    assert b.weight.detach()._data.data_ptr() == ptr   # loaded in place: storage never moves
    for n in ("row_data", "row_scale", "col_data", "col_scale"):
        assert same(getattr(a.primary, n), getattr(b.primary, n)) if getattr(a.primary, n, None) is not None else True
    x = torch.randn(2, 4, 33, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    ya, yb = a(x), b(x2)
    assert same(ya, yb)
    g = torch.randn_like(ya)
    ya.backward(g)
    yb.backward(g)
    assert same(x.grad, x2.grad) and same(a.weight.grad, b.weight.grad)
    # under ShardedOptimizer: the state dict's weight is the replicated row plane, dequantized
    model, opt = under_optimizer(a)
    sd = model.state_dict()
    assert set(sd) == {"0.weight", "0.bias"} and same(sd["0.weight"], deq(a, "row", torch.float32))
    opt.close()


def test_no_high_precision_weight_under_the_optimizer():
    """(The removed release_master_init.) Under ShardedOptimizer the model holds no high-precision
    weight: the linear's floating tensors are its bias and the weight's zero-size stand-in; the
    planes are uint8."""
    m = make(64, 96, "both", "padded", torch.bfloat16, 0)
    model, opt = under_optimizer(m)
    model(torch.randn(5, 64)).sum().backward()

    def floats(mod):
        seen = dict(mod.named_parameters())
        seen.update((n, t) for n, t in mod.named_buffers())
        seen.update((n, t) for n, t in vars(mod).items() if isinstance(t, torch.Tensor))
        return sorted(n for n, t in seen.items() if t.is_floating_point())

    assert floats(m) == ["bias", "weight"] and m.weight._stub.numel() == 0 and not list(m.named_buffers())
    for pl in m.weight._box.planes.values():
        assert all(getattr(pl, n).dtype == torch.uint8 for n in ("row_data", "row_scale", "col_data", "col_scale")
                   if getattr(pl, n, None) is not None)
    assert "planes=both" in repr(m) and "layout=padded" in repr(m) and "in_features=64" in repr(m)
    opt.close()


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


def test_module_to_keeps_planes_and_casts_the_master():
    """.to(float16): floating-point tensors convert, the master too (a Parameter, as nn.Linear's
    weight: by design, the removed linear kept an fp32 master); the planes stay uint8 and are the
    whole-tensor quantize of the cast master."""
    m = make(40, 24, "row", "padded", torch.bfloat16, 0)
    m.to(torch.float16)
    assert m.primary.row_data.dtype == torch.uint8 and isinstance(m.weight, mxt.QuantMaster)
    assert m.bias.dtype == torch.float16 and m.weight.dtype == torch.float16
    assert torch.equal(m.primary.row_data, whole_quantize(m).row_data)
    x = torch.randn(2, 40)
    y = m(x)
    assert same(y, F.linear(x.to(torch.bfloat16), deq(m, "row", torch.bfloat16), m.bias.to(torch.bfloat16)).float())


# ---- CUDA ------------------------------------------------------------------------

@pytest.mark.parametrize("planes", PLANES)
def test_cuda_matches_cpu_planes_and_linear(planes):
    cuda_or_skip()
    for layout, dtype in (("padded", torch.bfloat16), ("swizzled", torch.float32), ("compact", torch.bfloat16)):
        c = make(97, 65, planes, layout, dtype, 4)
        g = copy.deepcopy(c).cuda()   # quantized on the GPU from the same master
        for n in ("row_data", "row_scale", "col_data", "col_scale"):
            a, b = getattr(c.primary, n, None), getattr(g.primary, n, None)
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
        assert g.weight.grad.is_cuda and g.weight.grad.dtype == torch.float32
        gy2, x2 = gy.reshape(-1, 65).double(), x.detach().to(dtype).reshape(-1, 97).double()
        assert close(g.weight.grad, gy2.t() @ x2, gy2.abs().t() @ x2.abs(), 15, torch.float32)
        with pytest.raises(ValueError, match="input on cpu"):
            g(torch.randn(2, 97))

# SPDX-License-Identifier: MIT
"""NVFP4Linear(in, out, ...) (convert()'s NVFP4ParamLinear built directly; the removed
ShardedOptimizer linear's tests moved onto it): forward from the row plane, backward from the
row or the transposed column-wise plane, wgrad into weight.grad (fp32 sums of the exact
products), the master and its writes, convert(format='nvfp4'); under ShardedOptimizer (a world
of one) the same rules read the replicated planes (m.weight._box.planes) and the gradient lands
in the optimizer's bucket. Skips without torch or the host library; the CUDA case skips without
a GPU and libmxshard_cuda's NVFP4 entry points."""
import copy
import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

import mxshard  # noqa: E402

from conftest import host_lib_or_skip  # noqa: E402

host_lib_or_skip(module_level=True)

import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from conftest import cuda_or_skip  # noqa: E402
from mxshard.torch import MXFP8Linear, NVFP4Linear, convert, is_mxfp8, is_nvfp4  # noqa: E402
import mxshard.torch as mxt  # noqa: E402

LAYOUTS = ("compact", "padded", "swizzled")
PLANES = ("row", "both")
BLOCKS = ("1x16", "16x16")
DTYPES = (torch.float32, torch.bfloat16)
SHAPES = [(1, 1), (33, 17), (16, 48), (7, 65), (40, 31)]   # (in, out): odd and even row lengths
BUFS = ("row_data", "row_scale", "col_data", "col_scale", "amax")
CODE = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}


def bits(t):
    return t.contiguous().view({4: torch.int32, 2: torch.int16, 1: torch.uint8}[t.element_size()])


def same(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(bits(a), bits(b))


def ref_weight(m, plane, dtype):
    """The reference dequantization: a fresh NVFP4Weight quantized from the module's master the
    same way (rounded through bf16: round_through="bf16", the spec), dequantized by
    mxshard.dequantize_nvfp4 (independent of the module's primary)."""
    w = mxshard.NVFP4Weight.empty(m.out_features, m.in_features, planes=m.planes, block=m.block, layout=m.layout,
                                  device="cpu")
    mxshard.quantize_nvfp4(w, master(m).to(torch.bfloat16).contiguous())
    return mxshard.dequantize_nvfp4(w, plane=plane, dtype=CODE[dtype])


def master(m):
    """The converted linear's master (its QuantMaster's data; the removed master_init)."""
    return m.weight.detach()._data


def set_master(m, w):
    """The removed set_master_: write the master (the bytes follow at the next use)."""
    with torch.no_grad():
        m.weight.copy_(w)
    return m


def spread(outf, inf, seed):
    """A weight whose 1x16 and 16x1 blocks differ (magnitudes over several binades)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(outf, inf, generator=g) * torch.exp2(torch.randint(-5, 6, (outf, inf), generator=g).float())


def plane_buf(planes, n):
    """Buffer `n` of a GatheredWeight's planes under ShardedOptimizer ({"row": the row plane and
    amax, "col" ("both"): the column plane and amax}); amax: the row plane's."""
    pl = planes.get("row" if n == "amax" else n[:3])
    return None if pl is None else getattr(pl, n, None)


def under_optimizer(m, lr=0.0):
    """m inside a model under ShardedOptimizer (a world of one): (model, opt)."""
    model = nn.Sequential(m)
    return model, mxt.ShardedOptimizer(model, lambda g: torch.optim.SGD(g, lr=lr))


def bucket_grad(opt, name):
    """The gradient ShardedOptimizer's bucket holds for item `name` (world of one: all rows)."""
    for g, grad in zip(opt.buckets, opt._grad):
        for pos, it in enumerate(g.items):
            if it.name == name:
                return g.view(grad, pos, 0).reshape(it.shape)
    raise KeyError(name)


@pytest.mark.parametrize("planes,block,layout", list(itertools.product(PLANES, BLOCKS, LAYOUTS)))
def test_forward_backward_match_dequantize_matmul(planes, block, layout):
    for k, (inf, outf) in enumerate(SHAPES):
        dtype = DTYPES[k % 2]
        torch.manual_seed(k)
        m = NVFP4Linear(inf, outf, bias=k % 2 == 0, planes=planes, block=block, layout=layout, compute_dtype=dtype)
        set_master(m, spread(outf, inf, k))
        # the primary's planes in TE's shapes; amax is the fp32 global amax (of the master through bf16)
        p = m.primary
        assert tuple(p.row_data.shape) == mxshard.nvfp4_data_shape(outf, inf, "row")
        assert (p.col_data is None) == (planes == "row") and p.amax.dtype == torch.float32 and p.amax.numel() == 1
        assert float(p.amax) == float(master(m).to(torch.bfloat16).abs().max())
        assert all(getattr(p, n) is None or getattr(p, n).dtype == torch.uint8
                   for n in ("row_data", "row_scale", "col_data", "col_scale"))
        g = torch.Generator().manual_seed(100 + k)
        lead = [(5,), (2, 3)][k % 2]
        w_row = ref_weight(m, "row", dtype)
        w_bw = ref_weight(m, "col" if planes == "both" else "row", dtype)
        expect_w = torch.zeros(outf, inf)
        calls = []
        hook = m.weight.register_post_accumulate_grad_hook(lambda q: calls.append(q.grad.clone()))
        for step in range(2):
            x = torch.randn(*lead, inf, generator=g).requires_grad_(True)
            gy = torch.randn(*lead, outf, generator=g).to(dtype)
            y = m(x)
            b = m.bias.to(dtype) if m.bias is not None else None
            assert y.dtype == x.dtype and same(y, F.linear(x.detach().to(dtype), w_row, b).to(x.dtype)), (inf, outf)
            y.backward(gy)
            assert same(x.grad, torch.matmul(gy, w_bw).float()), (inf, outf, step)
            gy2, x2 = gy.reshape(-1, outf), x.detach().to(dtype).reshape(-1, inf)
            expect_w += torch.mm(gy2.t().float(), x2.float())   # fp32 sums of the exact products
            assert m.weight.grad.dtype == torch.float32 and same(m.weight.grad, expect_w)
            assert len(calls) == step + 1 and same(calls[-1], expect_w)   # the hook sees the accumulated grad
        assert [n for n, _ in m.named_parameters()] == (["weight", "bias"] if m.bias is not None else ["weight"])
        assert not list(m.named_buffers())
        # quantization error within the NVFP4 bound (contract 9.3), with the row plane
        wi = master(m)
        d = (ref_weight(m, "row", torch.float32) - wi).abs()
        assert d.max() <= wi.abs().max() * (1 + 2 ** -4) / 6 + 6 * 2 ** -10 * float(p.amax) / 2688
        if k < 2:   # the same forward / backward under ShardedOptimizer: its replicated planes, the same bytes
            x = torch.randn(*lead, inf, generator=g).requires_grad_(True)
            gy = torch.randn(*lead, outf, generator=g).to(dtype)
            y = m(x)
            y.backward(gy)
            gx = x.grad
            hook.remove()
            m.weight.grad = None
            model, opt = under_optimizer(m)
            planes_now = m.weight._box.planes
            assert set(planes_now) == ({"row", "col"} if planes == "both" else {"row"})
            assert m.primary is planes_now["row"]
            for n in BUFS:   # the same bytes as the linear's own primary
                a, b = plane_buf(planes_now, n), getattr(p, n, None)
                assert (a is None) == (b is None) and (a is None or same(a.reshape(-1), b.reshape(-1))), n
            if planes == "both":
                assert same(planes_now["col"].amax, p.amax)
            assert same(mxt.dequantized_weight(m, dtype), w_row)
            x2 = x.detach().clone().requires_grad_(True)
            y2 = model(x2)
            assert same(y2, y)
            y2.backward(gy)
            assert same(x2.grad, gx)
            gy2, xd = gy.reshape(-1, outf), x.detach().to(dtype).reshape(-1, inf)
            assert same(bucket_grad(opt, "0.weight"), torch.mm(gy2.t().float(), xd.float()))
            opt.close()


def test_both_reads_the_column_plane_and_16x16_planes_agree():
    w = spread(40, 70, 3)
    x = torch.randn(6, 70, requires_grad=True)
    gy = torch.randn(6, 40)
    m = set_master(NVFP4Linear(70, 40, planes="both", block="1x16", compute_dtype=torch.float32), w)
    m(x).backward(gy)
    by_col_w = ref_weight(m, "col", torch.float32)
    by_col = torch.matmul(gy, by_col_w)
    by_row = torch.matmul(gy, ref_weight(m, "row", torch.float32))
    assert same(x.grad, by_col) and not torch.equal(by_col, by_row)   # 16x1 blocks differ from 1x16 ones
    r = set_master(NVFP4Linear(70, 40, planes="row", block="1x16", compute_dtype=torch.float32), w)
    x2 = x.detach().clone().requires_grad_(True)
    r(x2).backward(gy)
    assert same(x2.grad, by_row) and same(r.primary.row_data, m.primary.row_data)
    assert same(r.primary.amax, m.primary.amax)
    t = set_master(NVFP4Linear(70, 40, planes="both", block="16x16", compute_dtype=torch.float32), w)
    assert same(ref_weight(t, "col", torch.float32), ref_weight(t, "row", torch.float32))
    # under ShardedOptimizer: dgrad from its replicated column plane, the same bytes
    model, opt = under_optimizer(m)
    x3 = x.detach().clone().requires_grad_(True)
    model(x3).backward(gy)
    assert same(x3.grad, by_col)
    assert same(mxshard.dequantize_nvfp4(m.weight._box.planes["col"], plane="col", dtype="f32"), by_col_w)
    opt.close()


def test_validation_and_clear_errors(monkeypatch):
    for kw, what in ((dict(in_features=0, out_features=4), "in_features"),
                     (dict(in_features=4, out_features=4, planes="col"), "'col'"),
                     (dict(in_features=4, out_features=4, block="32"), "block='32'"),
                     (dict(in_features=4, out_features=4, block="1X16"), "block='1X16'"),
                     (dict(in_features=4, out_features=4, layout="te"), "layout='te'"),
                     (dict(in_features=4, out_features=4, compute_dtype=torch.float64), "compute_dtype")):
        with pytest.raises(ValueError, match=what):
            NVFP4Linear(**kw)
    with pytest.raises(TypeError):
        NVFP4Linear(4, 4, rounding="ceil")   # NVFP4 has no E8M0 rounding
    with pytest.raises(TypeError, match="NVFP4Linear: pass bias=True or False"):
        NVFP4Linear(4, 4, bias=1)
    with pytest.raises(TypeError, match="NVFP4Linear: pass in_features as an int"):
        NVFP4Linear(4.0, 4)
    m = NVFP4Linear(40, 24)
    with pytest.raises(ValueError, match="in_features=40"):
        m(torch.randn(4, 41))
    with pytest.raises(ValueError, match="floating"):
        m(torch.ones(4, 40, dtype=torch.int64))
    with pytest.raises(TypeError, match="NVFP4ParamLinear: input must be a torch.Tensor"):
        m(np.ones((4, 40), np.float32))
    before = m.primary.row_data.clone()
    for bad in (torch.randn(41, 24), torch.randn(24 * 40 + 1)):
        with pytest.raises(RuntimeError):
            set_master(m, bad)
    assert torch.equal(m.primary.row_data, before) and torch.equal(master(m), master(m).clone())
    # (the removed main_grad's dtype check: a float16 gradient cannot be attached to the fp32 master)
    with pytest.raises(RuntimeError, match="grad_dtype"):
        m.weight.grad = torch.zeros(24, 40, dtype=torch.float16)
    from mxshard import _lib

    def absent():
        raise _lib.LibraryNotFoundError("mxshard: cannot load the host library libmxshard_host (test)")
    monkeypatch.setattr(_lib, "host_lib", absent)
    with pytest.raises(mxshard.LibraryNotFoundError, match="on cpu needs the host library"):
        NVFP4Linear(8, 8)


def test_written_master_state_dict_and_to():
    m = NVFP4Linear(33, 20, planes="both", block="1x16", layout="swizzled")
    w = spread(20, 33, 1)
    set_master(m, w)
    assert same(master(m), w)   # the master is what was written; the primary follows it
    want = mxshard.NVFP4Weight.empty(20, 33, planes="both", block="1x16", layout="swizzled", device="cpu")
    mxshard.quantize_nvfp4(want, w.to(torch.bfloat16))
    for n in BUFS:
        assert same(getattr(m.primary, n), getattr(want, n)), n
    x = torch.randn(3, 33)
    # state_dict round trip (loaded in place: the master's storage never moves)
    n2 = NVFP4Linear(33, 20, planes="both", block="1x16", layout="swizzled")
    assert set(m.state_dict()) == {"weight", "bias"} and type(m.state_dict()["weight"]) is torch.Tensor
    assert not same(n2.primary.amax, m.primary.amax)
    ptr = master(n2).data_ptr()
    n2.load_state_dict(m.state_dict())
    assert master(n2).data_ptr() == ptr and same(n2(x), m(x))
    for n in BUFS:
        assert same(getattr(n2.primary, n), getattr(m.primary, n)), n
    # .to(float16): the bias and the master convert (a Parameter, as nn.Linear's weight: by design,
    # the removed linear kept an fp32 master), the planes stay uint8, amax float32 and is the cast master's
    n2.to(torch.float16)
    assert n2.primary.amax.dtype == torch.float32 and n2.bias.dtype == torch.float16
    assert n2.weight.dtype == torch.float16 and isinstance(n2.weight, mxt.QuantMaster)
    assert float(n2.primary.amax) == float(master(n2).to(torch.bfloat16).abs().max())
    assert n2.primary.row_data.dtype == torch.uint8
    assert "block=1x16" in repr(n2) and "planes=both" in repr(n2)


def test_optimizer_rebinds_the_same_planes_each_step_and_holds_nothing_high_precision():
    """(The removed rebind_primary_ / release_master_init: the optimizer's storage.) Under
    ShardedOptimizer the replicated planes are the same object after a step, with the new bytes
    (amax included): the whole-tensor quantize of the new master; the forward uses them; the
    linear's floating tensors are its bias and the weight's zero-size stand-in, the planes uint8
    and amax one float32."""
    m = set_master(NVFP4Linear(33, 20, planes="both", block="1x16", layout="swizzled"), spread(20, 33, 1))
    model = nn.Sequential(m)
    opt = mxt.ShardedOptimizer(model, lambda g: torch.optim.SGD(g, lr=0.5))
    planes = dict(m.weight._box.planes)
    old = {n: plane_buf(planes, n).clone() for n in BUFS}
    x = torch.randn(3, 33)
    model(x).square().sum().backward()
    opt.step()
    assert all(m.weight._box.planes[k] is v for k, v in planes.items())
    assert not torch.equal(planes["row"].row_data, old["row_data"]) and float(planes["row"].amax) != float(old["amax"])
    assert not torch.equal(planes["col"].col_data, old["col_data"]) and same(planes["col"].amax, planes["row"].amax)
    new = opt.state_dict()["masters"]["0.weight"]
    ref = mxshard.NVFP4Weight.empty(20, 33, planes="both", block="1x16", layout="swizzled", device="cpu")
    mxshard.quantize_nvfp4(ref, new.to(torch.bfloat16))
    for n in BUFS:
        assert same(plane_buf(planes, n).reshape(-1), getattr(ref, n).reshape(-1)), n
    assert same(model(x), F.linear(x.to(torch.bfloat16), mxshard.dequantize_nvfp4(ref, plane="row", dtype="bf16"),
                                   m.bias.to(torch.bfloat16)).float())
    sd = model.state_dict()
    assert set(sd) == {"0.weight", "0.bias"} and same(sd["0.weight"], mxshard.dequantize_nvfp4(ref, plane="row",
                                                                                                dtype="f32"))

    def floats(mod):
        seen = dict(mod.named_parameters())
        seen.update(mod.named_buffers())
        seen.update((n, t) for n, t in vars(mod).items() if isinstance(t, torch.Tensor))
        return sorted(n for n, t in seen.items() if t.is_floating_point())

    model(torch.randn(5, 33)).sum().backward()
    assert floats(m) == ["bias", "weight"] and m.weight._stub.numel() == 0 and not list(m.named_buffers())
    for pl in m.weight._box.planes.values():
        assert all(getattr(pl, n) is None or getattr(pl, n).dtype == torch.uint8
                   for n in ("row_data", "row_scale", "col_data", "col_scale"))
        assert sum(getattr(pl, n) is not None for n in ("row_data", "row_scale", "col_data", "col_scale")) == 2
        assert pl.amax.dtype == torch.float32 and pl.amax.numel() == 1
    opt.close()


class Net(nn.Module):
    def __init__(self, d=24):
        super().__init__()
        self.inp = nn.Linear(7, d)
        self.mid = nn.Linear(d, 2 * d)
        self.head = nn.Linear(2 * d, 3)

    def forward(self, x):
        return self.head(F.gelu(self.mid(self.inp(x))))


def test_convert_format_nvfp4():
    torch.manual_seed(0)
    net = Net()
    model = convert(copy.deepcopy(net), {"mid": "both", "*": "row"}, format="nvfp4", block="16x16",
                    layout="compact", compute_dtype=torch.float32)
    for name in ("inp", "mid", "head"):
        mod, lin = model.get_submodule(name), net.get_submodule(name)
        assert is_nvfp4(mod) and not is_mxfp8(mod) and mod.format == "nvfp4"
        assert (mod.planes, mod.block, mod.layout) == ("both" if name == "mid" else "row", "16x16", "compact")
        assert same(mod.weight.detach()._data, lin.weight.detach())   # the master: the original weight
        ref = copy.deepcopy(lin)
        with torch.no_grad():
            ref.weight.copy_(ref_weight(mod, "row", torch.float32))
        x = torch.randn(2, lin.in_features)
        assert same(mod(x), ref(x)), name
    model(torch.randn(4, 7)).sum().backward()
    assert all(m.weight.grad.abs().sum() > 0 for m in model.modules() if is_nvfp4(m))
    # the default stays MXFP8; block defaults to 1x16; the other format's option is an error
    assert is_mxfp8(convert(copy.deepcopy(net), "row").inp)
    assert convert(copy.deepcopy(net), "row", format="nvfp4").inp.block == "1x16"
    for kw in (dict(format="fp4"), dict(format="nvfp4", rounding="ceil"), dict(block="1x16"),
               dict(format="nvfp4", block="32x32"), dict(format="nvfp4", layout="te")):
        model = copy.deepcopy(net)
        with pytest.raises(ValueError, match="convert"):
            convert(model, "row", **kw)
        assert all(type(m) is nn.Linear for m in (model.inp, model.mid, model.head))   # nothing swapped
    # one model, both formats: two calls
    mixed = convert(convert(copy.deepcopy(net), {"mid": "row"}, format="nvfp4"), "row")
    assert is_nvfp4(mixed.mid) and is_mxfp8(mixed.inp) and isinstance(mixed.head, mxt.MXFP8ParamLinear)


def test_cuda_matches_cpu():
    cuda_or_skip()
    try:
        mxshard._lib.nvfp4_cuda("test", need=("quantize", "dequantize"))
    except mxshard.UnsupportedError as e:
        pytest.skip(str(e))
    for planes, block in (("both", "1x16"), ("row", "16x16")):
        c = set_master(NVFP4Linear(97, 65, planes=planes, block=block, compute_dtype=torch.float32),
                       spread(65, 97, 4))
        g = copy.deepcopy(c).cuda()   # quantized on the GPU from the same master
        assert same(master(g).cpu(), master(c))
        for n in BUFS:
            a, b = getattr(c.primary, n, None), getattr(g.primary, n, None)
            assert (a is None) == (b is None) and (a is None or torch.equal(bits(a), bits(b.cpu()))), n
        # the dequantized weight is the library's: bit-identical on both devices; the GEMM is
        # torch's, so the module's output is compared with the same GEMM on the same device
        wg = mxshard.dequantize_nvfp4(g.primary, plane="row", dtype=CODE[torch.float32])
        assert same(wg.cpu(), mxshard.dequantize_nvfp4(c.primary, plane="row", dtype=CODE[torch.float32]))
        x = torch.randn(3, 97, device="cuda", requires_grad=True)
        y = g(x)   # in = 97, an odd NVFP4 row length: the reference path; any path is within this bound
        ref = F.linear(x.detach().double(), wg.double(), g.bias.double())
        bound = 97 * 2.0 ** -24 * (x.detach().double().abs() @ wg.double().abs().t() + g.bias.double().abs())
        assert torch.all((y.double() - ref).abs() <= bound)
        y.sum().backward()
        assert g.weight.grad.is_cuda and g.weight.grad.dtype == torch.float32

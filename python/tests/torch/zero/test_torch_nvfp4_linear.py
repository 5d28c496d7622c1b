# SPDX-License-Identifier: MIT
"""mxshard.torch.zero.nvfp4_linear: NVFP4Linear (forward from the row plane,
backward from the row or the transposed column-wise plane, wgrad into an fp32
main_grad), its master / storage calls and convert(format='nvfp4'). Skips
without torch or the host library; the CUDA case skips without a GPU and
libmxshard_cuda's NVFP4 entry points."""
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
    same way, dequantized by mxshard.dequantize_nvfp4 (independent of the module's buffers)."""
    w = mxshard.NVFP4Weight.empty(m.out_features, m.in_features, planes=m.planes, block=m.block, layout=m.layout,
                                  device="cpu")
    # ShardedOptimizer's NVFP4Linear: its fp32 master; convert()'s NVFP4ParamLinear: its master
    # rounded through bf16 (round_through="bf16", the spec)
    src = m.master_init() if isinstance(m, NVFP4Linear) else m.weight.detach()._data.to(torch.bfloat16)
    mxshard.quantize_nvfp4(w, src.contiguous())
    return mxshard.dequantize_nvfp4(w, plane=plane, dtype=CODE[dtype])


def spread(outf, inf, seed):
    """A weight whose 1x16 and 16x1 blocks differ (magnitudes over several binades)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(outf, inf, generator=g) * torch.exp2(torch.randint(-5, 6, (outf, inf), generator=g).float())


@pytest.mark.parametrize("planes,block,layout", list(itertools.product(PLANES, BLOCKS, LAYOUTS)))
def test_forward_backward_match_dequantize_matmul(planes, block, layout):
    for k, (inf, outf) in enumerate(SHAPES):
        dtype = DTYPES[k % 2]
        torch.manual_seed(k)
        m = NVFP4Linear(inf, outf, bias=k % 2 == 0, planes=planes, block=block, layout=layout, compute_dtype=dtype)
        m.set_master_(spread(outf, inf, k))
        # the buffers are the primary's, in TE's shapes; amax is the fp32 global amax
        assert m.primary.row_data is m.row_data and m.primary.amax is m.amax
        assert tuple(m.row_data.shape) == mxshard.nvfp4_data_shape(outf, inf, "row")
        assert (m.col_data is None) == (planes == "row") and m.amax.dtype == torch.float32
        assert float(m.amax) == float(m.master_init().abs().max())
        g = torch.Generator().manual_seed(100 + k)
        lead = [(5,), (2, 3)][k % 2]
        w_row = ref_weight(m, "row", dtype)
        w_bw = ref_weight(m, "col" if planes == "both" else "row", dtype)
        expect_main = torch.zeros(outf, inf)
        calls = []
        m._mxs_grad_hook = lambda: calls.append(1)
        for step in range(2):
            x = torch.randn(*lead, inf, generator=g).requires_grad_(True)
            gy = torch.randn(*lead, outf, generator=g).to(dtype)
            y = m(x)
            b = m.bias.to(dtype) if m.bias is not None else None
            assert y.dtype == x.dtype and same(y, F.linear(x.detach().to(dtype), w_row, b).to(x.dtype)), (inf, outf)
            y.backward(gy)
            assert same(x.grad, torch.matmul(gy, w_bw).float()), (inf, outf, step)
            gy2, x2 = gy.reshape(-1, outf), x.detach().to(dtype).reshape(-1, inf)
            expect_main.addmm_(gy2.t().float(), x2.float())   # fp32 sums of the exact products
            assert m.main_grad.dtype == torch.float32 and same(m.main_grad, expect_main)
            assert len(calls) == step + 1
        assert [n for n, _ in m.named_parameters()] == (["bias"] if m.bias is not None else [])
        # quantization error within the NVFP4 bound (contract 9.3), with the row plane
        wi = m.master_init()
        d = (ref_weight(m, "row", torch.float32) - wi).abs()
        assert d.max() <= wi.abs().max() * (1 + 2 ** -4) / 6 + 6 * 2 ** -10 * float(m.amax) / 2688


def test_both_reads_the_column_plane_and_16x16_planes_agree():
    w = spread(40, 70, 3)
    x = torch.randn(6, 70, requires_grad=True)
    gy = torch.randn(6, 40)
    m = NVFP4Linear(70, 40, planes="both", block="1x16", compute_dtype=torch.float32).set_master_(w)
    m(x).backward(gy)
    by_col = torch.matmul(gy, ref_weight(m, "col", torch.float32))
    by_row = torch.matmul(gy, ref_weight(m, "row", torch.float32))
    assert same(x.grad, by_col) and not torch.equal(by_col, by_row)   # 16x1 blocks differ from 1x16 ones
    r = NVFP4Linear(70, 40, planes="row", block="1x16", compute_dtype=torch.float32).set_master_(w)
    x2 = x.detach().clone().requires_grad_(True)
    r(x2).backward(gy)
    assert same(x2.grad, by_row) and same(r.row_data, m.row_data) and same(r.amax, m.amax)
    t = NVFP4Linear(70, 40, planes="both", block="16x16", compute_dtype=torch.float32).set_master_(w)
    assert same(ref_weight(t, "col", torch.float32), ref_weight(t, "row", torch.float32))


def test_validation_and_clear_errors(monkeypatch):
    for kw in (dict(in_features=0, out_features=4), dict(in_features=4, out_features=4, planes="col"),
               dict(in_features=4, out_features=4, block="32"), dict(in_features=4, out_features=4, block="1X16"),
               dict(in_features=4, out_features=4, layout="te"),
               dict(in_features=4, out_features=4, compute_dtype=torch.float64),
               dict(in_features=4, out_features=4, device="meta")):
        with pytest.raises(ValueError, match="NVFP4Linear"):
            NVFP4Linear(**kw)
    with pytest.raises(TypeError):
        NVFP4Linear(4, 4, rounding="ceil")   # NVFP4 has no E8M0 rounding
    with pytest.raises(TypeError, match="bias must be a bool"):
        NVFP4Linear(4, 4, bias=1)
    m = NVFP4Linear(40, 24)
    with pytest.raises(ValueError, match="in_features=40"):
        m(torch.randn(4, 41))
    with pytest.raises(ValueError, match="floating"):
        m(torch.ones(4, 40, dtype=torch.int64))
    with pytest.raises(TypeError, match="NVFP4Linear"):
        m(np.ones((4, 40), np.float32))
    before = m.row_data.clone()
    for bad in (torch.randn(40, 24), torch.randn(24, 40, dtype=torch.float64), torch.randn(24 * 40)):
        with pytest.raises(ValueError, match="NVFP4Linear.set_master_"):
            m.set_master_(bad)
    assert torch.equal(m.row_data, before)
    m.main_grad = torch.zeros(24, 40, dtype=torch.float16)   # float32 or bfloat16 only
    with pytest.raises(ValueError, match="NVFP4Linear.main_grad"):
        m(torch.randn(2, 40)).sum().backward()
    from mxshard import _lib

    def absent():
        raise _lib.LibraryNotFoundError("mxshard: cannot load the host library libmxshard_host (test)")
    monkeypatch.setattr(_lib, "host_lib", absent)
    with pytest.raises(mxshard.LibraryNotFoundError, match="NVFP4Linear on cpu needs the host library"):
        NVFP4Linear(8, 8)


def test_master_rebind_state_dict_and_to():
    m = NVFP4Linear(33, 20, planes="both", block="1x16", layout="swizzled")
    w = spread(20, 33, 1)
    m.set_master_(w)
    assert same(m.master_init(), w)
    want = ref_weight(m, "row", torch.float32)
    m.release_master_init()
    assert same(m.master_init(), want)   # released: the row plane dequantized
    # rebind into one bucket: uint8 planes and a float32 amax view; rejected before any write
    sizes = {n: getattr(m, n).numel() for n in BUFS if n != "amax"}
    bucket = torch.full((sum(sizes.values()) + 5,), 0xAB, dtype=torch.uint8)
    views, off = {}, 2
    for n, k in sizes.items():
        views[n] = bucket[off:off + k].view(getattr(m, n).shape)
        off += k
    amax = torch.full((3,), -1.0)
    overlapping = bucket[3:3 + sizes["row_scale"]].view(m.row_scale.shape)   # inside row_data's bytes
    for bad in ({"amax": torch.zeros(1, dtype=torch.float16)}, {"amax": torch.zeros(2)},
                {"amax": amax[1:2], "row_scale": overlapping}):
        with pytest.raises(ValueError, match="NVFP4Linear.rebind_primary_"):
            m.rebind_primary_(**{**views, "amax": amax[1:2], **bad})
        assert torch.all(bucket == 0xAB) and float(amax[1]) == -1.0
    old = {n: getattr(m, n).clone() for n in BUFS}
    x = torch.randn(3, 33)
    y0 = m(x)
    m.rebind_primary_(**views, amax=amax[1:2])
    assert m.amax.data_ptr() == amax[1:2].data_ptr() and m.primary.amax is m.amax
    assert all(torch.equal(getattr(m, n), old[n]) for n in BUFS) and same(m(x), y0)
    m.set_master_(spread(20, 33, 2))   # quantize writes into the bucket now, amax included
    assert float(amax[1]) == float(m.amax) != float(old["amax"]) and amax[0] == -1.0 and amax[2] == -1.0
    # state_dict round trip (loaded in place)
    n2 = NVFP4Linear(33, 20, planes="both", block="1x16", layout="swizzled")
    assert set(m.state_dict()) == {"bias", *BUFS}
    ptr = n2.amax.data_ptr()
    n2.load_state_dict(m.state_dict())
    assert n2.amax.data_ptr() == ptr and same(n2(x), m(x))
    # .to(float16): the bias converts, the planes stay uint8, amax stays float32
    a = float(n2.amax)
    n2.to(torch.float16)
    assert n2.amax.dtype == torch.float32 and float(n2.amax) == a and n2.bias.dtype == torch.float16
    assert n2.row_data.dtype == torch.uint8 and n2.primary.amax is n2.amax
    assert "block=1x16" in repr(n2) and "planes=both" in repr(n2)
    # nothing high-precision but the bias (and amax, one element) once released
    n2.release_master_init()
    floats = sorted(n for n, t in list(n2.named_buffers()) + list(n2.named_parameters()) if t.is_floating_point())
    assert floats == ["amax", "bias"]


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
        c = NVFP4Linear(97, 65, planes=planes, block=block, compute_dtype=torch.float32).set_master_(spread(65, 97, 4))
        g = copy.deepcopy(c).cuda()
        g.set_master_(c.master_init().cuda())
        for n in BUFS:
            a, b = getattr(c, n), getattr(g, n)
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
        assert g.main_grad.is_cuda and g.main_grad.dtype == torch.float32

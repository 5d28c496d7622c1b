# SPDX-License-Identifier: MIT
"""mxshard.torch.checkpoint.export: export_safetensors and load_safetensors, and what a converted
linear's load_state_dict does with a file's quantized planes (refuses them, naming load_safetensors),
on a small language model with a tied embedding, trained a step under a ShardedOptimizer (a world of
one: its converted linears' weights are the replicated GatheredWeights whose planes the forward uses),
for MXFP8 and NVFP4, every plane set, layout and NVFP4 block. One process, no torch.distributed.
Skips without torch, safetensors or the host library."""
import itertools
import json

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
pytest.importorskip("safetensors", reason="safetensors is not installed (pip install safetensors)")

import mxshard  # noqa: E402

from conftest import host_lib_or_skip  # noqa: E402

host_lib_or_skip(module_level=True)

import safetensors.torch as st  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from safetensors import safe_open  # noqa: E402

import mxshard.torch as mxt  # noqa: E402
from mxshard.torch import CheckpointError, CheckpointMismatchError, export_safetensors, load_safetensors  # noqa: E402

LAYOUTS = ("compact", "padded", "swizzled")
PLANES = ("row", "both")
FORMATS = [("mxfp8", None)] + [("nvfp4", b) for b in ("1x16", "16x16")]
CASES = [(f, b, p, lay) for (f, b), p, lay in itertools.product(FORMATS, PLANES, LAYOUTS)]
CODE = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}


class TiedLM(nn.Module):
    """Embedding, an MLP block, a norm and an LM head tied to the embedding; a buffer."""

    def __init__(self, seed, vocab=37, dim=40, hidden=72, tied=True):
        super().__init__()
        torch.manual_seed(seed)
        self.emb = nn.Embedding(vocab, dim)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim, bias=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        if tied:
            self.head.weight = self.emb.weight
        self.register_buffer("scale", torch.rand(dim) + 0.5)

    def forward(self, ids):
        x = self.emb(ids) * self.scale
        x = x + self.down(F.gelu(self.up(x)))
        return self.head(self.norm(x))


def converted(seed, fmt, block, planes, layout, tied=True, step=True):
    """convert()'s model under a ShardedOptimizer (model.opt; a world of one), trained one SGD step
    (step=True): each converted linear's weight is a GatheredWeight whose planes
    (m.weight._box.planes) are the bytes its forward uses, quantized from the stepped masters."""
    model = param_converted(seed, fmt, block, planes, layout, tied)
    model.opt = mxt.ShardedOptimizer(model, lambda g: torch.optim.SGD(g, lr=0.05))
    if step:
        model(IDS).square().mean().backward()
        model.opt.step()
        model.opt.zero_grad()
    return model


def param_converted(seed, fmt, block, planes, layout, tied=True):
    """convert()'s model: MXFP8ParamLinear / NVFP4ParamLinear (weight = the master)."""
    kw = {"block": block} if fmt == "nvfp4" else {}
    return mxt.convert(TiedLM(seed, tied=tied), planes, format=fmt, layout=layout, skip="head",
                       compute_dtype=torch.float32, **kw)


def u8(t):
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def assert_same_state(a, b):
    """Every tensor of two state dicts byte-identical (same names, dtypes, shapes)."""
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and sa[k].shape == sb[k].shape, k
        assert torch.equal(u8(sa[k]), u8(sb[k])), f"{k}: {int((u8(sa[k]) != u8(sb[k])).sum())} bytes differ"


def primary(m, plane="row"):
    """The plane the forward (row) or backward (col) of converted linear m under the optimizer uses."""
    from mxshard.torch.fsdp.gathered import GatheredWeight
    assert isinstance(m.weight, GatheredWeight) and m.weight._box.mesh is None, type(m.weight)
    return m.weight._box.planes[plane]


def primary_row(m, dtype):
    """mxshard's dequantize of module m's row plane (the reference of a dequantized load)."""
    deq = mxshard.dequantize_nvfp4 if m.spec.format == "nvfp4" else mxshard.dequantize
    return deq(primary(m), plane="row", dtype=CODE[dtype])


def plane_bytes(m):
    """{buffer name: tensor} of the planes of converted linear m under the optimizer."""
    bufs = {}
    for b in m.spec.fmt.buffers:
        if m.spec.planes == "both" or not b.startswith("col_"):
            bufs[b] = getattr(primary(m, "col" if b.startswith("col_") else "row"), b)
    return bufs


def row_values(m):
    """The [out, in] fp32 values converted linear m's forward multiplies by."""
    return mxt.dequantized_weight(m)


IDS = torch.tensor([[0, 5, 36, 7, 11], [3, 3, 20, 1, 30]])


@pytest.fixture(scope="module", params=CASES, ids=lambda c: "-".join(x for x in c if x))
def exported(request, tmp_path_factory):
    fmt, block, planes, layout = request.param
    src = converted(0, fmt, block, planes, layout)
    path = str(tmp_path_factory.mktemp("export") / "m.safetensors")
    export_safetensors(path, src)
    return src, path, request.param


# ---- the file ---------------------------------------------------------------------------

def test_file_holds_each_tensor_once_in_its_code_dtype(exported):
    src, path, (fmt, block, planes, layout) = exported
    with safe_open(path, framework="pt") as f:
        meta = f.metadata()
        got = {k: f.get_tensor(k) for k in f.keys()}
    sd = src.state_dict()
    quant = {f"{n}.{b}": t for n in ("up", "down") for b, t in plane_bytes(getattr(src, n)).items()}
    # the converted weights go as their planes (not the dequantized weight state_dict() shows); the
    # tied head is stored once, as emb.weight
    assert set(got) == (set(sd) - {"head.weight", "up.weight", "down.weight"}) | set(quant)
    assert json.loads(meta["aliases"]) == {"head.weight": "emb.weight"}
    mx = json.loads(meta["mxshard"])
    assert set(mx) == {"up", "down"} and meta["format"] == mxt.checkpoint.EXPORT_FORMAT
    assert mx["up"]["planes"] == planes and mx["up"]["layout"] == layout
    for k, t in got.items():
        leaf = k.rpartition(".")[2]
        ref = quant[k] if k in quant else sd[k]
        if k in quant:
            e4m3 = leaf.endswith("_data") if fmt == "mxfp8" else leaf.endswith("_scale")
            want = torch.float8_e4m3fn if e4m3 else torch.float32 if leaf == "amax" else torch.uint8
        else:
            want = sd[k].dtype
        assert t.dtype == want and t.shape == ref.shape, (k, t.dtype, want)
        assert torch.equal(u8(t), u8(ref)), k     # the bytes the forward (and backward) use
    assert ("up.col_data" in got) == (planes == "both")
    for n in ("up", "down"):   # ... which are the whole-tensor quantize of the master (a world of one)
        m = getattr(src, n)
        v, b, pos = next(x for x in src.opt._views if src.opt.buckets[x[1]].items[x[2]].name == f"{n}.weight")
        fresh = mxt.convert(nn.Sequential(nn.Linear(m.in_features, m.out_features, bias=False)), planes,
                            format=fmt, layout=layout, compute_dtype=torch.float32,
                            **({"block": block} if fmt == "nvfp4" else {}))[0]
        with torch.no_grad():
            fresh.weight.copy_(v.reshape(m.weight.shape))
        mine = mxt.checkpoint.export._param_linear_buffers(fresh, fresh.weight)
        assert set(mine) == set(plane_bytes(m))
        assert all(torch.equal(u8(mine[b]), u8(got[f"{n}.{b}"])) for b in mine), n


# ---- into a converted model: the row plane's values ------------------------------------------

def refuses_planes(call, dst):
    """call() raises the advice to use load_safetensors (a converted linear loads a weight, not
    planes) and writes nothing into dst's converted linears. (torch's load_state_dict has loaded
    the modules before the first converted one by then: the root's buffer, the embedding.)"""
    before = {k: v.clone() for k, v in dst.state_dict().items() if k.startswith(("up.", "down."))}
    with pytest.raises(RuntimeError, match=r"save and load a ShardedOptimizer model with .*export_safetensors / "
                                           r"load_safetensors") as ei:
        call()
    assert "up's quantized planes" in str(ei.value) or "down's quantized planes" in str(ei.value)
    assert_same(before, {k: v for k, v in dst.state_dict().items() if k.startswith(("up.", "down."))})


def assert_same(a, b):
    assert a.keys() == b.keys()
    assert all(torch.equal(u8(a[k]), u8(b[k])) for k in a), [k for k in a if not torch.equal(u8(a[k]), u8(b[k]))]


def test_load_state_dict_of_load_file_refuses_the_planes(exported):
    """ShardedOptimizer's linears no longer hold byte buffers (the byte load of the removed
    MXFP8Linear / NVFP4Linear): a converted linear, under the optimizer or not, refuses a file's
    planes with the advice, strict or not, and nothing is written."""
    src, path, case = exported
    for dst in (converted(1, *case), param_converted(1, *case)):
        refuses_planes(lambda: dst.load_state_dict(st.load_file(path)), dst)
        refuses_planes(lambda: dst.load_state_dict(st.load_file(path), strict=False), dst)


def test_safetensors_load_model_refuses_the_planes(exported):
    src, path, case = exported
    dst = converted(2, *case)
    refuses_planes(lambda: st.load_model(dst, path), dst)


def check_loaded(dst, src):
    """dst (loaded from src's file) multiplies by src's row-plane values: every tensor of its state
    dict byte-identical (the converted weights: their row plane dequantized), the tie restored, the
    forward equal."""
    assert dst.head.weight is dst.emb.weight
    assert_same_state(dst, src)
    for n in ("up", "down"):
        assert torch.equal(row_values(getattr(dst, n)), row_values(getattr(src, n))), n
    assert torch.equal(dst(IDS), src(IDS)) and not dst(IDS).isnan().any()


def test_load_safetensors_into_converted_model_is_exact(exported):
    src, path, case = exported
    dst = param_converted(3, *case)
    assert tuple(load_safetensors(path, dst)) == ([], [])
    check_loaded(dst, src)
    opt = mxt.ShardedOptimizer(dst, lambda g: torch.optim.SGD(g, lr=0.05))   # and the optimizer built after
    check_loaded(dst, src)
    if case[2] == "both":   # the column plane is derived from the loaded master, as the optimizer's writeback
        assert all(torch.equal(u8(t), u8(plane_bytes(dst.up)[b])) for b, t in plane_bytes(dst.up).items())
    opt.close()


def test_load_safetensors_into_model_under_optimizer_is_exact(exported):
    """Under a ShardedOptimizer the loaded values wait for masters_from_model (step() raises until
    then); after it the model multiplies by the file's values."""
    src, path, case = exported
    dst = converted(3, *case, step=False)
    assert tuple(load_safetensors(path, dst)) == ([], [])
    dst(IDS).sum().backward()
    with pytest.raises(Exception, match="masters_from_model"):
        dst.opt.step()
    dst.opt.zero_grad()
    dst.opt.masters_from_model()
    check_loaded(dst, src)


# ---- into a plain model: dequantized ---------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_load_safetensors_into_plain_model_dequantizes(exported, dtype):
    src, path, case = exported
    plain = TiedLM(4, tied=False).to(dtype)     # untied: the file's tie is restored
    load_safetensors(path, plain)
    assert plain.head.weight is plain.emb.weight
    for name in ("up", "down"):
        want = primary_row(getattr(src, name), dtype)
        assert torch.equal(want.float(), row_values(getattr(src, name))) or dtype != torch.float32
        got = getattr(plain, name).weight
        assert got.dtype == dtype and torch.equal(u8(got), u8(want)), name
    assert torch.equal(plain.up.bias, src.up.bias.to(dtype))
    assert torch.equal(plain.emb.weight, src.emb.weight.to(dtype)) and torch.equal(plain.scale, src.scale.to(dtype))
    if dtype == torch.float32:
        torch.testing.assert_close(plain(IDS), src(IDS), rtol=1e-5, atol=1e-5)


# ---- what fails, and says what to do ------------------------------------------------------

def test_load_safetensors_rejects_other_options_before_writing(tmp_path):
    src = converted(0, "mxfp8", None, "row", "padded")
    path = str(tmp_path / "m.safetensors")
    export_safetensors(path, src)
    for other, words in [(("mxfp8", None, "row", "swizzled"), "layout 'padded'"),   # same scale shapes here
                         (("mxfp8", None, "both", "padded"), "planes 'row'"),
                         (("nvfp4", "1x16", "row", "padded"), "format mxfp8")]:
        dst = converted(5, *other, tied=False)
        before = {k: v.clone() for k, v in dst.state_dict().items()}
        with pytest.raises(CheckpointMismatchError, match=words) as ei:
            load_safetensors(path, dst)
        assert "convert the model with the file's options" in str(ei.value)
        assert dst.head.weight is not dst.emb.weight          # the tie is not restored either
        assert all(torch.equal(u8(v), u8(dst.state_dict()[k])) for k, v in before.items())
    wider = TiedLM(6, dim=41)
    with pytest.raises(CheckpointMismatchError, match="shape"):
        load_safetensors(path, wider)
    lm = TiedLM(7)
    lm.extra = nn.Linear(3, 3)
    with pytest.raises(CheckpointMismatchError, match="extra.weight"):
        load_safetensors(path, lm)
    assert tuple(load_safetensors(path, lm, strict=False)) == (["extra.weight", "extra.bias"], [])


def test_dense_file_into_converted_model(tmp_path):
    """A dense file loads into a convert()ed model as it is (the masters); into a model under
    ShardedOptimizer too (it once raised: the removed byte-buffer linears took no weight): the values
    wait for masters_from_model (step() raises until then), then the model multiplies by the same
    quantization of the file's weights as the convert()ed model."""
    path = str(tmp_path / "dense.safetensors")
    export_safetensors(path, TiedLM(0))
    conv = param_converted(1, "mxfp8", None, "row", "padded")
    assert tuple(load_safetensors(path, conv)) == ([], [])
    conv.load_state_dict(st.load_file(path), strict=False)
    assert torch.equal(conv.up.weight, TiedLM(0).up.weight)
    for load, result in ((lambda m: load_safetensors(path, m), ([], [])),
                         (lambda m: m.load_state_dict(st.load_file(path), strict=False), (["head.weight"], []))):
        dst = converted(1, "mxfp8", None, "row", "padded")
        assert tuple(load(dst)) == result
        dst(IDS).sum().backward()
        with pytest.raises(Exception, match="masters_from_model"):
            dst.opt.step()
        dst.opt.zero_grad()
        dst.opt.masters_from_model()
        for n in ("up", "down"):
            assert torch.equal(row_values(getattr(dst, n)), row_values(getattr(conv, n))), n
        assert torch.equal(dst(IDS), conv(IDS))
    plain = TiedLM(2)
    load_safetensors(path, plain)    # a dense file into a plain model: as load_state_dict
    assert_same_state(plain, TiedLM(0))


def test_bad_arguments_and_files(tmp_path):
    m = TiedLM(0)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file")
    for call, exc, words in [(lambda: load_safetensors(3, m), TypeError, "path must be"),
                             (lambda: load_safetensors(str(bad), object()), TypeError, "model must be"),
                             (lambda: load_safetensors(str(bad), m, strict=1), TypeError, "strict must be a bool"),
                             (lambda: load_safetensors(str(tmp_path / "none"), m), CheckpointError, "is not a file"),
                             (lambda: load_safetensors(str(bad), m), CheckpointError, "not a readable safetensors"),
                             (lambda: export_safetensors(str(bad), "model"), TypeError, "model must be"),
                             (lambda: export_safetensors(str(tmp_path / "x"), WithExtraState()), TypeError,
                              "x._extra_state is a dict")]:
        with pytest.raises(exc, match=words):
            call()
    assert not (tmp_path / "x").exists()


class LinearWithExtraState(nn.Linear):
    def get_extra_state(self):
        return {"step": 1}


class WithExtraState(nn.Module):
    def __init__(self):
        super().__init__()
        self.x = LinearWithExtraState(2, 2)


# ---- a converted linear and a file's planes ---------------------------------------------------

def test_converted_linear_refuses_planes_in_any_dtype():
    """The byte-load pre-hook of the removed MXFP8Linear / NVFP4Linear is gone: mxt.MXFP8Linear /
    NVFP4Linear build convert()'s linear, which loads a weight; planes (in their code's dtype or as
    raw int8 bytes, from a linear under ShardedOptimizer) raise the advice and write nothing."""
    for fmt, kw in (("mxfp8", {}), ("nvfp4", {"block": "1x16"})):
        cls = mxt.NVFP4Linear if fmt == "nvfp4" else mxt.MXFP8Linear
        a, b = cls(40, 33, planes="both", **kw), cls(40, 33, planes="both", **kw)
        opt = mxt.ShardedOptimizer(nn.Sequential(a), lambda g: torch.optim.SGD(g, lr=0.1))
        code = {"mxfp8": {"data": torch.float8_e4m3fn, "scale": torch.float8_e8m0fnu},
                "nvfp4": {"data": torch.float4_e2m1fn_x2, "scale": torch.float8_e4m3fn}}[fmt]
        planes = plane_bytes(a)
        assert set(planes) >= {"row_data", "row_scale", "col_data", "col_scale"}
        for named in (True, False):   # the dtype of the code, or raw int8 bytes
            sd = {"bias": a.bias.detach().clone()}
            for k, v in planes.items():
                kind = k.rpartition("_")[2]
                sd[k] = v if kind not in code else v.view(code[kind] if named else torch.int8)
            before = {k: v.clone() for k, v in b.state_dict().items()}
            for strict in (True, False):
                with pytest.raises(RuntimeError, match=r"^mxshard: save and load a ShardedOptimizer model with") \
                        as ei:
                    b.load_state_dict(sd, strict=strict)
                assert "row_data, row_scale, col_data, col_scale" in str(ei.value)
                assert_same(before, b.state_dict())
        opt.close()


# ---- shared tensors -----------------------------------------------------------------------

class SharedBuffer(nn.Module):
    def __init__(self, share):
        super().__init__()
        self.a, self.b = nn.Module(), nn.Module()
        t = torch.arange(6.0)
        self.a.register_buffer("freq", t)
        self.b.register_buffer("freq", t if share else t.clone())
        self.a.register_buffer("tail", t[3:])     # a view of part of it: stored on its own
        self.lin = nn.Linear(6, 4)


def test_shared_buffers_stored_once_and_shared_again(tmp_path):
    path = str(tmp_path / "s.safetensors")
    export_safetensors(path, SharedBuffer(share=True))
    with safe_open(path, framework="pt") as f:
        assert set(f.keys()) == {"a.freq", "a.tail", "lin.weight", "lin.bias"}
        assert json.loads(f.metadata()["aliases"]) == {"b.freq": "a.freq"}
    dst = SharedBuffer(share=False)
    load_safetensors(path, dst)
    assert dst.b.freq is dst.a.freq and torch.equal(dst.a.tail, torch.arange(3.0, 6.0))

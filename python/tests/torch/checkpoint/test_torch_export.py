# SPDX-License-Identifier: MIT
"""mxshard.torch.checkpoint.export: export_safetensors and load_safetensors, and the
quantized modules' load_state_dict pre-hook (bytes, not values), on a small
language model with a tied embedding, for MXFP8 and NVFP4, every plane set,
layout and NVFP4 block. One process, no torch.distributed. Skips without
torch, safetensors or the host library."""
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


def converted(seed, fmt, block, planes, layout, tied=True):
    """A converted model whose linears hold their primaries as byte buffers: ShardedOptimizer's
    storage (adopt_param_linears, what its construction does), the modules a byte load targets."""
    return as_byte_linears(param_converted(seed, fmt, block, planes, layout, tied))


def param_converted(seed, fmt, block, planes, layout, tied=True):
    """convert()'s model: MXFP8ParamLinear / NVFP4ParamLinear (weight = the master)."""
    kw = {"block": block} if fmt == "nvfp4" else {}
    return mxt.convert(TiedLM(seed, tied=tied), planes, format=fmt, layout=layout, skip="head",
                       compute_dtype=torch.float32, **kw)


def as_byte_linears(model):
    from mxshard.torch.zero.adopt import adopt_param_linears
    adopt_param_linears(model, [])
    return model


def u8(t):
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def assert_same_state(a, b):
    """Every tensor of two state dicts byte-identical (same names, dtypes, shapes)."""
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and sa[k].shape == sb[k].shape, k
        assert torch.equal(u8(sa[k]), u8(sb[k])), f"{k}: {int((u8(sa[k]) != u8(sb[k])).sum())} bytes differ"


def primary_row(m, dtype):
    """mxshard's dequantize of module m's primary (the reference of a dequantized load)."""
    deq = mxshard.dequantize_nvfp4 if m.format == "nvfp4" else mxshard.dequantize
    return deq(m.primary, plane="row", dtype=CODE[dtype])


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
    assert set(got) == set(sd) - {"head.weight"}          # the tied head is stored once, as emb.weight
    assert json.loads(meta["aliases"]) == {"head.weight": "emb.weight"}
    mx = json.loads(meta["mxshard"])
    assert set(mx) == {"up", "down"} and meta["format"] == mxt.checkpoint.EXPORT_FORMAT
    assert mx["up"]["planes"] == planes and mx["up"]["layout"] == layout
    for k, t in got.items():
        leaf = k.rpartition(".")[2]
        if k.startswith(("up.", "down.")) and leaf != "bias":
            e4m3 = leaf.endswith("_data") if fmt == "mxfp8" else leaf.endswith("_scale")
            want = torch.float8_e4m3fn if e4m3 else torch.float32 if leaf == "amax" else torch.uint8
        else:
            want = sd[k].dtype
        assert t.dtype == want and t.shape == sd[k].shape, (k, t.dtype, want)
        assert torch.equal(u8(t), u8(sd[k])), k
    assert ("up.col_data" in got) == (planes == "both")


# ---- into a converted model: bytes ---------------------------------------------------------

def test_load_state_dict_of_load_file_is_exact(exported):
    src, path, case = exported
    dst = converted(1, *case)
    with pytest.raises(RuntimeError, match="head.weight"):   # strict: the alias key is not in the file
        dst.load_state_dict(st.load_file(path))
    dst = converted(1, *case)
    missing, unexpected = dst.load_state_dict(st.load_file(path), strict=False)
    assert missing == ["head.weight"] and unexpected == []
    assert dst.head.weight is dst.emb.weight
    assert_same_state(dst, src)
    assert torch.equal(dst(IDS), src(IDS)) and not dst(IDS).isnan().any()


def test_safetensors_load_model_is_exact(exported):
    src, path, case = exported
    dst = converted(2, *case)
    st.load_model(dst, path)   # strict; knows the tie
    assert_same_state(dst, src)


def test_load_safetensors_into_converted_model_is_exact(exported):
    src, path, case = exported
    dst = converted(3, *case)
    assert tuple(load_safetensors(path, dst)) == ([], [])
    assert dst.head.weight is dst.emb.weight
    assert_same_state(dst, src)
    assert torch.equal(dst(IDS), src(IDS))


# ---- into a plain model: dequantized ---------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_load_safetensors_into_plain_model_dequantizes(exported, dtype):
    src, path, case = exported
    plain = TiedLM(4, tied=False).to(dtype)     # untied: the file's tie is restored
    load_safetensors(path, plain)
    assert plain.head.weight is plain.emb.weight
    for name in ("up", "down"):
        want = primary_row(getattr(src, name), dtype)
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
    """A dense file loads into a convert()ed model as it is (the masters); into ShardedOptimizer's
    byte-buffer linears it raises, the fix first and once, then the weights it concerns."""
    path = str(tmp_path / "dense.safetensors")
    export_safetensors(path, TiedLM(0))
    conv = param_converted(1, "mxfp8", None, "row", "padded")
    assert tuple(load_safetensors(path, conv)) == ([], [])
    conv.load_state_dict(st.load_file(path), strict=False)
    assert torch.equal(conv.up.weight, TiedLM(0).up.weight)
    dst = converted(1, "mxfp8", None, "row", "padded")
    with pytest.raises(CheckpointMismatchError, match=r"^load_safetensors: load the file before ShardedOptimizer"):
        load_safetensors(path, dst)
    with pytest.raises(RuntimeError) as ei:
        dst.load_state_dict(st.load_file(path), strict=False)
    msg = str(ei.value).split("\n\t")
    assert msg[1].startswith("Load dense weights into the model before ShardedOptimizer") and "set_master_" in msg[1]
    assert [m.split()[0] for m in msg[2:]] == ["up.weight", "down.weight"]
    assert len(str(ei.value)) < 600 and str(ei.value).count("load_safetensors") == 1
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


# ---- the load_state_dict pre-hook ------------------------------------------------------------

def test_hook_takes_tensors_whose_dtype_names_the_code_as_bytes():
    for fmt, kw in (("mxfp8", {}), ("nvfp4", {"block": "1x16"})):
        cls = mxt.NVFP4Linear if fmt == "nvfp4" else mxt.MXFP8Linear
        a, b = cls(40, 33, planes="both", **kw), cls(40, 33, planes="both", **kw)
        code = {"mxfp8": {"data": torch.float8_e4m3fn, "scale": torch.float8_e8m0fnu},
                "nvfp4": {"data": torch.float4_e2m1fn_x2, "scale": torch.float8_e4m3fn}}[fmt]
        for named in (True, False):   # the dtype of the code, or raw int8 bytes
            sd = {}
            for k, v in a.state_dict().items():
                kind = k.rpartition("_")[2]
                sd[k] = v if kind not in code else v.view(code[kind] if named else torch.int8)
            b.load_state_dict(sd)
            assert_same_state(b, a)


def test_hook_rejects_values_of_another_dtype_and_shape():
    a, b = mxt.MXFP8Linear(40, 33, planes="both"), mxt.MXFP8Linear(40, 33, planes="both")
    for key, value, words in [("row_data", lambda t: t.float(), "only uint8, int8, float8_e4m3fn are taken"),
                              ("row_scale", lambda t: t.view(torch.float8_e4m3fn), "E8M0 codes"),
                              ("col_data", lambda t: t.view(torch.float8_e5m2), "corrupt the weight"),
                              ("row_scale", lambda t: t[:-1], "another shape, planes, layout")]:
        sd = dict(a.state_dict())
        sd[key] = value(sd[key])
        before = b.state_dict()[key].clone()
        with pytest.raises(RuntimeError, match=f"{key}: .*{words}"):
            b.load_state_dict(sd)
        assert torch.equal(b.state_dict()[key], before), key     # the bad tensor went nowhere
    n = mxt.NVFP4Linear(40, 33)
    sd = dict(n.state_dict())
    sd["amax"] = sd["amax"].to(torch.bfloat16)
    with pytest.raises(RuntimeError, match="amax: dtype torch.bfloat16, the NVFP4 tensor amax is float32"):
        mxt.NVFP4Linear(40, 33).load_state_dict(sd)


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

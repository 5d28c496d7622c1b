# SPDX-License-Identifier: MIT
"""One converted weight for every training loop (issue 34), in one process:
convert() makes MXFP8ParamLinear / NVFP4ParamLinear whatever else the user
writes next, and each habit either trains correctly or raises at once with
what to do. The multi-process halves (FSDP2, ShardedOptimizer on gloo
ranks) are in torch_fsdp_cases.py and torch_dist_cases.py."""
import copy
import warnings

import pytest

from conftest import torch_lib_or_skip

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import mxshard  # noqa: E402
import mxshard.torch as mxt  # noqa: E402
from mxshard.torch.fsdp.gathered import GatheredWeight  # noqa: E402


@pytest.fixture(autouse=True)
def _lib():
    torch_lib_or_skip()


class Net(nn.Module):
    def __init__(self, d=40, h=72, out=24):
        super().__init__()
        self.up = nn.Linear(d, h)
        self.down = nn.Linear(h, out, bias=False)
        self.head = nn.Linear(out, 5)

    def forward(self, x):
        return self.head(F.gelu(self.down(F.gelu(self.up(x)))))


def build(seed=0, policy=None, **kw):
    torch.manual_seed(seed)
    return mxt.convert(Net(), policy or {"up": "both", "down": "row"}, **kw)


def u8(t):
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def whole_quantize(m):
    """The whole-tensor quantize of module m's master rounded through bf16 (its spec)."""
    master = m.weight.detach()._data
    src = master.to(torch.bfloat16)
    s = m.spec
    if s.format == "mxfp8":
        w = mxshard.MXFP8Weight.empty(*master.shape, planes=s.planes, layout=s.layout, device="cpu")
        return mxshard.quantize(w, src, rounding=s.rounding)
    w = mxshard.NVFP4Weight.empty(*master.shape, planes=s.planes, block=s.block, layout=s.layout, device="cpu")
    return mxshard.quantize_nvfp4(w, src)


def held_plane(m, b):
    """Buffer `b` (row_data, row_scale, col_data, col_scale, amax) of the replicated primary a
    converted linear holds under ShardedOptimizer (its GatheredWeight's planes: "row", "col")."""
    planes = m.weight._box.planes
    if b.startswith("col"):
        return getattr(planes["col"], b) if "col" in planes else None
    return getattr(planes["row"], b)


def assert_primary_is_whole_quantize(m):
    p, want = m.primary, whole_quantize(m)
    for b in ("row_data", "row_scale", "col_data", "col_scale"):
        if getattr(want, b, None) is not None:
            assert torch.equal(u8(getattr(p, b)), u8(getattr(want, b))), b


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_plain_torch_optim_trains_every_converted_weight(fmt):
    """Item 1: convert, then torch.optim.AdamW(model.parameters()): every converted weight is a
    Parameter, moves, and its primary follows (the whole-tensor quantize of the new master)."""
    ref = Net()
    model = build(format=fmt)
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in ref.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = torch.randn(16, 40), torch.randn(16, 5)
    before = {n: u8(m.primary.row_data).clone() for n, m in model.named_modules() if mxt.is_param_linear(m)}
    losses = []
    for _ in range(8):
        loss = F.mse_loss(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)   # sees every gradient
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0], losses
    for n, m in model.named_modules():
        if mxt.is_param_linear(m):
            assert not torch.equal(u8(m.primary.row_data), before[n]), n
            assert_primary_is_whole_quantize(m)


def test_fsdp_flag_is_a_deprecated_no_op():
    """Item 3 / 13: fsdp= selects nothing any more (a DeprecationWarning), so the two old modes give
    one module and one quantization."""
    with pytest.warns(DeprecationWarning, match="drop fsdp="):
        a = build(fsdp=False)
    with pytest.warns(DeprecationWarning):
        b = build(fsdp=True)
    c = build()
    for m in (a, b, c):
        assert isinstance(m.up, mxt.MXFP8ParamLinear) and isinstance(m.down, mxt.MXFP8ParamLinear)
    for name in ("up", "down"):
        for x in (a, b):
            assert torch.equal(u8(getattr(x, name).primary.row_data), u8(getattr(c, name).primary.row_data))


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_sharded_optimizer_takes_a_converted_model_and_quantizes_it_the_same_way(fmt):
    """Items 3 and 13: convert() then ShardedOptimizer (a world of one): the optimizer takes the
    linears' storage over, its primaries equal the bytes the converted model computed with, and
    a step moves them; param_groups may name the weights as the Parameters the user saw."""
    model = build(format=fmt)
    want = {n: copy.deepcopy(m.primary) for n, m in model.named_modules() if mxt.is_param_linear(m)}
    deq = {n: mxt.dequantized_weight(model.get_submodule(n)) for n in want}
    decay = [p for p in model.parameters() if p.ndim >= 2]
    opt = mxt.ShardedOptimizer(model, lambda g: torch.optim.AdamW(g, lr=1e-2),
                               param_groups=[{"params": decay, "weight_decay": 0.1}])
    try:
        for n, w in want.items():
            held = model.get_submodule(n)
            # the model keeps its converted linear; its weight is the replicated GatheredWeight
            assert mxt.is_param_linear(held) and (mxt.is_mxfp8(held) or mxt.is_nvfp4(held))
            assert isinstance(held.weight, GatheredWeight)
            assert tuple(held.weight.shape) == (held.out_features, held.in_features)
            for b in ("row_data", "row_scale", "col_data", "col_scale", "amax"):
                if getattr(w, b, None) is not None:
                    assert torch.equal(u8(held_plane(held, b)), u8(getattr(w, b))), (n, b)
            # the one line that gives the computed weight works on the optimizer's linears too
            assert torch.equal(mxt.dequantized_weight(held), deq[n]), n
        with pytest.raises(TypeError, match="^mxshard: pass dequantized_weight a linear that convert"):
            mxt.dequantized_weight(model.head)   # an nn.Linear: its weight is module.weight itself
        assert opt.param_groups[0]["weight_decay"] == 0.1
        x = torch.randn(8, 40)
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        assert not torch.equal(u8(held_plane(model.up, "row_data")), u8(want["up"].row_data))
    finally:
        opt.close()


def test_sharded_optimizer_refuses_a_frozen_converted_weight_and_leaves_the_model():
    model = build()
    model.down.weight.requires_grad_(False)
    with pytest.raises(ValueError, match=r"^ShardedOptimizer: keep frozen linears dense \(convert\(\.\.\., skip=\.\.\.\)\) or unfreeze down\.weight"):
        mxt.ShardedOptimizer(model, lambda g: torch.optim.SGD(g, lr=0.1))
    assert isinstance(model.up, mxt.MXFP8ParamLinear) and isinstance(model.down, mxt.MXFP8ParamLinear)


def test_frozen_converted_weight_under_torch_optim():
    """requires_grad_(False) on a converted weight: it gets no gradient and does not move."""
    model = build()
    model.up.weight.requires_grad_(False)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    before = u8(model.up.primary.row_data).clone()
    model(torch.randn(4, 40)).sum().backward()
    assert model.up.weight.grad is None and model.down.weight.grad is not None
    opt.step()
    assert torch.equal(u8(model.up.primary.row_data), before)


def test_output_dtype_is_nn_linears():
    """Item 12: a converted model run in fp32 without autocast returns fp32 (nn.Linear's rule), so
    attention's q, k and v agree; inside autocast it returns autocast's dtype."""
    model = build()
    x = torch.randn(3, 40)
    assert model.up(x).dtype == torch.float32 and model(x).dtype == torch.float32
    assert model.up(x.to(torch.float16)).dtype == torch.float16
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model.up(x).dtype == torch.bfloat16
    q = model.up(x).view(1, 1, 3, 72)
    k = (torch.randn(1, 1, 3, 72) * 1.0).float()
    F.scaled_dot_product_attention(q, k, k)   # no "same dtype" error


def test_writes_through_data_and_load_state_dict_reach_the_primary():
    """HF-style init through .data, copy_ under no_grad, a load_state_dict round trip: the next
    forward uses the new master (one process)."""
    model = build()
    x = torch.randn(4, 40)
    y0 = model(x)
    for m in (model.up, model.down):
        m.weight.data.neg_()
    y1 = model(x)
    assert not torch.equal(y0, y1)
    assert_primary_is_whole_quantize(model.up)
    with torch.no_grad():
        model.up.weight.copy_(torch.randn(72, 40))
    assert_primary_is_whole_quantize(model.up)
    sd = copy.deepcopy(model.state_dict())
    assert type(sd["up.weight"]) is torch.Tensor       # plain tensors: torch.save, HF, safetensors
    other = build(seed=3)
    other.load_state_dict(sd)
    assert torch.equal(other(x), model(x))
    model.zero_grad()


def test_ema_copy_of_a_converted_model():
    """torch.optim.swa_utils.AveragedModel (an EMA copy): it averages the masters and its forward
    uses their quantization."""
    model = build()
    ema = torch.optim.swa_utils.AveragedModel(model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.9))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 40)
    ema.update_parameters(model)                 # the first update copies the model
    w1 = model.up.weight.detach()._data.clone()
    model(x).sum().backward()
    opt.step()
    ema.update_parameters(model)                 # then ema = 0.9 ema + 0.1 model
    e = ema.module
    want = 0.9 * w1 + 0.1 * model.up.weight.detach()._data
    torch.testing.assert_close(e.up.weight.detach()._data, want)
    assert_primary_is_whole_quantize(e.up)
    assert not torch.equal(ema(x), model(x))


class Conv1D(nn.Module):
    """Shaped like Hugging Face transformers' GPT-2 Conv1D (weight [in, out], y = x @ W + b)."""

    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.02)
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x):
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(*x.shape[:-1], self.nf)


def test_conv1d_is_named_not_skipped_silently():
    """Item 14: a GPT-2-style model: convert(model, "row") would convert only lm_head; it raises
    naming the Conv1D modules (strict), warns with strict=False, and skip= takes them out."""
    m = nn.ModuleDict({"c_attn": Conv1D(12, 4), "c_proj": Conv1D(4, 12), "lm_head": nn.Linear(4, 10)})
    with pytest.raises(ValueError, match=r"^convert: add the Conv1D modules to skip=.*c_attn, c_proj"):
        mxt.convert(copy.deepcopy(m), "row")
    with pytest.warns(UserWarning, match="Conv1D"):
        out = mxt.convert(copy.deepcopy(m), "row", strict=False)
    assert isinstance(out["lm_head"], mxt.MXFP8ParamLinear)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = mxt.convert(copy.deepcopy(m), "row", skip=["c_*"])
    assert isinstance(out["lm_head"], mxt.MXFP8ParamLinear) and type(out["c_attn"]) is Conv1D
    # a policy pattern that names the Conv1D modules is right about the names: the message says why they
    # cannot be converted (it said "fix the pattern")
    with pytest.raises(ValueError, match=r"^convert: policy pattern 'c_\*' names Hugging Face Conv1D modules, "
                                         r"which convert\(\) cannot convert \(c_attn, c_proj"):
        mxt.convert(copy.deepcopy(m), {"c_*": "row"})


class _Attn(nn.Module):
    """BEiT / EVA's attention input: F.linear with the converted qkv's weight and a bias of its own."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(40, 48, bias=False)
        self.q_bias = nn.Parameter(torch.zeros(48))

    def forward(self, x):
        return F.linear(x, self.qkv.weight, self.q_bias)


def test_a_product_with_a_converted_weight_outside_its_module_says_to_call_the_module():
    """F.linear(x, self.qkv.weight) or x @ w.T in a forward computed with the fp32 master, not the
    quantized bytes the layer trains with, and said nothing: it raises naming the module and
    skip=. A detached copy (weight.detach(), .data, a clone) multiplies as any tensor."""
    torch.manual_seed(0)
    m = mxt.convert(_Attn(), "row")
    x = torch.randn(3, 40)
    w = m.qkv.weight
    for f in (lambda: m(x), lambda: x @ w.T, lambda: torch.matmul(x, w.t()), lambda: torch.einsum("bi,oi->bo", x, w)):
        with pytest.raises(RuntimeError, match=r"^mxshard: call the module to multiply by qkv.weight \(qkv\(x\)\), "
                                               r"or keep qkv dense \(convert\(..., skip=\['qkv'\]\)\)"):
            f()
    plain = w.detach()._data
    for v in (w.detach(), w.data, w.detach().clone()):
        assert torch.equal(F.linear(x, v), F.linear(x, plain))
    # a product of weights alone (an orthogonality penalty) is on the masters, and trains them
    penalty = (w @ w.T - torch.eye(48)).pow(2).sum()
    penalty.backward()
    assert torch.equal(penalty.detach(), (plain @ plain.T - torch.eye(48)).pow(2).sum()) and w.grad is not None
    assert torch.equal(m.qkv(x), F.linear(x.to(torch.bfloat16), mxt.dequantized_weight(m.qkv, torch.bfloat16)))


def test_pruning_a_converted_linear_says_to_keep_it_dense():
    """torch.nn.utils.prune on a converted linear: the next forward raises naming pruning and
    skip= (it said the weight "was replaced", naming ties and functional_call)."""
    import torch.nn.utils.prune as prune
    model = build()
    prune.l1_unstructured(model.up, "weight", amount=0.5)
    with pytest.raises(RuntimeError, match=r"^mxshard: keep linears you prune \(torch.nn.utils.prune\) dense: "
                                           r"leave up out of convert\(\)'s policy \(skip=\[...\]\)"):
        model(torch.randn(2, 40))


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_export_holds_the_bytes_the_forward_used_and_a_plain_model_reproduces_it(fmt, tmp_path):
    """Item 10: export_safetensors of a convert()ed model writes the primaries (not the masters),
    and load_safetensors into a plain model reproduces the converted model's outputs."""
    pytest.importorskip("safetensors")
    from safetensors.torch import load_file
    model = build(format=fmt, policy={"up": "both", "down": "row"}, compute_dtype=torch.float32)
    path = str(tmp_path / "m.safetensors")
    mxt.export_safetensors(path, model)
    f = load_file(path)
    assert "up.weight" not in f and "down.weight" not in f and "head.weight" in f
    for n in ("up", "down"):
        p = getattr(model, n).primary
        for b in ("row_data", "row_scale", "col_data", "col_scale"):
            if getattr(p, b, None) is not None:
                assert torch.equal(u8(f[f"{n}.{b}"]), u8(getattr(p, b))), (n, b)
    plain = Net()
    mxt.load_safetensors(path, plain)
    for n in ("up", "down"):
        assert torch.equal(getattr(plain, n).weight, mxt.dequantized_weight(getattr(model, n)))
    x = torch.randn(6, 40)
    torch.testing.assert_close(plain(x), model(x), rtol=1e-6, atol=1e-6)


def test_whole_model_pickle_and_assign_loads():
    """torch.save(model) / torch.load of a converted model (the group's derived bytes are rebuilt),
    load_state_dict(assign=True) into a converted model built on the meta device (the master takes
    the loaded tensor) and into a materialised one (its values)."""
    import io
    model = build()
    x = torch.randn(5, 40)
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    back = torch.load(buf, weights_only=False)
    assert torch.equal(back(x), model(x))
    sd = model.state_dict()
    with torch.device("meta"):
        meta = Net()
    meta = mxt.convert(meta, {"up": "both", "down": "row"})
    meta.load_state_dict(sd, assign=True)
    assert isinstance(meta.up.weight.detach(), mxt.QuantMaster) and meta.up.weight.device.type == "cpu"
    assert meta.up.weight.detach()._data.data_ptr() == sd["up.weight"].data_ptr()   # assigned, not copied
    assert torch.equal(meta(x), model(x))
    other = build(seed=5)
    other.load_state_dict(sd, assign=True)
    assert isinstance(other.up.weight.detach(), mxt.QuantMaster) and torch.equal(other(x), model(x))


def test_meta_device_then_to_empty_then_init():
    """torchtitan's order in one process: build on meta, convert, to_empty, initialise in place."""
    with torch.device("meta"):
        model = Net()
    model = mxt.convert(model, {"up": "both", "down": "row"})
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    for m in (model.up, model.down, model.head):
        m.reset_parameters()
    assert isinstance(model.up.weight.detach(), mxt.QuantMaster)
    assert_primary_is_whole_quantize(model.up)
    assert_primary_is_whole_quantize(model.down)
    assert torch.isfinite(model(torch.randn(3, 40))).all()


def test_replaced_weight_says_what_to_do_first():
    model = build()
    model.down.weight = nn.Parameter(torch.randn(24, 72))
    with pytest.raises(RuntimeError, match=r"^mxshard: keep a converted weight's Parameter: load values into it"):
        model(torch.randn(2, 40))


@pytest.mark.parametrize("zero", ["opt", "model", "none"])
def test_sharded_optimizer_any_zero_grad_habit_trains_alike(zero):
    """opt.zero_grad(), model.zero_grad() (HF Trainer's habit, which cannot reach ShardedOptimizer's
    buffers) or none: step() consumes the gradients, so the three loops give the same bytes."""
    def run(mode):
        model = build()
        opt = mxt.ShardedOptimizer(model, lambda g: torch.optim.SGD(g, lr=0.1))
        try:
            for s in range(3):
                g = torch.Generator().manual_seed(s)
                model(torch.randn(8, 40, generator=g)).pow(2).mean().backward()
                opt.step()
                if mode == "opt":
                    opt.zero_grad()
                elif mode == "model":
                    model.zero_grad()
            return u8(held_plane(model.up, "row_data")).clone(), u8(held_plane(model.down, "row_data")).clone()
        finally:
            opt.close()
    want, got = run("opt"), run(zero)
    assert all(torch.equal(a, b) for a, b in zip(want, got))


def test_clip_grad_norm_under_sharded_optimizer_says_what_to_use():
    """Item 4: torch.nn.utils.clip_grad_norm_(model.parameters()) under ShardedOptimizer raises,
    naming max_grad_norm (it used to return 0 and clip nothing); gradient accumulation through the
    same .grad still adds into the bucket, and the masters match a loop without the failed clip."""
    def run(try_clip):
        model = build()
        opt = mxt.ShardedOptimizer(model, lambda g: torch.optim.SGD(g, lr=0.1), max_grad_norm=0.5)
        try:
            for s in range(2):
                g = torch.Generator().manual_seed(s)
                with opt.no_sync():
                    model(torch.randn(8, 40, generator=g)).pow(2).mean().backward()
                model(torch.randn(8, 40, generator=g)).pow(2).mean().backward()
                if try_clip:
                    with pytest.raises(RuntimeError, match=r"^ShardedOptimizer: clip with ShardedOptimizer\(\.\.\., "
                                                           r"max_grad_norm=\.\.\.\)"):
                        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    with pytest.raises(RuntimeError, match="opt.last_grad_norm"):
                        model.head.bias.grad.norm()
                opt.step()
                opt.zero_grad()
                assert model.head.bias.grad is None
            return u8(held_plane(model.up, "row_data")).clone(), u8(model.head.bias.detach()).clone(), opt.last_grad_norm
        finally:
            opt.close()
    a, b = run(False), run(True)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and a[2] == b[2]


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_assigning_weight_data_takes_effect_like_on_a_plain_linear(fmt, dtype):
    """`weight.data = t` (Hugging Face's _init_weights idiom: trunc_normal_ of an fp32 copy, then
    `.to(weight.dtype)`, a new tensor on a bf16 model) used to be a silent no-op: the master is now
    t's values, the next forward uses their quantization, later writes into t are seen (t is the
    storage, as for a plain Parameter), and the optimizer keeps training the same Parameter."""
    def init(m):
        torch.manual_seed(7)
        w = m.up.weight
        w.data = nn.init.trunc_normal_(w.data.to(torch.float32), std=1e-3).to(w.dtype)
    torch.manual_seed(0)
    plain = Net().to(dtype)
    init(plain)
    model = build(format=fmt, policy={"up": "both", "down": "row"}).to(dtype)
    param = model.up.weight
    init(model)
    assert model.up.weight is param and isinstance(param, mxt.QuantMaster) and param.dtype == dtype
    assert torch.equal(param.detach()._data, plain.up.weight.detach())
    assert param.abs().max().item() < 1e-2 and torch.equal(param.detach(), plain.up.weight.detach())
    assert_primary_is_whole_quantize(model.up)
    deq = mxt.dequantized_weight(model.up)
    assert deq.abs().max().item() < 1e-2
    # t itself is the master's storage (a contiguous tensor of the master's dtype), as for nn.Linear
    t = torch.zeros(72, 40, dtype=dtype)
    model.up.weight.data = t
    assert mxt.dequantized_weight(model.up).abs().max().item() == 0
    t.fill_(0.5)
    assert torch.equal(mxt.dequantized_weight(model.up), torch.full((72, 40), 0.5))
    # another dtype: its values in the master's dtype
    model.up.weight.data = torch.full((72, 40), 0.25, dtype=torch.float64)
    assert param.dtype == dtype and torch.equal(mxt.dequantized_weight(model.up), torch.full((72, 40), 0.25))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(4, 40, dtype=dtype)).float().sum().backward()
    opt.step()
    assert not torch.equal(param.detach()._data, torch.full((72, 40), 0.25, dtype=dtype))
    assert_primary_is_whole_quantize(model.up)


def test_vector_to_parameters_then_deepcopy_and_save():
    """torch.nn.utils.vector_to_parameters assigns each parameter `.data` a view of the vector at an
    offset: the masters take the values (the forward uses them), and the model still deep-copies
    and saves (both raised "invalid python storage" on the wrapper the offset was carried into)."""
    import io
    from torch.nn.utils import parameters_to_vector, vector_to_parameters
    model = build()
    vec = parameters_to_vector(model.parameters())
    vector_to_parameters(vec * 0.5, model.parameters())
    assert torch.equal(parameters_to_vector(model.parameters()), vec * 0.5)
    assert_primary_is_whole_quantize(model.up)
    x = torch.randn(3, 40)
    twin = copy.deepcopy(model)
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    for other in (twin, loaded):
        assert torch.equal(other(x), model(x))


def test_assigning_weight_data_of_another_shape_says_what_to_do_first():
    model = build()
    with pytest.raises(ValueError, match=r"^mxshard: assign a tensor of the weight's shape \(72, 40\) to up.weight"):
        model.up.weight.data = torch.zeros(40, 72)
    with pytest.raises(TypeError, match=r"^mxshard: assign a floating-point tensor to up.weight.data"):
        model.up.weight.data = torch.zeros(72, 40, dtype=torch.int32)
    assert_primary_is_whole_quantize(model.up)
    with torch.device("meta"):
        meta = Net()
    meta = mxt.convert(meta, {"up": "both", "down": "row"})
    with pytest.raises(RuntimeError, match=r"^mxshard: materialise up.weight with model.to_empty\(device=...\)"):
        meta.up.weight.data = torch.zeros(72, 40)   # (torch refuses a plain meta Parameter this too)
    assert meta.up.weight.is_meta and meta.up.weight.detach()._data.is_meta


@pytest.mark.parametrize("fmt,policy", [("mxfp8", "both"), ("nvfp4", "row")])
def test_a_sharded_optimizer_state_dict_into_a_converted_model_names_the_checkpoint_tools(fmt, policy):
    """model.state_dict() of a model under ShardedOptimizer holds each converted weight as a plain
    fp32 tensor (its dequantized row plane: the values the forward multiplies by), no planes, so a
    convert()ed model loads it as an ordinary weight (strict). A state dict in the old form (the
    removed ShardedOptimizer linears' row_data, row_scale, ... and no weight) still raises, naming
    save_checkpoint / load_checkpoint and export_safetensors / load_safetensors, instead of torch's
    missing / unexpected keys (or, with strict=False, silently keeping the old weights)."""
    torch.manual_seed(0)
    model = mxt.convert(Net(), {"up": policy, "down": "row"}, format=fmt)
    opt = mxt.ShardedOptimizer(model, lambda groups: torch.optim.AdamW(groups, lr=1e-3))
    sd = model.state_dict()
    assert not any(k.endswith(("row_data", "row_scale", "col_data", "col_scale", "amax")) for k in sd)
    for n in ("up", "down"):
        t = sd[n + ".weight"]
        assert type(t) is torch.Tensor and t.dtype == torch.float32
        assert torch.equal(t, mxt.dequantized_weight(model.get_submodule(n)))
    fresh = build(seed=3, format=fmt, policy={"up": policy, "down": "row"})
    fresh.load_state_dict(sd)
    for n in ("up", "down"):
        assert torch.equal(fresh.get_submodule(n).weight.detach()._data, sd[n + ".weight"])
    opt.close()
    # the old form: the planes of the removed linears, no weight
    old = {k: v for k, v in sd.items() if k != "up.weight"}
    old["up.row_data"] = torch.zeros(72, 40, dtype=torch.uint8)
    old["up.row_scale"] = torch.zeros(72, 2, dtype=torch.uint8)
    words = r"^mxshard: save and load a ShardedOptimizer model with mxshard.torch.save_checkpoint / load_checkpoint"
    for strict in (True, False):
        fresh = build(seed=3, format=fmt, policy={"up": policy, "down": "row"})
        with pytest.raises(RuntimeError, match=words + r".*export_safetensors / load_safetensors"):
            fresh.load_state_dict(old, strict=strict)



def test_convert_of_a_tied_weight_says_what_to_do_first():
    tied = nn.ModuleDict({"emb": nn.Embedding(5, 24), "up": nn.Linear(24, 24), "head": nn.Linear(24, 5, bias=False)})
    tied["emb"].weight = tied["head"].weight
    first = r"^convert: keep head dense \(leave it out of the policy, or skip=\['head'\]\): its weight is shared"
    with pytest.raises(ValueError, match=first):
        mxt.convert(tied, "row")
    out = mxt.convert(tied, "row", skip=["head"])
    assert type(out["head"]) is nn.Linear and isinstance(out["up"], mxt.MXFP8ParamLinear)


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_a_float64_master_says_to_cast_back(fmt):
    """model.double() casts a converted weight's master to float64, which the writeback does not
    read: the forward raises saying what to do, and model.float() trains again."""
    m = nn.Sequential(nn.Linear(64, 96), nn.GELU(), nn.Linear(96, 64))
    mxt.convert(m, "row", format=fmt)
    m.double()
    with pytest.raises(ValueError, match=r"^mxshard: keep 0\.weight in float32, bfloat16 or float16"):
        m(torch.randn(4, 64, dtype=torch.float64))
    m.float()
    m(torch.randn(4, 64)).sum().backward()
    assert m[0].weight.grad is not None and m[0].weight.grad.dtype == torch.float32


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_share_memory_shares_the_master_and_keeps_training(fmt):
    """weight.share_memory_() and model.share_memory() (torch.multiprocessing's Hogwild habit)
    move the master's values into shared memory (the wrapper has no storage of its own: torch's
    own share_memory_ crashed on it), change nothing the forward computes, and the model then
    trains like a twin that was never shared (the bytes follow the master)."""
    model, twin = build(format=fmt), build(format=fmt)
    x, y = torch.randn(16, 40), torch.randn(16, 5)
    y0 = model(x)
    w = model.up.weight
    assert w.share_memory_() is w
    assert w.is_shared() and w._data.is_shared()
    assert not model.down.weight.is_shared()
    assert model.share_memory() is model
    for m in (model.up, model.down):
        assert isinstance(m.weight, mxt.QuantMaster) and m.weight.is_shared()
    assert torch.equal(model(x), y0)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (model, twin)]
    for _ in range(3):
        for m, opt in zip((model, twin), opts):
            F.mse_loss(m(x), y).backward()
            opt.step()
            opt.zero_grad()
    assert not torch.equal(model(x), y0)
    assert torch.equal(model(x), twin(x))
    assert_primary_is_whole_quantize(model.up)


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
@pytest.mark.parametrize("path", ["eager", "op"])
def test_double_backward_says_to_keep_the_layer_dense(fmt, path):
    """create_graph=True (a gradient penalty) through a converted linear: its backward multiplies
    by the quantized planes outside autograd, so a second backward would silently miss the terms
    through the weight; it raises instead, naming the layer to leave out of the policy, on the
    eager path and on the custom op's (torch.compile's) autograd alike."""
    model = build(format=fmt)
    x = torch.randn(4, 40, requires_grad=True)
    if path == "eager":
        y = model.up(x)
    else:
        up = model.up
        y = torch.ops.mxshard.param_linear(x.to(up.spec.compute_dtype), up.weight,
                                           up.bias.to(up.spec.compute_dtype), up._plan)
    with pytest.raises(RuntimeError, match=r"^mxshard: keep layers that need double backward \(create_graph=True"
                                           r".*leave up out of convert\(\)'s policy"):
        torch.autograd.grad(y.square().sum(), x, create_graph=True)


@pytest.mark.parametrize("reentrant", [True, False])
def test_activation_checkpointing_still_trains_like_eager(reentrant):
    """torch.utils.checkpoint (reentrant or not) recomputes the forward with grad mode on, but runs
    the converted linears' backward without create_graph: not a double backward, the same grads."""
    a, b = build(), build()
    x = torch.randn(6, 40)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()   # (reentrant needs an input that does)
    a(xa).square().sum().backward()
    torch.utils.checkpoint.checkpoint(b, xb, use_reentrant=reentrant).square().sum().backward()
    assert torch.equal(xa.grad, xb.grad)
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p.grad, q.grad), n


def test_first_order_grads_with_a_dense_layer_kept_out_of_the_policy():
    """The advice works: the layer a gradient penalty needs twice stays an nn.Linear, the others
    convert, and the double backward reaches the dense layer's weight."""
    model = build(policy={"down": "row"})
    assert type(model.up) is nn.Linear
    x = torch.randn(4, 40, requires_grad=True)
    g, = torch.autograd.grad(model.up(x).square().sum(), x, create_graph=True)
    g.square().sum().backward()
    assert model.up.weight.grad is not None and model.up.weight.grad.abs().sum() > 0


def test_converting_a_converted_model_again_says_it_is_already_converted():
    """convert() twice on one model: the same policy says the model is already converted (not
    'converts no nn.Linear'); another spec for a converted linear raises even with strict=False
    (it used to keep the first spec silently); separate submodules in separate calls, and the
    documented two-format model (the second call sees only the linears the first left dense), work."""
    model = build(policy="row")
    first = r"^convert: the model is already converted \(up, down, head: MXFP8 'row'\); convert a model once"
    with pytest.raises(ValueError, match=first):
        mxt.convert(model, "row")
    assert mxt.convert(model, "row", strict=False) is model   # the same spec: nothing to do
    for kw in ({}, {"strict": False}):
        with pytest.raises(ValueError, match=first + r".*up -> MXFP8 'both'"):
            mxt.convert(model, "both", **kw)
        with pytest.raises(ValueError, match=first + r".*down -> MXFP8 'row' \(layout='compact'\)"):
            mxt.convert(model, {"down": "row"}, layout="compact", **kw)
    assert all(m.spec.planes == "row" and m.spec.layout == "padded" for m in (model.up, model.down, model.head))
    torch.manual_seed(0)
    net = Net()
    mxt.convert(net, {"up": "both"})
    mxt.convert(net, {"down": "row", "head": "row"})
    assert (net.up.spec.planes, net.down.spec.planes, net.head.spec.planes) == ("both", "row", "row")
    mixed = build(policy={"up": "row"})
    mxt.convert(mixed, "both", format="nvfp4")   # the rest as NVFP4
    assert (mixed.up.spec.format, mixed.down.spec.format, mixed.down.spec.planes) == ("mxfp8", "nvfp4", "both")


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_torch_func_transforms_and_parametrizations_say_to_keep_the_layer_dense(fmt):
    """torch.func transforms (vmap, jacrev, grad of functional_call) and parametrizations
    (weight_norm, spectral_norm) cannot run through a converted linear: each raises at the
    forward, saying to leave the layer out of convert(); ShardedOptimizer's linears too."""
    def build():
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(64, 96), nn.GELU(), nn.Linear(96, 64))
        mxt.convert(m, "row", format=fmt)
        return m
    x, y = torch.randn(16, 64), torch.randn(16, 64)
    m = build()
    p = dict(m.named_parameters())
    transforms = [lambda: torch.func.vmap(m)(x.unsqueeze(0).expand(3, 16, 64)),
                  lambda: torch.func.jacrev(m)(x[:1]),
                  lambda: torch.func.grad(lambda q: F.mse_loss(torch.func.functional_call(m, q, (x,)), y))(p)]
    for run in transforms:
        with pytest.raises(RuntimeError, match=r"^mxshard: leave 0 out of convert\(\) \(skip=\[\.\.\.\]\) to run "
                                               r"torch\.func transforms"):
            run()
    assert torch.equal(torch.func.functional_call(m, p, (x,)), m(x))   # its own parameters: fine
    m = build()
    torch.nn.utils.parametrizations.weight_norm(m[0])
    with pytest.raises(RuntimeError, match=r"^mxshard: keep linears you parametrize .* dense: leave 0 out of"):
        m(x)
    # spectral_norm's registration runs its power method (torch.mv) on the weight itself: a product with
    # the master, refused there, at once, with the same advice (keep the layer dense)
    m = build()
    with pytest.raises(RuntimeError, match=r"^mxshard: call the module to multiply by 0\.weight \(0\(x\)\), or keep "
                                           r"0 dense \(convert\(\.\.\., skip=\['0'\]\)\)"):
        torch.nn.utils.parametrizations.spectral_norm(m[0])
    m = build()
    o = mxt.ShardedOptimizer(m, lambda g: torch.optim.SGD(g, lr=0.1))
    with pytest.raises(RuntimeError, match=r"to run torch\.func transforms"):
        torch.func.vmap(m)(x.unsqueeze(0).expand(3, 16, 64))
    o.close()

# SPDX-License-Identifier: MIT
"""MXFP8ParamLinear (convert(...)) without FSDP2, in this process:
what a torch user does to an nn.Linear and its weight Parameter works, the
forward reads exactly the whole-tensor quantize of the master, and what
cannot work fails with a message that says what to do. Skips without torch
or the host library."""
import io

import pytest

from conftest import torch_lib_or_skip


def _mods():
    torch = torch_lib_or_skip()
    import mxshard
    import mxshard.torch as mxt
    return torch, mxshard, mxt


def _model(torch, planes="row", layout="padded", dtype=None, **kw):
    nn = torch.nn
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(40, 33), nn.GELU(), nn.Linear(33, 7, bias=False))
    if dtype is not None:
        m = m.to(dtype)
    import mxshard.torch as mxt
    return mxt.convert(m, {"0": planes, "2": "row"}, layout=layout, compute_dtype=torch.float32, **kw)


def _whole(torch, mxshard, lin, plane="row"):
    """The row (or col) plane of the whole-tensor quantize of the module's master, dequantized to f32."""
    s = lin.spec
    w = mxshard.MXFP8Weight.empty(lin.out_features, lin.in_features, planes=s.planes, layout=s.layout, device="cpu")
    mxshard.quantize(w, lin.weight._data.detach().to(torch.bfloat16), rounding=s.rounding)
    return mxshard.dequantize(w, plane=plane, dtype="f32")


@pytest.mark.parametrize("planes,layout", [("row", "padded"), ("both", "swizzled"), ("both", "compact")])
def test_forward_and_backward_read_the_whole_tensor_quantize(planes, layout):
    torch, mxshard, mxt = _mods()
    m = _model(torch, planes, layout)
    lin = m[0]
    assert isinstance(lin, torch.nn.Linear) and isinstance(lin.weight, torch.nn.Parameter)
    assert isinstance(lin.weight, mxt.QuantMaster) and lin.weight.dtype == torch.float32
    x = torch.randn(5, 40, requires_grad=True)
    y = lin(x)
    w = _whole(torch, mxshard, lin)
    assert torch.equal(y, torch.nn.functional.linear(x.detach(), w, lin.bias.detach()))
    assert torch.equal(mxt.dequantized_weight(lin), w)
    gy = torch.randn_like(y)
    y.backward(gy)
    wd = _whole(torch, mxshard, lin, "col" if planes == "both" else "row")
    assert torch.equal(x.grad, gy @ wd)
    assert torch.allclose(lin.weight.grad, gy.t() @ x.detach(), rtol=1e-6, atol=1e-6)
    assert lin.weight.grad.dtype == torch.float32 and lin.weight.grad.shape == (33, 40)


def test_torch_optim_steps_requantize_and_parameter_tooling_works():
    torch, mxshard, mxt = _mods()
    m = _model(torch)
    n = sum(p.numel() for p in m.parameters())
    assert n == 40 * 33 + 33 + 33 * 7          # weights count as parameters
    opt = torch.optim.AdamW(m.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5)
    x = torch.randn(6, 40)
    before = mxt.dequantized_weight(m[0]).clone()
    m(x).square().sum().backward()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
    opt.step()
    sched.step()
    opt.zero_grad()
    after = mxt.dequantized_weight(m[0])
    assert not torch.equal(before, after) and torch.equal(after, _whole(torch, mxshard, m[0]))
    # HF-style initialisation through .data, nn.init
    with torch.no_grad():
        m[0].weight.data.normal_(0.0, 0.02)
        torch.nn.init.zeros_(m[2].weight)
    assert torch.equal(mxt.dequantized_weight(m[0]), _whole(torch, mxshard, m[0]))
    assert torch.count_nonzero(mxt.dequantized_weight(m[2])) == 0


def test_state_dict_holds_plain_tensors_and_round_trips():
    torch, mxshard, mxt = _mods()
    m = _model(torch, "both")
    sd = m.state_dict()
    assert type(sd["0.weight"]) is torch.Tensor and sd["0.weight"].dtype == torch.float32
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    m2 = _model(torch, "both")
    with torch.no_grad():
        m2[0].weight.mul_(3)
    m2.load_state_dict(loaded)
    assert isinstance(m2[0].weight, mxt.QuantMaster)
    for a, b in zip(m.parameters(), m2.parameters()):
        assert torch.equal(a.detach(), b.detach())
    x = torch.randn(4, 40)
    assert torch.equal(m(x), m2(x))
    # bf16 masters: .to(dtype) keeps the subclass
    mb = m.to(torch.bfloat16)
    assert isinstance(mb[0].weight, mxt.QuantMaster) and mb[0].weight.dtype == torch.bfloat16
    assert torch.equal(mxt.dequantized_weight(mb[0]), _whole(torch, mxshard, mb[0]))


# both formats, both plane sets; inductor (the default backend) once, aot_eager (the same tracing and
# autograd, no C++ code generation: seconds less on 2 cores) for the other
@pytest.mark.parametrize("fmt,planes,backend", [("mxfp8", "both", "inductor"), ("nvfp4", "row", "aot_eager")])
def test_torch_compile_traces_through_the_converted_linears(fmt, planes, backend):
    """torch.compile of a block with converted linears (issue 35): no graph break at them
    (torch._dynamo.explain), and the compiled forward and backward equal eager bit for bit (ReLU
    and a residual add between them: ops whose compiled code rounds as eager's does)."""
    torch, mxshard, mxt = _mods()
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = nn.Linear(40, 64), nn.Linear(64, 40, bias=False)

        def forward(self, x):
            return x + self.down(torch.relu(self.up(x)))

    def build():
        torch.manual_seed(0)
        return mxt.convert(Block(), planes, format=fmt, compute_dtype=torch.float32)
    x = torch.randn(6, 40)
    eager, comp = build(), build()
    ex = torch._dynamo.explain(comp)(x)
    assert ex.graph_break_count == 0, [str(r.reason) for r in ex.break_reasons]
    ye = eager(x)
    ye.pow(2).sum().backward()
    # inductor's whole pipeline (lowering, scheduling, C++ code generation and compilation), its
    # generated C++ scalar rather than vectorized: g++ then compiles it in seconds instead of
    # ~45 s on 2 cores (the ATen vector headers), and the ops between the linears round alike
    with torch._inductor.config.patch({"cpp.vec_isa_ok": False}):
        cm = torch.compile(comp, backend=backend)
        yc = cm(x)
        yc.pow(2).sum().backward()
        assert torch.equal(ye, yc)
        for (n, a), (_, b) in zip(eager.named_parameters(), comp.named_parameters()):
            assert torch.equal(a.grad, b.grad), n
        # a step, then the compiled module sees the new bytes (the plan reads the current master)
        for mod in (eager, comp):
            torch.optim.SGD(mod.parameters(), lr=0.1).step()
        assert torch.equal(eager(x), cm(x))


def test_torch_compile_of_a_model_with_gelu_runs():
    torch, mxshard, mxt = _mods()
    m = _model(torch)
    x = torch.randn(3, 40)
    torch.testing.assert_close(torch.compile(m)(x), m(x))   # inductor's GELU rounds its own way


def test_what_cannot_work_fails_clearly():
    torch, mxshard, mxt = _mods()
    m = _model(torch)
    m[2].weight = torch.nn.Parameter(torch.zeros(7, 33))          # a tie / assign=True / a new Parameter
    with pytest.raises(RuntimeError, match="replaced"):
        m(torch.randn(2, 40))
    m = _model(torch)
    with pytest.raises(ValueError, match="in_features=40"):
        m[0](torch.randn(2, 39))
    from mxshard.torch.fsdp.gathered import GatheredWeight, _Box
    # FSDP2's gathered weight (its box has the gathers' mesh; any object stands for one here)
    gathered = GatheredWeight((33, 40), torch.float32, torch.device("cpu"), _Box(m[0].weight, object()))
    first = r"^mxshard: call reshard\(\) on the fully_shard module that holds 0\.weight .*before reading 0\.weight:"
    with pytest.raises(NotImplementedError, match=first + ".*gathered MXFP8 weight.*dequantized_weight"):
        gathered.sum()
    with pytest.raises(NotImplementedError, match=first):   # (a copy out of it names the weight too)
        torch.empty(33, 40).copy_(gathered)
    # ShardedOptimizer's replicated weight (a box without a mesh) says how to write and read it instead
    held = GatheredWeight((33, 40), torch.float32, torch.device("cpu"), _Box(m[0].weight, None))
    second = (r"^mxshard: write 0\.weight through model\.load_state_dict\(sd\) and then opt\.masters_from_model\(\) "
              r"on every rank .*dequantized_weight\(module\): under ShardedOptimizer it is the replicated MXFP8 weight")
    with pytest.raises(NotImplementedError, match=second):
        held.sum()


def test_convert_strict_rejects_patterns_that_match_nothing():
    torch, mxshard, mxt = _mods()
    nn = torch.nn
    m = nn.Module()
    m.blocks = nn.ModuleList(nn.ModuleDict({"mlp": nn.Linear(8, 8)}) for _ in range(2))
    with pytest.raises(ValueError, match="'block.\\*.mlp' matches no nn.Linear.*strict=False"):
        mxt.convert(m, {"block.*.mlp": "row"})
    with pytest.raises(ValueError, match="skip pattern"):
        mxt.convert(m, "row", skip="nothing.*")
    assert mxt.convert(m, {"block.*.mlp": "row"}, strict=False) is m     # nothing converted, allowed
    assert type(m.blocks[0]["mlp"]) is nn.Linear
    mxt.convert(m, {"blocks.*.mlp": "row"})
    assert all(mxt.is_param_linear(b["mlp"]) for b in m.blocks)


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_built_linears_weight_is_the_master_and_read_only_under_sharded_optimizer(fmt):
    """MXFP8Linear / NVFP4Linear(in, out) build convert()'s linear (the removed buffer linears'
    names): .weight is the master Parameter, writes through it (HF-style .data.normal_(), nn.init)
    reach the bytes the forward uses. Under ShardedOptimizer the weight is its replicated quantized
    weight: the same writes raise, saying to write through load_state_dict + masters_from_model and
    to read with dequantized_weight, and a refused write changes nothing."""
    torch, mxshard, mxt = _mods()
    cls, param_cls = (mxt.MXFP8Linear, mxt.MXFP8ParamLinear) if fmt == "mxfp8" else \
        (mxt.NVFP4Linear, mxt.NVFP4ParamLinear)
    m = cls(40, 16)
    assert type(m) is param_cls and isinstance(m, cls) and not isinstance(m, (mxt.NVFP4Linear if fmt == "mxfp8"
                                                                               else mxt.MXFP8Linear))
    w = m.weight
    assert isinstance(w, torch.nn.Parameter) and isinstance(w, mxt.QuantMaster)
    assert tuple(w.shape) == (16, 40) and w.dtype == torch.float32
    x = torch.randn(3, 40)
    deq = mxt.dequantized_weight(m)
    assert torch.equal(m(x), torch.nn.functional.linear(x.to(m.compute_dtype), deq.to(m.compute_dtype),
                                                        m.bias.to(m.compute_dtype)).float())
    with torch.no_grad():
        m.weight.data.normal_()
    assert not torch.equal(mxt.dequantized_weight(m), deq)
    torch.nn.init.zeros_(m.weight)
    assert torch.count_nonzero(mxt.dequantized_weight(m)) == 0
    torch.nn.init.normal_(m.weight)
    model = torch.nn.Sequential(m)
    opt = mxt.ShardedOptimizer(model, lambda g: torch.optim.SGD(g, lr=0.1))
    before = mxt.dequantized_weight(m).clone()
    words = r"^mxshard: write 0\.weight through model\.load_state_dict\(sd\) and then opt\.masters_from_model\(\)"
    for write in (lambda: m.weight.data.normal_(), lambda: torch.nn.init.zeros_(m.weight)):
        with pytest.raises(NotImplementedError, match=words):
            write()
    with pytest.raises(NotImplementedError, match=r"^mxshard: call the module to multiply by 0\.weight \(0\(x\)\).*"
                                                  r"under ShardedOptimizer it is the replicated " + fmt.upper()):
        m.weight.t().mul_(2)
    assert torch.equal(mxt.dequantized_weight(m), before), "a refused write changed the weight"
    opt.close()

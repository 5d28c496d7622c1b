# SPDX-License-Identifier: MIT
"""ShardedOptimizer behaves like a torch.optim optimizer, or says why not
(issue 24), in a world of one in this process: it IS a torch.optim.Optimizer
whose param groups are the inner optimizer's (schedulers, hooks,
zero_grad(set_to_none)); a step without gradients changes nothing; writes
into the model's weights are refused until the optimizer is told;
torch.distributed.checkpoint's state_dict helpers, inner optimizers that are
not elementwise and bad grad dtypes raise, naming what to use; bf16 gradient
buffers; a failed construction leaves nothing alive. The same across gloo
ranks: test_torch_optim.py (torch_optim_habit_cases).

Under the thin ShardedOptimizer a converted linear's weight is a replicated
GatheredWeight Parameter: its gradient arrives in weight.grad (autograd) and
goes into the rank-major buffers opt._grad[b] (this rank's reduced part:
opt._shard[b]; the masters: opt._master[b], an item's rows
opt.buckets[b].view(buf, pos, rank)); a write into a converted weight is
model.load_state_dict(...) then opt.masters_from_model()."""
import contextlib
import copy
import gc
import os
import tempfile
import warnings

import pytest

from conftest import gloo_or_skip, raises_untouched


@pytest.fixture(scope="module")
def C():
    gloo_or_skip(host_lib=True)
    import torch.distributed as dist
    if dist.is_initialized():
        pytest.skip("torch.distributed is initialised in the test process")
    import torch_dist_cases
    return torch_dist_cases


@pytest.fixture(scope="module")
def HC(C):
    import torch_optim_habit_cases
    return torch_optim_habit_cases


def _adamw(g):
    import torch
    return torch.optim.AdamW(g, lr=1e-2, weight_decay=0.1)



def test_is_a_torch_optimizer_sharing_the_inner_groups_and_state(C):
    import torch
    from mxshard.torch import ShardedOptimizer
    m = C.build_model()
    o = ShardedOptimizer(m, _adamw, bucket_size=2500)
    assert isinstance(o, torch.optim.Optimizer)
    assert o.param_groups is o.inner.param_groups and o.state is o.inner.state and o.defaults is o.inner.defaults
    calls = []
    o.register_step_pre_hook(lambda *a: calls.append("pre"))
    o.register_step_post_hook(lambda *a: calls.append("post"))
    C.inject(m, 0, 0)
    o.step()
    assert calls == ["pre", "post"] and len(o.state) == len(o.inner.param_groups[0]["params"])
    with pytest.raises(NotImplementedError, match="param_groups="):
        o.add_param_group({"params": [torch.zeros(2)]})
    with pytest.raises(TypeError, match="save_checkpoint"):
        copy.deepcopy(o)
    o.close()


def test_lr_scheduler_drives_the_inner_learning_rate(C):
    """LambdaLR(opt): the inner optimizer runs with the scheduled lr (masters
    bit-identical to a plain AdamW driven by the same schedule), and no
    'scheduler.step() before optimizer.step()' warning."""
    import torch
    from mxshard.torch import ShardedOptimizer
    factory = C.FACTORIES["adamw"](False)
    m = C.build_model()
    o = ShardedOptimizer(m, factory, bucket_size=2500, param_groups=C.groups_of(m))
    ref = C.Reference(C.build_model(), factory, True, 1)
    sched = [torch.optim.lr_scheduler.LambdaLR(x, lambda s: 0.5 ** s) for x in (o, ref.inner)]
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for s in range(3):
            C.inject(m, s, 0)
            o.step()
            ref.step(s)
            for sc in sched:
                sc.step()
            o.zero_grad()
    assert not [x for x in w if "lr_scheduler" in str(x.message)], [str(x.message) for x in w]
    assert o.inner.param_groups[0]["lr"] == pytest.approx(1e-2 * 0.5 ** 3)
    C.check_masters(o, ref.values())
    C.check_weights(m, ref.values())


def test_zero_grad_honours_set_to_none(C):
    import torch
    from mxshard.torch import ShardedOptimizer
    m = C.build_model()
    o = ShardedOptimizer(m, _adamw, bucket_size=2500)
    g = torch.ones_like(m.ln.weight)
    m.ln.weight.grad = g                      # a gradient set outside the hooks
    gb = torch.ones(m.b.weight.shape)         # a converted weight's, set outside the hooks (was main_grad)
    m.b.weight.grad = gb
    for t in o._grad:                         # what the hooks add during a backward
        t.fill_(1.0)
    for t in o._shard:
        t.fill_(1.0)
    o.zero_grad(set_to_none=False)
    assert m.ln.weight.grad is g and not g.any(), "set_to_none=False must zero .grad in place"
    assert m.b.weight.grad is gb and not gb.any(), "set_to_none=False must zero a converted weight's .grad in place"
    assert all(not t.any() for t in o._grad) and all(not t.any() for t in o._shard)
    # a gradient the hooks took (HeldGrad) goes: the bucket holds it, and the bucket was zeroed
    C.inject(m, 0, 0)
    o.step()
    m.h.grad = torch.ones_like(m.h)
    o._flush([])
    assert type(m.h.grad).__name__ == "HeldGrad" and any(t.any() for t in o._grad)
    o.zero_grad(set_to_none=False)
    assert m.h.grad is None and all(not t.any() for t in o._grad)
    o.zero_grad()
    assert m.ln.weight.grad is None and m.b.weight.grad is None


def test_step_without_gradient_changes_nothing(C, HC):
    """No gradient written since zero_grad() (or since the last step): step()
    changes nothing. A gradient written straight into main_grad (no hook)
    counts (was: written into main_grad; now: a converted weight's .grad set outside the hooks).
    Granularity is the step: an item without gradient in a step
    where others have one is stepped with a zero gradient (weight decay)."""
    import torch
    from mxshard.torch import ShardedOptimizer
    m = C.build_model()
    o = ShardedOptimizer(m, _adamw, bucket_size=2500)
    before = HC.snapshot(m, o)
    o.step()                                   # never a backward
    assert not HC.same(before, HC.snapshot(m, o)) and o.last_grad_norm is None
    C.inject(m, 0, 0)
    o.step()
    after_one = HC.snapshot(m, o)
    o.step()                                   # no zero_grad, no backward: the gradient was consumed
    assert not HC.same(after_one, HC.snapshot(m, o))
    o.zero_grad()
    o.step()
    assert not HC.same(after_one, HC.snapshot(m, o))
    m.c.weight.grad = torch.full(m.c.weight.shape, 2.0 ** -10)   # only c, no hook fired
    h_before = m.h.detach().clone()
    o.step()
    assert o.steps == 2, "a gradient set straight into a converted weight's .grad did not count"
    assert not torch.equal(m.h.detach(), h_before), "an item without gradient is stepped (weight decay)"


def test_writes_into_the_model_are_refused_until_told_nvfp4(C, HC):
    """NVFP4 weights (amax and scale buffers) under the same guard:
    model.load_state_dict() -> step() raises and changes nothing;
    masters_from_model() -> the loaded primaries, dequantized, are the masters."""
    import torch
    from mxshard.torch import ShardedOptimizer
    m = _nv_model()
    o = ShardedOptimizer(m, _adamw, bucket_size=1000)
    assert {it.kind for it in o.items} >= {"nvfp4_row", "nvfp4_both", "mxfp8_both", "dense"}
    C.inject(m, 0, 0)
    o.step()
    o.zero_grad()
    sd3 = _nv_model(seed=3).state_dict()
    m.load_state_dict(sd3)
    before = HC.snapshot(m, o)
    C.inject(m, 1, 0)
    with pytest.raises(RuntimeError, match=r"^ShardedOptimizer.step: call opt.masters_from_model\(\)"):
        o.step()
    assert not HC.same(before, HC.snapshot(m, o))
    # the loaded values: a converted weight's is the saved row plane dequantized (what state_dict() holds)
    loaded = {n: sd3[n].float().reshape(-1).clone() for n, _ in C.item_table(m)}
    o.masters_from_model()
    assert all(getattr(x, "_mxs_loaded", None) is None for x in m.modules()), "masters_from_model kept a copy"
    full = C.full_masters(o)
    for n, v in loaded.items():   # (the writeback then quantizes them: NVFP4 values may move by one rounding)
        assert torch.equal(full[n], v), f"{n}: the master is not the loaded (dequantized) value"
    o.zero_grad()
    C.inject(m, 2, 0)
    o.step()
    assert o.steps == 2


# every plane set x block x layout of torch_nvfp4_cases.NV_MODULES[:4] + [8:10] (that module still
# imports the removed zero.layout): (planes, block, layout, (in, out))
_NV = [("row", "1x16", "compact", (33, 17)), ("row", "1x16", "padded", (16, 8)), ("row", "1x16", "swizzled", (40, 3)),
       ("row", "16x16", "compact", (9, 5)), ("both", "1x16", "swizzled", (32, 32)),
       ("both", "16x16", "compact", (1, 1))]


def _nv_model(seed=0):
    """NVFP4 linears of odd shapes, an MXFP8 one, an Embedding, a LayerNorm, a bf16 parameter
    and a frozen one (torch_nvfp4_cases.build_model's)."""
    import torch
    from torch import nn
    from mxshard.torch import MXFP8Linear, NVFP4Linear
    torch.manual_seed(seed)
    m = nn.Module()
    m.emb = nn.Embedding(5, 12)
    for i, (planes, block, layout, (inf, outf)) in enumerate(_NV):
        setattr(m, f"nv{i}", NVFP4Linear(inf, outf, bias=i % 3 != 0, planes=planes, block=block, layout=layout))
    m.mx = MXFP8Linear(40, 9, planes="both", layout="padded")
    m.ln = nn.LayerNorm(17)
    m.h = nn.Parameter(torch.randn(3, 5).to(torch.bfloat16))
    m.frozen = nn.Parameter(torch.randn(3), requires_grad=False)
    return m


def test_dcp_state_dict_helpers_raise_naming_save_checkpoint(C, HC):
    """torch.distributed.checkpoint.state_dict's get_state_dict / set_state_dict map the optimizer's
    parameters to the model's by identity (ShardedOptimizer's are master shards: a KeyError deep in
    torch): they raise, naming mxt.save_checkpoint / load_checkpoint, and change nothing. Changed by
    design: dcp.save / dcp.load of {"optim": opt} (a Stateful whose state_dict() is DCP's form) work:
    the load restores the saved masters, inner state, steps and weights bit for bit."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from mxshard.torch import ShardedOptimizer
    m = C.build_model()
    o = ShardedOptimizer(m, _adamw, bucket_size=2500)
    for stepped in (False, True):
        before = HC.snapshot(m, o)
        with pytest.raises(NotImplementedError) as e:
            get_state_dict(m, o)
        assert HC.first_sentence(e.value).startswith("Use mxt.save_checkpoint(path, model, opt) / "
                                                     "mxt.load_checkpoint(path, model, opt)"), e.value
        assert "get_state_dict" in str(e.value), e.value
        assert not HC.same(before, HC.snapshot(m, o)), "get_state_dict changed the optimizer"
        C.inject(m, 0, 0)
        o.step()
        o.zero_grad()
    before = HC.snapshot(m, o)
    with pytest.raises(NotImplementedError, match=r"^Use mxt.save_checkpoint.*mxt.load_checkpoint"):
        set_state_dict(m, o, model_state_dict=m.state_dict(), optim_state_dict={"state": {}, "param_groups": []})
    assert not HC.same(before, HC.snapshot(m, o)), "set_state_dict changed the optimizer"
    assert o.steps == 2
    import torch.distributed.checkpoint as dcp
    with tempfile.TemporaryDirectory() as d, warnings.catch_warnings():
        warnings.simplefilter("ignore")   # (no process group: DCP saves in a single process)
        saved = HC.snapshot(m, o)
        dcp.save({"optim": o}, checkpoint_id=d)
        assert ".metadata" in os.listdir(d)
        assert not HC.same(saved, HC.snapshot(m, o)), "dcp.save changed the optimizer"
        C.inject(m, 1, 0)
        o.step()
        o.zero_grad()
        assert HC.same(saved, HC.snapshot(m, o)), "the step after the save moved nothing"
        dcp.load({"optim": o}, checkpoint_id=d)
        diff = HC.same(saved, HC.snapshot(m, o))
        assert not diff, f"dcp.load did not restore {diff}"


def test_inner_optimizer_must_be_elementwise(C):
    import torch
    from mxshard.torch import ShardedOptimizer
    m = C.build_model()
    bad = [torch.optim.LBFGS, torch.optim.SparseAdam] + \
        [getattr(torch.optim, n) for n in ("Adafactor",) if hasattr(torch.optim, n)]
    for cls in bad:
        raises_untouched(m, lambda: ShardedOptimizer(m, lambda g: cls(g, lr=1e-2)), TypeError,
                   f"inner optimizer {cls.__name__} is not known to be elementwise")
    if hasattr(torch.optim, "Muon"):  # refuses 1-D parameters itself: its error gets a note saying why
        with pytest.raises(ValueError) as e:
            ShardedOptimizer(m, lambda g: torch.optim.Muon(g, lr=1e-2))
        assert any("must be elementwise" in n for n in getattr(e.value, "__notes__", [])), e.value
    if hasattr(torch.optim, "Adafactor"):
        ShardedOptimizer(m, lambda g: torch.optim.Adafactor(g, lr=1e-2), assume_elementwise=True).close()


def _elementwise(cls, cut):
    """Stepping a vector cut into views at `cut` equals stepping it whole (3 steps)."""
    import torch
    gen = torch.Generator().manual_seed(1)
    x0 = torch.randn(37, generator=gen)
    grads = [torch.randn(37, generator=gen) for _ in range(3)]
    whole, cutv = x0.clone(), x0.clone()
    views = [cutv[a:b] for a, b in zip([0] + cut, cut + [37])]
    opts = [cls([whole], lr=0.01), cls(views, lr=0.01)]
    for g in grads:
        whole.grad = g.clone()
        for v, (a, b) in zip(views, zip([0] + cut, cut + [37])):
            v.grad = g[a:b].clone()
        for o in opts:
            o.step()
    return torch.equal(whole, cutv)


def test_allowed_inner_optimizers_are_elementwise():
    torch = gloo_or_skip()
    from mxshard.torch.zero.compat import ELEMENTWISE
    assert len(ELEMENTWISE) >= 10
    for cls in ELEMENTWISE:
        assert _elementwise(cls, [10, 23]), f"{cls.__name__} is not elementwise on views"
    if hasattr(torch.optim, "Adafactor"):  # the property the allow-list rests on, failing where it should
        assert not _elementwise(torch.optim.Adafactor, [10, 23])


def test_grad_dtype(C, HC):
    """bf16 gradient buffers: exact against the fp32 reference (dyadic
    gradients); a real backward through dense layers gives the same masters
    as fp32 buffers (the gradients are bf16 already); grad_dtype=float16 is
    refused. Changed by design: a converted linear's weight is a Parameter of
    grad_dtype (its wgrad arrives in bf16), so bf16 buffers are accepted with
    converted linears and a real backward through them steps (the removed
    linear refused them unless its MAIN_GRAD_DTYPES had bf16)."""
    import torch
    from torch import nn
    from mxshard.torch import MXFP8Linear, ShardedOptimizer
    C.case_exact(0, 1, grad_dtype=torch.bfloat16, opt="sgd", max_grad_norm=0.05, steps=2)
    o16 = ShardedOptimizer(C.build_model(), _adamw, bucket_size=2500, grad_dtype=torch.bfloat16)
    o32 = ShardedOptimizer(C.build_model(), _adamw, bucket_size=2500)
    assert o16.buffer_bytes()["grad"] * 2 == o32.buffer_bytes()["grad"]
    assert o16.buffer_bytes()["master"] == o32.buffer_bytes()["master"]
    assert all(t.dtype == torch.bfloat16 for t in o16._grad + o16._shard)
    assert all(t.dtype == torch.float32 for t in o32._grad + o32._shard)
    masters = []
    for gd in (torch.float32, torch.bfloat16):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(12, 16), nn.GELU(), nn.Linear(16, 4)).to(torch.bfloat16)
        o = ShardedOptimizer(net, lambda g: torch.optim.SGD(g, lr=0.5), grad_dtype=gd)
        net(torch.randn(3, 12, dtype=torch.bfloat16)).float().pow(2).sum().backward()
        o.step()
        masters.append(o._master[0].clone())
        # (after a step the inner parameters keep no gradient tensor, the upcast bf16 shards included: a
        # HeldGrad placeholder, no storage)
        assert o._grad[0].dtype == gd and all(type(v.grad).__name__ == "HeldGrad" for v, _, _ in o._views)
    assert torch.equal(masters[0], masters[1])
    m = C.build_model()
    raises_untouched(m, lambda: ShardedOptimizer(m, _adamw, grad_dtype=torch.float16), ValueError, "grad_dtype")
    raises_untouched(m, lambda: ShardedOptimizer(m, _adamw, grad_dtype=torch.int8), ValueError,
                     r"^ShardedOptimizer: pass grad_dtype=torch.float32 or torch.bfloat16")
    # converted linears with bf16 buffers: a real backward through them steps
    mlp = C.MLP("padded")
    assert any(isinstance(x, MXFP8Linear) for x in mlp.modules())
    o = ShardedOptimizer(mlp, _adamw, grad_dtype=torch.bfloat16)
    conv = [x for x in mlp.modules() if isinstance(x, MXFP8Linear)]
    assert all(x.weight.dtype == torch.bfloat16 for x in conv), "a converted weight's gradient is not bf16"
    before = [t.clone() for t in o._master]
    mlp(torch.randn(4, 40)).pow(2).sum().backward()
    assert all(type(x.weight.grad).__name__ == "HeldGrad" for x in conv) and any(t.any() for t in o._grad)
    o.step()
    assert o.steps == 1 and all(not torch.equal(a, b) for a, b in zip(before, o._master))


def test_failed_construction_leaves_nothing_alive(C, HC):
    import torch
    from mxshard.torch import ShardedOptimizer
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        base = HC.alive_optimizers()
        for f in (lambda: ShardedOptimizer(C.build_model(extra_dense=torch.zeros(2, dtype=torch.float64)), _adamw),
                  lambda: ShardedOptimizer(C.build_model(), lambda g: object()),
                  lambda: ShardedOptimizer(C.build_model(), lambda g: torch.optim.LBFGS(g))):
            with pytest.raises(TypeError):
                f()
        assert HC.alive_optimizers() == base, "a failed ShardedOptimizer is still in memory (a reference cycle)"
    finally:
        if enabled:
            gc.enable()


def test_tie_made_after_convert_is_refused(C, HC):
    """emb.weight = fc.weight after convert(): ShardedOptimizer would swap fc for its own storage and
    emb would keep the old Parameter (the tie silently broken). Refused, naming both, saying to keep
    tied weights dense; the model is left as it was (fc still the converted linear, still tied)."""
    import torch
    from torch import nn
    import mxshard.torch as mxt
    from mxshard.torch import ShardedOptimizer
    for fmt in ("mxfp8", "nvfp4"):
        t = nn.Module()
        t.emb, t.fc = nn.Embedding(64, 64), nn.Linear(64, 64)
        mxt.convert(t, "row", format=fmt)
        t.emb.weight = t.fc.weight
        fc = t.fc
        raises_untouched(t, lambda: ShardedOptimizer(t, _adamw), ValueError, "keep tied weights dense")
        with pytest.raises(ValueError) as e:
            ShardedOptimizer(t, _adamw)
        assert HC.first_sentence(e.value).startswith("ShardedOptimizer: keep tied weights dense") \
            and "'fc'" in str(e.value) and "emb.weight" in str(e.value), e.value
        assert t.fc is fc and mxt.is_param_linear(t.fc) and t.emb.weight is t.fc.weight
    # a tie of dense modules (a policy that skips them) trains tied
    t = nn.Module()
    t.emb, t.fc, t.head = nn.Embedding(64, 64), nn.Linear(64, 64), nn.Linear(64, 64)
    mxt.convert(t, "row", skip=["fc"])
    t.emb.weight = t.fc.weight
    o = ShardedOptimizer(t, _adamw)
    t.head(t.fc(t.emb(torch.arange(8)))).pow(2).sum().backward()
    o.step()
    assert t.emb.weight is t.fc.weight and [it.name for it in o.items].count("emb.weight") == 1
    o.close()


def test_held_gradient_messages_name_the_way_out(C, HC):
    """A dense .grad under ShardedOptimizer: clip_grad_value_ says value clipping is not available
    (norm clipping is: max_grad_norm); an out= function reading it (DistributedDataParallel's
    reducer) says to unwrap DDP; clip_grad_norm_ names max_grad_norm. Nothing is clipped."""
    import torch
    from mxshard.torch import ShardedOptimizer
    m = HC.converted()
    o = ShardedOptimizer(m, lambda g: torch.optim.SGD(g, lr=0.1))
    HC.backward(m, 0, 0)
    before = HC.snapshot(m, o)
    grads = [t.clone() for t in o._grad]
    assert all(type(p.grad).__name__ == "HeldGrad" for p in m.parameters())   # (the converted weights' too)
    with pytest.raises(RuntimeError) as e:
        torch.nn.utils.clip_grad_value_(m.parameters(), 1e-4)
    assert HC.first_sentence(e.value).startswith("ShardedOptimizer: gradient value clipping "
                                                 "(torch.nn.utils.clip_grad_value_, clamping .grad) is not "
                                                 "available under ShardedOptimizer"), e.value
    assert "max_grad_norm" in HC.first_sentence(e.value)
    with pytest.raises(RuntimeError) as e:
        torch.mul(m[2].bias.grad, 0.5, out=torch.empty(64))
    assert HC.first_sentence(e.value).startswith("ShardedOptimizer: if the model is wrapped in "
                                                 "DistributedDataParallel, unwrap it"), e.value
    with pytest.raises(RuntimeError) as e:
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
    assert HC.first_sentence(e.value).startswith("ShardedOptimizer: clip with ShardedOptimizer(..., "
                                                 "max_grad_norm=...)"), e.value
    assert all(torch.equal(g, t) for g, t in zip(grads, o._grad)) and not HC.same(before, HC.snapshot(m, o))
    o.close()


@pytest.mark.parametrize("grad_dtype", ["float32", "bfloat16"])
def test_the_inner_parameters_gradients_refuse_clipping_and_grad_scaler(C, HC, grad_dtype):
    """The optimizer's own parameters (opt.param_groups: views of the master shards) hold a
    HeldGrad between steps: clip_grad_norm_ over them (what one writes when model.parameters()
    raises) used to return 0 before the first step and, after one, clip this rank's stale local
    slice (a norm that differed per rank); GradScaler's unscale_ asserted "No inf checks" first,
    then unscaled local slices only. Both raise now, before and after a step, saying what to do,
    and leave everything as it was; the steps in between train as before."""
    import torch
    from mxshard.torch import ShardedOptimizer
    m = HC.converted()
    o = ShardedOptimizer(m, lambda g: torch.optim.AdamW(g, lr=1e-3), grad_dtype=getattr(torch, grad_dtype))
    inner = [p for g in o.param_groups for p in g["params"]]
    for step in range(2):
        HC.backward(m, 0, step)
        before = HC.snapshot(m, o)
        grads = [t.clone() for t in o._grad]
        with pytest.raises(RuntimeError) as e:
            torch.nn.utils.clip_grad_norm_(inner, 1.0)
        assert HC.first_sentence(e.value).startswith("ShardedOptimizer: clip with ShardedOptimizer(..., "
                                                     "max_grad_norm=...)"), e.value
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
        scaler.scale(torch.ones(()))   # (as scaler.scale(loss).backward() would: the scale exists)
        with pytest.raises(RuntimeError) as e:
            scaler.step(o)
        assert HC.first_sentence(e.value).startswith("ShardedOptimizer: drop torch.amp.GradScaler and train in "
                                                     "bfloat16"), e.value
        assert all(torch.equal(g, t) for g, t in zip(grads, o._grad))
        assert not HC.same(before, HC.snapshot(m, o))
        o.step()
        o.zero_grad()
    assert o.steps == 2
    o.close()


def test_load_state_dict_of_another_configuration_or_rank_says_what_to_do(C, HC):
    """opt.load_state_dict. Changed by design (its state dict is DCP's form, keyed by item names;
    the fingerprint and rank checks went): a state dict saved with another lr loads as
    torch.optim's does, restoring the saved lr, masters, state and step, and the model's weights
    are rewritten from the loaded masters. One of another world size or rank (other rows of each
    master: what one rank's copy of a DCP save is), or of another model, is refused, naming what
    to do, and changes nothing."""
    import torch
    from mxshard.torch import ShardedOptimizer
    m = HC.converted()
    o = ShardedOptimizer(m, lambda g: torch.optim.AdamW(g, lr=1e-2))
    HC.backward(m, 0, 0)
    o.step()
    sd = o.state_dict()
    saved = HC.snapshot(m, o)
    o.close()
    m2 = HC.converted(seed=1)
    o2 = ShardedOptimizer(m2, lambda g: torch.optim.AdamW(g, lr=1e-3))
    before = HC.snapshot(m2, o2)
    half = dict(sd, masters={k: v[:(v.shape[0] + 1) // 2] for k, v in sd["masters"].items()})
    with pytest.raises(ValueError) as e:
        o2.load_state_dict(half)
    assert "mxt.load_checkpoint" in str(e.value) and "0.weight" in str(e.value), e.value
    assert not HC.same(before, HC.snapshot(m2, o2)), "a refused load changed the optimizer"
    other = dict(sd, masters={("x" + k if k == "2.bias" else k): v for k, v in sd["masters"].items()})
    with pytest.raises(ValueError, match=r"ShardedOptimizer.load_state_dict: build the"):
        o2.load_state_dict(other)
    assert not HC.same(before, HC.snapshot(m2, o2)), "a refused load changed the optimizer"
    o2.load_state_dict(sd)
    assert o2.inner.param_groups[0]["lr"] == 1e-2 and o2.steps == 1
    diff = HC.same(dict(saved, inner={}), dict(HC.snapshot(m2, o2), inner={}))   # (inner: keyed by id(view))
    assert not diff, f"the load did not restore {diff}"
    assert len(o2.inner.state) == len(o2._views) and all(
        torch.equal(o2.inner.state[v][k], sd["state"][o2.buckets[b].items[pos].name][k])
        for v, b, pos in o2._views for k in ("exp_avg", "exp_avg_sq", "step"))
    C.check_weights(m2, C.full_masters(o2))
    o2.close()


def test_frozen_quantized_weight_refused_at_construction(C, HC):
    """A quantized linear whose weight was frozen (module.weight.requires_grad_(False)) is refused
    by the next ShardedOptimizer, as a frozen converted weight is; close() lets another optimizer
    take the model over."""
    from mxshard.torch import ShardedOptimizer
    m = HC.converted()
    o = ShardedOptimizer(m, _adamw)
    raises_untouched(m, lambda: ShardedOptimizer(m, _adamw), ValueError,
                     r"^ShardedOptimizer: close the ShardedOptimizer that trains 0 first \(opt.close\(\)\)")
    o.close()
    m[0].weight.requires_grad_(False)
    raises_untouched(m, lambda: ShardedOptimizer(m, _adamw), ValueError,
                     r"^ShardedOptimizer: keep frozen linears dense \(convert\(..., skip=...\)\) or unfreeze "
                     r"0.weight: it is frozen \(requires_grad=False\)")
    m[0].requires_grad_(True)
    ShardedOptimizer(m, _adamw).close()


@pytest.mark.parametrize("inner,who", [("sgd_wd", "before"), ("sgd_wd", "second"), ("adamw", "before"),
                                       ("adamw", "second"), ("adamw_foreach", "before"), ("adamw_foreach", "second")])
def test_torch_optimizer_over_the_model_raises_saying_step_only_sharded(C, HC, inner, who):
    """A torch.optim optimizer over model.parameters() (a second optimizer, or one built before
    ShardedOptimizer) stepping a model ShardedOptimizer owns raises, its first sentence saying to
    step only the ShardedOptimizer, and leaves the buckets' gradients alone (SGD's weight decay
    adds the parameter to .grad: not a gradient to accumulate)."""
    import torch
    from mxshard.torch import ShardedOptimizer
    m = HC.converted()
    make = {"sgd_wd": lambda ps: torch.optim.SGD(ps, lr=0.1, weight_decay=0.1, foreach=False),
            "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.1, foreach=False),
            "adamw_foreach": lambda ps: torch.optim.AdamW(ps, lr=0.1, foreach=True)}[inner]
    before_opt = make(list(m.parameters()))
    o = ShardedOptimizer(m, lambda g: torch.optim.SGD(g, lr=0.1))
    second = make(list(m.parameters()))
    HC.backward(m, 0, 0)
    grads = [t.clone() for t in o._grad]
    before = HC.snapshot(m, o)
    t = before_opt if who == "before" else second
    try:
        t.step()
        raise AssertionError("a torch.optim optimizer over the model stepped")
    except Exception as e:  # noqa: BLE001 - the type is asserted
        assert isinstance(e, RuntimeError), repr(e)
        first = HC.first_sentence(e)
        assert first.startswith("ShardedOptimizer: clip with ShardedOptimizer(..., max_grad_norm=...)"), e
        assert "step only the ShardedOptimizer (it owns the gradients" in first, e
    assert all(torch.equal(g, x) for g, x in zip(grads, o._grad)), "the gradient buckets changed"
    if inner == "sgd_wd":   # (AdamW decays the parameter in place before it reads .grad)
        assert not HC.same(before, HC.snapshot(m, o))
    o.model_from_masters()   # (undoes AdamW's decay of the dense parameters)
    o.step()
    assert o.steps == 1
    o.close()


def test_autograd_grad_wrt_input_leaves_the_buckets(C, HC):
    """torch.autograd.grad(loss, x) under ShardedOptimizer (saliency, an input-gradient penalty)
    returns x's gradient and writes no gradient bucket (nor reports an item: no bucket is
    launched), so a step after it alone changes nothing; a retained graph's backward after it
    and a step give the masters of a plain backward and step, bit for bit; the same inside
    no_sync."""
    import torch
    import torch.nn.functional as F
    from mxshard.torch import ShardedOptimizer

    def run(pre, nosync=False):
        m = HC.converted()
        o = ShardedOptimizer(m, _adamw)
        g = torch.Generator().manual_seed(3)
        x = torch.randn(16, 64, generator=g).requires_grad_(True)
        y = torch.randn(16, 64, generator=g)
        for _ in range(2):
            loss = F.mse_loss(m(x).float(), y)
            if pre:
                versions = [t._version for t in o._grad]
                grads = [t.clone() for t in o._grad]
                ctx = o.no_sync() if nosync else contextlib.nullcontext()
                with ctx:
                    gx, = torch.autograd.grad(loss, x, retain_graph=True)
                assert gx.shape == x.shape and gx.abs().sum() > 0
                assert [t._version for t in o._grad] == versions, "autograd.grad wrote a bucket"
                assert all(torch.equal(a, t) for a, t in zip(grads, o._grad))
                assert all(not seen for seen in o._seen) and all(w is None for w in o._work), \
                    "autograd.grad reported items"
                assert all(p.grad is None for p in m.parameters()), "autograd.grad left a .grad"
                snap = HC.snapshot(m, o)
                if not nosync:
                    o.step()   # nothing arrived: changes nothing
                    assert not HC.same(snap, HC.snapshot(m, o)), "a step after autograd.grad alone moved something"
            loss.backward()
            o.step()
            o.zero_grad()
        out = [t.clone() for t in o._master]
        o.close()
        return out
    ref = run(False)
    for kw in ({}, {"nosync": True}):
        got = run(True, **kw)
        assert all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(ref, got)), kw


def test_a_linear_used_twice_in_one_forward_says_overlap_false(C):
    """A converted linear applied twice in one forward (bucket_size=1: each item its own bucket).
    The old linear reported each use's gradient, so the second arrived after the reduction
    started and step() raised, saying to pass overlap=False. Changed by design: the weight is one
    leaf Parameter, autograd sums both uses before its post-accumulate-grad hook runs once, so
    overlap=True trains it, bit-identical to overlap=False, and the reduction saw the sum."""
    import torch
    from mxshard.torch import ShardedOptimizer, convert

    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.shared, self.out = torch.nn.Linear(64, 64, bias=False), torch.nn.Linear(64, 4, bias=False)

        def forward(self, x):
            return self.out(self.shared(self.shared(x)))
    got = {}
    for overlap in (True, False):
        torch.manual_seed(0)
        m = convert(Twice(), "row")
        x = torch.randn(4, 64)
        with ShardedOptimizer(m, _adamw, bucket_size=1, overlap=overlap) as o:
            assert [it.name for it in o.items] == ["shared.weight", "out.weight"] and len(o.buckets) == 2
            m(x).sum().backward()
            assert (o._work[0] is not None) == overlap, "the bucket was not launched from the hook"
            before = o._master[0].clone()
            o.step()
            assert not torch.equal(before, o._master[0]) and o.steps == 1
            got[overlap] = [t.clone() for t in o._master]
    assert all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(got[True], got[False]))


def test_module_hooks_on_converted_linears_survive_the_optimizer(C):
    """Forward and backward hooks registered on convert()'s linears before ShardedOptimizer took
    them over stopped running under the old optimizer (it swapped in its own linear). Changed by
    design: the model keeps convert()'s linears (MXFP8ParamLinear), so the hooks stay where they
    were and run, once per forward; a failed construction leaves them there too."""
    import torch
    from mxshard.torch import ShardedOptimizer, convert
    torch.manual_seed(0)
    m = convert(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)), "row")
    seen = []
    m[0].register_forward_hook(lambda mod, i, o: seen.append(type(mod).__name__))
    m[2].register_full_backward_pre_hook(lambda mod, go: (torch.zeros_like(go[0]),))
    with pytest.raises(RuntimeError, match="no optimizer"):
        ShardedOptimizer(m, lambda g: (_ for _ in ()).throw(RuntimeError("no optimizer")))
    mods = list(m.modules())
    m(torch.randn(2, 64))
    assert seen == ["MXFP8ParamLinear"]
    with ShardedOptimizer(m, _adamw) as o:
        assert list(m.modules()) == mods, "the optimizer swapped a module"
        m(torch.randn(4, 64)).sum().backward()
        assert seen == ["MXFP8ParamLinear"] * 2
        grads = {it.name: o.buckets[it.bucket].view(o._grad[it.bucket], [x.name for x in
                 o.buckets[it.bucket].items].index(it.name), 0) for it in o.items}
        assert grads["2.weight"].abs().sum() == 0 and grads["2.bias"].abs().sum() == 0, \
            "the backward pre-hook was dropped"
        assert grads["0.weight"].abs().sum() == 0   # (nothing flows below a zeroed output gradient)

# SPDX-License-Identifier: MIT
"""ShardedOptimizer behaves like a torch.optim optimizer, or says why not
(issue 24), in a world of one in this process: it IS a torch.optim.Optimizer
whose param groups are the inner optimizer's (schedulers, hooks,
zero_grad(set_to_none)); a step without gradients changes nothing; writes
into the model's weights are refused until the optimizer is told;
torch.distributed.checkpoint's state_dict helpers, inner optimizers that are
not elementwise and bad grad dtypes raise, naming what to use; bf16 gradient
buffers; a failed construction leaves nothing alive. The same across gloo
ranks: test_torch_optim.py (torch_optim_habit_cases)."""
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
    m.b.main_grad.fill_(1.0)
    o.zero_grad(set_to_none=False)
    assert m.ln.weight.grad is g and not g.any(), "set_to_none=False must zero .grad in place"
    assert not m.b.main_grad.any() and all(not bk.grad.any() for bk in o._buckets)
    o.zero_grad()
    assert m.ln.weight.grad is None


def test_step_without_gradient_changes_nothing(C, HC):
    """No gradient written since zero_grad() (or since the last step): step()
    changes nothing. A gradient written straight into main_grad (no hook)
    counts. Granularity is the step: an item without gradient in a step
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
    m.c.main_grad.copy_(torch.full_like(m.c.main_grad, 2.0 ** -10))   # only c, no hook fired
    h_before = m.h.detach().clone()
    o.step()
    assert o.steps == 2, "a gradient written straight into main_grad did not count"
    assert not torch.equal(m.h.detach(), h_before), "an item without gradient is stepped (weight decay)"


def test_writes_into_the_model_are_refused_until_told_nvfp4(C, HC):
    """NVFP4 weights (amax and scale buffers) under the same guard:
    model.load_state_dict() -> step() raises and changes nothing;
    masters_from_model() -> the loaded primaries, dequantized, are the masters."""
    import torch
    import torch_nvfp4_cases as N
    from mxshard.torch import ShardedOptimizer
    m = N.build_model(modules=N.NV_MODULES[:4] + N.NV_MODULES[8:10])
    o = ShardedOptimizer(m, _adamw, bucket_size=1000)
    N.inject(m, 0, 0, 1)
    o.step()
    o.zero_grad()
    m.load_state_dict(N.build_model(seed=3, modules=N.NV_MODULES[:4] + N.NV_MODULES[8:10]).state_dict())
    before = HC.snapshot(m, o)
    N.inject(m, 1, 0, 1)
    with pytest.raises(RuntimeError, match="masters_from_model"):
        o.step()
    assert not HC.same(before, HC.snapshot(m, o))
    loaded = {n: (obj.master_init() if hasattr(obj, "master_init") else obj.detach()).float().reshape(-1).clone()
              for n, obj in C.item_table(m)}
    o.masters_from_model()
    full = N.full_masters(o)
    for n, v in loaded.items():   # (the writeback then quantizes them: NVFP4 values may move by one rounding)
        assert torch.equal(full[n], v), f"{n}: the master is not the loaded (dequantized) value"
    o.zero_grad()
    N.inject(m, 2, 0, 1)
    o.step()
    assert o.steps == 2


def test_dcp_state_dict_helpers_raise_naming_save_checkpoint(C, HC):
    import torch
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from mxshard.torch import ShardedOptimizer
    m = C.build_model()
    o = ShardedOptimizer(m, _adamw, bucket_size=2500)
    for stepped in (False, True):
        before = HC.snapshot(m, o)
        with pytest.raises(NotImplementedError, match="mxt.save_checkpoint"):
            get_state_dict(m, o)
        assert not HC.same(before, HC.snapshot(m, o)), "get_state_dict changed the optimizer"
        C.inject(m, 0, 0)
        o.step()
        o.zero_grad()
    with pytest.raises(NotImplementedError, match="mxt.load_checkpoint"):
        set_state_dict(m, o, model_state_dict=m.state_dict(), optim_state_dict={"state": {}, "param_groups": []})
    assert o.steps == 2
    # dcp.save / dcp.load of the optimizer (a Stateful): its state_dict() is this rank's shards, which
    # DCP would keep from one rank only; both raise before writing or reading anything
    import torch.distributed.checkpoint as dcp
    with tempfile.TemporaryDirectory() as d:
        before = HC.snapshot(m, o)
        with pytest.raises(NotImplementedError, match="mxt.save_checkpoint"):
            dcp.save({"optim": o}, checkpoint_id=d)
        assert not os.listdir(d)
        with pytest.raises(NotImplementedError, match="mxt.load_checkpoint"):
            dcp.load({"optim": o}, checkpoint_id=d)
        assert not HC.same(before, HC.snapshot(m, o)), "dcp.save / dcp.load changed the optimizer"


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
    as fp32 buffers (the gradients are bf16 already); a quantized linear that
    does not accumulate into a bf16 main_grad is refused, naming the fix."""
    import torch
    from torch import nn
    from mxshard.torch import MXFP8Linear, ShardedOptimizer
    with HC.bf16_main_grads():
        C.case_exact(0, 1, grad_dtype=torch.bfloat16, opt="sgd", max_grad_norm=0.05, steps=2)
        o16 = ShardedOptimizer(C.build_model(), _adamw, bucket_size=2500, grad_dtype=torch.bfloat16)
    o32 = ShardedOptimizer(C.build_model(), _adamw, bucket_size=2500)
    assert o16.buffer_bytes()["grad"] * 2 == o32.buffer_bytes()["grad"]
    assert all(bk.grad.dtype == torch.bfloat16 for bk in o16._buckets)
    masters = []
    for gd in (torch.float32, torch.bfloat16):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(12, 16), nn.GELU(), nn.Linear(16, 4)).to(torch.bfloat16)
        o = ShardedOptimizer(net, lambda g: torch.optim.SGD(g, lr=0.5), grad_dtype=gd)
        net(torch.randn(3, 12, dtype=torch.bfloat16)).float().pow(2).sum().backward()
        o.step()
        masters.append(o._buckets[0].master.clone())
        # (after a step the inner parameters keep no gradient tensor, the upcast bf16 shards included: a
        # HeldGrad placeholder, no storage)
        assert o._buckets[0].grad.dtype == gd and all(type(v.grad).__name__ == "HeldGrad" for v in o._views)
    assert torch.equal(masters[0], masters[1])
    m = C.build_model()
    raises_untouched(m, lambda: ShardedOptimizer(m, _adamw, grad_dtype=torch.float16), ValueError, "grad_dtype")
    if torch.bfloat16 not in getattr(MXFP8Linear, "MAIN_GRAD_DTYPES", (torch.float32,)):
        raises_untouched(m, lambda: ShardedOptimizer(m, _adamw, grad_dtype=torch.bfloat16), ValueError,
                   "grad_dtype=torch.float32")
    else:  # the linear accumulates into bf16: a real backward through it steps
        mlp = C.MLP("padded")
        o = ShardedOptimizer(mlp, _adamw, grad_dtype=torch.bfloat16)
        mlp(torch.randn(4, 40)).pow(2).sum().backward()
        o.step()
        assert o.steps == 1


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


def test_ema_of_a_sharded_model_raises_and_copies_evaluate(C, HC):
    """torch.optim.swa_utils.AveragedModel made after the optimizer: its update_parameters raises
    (default: it would copy the model's planes over the average; use_buffers=True: it would
    average FP8 / FP4 bytes), saying what to do, and leaves the model and optimizer alone. A deep
    copy evaluates like the model, is outside the optimizer (a backward through it reaches none
    of the optimizer's gradients) and its planes refuse in-place writes, views included."""
    import copy
    import torch
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
    from mxshard.torch import ShardedOptimizer
    for fmt, policy in (("mxfp8", "row"), ("mxfp8", "both"), ("nvfp4", "row")):
        m = HC.converted(fmt, policy)
        o = ShardedOptimizer(m, _adamw)
        HC.backward(m, 0, 0)
        o.step()
        o.zero_grad()
        for use_buffers in (False, True):
            ema = AveragedModel(m, multi_avg_fn=get_ema_multi_avg_fn(0.5), use_buffers=use_buffers)
            HC.backward(m, 0, 1)
            o.step()
            o.zero_grad()
            before = HC.snapshot(m, o)
            planes = {k: v.clone() for k, v in ema.module.state_dict().items() if not k.endswith("bias")}
            with pytest.raises(RuntimeError) as e:
                ema.update_parameters(m)
            assert HC.first_sentence(e.value).startswith("Keep an EMA (or any average) of a model trained by "
                                                         "ShardedOptimizer yourself from each quantized linear's "
                                                         "module.weight"), e.value
            assert not HC.same(before, HC.snapshot(m, o)), "update_parameters changed the model or optimizer"
            assert all(torch.equal(v, ema.module.state_dict()[k]) for k, v in planes.items()), \
                "update_parameters wrote into the EMA's planes"
        c = copy.deepcopy(m)
        x = torch.randn(4, 64)
        with torch.no_grad():
            assert torch.equal(c(x), m(x))
        grads = [bk.grad.clone() for bk in o._buckets]
        c(x).pow(2).sum().backward()
        assert all(torch.equal(g, bk.grad) for g, bk in zip(grads, o._buckets)), "a copy's backward reached the optimizer"
        assert c[0].main_grad is not None and c[0].main_grad.data_ptr() != m[0].main_grad.data_ptr()
        for write in (lambda p: p.copy_(torch.zeros_like(p)), lambda p: p.data.add_(1), lambda p: p[0].zero_(),
                      lambda p: torch._foreach_mul_([p.detach()], 2)):
            with pytest.raises(RuntimeError, match="Keep an EMA"):
                write(c[0].row_data)
        assert torch.equal(c[0].row_data, m[0].row_data)
        c[0].set_master_(torch.zeros(96, 64))      # a copy's weight is its own to set
        assert not c[0].weight.any() and m[0].weight.any()
        o.close()


def test_ema_made_before_the_optimizer_raises_instead_of_averaging_a_bias_into_a_weight(C, HC):
    """AveragedModel built on the converted model before ShardedOptimizer: the optimizer takes the
    converted weights out of model.parameters(), so update_parameters pairs each EMA weight with
    the next parameter (a bias). Square layers broadcast the bias over the weight silently; the
    EMA's master refuses that write (nothing written) and says what to do."""
    import torch
    from torch import nn
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
    import mxshard.torch as mxt
    from mxshard.torch import ShardedOptimizer
    for fmt, ema_fn in (("mxfp8", None), ("nvfp4", get_ema_multi_avg_fn(0.5))):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 64))
        mxt.convert(m, "row", format=fmt)
        ema = AveragedModel(m, multi_avg_fn=ema_fn) if ema_fn else AveragedModel(m)
        o = ShardedOptimizer(m, _adamw)
        m(torch.randn(8, 64)).pow(2).sum().backward()
        o.step()
        o.zero_grad()
        before = [p.detach().clone() for p in ema.module.parameters()]
        for _ in range(2):   # the first update copies, later ones average
            with pytest.raises(RuntimeError) as e:
                ema.update_parameters(m)
            assert HC.first_sentence(e.value).startswith("mxshard: write a tensor of 0.weight's shape (64, 64) "
                                                         "into it, not one of shape (64,) broadcast over it"), e.value
            assert "AveragedModel" in str(e.value) and "module.weight" in str(e.value)
            assert all(torch.equal(a, b.detach()) for a, b in zip(before, ema.module.parameters()))
        o.close()


def test_cast_after_construction_says_to_cast_before(C, HC):
    import torch
    from mxshard.torch import ShardedOptimizer
    for cast in (lambda m: m.to(torch.bfloat16), lambda m: m.half()):
        m = HC.converted()
        o = ShardedOptimizer(m, _adamw)
        masters = [bk.master.clone() for bk in o._buckets]
        cast(m)
        with pytest.raises(RuntimeError) as e:
            o.step()
        assert HC.first_sentence(e.value).startswith("ShardedOptimizer.step: Cast or move the model"), e.value
        assert "2.bias" in str(e.value) and "now torch." in str(e.value), e.value
        assert all(torch.equal(a, bk.master) for a, bk in zip(masters, o._buckets)) and o.steps == 0
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
    grads = [bk.grad.clone() for bk in o._buckets]
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
    assert all(torch.equal(g, bk.grad) for g, bk in zip(grads, o._buckets)) and not HC.same(before, HC.snapshot(m, o))
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
        grads = [bk.grad.clone() for bk in o._buckets]
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
        assert all(torch.equal(g, bk.grad) for g, bk in zip(grads, o._buckets))
        assert not HC.same(before, HC.snapshot(m, o))
        o.step()
        o.zero_grad()
    assert o.steps == 2
    o.close()


def test_load_state_dict_of_another_configuration_or_rank_says_what_to_do(C, HC):
    """opt.load_state_dict of a state dict saved with another lr, or by another rank (what
    torch.distributed.checkpoint.save of opt.state_dict() gives back: one rank's copy), names what
    to do and the first difference; it said "fingerprint N differs" or "rank 1 differs"."""
    import torch
    from mxshard.torch import ShardedOptimizer
    m = HC.converted()
    o = ShardedOptimizer(m, lambda g: torch.optim.AdamW(g, lr=1e-2))
    HC.backward(m, 0, 0)
    o.step()
    sd = o.state_dict()
    o.close()
    m2 = HC.converted(seed=1)
    o2 = ShardedOptimizer(m2, lambda g: torch.optim.AdamW(g, lr=1e-3))
    before = HC.snapshot(m2, o2)
    with pytest.raises(ValueError) as e:
        o2.load_state_dict(sd)
    msg = str(e.value)
    assert msg.startswith("load_state_dict: build the ShardedOptimizer as the one that saved the state dict"), msg
    assert "mxt.load_checkpoint" in HC.first_sentence(e.value) and "lr" in msg.split("saved", 2)[-1], msg
    with pytest.raises(ValueError, match=r"^load_state_dict: load this rank's own state dict"):
        o2.load_state_dict(dict(sd, rank=1))
    assert not HC.same(before, HC.snapshot(m2, o2))
    o2.close()


def test_frozen_quantized_weight_refused_at_construction(C, HC):
    """A quantized linear whose weight was frozen (module.weight.requires_grad_(False)) is refused
    by the next ShardedOptimizer, as a frozen converted weight is; close() lets another optimizer
    take the model over."""
    from mxshard.torch import ShardedOptimizer
    m = HC.converted()
    o = ShardedOptimizer(m, _adamw)
    with pytest.raises(ValueError, match="already managed by another ShardedOptimizer"):
        ShardedOptimizer(m, _adamw)
    o.close()
    m[0].weight.requires_grad_(False)
    raises_untouched(m, lambda: ShardedOptimizer(m, _adamw), ValueError, r"0.weight is frozen \(requires_grad_")
    m[0].requires_grad_(True)
    ShardedOptimizer(m, _adamw).close()


def test_reset_parameters_of_an_owned_linear_is_a_write(C, HC):
    """module.reset_parameters() (an HF-style re-init) on a linear the optimizer owns quantizes new
    planes: the next step raises (nothing changes), and masters_from_model() takes the new values
    as the masters (nothing else kept on the module)."""
    import torch
    from mxshard.torch import ShardedOptimizer
    m = HC.converted()
    o = ShardedOptimizer(m, _adamw)
    m[2].reset_parameters()
    masters = [bk.master.clone() for bk in o._buckets]
    HC.backward(m, 0, 0)
    with pytest.raises(RuntimeError, match=r"^ShardedOptimizer.step: Right after writing into the model's weights, "
                                           r"call opt.masters_from_model\(\) on every rank"):
        o.step()
    assert all(torch.equal(a, bk.master) for a, bk in zip(masters, o._buckets)) and o.steps == 0
    new = m[2].weight.clone()
    o.masters_from_model()
    assert m[2]._master_init is None and torch.equal(C.full_masters(o)["2.weight"], new.reshape(-1))
    o.zero_grad()
    HC.backward(m, 0, 1)
    o.step()
    assert o.steps == 1
    o.close()


@pytest.mark.parametrize("inner", ["sgd_wd", "adamw", "adamw_foreach"])
def test_torch_optimizer_over_the_model_raises_saying_step_only_sharded(C, HC, inner):
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
    grads = [bk.grad.clone() for bk in o._buckets]
    dense = {n: p.detach().clone() for n, p in m.named_parameters()}
    for t in (before_opt, second):
        with pytest.raises(RuntimeError) as e:
            t.step()
        first = HC.first_sentence(e.value)
        assert first.startswith("ShardedOptimizer: clip with ShardedOptimizer(..., max_grad_norm=...)"), e.value
        assert "step only the ShardedOptimizer (it owns the gradients" in first, e.value
        assert all(torch.equal(g, bk.grad) for g, bk in zip(grads, o._buckets)), "the gradient buckets changed"
        if inner == "sgd_wd":   # (AdamW decays the parameter in place before it reads .grad)
            assert all(torch.equal(v, dict(m.named_parameters())[n]) for n, v in dense.items())
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
                versions = [bk.grad._version for bk in o._buckets]
                grads = [bk.grad.clone() for bk in o._buckets]
                ctx = o.no_sync() if nosync else contextlib.nullcontext()
                with ctx:
                    gx, = torch.autograd.grad(loss, x, retain_graph=True)
                assert gx.shape == x.shape and gx.abs().sum() > 0
                assert [bk.grad._version for bk in o._buckets] == versions, "autograd.grad wrote a bucket"
                assert all(torch.equal(a, bk.grad) for a, bk in zip(grads, o._buckets))
                assert all(not bk.seen and bk.work is None for bk in o._buckets), "autograd.grad reported items"
                snap = HC.snapshot(m, o)
                if not nosync:
                    o.step()   # nothing arrived: changes nothing
                    assert not HC.same(snap, HC.snapshot(m, o)), "a step after autograd.grad alone moved something"
            loss.backward()
            o.step()
            o.zero_grad()
        out = [bk.master.clone() for bk in o._buckets]
        o.close()
        return out
    ref = run(False)
    for kw in ({}, {"nosync": True}):
        got = run(True, **kw)
        assert all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(ref, got)), kw


def test_a_linear_used_twice_in_one_forward_says_overlap_false(C):
    """A converted linear applied twice in one forward, its bucket complete after the first use's
    gradient: the second arrives after the reduction started. step() raised naming no_sync first
    (the fix for a second backward); it now says to pass overlap=False, which trains it."""
    import torch
    from mxshard.torch import ShardedOptimizer, convert

    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.shared, self.out = torch.nn.Linear(64, 64, bias=False), torch.nn.Linear(64, 4, bias=False)

        def forward(self, x):
            return self.out(self.shared(self.shared(x)))
    for overlap in (True, False):
        torch.manual_seed(0)
        m = convert(Twice(), "row")
        with ShardedOptimizer(m, _adamw, bucket_size=1, overlap=overlap) as o:
            m(torch.randn(4, 64)).sum().backward()
            if overlap:
                with pytest.raises(RuntimeError, match=r"^ShardedOptimizer.step: pass overlap=False to "
                                                       r"ShardedOptimizer: shared.weight is used more than once"):
                    o.step()
            else:
                before = o._buckets[0].master.clone()
                o.step()
                assert not torch.equal(before, o._buckets[0].master)


def test_module_hooks_on_converted_linears_survive_the_optimizer(C):
    """Forward and backward hooks registered on convert()'s linears before ShardedOptimizer took
    them over stopped running (the optimizer swaps in its own linear): a forward hook captured
    nothing and a backward pre-hook zeroing a gradient was ignored, silently. They move to the
    optimizer's linear; a failed construction moves them back."""
    import torch
    from mxshard.torch import ShardedOptimizer, convert
    torch.manual_seed(0)
    m = convert(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)), "row")
    seen = []
    m[0].register_forward_hook(lambda mod, i, o: seen.append(type(mod).__name__))
    m[2].register_full_backward_pre_hook(lambda mod, go: (torch.zeros_like(go[0]),))
    with pytest.raises(RuntimeError, match="no optimizer"):
        ShardedOptimizer(m, lambda g: (_ for _ in ()).throw(RuntimeError("no optimizer")))
    m(torch.randn(2, 64))
    assert seen == ["MXFP8ParamLinear"]
    with ShardedOptimizer(m, _adamw) as o:
        m(torch.randn(4, 64)).sum().backward()
        assert seen[-1] == "MXFP8Linear"
        assert all(bk.grad.abs().sum() == 0 for bk in o._buckets), "the backward pre-hook was dropped"

# SPDX-License-Identifier: MIT
"""ShardedOptimizer and writes into the model it trains, in a world of one in
this process (split from test_torch_optim_habits.py): an EMA (AveragedModel,
a deep copy) of the model, a cast after construction, an in-place re-init
(reset_parameters). Under the thin ShardedOptimizer a converted linear's
weight is a replicated GatheredWeight Parameter; a write into it is
model.load_state_dict(...) then opt.masters_from_model()."""
import pytest

from test_torch_optim_habits import C, HC, _adamw  # noqa: F401  (the same fixtures: torch_dist_cases / habit cases)


def test_ema_of_a_sharded_model_raises_and_copies_evaluate(C, HC):
    """torch.optim.swa_utils.AveragedModel made after the optimizer raises at its construction
    (changed by design: it raised at update_parameters, which would copy the model's planes over
    the average, or average FP8 / FP4 bytes with use_buffers=True), saying what to do, and leaves
    the model and optimizer alone. A deep copy evaluates like the model, is outside the optimizer
    (a backward through it reaches none of the optimizer's gradients) and its weight is its own to
    set."""
    import copy
    import torch
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
    from mxshard.torch import ShardedOptimizer, dequantized_weight
    for fmt, policy in (("mxfp8", "row"), ("mxfp8", "both"), ("nvfp4", "row")):
        m = HC.converted(fmt, policy)
        o = ShardedOptimizer(m, _adamw)
        HC.backward(m, 0, 0)
        o.step()
        o.zero_grad()
        for use_buffers in (False, True):
            HC.backward(m, 0, 1)
            o.step()
            o.zero_grad()
            before = HC.snapshot(m, o)
            with pytest.raises(RuntimeError) as e:
                AveragedModel(m, multi_avg_fn=get_ema_multi_avg_fn(0.5), use_buffers=use_buffers)
            assert HC.first_sentence(e.value).startswith("Keep an EMA (or any average) of a model trained by "
                                                         "ShardedOptimizer yourself from each quantized linear's "
                                                         "module.weight"), e.value
            assert not HC.same(before, HC.snapshot(m, o)), "AveragedModel changed the model or optimizer"
        c = copy.deepcopy(m)
        x = torch.randn(4, 64)
        with torch.no_grad():
            assert torch.equal(c(x), m(x))
        grads = [t.clone() for t in o._grad]
        from mxshard.torch.zero.grads import module_owner
        assert all(module_owner(x) is None for x in c.modules()), "a copy is owned by the model's optimizer"
        c(x).pow(2).sum().backward()
        assert all(torch.equal(g, t) for g, t in zip(grads, o._grad)), "a copy's backward reached the optimizer"
        assert c[0].weight.grad is not None and type(c[0].weight.grad).__name__ != "HeldGrad"
        planes = {k: v.clone() for k, v in m.state_dict().items()}
        c[0].load_state_dict({"weight": torch.zeros(96, 64)}, strict=False)   # a copy's weight is its own to set
        assert not dequantized_weight(c[0]).any() and dequantized_weight(m[0]).any()
        assert getattr(m[0], "_mxs_loaded", None) is None
        assert all(torch.equal(v, m.state_dict()[k]) for k, v in planes.items())
        o.close()


def test_ema_made_before_the_optimizer_raises_instead_of_averaging_a_bias_into_a_weight(C, HC):
    """AveragedModel built on the converted model before ShardedOptimizer: the old optimizer took
    the converted weights out of model.parameters(), so update_parameters paired each EMA weight
    with the next parameter (a bias; square layers broadcast it silently). Changed by design: the
    model keeps its weight Parameters (replicated GatheredWeights), so each EMA parameter pairs
    with its own; update_parameters raises, the first sentence saying to keep the average
    yourself from dequantized_weight(module); nothing is written into the EMA, the model or the
    optimizer."""
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
        assert [n for n, _ in ema.module.named_parameters()] == [n for n, _ in m.named_parameters()]
        assert all(a.shape == b.shape for a, b in zip(ema.module.parameters(), m.parameters()))
        before = [p.detach().clone() for p in ema.module.parameters()]
        snap = HC.snapshot(m, o)
        for _ in range(2):   # the first update copies, later ones average
            with pytest.raises(RuntimeError) as e:
                ema.update_parameters(m)
            first = HC.first_sentence(e.value)
            assert first.startswith("Keep an EMA (or any average) of a model trained by ShardedOptimizer yourself "
                                    "from each quantized linear's module.weight"), e.value
            assert "mxshard.torch.dequantized_weight(module)" in first and "0.weight" in str(e.value), e.value
            assert all(torch.equal(a, b.detach()) for a, b in zip(before, ema.module.parameters()))
            assert not HC.same(snap, HC.snapshot(m, o))
        o.close()


def test_cast_after_construction_says_to_cast_before(C, HC):
    """A cast after the optimizer was built. Changed by design: a cast reaching a converted weight
    (model.to(dtype), model.half()) raises at once (its weight is the replicated quantized one: no
    values to cast), naming the weight, and changes nothing (the old one cast, then step() raised);
    a cast of dense modules only: step() raises saying to cast before building the optimizer,
    naming the parameter and its new dtype, and changes nothing; cast back, training goes on."""
    import torch
    from torch import nn
    from mxshard.torch import ShardedOptimizer
    for cast in (lambda mod: mod.to(torch.bfloat16), lambda mod: mod.half()):
        m = HC.converted()
        m.append(nn.Linear(64, 64))
        o = ShardedOptimizer(m, _adamw)
        before = HC.snapshot(m, o)
        with pytest.raises(RuntimeError) as e:
            cast(m)
        assert HC.first_sentence(e.value).startswith("Cast or move the model before building the ShardedOptimizer"), \
            e.value
        assert "0.weight" in str(e.value), e.value
        assert not HC.same(before, HC.snapshot(m, o)) and all(p.dtype == torch.float32 for p in m.parameters())
        cast(m[3])   # dense only
        C.inject(m, 0, 0)
        with pytest.raises(RuntimeError) as e:
            o.step()
        assert HC.first_sentence(e.value).startswith("ShardedOptimizer.step: Cast or move the model"), e.value
        assert "3.bias" in str(e.value) and "now torch." in str(e.value), e.value
        assert all(torch.equal(a, t) for a, t in zip(before["masters"], o._master)) and o.steps == 0
        o.zero_grad()   # (the refused step left the gradients held: a cast would cast them too)
        m[3].float()
        o.model_from_masters()
        C.inject(m, 0, 0)
        o.step()
        assert o.steps == 1
        o.close()


def test_reset_parameters_of_an_owned_linear_is_a_write(C, HC):
    """module.reset_parameters() (an HF-style re-init) on a linear the optimizer owns. Changed by
    design: the weight is the replicated quantized one, so the in-place init raises at once, its
    first sentence saying to write through load_state_dict and masters_from_model, and changes
    nothing (the old one quantized new planes and refused the next step). The way it names: load a
    freshly initialised linear's values; the next step raises (nothing changes) until
    masters_from_model(), which takes them as the masters (nothing else kept on the module)."""
    import torch
    from mxshard.torch import ShardedOptimizer
    m = HC.converted()
    o = ShardedOptimizer(m, _adamw)
    before = HC.snapshot(m, o)
    with pytest.raises(NotImplementedError) as e:
        m[2].reset_parameters()
    assert HC.first_sentence(e.value).startswith("mxshard: write 2.weight through model.load_state_dict(sd) and "
                                                 "then opt.masters_from_model() on every rank"), e.value
    assert not HC.same(before, HC.snapshot(m, o)), "a refused reset_parameters changed something"
    fresh = torch.nn.Linear(96, 64)
    m[2].load_state_dict(fresh.state_dict())
    HC.backward(m, 0, 0)
    with pytest.raises(RuntimeError, match=r"^ShardedOptimizer.step: call opt.masters_from_model\(\) \(train on "
                                           r"from what was written\) or opt.model_from_masters\(\) \(undo it\) on "
                                           r"every rank: 2.weight was written"):
        o.step()
    assert all(torch.equal(a, t) for a, t in zip(before["masters"], o._master)) and o.steps == 0
    o.masters_from_model()
    assert getattr(m[2], "_mxs_loaded", None) is None
    full = C.full_masters(o)
    assert torch.equal(full["2.weight"], fresh.weight.detach().reshape(-1))
    assert torch.equal(full["2.bias"], fresh.bias.detach().reshape(-1))
    o.zero_grad()
    HC.backward(m, 0, 1)
    o.step()
    assert o.steps == 1
    o.close()

# SPDX-License-Identifier: MIT
"""The converted linear's forward and backward as torch.library custom ops, so
that torch.compile of a block traces through a converted linear (no graph
break) and runs the library's GEMM paths on the same bytes as eager.

    mxshard::param_linear(x, weight, bias, plan) -> y
        y = x @ deq(row plane)^T (+ bias), in the module's compute dtype
    mxshard::param_linear_backward(gy, x, weight, plan, need_gx, need_gw, need_gb) -> [gx?, gw?, gb?]
        gx = gy @ deq(dgrad plane), gw = gy^T @ x (the weight's dtype), gb = sum of gy

`plan` names the module's prepared plan: the entry of PLANS that
`register(module)` gave it when convert() built it (the cuBLASLt pattern: a
handle made once, tensors bound per call). The ops find the quantized bytes
through it (the GatheredWeight FSDP2 just gathered, or the module's own
quantization of its master, once per master version), never through the
`weight` argument: that one is there for autograd (its gradient) and for
torch.compile's graph (what the op reads). Under FSDP2 the weight is a
GatheredWeight, which hands these ops a zero-size stand-in
(fsdp.gathered); a QuantMaster hands them its inner tensor.

The fake implementations give torch.compile the output shapes and dtypes
from the plan alone. Eager calls (outside torch.compile) take ParamLinearFn,
the same two rules (_forward, _backward_parts) without the custom ops'
dispatch, which costs host time on every call.
"""
from __future__ import annotations

import weakref
from typing import List, Optional

import torch

from ..gemm import paths as _gemm
from .gathered import GatheredWeight
from .group import _replaced_message
from .master import QuantMaster

__all__ = ["register", "param_linear", "param_linear_backward", "ParamLinearFn", "OPS"]

_PLANS = []   # plan id -> weakref of its module (a module's copy registers anew: __setstate__)


def register(module):
    """A new plan id for `module` (at convert() and when a module is copied or unpickled)."""
    _PLANS.append(weakref.ref(module))
    return len(_PLANS) - 1


def _module(plan):
    m = _PLANS[plan]() if 0 <= plan < len(_PLANS) else None
    if m is None:
        raise RuntimeError(f"mxshard: keep the converted model alive while a program traced from it runs "
                           f"(torch.export, torch.compile), or export the model with export_safetensors and load "
                           f"the file into a plain model: the program's mxshard ops name converted linear {plan}, "
                           f"which was freed")
    return m


def _primary(module, w, plane):
    """The primary holding `plane` for this use: the gathered one, one fetched on demand (used
    once), or the module's own (no FSDP2)."""
    if isinstance(w, GatheredWeight):
        p = w.plane(plane)
        return p if p is not None else module._group.fetch_plane(w, plane)
    return module._group.local_primary(w)


def refuse_functorch(name, *tensors):
    """Raises when a torch.func transform (vmap, grad, jacrev, jvp, ...) wraps a tensor of the call:
    the quantized GEMM runs outside autograd's functional machinery, so it cannot be batched or
    transformed."""
    wrapped = torch._C._functorch.is_functorch_wrapped_tensor
    if any(t is not None and wrapped(t) for t in tensors):
        raise RuntimeError(
            f"mxshard: leave {name} out of convert() (skip=[...]) to run torch.func transforms (vmap, grad, "
            f"jacrev, jvp, functional_call under grad) through it, or apply them to the plain model: a converted "
            f"linear computes with its quantized weight outside autograd's functional machinery, so it cannot "
            f"be batched or differentiated by torch.func")


def refuse_forward_ad(name):
    """The jvp of both converted linears' autograd functions: forward-mode AD (torch.autograd.forward_ad
    dual tensors) through a converted linear."""
    raise RuntimeError(
        f"mxshard: leave {name} out of convert() (skip=[...]) to run forward-mode AD (torch.autograd.forward_ad, "
        f"dual tensors) through it, or use reverse mode (backward, torch.autograd.grad): a converted linear "
        f"multiplies by its quantized weight outside autograd's forward-mode machinery")


def _check_weight(module):
    """The weight tensor the forward can use (GatheredWeight or QuantMaster), or a clear error."""
    w = module._parameters.get("weight")
    if isinstance(w, (GatheredWeight, QuantMaster)):
        return w
    if isinstance(w, torch.Tensor):   # torch.func.grad(functional_call(...)) hands in a wrapped tensor
        refuse_functorch(module.meta.name, w)
    if "weight_orig" in module._parameters:   # torch.nn.utils.prune
        raise RuntimeError(
            f"mxshard: keep linears you prune (torch.nn.utils.prune) dense: leave {module.meta.name} out of "
            f"convert()'s policy (skip=[...]). Pruning moved the converted weight to "
            f"{module.meta.name}.weight_orig and sets weight = weight_orig * weight_mask before each forward, a "
            f"plain tensor the converted linear cannot multiply as its quantized bytes")
    from torch.nn.utils import parametrize
    if parametrize.is_parametrized(module, "weight") or "weight_g" in module._parameters:
        raise RuntimeError(
            f"mxshard: keep linears you parametrize (weight_norm, spectral_norm, register_parametrization) dense: "
            f"leave {module.meta.name} out of convert()'s policy (skip=[...]). A converted linear's weight must "
            f"stay its QuantMaster Parameter, and the parametrization moved it (to "
            f"{module.meta.name}.parametrizations.weight.original, or weight_g / weight_v)")
    from torch.distributed.tensor import DTensor
    if isinstance(w, DTensor):
        raise RuntimeError(
            f"mxshard: call the module fully_shard was applied to (or the root), not this submodule alone: "
            f"{module.meta.name}'s weight is still sharded (a DTensor); FSDP2 unshards it in that module's forward")
    raise RuntimeError(_replaced_message(module.meta.name, w))


def _forward(m, w, x, bias):
    """y = x @ deq(row)^T (+ bias), w the module's checked weight: the one forward rule of both
    paths below."""
    return _gemm.linear_fwd(x, _primary(m, w, "row"), bias, m.spec.compute_dtype)


def _refuse_double_backward(m):
    refuse_double_backward(m.meta.name or "this linear (the converted model's root)")


def refuse_double_backward(name):
    """Raise when a converted linear's backward runs with grad mode on (autograd.grad / backward
    with create_graph=True): its GEMMs read quantized planes, outside autograd, so a graph of the
    gradients would silently miss every term through the weight (and through x for gw). The one
    rule of both converted linears (this package's and ShardedOptimizer's)."""
    if torch.is_grad_enabled():
        raise RuntimeError(
            f"mxshard: keep layers that need double backward (create_graph=True: gradient penalties, "
            f"Hessian-vector products, MAML) dense: leave {name} out of convert()'s policy. Its "
            f"backward multiplies by the quantized weight outside autograd, so the gradients it returns "
            f"cannot be differentiated again (their terms through the weight would be silently missing)")


def _call_weight(m, weight):
    """The weight a call multiplies by (forward and input gradient): the master the call was given.
    The eager path hands in the QuantMaster itself (saved for backward: torch.func.functional_call
    swaps the module's weight for the call only, and an in-place write between forward and backward
    fails torch's saved-tensor check, as with nn.Linear). The custom ops get its inner tensor: the
    module's own master's (the module's weight), another one's (functional_call's fast weight under
    torch.compile, the parameter of a torch.export program: quantized as a master of this module's
    spec; it was ignored for the module's own, silently), or a zero-size stand-in (FSDP2's gathered
    weight, gathered again for the backward: the forward's planes are not kept, that is what
    resharding frees)."""
    if isinstance(weight, QuantMaster):
        return weight
    cur = _check_weight(m)
    if weight is None or isinstance(cur, GatheredWeight) or weight.numel() == 0:
        return cur
    if cur._data.data_ptr() == weight.data_ptr() and cur._data.shape == weight.shape:
        return cur   # (the module's own master's inner tensor)
    if tuple(weight.shape) != (m.out_features, m.in_features):
        raise ValueError(f"mxshard: give {m.meta.name}.weight a tensor of its shape {(m.out_features, m.in_features)}; "
                         f"got {tuple(weight.shape)}")
    data = weight.detach() if type(weight) is torch.nn.Parameter else weight
    return QuantMaster(data.contiguous(), m.meta)   # (another master's inner tensor)


def _backward_parts(m, gy, x, weight, weight_dtype, need_gx, need_gw, need_gb):
    """(gx, gw, gb), None where not needed: the one backward rule of both paths below. `weight`:
    what the forward saved (_call_weight)."""
    plane = m.spec.dgrad_plane()
    m._group.backward_ran = True   # (FSDPGroup: a forward after this one is a new micro-batch)
    gy2, gx, gb = _gemm.input_and_bias_grads(gy, m.spec.compute_dtype, need_gx, need_gb,
                                             lambda: _primary(m, _call_weight(m, weight), plane), plane)
    gw = _gemm.linear_wgrad(gy2, x.reshape(-1, x.shape[-1]), dtype=weight_dtype) if need_gw else None
    return gx, gw, gb


def refuse_orphan_weight(m):
    """A weight gradient for a converted linear whose ShardedOptimizer was closed (or freed): its
    weight is that optimizer's replicated quantized weight, whose masters went with it, so the
    gradient would train nothing (torch.optim over model.parameters() cannot step it). Called by
    the post-accumulate-grad hook close() leaves on that weight (a gradient wrt the input alone
    does not reach it)."""
    w = m._parameters.get("weight")
    if isinstance(w, GatheredWeight) and w._box.mesh is None:
        ref = getattr(m, "_mxs_owner", None)
        if (ref() if ref is not None else None) is None:
            raise RuntimeError(
                f"mxshard: build a new ShardedOptimizer on the model to train it on (mxt.ShardedOptimizer(model, "
                f"...)), or load a checkpoint into a freshly converted model to train it with torch.optim: the "
                f"ShardedOptimizer that trained {m.meta.name or 'this linear'} was closed, its weight is that "
                f"optimizer's replicated quantized weight and its masters went with it, so this gradient would "
                f"train nothing")


class ParamLinearFn(torch.autograd.Function):
    """The eager path: the same rules as the custom ops, without their dispatch (a converted linear
    calls it outside torch.compile; bench/RESULTS.md "Issue 35 (2026-12-06)" has the host time)."""

    @staticmethod
    def forward(ctx, x, weight, bias, module):
        ctx.module, ctx.weight_dtype, ctx.has_bias = module, weight.dtype, bias is not None
        ctx.save_for_backward(x)
        # the master is kept for the backward (not FSDP2's gathered weight: the backward gathers it
        # again) as a Python reference, not a saved tensor: a saved one would count as a second
        # holder, and model.to() / share_memory() swap a subclass Parameter only when none is left
        # (a graph kept from a forward would block them, as it does not with nn.Linear); its version
        # is checked as torch checks a saved tensor's
        ctx.weight = weight if isinstance(weight, QuantMaster) else None
        ctx.weight_version = weight._version if ctx.weight is not None else None
        return _forward(module, weight, x, bias)   # (the forward checked the weight)

    @staticmethod
    def jvp(ctx, *tangents):
        refuse_forward_ad(ctx.module.meta.name or "this linear (the converted model's root)")

    @staticmethod
    def backward(ctx, gy):
        _refuse_double_backward(ctx.module)
        (x,) = ctx.saved_tensors
        weight = ctx.weight
        if weight is not None and weight._version != ctx.weight_version:
            raise RuntimeError(
                f"one of the variables needed for gradient computation has been modified by an inplace "
                f"operation: {ctx.module.meta.name}.weight is at version {weight._version}; expected version "
                f"{ctx.weight_version} instead (mxshard: write into the weight after the backward, as with "
                f"nn.Linear)")
        gx, gw, gb = _backward_parts(ctx.module, gy, x, weight, ctx.weight_dtype, ctx.needs_input_grad[0],
                                     ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2])
        return gx, gw, gb, None


@torch.library.custom_op("mxshard::param_linear", mutates_args=())
def param_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], plan: int) -> torch.Tensor:
    m = _module(plan)
    return _forward(m, _call_weight(m, weight), x, bias)   # (the plan names the module: its spec and group)


@param_linear.register_fake
def _param_linear_fake(x, weight, bias, plan):
    m = _module(plan)
    return x.new_empty(tuple(x.shape[:-1]) + (m.out_features,), dtype=m.spec.compute_dtype)


@torch.library.custom_op("mxshard::param_linear_backward", mutates_args=())
def param_linear_backward(gy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, plan: int, need_gx: bool,
                          need_gw: bool, need_gb: bool) -> List[torch.Tensor]:
    gx, gw, gb = _backward_parts(_module(plan), gy, x, weight, weight.dtype, need_gx, need_gw, need_gb)
    return [t for t, need in ((gx, need_gx), (gw, need_gw), (gb, need_gb)) if need]


@param_linear_backward.register_fake
def _param_linear_backward_fake(gy, x, weight, plan, need_gx, need_gw, need_gb):
    m = _module(plan)
    out = [x.new_empty(x.shape, dtype=m.spec.compute_dtype)] if need_gx else []
    if need_gw:
        out.append(x.new_empty((m.out_features, m.in_features), dtype=weight.dtype))
    if need_gb:
        out.append(x.new_empty((m.out_features,), dtype=m.spec.compute_dtype))
    return out


def _setup_context(ctx, inputs, output):
    x, weight, bias, plan = inputs
    ctx.save_for_backward(x, weight)
    ctx.plan, ctx.has_bias = plan, bias is not None


def _backward(ctx, gy):
    if torch.is_grad_enabled():
        _refuse_double_backward(_module(ctx.plan))
    x, weight = ctx.saved_tensors
    need_gx, need_gw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    need_gb = ctx.has_bias and ctx.needs_input_grad[2]
    out = iter(param_linear_backward(gy, x, weight, ctx.plan, need_gx, need_gw, need_gb))
    gx = next(out) if need_gx else None
    gw = next(out) if need_gw else None
    gb = next(out) if need_gb else None
    return gx, gw, gb, None


param_linear.register_autograd(_backward, setup_context=_setup_context)

OPS = {torch.ops.mxshard.param_linear.default, torch.ops.mxshard.param_linear_backward.default}

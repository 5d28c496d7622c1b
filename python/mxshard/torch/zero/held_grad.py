# SPDX-License-Identifier: MIT
"""HeldGrad: what a dense parameter's `.grad` is under ShardedOptimizer once
its gradient went into the optimizer's bucket.

    backward   p.grad (autograd) -> dense_hook adds it into the bucket -> p.grad = HeldGrad
    backward   (no_sync, another micro-batch) autograd's p.grad += new  ->  added into the bucket
    anything else on it (clip_grad_norm_, p.grad.norm(), an optimizer of your own)
               -> RuntimeError: clip with ShardedOptimizer(max_grad_norm=...), step only it
               (clip_grad_value_: value clipping is not available, norm clipping is;
               DistributedDataParallel's reducer, an out= function or a copy from
               .grad: unwrap the model from DDP)

The gradient a parameter shows would be this rank's local, unreduced one,
and only for the dense parameters (the converted weights are no Parameters
under ShardedOptimizer), so a norm or a clip computed from `.grad` would be
silently wrong (torch.nn.utils.clip_grad_norm_ used to return 0 and clip
nothing). It holds no storage: its shape, dtype and device are the
parameter's. opt.zero_grad(), model.zero_grad() and the next forward after
a step drop it (set it to None).

The inner optimizer's parameters (opt.param_groups: views of the master
shards) hold one too between steps, so that clip_grad_norm_ over them, or
torch.amp.GradScaler's unscale_ (refused, saying to train in bfloat16),
raises instead of reading a stale local slice (or None) and clipping or
unscaling silently wrong; step() sets their .grad to the reduced shards
for the inner step alone.
"""
from __future__ import annotations

import torch

__all__ = ["HeldGrad"]

_aten = torch.ops.aten
_ACCUMULATE = {_aten.add_.Tensor, _aten.add.Tensor}
_KEEP = {_aten.zero_.default, _aten.detach_.default, _aten.detach.default, _aten.alias.default}


class HeldGrad(torch.Tensor):
    """The .grad of dense parameter `name` whose gradient ShardedOptimizer holds in `gview`; with
    gview None, the .grad of one of the inner optimizer's parameters (a view of a master shard)
    between steps."""

    @staticmethod
    def __new__(cls, param, gview, name):
        return torch.Tensor._make_wrapper_subclass(cls, param.shape, dtype=param.dtype, device=param.device)

    def __init__(self, param, gview, name):
        self._gview, self._name = gview, name

    def __repr__(self, *, tensor_contents=None):
        return f"HeldGrad({self._name!r}: held in ShardedOptimizer's gradient bucket)"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        me = args[0] if args and isinstance(args[0], HeldGrad) else None
        if me is not None and me._gview is not None and func in _ACCUMULATE and len(args) >= 2 and isinstance(args[1], torch.Tensor) \
                and not isinstance(args[1], (HeldGrad, torch.nn.Parameter)):
            # autograd accumulating another backward's gradient (grad += new, or grad + new)
            me._gview.add_(args[1].reshape(me._gview.shape), alpha=kwargs.get("alpha", 1))
            return me
        if me is not None and func in _KEEP:
            return me   # zero_grad(set_to_none=False): the bucket is zeroed by the optimizer
        names = sorted({t._name for t in _held_in((args, kwargs))})
        which = f"{', '.join(names[:3])}{', ...' if len(names) > 3 else ''}"
        why = (f"the optimizer holds the gradients in its buckets (reduced over the ranks in step()), so {func} "
               f"cannot run on the .grad of {which}")
        base = func.name().split("::")[-1].split(".")[0].lstrip("_")
        if base in _VALUE_CLIP:
            raise RuntimeError(
                f"ShardedOptimizer: gradient value clipping (torch.nn.utils.clip_grad_value_, clamping .grad) is "
                f"not available under ShardedOptimizer; what it offers is norm clipping: "
                f"ShardedOptimizer(..., max_grad_norm=...) (the global norm is opt.last_grad_norm). {why}")
        if base.startswith("amp_"):
            # torch.amp.GradScaler's unscale_ (_amp_foreach_non_finite_check_and_unscale_) and update
            raise RuntimeError(
                f"ShardedOptimizer: drop torch.amp.GradScaler and train in bfloat16 (torch.autocast(device_type, "
                f"dtype=torch.bfloat16) needs no loss scaling): GradScaler unscales and checks each .grad before "
                f"the step, and ShardedOptimizer reduces the gradients over the ranks inside step(), so it would "
                f"unscale and check this rank's local part only. {why}")
        if func._overloadname == "out" or (func is _aten.copy_.default and len(args) > 1
                                           and isinstance(args[1], HeldGrad) and not isinstance(args[0], HeldGrad)):
            # DistributedDataParallel's reducer copies (or scales with out=) every .grad into its own buckets
            raise RuntimeError(
                f"ShardedOptimizer: if the model is wrapped in DistributedDataParallel, unwrap it: ShardedOptimizer "
                f"reduces the gradients itself (build it on the bare model; opt.no_sync() for accumulation); to "
                f"clip, use ShardedOptimizer(..., max_grad_norm=...). {why}")
        raise RuntimeError(
            f"ShardedOptimizer: clip with ShardedOptimizer(..., max_grad_norm=...) (the norm: opt.last_grad_norm), "
            f"and step only the ShardedOptimizer (it owns the gradients: a torch.optim optimizer over "
            f"model.parameters(), a second one or one built before it, cannot step them; give parameters their "
            f"own settings with ShardedOptimizer(..., param_groups=...)): {why}")


# clip_grad_value_'s functions (torch._foreach_clamp_min_ / _max_, or .clamp_ per gradient)
_VALUE_CLIP = {"clamp", "clamp_", "clamp_min", "clamp_min_", "clamp_max", "clamp_max_", "clip", "clip_",
               "foreach_clamp_min", "foreach_clamp_min_", "foreach_clamp_max", "foreach_clamp_max_"}


def _held_in(tree):
    """The HeldGrad leaves of a pytree of arguments."""
    from torch.utils._pytree import tree_leaves
    return [x for x in tree_leaves(tree) if isinstance(x, HeldGrad)]

# SPDX-License-Identifier: MIT
"""ShardedOptimizer's side of convert()'s one converted linear.

convert(model, policy) makes every converted linear an MXFP8ParamLinear /
NVFP4ParamLinear: its `weight` is an nn.Parameter holding the master, so the
model trains as it is under any torch.optim optimizer, under FSDP2 and
with DCP. ShardedOptimizer (ZeRO-1: fp32 master SHARDS, replicated
primaries) keeps no full master on any rank, so at its construction each
such module becomes the MXFP8Linear / NVFP4Linear whose planes the optimizer
owns, quantized as the module's spec says (planes, layout, rounding / block,
compute dtype), its master the module's weight:

    before   model.fc: MXFP8ParamLinear   weight = Parameter(master [out, in])
    after    model.fc: MXFP8Linear        row_data / row_scale (/ col_*) views of the
                                          optimizer's buckets; the master: this rank's shard

A model under fully_shard is refused (FSDP2 and ShardedOptimizer are two
ways to shard the same masters: use one), and so is a frozen converted
weight (ShardedOptimizer trains every converted weight), and a converted weight
that another module also holds (a tie made after convert: keep tied weights
dense). From then on the
optimizer's writeback quantizes the masters, rounded through its own
round_through= (the module's spec.round_through served its own quantization
only). The swap is undone when the construction fails, so a failed
ShardedOptimizer leaves the model as it was.
"""
from __future__ import annotations

import types

from ..fsdp.linear import _PARAM_LINEAR_OWN, _ParamLinear, hand_over
from .linear import MXFP8Linear
from .nvfp4_linear import NVFP4Linear

__all__ = ["adopt_param_linears"]


def _check_adoptable(name, m):
    from torch.distributed.tensor import DTensor
    if isinstance(m._parameters.get("weight"), DTensor):
        raise ValueError(f"ShardedOptimizer: {name} is sharded by FSDP2 (fully_shard). Use one of the two: "
                         f"fully_shard with any torch.optim optimizer, or ShardedOptimizer on a model that is "
                         f"not fully_shard'ed; they shard the same masters two ways")
    w = m._parameters.get("weight")
    if getattr(w, "_backward_hooks", None) or getattr(w, "_post_accumulate_grad_hooks", None):
        raise ValueError(f"ShardedOptimizer: remove the gradient hooks registered on {name}.weight (register_hook, "
                         f"register_post_accumulate_grad_hook), or train with torch.optim / FSDP2, where they run: "
                         f"ShardedOptimizer adds a converted weight's gradient into its bucket, and would drop them "
                         f"silently (a hook on a dense parameter works)")
    if not m.weight.requires_grad:
        raise ValueError(f"ShardedOptimizer: {name}.weight is frozen (requires_grad=False). Keep frozen linears "
                         f"dense (convert(..., skip=...)) or unfreeze them: ShardedOptimizer trains every "
                         f"converted weight")


def _check_not_tied(name, m, holders):
    """A converted weight that another module also holds (a tie made after convert(), e.g.
    emb.weight = fc.weight) is refused: the optimizer would swap the linear for its own storage
    and the other module would keep the old Parameter (the tie silently broken)."""
    others = sorted({n for n, h in holders if h is not m})
    if others:
        raise ValueError(f"ShardedOptimizer: keep tied weights dense: convert the model with a policy (or skip=) "
                         f"that leaves {name!r} an nn.Linear, then tie. {name}.weight is also "
                         f"{', '.join(others)}; ShardedOptimizer holds a converted weight as quantized planes of its "
                         f"own, so the other module would keep the old Parameter and the tie would silently break")


def adopt_param_linears(model, undo):
    """Swaps every MXFP8ParamLinear / NVFP4ParamLinear of `model` for the MXFP8Linear / NVFP4Linear
    ShardedOptimizer owns (checked first, swapped after). Appends to `undo` the functions that put
    the modules back. Returns {id(old module) or id(its weight Parameter): new module}, so that
    param_groups may name what the user saw before the swap."""
    found, holders = [], {}
    for name, m in model.named_modules(remove_duplicate=False):
        if isinstance(m, _ParamLinear):
            _check_adoptable(name or "<root>", m)
            found.append((name, m))
        for pname, p in m._parameters.items():
            if p is not None:
                holders.setdefault(id(p), []).append((f"{name}.{pname}" if name else pname, m))
    for name, m in found:
        _check_not_tied(name or "<root>", m, holders.get(id(m._parameters.get("weight")), []))
    if found and found[0][0] == "":
        raise ValueError("ShardedOptimizer: the model is itself a converted linear; wrap it in an nn.Module "
                         "(nn.Sequential(model)) so that its optimizer can swap its storage")
    new_of, aliases = {}, {}
    for name, m in found:
        if id(m) not in new_of:
            s = m.spec
            lin = types.SimpleNamespace(in_features=m.in_features, out_features=m.out_features,
                                        weight=m.weight._data, bias=m.bias, training=m.training)
            cls = next(c for c in (MXFP8Linear, NVFP4Linear) if c.fmt == s.fmt)
            own = s.fmt.option   # the option only this format takes: rounding (MXFP8) or block (NVFP4)
            new = cls._from_linear(lin, s.compute_dtype, planes=s.planes, layout=s.layout, **{own: getattr(s, own)})
            new_of[id(m)] = new
            aliases[id(m)] = new
            aliases[id(m.weight)] = new
    moved = set()
    for name, m in found:
        if id(m) not in moved:   # (a module under several names: once)
            moved.add(id(m))
            undo.append(hand_over(m, new_of[id(m)], keep=_PARAM_LINEAR_OWN))   # its hooks keep running
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, child, new_of[id(m)])
        undo.append(lambda parent=parent, child=child, m=m: setattr(parent, child, m))
    return aliases

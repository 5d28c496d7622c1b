# SPDX-License-Identifier: MIT
"""ShardedOptimizer's items and buckets: which tensors it trains, and where
each rank's rows of them sit. Pure geometry except `collect` (reads the model).

    item        a converted linear's weight (its QuantMaster: [R, C]) or a trainable dense
                parameter (dim 0 its rows; a 0-d one is one row), in model order, tied ones once
    rank rows   FSDP2's dim-0 rule (fsdp_geometry.rank_rows): rank k holds rows
                [k*ch, min(R, (k+1)*ch)), ch = ceil(R / world)
    bucket      consecutive items up to bucket_size elements; every rank's SHARD of it is the
                same size S = sum of ch*C over its items (FSDP2's padded chunks, rank-major):

                  gradient buffer [world * S]   rank 0: item a rows 0..ch | item b rows 0..ch ...
                                                rank 1: item a rows ch..2ch | item b ...
                  reduce_scatter -> this rank's [S]; master shard [S] (fp32), same offsets

A rank's rows of an item are one contiguous [rows, C] view of its shard:
the inner optimizer's parameter, the library writeback's master (WeightUnit,
the FSDP2 engine) and a DTensor Shard(0) in checkpoints (DCP reshards them).
"""
from __future__ import annotations

import hashlib
import math
import sys

import torch
from torch import nn

from ... import fsdp_geometry as G
from ..fsdp.linear import _ParamLinear

__all__ = ["FSDP_ADVICE", "fsdp_touched", "Item", "BucketGeometry", "collect", "buckets", "resolve_groups", "fingerprint", "DTYPES"]

FSDP_ADVICE = "Use ShardedOptimizer or FSDP2's fully_shard for a model, not both:"
DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def fsdp_touched(model):
    """(names of the modules of `model` that fully_shard made FSDP2 modules, names of its
    parameters that are DTensors)."""
    cls = getattr(sys.modules.get("torch.distributed.fsdp"), "FSDPModule", None)
    try:
        from torch.distributed.tensor import DTensor
    except Exception:  # noqa: BLE001
        DTensor = None
    mods, params = [], []
    for name, m in model.named_modules(remove_duplicate=False):
        if cls is not None and isinstance(m, cls):
            mods.append(name or "<root>")
        if DTensor is not None:
            for pn, p in m._parameters.items():
                if isinstance(p, DTensor):
                    params.append(f"{name}.{pn}" if name else pn)
    return mods, params


class Item:
    """One trainable tensor: a converted linear's weight (module set) or a dense parameter."""

    def __init__(self, name, shape, dtype, module=None, param=None):
        self.name, self.shape, self.dtype = name, tuple(shape), dtype
        self.module, self.param = module, param
        self.rows = self.shape[0] if self.shape else 1
        self.cols = math.prod(self.shape[1:]) if len(self.shape) > 1 else 1
        self.numel = self.rows * self.cols
        self.group = 0
        self.live = None   # a converted weight's Parameter under the optimizer (optim._attach)

    def live_param(self):
        """The Parameter the model holds for this item now (a converted weight's replicated one)."""
        return self.live if self.live is not None else self.param

    @property
    def kind(self):
        if self.module is None:
            return "dense"
        s = self.module.spec
        return f"{s.format}_{s.planes}"

    def describe(self):
        """What enters the fingerprint: name, shape, kind, dtype, the spec's options, group."""
        spec = tuple(str(v) for v in self.module.spec) if self.module is not None else ()
        return (self.name, self.shape, self.kind, DTYPES.get(self.dtype, str(self.dtype)), spec, self.group)


class BucketGeometry:
    """Items [i0, i1) of the model's list: each item's offset in a rank's shard (its padded
    chunk ch*C elements) and the shard size S (the same on every rank)."""

    def __init__(self, index, items, world):
        self.index, self.items, self.world = index, items, world
        self.offsets, at = [], 0
        for it in items:
            self.offsets.append(at)
            at += G.chunk_rows(it.rows, world) * it.cols
        self.shard = at

    def rows_of(self, pos, rank):
        it = self.items[pos]
        return G.rank_rows(it.rows, self.world, rank)

    def view(self, buf, pos, rank):
        """Item `pos`'s rows of rank `rank` in a [S] shard buffer: [rows, *shape[1:]] (0-d: [rows])."""
        it = self.items[pos]
        r0, r1 = self.rows_of(pos, rank)
        o = self.offsets[pos]
        return buf[o:o + (r1 - r0) * it.cols].view((r1 - r0,) + it.shape[1:])

    def chunks(self, buf, pos):
        """Item `pos`'s padded chunks in a rank-major [world * S] buffer: a [world, ch*C] view."""
        it = self.items[pos]
        ch = G.chunk_rows(it.rows, self.world)
        o = self.offsets[pos]
        return buf.view(self.world, self.shard)[:, o:o + ch * it.cols]


def add_rows(chunks, full, rows, cols, world):
    """Adds a full [rows, ...] tensor into its [world, ch*cols] rank-major chunks (ranks past the
    last row get nothing)."""
    ch = G.chunk_rows(rows, world)
    nf, rem = rows // ch, rows % ch
    flat = full.reshape(-1)
    if nf:
        chunks[:nf].add_(flat[:nf * ch * cols].view(nf, ch * cols))
    if rem:
        chunks[nf, :rem * cols].add_(flat[nf * ch * cols:])


def collect(model):
    """(items, frozen dense parameters [(name, p)], {name: item}) in model order. A converted
    linear (MXFP8ParamLinear / NVFP4ParamLinear) gives its weight as one item (its bias, if any,
    is a dense item like any parameter)."""
    items, frozen, names, seen = [], [], {}, set()
    for mname, m in model.named_modules():
        for pname, p in m.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            name = f"{mname}.{pname}" if mname else pname
            if isinstance(m, _ParamLinear) and pname == "weight":
                items.append(Item(name, p.shape, p.dtype, module=m, param=p))
            elif not p.requires_grad:
                frozen.append((name, p))
                continue
            else:
                if p.dtype not in DTYPES:
                    raise TypeError(f"ShardedOptimizer: cast {name} to float32, bfloat16 or float16 (model.float()): "
                                    f"its dtype {p.dtype} is not one a dense parameter may have")
                if p.numel() == 0:
                    raise ValueError(f"ShardedOptimizer: give {name} at least one element, or freeze it: an empty "
                                     f"parameter")
                items.append(Item(name, p.shape, p.dtype, param=p))
            names[name] = items[-1]
            if items[-1].module is not None:
                names.setdefault(mname, items[-1])
    if not items:
        raise ValueError("ShardedOptimizer: give it a model with trainable parameters (this one has none)")
    return items, frozen, names


def buckets(items, bucket_size, world):
    """Consecutive items, a new bucket when the next would pass bucket_size elements."""
    out, cur, n = [], [], 0
    for it in items:
        if cur and n + it.numel > bucket_size:
            out.append(BucketGeometry(len(out), cur, world))
            cur, n = [], 0
        cur.append(it)
        n += it.numel
    if cur:
        out.append(BucketGeometry(len(out), cur, world))
    return out


def resolve_groups(param_groups, items, names):
    """Sets item.group; returns the options of each group (items named nowhere: a last group
    without overrides). Entries: Parameters, converted linears (their weight) or names."""
    if param_groups is None:
        return [{}]
    if isinstance(param_groups, dict) or not isinstance(param_groups, (list, tuple)):
        raise TypeError("ShardedOptimizer: pass param_groups as a list of dicts {'params': [...], **options}")
    by_id = {}
    for it in items:
        by_id[id(it.param)] = it
        if it.module is not None:
            by_id[id(it.module)] = it
    assigned, options = {}, []
    for gi, g in enumerate(param_groups):
        if not isinstance(g, dict) or "params" not in g:
            raise TypeError(f"ShardedOptimizer: give param_groups[{gi}] a 'params' entry (a dict {{'params': [...], "
                            f"**options}})")
        ps = g["params"]
        if isinstance(ps, (torch.Tensor, nn.Module, str)):
            ps = [ps]
        if isinstance(ps, set):
            raise TypeError(f"ShardedOptimizer: make param_groups[{gi}]['params'] a list (a set has no defined order)")
        for e in list(ps):
            if isinstance(e, str):
                it, what = names.get(e), f"name {e!r}"
            elif isinstance(e, (torch.Tensor, _ParamLinear)):
                it = by_id.get(id(e))
                what = f"a {type(e).__name__}" + (f" of shape {tuple(e.shape)}" if isinstance(e, torch.Tensor) else "")
            else:
                raise TypeError(f"ShardedOptimizer: list Parameters, converted linears or names in param_groups[{gi}], "
                                f"got {type(e).__name__}")
            if it is None:
                raise ValueError(f"ShardedOptimizer: param_groups[{gi}]: {what} is not a trainable item of the model")
            if id(it) in assigned:
                raise ValueError(f"ShardedOptimizer: list {it.name} once: it is in group {assigned[id(it)]} and in "
                                 f"group {gi}")
            assigned[id(it)] = gi
            it.group = gi
        options.append({k: v for k, v in g.items() if k != "params"})
    rest = [it for it in items if id(it) not in assigned]
    for it in rest:
        it.group = len(options)
    if rest:
        options.append({})
    return options


def plain(v):
    """Options that enter the fingerprint: plain numbers / strings and tuples of them."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return True
    return isinstance(v, (tuple, list)) and all(plain(x) for x in v)


def fingerprint(items, extra):
    """A 63-bit digest of every item's description and the options that must agree."""
    h = hashlib.sha256(repr([it.describe() for it in items] + list(extra)).encode()).digest()
    return int.from_bytes(h[:8], "little") >> 1

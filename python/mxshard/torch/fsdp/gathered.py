# SPDX-License-Identifier: MIT
"""GatheredWeight: the unsharded weight FSDP2 hands a converted linear between
its all-gather and its reshard. It reports the weight's [out, in] shape and
the parameter dtype (what its gradient is), holds no high-precision values
and no storage of its own: only the quantized plane(s) just gathered.

    FSDP2 unshard -> fsdp_post_all_gather -> GatheredWeight (box: {"row": MXFP8Weight}) -> module.weight
    forward:  the row plane;  backward: the dgrad plane (gathered by the backward's unshard)
    a plane that is not there (the forward recomputed by activation checkpointing inside the
    backward, or reshard_after_forward=False keeping the forward's gather for the backward) is
    all-gathered on demand by the module, used once and dropped (fetch_plane)

Every alias FSDP2 makes of it (as_strided, the Parameter's detach) shares one
_Box, so the planes FSDP2's later gathers write (post_all_gather with out=)
are the planes every alias sees. The converted linear's own ops
(mxshard::param_linear and its backward, fsdp.ops) get a zero-size stand-in
(they read the planes through the module's plan); any other op raises: the
tensor has no values to compute with.

torch.compile traces through it (a block compiled, then fully_shard): it is a
traceable wrapper subclass whose one inner tensor is a zero-size stub of its
dtype and device, and whose flatten context is its _Box (equal only to itself,
so a guard on it holds while FSDP2 refills the same unsharded weight). The
compiled graph calls the same custom ops, which find the planes through the
plan at run time.
"""
from __future__ import annotations

import torch

__all__ = ["GatheredWeight", "is_gathered"]

_ALIASES = {torch.ops.aten.detach.default, torch.ops.aten.alias.default, torch.ops.aten.as_strided.default,
            torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default}


class _Box:
    """What every alias of one unsharded weight shares: the gathered primaries by plane, the
    sharded source (the QuantMaster this rank owns), the device mesh of the gathers and the
    scratch FSDP2 allocates and frees with the unsharded weight (the converted scales)."""

    __slots__ = ("planes", "source", "mesh", "scratch", "stub")

    def __init__(self, source, mesh):
        self.planes, self.source, self.mesh, self.scratch, self.stub = {}, source, mesh, None, None

    def __deepcopy__(self, memo):
        # torch.compile's guards keep a deep copy of a subclass's flatten context and compare it
        # with ==: the box is the weight's identity (equal only to itself), never its values
        return self


_LOOKUPS = {"embedding", "embedding_bag", "_embedding_bag", "_embedding_bag_forward_only", "index_select",
            "gather", "take"}   # ops that read a tied weight's values by index (an embedding)


class GatheredWeight(torch.Tensor):
    """The unsharded [out, in] weight of a converted linear under FSDP2 (see the module doc)."""

    @staticmethod
    def __new__(cls, shape, dtype, device, box, requires_grad=False, stub=None):
        return torch.Tensor._make_wrapper_subclass(cls, shape, dtype=dtype, device=device,
                                                   requires_grad=requires_grad)

    def __init__(self, shape, dtype, device, box, requires_grad=False, stub=None):
        self._box = box
        if stub is None:   # (one per box: FSDP2's aliases of the weight share it)
            stub = box.stub
            if stub is None or stub.dtype != dtype or stub.device != device:
                stub = box.stub = torch.empty(0, dtype=dtype, device=device)
        self._stub = stub

    def __tensor_flatten__(self):
        return ["_stub"], self._box

    @staticmethod
    def __tensor_unflatten__(inner, box, outer_size, outer_stride):
        s = inner["_stub"]
        return GatheredWeight(tuple(outer_size), s.dtype, s.device, box, stub=s)

    def __repr__(self, *, tensor_contents=None):
        m = self._box.source._meta
        return f"GatheredWeight({m.name!r}, {tuple(self.shape)}, planes gathered={sorted(self._box.planes)})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if func in _ALIASES:
            t = args[0]
            shape = tuple(args[1]) if func is not torch.ops.aten.detach.default and len(args) > 1 else tuple(t.shape)
            if func is torch.ops.aten.as_strided.default or func in (torch.ops.aten.view.default,
                                                                     torch.ops.aten._unsafe_view.default):
                if shape != tuple(t.shape):
                    _refuse_wrapper(t)
                    raise RuntimeError(f"mxshard: a gathered quantized weight {tuple(t.shape)} cannot be viewed "
                                       f"as {shape}")
            return GatheredWeight(t.shape, t.dtype, t.device, t._box)
        if func is torch.ops.aten.clone.default and args[0]._box.mesh is None:
            t = args[0]   # (copy.deepcopy of a model under ShardedOptimizer: the copy holds its own planes)
            _refuse_wrapper(t)
            return GatheredWeight(t.shape, t.dtype, t.device, _copy_box(t._box))
        if func.namespace == "mxshard":  # the converted linear's own ops (fsdp.ops) read the planes themselves
            return func(*_stand_ins(args), **_stand_ins(kwargs or {}))
        from torch.utils._pytree import tree_leaves
        g = next((t for t in tree_leaves((args, kwargs or {})) if isinstance(t, GatheredWeight)), None)
        meta = g._box.source._meta if g is not None else None
        what = f"{meta.name}.weight" if meta is not None and meta.name else "this converted weight"
        fmt = meta.spec.format.upper() if meta is not None else "MXFP8/NVFP4"
        from .master import _MATMULS
        if func.name().split("::")[-1].split(".")[0] in _MATMULS | {"t", "transpose", "permute", "numpy_T"}:
            # F.linear(x, self.qkv.weight) in a forward (t + addmm), x @ w.T
            mod = meta.name if meta is not None and meta.name else "the module"
            where = "ShardedOptimizer it is the replicated" if g is not None and g._box.mesh is None else \
                "FSDP2 it is the gathered"
            raise NotImplementedError(
                f"mxshard: call the module to multiply by {what} ({mod}(x)), or keep {mod} dense "
                f"(convert(..., skip=[{mod!r}])): under {where} {fmt} weight, which holds "
                f"quantized planes, not values, so {func} cannot run on it; the module's own forward multiplies "
                f"by them")
        if func.name().split("::")[-1].split(".")[0] in _LOOKUPS:
            # emb.weight = head.weight after convert(): the embedding reads the gathered bytes
            mod = meta.name if meta is not None and meta.name else "the converted linear"
            raise NotImplementedError(
                f"mxshard: keep {mod} dense (convert(..., skip=[{mod!r}])) while another module shares its weight "
                f"(a tie such as embedding.weight = {what}, made after convert()): under FSDP2 the shared weight is "
                f"the gathered {fmt} weight, which holds quantized planes, not values, so {func} cannot read it")
        if g is not None and g._box.mesh is None:   # ShardedOptimizer's replicated weight
            _refuse_wrapper(g)
            raise NotImplementedError(
                f"mxshard: write {what} through model.load_state_dict(sd) and then opt.masters_from_model() on "
                f"every rank (or load a checkpoint with mxt.load_checkpoint), and read its values with "
                f"mxshard.torch.dequantized_weight(module): under ShardedOptimizer it is the replicated {fmt} weight, "
                f"which holds quantized planes, not values (the fp32 masters are the optimizer's shards), so "
                f"{func} cannot run on it")
        raise NotImplementedError(
            f"mxshard: call reshard() on the fully_shard module that holds {what} (model.reshard() reshards "
            f"the root's own parameters only; for all: `for mod in model.modules(): if isinstance(mod, "
            f"FSDPModule): mod.reshard()`), or run the module (module(x)), before reading {what}: under FSDP2 "
            f"(reshard_after_forward=False keeps it after a forward) it is still the gathered {fmt} weight, "
            f"which holds quantized planes, not values, so {func} cannot run on it. For the values the forward "
            f"multiplies by, call mxshard.torch.dequantized_weight(module) while the module is unsharded")

    # -- planes

    def plane(self, name):
        """The primary holding plane `name` ("row" | "col"), or None when it was not gathered."""
        return self._box.planes.get(name)

    @property
    def source(self):
        """The sharded master (QuantMaster) this rank owns."""
        return self._box.source


_WRAPPERS = (("torch.nn.parallel.distributed", None,
              "mxshard: if the model is wrapped in DistributedDataParallel, unwrap it: ShardedOptimizer reduces the "
              "gradients itself (build it on the bare model; opt.no_sync() for accumulation). DDP cannot flatten "
              "{what}: it is ShardedOptimizer's replicated quantized weight, planes, not values"),
             ("torch.distributed.fsdp", None,
              "Use ShardedOptimizer or FSDP2's fully_shard for a model, not both: fully_shard cannot shard "
              "{what}, ShardedOptimizer's replicated quantized weight (it shards the same masters another way). To "
              "use FSDP2, build the model again (convert(), then fully_shard) with a torch.optim optimizer; to use "
              "ShardedOptimizer, do not call fully_shard on its model"),
             ("torch.optim.swa_utils", None,
              "Keep an EMA (or any average) of a model trained by ShardedOptimizer yourself from each quantized "
              "linear's module.weight values (mxshard.torch.dequantized_weight(module)), or train under torch.optim "
              "/ FSDP2, where converted weights hold their masters. {what} is ShardedOptimizer's replicated "
              "quantized weight (the FP32 masters are its shards): averaging its FP8 / FP4 bytes, or copying them "
              "over an average, would be silently wrong"),
             ("torch.optim", None,
              "ShardedOptimizer: clip with ShardedOptimizer(..., max_grad_norm=...) (the norm: opt.last_grad_norm), "
              "and step only the ShardedOptimizer (it owns the gradients and the masters: a torch.optim optimizer "
              "over model.parameters(), a second one or one built before it, cannot step {what}, its replicated "
              "quantized weight; give parameters their own settings with ShardedOptimizer(..., param_groups=...))"),
             ("torch.nn.modules.module", "_apply",
              "Cast or move the model before building the ShardedOptimizer (model.to(...), then "
              "ShardedOptimizer(model, ...)): {what} is its replicated quantized weight, whose planes keep their "
              "codes and device"))


def _refuse_wrapper(g):
    """Raises what to do when DistributedDataParallel, fully_shard, an EMA, a torch.optim optimizer
    or a cast (found among the callers) takes ShardedOptimizer's replicated weight `g`; returns
    otherwise."""
    import sys
    meta = g._box.source._meta
    what = f"{meta.name}.weight" if meta.name else "this converted weight"
    f = sys._getframe(1)
    while f is not None and g._box.mesh is None:
        mod = f.f_globals.get("__name__", "")
        for prefix, fn, msg in _WRAPPERS:
            if mod.startswith(prefix) and (fn is None or f.f_code.co_name == fn):
                raise RuntimeError(msg.format(what=what))
        f = f.f_back


def _copy_box(box):
    """A deep copy of ShardedOptimizer's replicated weight (copy.deepcopy of its model): the same
    planes' bytes, owned by the copy (no optimizer writes them)."""
    import copy
    new = _Box(box.source, None)
    new.planes = copy.deepcopy(box.planes)
    return new


def _stand_ins(tree):
    """`tree` with every GatheredWeight replaced by a zero-size tensor of its dtype and device: the
    mxshard ops find the planes through their plan (fsdp.ops), the tensor only names the weight."""
    from torch.utils._pytree import tree_map_only
    return tree_map_only(GatheredWeight, lambda g: torch.empty(0, dtype=g.dtype, device=g.device), tree)


def is_gathered(t) -> bool:
    return isinstance(t, GatheredWeight)

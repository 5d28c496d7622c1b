# SPDX-License-Identifier: MIT
"""ShardedOptimizer: ZeRO-1 (Megatron's distributed optimizer) over the one
converted model: fp32 master SHARDS in the optimizer, replicated weights in
the model, built from FSDP2's pieces.

    model = mxshard.torch.convert(model, policy="row")
    opt = mxshard.torch.ShardedOptimizer(model, lambda groups: torch.optim.AdamW(groups, lr=1e-3))
    for batch in data:
        model(batch).sum().backward()    # hooks add each gradient into its bucket, reduce full buckets
        opt.step()                       # reduce -> norm/clip -> inner step on the shards -> writeback
        opt.zero_grad()

What it holds (items.py draws the layout): per bucket an fp32 master shard
(this rank's rows of every item, FSDP2's dim-0 rule) and a gradient buffer;
the inner optimizer (an elementwise torch.optim optimizer built by
`optimizer_factory`) steps one [rows, ...] view per item. The model keeps its
converted linears (MXFP8ParamLinear / NVFP4ParamLinear): each one's weight
becomes the replicated quantized weight FSDP2 would gather (a GatheredWeight
holding every plane, rebuilt after each step), so its forward and backward
are FSDP2's; dense parameters stay plain, replicated Parameters.

step(), in order:
  1. every bucket's reduction (reduce_scatter; gloo: all_reduce) launched and waited;
     local checks (nothing replaced, written or frozen behind the optimizer's back);
  2. ONE all_reduce(SUM) of [sum of squares of this rank's shards, failed, any gradient]:
     a failure anywhere raises everywhere; no gradient anywhere: nothing moves;
     `last_grad_norm`, and clipping with `max_grad_norm` (clip_grad_norm_'s formula);
  3. the inner step on the shards;
  4. the writeback (refresh.py): ONE MAX all-reduce for every converted weight (+ status),
     then per bucket ONE all_gather of the quantized bytes and dense values.

Collectives per step (world > 1), counted in `opt.collectives`: one reduction per
bucket, all_reduce_norm 1, all_reduce_max 1, all_gather 1 per bucket.

Checkpoints: state_dict() is DCP's form (every master and inner state tensor a
DTensor Shard(0) of its full shape, keyed by the item's name): dcp.save /
dcp.load of {"optim": opt} reshard across world sizes; mxt.save_checkpoint
does that. Failures never hang the group: every rank raises.
"""
from __future__ import annotations

import contextlib
import functools
import gc
import math
import weakref
from collections import Counter, OrderedDict, namedtuple

import torch
from torch import nn

from ... import _lib as L
from ..fsdp.gathered import GatheredWeight, _Box
from ..fsdp.linear import _ParamLinear
from ..fsdp.master import QuantMaster, WeightMeta
from . import compat
from .comm import Comm
from .grads import GRAD_DTYPES, Gradients, _Into, grad_hook, module_owner, sum_squares, zero_pending_hook
from .held_grad import HeldGrad
from .items import FSDP_ADVICE as _FSDP_ADVICE, Item, buckets, collect, fingerprint, fsdp_touched, plain, resolve_groups
from .refresh import Refresh
from .state import FORMAT, StateDict

__all__ = ["ShardedOptimizer", "FORMAT", "ItemRow"]

ItemRow = namedtuple("ItemRow", "name kind bucket offset shape")

_ROUND_THROUGH = {None: "none", "none": "none", "f32": "none", "bf16": "bf16", "f16": "f16"}


class ShardedOptimizer(Gradients, StateDict, torch.optim.Optimizer):
    """ZeRO-1 over `model` (see the module doc); a torch.optim.Optimizer whose param_groups are
    the inner optimizer's.

    model              a converted model (mxshard.torch.convert) or any nn.Module; not under
                       fully_shard or DistributedDataParallel
    optimizer_factory  callable(list of param-group dicts) -> an elementwise torch.optim optimizer
    process_group      a torch.distributed group (default: the world, or a world of one)
    bucket_size        elements per bucket (about; a larger item gets its own)
    param_groups       [{"params": [...], **options}]: Parameters, converted linears or names
    grad_reduce        "mean" or "sum";  max_grad_norm: clip the global 2-norm (None: no clip)
    round_through      "bf16" (Transformer Engine's), "f16" or None: what every converted
                       weight's master is rounded through before quantizing
    rounding           "ceil" / "floor" for every MXFP8 weight (None: each module's)
    overlap            reduce buckets from the backward hooks;  grad_dtype: float32 / bfloat16
    align              accepted for compatibility: buckets follow FSDP2's dim-0 chunks now
    assume_elementwise accept an inner optimizer outside torch.optim's elementwise ones
    """

    def __init__(self, model, optimizer_factory, process_group=None, bucket_size=40_000_000, *,
                 param_groups=None, grad_reduce="mean", max_grad_norm=None, round_through="bf16",
                 rounding=None, overlap=True, align=128, grad_dtype=torch.float32, assume_elementwise=False):
        for k in ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks", "_optimizer_state_dict_pre_hooks",
                  "_optimizer_state_dict_post_hooks", "_optimizer_load_state_dict_pre_hooks",
                  "_optimizer_load_state_dict_post_hooks"):
            setattr(self, k, OrderedDict())
        self._warned_capturable_if_run_uncaptured = True
        self._patch_step_function()
        self.comm = Comm(process_group)
        self.world, self.rank = self.comm.world, self.comm.rank
        self.setup_collectives, self.collectives = Counter(), Counter()
        self.comm.counts = self.setup_collectives
        self.last_grad_norm, self.steps, self.inner, self.fingerprint = None, 0, None, 0
        self._closed, self._sync, self._zero_pending = False, True, False
        self._geoms, self._items, self._handles, self._undo = [], [], [], []
        self._grad, self._shard, self._master, self._into = [], [], [], []
        self._refresh, self._model_ref, self._described, self._view_held = None, None, [], None
        self._reset()
        err = None
        try:
            self._validate(bucket_size, grad_reduce, max_grad_norm, round_through, rounding, overlap, align,
                           grad_dtype, optimizer_factory)
            self._build(model, optimizer_factory, param_groups, assume_elementwise)
        except Exception as e:  # noqa: BLE001 - the group learns of it first
            err = e
        try:
            self._agree(err)
        finally:
            err = None
        try:
            self._attach(model)
            self._writeback(None)
        except Exception:
            self._rollback()
            self._release()
            raise
        self._undo = []
        self.comm.counts = self.collectives
        self._zero_grads(True)
        self._hold_view_grads()
        if self.comm.dist is not None:
            # at interpreter exit (an optimizer still alive, close() not called): one gc pass while the
            # interpreter is whole, so that what still holds the process group goes first
            weakref.finalize(self, gc.collect)

    # ---- construction --------------------------------------------------------------------

    def _validate(self, bucket_size, grad_reduce, max_grad_norm, round_through, rounding, overlap, align,
                  grad_dtype, factory):
        if not callable(factory):
            raise TypeError("ShardedOptimizer: pass optimizer_factory as a callable (list of param-group dicts -> "
                            "a torch.optim optimizer), e.g. lambda g: torch.optim.AdamW(g, lr=1e-3)")
        for name, v in (("bucket_size", bucket_size), ("align", align)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"ShardedOptimizer: pass {name} as an int >= 1, got {v!r}")
        if grad_reduce not in ("mean", "sum"):
            raise ValueError(f"ShardedOptimizer: pass grad_reduce='mean' or 'sum', got {grad_reduce!r}")
        if max_grad_norm is not None and (isinstance(max_grad_norm, bool) or not isinstance(max_grad_norm, (int, float))
                                          or not max_grad_norm > 0 or not math.isfinite(max_grad_norm)):
            raise ValueError(f"ShardedOptimizer: pass max_grad_norm as a positive number or None, got {max_grad_norm!r}")
        if round_through not in _ROUND_THROUGH:
            raise ValueError(f"ShardedOptimizer: pass round_through='bf16', 'f16' or None, got {round_through!r}")
        if rounding not in (None, "ceil", "floor"):
            raise ValueError(f"ShardedOptimizer: pass rounding='ceil', 'floor' or None, got {rounding!r}")
        if not isinstance(overlap, bool):
            raise TypeError(f"ShardedOptimizer: pass overlap as a bool, got {type(overlap).__name__}")
        if grad_dtype not in GRAD_DTYPES:
            raise ValueError(f"ShardedOptimizer: pass grad_dtype=torch.float32 or torch.bfloat16, got {grad_dtype!r}")
        self.bucket_size, self.align, self.grad_reduce, self.max_grad_norm = bucket_size, align, grad_reduce, max_grad_norm
        self.round_through, self.rounding, self.overlap, self.grad_dtype = round_through, rounding, overlap, grad_dtype

    def _build(self, model, factory, param_groups, assume_elementwise):
        if not isinstance(model, nn.Module):
            raise TypeError(f"ShardedOptimizer: pass an nn.Module, got {type(model).__name__}")
        compat.check_not_ddp(model)
        mods, params = fsdp_touched(model)
        if mods or params:
            raise ValueError(f"{_FSDP_ADVICE} ShardedOptimizer: use one of the two: fully_shard with any torch.optim "
                             f"optimizer, or ShardedOptimizer on a model that is not fully_shard'ed; they shard the "
                             f"same masters two ways")
        items, self._frozen, names = collect(model)
        holders = {}
        for mname, m in model.named_modules(remove_duplicate=False):
            for pname, p in m._parameters.items():
                if p is not None:
                    holders.setdefault(id(p), set()).add(f"{mname}.{pname}" if mname else pname)
        for it in items:
            if it.module is not None:
                self._check_converted(it, holders.get(id(it.param), set()))
        converted = {id(it.param) for it in items if it.module is not None}
        for mname, m in model.named_modules():   # a converted weight tied into a module that comes first
            w = m._parameters.get("weight") if isinstance(m, _ParamLinear) else None   # (emb.weight = fc.weight)
            if w is not None and id(w) not in converted:
                self._check_converted(Item(f"{mname}.weight", w.shape, w.dtype, module=m, param=w),
                                      holders.get(id(w), set()))
        devs = {str(it.param.device) for it in items}
        if len(devs) > 1:
            raise ValueError(f"ShardedOptimizer: move the model to one device (model.to(device)); its parameters are "
                             f"on {sorted(devs)}")
        self.device = device = items[0].param.device
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"ShardedOptimizer: keep the model on a CPU or CUDA device, not {device}")
        if self.comm.backend is not None and "nccl" in self.comm.backend and device.type != "cuda":
            raise ValueError("ShardedOptimizer: move the model to its CUDA device (the NCCL backend needs it)")
        options = resolve_groups(param_groups, items, names)
        self._items = items
        self._geoms = buckets(items, self.bucket_size, self.world)
        metas = {}
        for it in items:
            if it.module is not None:
                s = it.module.spec
                s = s._replace(round_through=_ROUND_THROUGH[self.round_through],
                               rounding=self.rounding if self.rounding and s.format == "mxfp8" else s.rounding)
                metas[it.name] = WeightMeta(s, it.name.rpartition(".")[0], it.rows, it.cols)   # (the module's name, as FSDP2's)
        self._metas = metas
        gdt = dict(dtype=self.grad_dtype, device=device)
        for g in self._geoms:
            master = torch.zeros(g.shard, dtype=torch.float32, device=device)
            grad = torch.zeros(self.world * g.shard, **gdt)
            shard = grad[self.rank * g.shard:(self.rank + 1) * g.shard] if not self.comm.has_reduce_scatter \
                else torch.zeros(g.shard, **gdt)
            self._master.append(master)
            self._grad.append(grad)
            self._shard.append(shard)
            for pos, it in enumerate(g.items):
                r0, r1 = g.rows_of(pos, self.rank)
                src = it.param._data if isinstance(it.param, QuantMaster) else \
                    _dequantized(it.module) if it.module is not None else it.param.detach()
                v = g.view(master, pos, self.rank)
                v.copy_(src.reshape((it.rows,) + it.shape[1:])[r0:r1])
            self._into.append([_Into(g.chunks(grad, pos), it, self.world) for pos, it in enumerate(g.items)])
        groups = [dict(o, params=[]) for o in options]
        self._views = []
        for b, g in enumerate(self._geoms):
            for pos, it in enumerate(g.items):
                v = g.view(self._master[b], pos, self.rank)
                groups[it.group]["params"].append(v)
                self._views.append((v, b, pos))
        try:
            inner = factory(groups)
        except Exception as e:
            e.add_note(compat.FACTORY_NOTE)
            raise
        if not isinstance(inner, torch.optim.Optimizer):
            raise TypeError(f"ShardedOptimizer: make optimizer_factory return a torch.optim.Optimizer, not "
                            f"{type(inner).__name__}")
        got = sorted(id(p) for grp in inner.param_groups for p in grp["params"])
        if got != sorted(id(v) for v, _, _ in self._views) or len(inner.param_groups) != len(groups):
            raise ValueError("ShardedOptimizer: make optimizer_factory build the optimizer over exactly the param "
                             "groups it is given (same groups, same tensors)")
        compat.check_elementwise(inner, assume_elementwise)
        self.inner = inner
        extra = [self.world, self.grad_reduce, self.max_grad_norm, self.round_through, self.rounding,
                 str(self.grad_dtype), self.bucket_size, type(inner).__name__]
        extra += [(gi, k, v) for gi, grp in enumerate(inner.param_groups) for k, v in sorted(grp.items())
                  if k != "params" and plain(v)]
        self.fingerprint = fingerprint(items, extra)
        self._described = [repr(it.describe()) for it in items] + [repr(x) for x in extra]
        self._refresh = Refresh(self._geoms, self._master, metas, self.world, self.rank, device)

    @staticmethod
    def _check_converted(it, holders):
        m, w = it.module, it.param
        name = it.name.rpartition(".")[0] or "<root>"
        if module_owner(m) is not None:
            raise ValueError(f"ShardedOptimizer: close the ShardedOptimizer that trains {name} first (opt.close()): "
                             f"it is still alive")
        if not isinstance(w, QuantMaster) and not _closed_optimizers_weight(w):
            raise ValueError(f"ShardedOptimizer: {name}'s weight was replaced ({type(w).__name__}); convert the model "
                             f"again")
        if not w.requires_grad:
            raise ValueError(f"ShardedOptimizer: keep frozen linears dense (convert(..., skip=...)) or unfreeze "
                             f"{name}.weight: it is frozen (requires_grad=False), and ShardedOptimizer trains every "
                             f"converted weight")
        if not _closed_optimizers_weight(w) and (getattr(w, "_backward_hooks", None)
                                                 or getattr(w, "_post_accumulate_grad_hooks", None)):
            raise ValueError(f"ShardedOptimizer: remove the gradient hooks registered on {name}.weight, or train "
                             f"with torch.optim / FSDP2: its gradient goes into the optimizer's bucket")
        if len(holders) > 1:
            raise ValueError(f"ShardedOptimizer: keep tied weights dense: convert the model with a policy (or skip=) "
                             f"that leaves {name!r} an nn.Linear, then tie. {it.name} is also "
                             f"{', '.join(sorted(h for h in holders if h != it.name))}")

    def _agree(self, err):
        """The one collective of the checks: every rank's [ok, fingerprint]. Ranks that differ all
        raise PlanMismatchError naming the first difference (one more gather, of the descriptions);
        a rank that failed raises its error, the others RemoteError; either way nothing of the
        optimizer holds the process group afterwards."""
        differs = None
        try:
            self.comm.agree(err is None, [self.fingerprint], "ShardedOptimizer construction", "all_gather_setup")
        except L.PlanMismatchError as e:
            differs = e.ranks[0]
        except Exception:
            self._release()
            raise
        if differs is not None:
            lines = self.comm.all_gather_object(self._described, "all_gather_setup")
            self._release()
            raise compat.plan_mismatch(differs, _first_difference(lines[0], lines[differs]))
        if err is not None:
            self._release()
            try:
                raise err
            finally:
                err = None

    def _attach(self, model):
        """The model's converted weights become replicated quantized weights, every trainable
        parameter reports its gradient into its bucket (undone by _rollback)."""
        ref = weakref.ref(self)
        for b, g in enumerate(self._geoms):
            for pos, it in enumerate(g.items):
                if it.module is not None:
                    m = it.module
                    box = _Box(QuantMaster(g.view(self._master[b], pos, self.rank), self._metas[it.name]), None)
                    live = nn.Parameter(GatheredWeight(it.shape, self.grad_dtype, self.device, box),
                                        requires_grad=True)
                    old = m._parameters["weight"]
                    m._parameters["weight"] = live
                    m._mxs_owner = ref
                    it.live = live

                    def undo(m=m, old=old):
                        m._parameters["weight"] = old
                        m._mxs_owner = None
                    self._undo.append(undo)
                self._into[b][pos].held = HeldGrad(it.live_param(), self._into[b][pos], it.name)
                h = it.live_param().register_post_accumulate_grad_hook(grad_hook(ref, b, pos))
                self._handles.append(h)
                self._undo.append(h.remove)
        owners = {id(it.live_param()) for it in self._items}
        for m in model.modules():
            if any(id(p) in owners for p in m.parameters(recurse=False)):
                h = m.register_forward_pre_hook(zero_pending_hook(ref))
                self._handles.append(h)
                self._undo.append(h.remove)
        self._model_ref = weakref.ref(model)

    def _hold_view_grads(self):
        """Between steps the inner optimizer's parameters show a HeldGrad: clip_grad_norm_ over
        opt.param_groups, or GradScaler's unscale_, raises instead of reading nothing."""
        if self._view_held is None:   # (made once: the views are fixed at construction)
            self._view_held = [HeldGrad(v, None, "ShardedOptimizer's master shards (opt.param_groups)")
                               for v, _, _ in self._views]
        for (v, _, _), h in zip(self._views, self._view_held):
            v.grad = h

    def _rollback(self):
        for f in reversed(self._undo):
            try:
                f()
            except Exception:  # noqa: BLE001 - best effort; the construction's error is what matters
                pass
        self._undo = []

    # ---- the writeback -----------------------------------------------------------------------

    def _writeback(self, err):
        """Every rank: the model's weights from the masters (refresh.py); raises this rank's
        `err` or another rank's failure on every rank."""
        prims = self._refresh.run(self.comm, err)
        for it in self._items:
            if it.module is not None:
                it.live._box.planes = prims[it.name]
        self._stamp = self._model_stamp()

    def _model_stamp(self):
        """Per item: (its Parameter still the model's, where its values are, their version or loads)."""
        return [(it.live_param() is (it.module._parameters.get("weight") if it.module is not None else it.param),
                 it.param.data_ptr() if it.module is None else 0,
                 it.param._version if it.module is None else getattr(it.module, "_mxs_loads", 0))
                for it in self._items]

    def _check_model(self):
        """Local: what changed behind the optimizer's back since the last writeback (messages)."""
        errs = []
        model = self._model_ref() if self._model_ref is not None else None
        if model is not None:
            mods, params = fsdp_touched(model)
            if mods or params:
                errs.append(f"{_FSDP_ADVICE} fully_shard was applied to the model after ShardedOptimizer took it "
                            f"over; build the model again (convert(), then fully_shard) with a torch.optim optimizer, "
                            f"or do not call fully_shard on the ShardedOptimizer's model")
        for it, now, was in zip(self._items, self._model_stamp(), self._stamp):
            if not now[0]:
                errs.append(f"{it.name} was replaced (a new Parameter or module) after the optimizer was built; "
                            f"build the ShardedOptimizer after changing the model")
            elif it.module is None and (it.param.dtype != it.dtype or it.param.device != self.device):
                errs.append(f"Cast or move the model before building the ShardedOptimizer (model.to(...), then "
                            f"ShardedOptimizer(model, ...)): {it.name} is now {it.param.dtype} on {it.param.device}, "
                            f"it was {it.dtype} on {self.device}")
            elif now[1:] != was[1:]:
                errs.append(f"call opt.masters_from_model() (train on from what was written) or "
                            f"opt.model_from_masters() (undo it) on every rank: {it.name} was written from outside "
                            f"the optimizer (load_state_dict, copy_, .data) since its last writeback")
            if not it.live_param().requires_grad:
                errs.append(f"freeze or unfreeze parameters before building the ShardedOptimizer: {it.name} was "
                            f"frozen after it")
        for name, p in self._frozen:
            if p.requires_grad:
                errs.append(f"freeze or unfreeze parameters before building the ShardedOptimizer: {name} was "
                            f"unfrozen after it")
        return errs

    @property
    def buckets(self):
        """The buckets' geometry (items.BucketGeometry: items, offsets in a rank's shard, shard size)."""
        return list(self._geoms)

    @property
    def items(self):
        """ItemRow(name, kind, bucket, offset in a rank's shard, shape) per trainable item, in order."""
        return [ItemRow(it.name, it.kind, g.index, o, it.shape) for g in self._geoms
                for it, o in zip(g.items, g.offsets)]

    # ---- torch.optim.Optimizer -------------------------------------------------------------

    @property
    def param_groups(self):
        return self.inner.param_groups if self.inner is not None else []

    @property
    def state(self):
        return self.inner.state if self.inner is not None else {}

    @property
    def defaults(self):
        return self.inner.defaults if self.inner is not None else {}

    def add_param_group(self, param_group):
        raise NotImplementedError("ShardedOptimizer: build it with every group in param_groups= (add_param_group: "
                                  "the items and groups are fixed at construction)")

    def __getstate__(self):
        raise TypeError("ShardedOptimizer: save opt.state_dict() or use mxt.save_checkpoint (it cannot be pickled or "
                        "copied: it owns the model's weights and a process group)")

    @contextlib.contextmanager
    def no_sync(self):
        """Gradient accumulation: backwards inside it only accumulate."""
        old, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = old

    def zero_grad(self, set_to_none=True):
        self._zero_grads(set_to_none)

    @torch.no_grad()
    def step(self, closure=None):
        """Reduce, check, clip, update the shards, write the weights back; nothing when no rank
        wrote a gradient since the last zero_grad() / step(). Returns the closure's loss."""
        if self._closed:
            raise RuntimeError("ShardedOptimizer.step: build a new ShardedOptimizer: this one was closed")
        loss, closure_err = None, None
        if closure is not None:
            try:
                with torch.enable_grad():
                    loss = closure()
            except Exception as e:  # noqa: BLE001 - the step's collectives run first
                closure_err = e
        try:
            return self._step(loss, closure_err)
        finally:
            closure_err = None
            self._grad_seen = [g._version for g in self._grad]
            self._zero_pending = True

    def _step(self, loss, closure_err):
        errs = [f"the closure raised {type(closure_err).__name__}: {closure_err}"] if closure_err is not None else []
        shards, sq = None, None
        try:
            self._flush(errs)
            arrived = self._grads_arrived()
            self._reduce_all()
        except Exception as e:  # noqa: BLE001
            arrived = True
            errs.append(f"gradient reduction: {e}")
        errs += self._hook_errors
        if self._reused:
            errs.append(f"pass overlap=False to ShardedOptimizer: {', '.join(sorted(set(self._reused)))} is used more "
                        f"than once in one forward, and a later use's gradient arrived after its bucket's reduction "
                        f"had started")
        if self._late:
            errs.append(f"accumulate over several backwards inside `with opt.no_sync():` (gradients arrived after "
                        f"their bucket's reduction had started: {', '.join(sorted(set(self._late))[:3])})")
        errs += self._check_model()
        if not errs:
            try:
                shards = self._fp32_shards()
                for s in shards:
                    sq = sum_squares(s, sq)
            except Exception as e:  # noqa: BLE001
                errs.append(f"grad norm: {e}")
        self._reset()
        dev = self.comm.small_device(self.device)
        flag = torch.tensor([0.0, 1.0 if errs else 0.0, 1.0 if arrived else 0.0], dtype=torch.float64, device=dev)
        if sq is not None and not errs:
            flag[0] = sq.to(dev)
        self.comm.all_reduce(flag, "all_reduce_norm")
        total, failed, any_arrived = flag.tolist()
        if closure_err is not None and len(errs) == 1:
            raise closure_err
        if errs:
            raise RuntimeError("ShardedOptimizer.step: " + "; ".join(errs))
        if failed:
            raise L.remote_error("ShardedOptimizer.step (another rank failed)")
        if not any_arrived:
            return loss
        norm = math.sqrt(total)
        self.last_grad_norm = norm
        if self.max_grad_norm is not None and self.max_grad_norm / (norm + 1e-6) < 1.0:
            for s in shards:
                s.mul_(self.max_grad_norm / (norm + 1e-6))
        local = None
        try:
            for v, b, pos in self._views:
                v.grad = self._geoms[b].view(shards[b], pos, self.rank)
            self.inner.step()
            self.steps += 1
        except Exception as e:  # noqa: BLE001 - the writeback's status entry tells the others
            local = e
        finally:
            self._hold_view_grads()
        try:
            self._writeback(local)
        finally:
            local = None
        return loss

    # ---- the model's weights -----------------------------------------------------------------

    def masters_from_model(self):
        """Collective: the model's current values become the masters (a converted weight's: its
        row plane dequantized to fp32), then one writeback; the inner state is kept."""
        self._check_open("masters_from_model")
        err = None
        try:
            for v, b, pos in self._views:
                it = self._geoms[b].items[pos]
                r0, r1 = self._geoms[b].rows_of(pos, self.rank)
                if it.module is not None:
                    loaded = getattr(it.module, "_mxs_loaded", None)
                    full = loaded if loaded is not None else _dequantized(it.module)
                else:
                    full = it.param.detach()
                v.copy_(full.reshape((it.rows,) + it.shape[1:])[r0:r1])
        except Exception as e:  # noqa: BLE001
            err = e
        self._drop_loaded()
        try:
            self._writeback(err)
        finally:
            err = None

    def model_from_masters(self):
        """Collective: every weight written from the masters now (undoing writes into the model)."""
        self._check_open("model_from_masters")
        self._drop_loaded()
        self._writeback(None)

    def _drop_loaded(self):
        for it in self._items:
            if it.module is not None:
                it.module._mxs_loaded = None

    def _check_open(self, where):
        if self._closed:
            raise RuntimeError(f"ShardedOptimizer.{where}: build a new ShardedOptimizer: this one was closed")

    # ---- humans --------------------------------------------------------------------------------

    def _release(self):
        for h in self._handles:
            h.remove()
        self._handles = []
        for it in self._items:   # the weights left in the model: a gradient for them raises (refuse_orphan_weight)
            if not self._closed and it.module is not None and it.live is not None \
                    and it.module._parameters.get("weight") is it.live:
                it.live.grad = None
                it.live.register_post_accumulate_grad_hook(functools.partial(_orphan_grad, it.module))
        for it in self._items:
            if it.module is not None and module_owner(it.module) is self:
                it.module._mxs_owner = None
        self._work = [None] * len(self._geoms)
        self.comm.group, self.comm.active = None, False
        self._dm = None   # (the DeviceMesh of state_dict()'s DTensors holds the group too)
        self._closed = True

    def close(self):
        """Release what holds the process group (hooks, pending reductions); the model keeps its
        last weights. Call it (or use `with ShardedOptimizer(...) as opt:`) before
        dist.destroy_process_group()."""
        self._release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def buffer_bytes(self):
        out = Counter()
        for t in self._master:
            out["master"] += t.numel() * 4
        for t in self._grad:
            out["grad"] += t.numel() * t.element_size()
        return dict(out)

    def __repr__(self):
        if self.inner is None:
            return "ShardedOptimizer(<not constructed>)"
        return (f"ShardedOptimizer(world={self.world}, rank={self.rank}, {len(self._geoms)} buckets, "
                f"{len(self._items)} items, inner={type(self.inner).__name__}, steps={self.steps})")


def _orphan_grad(module, p):
    from ..fsdp.ops import refuse_orphan_weight
    refuse_orphan_weight(module)


def _closed_optimizers_weight(w):
    """The replicated weight a closed ShardedOptimizer left in the model (a new one takes its
    values, the row plane dequantized, as masters)."""
    return isinstance(w, GatheredWeight) and w._box.mesh is None


def _first_difference(a, b):
    """The first differing line of two ranks' descriptions (item: name, shape, kind, dtype, spec,
    group; then world, options, inner optimizer and its group options)."""
    for x, y in zip(a, b):
        if x != y:
            return f"rank 0 has {x}, the other {y}"
    return f"rank 0 has {len(a)} entries, the other {len(b)}"


def _dequantized(module):
    from ..fsdp.linear import dequantized_weight
    return dequantized_weight(module)

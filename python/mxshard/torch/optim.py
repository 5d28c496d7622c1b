# SPDX-License-Identifier: MIT
"""ShardedOptimizer: a ZeRO-1 / Megatron-style distributed optimizer for any
nn.Module whose linears may be MXFP8Linear or NVFP4Linear (weights held only
as MXFP8 / NVFP4 primaries; the fp32 masters live sharded in the optimizer).

    model = mxshard.torch.convert(model, policy="row")
    opt = mxshard.torch.ShardedOptimizer(
        model, lambda groups: torch.optim.AdamW(groups, lr=1e-3), bucket_size=40_000_000)
    for batch in data:
        loss = model(batch).sum()
        loss.backward()          # hooks reduce each bucket as soon as its gradients are complete
        opt.step()               # reduce -> norm/clip -> inner step on the shards -> writeback
        opt.zero_grad()

What it owns (assigned once at construction, never moved afterwards):

- per bucket an fp32 master SHARD (this rank's S elements), an fp32 gradient
  buffer over the whole bucket (the local accumulation target: every
  MXFP8Linear's / NVFP4Linear's ``main_grad`` is a view of it, dense
  parameters' gradients are added into it by a post-accumulate-grad hook,
  which then sets ``p.grad = None``), a row-plane byte buffer holding every
  MXFP8 weight's ``row_data`` (and a col-plane one for the "both" weights),
  one scale buffer per plane, likewise for the NVFP4 weights (packed row
  planes, the transposed column planes, E4M3 scales, one fp32 ``amax`` per
  weight), and one buffer per dense dtype whose views ARE the dense
  parameters' ``.data``. A bucket may mix MXFP8, NVFP4 and dense items
  (mxshard.torch.layout: NVFP4 items at even offsets, even shard boundaries);
- the inner optimizer (any torch.optim.Optimizer, built by
  ``optimizer_factory``) over views of the master shards: per bucket, one
  view per run of items of one param group inside this rank's range.

Every rank must build the same model (same shapes, same order, same initial
values: seed them alike) with the same arguments; the construction checks
that the configurations agree (PlanMismatchError otherwise; the values are
not compared) and ends with one writeback, so that the primaries are the
quantization of the masters and the dense parameters the masters cast to
their dtype, on every rank (each rank's master shard comes from its own
model, so ranks that started from different values end up with a mix).

After construction the model's storage belongs to the optimizer: do not
move the model (.to(), .cuda(), replacing a parameter's .data or an
MXFP8Linear's main_grad): step() checks and raises. Dense parameters'
``.grad`` is None after each backward (the gradient is in the bucket
buffer): clip with ``max_grad_norm``, not torch.nn.utils.clip_grad_norm_.
``step(closure)`` evaluates the closure (with grad enabled) first.

step(), in order:
  1. every bucket's gradient reduction (those not launched by the hooks are
     launched now, in bucket order) and a wait for all of them; local checks
     (no item's storage replaced or reshaped since construction);
  2. ONE all_reduce(SUM) of [sum of squares of this rank's gradient shards,
     local failure flag] (fp64): if any rank failed every rank raises (that
     rank its own error, the others mxshard.RemoteError); the global norm is
     kept in ``last_grad_norm``; with ``max_grad_norm`` the shards are
     multiplied by min(1, max_grad_norm / (norm + 1e-6))
     (torch.nn.utils.clip_grad_norm_'s formula);
  3. the inner optimizer's step on the fp32 shards;
  4. per bucket with MXFP8 weights, one mxshard.BucketWriteback run: one
     uint8 MAX all-reduce, then one byte all-gather per present plane; per
     bucket with NVFP4 weights, one mxshard.NVFP4BucketWriteback run: ONE
     MAX all-reduce of the packed block amaxes (which also yields each
     weight's global amax: no second reduction), the cast of the shard,
     one byte all-gather of the row planes and, when a "both" 1x16 weight
     is in the bucket, one of the column stage, then the local transpose
     into the column-wise planes;
  5. per bucket and dense dtype: the cast of this rank's master range into
     that dtype and one all-gather.
  Nothing is zeroed: call zero_grad() before the next backward.

Collectives per step (world > 1; ``opt.collectives`` counts them by kind,
construction's own are in ``opt.setup_collectives``):

    kind               per step
    reduce_scatter     1 per bucket (backends with reduce_scatter_tensor)
    all_reduce_grad    1 per bucket (gloo: all_reduce of the bucket, then slice)
    all_reduce_norm    1
    all_reduce_max          1 per bucket with MXFP8 weights
    all_gather_row          1 per bucket with MXFP8 weights
    all_gather_col          1 per bucket with "both" MXFP8 weights
    all_reduce_nvfp4        1 per bucket with NVFP4 weights
    all_gather_nvfp4_row    1 per bucket with NVFP4 weights
    all_gather_nvfp4_stage  1 per bucket with "both" 1x16 NVFP4 weights (16x16
                            ones rebuild the column plane from the row plane)
    all_gather_dense        1 per bucket and dense dtype

so B buckets, of which M hold MXFP8 weights (C of them "both" ones) and N
hold NVFP4 weights (T of them "both" 1x16 ones), with D (bucket, dense
dtype) pairs cost B + 1 + 2M + C + 2N + T + D collectives per step; of those
only the 1 + M + N small ones are latency-bound (the norm, the exponent and
the amax maxima). A bucket holding both formats runs both writebacks (two
small maxima).
Construction: 1 all_gather of the fingerprints (+1 all_gather_object only
when they differ), 2 small all_gathers per MXFP8 and per NVFP4 writeback
(their setups), then one writeback (steps 4-5). A world of one issues none.

Gradients: "mean" (default) divides the reduced SUM by the world size, on
the shard after the reduction (one rounding; the sum itself is the
backend's), "sum" does not divide. The hooks launch a bucket's reduction
asynchronously when all of its items have reported in this backward and
every earlier bucket has been launched (buckets are reduced in the same
order on every rank). A bucket with an unused parameter is reduced at the
start of step() (so are all later ones). Gradient accumulation over several
backwards: ``with opt.no_sync():`` around all but the last (otherwise the
second backward finds its buckets already reduced and step() raises).
``overlap=False`` disables the hooks' launches (everything is reduced in
step()). A module called twice in one forward whose second gradient arrives
after its bucket was launched also makes step() raise: use overlap=False
for such models. In eval / under no_grad no hook fires; train()/eval() are
the model's business only.

Failures never hang the group: a rank-local error before the norm
all-reduce (a replaced parameter, a gradient of the wrong shape, a late
gradient) travels in its flag; an error in the inner step marks the
buckets' writeback status bytes, so the others raise RemoteError there;
every rank still runs the remaining collectives of the step before raising
(a model without MXFP8 or NVFP4 weights has no status byte to carry an
inner-step error: then only the failing rank raises). After an exception from step()
call zero_grad() before the next backward.

Learning-rate schedulers and anything else that wants a torch.optim
object take ``opt.inner``; ``opt.param_groups`` is its list of groups (one
per param group, on every rank, even where this rank's shard holds none of
the group's elements).

Checkpoints: state_dict() holds this rank's master shards and the inner
optimizer's state (clones); load_state_dict() needs the same world, rank and
configuration (fingerprint) and rebuilds the primaries and dense parameters
from the loaded masters (a collective: every rank calls it). Resharding
checkpoints (any DP size, through torch.distributed.checkpoint) are
mxshard.torch.checkpoint's save_checkpoint / load_checkpoint: they address
the inner state per view through ``_inner_params()`` and load through
load_state_dict() with shards they assembled for this rank.
"""
from __future__ import annotations

import contextlib
import gc
import math
import weakref
from collections import Counter, namedtuple

import torch
from torch import nn

from .. import _lib as L
from ..nvfp4 import NVFP4BucketWriteback, NVFP4Weight, _needs_stage
from ..weight import MXFP8Weight
from ..writeback import BucketWriteback
from . import layout as LY
from .comm import Comm
from .linear import _QuantLinear, is_quantized

FORMAT = "mxshard.sharded_optimizer/1"
ItemRow = namedtuple("ItemRow", "name kind bucket offset shape")

_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
_TORCH_DTYPE = {v: k for k, v in _DTYPES.items()}
_ROUND_THROUGH = {None: None, "none": None, "f32": None, "bf16": "bf16", "f16": "f16"}
# a bucket's buffers of quantized planes (and NVFP4 amaxes)
_PLANE_BUFFERS = ("rowbuf", "colbuf", "rowscale", "colscale", "nvrow", "nvcol", "nvrowscale", "nvcolscale", "nvamax")
# per module format: (item kind, the description that enters the fingerprint; a rounding is added for MXFP8)
_QUANT_KIND = {"mxfp8": lambda m: ("mx_" + m.planes, f"mxfp8:{m.layout}"),
               "nvfp4": lambda m: ("nv_" + m.planes, f"nvfp4:{m.block}:{m.layout}")}


class _Item:
    """One trainable tensor of the model and everything the optimizer keeps of it."""

    def __init__(self, name, kind, shape, dtype, module=None, param=None):
        self.name, self.kind, self.shape, self.dtype = name, kind, tuple(shape), dtype
        self.module, self.param = module, param
        self.group = 0
        self.numel = int(math.prod(self.shape))


def _plain(v):
    """Group options that enter the fingerprint: plain numbers/strings (and tuples of them)."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return True
    if isinstance(v, (tuple, list)):
        return all(_plain(x) for x in v)
    return False


def _mx_hook(ref, b, pos):
    def hook():
        opt = ref()
        if opt is not None:
            opt._report(b, pos)
    hook._mxs_owner = ref
    return hook


def _owned(hook):
    """True when `hook` belongs to a ShardedOptimizer that is still alive."""
    ref = getattr(hook, "_mxs_owner", None)
    return ref is not None and ref() is not None


def _dense_hook(ref, b, pos, gview):
    def hook(p):
        g = p.grad
        opt = ref()
        if g is None or opt is None:  # an optimizer that is gone leaves the gradient alone
            return
        try:
            gview.add_(g.reshape(gview.shape))
        except Exception as e:  # noqa: BLE001 - surfaces in step(), never inside backward
            opt._hook_errors.append(f"{opt._items[opt.plan.buckets[b].items[pos].item].name}: {e}")
            return
        p.grad = None
        opt._report(b, pos)
    hook._mxs_owner = ref
    return hook


def _sum_squares(g, total=None, chunk=1 << 22):
    """total + sum of squares of an fp32 tensor, accumulated in fp64 (chunked),
    as a 0-d fp64 tensor on g's device: no host synchronization."""
    for i in range(0, g.numel(), chunk):
        c = g[i:i + chunk].double()
        d = torch.dot(c, c)
        total = d if total is None else total + d
    return total


def _clone_tree(x):
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, dict):
        return {k: _clone_tree(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_clone_tree(v) for v in x]
    if isinstance(x, tuple):
        return tuple(_clone_tree(v) for v in x)
    return x


class _Bucket:
    """Per-bucket storage and bookkeeping (this rank)."""

    def __init__(self, spec):
        self.spec = spec
        self.master = self.grad = self.grad_shard = None
        self.rowbuf = self.colbuf = self.rowscale = self.colscale = None
        self.nvrow = self.nvcol = self.nvrowscale = self.nvcolscale = self.nvamax = None
        self.dense = []          # (dtype, lo, hi_ext, buffer)
        self.wb = None           # the MXFP8 items' BucketWriteback
        self.wb_items = []
        self.nvwb = None         # the NVFP4 items' NVFP4BucketWriteback
        self.nv_items = []
        self.nv_planes = []
        self.gathers = []        # per dense dtype: a gather schedule
        self.seen = set()
        self.work = None         # the launched reduction (None: not launched)
        self.wb_planes = []
        self.shard_is_view = True


class ShardedOptimizer:
    """ZeRO-1 sharded optimizer over `model` (see the module doc).

    model              any nn.Module; trainable items are every MXFP8Linear's
                       and NVFP4Linear's weight (its master comes from
                       module.master_init(), which is then released) and
                       every Parameter with requires_grad, in model order,
                       tied ones once
    optimizer_factory  callable(list of param-group dicts) -> a
                       torch.optim.Optimizer over exactly those params, e.g.
                       ``lambda g: torch.optim.AdamW(g, lr=1e-3)``
    process_group      a torch.distributed group (default: the world when
                       torch.distributed is initialised, else a world of one)
    bucket_size        elements per bucket (about; a larger item gets its own)
    param_groups       [{"params": [...], **options}, ...]: entries are
                       Parameters, MXFP8Linear / NVFP4Linear modules (their
                       weight), or names (an item's name such as "fc.weight",
                       or such a module's name); items named nowhere go to
                       a last group without overrides
    grad_reduce        "mean" (divide the sum by the world size) or "sum"
    max_grad_norm      clip the global 2-norm to this (None: no clipping)
    round_through      "bf16" (default, as Transformer Engine), "f16" or None:
                       the writeback quantizes the master rounded through it
                       (MXFP8 and NVFP4 alike)
    rounding           "ceil"/"floor" for every MXFP8 weight (None: each
                       module's own; the weights of one bucket must agree;
                       NVFP4 has none)
    overlap            launch reductions from the backward hooks
    align              shard alignment in elements (each bucket is padded
                       to a multiple of world*align)

    Attributes: inner (the inner optimizer), param_groups (its groups),
    items (rows of name, kind, bucket, offset, shape), plan (the layout),
    collectives / setup_collectives (Counters), last_grad_norm, world, rank.
    """

    def __init__(self, model, optimizer_factory, process_group=None, bucket_size=40_000_000, *,
                 param_groups=None, grad_reduce="mean", max_grad_norm=None, round_through="bf16",
                 rounding=None, overlap=True, align=128):
        self.comm = Comm(process_group)
        self.world, self.rank = self.comm.world, self.comm.rank
        self.setup_collectives = Counter()
        self.collectives = Counter()
        self.comm.counts = self.setup_collectives
        self.last_grad_norm = None
        self.steps = 0
        self._buckets = []
        self._views = []          # (view, grad view)
        self._view_at = []        # per view: (bucket index, shard lo, shard hi, group)
        self._hook_errors = []
        self._late = []
        self._sync = True
        self._next = 0
        self._handles = []
        self._undo = []
        self._items = []
        self.plan = None
        self.inner = None
        err = None
        try:
            self._validate_args(model, optimizer_factory, bucket_size, grad_reduce, max_grad_norm, round_through,
                                rounding, overlap, align)
            self._build(model, optimizer_factory, param_groups)
            self.fingerprint = LY.fingerprint(self.plan)
        except Exception as e:  # noqa: BLE001 - the group learns of it first
            err = e
            self.fingerprint = 0
        try:
            self._agree(err)
            self._build_writebacks()
            local, remote = [], []
            self._writeback_and_gather(local, remote)
            if local or remote:
                raise (local + remote)[0]
        except Exception:
            self._rollback()
            raise
        self._finish()
        # at interpreter exit (an optimizer still alive, close() not called):
        # one gc pass while the interpreter is whole, so that what still holds
        # the process group goes before Python's finalization (see close())
        weakref.finalize(self, gc.collect)

    # ---- construction ---------------------------------------------------------

    def _validate_args(self, model, factory, bucket_size, grad_reduce, max_grad_norm, round_through, rounding,
                       overlap, align):
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
        if not callable(factory):
            raise TypeError("optimizer_factory must be callable (list of param-group dicts -> Optimizer)")
        for name, v in (("bucket_size", bucket_size), ("align", align)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        if grad_reduce not in ("mean", "sum"):
            raise ValueError(f"grad_reduce must be 'mean' or 'sum', got {grad_reduce!r}")
        if max_grad_norm is not None:
            if isinstance(max_grad_norm, bool) or not isinstance(max_grad_norm, (int, float)) \
                    or not max_grad_norm > 0 or not math.isfinite(max_grad_norm):
                raise ValueError(f"max_grad_norm must be a positive number or None, got {max_grad_norm!r}")
        if round_through not in _ROUND_THROUGH:
            raise ValueError(f"round_through must be 'bf16', 'f16' or None, got {round_through!r}")
        if rounding not in (None, "ceil", "floor"):
            raise ValueError(f"rounding must be 'ceil', 'floor' or None, got {rounding!r}")
        if not isinstance(overlap, bool):
            raise TypeError(f"overlap must be a bool, got {type(overlap).__name__}")
        self.bucket_size, self.align = bucket_size, align
        self.grad_reduce, self.max_grad_norm = grad_reduce, max_grad_norm
        self.round_through = _ROUND_THROUGH[round_through]
        self.rounding, self.overlap = rounding, overlap

    def _collect(self, model):
        """The trainable items in model order (a quantized module's weight before its bias)."""
        items, seen_p, names = [], set(), {}
        for mname, m in model.named_modules():
            if is_quantized(m):
                if _owned(getattr(m, "_mxs_grad_hook", None)):
                    raise ValueError(f"{mname}: already managed by another ShardedOptimizer (still alive)")
                if m.planes not in ("row", "both"):
                    raise ValueError(f"{mname}: {type(m).__name__} planes {m.planes!r} (expected 'row' or 'both')")
                kind, desc = _QUANT_KIND[m.format](m)
                items.append(_Item(f"{mname}.weight" if mname else "weight", kind,
                                   (m.out_features, m.in_features), desc, module=m))
                names[mname] = items[-1]
            for pname, p in m.named_parameters(recurse=False):
                if id(p) in seen_p:
                    continue
                seen_p.add(id(p))
                if not p.requires_grad:
                    continue
                name = f"{mname}.{pname}" if mname else pname
                hooks = getattr(p, "_post_accumulate_grad_hooks", None) or {}
                if any(_owned(h) for h in hooks.values()):
                    raise ValueError(f"{name}: already managed by another ShardedOptimizer (still alive)")
                if p.dtype not in _DTYPES:
                    raise TypeError(f"{name}: dtype {p.dtype} is not supported for a dense parameter "
                                    f"(float32, bfloat16, float16)")
                if p.numel() == 0:
                    raise ValueError(f"{name}: an empty parameter")
                items.append(_Item(name, "dense", p.shape, _DTYPES[p.dtype], param=p))
        for it in items:
            names.setdefault(it.name, it)
        if not items:
            raise ValueError("ShardedOptimizer: the model has no trainable parameters (an empty model)")
        return items, names

    @staticmethod
    def _device_of(it):
        if it.kind == "dense":
            return [it.param.device]
        m = it.module
        return [getattr(m, n).device for n in m._BUFS if getattr(m, n) is not None]

    def _check_devices(self, items):
        devs = {}
        for it in items:
            for d in self._device_of(it):
                devs.setdefault(str(d), it.name)
        if len(devs) > 1:
            raise ValueError("ShardedOptimizer: parameters on several devices: " +
                             ", ".join(f"{d} ({n})" for d, n in devs.items()))
        d = torch.device(next(iter(devs)))
        if d.type not in ("cpu", "cuda"):
            raise ValueError(f"ShardedOptimizer: unsupported device {d} (cpu or cuda)")
        if self.comm.backend is not None and "nccl" in self.comm.backend and d.type != "cuda":
            raise ValueError("ShardedOptimizer: the NCCL backend needs the model on a CUDA device")
        return d

    @staticmethod
    def _resolve_groups(param_groups, items, names):
        """Group index per item and the options of each group."""
        if param_groups is None:
            return [{}]
        if isinstance(param_groups, dict) or not isinstance(param_groups, (list, tuple)):
            raise TypeError("param_groups must be a list of dicts {'params': [...], **options}")
        by_id = {}
        for it in items:
            by_id[id(it.module if it.module is not None else it.param)] = it
        assigned = {}
        options = []
        for gi, g in enumerate(param_groups):
            if not isinstance(g, dict) or "params" not in g:
                raise TypeError(f"param_groups[{gi}] must be a dict with a 'params' entry")
            ps = g["params"]
            if isinstance(ps, (torch.Tensor, nn.Module, str)):
                ps = [ps]
            if isinstance(ps, set):
                raise TypeError(f"param_groups[{gi}]['params'] is a set (its order is not defined)")
            for e in list(ps):
                if isinstance(e, str):
                    it = names.get(e)
                    what = f"name {e!r}"
                elif isinstance(e, (torch.Tensor, _QuantLinear)):
                    it = by_id.get(id(e))
                    what = f"a {type(e).__name__}" + (f" of shape {tuple(e.shape)}" if isinstance(e, torch.Tensor)
                                                      else "")
                else:
                    raise TypeError(f"param_groups[{gi}]: entries must be Parameters, MXFP8Linear / NVFP4Linear "
                                    f"modules or names, got {type(e).__name__}")
                if it is None:
                    raise ValueError(f"param_groups[{gi}]: {what} is not a trainable item of the model")
                if id(it) in assigned:
                    raise ValueError(f"param_groups: {it.name} is listed in group {assigned[id(it)]} and in "
                                     f"group {gi}" if assigned[id(it)] != gi else
                                     f"param_groups[{gi}]: {it.name} is listed twice")
                assigned[id(it)] = gi
                it.group = gi
            options.append({k: v for k, v in g.items() if k != "params"})
        rest = [it for it in items if id(it) not in assigned]
        if rest:
            for it in rest:
                it.group = len(options)
            options.append({})
        return options

    def _build(self, model, factory, param_groups):
        items, names = self._collect(model)
        device = self._check_devices(items)
        options = self._resolve_groups(param_groups, items, names)
        self._items, self.device = items, device
        roundings = {}
        for it in items:
            if it.kind in LY.MX_KINDS:
                r = self.rounding or it.module.rounding
                if r not in ("ceil", "floor"):
                    raise ValueError(f"{it.name}: rounding {r!r} (expected 'ceil' or 'floor')")
                roundings[it.name] = r
        specs = [LY.ItemSpec(it.name, it.kind, it.shape,
                             it.dtype + (f":{roundings[it.name]}" if it.name in roundings else ""), it.group)
                 for it in items]
        extra = [("grad_reduce", self.grad_reduce), ("max_grad_norm", self.max_grad_norm),
                 ("round_through", self.round_through), ("rounding", self.rounding)]
        extra += [(f"group{gi}.{k}", v) for gi, o in enumerate(options) for k, v in sorted(o.items()) if _plain(v)]
        plan = LY.make_plan(specs, self.bucket_size, self.world, self.align, extra)
        self.plan = plan
        self._roundings = roundings
        # storage first (nothing of the model is touched until everything is allocated)
        for bs in plan.buckets:
            self._buckets.append(self._alloc(bs, device))
        self._init_masters()
        groups = [dict(o, params=[]) for o in options]
        for b, bs in zip(self._buckets, plan.buckets):
            for lo, hi, g in LY.group_runs(plan, bs, self.rank):
                v = b.master[lo:hi]
                groups[g]["params"].append(v)
                self._views.append((v, b.grad_shard[lo:hi]))
                self._view_at.append((bs.index, lo, hi, g))
        inner = factory(groups)
        if not isinstance(inner, torch.optim.Optimizer):
            raise TypeError(f"optimizer_factory returned {type(inner).__name__}, not a torch.optim.Optimizer")
        got = [id(p) for g in inner.param_groups for p in g["params"]]
        want = [id(v) for v, _ in self._views]
        if sorted(got) != sorted(want) or len(inner.param_groups) != len(groups):
            raise ValueError("optimizer_factory must build the optimizer over exactly the param groups it is "
                             "given (same groups, same tensors)")
        self.inner = inner
        plan = LY.make_plan(specs, self.bucket_size, self.world, self.align,
                            extra + [("inner", type(inner).__name__)] +
                            [(f"inner{gi}.{k}", v) for gi, g in enumerate(inner.param_groups)
                             for k, v in sorted(g.items()) if k != "params" and _plain(v)])
        self.plan = plan
        for b, bs in zip(self._buckets, plan.buckets):
            b.spec = bs
        self._attach()

    def _alloc(self, bs, device):
        b = _Bucket(bs)
        f32 = dict(dtype=torch.float32, device=device)
        S, r = bs.shard, self.rank
        b.master = torch.zeros(S, **f32)
        b.grad = torch.zeros(bs.n_pad, **f32)
        b.shard_is_view = not self.comm.has_reduce_scatter
        b.grad_shard = b.grad[r * S:(r + 1) * S] if b.shard_is_view else torch.zeros(S, **f32)
        u8 = dict(dtype=torch.uint8, device=device)
        mx = [p for p in bs.items if self._items[p.item].kind in LY.MX_KINDS]
        if mx:
            rs = [self._items[p.item].module.row_scale.numel() for p in mx]
            b.rowbuf = torch.zeros(bs.row[1] - bs.row[0], **u8)
            b.rowscale = torch.zeros(sum(rs), **u8)
            both = [p for p in mx if self._items[p.item].kind == "mx_both"]
            if both:
                b.colbuf = torch.zeros(bs.col[1] - bs.col[0], **u8)
                b.colscale = torch.zeros(sum(self._items[p.item].module.col_scale.numel() for p in both), **u8)
        nv = [self._items[p.item].module for p in bs.items if self._items[p.item].kind in LY.NV_KINDS]
        if nv:
            b.nvrow = torch.zeros(LY.nv_bytes(*bs.nv), **u8)
            b.nvrowscale = torch.zeros(sum(m.row_scale.numel() for m in nv), **u8)
            b.nvamax = torch.zeros(len(nv), **f32)
            both = [m for m in nv if m.planes == "both"]
            if both:
                b.nvcol = torch.zeros(sum(m.col_data.numel() for m in both), **u8)
                b.nvcolscale = torch.zeros(sum(m.col_scale.numel() for m in both), **u8)
        for dt, lo, hi in bs.dense:
            hi_ext = bs.n_pad if hi == bs.numel else hi  # the last segment takes the padding: in-place gathers
            b.dense.append((dt, lo, hi_ext, torch.zeros(hi_ext - lo, dtype=_TORCH_DTYPE[dt], device=device)))
        return b

    def _init_masters(self):
        """Master shards from module.master_init() / the dense parameters' values."""
        for b in self._buckets:
            for p, start, length, pos in LY.item_shards(b.spec, self.rank):
                if length == 0:
                    continue
                it = self._items[p.item]
                if it.module is not None:
                    w = it.module.master_init()
                    if not isinstance(w, torch.Tensor) or tuple(w.shape) != it.shape:
                        raise ValueError(f"{it.name}: master_init() returned "
                                         f"{getattr(w, 'shape', type(w).__name__)}, expected {it.shape}")
                    flat = w.detach().reshape(-1)
                else:
                    flat = it.param.detach().reshape(-1)
                b.master[pos:pos + length].copy_(flat[start:start + length])

    def _attach(self):
        """Point the model at the optimizer's storage (undone by _rollback on a
        later failure of the construction)."""
        ref = weakref.ref(self)
        self._expect = []
        for bi, b in enumerate(self._buckets):
            bs = b.spec
            at = Counter()   # per buffer: how much of it the items so far took
            for pos, p in enumerate(bs.items):
                it = self._items[p.item]
                gview = b.grad[p.offset:p.end].view(it.shape)
                if it.module is not None:
                    m = it.module
                    kw = self._plane_views(b, p, it, at)
                    old = {k: getattr(m, k) for k in m._BUFS if getattr(m, k) is not None}
                    old_grad, old_hook = getattr(m, "main_grad", None), getattr(m, "_mxs_grad_hook", None)
                    if old_grad is not None:
                        gview.copy_(old_grad)
                    m.rebind_primary_(**kw)
                    m.main_grad = gview
                    m._mxs_grad_hook = _mx_hook(ref, bi, pos)

                    def undo(m=m, old=old, old_grad=old_grad, old_hook=old_hook):
                        m.rebind_primary_(**old)
                        m.main_grad, m._mxs_grad_hook = old_grad, old_hook
                    self._undo.append(undo)
                    (b.wb_items if it.kind in LY.MX_KINDS else b.nv_items).append((it, kw))
                    self._expect.append((it, kw, gview))
                else:
                    prm = it.param
                    dbuf = next((d for d in b.dense if d[0] == it.dtype))
                    view = dbuf[3][p.offset - dbuf[1]:p.end - dbuf[1]].view(it.shape)
                    view.copy_(prm.detach())
                    old_data = prm.data
                    prm.data = view
                    h = prm.register_post_accumulate_grad_hook(_dense_hook(ref, bi, pos, gview))
                    self._handles.append(h)

                    def undo(prm=prm, old_data=old_data, h=h):
                        h.remove()
                        prm.data = old_data
                    self._undo.append(undo)
                    self._expect.append((it, view, gview))

    @staticmethod
    def _plane_views(b, p, it, at):
        """The views of bucket `b`'s buffers that become item `it`'s primary
        (placed at `p`); `at` counts what earlier items took of each buffer.
        MXFP8: data bytes at the item's flat offsets in the row (col) segment;
        NVFP4: packed data bytes at (offset - nv lo) / 2 of the nv segment,
        the column-wise data (never gathered: finish writes it) one after the
        other, one amax element per item; scales one after the other."""
        m = it.module

        def take(name, buf, like):
            t = buf[at[name]:at[name] + like.numel()].view(like.shape)
            at[name] += like.numel()
            return t
        if it.kind in LY.MX_KINDS:
            bs, (rows, cols) = b.spec, it.shape
            kw = {"row_data": b.rowbuf[p.offset - bs.row[0]:p.end - bs.row[0]].view(rows, cols),
                  "row_scale": take("rowscale", b.rowscale, m.row_scale)}
            if it.kind == "mx_both":
                kw["col_data"] = b.colbuf[p.offset - bs.col[0]:p.end - bs.col[0]].view(rows, cols)
                kw["col_scale"] = take("colscale", b.colscale, m.col_scale)
            return kw
        o = (p.offset - b.spec.nv[0]) // 2
        kw = {"row_data": b.nvrow[o:o + m.row_data.numel()].view(m.row_data.shape),
              "row_scale": take("nvrowscale", b.nvrowscale, m.row_scale),
              "amax": take("nvamax", b.nvamax, m.amax)}
        if it.kind == "nv_both":
            kw["col_data"] = take("nvcol", b.nvcol, m.col_data)
            kw["col_scale"] = take("nvcolscale", b.nvcolscale, m.col_scale)
        return kw

    def _rollback(self):
        for f in reversed(self._undo):
            try:
                f()
            except Exception:  # noqa: BLE001 - best effort, the construction error is what matters
                pass
        self._undo = []

    def _agree(self, err):
        """The one collective of the checks: every rank's [ok, fingerprint]."""
        heads = self.comm.all_gather_i64([0 if err is not None else 1, self.fingerprint], "all_gather_setup")
        if err is not None:
            self._rollback()
            raise err
        bad = [r for r, h in enumerate(heads) if not h[0]]
        if bad:
            raise L.remote_error(f"ShardedOptimizer construction (ranks {bad} failed)")
        if len({h[1] for h in heads}) != 1:
            lines = self.comm.all_gather_object(LY.describe(self.plan), "all_gather_setup")
            ref_r = next(r for r, h in enumerate(heads) if h[1] != heads[0][1])
            diff = LY.first_difference(lines[0], lines[ref_r])
            raise L.status_error(L.host_lib().codes.get("MXS_ERR_PLAN_MISMATCH", 9),
                                 f"ShardedOptimizer: configuration differs between ranks (rank 0 vs rank {ref_r}: "
                                 f"{diff})")

    def _shard_items(self, b, weights, kinds):
        """(weight, master view, start, length) of the bucket's items of `kinds`, in bucket order."""
        shards = [(p, s, n, pos) for p, s, n, pos in LY.item_shards(b.spec, self.rank)
                  if self._items[p.item].kind in kinds]
        return [(w, b.master[pos:pos + n] if n > 0 else b.master[0:0], s, n)
                for w, (p, s, n, pos) in zip(weights, shards)]

    def _build_writebacks(self):
        group = self.comm.group if self.comm.dist is not None else None
        for b in self._buckets:
            if b.nv_items:
                ws = [NVFP4Weight.from_buffers(*it.shape, block=it.module.block, layout=it.module.layout, **kw)
                      for it, kw in b.nv_items]
                b.nvwb = NVFP4BucketWriteback(self._shard_items(b, ws, LY.NV_KINDS), round_through=self.round_through,
                                              group=group, gather=True)
                self.comm.count("all_gather_setup", 2)
                b.nv_planes = ["row"] + (["stage"] if any(_needs_stage(w) for w in ws) else [])
            if not b.wb_items:
                continue
            items = []
            for it, kw in b.wb_items:
                rows, cols = it.shape
                w = MXFP8Weight.from_buffers(rows, cols, layout=it.module.layout, **kw)
                items.append(w)
            wbi = self._shard_items(b, items, LY.MX_KINDS)
            rounding = {self._roundings[it.name] for it, _ in b.wb_items}
            if len(rounding) != 1:
                # the same on every rank (it is in the fingerprint): every rank raises here
                raise ValueError(f"bucket {b.spec.index}: its MXFP8 weights have different roundings "
                                 f"{sorted(rounding)}; pass rounding= to the optimizer")
            b.wb = BucketWriteback(wbi, rounding=rounding.pop(), round_through=self.round_through, group=group,
                                   gather=True)
            self.comm.count("all_gather_setup", 2)
            b.wb_planes = ["row"] + (["col"] if b.colbuf is not None else [])
        for b in self._buckets:
            b.gathers = [self._dense_schedule(b, d) for d in b.dense]

    def _dense_schedule(self, b, d):
        dt, lo, hi, buf = d
        bs, r, S = b.spec, self.rank, b.spec.shard
        pieces = LY.segment_pieces(bs, lo, hi)
        lens = [e - s for s, e in pieces]
        mine = pieces[r]
        cast = (buf[mine[0] - lo:mine[1] - lo], b.master[mine[0] - r * S:mine[1] - r * S])
        if lo == 0 and hi == bs.n_pad:
            return {"kind": "inplace", "cast": cast, "out": buf.view(torch.uint8),
                    "inp": buf[r * S:(r + 1) * S].view(torch.uint8)}
        P = max(lens)
        send = torch.zeros(P, dtype=buf.dtype, device=buf.device)
        recv = torch.zeros(P * bs.dp, dtype=buf.dtype, device=buf.device)
        unpack = [(buf[s - lo:e - lo], recv[q * P:q * P + e - s]) for q, (s, e) in enumerate(pieces)
                  if q != r and e > s]
        return {"kind": "padded", "cast": cast, "send": send, "recv": recv, "n": lens[r], "unpack": unpack}

    def _finish(self):
        for it in self._items:
            if it.module is not None and hasattr(it.module, "release_master_init"):
                it.module.release_master_init()
        self._undo = []
        self._ptrs = self._pointers()
        self.comm.counts = self.collectives
        self.items = [ItemRow(self._items[p.item].name, self._items[p.item].kind, bs.index, p.offset,
                              self._items[p.item].shape) for bs in self.plan.buckets for p in bs.items]

    # ---- storage checks ---------------------------------------------------------

    def _pointers(self):
        out = []
        for b in self._buckets:
            for t in (b.master, b.grad, b.grad_shard) + tuple(getattr(b, k) for k in _PLANE_BUFFERS):
                out.append(None if t is None else t.data_ptr())
        return out

    def _check_storage(self):
        """Local: nothing moved since construction. Returns error strings."""
        errs = []
        if self._pointers() != self._ptrs:
            errs.append("an optimizer buffer moved")
        for it, a, gview in self._expect:
            if it.module is not None:
                m = it.module
                bufs = m._buffers  # the module's buffers ARE the primary's planes (its primary property)
                for k, v in a.items():
                    t = bufs.get(k)
                    if t is None or (t is not v and (t.data_ptr() != v.data_ptr() or t.shape != v.shape)):
                        errs.append(f"{it.name}: module {k} was replaced or reshaped after the optimizer "
                                    f"was built")
                mg = m.__dict__.get("main_grad")
                if mg is None or mg.data_ptr() != gview.data_ptr() or tuple(mg.shape) != it.shape:
                    errs.append(f"{it.name}: module main_grad was replaced (write into it in place)")
            else:
                p = it.param
                if p.data_ptr() != a.data_ptr() or tuple(p.shape) != it.shape or p.dtype != a.dtype \
                        or p.device != a.device:
                    errs.append(f"{it.name}: the parameter's storage was replaced or reshaped after the optimizer "
                                f"was built")
        return errs

    # ---- gradients ----------------------------------------------------------

    def _report(self, b, pos):
        """Hook: item `pos` of bucket `b` has its gradient for this backward."""
        if not (self._sync and self.overlap) or getattr(self, "_closed", False):
            return
        bk = self._buckets[b]
        if bk.work is not None:
            self._late.append(self._items[bk.spec.items[pos].item].name)
            return
        bk.seen.add(pos)
        while self._next < len(self._buckets) and \
                len(self._buckets[self._next].seen) == len(self._buckets[self._next].spec.items):
            self._launch(self._next, async_op=True)

    def _launch(self, b, async_op):
        bk = self._buckets[b]
        bk.work = self.comm.reduce_grad(bk.grad, bk.grad_shard, async_op=async_op)
        self._next = b + 1

    def _flush(self, errs):
        """Dense .grad set outside the hooks (or by hooks that did not report)
        goes into the gradient buffers of the buckets not launched yet."""
        for it, view, gview in self._expect:
            if it.param is None or it.param.grad is None:
                continue
            b, _ = self._where[id(it)]
            if self._buckets[b].work is not None:
                errs.append(f"{it.name}: a gradient arrived after its bucket was reduced")
                continue
            try:
                gview.add_(it.param.grad.reshape(gview.shape))
                it.param.grad = None
            except Exception as e:  # noqa: BLE001
                errs.append(f"{it.name}: {e}")

    @property
    def _where(self):
        w = getattr(self, "_where_cache", None)
        if w is None:
            w = {id(it): self.plan.where[i] for i, it in enumerate(self._items)}
            self._where_cache = w
        return w

    def _reduce_all(self, errs):
        """Phase 1: launch what is left (in bucket order), wait for everything."""
        self._flush(errs)
        while self._next < len(self._buckets):
            self._launch(self._next, async_op=True)
        for bk in self._buckets:
            try:
                bk.work.wait()
            except Exception as e:  # noqa: BLE001
                errs.append(f"bucket {bk.spec.index} reduction: {e}")
        if self.grad_reduce == "mean" and self.world > 1:
            for bk in self._buckets:
                bk.grad_shard.div_(self.world)

    def _reset(self):
        for bk in self._buckets:
            bk.seen = set()
            bk.work = None
        self._next = 0
        self._late = []
        self._hook_errors = []

    @contextlib.contextmanager
    def no_sync(self):
        """Gradient accumulation: backwards inside it only accumulate (no
        reductions launched); the next backward outside it launches them."""
        old = self._sync
        self._sync = False
        try:
            yield
        finally:
            self._sync = old

    def zero_grad(self, set_to_none=True):
        """Zero every gradient buffer (the buffers stay; main_grad views stay),
        reset the readiness of the buckets, set dense parameters' .grad to
        None (whatever set_to_none says)."""
        for bk in self._buckets:
            if bk.work is not None:
                bk.work.wait()
            bk.grad.zero_()
            if not bk.shard_is_view:
                bk.grad_shard.zero_()
        for it, _, _ in self._expect:
            if it.param is not None:
                it.param.grad = None
        self._reset()

    # ---- the step -------------------------------------------------------------

    @torch.no_grad()
    def step(self, closure=None):
        """Reduce, check, clip, update the shards, write the weights back (see
        the module doc). Returns the closure's loss (or None)."""
        if getattr(self, "_closed", False):
            raise RuntimeError("ShardedOptimizer.step: the optimizer was closed")
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        errs = []
        try:
            self._reduce_all(errs)
        except Exception as e:  # noqa: BLE001
            errs.append(f"gradient reduction: {e}")
        errs += self._hook_errors
        if self._late:
            errs.append(f"gradients reported after their bucket's reduction had started ({', '.join(self._late)}); "
                        f"accumulate over several backwards inside opt.no_sync(), or pass overlap=False for a "
                        f"module used several times in one forward")
        errs += self._check_storage()
        sq = None
        if not errs:
            try:
                for bk in self._buckets:
                    sq = _sum_squares(bk.grad_shard, sq)
            except Exception as e:  # noqa: BLE001
                errs.append(f"grad norm: {e}")
        self._reset()
        dev = self.comm.small_device(self.device)
        flag = torch.tensor([0.0, 1.0 if errs else 0.0], dtype=torch.float64, device=dev)
        if sq is not None and not errs:
            flag[0] = sq.to(dev)  # the sum stays on the device: one copy, no sync per chunk
        self.comm.all_reduce(flag, "all_reduce_norm")
        total, failed = flag.tolist()
        if errs:
            raise RuntimeError("ShardedOptimizer.step: " + "; ".join(errs))
        if failed:
            raise L.remote_error("ShardedOptimizer.step (another rank failed)")
        norm = math.sqrt(total)
        self.last_grad_norm = norm
        if self.max_grad_norm is not None:
            coef = self.max_grad_norm / (norm + 1e-6)
            if coef < 1.0:
                for bk in self._buckets:
                    bk.grad_shard.mul_(coef)
        local, remote = [], []
        try:
            for v, g in self._views:
                v.grad = g
            self.inner.step()
            self.steps += 1
        except Exception as e:  # noqa: BLE001 - the writebacks tell the others
            local.append(e)
        self._writeback_and_gather(local, remote)
        if local:
            raise local[0]
        if remote:
            raise remote[0]
        return loss

    def _writeback_and_gather(self, local, remote):
        """Phases 4-5 on every rank whatever happened; errors collected."""
        group = self.comm.group if self.comm.dist is not None else None
        for bk in self._buckets:
            for wb, reduce_kind, gathers in ((bk.wb, "all_reduce_max", [f"all_gather_{pn}" for pn in bk.wb_planes]),
                                             (bk.nvwb, "all_reduce_nvfp4",
                                              [f"all_gather_nvfp4_{pn}" for pn in bk.nv_planes])):
                if wb is None:
                    continue
                self.comm.count(reduce_kind)
                try:
                    # after a local failure (e.g. in the inner step) run() joins the one all-reduce
                    # with this rank's status byte set, so every other rank raises RemoteError
                    wb.run(group, error=local[0] if local else None)
                    for kind in gathers:
                        self.comm.count(kind)
                except L.RemoteError as e:
                    remote.append(e)
                except Exception as e:  # noqa: BLE001
                    if all(e is not x for x in local):  # run() re-raises the error it was handed
                        local.append(e)
        for bk in self._buckets:
            for s in bk.gathers:
                try:
                    dst, src = s["cast"]
                    dst.copy_(src)          # this rank's piece, straight into place
                    if s["kind"] == "padded":
                        s["send"][:s["n"]].copy_(dst)
                except Exception as e:  # noqa: BLE001 - still join the gather
                    local.append(e)
                if not self.comm.active:
                    continue
                if s["kind"] == "inplace":
                    self.comm.all_gather_into(s["out"], s["inp"], "all_gather_dense")
                else:
                    self.comm.all_gather_into(s["recv"].view(torch.uint8), s["send"].view(torch.uint8),
                                              "all_gather_dense")
                    for dst, src in s["unpack"]:
                        dst.copy_(src)

    # ---- checkpoints ----------------------------------------------------------

    def state_dict(self):
        """This rank's part: {"format", "world", "rank", "fingerprint", "step",
        "buckets": [master shard clones], "inner": the inner state (clones)}."""
        return {"format": FORMAT, "world": self.world, "rank": self.rank, "fingerprint": self.fingerprint,
                "step": self.steps, "buckets": [b.master.detach().clone() for b in self._buckets],
                "inner": _clone_tree(self.inner.state_dict())}

    def load_state_dict(self, sd):
        """Load a state_dict() of the same world size, rank and configuration,
        then rebuild the primaries and dense parameters from the masters.
        Collective: every rank calls it (a rank whose checks fail makes every
        rank raise)."""
        err = None
        try:
            self._check_state(sd)
            inner_before = _clone_tree(self.inner.state_dict())
            try:
                self.inner.load_state_dict(_clone_tree(sd["inner"]))
            except Exception:
                self.inner.load_state_dict(inner_before)
                raise
            for b, m in zip(self._buckets, sd["buckets"]):
                b.master.copy_(m)
            self.steps = int(sd["step"])
        except Exception as e:  # noqa: BLE001 - the group learns of it first
            err = e
        flag = torch.tensor([1.0 if err is not None else 0.0], dtype=torch.float64,
                            device=self.comm.small_device(self.device))
        self.comm.all_reduce(flag, "all_reduce_status")
        if err is not None:
            raise err
        if flag.item():
            raise L.remote_error("ShardedOptimizer.load_state_dict (another rank failed)")
        local, remote = [], []
        self._writeback_and_gather(local, remote)
        if local or remote:
            raise (local + remote)[0]

    def _check_state(self, sd):
        if not isinstance(sd, dict) or sd.get("format") != FORMAT:
            raise ValueError(f"load_state_dict: not a {FORMAT} state dict")
        for k, mine in (("world", self.world), ("rank", self.rank), ("fingerprint", self.fingerprint)):
            if sd.get(k) != mine:
                raise ValueError(f"load_state_dict: {k} {sd.get(k)!r} differs from this optimizer's {mine!r} "
                                 f"(same world size, rank and configuration needed)")
        bs = sd.get("buckets")
        if not isinstance(bs, (list, tuple)) or len(bs) != len(self._buckets):
            raise ValueError(f"load_state_dict: expected {len(self._buckets)} bucket masters")
        for i, (b, m) in enumerate(zip(self._buckets, bs)):
            if not isinstance(m, torch.Tensor) or tuple(m.shape) != tuple(b.master.shape) or m.dtype != torch.float32:
                raise ValueError(f"load_state_dict: bucket {i} master must be a float32 tensor of "
                                 f"{tuple(b.master.shape)}")
        if not isinstance(sd.get("step"), int) or "inner" not in sd:
            raise ValueError("load_state_dict: missing 'step' or 'inner'")

    def _inner_params(self):
        """The inner optimizer's parameters in its state_dict() order:
        [(index, group, bucket index, shard lo, shard hi, view)] (each a view
        master[lo:hi] of one bucket's master shard)."""
        at = {id(v): a for (v, _), a in zip(self._views, self._view_at)}
        out = []
        for g, grp in enumerate(self.inner.param_groups):
            for p in grp["params"]:
                b, lo, hi, _ = at[id(p)]
                out.append((len(out), g, b, lo, hi, p))
        return out

    # ---- humans ----------------------------------------------------------------

    def close(self):
        """Release what holds on to the process group: every bucket's
        writeback (its gather schedules keep the group), the backward hooks,
        the pending reductions. Call it (or use ``with ShardedOptimizer(...)
        as opt:``) before ``dist.destroy_process_group()``: a group that
        outlives destroy_process_group() inside a live optimizer is torn down
        during interpreter exit, where gloo can abort the process. The model
        keeps its (last written) primaries and dense values; the optimizer
        can not step afterwards."""
        for h in self._handles:
            h.remove()
        self._handles = []
        for b in self._buckets:
            b.work = None
            for k in ("wb", "nvwb"):
                if getattr(b, k) is not None:
                    getattr(b, k).close()
                    setattr(b, k, None)
            b.gathers = []
        self.comm.group = None
        self.comm.active = False
        self._closed = True
        # Reference cycles (ctypes argument arrays, closures) that reach
        # tensors of the collectives are collected now, while the process
        # group is alive, not during interpreter exit.
        gc.collect()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def param_groups(self):
        return self.inner.param_groups

    def buffer_bytes(self):
        """Bytes of this rank's storage by kind."""
        out = Counter()
        for b in self._buckets:
            for k in ("master", "grad") + _PLANE_BUFFERS:
                t = getattr(b, k)
                if t is not None:
                    out[k] += t.numel() * t.element_size()
            if not b.shard_is_view:
                out["grad_shard"] += b.grad_shard.numel() * 4
            for _, _, _, buf in b.dense:
                out["dense"] += buf.numel() * buf.element_size()
        return dict(out)

    def __repr__(self):
        lines = [f"ShardedOptimizer(world={self.world}, rank={self.rank}, {len(self._buckets)} buckets, "
                 f"{len(self._items)} items, inner={type(self.inner).__name__}, steps={self.steps}"]
        for b in self._buckets:
            bs = b.spec
            kinds = Counter(self._items[p.item].kind for p in bs.items)
            lines.append(f"  bucket {bs.index}: {bs.numel} elements (padded {bs.n_pad}, shard {bs.shard}), "
                         + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())))
        lines.append("  bytes: " + ", ".join(f"{k}={v}" for k, v in sorted(self.buffer_bytes().items())) + ")")
        return "\n".join(lines)

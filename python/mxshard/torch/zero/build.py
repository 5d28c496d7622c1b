# SPDX-License-Identifier: MIT
"""ShardedOptimizer's construction: the arguments, the model's items and
param groups, the storage of every bucket, the inner optimizer over views of
the master shards, pointing the model at the optimizer's storage (undone if
anything later fails), the ranks' agreement, the writeback objects.

Nothing of the model is touched until everything is allocated and the inner
optimizer is built and accepted; a failure after that is rolled back.
"""
from __future__ import annotations

import math
import weakref
from collections import Counter

import torch
from torch import nn

from ... import _lib as L
from ...formats import MXFP8, NVFP4
from ...nvfp4_writeback import _needs_stage
from . import compat as compat
from . import layout as LY
from .grads import GRAD_DTYPES, dense_hook, mx_hook, owned_hook, zero_pending_hook
from .adopt import adopt_param_linears
from ..fsdp.linear import _ParamLinear
from .linear import _QuantLinear, is_quantized

__all__ = ["Item", "Bucket", "plain", "Construction", "DTYPES", "TORCH_DTYPE"]

DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}
TORCH_DTYPE = {v: k for k, v in DTYPES.items()}
_ROUND_THROUGH = {None: None, "none": None, "f32": None, "bf16": "bf16", "f16": "f16"}
# per module format: (item kind, the description that enters the fingerprint; a rounding is added for MXFP8)
_QUANT_KIND = {MXFP8: lambda m: ("mx_" + m.planes, f"{MXFP8.name}:{m.layout}"),
               NVFP4: lambda m: ("nv_" + m.planes, f"{NVFP4.name}:{m.block}:{m.layout}")}


class Item:
    """One trainable tensor of the model and everything the optimizer keeps of it."""

    def __init__(self, name, kind, shape, dtype, module=None, param=None):
        self.name, self.kind, self.shape, self.dtype = name, kind, tuple(shape), dtype
        self.module, self.param = module, param
        self.group = 0
        self.numel = int(math.prod(self.shape))


class Bucket:
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
        self.task = -1           # the autograd graph task that launched it (-1: none, or step())
        self.wb_planes = []
        self.shard_is_view = True


def plain(v):
    """Group options that enter the fingerprint: plain numbers/strings (and tuples of them)."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return True
    if isinstance(v, (tuple, list)):
        return all(plain(x) for x in v)
    return False


def _main_grad_dtypes(m):
    """The main_grad dtypes a quantized linear's backward accumulates into (its
    class's MAIN_GRAD_DTYPES; float32 only when it declares none)."""
    return tuple(getattr(type(m), "MAIN_GRAD_DTYPES", (torch.float32,)))


class Construction:
    """The construction half of ShardedOptimizer (a mixin)."""

    def _validate_args(self, model, factory, bucket_size, grad_reduce, max_grad_norm, round_through, rounding,
                       overlap, align, grad_dtype):
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
        compat.check_not_ddp(model)
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
        if grad_dtype not in GRAD_DTYPES:
            raise ValueError(f"grad_dtype must be torch.float32 or torch.bfloat16, got {grad_dtype!r}")
        self.bucket_size, self.align = bucket_size, align
        self.grad_reduce, self.max_grad_norm = grad_reduce, max_grad_norm
        self.round_through = _ROUND_THROUGH[round_through]
        self.rounding, self.overlap, self.grad_dtype = rounding, overlap, grad_dtype

    def _collect(self, model):
        """The trainable items in model order (a quantized module's weight before its bias)."""
        items, seen_p, names = [], set(), {}
        self._frozen_params = []   # (name, Parameter) left out for requires_grad=False: step() checks them
        for mname, m in model.named_modules():
            if is_quantized(m):
                if owned_hook(getattr(m, "_mxs_grad_hook", None)):
                    raise ValueError(f"{mname}: already managed by another ShardedOptimizer (still alive; "
                                     f"opt.close() it first)")
                if not getattr(m, "_mxs_weight_requires_grad", True):
                    raise ValueError(f"{mname}.weight is frozen (requires_grad_(False)). Keep frozen linears dense "
                                     f"(convert(..., skip=...)) or unfreeze them: ShardedOptimizer trains every "
                                     f"quantized weight")
                if m.planes not in ("row", "both"):
                    raise ValueError(f"{mname}: {type(m).__name__} planes {m.planes!r} (expected 'row' or 'both')")
                if self.grad_dtype not in _main_grad_dtypes(m):
                    raise ValueError(f"{mname}: {type(m).__name__} accumulates its weight gradient only into a "
                                     f"{' / '.join(str(d) for d in _main_grad_dtypes(m))} main_grad; "
                                     f"grad_dtype={self.grad_dtype} is not possible with it: use "
                                     f"grad_dtype=torch.float32")
                kind, desc = _QUANT_KIND[m.fmt](m)
                items.append(Item(f"{mname}.weight" if mname else "weight", kind,
                                  (m.out_features, m.in_features), desc, module=m))
                names[mname] = items[-1]
            for pname, p in m.named_parameters(recurse=False):
                if id(p) in seen_p:
                    continue
                seen_p.add(id(p))
                name = f"{mname}.{pname}" if mname else pname
                if not p.requires_grad:
                    self._frozen_params.append((name, p))
                    continue
                hooks = getattr(p, "_post_accumulate_grad_hooks", None) or {}
                if any(owned_hook(h) for h in hooks.values()):
                    raise ValueError(f"{name}: already managed by another ShardedOptimizer (still alive)")
                if p.dtype not in DTYPES:
                    raise TypeError(f"{name}: dtype {p.dtype} is not supported for a dense parameter "
                                    f"(float32, bfloat16, float16)")
                if p.numel() == 0:
                    raise ValueError(f"{name}: an empty parameter")
                items.append(Item(name, "dense", p.shape, DTYPES[p.dtype], param=p))
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
    def _resolve_groups(param_groups, items, names, aliases=None):
        """Group index per item and the options of each group. aliases: {id(a converted linear or
        its weight Parameter before adopt_param_linears): the module that replaced it}."""
        if param_groups is None:
            return [{}]
        if isinstance(param_groups, dict) or not isinstance(param_groups, (list, tuple)):
            raise TypeError("param_groups must be a list of dicts {'params': [...], **options}")
        by_id = {}
        for it in items:
            by_id[id(it.module if it.module is not None else it.param)] = it
        for k, new in (aliases or {}).items():
            by_id[k] = by_id.get(id(new))
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
                elif isinstance(e, (torch.Tensor, _QuantLinear, _ParamLinear)):
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

    def _build(self, model, factory, param_groups, assume_elementwise):
        aliases = adopt_param_linears(model, self._undo)
        items, names = self._collect(model)
        device = self._check_devices(items)
        options = self._resolve_groups(param_groups, items, names, aliases)
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
        if self.grad_dtype != torch.float32:  # (absent for float32: the fingerprints of older state dicts hold)
            extra.append(("grad_dtype", DTYPES[self.grad_dtype]))
        extra += [(f"group{gi}.{k}", v) for gi, o in enumerate(options) for k, v in sorted(o.items()) if plain(v)]
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
                self._views.append(v)
                self._view_at.append((bs.index, lo, hi, g))
        try:
            inner = factory(groups)
        except Exception as e:
            e.add_note(compat.FACTORY_NOTE)
            raise
        if not isinstance(inner, torch.optim.Optimizer):
            raise TypeError(f"optimizer_factory returned {type(inner).__name__}, not a torch.optim.Optimizer")
        got = [id(p) for g in inner.param_groups for p in g["params"]]
        want = [id(v) for v in self._views]
        if sorted(got) != sorted(want) or len(inner.param_groups) != len(groups):
            raise ValueError("optimizer_factory must build the optimizer over exactly the param groups it is "
                             "given (same groups, same tensors)")
        compat.check_elementwise(inner, assume_elementwise)
        self.inner = inner
        plan = LY.make_plan(specs, self.bucket_size, self.world, self.align,
                            extra + [("inner", type(inner).__name__)] +
                            [(f"inner{gi}.{k}", v) for gi, g in enumerate(inner.param_groups)
                             for k, v in sorted(g.items()) if k != "params" and plain(v)])
        self.plan = plan
        for b, bs in zip(self._buckets, plan.buckets):
            b.spec = bs
        self._attach()
        self._hook_forwards(model, items)
        self._model_ref = weakref.ref(model)   # (step() refuses a model fully_shard'ed after this)

    def _hook_forwards(self, model, items):
        """zero_pending_hook on every module that owns a trainable item (undone by _rollback)."""
        ref = weakref.ref(self)
        params = {id(it.param) for it in items if it.param is not None}
        for m in model.modules():
            if is_quantized(m) or any(id(p) in params for p in m.parameters(recurse=False)):
                h = m.register_forward_pre_hook(zero_pending_hook(ref))
                self._handles.append(h)
                self._undo.append(h.remove)

    def _alloc(self, bs, device):
        b = Bucket(bs)
        f32 = dict(dtype=torch.float32, device=device)
        gdt = dict(dtype=self.grad_dtype, device=device)
        S, r = bs.shard, self.rank
        b.master = torch.zeros(S, **f32)
        b.grad = torch.zeros(bs.n_pad, **gdt)
        b.shard_is_view = not self.comm.has_reduce_scatter
        b.grad_shard = b.grad[r * S:(r + 1) * S] if b.shard_is_view else torch.zeros(S, **gdt)
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
            b.dense.append((dt, lo, hi_ext, torch.zeros(hi_ext - lo, dtype=TORCH_DTYPE[dt], device=device)))
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
                    m._mxs_grad_hook = mx_hook(ref, bi, pos)
                    m._mxs_released = False

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
                    h = prm.register_post_accumulate_grad_hook(dense_hook(ref, bi, pos, gview))
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
        differs = None
        try:
            self.comm.agree(err is None, [self.fingerprint], "ShardedOptimizer construction", "all_gather_setup")
        except L.PlanMismatchError as e:
            differs = e.ranks[0]  # (raised below, outside this block: no frame <-> traceback cycle through e)
        if differs is not None:
            # every rank is here: one more gather says what differs (plan descriptions)
            lines = self.comm.all_gather_object(LY.describe(self.plan), "all_gather_setup")
            raise compat.plan_mismatch(differs, LY.first_difference(lines[0], lines[differs]))
        if err is not None:
            self._rollback()
            try:
                raise err
            finally:
                err = None  # no frame <-> traceback cycle keeps the optimizer (and its group) alive

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
                ws = [NVFP4.weight(*it.shape, block=it.module.block, layout=it.module.layout, **kw)
                      for it, kw in b.nv_items]
                b.nvwb = NVFP4.writeback(self._shard_items(b, ws, LY.NV_KINDS), round_through=self.round_through,
                                        group=group, gather=True)
                self.comm.count("all_gather_setup", 2)
                b.nv_planes = ["row"] + (["stage"] if any(_needs_stage(w) for w in ws) else [])
            if not b.wb_items:
                continue
            items = []
            for it, kw in b.wb_items:
                rows, cols = it.shape
                w = MXFP8.weight(rows, cols, layout=it.module.layout, **kw)
                items.append(w)
            wbi = self._shard_items(b, items, LY.MX_KINDS)
            rounding = {self._roundings[it.name] for it, _ in b.wb_items}
            if len(rounding) != 1:
                # the same on every rank (it is in the fingerprint): every rank raises here
                raise ValueError(f"bucket {b.spec.index}: its MXFP8 weights have different roundings "
                                 f"{sorted(rounding)}; pass rounding= to the optimizer")
            b.wb = MXFP8.writeback(wbi, rounding=rounding.pop(), round_through=self.round_through, group=group,
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

# SPDX-License-Identifier: MIT
"""MXFP8Linear: an nn.Linear whose weight exists only as an MXFP8 primary.

    y = x @ W^T + b,   W = dequantize(row plane)          (forward)
    dgrad = gy @ W,    W = dequantize(row plane)  planes="row"   (high-precision backward override)
                       W = dequantize(col plane)  planes="both"  (blocks down `out`, the reduced dim)
    main_grad += gy^T @ x                                 (fp32 [out, in], flattened batch dims)

The weight is an mxshard.MXFP8Weight (`self.primary`) whose planes are the
module's uint8 buffers `row_data`, `row_scale`, `col_data`, `col_scale` in
Transformer Engine's shapes. Forward and backward each dequantize the plane
they read into a transient tensor of `compute_dtype` and drop it after the
GEMM: between forward and backward nothing is kept but the input activation.

GEMMs: torch.matmul / F.linear on the dequantized weight. This dequantize
path is the one used and tested. `torch._scaled_mm` with MX block scales
(compute capability >= 10.0, swizzled scales) could read the planes directly;
such a capability-gated fast path is future work and not implemented here.

The autograd path, the fp32 initial master, main_grad and rebind_primary_
live in _QuantLinear, which NVFP4Linear (mxshard.torch.zero.nvfp4_linear) shares;
convert() builds either (format='mxfp8' | 'nvfp4').

The user guide, with the interface ShardedOptimizer relies on: docs/torch.md.
"""
from __future__ import annotations

import copy
import math
import sys

import torch
import torch.nn as nn

from ... import _arrays as A
from ... import _lib as L
from ..gemm import paths as _gemm
from ..options import (_COMPUTE_DTYPES, _LAYOUTS, _PLANES, _ROUNDINGS, _check_choice, _check_compute_dtype,
                       _check_device, _check_features, _dtype_code, _require_library)
from ..fsdp.linear import MXFP8ParamLinear, refuse_script_message
from ..fsdp.ops import refuse_double_backward, refuse_forward_ad, refuse_functorch
from ... import formats as _formats

__all__ = ["MXFP8Linear", "is_mxfp8", "is_quantized", "ReadOnlyWeight", "ReadOnlyPlane"]



# ---- FSDP2 over a model ShardedOptimizer owns ----------------------------------------

FSDP_ADVICE = "Use ShardedOptimizer or FSDP2's fully_shard for a model, not both:"
def _fsdp_module_cls():
    """torch.distributed.fsdp.FSDPModule, or None while nobody imported FSDP2 (then no module can be
    one): a dictionary lookup, so the forward may ask it every call."""
    return getattr(sys.modules.get("torch.distributed.fsdp"), "FSDPModule", None)


def fsdp_touched(model):
    """(names of the modules of `model` that fully_shard made FSDP2 modules, names of its
    parameters that are DTensors)."""
    cls = _fsdp_module_cls()
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


# ---- the autograd function -------------------------------------------------------

class _QuantLinearFn(torch.autograd.Function):
    """y = x @ W^T (+ b) with W dequantized from `module.primary` on the fly
    (module: an MXFP8Linear or NVFP4Linear).

    Inputs: x and b already in compute_dtype (the casts are outside, so autograd
    returns their gradients in the callers' dtypes); `token`: the module's
    empty leaf that requires grad (module._grad_token()), standing for the
    weight in the graph. The backward always runs when the forward recorded a
    graph, and adds the weight gradient into main_grad (then calls the
    module's gradient hook) only when the engine would execute the token's
    AccumulateGrad node, i.e. when the pass accumulates leaf gradients as
    loss.backward() does; torch.autograd.grad(loss, x) (or backward(inputs=...)
    without the weight) leaves main_grad alone, as it leaves .grad alone in
    torch. Double backward (create_graph=True) raises: the weight's
    second-order term would be missing."""

    @staticmethod
    def forward(ctx, x, b, token, module):
        y = _gemm.linear_fwd(x, module.primary, b, module.compute_dtype)
        ctx.module = module
        ctx.token = token
        ctx.has_bias = b is not None
        ctx.save_for_backward(x)
        return y

    @staticmethod
    def jvp(ctx, *tangents):
        refuse_forward_ad(ctx.module._who)

    @staticmethod
    def backward(ctx, gy):
        m = ctx.module
        refuse_double_backward(m._who)
        (x,) = ctx.saved_tensors
        gy2, gx, gb = _gemm.input_and_bias_grads(gy, m.compute_dtype, ctx.needs_input_grad[0],
                                                 ctx.has_bias and ctx.needs_input_grad[1], lambda: m.primary,
                                                 "col" if m.planes == "both" else "row")
        tok = ctx.token
        if tok is None or torch._C._will_engine_execute_node(torch.autograd.graph.get_gradient_edge(tok).node):
            if getattr(m, "_mxs_released", False):
                raise RuntimeError(
                    f"mxshard: build a new ShardedOptimizer on the model to train it on (mxt.save_checkpoint before "
                    f"close() and mxt.load_checkpoint into the new one keep the FP32 masters), or train a convert()ed "
                    f"model with torch.optim: {m._who} belonged to a ShardedOptimizer that was closed, and its weight "
                    f"is held as {m.format.upper()} bytes, no Parameter, so no other optimizer would train it")
            x2 = x.reshape(-1, x.shape[-1])
            m._accumulate_main_grad(gy2, x2)
            hook = m._mxs_grad_hook
            if hook is not None:
                hook()
        return gx, gb, None, None


# ---- the shared module machinery ---------------------------------------------------

@torch.compiler.disable
def _apply_quant_linear(x, b, token, module):
    """_QuantLinearFn.apply, which torch.compile runs eagerly (one graph break per linear): dynamo
    would trace into the library's ctypes calls and recompile them at every call until its limit.
    (convert()'s linears, the FSDP2 path, are custom ops that compile without a break.)"""
    return _QuantLinearFn.apply(x, b, token, module)


class _QuantLinear(nn.Module):
    """What MXFP8Linear and NVFP4Linear share: options, the primary over the
    module's buffers, the autograd path, the fp32 initial master, main_grad,
    rebind_primary_. A subclass sets `fmt` (its mxshard.formats value),
    `format` (its name), `_BUFS` (the primary's buffer names, fmt.buffers),
    `_FIXED` (buffers that keep their dtype under .to(dtype)) and implements
    _check_format, _empty_primary, _primary_from_buffers,
    _dequant(plane, dtype=None) and _quantize(w)."""

    fmt = None        # mxshard.formats.MXFP8 | NVFP4

    def __prepare_scriptable__(self):
        # (torch.jit.script calls it on every submodule first)
        raise RuntimeError(refuse_script_message(self._who))
    format = None     # its name: "mxfp8" | "nvfp4"
    _BUFS = ()
    _FIXED = ()

    @property
    def _who(self):
        return type(self).__name__

    def _construct(self, in_features, out_features, bias, device, compute_dtype, **fmt):
        if not isinstance(bias, bool):
            raise TypeError(f"{self._who}: bias must be a bool, got {type(bias).__name__}")
        device = self._setup(in_features, out_features, device, compute_dtype, **fmt)
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, dtype=torch.float32, device=device))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    # -- construction helpers

    def _setup(self, in_features, out_features, device, compute_dtype, **fmt):
        """Validates every option, then allocates the planes (zeros). Returns the device."""
        who = self._who
        self.in_features = _check_features("in_features", in_features, who)
        self.out_features = _check_features("out_features", out_features, who)
        self._check_format(**fmt)
        self.compute_dtype = _check_compute_dtype(compute_dtype, who)
        device = _check_device(device, who)
        self._require(device)
        w = self._empty_primary(device)
        for name in self._BUFS:
            self.register_buffer(name, getattr(w, name))
        from .byte_buffers import _register_byte_load_hook  # load_state_dict takes FP8 tensors as bytes
        _register_byte_load_hook(self)
        self._primary = w
        self._master_init = None
        self.main_grad = None
        self._mxs_grad_hook = None
        return device

    @classmethod
    def _require(cls, device):
        """The libraries this class needs on `device` (a clear error otherwise)."""
        _require_library(device, cls.__name__)

    @classmethod
    def _from_linear(cls, lin, compute_dtype, **fmt):
        """A module quantized from nn.Linear `lin` (same device, the same bias
        Parameter); keeps lin's weight as an fp32 copy (the initial master)."""
        m = cls.__new__(cls)
        nn.Module.__init__(m)
        w = lin.weight.detach()
        m._setup(lin.in_features, lin.out_features, w.device, compute_dtype, **fmt)
        m.bias = lin.bias
        m.train(lin.training)
        m._set_master(w.to(torch.float32, copy=True), keep=True)
        return m

    def reset_parameters(self):
        """nn.Linear's initialisation: kaiming-uniform weight (kept as the fp32
        initial master, and quantized into the planes), uniform bias."""
        dev = self.row_data.device
        w = torch.empty(self.out_features, self.in_features, dtype=torch.float32, device=dev)
        nn.init.kaiming_uniform_(w, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1.0 / math.sqrt(self.in_features)
            with torch.no_grad():
                nn.init.uniform_(self.bias, -bound, bound)
        # (under ShardedOptimizer nothing is kept: masters_from_model() takes the planes, as after set_master_)
        self._set_master(w, keep=not self._under_optimizer())

    # -- the primary

    @property
    def primary(self):
        """The weight object over the module's current buffers (rebuilt when a
        buffer object was replaced, e.g. by .to() or rebind_primary_)."""
        p = self._primary
        if any(getattr(p, n) is not self._buffers.get(n) for n in self._BUFS):
            p = self._primary_from_buffers()
            self._primary = p
        return p

    # -- master

    def _check_master(self, w, what):
        who = self._who
        if not isinstance(w, torch.Tensor):
            raise TypeError(f"{who}.{what}: expected a torch.Tensor, got {type(w).__name__}")
        if tuple(w.shape) != (self.out_features, self.in_features):
            raise ValueError(f"{who}.{what}: shape {tuple(w.shape)}, the weight is "
                             f"[{self.out_features}, {self.in_features}]")
        if w.dtype not in _COMPUTE_DTYPES:
            raise ValueError(f"{who}.{what}: dtype {w.dtype} is not float32, bfloat16 or float16")
        if w.device != self.row_data.device:
            raise ValueError(f"{who}.{what}: tensor on {w.device}, the module is on {self.row_data.device}")

    def _set_master(self, w, keep):
        w = w.detach().contiguous()
        self._quantize(w)
        # the quantization writes the planes' bytes outside torch: bump their version counters as
        # an in-place write would, so that a ShardedOptimizer that owns them sees the write at its
        # next step() (and raises, naming masters_from_model, instead of writing its masters back
        # over it)
        for n in self._BUFS:
            t = self._buffers.get(n)
            if t is not None and not t.is_inference():
                torch.autograd.graph.increment_version(t)
        if keep:
            self._master_init = w if w.dtype == torch.float32 else w.to(torch.float32)

    def set_master_(self, w_fp32):
        """Quantizes the whole [out, in] tensor into the primary's planes (round
        through none). While the module still keeps its initial master, the
        kept copy becomes (an fp32 copy of) this tensor. Under ShardedOptimizer
        (which holds the fp32 master, sharded) call it on every rank, then
        opt.masters_from_model(): the next step() raises until then."""
        self._check_master(w_fp32, "set_master_")
        keep = self._master_init is not None
        src = w_fp32.detach()
        self._set_master(src.to(torch.float32, copy=True) if keep else src, keep=keep)
        return self

    def master_init(self):
        """The fp32 [out, in] initial master: the kept high-precision weight (the
        module's own tensor: copy it before changing it), or once released, the
        row plane dequantized to fp32 (a new tensor)."""
        if self._master_init is not None:
            return self._master_init
        return self._dequant("row", "f32")

    @property
    def weight(self):
        """A READ-ONLY fp32 [out, in] view of the weight the forward uses (the row plane,
        dequantized; a new tensor each time, not a Parameter). Writing into it raises: the weight
        is held only as the quantized primary; set values with set_master_(w) (under
        ShardedOptimizer: on every rank, then opt.masters_from_model()). A weight that is an
        nn.Parameter (FSDP2, torch.optim, HF-style init) is convert()'s MXFP8ParamLinear.
        weight.requires_grad_(flag) is the module's requires_grad_(flag)."""
        return ReadOnlyWeight(self._dequant("row", "f32"), self._who, self)

    def _under_optimizer(self):
        """True while a live ShardedOptimizer owns this module's planes."""
        from .grads import owned_hook
        return owned_hook(self.__dict__.get("_mxs_grad_hook"))

    def _write_advice(self):
        """The first sentence of every refused write into the weight: what to do instead."""
        if self._under_optimizer():
            return (f"To change {self._who}.weight under ShardedOptimizer, call module.set_master_(w) on every "
                    f"rank, then opt.masters_from_model() (every rank; or load a state dict into the model, then "
                    f"opt.masters_from_model()).")
        return (f"Set {self._who}.weight with module.set_master_(w) (for a weight that is an nn.Parameter: "
                f"HF-style init, torch.optim, FSDP2, use convert()'s MXFP8ParamLinear / NVFP4ParamLinear).")

    def requires_grad_(self, requires_grad=True):
        """nn.Module.requires_grad_ (the bias), and the weight's flag: ShardedOptimizer refuses a
        frozen weight at construction and raises at step() when it changed after."""
        self._mxs_weight_requires_grad = bool(requires_grad)
        return super().requires_grad_(requires_grad)

    def __setattr__(self, name, value):
        if name == "weight":
            raise AttributeError(f"{self._write_advice()} {self._who}.weight is a read-only dequantized view: the "
                                 f"weight lives as quantized planes. A tied or replaced weight needs the linear "
                                 f"dense (convert's policy or skip)")
        super().__setattr__(name, value)

    def __deepcopy__(self, memo):
        """copy.deepcopy: an independent module. A copy of a module whose planes a live
        ShardedOptimizer owns (e.g. AveragedModel's copy for an EMA) is outside the optimizer
        (no main_grad, no gradient hook) and holds its planes as ReadOnlyPlane tensors: its
        forward works, an in-place write into a plane (copy_, lerp_: AveragedModel's
        update_parameters) raises, since averaging quantized bytes, or copying the model's
        over the average, would be silently wrong."""
        adopted = self._under_optimizer()
        cls = type(self)
        new = cls.__new__(cls)
        memo[id(self)] = new
        state = {}
        for k, v in self.__dict__.items():
            if adopted and k in ("main_grad", "_mxs_grad_hook"):
                state[k] = None
            elif adopted and k == "_forward_pre_hooks":   # (not the optimizer's zero-grad hook)
                state[k] = copy.deepcopy(type(v)((i, h) for i, h in v.items()
                                                 if getattr(h, "_mxs_owner", None) is None), memo)
            else:
                state[k] = copy.deepcopy(v, memo)
        new.__setstate__(state)
        if adopted:
            for n in self._BUFS:
                t = new._buffers.get(n)
                if t is not None:
                    new._buffers[n] = ReadOnlyPlane(t, f"{self._who}.{n}")
        return new

    def release_master_init(self):
        """Drops the kept fp32 copy (the optimizer owns the master from now on)."""
        self._master_init = None

    # -- storage

    def _rebind(self, given):
        """rebind_primary_'s body: `given` maps buffer names to new tensors."""
        who = f"{self._who}.rebind_primary_"
        given = {n: t for n, t in given.items() if t is not None}
        for n, t in given.items():
            cur = self._buffers.get(n)
            if cur is None:
                raise ValueError(f"{who}: {n} given, but the module (planes={self.planes!r}) has no such plane")
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{who}: {n} must be a torch.Tensor, got {type(t).__name__}")
            if t.dtype != cur.dtype:
                raise ValueError(f"{who}: {n} has dtype {t.dtype}, expected {cur.dtype}")
            if tuple(t.shape) != tuple(cur.shape):
                raise ValueError(f"{who}: {n} has shape {tuple(t.shape)}, expected {tuple(cur.shape)}")
            if t.device != cur.device:
                raise ValueError(f"{who}: {n} is on {t.device}, the module on {cur.device}")
            if not t.is_contiguous():
                raise ValueError(f"{who}: {n} must be contiguous")
        spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size(), n) for n, t in given.items())
        for (a0, a1, an), (b0, b1, bn) in zip(spans, spans[1:]):
            if b0 < a1:
                raise ValueError(f"{who}: {an} and {bn} overlap")
        with torch.no_grad():
            for n, t in given.items():
                cur = self._buffers[n]
                if t.data_ptr() != cur.data_ptr():
                    t.copy_(cur)
                self._buffers[n] = t
        return self.primary

    # -- gradient

    MAIN_GRAD_DTYPES = (torch.float32, torch.bfloat16)

    def _accumulate_main_grad(self, gy2, x2):
        """main_grad += gy2^T @ x2: float32 (created on first use), accumulated in fp32 inside the
        GEMM; or bfloat16 (ShardedOptimizer(grad_dtype=torch.bfloat16)): the product in fp32, then
        one rounding to bf16 per accumulation."""
        g = self.main_grad
        if g is None:
            g = torch.zeros(self.out_features, self.in_features, dtype=torch.float32, device=x2.device)
            self.main_grad = g
        elif (g.dtype not in self.MAIN_GRAD_DTYPES or tuple(g.shape) != (self.out_features, self.in_features)
              or g.device != x2.device):
            raise ValueError(f"{self._who}.main_grad must be a float32 or bfloat16 [{self.out_features}, "
                             f"{self.in_features}] tensor on {x2.device}, got {g.dtype} {tuple(g.shape)} on {g.device}")
        if g.dtype == torch.float32:
            _gemm.linear_wgrad(gy2, x2, acc=g)
        else:
            g.add_(_gemm.linear_wgrad(gy2, x2, dtype=torch.float32))

    # -- nn.Module

    def forward(self, x):
        who = self._who
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{who}: input must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() < 1 or x.shape[-1] != self.in_features:
            raise ValueError(f"{who}: input shape {tuple(x.shape)}, the last dim must be "
                             f"in_features={self.in_features}")
        if not x.is_floating_point():
            raise ValueError(f"{who}: pass a floating-point input (x.float(), or the model's dtype): its dtype "
                             f"{x.dtype} is not a floating-point type")
        dev = self.row_data.device
        if x.device != dev:
            raise ValueError(f"{who}: input on {x.device}, the weight on {dev}")
        self._require(dev)
        fsdp = _fsdp_module_cls()
        if fsdp is not None and isinstance(self, fsdp) and self._under_optimizer():
            raise RuntimeError(f"{FSDP_ADVICE} fully_shard was applied to this {who} after ShardedOptimizer "
                               f"took the model over; the two shard the same masters two ways (to use FSDP2, "
                               f"convert() the model again, fully_shard it and train it with a torch.optim "
                               f"optimizer; to use ShardedOptimizer, do not call fully_shard on its model)")
        dt = self.compute_dtype
        xc = x.to(dt)
        b = self.bias.to(dt) if self.bias is not None else None
        refuse_functorch(who, xc, b)
        y = _apply_quant_linear(xc, b, self._grad_token(dev) if torch.is_grad_enabled() else None, self)
        out = _gemm.output_dtype(x)
        return y if y.dtype == out else y.to(out)

    def _grad_token(self, dev):
        """The module's empty leaf that requires grad, the weight's stand-in in the autograd graph
        (_QuantLinearFn): neither a Parameter nor a buffer (not in parameters() / state_dict()),
        one per module, so that its AccumulateGrad node tells whether a backward pass
        accumulates leaf gradients."""
        t = self.__dict__.get("_mxs_token")
        if t is None or t.device != dev:
            t = torch.empty(0, device=dev, requires_grad=True)
            self.__dict__["_mxs_token"] = t
        return t

    def _apply(self, fn, *args, **kwargs):
        # buffers of a fixed dtype (NVFP4's fp32 amax) follow device moves only
        fixed = {n: self._buffers.pop(n) for n in self._FIXED if self._buffers.get(n) is not None}
        try:
            out = super()._apply(fn, *args, **kwargs)
        finally:
            for n, t in fixed.items():
                dev = fn(t[:0]).device
                self._buffers[n] = t if dev == t.device else t.to(dev)
        dev = self.row_data.device
        for name in ("_master_init", "main_grad"):  # device moves only: they stay fp32
            t = getattr(self, name)
            if t is not None and t.device != dev:
                setattr(self, name, t.to(dev))
        return out


class ReadOnlyWeight(torch.Tensor):
    """The dequantized weight of a quantized linear (`module.weight`): reads work like on any
    tensor (the results are plain tensors, views stay read-only, .data included); any write
    raises, naming what to use instead. requires_grad_(flag) is the module's."""

    @staticmethod
    def __new__(cls, data, who, module=None):
        return torch.Tensor._make_wrapper_subclass(cls, data.size(), strides=data.stride(), dtype=data.dtype,
                                                   device=data.device)

    def __init__(self, data, who, module=None):
        self._data, self._who, self._module = data, who, module

    def __repr__(self, *, tensor_contents=None):
        return f"ReadOnlyWeight({self._who}, {self._data!r})"

    def requires_grad_(self, requires_grad=True):
        """Freezes / unfreezes the module's weight (module.requires_grad_ for the weight alone):
        this tensor is a transient dequantized view, never a leaf that trains."""
        m = self._module
        if m is not None:
            m._mxs_weight_requires_grad = bool(requires_grad)
        return self

    def _advice(self):
        m = self._module
        return m._write_advice() if m is not None else f"Set {self._who}.weight with module.set_master_(w)."

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for i, a in enumerate(func._schema.arguments):
            v = args[i] if i < len(args) else kwargs.get(a.name)
            if a.alias_info is not None and a.alias_info.is_write and isinstance(v, ReadOnlyWeight):
                raise RuntimeError(f"{v._advice()} {v._who}.weight is a read-only dequantized view of the "
                                   f"quantized planes ({func} would write into it)")
        from torch.utils._pytree import tree_map_only
        a2, k2 = tree_map_only(ReadOnlyWeight, lambda t: t._data, (args, kwargs))
        out = func(*a2, **k2)
        rets = func._schema.returns
        if rets and rets[0].alias_info is not None:  # a view (.data, .t(), slices): read-only as well
            sets = rets[0].alias_info.before_set
            src = [args[i] if i < len(args) else kwargs.get(a.name) for i, a in enumerate(func._schema.arguments)
                   if a.alias_info is not None and a.alias_info.before_set == sets]
            if src and isinstance(src[0], ReadOnlyWeight):   # (not ema.lerp_(weight, w): that returns ema)
                return tree_map_only(torch.Tensor, lambda t: ReadOnlyWeight(t, src[0]._who, src[0]._module), out)
        return out


# functions that keep a ReadOnlyPlane read-only although their result is new storage: device
# moves (module.to(device), AveragedModel(model, device=...))
_PLANE_KEEP = frozenset(("to", "cuda", "cpu"))
_INPLACE_DUNDERS = frozenset(f"__i{op}__" for op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow",
                                                     "and", "or", "xor", "lshift", "rshift", "matmul")) | {"__setitem__"}


class ReadOnlyPlane(torch.Tensor):
    """A plane buffer (row_data, row_scale, ...) of a COPY of a quantized linear whose planes a
    ShardedOptimizer owns (copy.deepcopy of the model, torch.optim.swa_utils.AveragedModel): real
    storage (the copy's forward reads it as usual), but every in-place or out= function on it,
    or on a view of it, raises. An EMA that averages the planes (use_buffers=True) averages FP8 /
    FP4 bytes, one that copies them from the model (the default) is no average at all; the fp32
    weights exist only as the optimizer's sharded masters."""

    @staticmethod
    def __new__(cls, data, who):
        t = torch.Tensor._make_subclass(cls, data.detach(), False)
        t._who = who
        return t

    def __init__(self, data, who):
        pass

    def __deepcopy__(self, memo):
        new = ReadOnlyPlane(self.as_subclass(torch.Tensor).clone(), self._who)
        memo[id(self)] = new
        return new

    def __reduce_ex__(self, proto):   # pickles (torch.save of a copy's state_dict) as a plain tensor
        return torch.Tensor.__reduce_ex__(self.as_subclass(torch.Tensor), proto)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in _INPLACE_DUNDERS or (name.endswith("_") and not name.startswith("__")
                                        and name != "requires_grad_"):
            writes = _planes_in(args[:1])            # an in-place function writes into its first argument
        else:
            writes = _planes_in(kwargs.get("out"))
        if writes:
            who = sorted({t._who for t in writes})
            raise RuntimeError(
                f"Keep an EMA (or any average) of a model trained by ShardedOptimizer yourself from each quantized "
                f"linear's module.weight (the dequantized fp32 weight: e.g. ema_w.lerp_(module.weight, 1 - decay) "
                f"per linear, on every rank), or train with torch.optim in one process or under FSDP2, where the "
                f"converted weights are Parameters and torch.optim.swa_utils.AveragedModel averages their fp32 "
                f"masters. {name} would write into {', '.join(who)}, a quantized plane of a copy of a linear whose "
                f"fp32 master ShardedOptimizer holds sharded: averaging its FP8/FP4 bytes, or copying the model's "
                f"bytes over it, would be silently wrong (to set the copy's weight use its set_master_(w))")
        src = _planes_in((args, kwargs))
        keep = name in _PLANE_KEEP
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
            if not src:
                return out
            ptrs = {t.untyped_storage().data_ptr() for t in src}

            def wrap(t):   # views of a plane (.data, .detach(), slices) stay read-only
                if isinstance(t, torch.Tensor) and not isinstance(t, ReadOnlyPlane) and t.layout == torch.strided \
                        and (keep or t.untyped_storage().data_ptr() in ptrs):
                    return ReadOnlyPlane(t, src[0]._who)
                return t
            if isinstance(out, (tuple, list)):
                return type(out)(wrap(t) for t in out)
            return wrap(out)


def _planes_in(tree):
    """The ReadOnlyPlane leaves of a pytree of arguments."""
    from torch.utils._pytree import tree_leaves
    return [x for x in tree_leaves(tree) if isinstance(x, ReadOnlyPlane)]


# ---- MXFP8 ---------------------------------------------------------------------

class MXFP8Linear(_QuantLinear):
    """y = x @ W^T + b with W held only as an MXFP8 primary (see the module docstring).

    planes: "row" (row-only; the backward dequantizes the row plane) or "both"
    (bidirectional; the backward reads the column-wise plane). layout: the scale
    layout, "compact" | "padded" (TE) | "swizzled" (cuBLAS). compute_dtype: the
    dtype of the dequantized weight, of the GEMMs and of the output. rounding:
    the E8M0 scale rounding of every quantize ("ceil" as TE, or "floor").

    A freshly built module initialises like nn.Linear (kaiming-uniform weight,
    uniform bias) and keeps that fp32 weight as its initial master until
    release_master_init()."""

    fmt = _formats.MXFP8
    format = fmt.name
    _BUFS = fmt.buffers

    def __init__(self, in_features, out_features, bias=True, *, planes="row", layout="padded", device=None,
                 compute_dtype=torch.bfloat16, rounding="ceil"):
        super().__init__()
        self._construct(in_features, out_features, bias, device, compute_dtype, planes=planes, layout=layout,
                        rounding=rounding)

    def _check_format(self, planes, layout, rounding):
        self.planes = _check_choice("planes", planes, _PLANES)
        self.layout = _check_choice("layout", layout, _LAYOUTS)
        self.rounding = _check_choice("rounding", rounding, _ROUNDINGS)

    def _empty_primary(self, device):
        return self.fmt.empty(self.out_features, self.in_features, planes=self.planes, layout=self.layout,
                              device=device)

    def _primary_from_buffers(self):
        return self.fmt.weight(self.out_features, self.in_features, layout=self.layout,
                               **{n: self._buffers.get(n) for n in self._BUFS})

    def _dequant(self, plane, dtype=None):
        return self.fmt.dequantize(self.primary, plane=plane, dtype=dtype or _dtype_code(self.compute_dtype))

    def _quantize(self, w):
        self.fmt.quantize(self.primary, w, rounding=self.rounding)

    def set_master_(self, w_fp32):
        """Quantizes the whole [out, in] tensor into the primary's planes (round
        through none, the module's rounding). While the module still keeps its
        initial master, the kept copy becomes (an fp32 copy of) this tensor."""
        return super().set_master_(w_fp32)

    def rebind_primary_(self, row_data=None, row_scale=None, col_data=None, col_scale=None):
        """Moves the present planes into the given uint8 tensors (same shapes and
        device, e.g. views into an optimizer's bucket buffers): the current bytes
        are copied into them, then the module buffers and self.primary point to
        them. Arguments left None keep their current storage. Everything is
        checked before anything is written."""
        return self._rebind(dict(row_data=row_data, row_scale=row_scale, col_data=col_data, col_scale=col_scale))

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, planes={self.planes}, layout={self.layout}, "
                f"compute_dtype={self.compute_dtype}")


def is_mxfp8(module) -> bool:
    """True for a linear whose weight is MXFP8: convert()'s MXFP8ParamLinear, or the MXFP8Linear
    ShardedOptimizer holds its storage in."""
    return isinstance(module, (MXFP8Linear, MXFP8ParamLinear))


def is_quantized(module) -> bool:
    """True for an MXFP8Linear or NVFP4Linear (module.format says which)."""
    return isinstance(module, _QuantLinear)

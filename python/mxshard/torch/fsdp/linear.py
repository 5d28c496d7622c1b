# SPDX-License-Identifier: MIT
"""MXFP8ParamLinear / NVFP4ParamLinear: nn.Linear subclasses whose `weight`
is a real nn.Parameter holding the high-precision master (a QuantMaster),
for FSDP2 (`fully_shard`), any torch.optim optimizer and DCP.

    forward    y  = x @ deq(row)^T + b      deq(row): the row plane FSDP2 just gathered as bytes
    backward   gx = gy @ deq(dgrad plane)   (the column plane for planes="both")
               gw = gy^T @ x                 -> weight.grad (fp32 accumulation, the parameter's dtype);
                                                FSDP2 reduce-scatters it like any gradient

Without fully_shard (a world of one, or before sharding) the module quantizes
its own master with the same library writeback, once per master version, and
runs the same GEMMs. `convert(model, policy)` builds these.

state_dict(): the weight is saved as a plain tensor (a plain DTensor under
FSDP2) sharing the master's storage, so torch.save, DCP and in-place loads see
ordinary tensors; load_state_dict copies values into the master (the
quantized bytes follow at the next use). `dequantized_weight(module)` gives
the values the forward uses.
"""
from __future__ import annotations

import functools

import torch
import torch.nn as nn

from ... import formats as _formats
from ..gemm import paths as _gemm
from . import ops as _ops
from .gathered import GatheredWeight
from .master import QuantMaster, QuantSpec, WeightMeta
from .ops import _check_weight, _primary

__all__ = ["MXFP8ParamLinear", "NVFP4ParamLinear", "is_param_linear", "is_mxfp8", "is_nvfp4", "dequantized_weight", "masters_changed",
           "param_linear_class"]


def master_parameter(data, meta, requires_grad):
    """nn.Parameter(QuantMaster(data, meta)) whose values are `data` itself, not the alias
    Parameter's constructor makes by detaching inside __torch_dispatch__ (where torch gives a
    detached tensor a version counter of its own): writes through other aliases of `data` (a state
    dict taken before convert(), the tensor a meta model was loaded from with assign=True) move the
    counter the bytes' freshness reads."""
    p = nn.Parameter(QuantMaster(data, meta), requires_grad=requires_grad)
    p._data = data
    return p


_HOOK_DICTS = ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks",
               "_forward_pre_hooks_with_kwargs", "_backward_hooks", "_backward_pre_hooks")
_PARAM_LINEAR_OWN = ("meta", "spec", "_group", "_plan")   # a converted linear's own attributes


def hand_over(old, new, keep=()):
    """Moves what a user added to module `old` onto `new`, which replaces it: its forward and
    backward hooks (the same dicts: the user's RemovableHandles keep working), buffers, parameters
    other than weight / bias, submodules and attributes that `new` lacks (Hugging Face's flags, a
    `no_weight_decay` mark); `keep`: attribute names of `old` that stay. Returns the function that
    moves them back (ShardedOptimizer's failed construction). State dict hooks stay: they belong
    to each module's own kind."""
    hooks = {n: getattr(old, n) for n in _HOOK_DICTS}
    full = old._is_full_backward_hook
    bufs = {k: v for k, v in old._buffers.items() if k not in new._buffers}
    transient = {k for k in bufs if k in old._non_persistent_buffers_set}
    params = {k: v for k, v in old._parameters.items() if k not in ("weight", "bias")}
    mods = dict(old._modules)
    attrs = {k: v for k, v in old.__dict__.items() if k not in new.__dict__ and k not in keep and k not in hooks}
    for n, d in hooks.items():
        setattr(new, n, d)
        setattr(old, n, type(d)())
    new._is_full_backward_hook = full
    for k, v in bufs.items():
        new.register_buffer(k, v, persistent=k not in transient)
    for k, v in params.items():
        new.register_parameter(k, v)
    for k, v in mods.items():
        new._modules[k] = v
    new.__dict__.update(attrs)

    def back():
        for n, d in hooks.items():
            setattr(old, n, d)
            setattr(new, n, type(d)())
        for k in bufs:
            new._buffers.pop(k, None)
            new._non_persistent_buffers_set.discard(k)
        for k in params:
            new._parameters.pop(k, None)
        for k in mods:
            new._modules.pop(k, None)
        for k in attrs:
            new.__dict__.pop(k, None)
    return back


class _ParamLinear(nn.Linear):
    """What MXFP8ParamLinear and NVFP4ParamLinear share; built by convert()."""

    _FORMAT = None   # the mxshard.formats value of the subclass

    def __init__(self, *args, **kwargs):
        # (convert() builds these through from_linear; copies and unpickling do not call __init__)
        raise TypeError(f"mxshard: build {type(self).__name__} with mxshard.torch.convert(model, policy) from an "
                        f"nn.Linear, or one layer with mxshard.torch.MXFP8Linear(in, out, ...) / NVFP4Linear(...); "
                        f"{type(self).__name__}(...) does not construct one")

    def __prepare_scriptable__(self):
        # (torch.jit.script calls it on every submodule first)
        raise RuntimeError(refuse_script_message(self.meta.name))

    @classmethod
    def from_linear(cls, lin, spec, name, group):
        """Takes over nn.Linear `lin`: its weight's storage becomes the master (same dtype, a new
        Parameter over it), its bias Parameter is kept (the same object)."""
        m = cls.__new__(cls)
        nn.Module.__init__(m)
        m.in_features, m.out_features = lin.in_features, lin.out_features
        w = lin.weight.detach()
        if w.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"convert: cast the model to float32 or bfloat16 first (model.float()): {name}.weight is "
                             f"{w.dtype}; masters are float32, bfloat16 or float16")
        meta = WeightMeta(spec, name, lin.out_features, lin.in_features, group)
        # the master takes over the linear's storage (no copy: a large model converts without a
        # second set of weights; the old Parameter object is dropped with the old module)
        # (a model built or loaded inside torch.inference_mode(): an inference tensor has no version
        # counter, which the bytes' freshness reads, so the master is a normal copy of it, made, as
        # its wrapper, outside inference mode)
        with torch.inference_mode(False):
            if w.is_inference():
                data = w.clone(memory_format=torch.contiguous_format)
            elif w.is_contiguous() and w.storage_offset() == 0:
                data = w
            else:
                data = w.clone(memory_format=torch.contiguous_format)
            m.weight = master_parameter(data, meta, lin.weight.requires_grad)
        if data is w:
            # the old Parameter lets go of the storage (a write through it would change the master unseen:
            # its version counter is not the master's) and is marked: an optimizer built before convert()
            # holds it, and its step raises (group._before_optimizer_step) instead of training nothing
            lin.weight.data = torch.empty(0, dtype=w.dtype, device=w.device)
        hand_over(lin, m)
        lin.weight._mxs_converted_to = name
        # its forward refuses (an instance attribute, not a hook: torch.compile does not guard on hooks,
        # so a graph traced before convert() retraced without one and ran F.linear on the released
        # weight: torch's "mat2 must be a matrix")
        lin.forward = functools.partial(_replaced_forward, name)
        m.bias = lin.bias
        m.meta, m.spec, m._group = meta, spec, group
        m._plan = _ops.register(m)
        m.train(lin.training)
        m._register_state_dict_hook(_plain_weight_in_state_dict)
        group.add(name, m)
        return m

    # the options, named as on ShardedOptimizer's MXFP8Linear / NVFP4Linear (read-only: the spec)
    format = property(lambda self: self.spec.format, doc="'mxfp8' or 'nvfp4'")
    fmt = property(lambda self: self.spec.fmt, doc="the format: mxshard.formats.MXFP8 or NVFP4")
    planes = property(lambda self: self.spec.planes, doc="'row' or 'both'")
    layout = property(lambda self: self.spec.layout, doc="the primary's scale layout")
    rounding = property(lambda self: self.spec.rounding, doc="MXFP8's E8M0 rounding ('nearest' for NVFP4)")
    block = property(lambda self: self.spec.block, doc="NVFP4's block ('1x32' for MXFP8)")
    compute_dtype = property(lambda self: self.spec.compute_dtype, doc="the GEMMs' dtype")

    @property
    def primary(self):
        """The quantized primary the forward multiplies by (every plane of the spec in one process;
        the gathered planes inside an FSDP2 forward): an mxshard.MXFP8Weight / NVFP4Weight, read
        only. Between FSDP2 steps the weight is sharded and this raises, as dequantized_weight."""
        w = self._parameters.get("weight")
        if _is_dtensor(w):
            raise RuntimeError(f"mxshard: {self.meta.name}: the weight is sharded (FSDP2, between steps): its "
                               f"quantized bytes exist while FSDP2 holds it unsharded")
        return _primary(self, _check_weight(self), "row")

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        """load_state_dict(assign=True) (meta-device loading, Hugging Face's low_cpu_mem_usage): the
        weight stays this module's QuantMaster Parameter; a master on the meta device takes the
        loaded tensor as its storage (assign's meaning), any other one its values (a copy). The
        bias is assigned as usual. Under FSDP2 (a sharded master) weight and bias are copied, as
        without assign (a master on the meta device there raises: to_empty() first)."""
        key = prefix + "weight"
        if key not in state_dict:
            _no_quantized_planes(state_dict, prefix)
        w = self._parameters.get("weight")
        if isinstance(w, GatheredWeight) and w._box.mesh is None and key in state_dict:
            # ShardedOptimizer's replicated weight: the loaded values wait for opt.masters_from_model()
            # (its step() raises on every rank until then, or until opt.model_from_masters() drops them)
            t = state_dict[key]
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(w.shape):
                error_msgs.append(f"size mismatch for {key}: copying a param with shape "
                                  f"{tuple(getattr(t, 'shape', ()))} from checkpoint, the shape in current model is "
                                  f"{tuple(w.shape)}.")
                return
            owner = getattr(self, "_mxs_owner", None)
            if owner is None or owner() is None:
                # nobody's replicated weight (a copy, or the optimizer closed): the loaded values are its master
                self.weight = master_parameter(t.detach().to(torch.float32, copy=True).contiguous(), self.meta,
                                               w.requires_grad)
            else:
                self._mxs_loaded = t.detach().to(torch.float32, copy=True)
                self._mxs_loads = getattr(self, "_mxs_loads", 0) + 1
            rest = {k: v for k, v in state_dict.items() if k != key}
            meta = dict(local_metadata, assign_to_params_buffers=False)
            super()._load_from_state_dict(rest, prefix, meta, strict, missing_keys, unexpected_keys, error_msgs)
            if key in missing_keys:
                missing_keys.remove(key)
            return
        sharded = _is_dtensor(w) and isinstance(w._local_tensor, QuantMaster)   # under FSDP2
        if not (local_metadata.get("assign_to_params_buffers", False) and key in state_dict
                and (isinstance(w, QuantMaster) or sharded) and isinstance(state_dict[key], torch.Tensor)):
            return super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                                 unexpected_keys, error_msgs)
        t = state_dict[key]
        if tuple(t.shape) != tuple(w.shape):
            error_msgs.append(f"size mismatch for {key}: copying a param with shape {tuple(t.shape)} from "
                              f"checkpoint, the shape in current model is {tuple(w.shape)}.")
            return
        if sharded and w._local_tensor.is_meta and _is_dtensor(t) and tuple(t.placements) == tuple(w.placements) \
                and t.device_mesh == w.device_mesh and t.is_floating_point() and not t.is_meta:
            # torchtune's load into a model built on meta and fully_shard'ed (a state dict of
            # distribute_tensor shards, assign=True): the shard becomes this rank's master, a
            # QuantMaster inside a new DTensor Parameter (FSDP2's load post-hook pads it again)
            from torch.distributed.tensor import DTensor
            local = t._local_tensor.detach()
            local = (local._data if isinstance(local, QuantMaster) else local).contiguous()
            with torch.no_grad():
                self.weight = nn.Parameter(
                    DTensor.from_local(QuantMaster(local, self.meta), t.device_mesh, t.placements, run_check=False,
                                       shape=t.shape, stride=t.stride()), requires_grad=w.requires_grad)
            rest = {k: v for k, v in state_dict.items() if k != key}
            super()._load_from_state_dict(rest, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                          error_msgs)
            if key in missing_keys:
                missing_keys.remove(key)
            return
        if sharded:
            # FSDP2: a new Parameter would reach FSDP2 as a plain sharded tensor (the all-gather of
            # quantized bytes gone); the module's values are copied instead (its weight and bias
            # keep their Parameters, so an optimizer made before keeps training them)
            if not _is_dtensor(t) or w._local_tensor.is_meta:
                raise RuntimeError(
                    f"mxshard: load {key} with load_state_dict(sd) (the default assign=False: copies into the "
                    f"existing parameters), or set_model_state_dict(model, full_sd, options=StateDictOptions("
                    f"full_state_dict=True)) for full tensors; assign=True into an FSDP2-sharded converted weight "
                    f"takes a sharded state dict (DTensors) into a materialised model (to_empty() first when "
                    f"built on the meta device)")
            copy = dict(local_metadata, assign_to_params_buffers=False)
            return super()._load_from_state_dict(state_dict, prefix, copy, strict, missing_keys, unexpected_keys,
                                                 error_msgs)
        with torch.no_grad():
            if w.is_meta:
                if type(t) not in (torch.Tensor, nn.Parameter):
                    error_msgs.append(f"{key}: load_state_dict(assign=True) into a converted weight on the meta "
                                      f"device takes a plain tensor, got a {type(t).__name__}")
                    return
                data = t.detach().contiguous()
                self.weight = master_parameter(data, self.meta, w.requires_grad)
            else:
                w.copy_(t)
        rest = {k: v for k, v in state_dict.items() if k != key}
        # a materialised linear copies its bias too (both keep their Parameters, so an optimizer made
        # before keeps training both, as under FSDP2); one on the meta device takes it (assign's meaning)
        meta = local_metadata if w.is_meta else dict(local_metadata, assign_to_params_buffers=False)
        super()._load_from_state_dict(rest, prefix, meta, strict, missing_keys, unexpected_keys, error_msgs)
        if key in missing_keys:
            missing_keys.remove(key)

    def reset_parameters(self):
        # nn.Linear's initialisation of the master, in place (the bytes follow at the next use)
        if getattr(self, "meta", None) is not None:
            super().reset_parameters()

    def forward(self, x):
        """y = x @ deq(row)^T + b (fsdp.ops): under torch.compile the custom op
        mxshard::param_linear (traced, no graph break), else the same rules eagerly."""
        who = type(self).__name__
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{who}: input must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() < 1 or x.shape[-1] != self.in_features:
            raise ValueError(f"{who}: input shape {tuple(x.shape)}, the last dim must be in_features={self.in_features}")
        if not x.is_floating_point():
            raise ValueError(f"{who}: pass a floating-point input (x.float(), or the model's dtype): its dtype "
                             f"{x.dtype} is not a floating-point type")
        w = _check_weight(self)
        if x.device != w.device:
            raise ValueError(f"{who}: input on {x.device}, the weight on {w.device}")
        dt = self.spec.compute_dtype
        b = self.bias.to(dt) if self.bias is not None else None
        if torch.compiler.is_compiling():   # traced: the custom op (fsdp.ops), no graph break
            y = _ops.param_linear(x.to(dt), w, b, self._plan)
        else:                               # eager: the same rules without the op's dispatch
            _ops.refuse_functorch(self.meta.name, x, w, b)
            y = _ops.ParamLinearFn.apply(x.to(dt), w, b, self)
        out = _gemm.output_dtype(x)
        return y if y.dtype == out else y.to(out)

    def __setstate__(self, state):
        # a copy (copy.deepcopy: an EMA model) or an unpickled module: a plan of its own
        super().__setstate__(state)
        if "_plan" in state:
            self._plan = _ops.register(self)
        if state.get("_mxs_owner") is not None:
            # a copy of a linear ShardedOptimizer trains: the copy is nobody's (its replicated weight is
            # its own planes), and the optimizer's forward pre-hooks stay with the original
            self._mxs_owner = None
            for k in [k for k, h in self._forward_pre_hooks.items() if getattr(h, "_mxs_owner", None) is not None]:
                del self._forward_pre_hooks[k]
        if state.get("_group") is not None:   # (the group's copy lists the copied members only)
            state["_group"].members.append((self.meta.name, self))

    def extra_repr(self):
        s = self.spec
        own = s.fmt.option   # the option only this format takes: rounding (MXFP8) or block (NVFP4)
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"planes={s.planes}, layout={s.layout}, {own}={getattr(s, own)}, compute_dtype={s.compute_dtype}")


class MXFP8ParamLinear(_ParamLinear):
    """An nn.Linear whose weight Parameter is an fp32/bf16 master, used as MXFP8 (row plane in
    forward; planes="both": the column plane in dgrad); all-gathered as MXFP8 bytes under FSDP2."""

    _FORMAT = _formats.MXFP8


class NVFP4ParamLinear(_ParamLinear):
    """As MXFP8ParamLinear, with NVFP4 (E2M1, E4M3 scales per 16 or 16x16, tensor amax)."""

    _FORMAT = _formats.NVFP4


def refuse_script_message(name):
    return (f"mxshard: use torch.compile or torch.export (or torch.jit.trace) for a converted model, or keep "
            f"{name or 'the linear'} dense (convert(..., skip=[...])): torch.jit.script cannot compile a converted "
            f"linear, whose forward calls the library from Python")


def _replaced_forward(name, *args, **kwargs):
    """The forward of an nn.Linear that convert() took the weight of (a handle kept on it)."""
    raise RuntimeError(f"mxshard: call the module convert() returned, or the model it converted: this nn.Linear "
                       f"({name or '<root>'}) gave its weight to the converted linear that replaced it")


def is_param_linear(module) -> bool:
    """True for MXFP8ParamLinear / NVFP4ParamLinear (convert()'s linears)."""
    return isinstance(module, _ParamLinear)


def masters_changed(model):
    """Tells mxshard that the masters of `model`'s converted linears were written outside an
    optimizer step or load_state_dict (weight.data writes, an in-place dcp.load into a state
    dict): the next all-gather refreshes their bytes. Call it on every rank."""
    for g in {id(m._group): m._group for m in model.modules() if isinstance(m, _ParamLinear)}.values():
        g.announced()


def is_mxfp8(module) -> bool:
    """True for an MXFP8 linear convert() made."""
    return isinstance(module, MXFP8ParamLinear)


def is_nvfp4(module) -> bool:
    """True for an NVFP4 linear convert() made."""
    return isinstance(module, NVFP4ParamLinear)


def param_linear_class(fmt):
    """The converted linear class of a format (an mxshard.formats value or its name)."""
    fmt = _formats.get(fmt)
    return next(c for c in (MXFP8ParamLinear, NVFP4ParamLinear) if c._FORMAT == fmt)


def make_spec(fmt, planes, layout, rounding, block, compute_dtype, round_through):
    """The QuantSpec of a weight of format `fmt` (a value or its name): its own option as given,
    the other one the format's fixed value (MXFP8: block '1x32'; NVFP4: rounding 'nearest')."""
    fmt = _formats.get(fmt)
    rounding, block = fmt.spec_options(rounding, block)
    return QuantSpec(fmt.name, planes, layout, rounding, block, compute_dtype, round_through)


_PLANE_KEYS = ("row_data", "row_scale", "col_data", "col_scale", "amax")   # ShardedOptimizer's linears


def _no_quantized_planes(state_dict, prefix):
    """A state dict of a model under ShardedOptimizer (torch.save(model.state_dict())) holds a
    linear's quantized planes, not its weight: a converted linear cannot load it (torch would
    report missing and unexpected keys, or, with strict=False, leave the weight as it was)."""
    found = [k for k in _PLANE_KEYS if prefix + k in state_dict]
    if found:
        name = prefix[:-1] or "the module"
        raise RuntimeError(
            f"mxshard: save and load a ShardedOptimizer model with mxshard.torch.save_checkpoint / load_checkpoint "
            f"(the training state: masters, optimizer) or export_safetensors / load_safetensors (its quantized "
            f"weights; load_safetensors also fills a plain or convert()ed model), not torch.save(model.state_dict()). "
            f"The state dict holds {name}'s quantized planes ({', '.join(found)}) and no {prefix}weight: it comes "
            f"from a model under ShardedOptimizer, and a converted linear loads a weight")


def _plain_weight_in_state_dict(module, state_dict, prefix, local_metadata):
    """state_dict hook: the weight as a plain tensor (or a plain DTensor under FSDP2) over the
    master's storage, so torch.save / DCP / safetensors and in-place loads see ordinary tensors."""
    key = prefix + "weight"
    w = state_dict.get(key)
    if w is None:
        return
    from torch.distributed.tensor import DTensor
    # The alias is made from the module's own Parameter, here, outside __torch_dispatch__: the
    # `w` state_dict() hands in is param.detach(), made inside dispatch, where torch does not
    # share version counters, so writes into it (dcp.load into model.state_dict(), copy_ into
    # an entry) would not move the master's counter and the next forward would use old bytes.
    own = module._parameters.get("weight")
    if w is own and isinstance(w, QuantMaster):
        return   # state_dict(keep_vars=True): the Parameter itself, as nn.Linear gives (writes go through dispatch)
    if isinstance(w, QuantMaster):
        src = own if isinstance(own, QuantMaster) and own._data.data_ptr() == w._data.data_ptr() else w
        state_dict[key] = src._data.detach()
    elif isinstance(w, DTensor) and isinstance(w._local_tensor, QuantMaster):
        src = w._local_tensor
        if isinstance(own, DTensor) and isinstance(own._local_tensor, QuantMaster) \
                and own._local_tensor._data.data_ptr() == src._data.data_ptr():
            src = own._local_tensor
        with torch.no_grad():
            state_dict[key] = DTensor.from_local(src._data.detach(), w.device_mesh, w.placements,
                                                 run_check=False, shape=w.shape, stride=w.stride())
    elif isinstance(w, GatheredWeight) and w._box.mesh is None and "row" in w._box.planes:
        # ShardedOptimizer's replicated weight (its masters are the optimizer's shards): the values the
        # forward multiplies by, in fp32 (mxt.save_checkpoint saves the masters)
        state_dict[key] = _gemm.dequant(w._box.planes["row"], "row", torch.float32)
    elif isinstance(w, GatheredWeight):
        raise RuntimeError(f"mxshard: {module.meta.name}: state_dict() while FSDP2 holds the weight unsharded "
                           f"(inside forward/backward); call it between steps")


@torch.no_grad()
def dequantized_weight(module, dtype=torch.float32):
    """The [out, in] weight the forward multiplies by (the row plane, dequantized to `dtype`: float32
    gives its values exactly, module.compute_dtype the GEMM's operand bit for bit), for
    an MXFP8ParamLinear / NVFP4ParamLinear that FSDP2 does not shard, or inside its forward while
    FSDP2 holds it unsharded. A sharded weight (between steps under FSDP2) raises: its bytes exist
    only while gathered. A linear ShardedOptimizer owns (MXFP8Linear / NVFP4Linear) gives its row
    plane dequantized as well; any other module raises TypeError."""
    if not is_param_linear(module):
        primary = getattr(module, "primary", None)   # ShardedOptimizer's MXFP8Linear / NVFP4Linear
        if primary is not None and hasattr(module, "fmt"):
            return _gemm.dequant(primary, "row", dtype)
        raise TypeError(f"mxshard: pass dequantized_weight a linear that convert() made (or one ShardedOptimizer "
                        f"owns); got a {type(module).__name__}, whose weight is module.weight itself")
    w = module._parameters.get("weight")
    if _is_dtensor(w):
        raise RuntimeError(f"mxshard: {module.meta.name}: the weight is sharded (FSDP2, between steps): its "
                           f"quantized bytes exist while FSDP2 holds it unsharded; call dequantized_weight inside "
                           f"the forward, or unshard the module first (module.unshard())")
    w = _check_weight(module)
    return _gemm.dequant(_primary(module, w, "row"), "row", dtype)


def _is_dtensor(t):
    from torch.distributed.tensor import DTensor
    return isinstance(t, DTensor)

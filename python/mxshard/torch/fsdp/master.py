# SPDX-License-Identifier: MIT
"""QuantMaster: the high-precision master of a quantized linear's weight as
a tensor subclass that FSDP2 shards like any parameter and all-gathers as
MXFP8 / NVFP4 bytes.

    module.weight = nn.Parameter(QuantMaster(fp32 [out, in], meta))
    fully_shard(...)      ->  DTensor(Shard(0), local = QuantMaster(fp32 [rows of this rank, in]))
    unshard (FSDP2)       ->  fsdp_pre_all_gather: this rank's bytes of ONE plane (row plane in
                              forward, the dgrad plane in backward), the all-gather moves them,
                              fsdp_post_all_gather: a GatheredWeight [out, in] holding that plane

Everything a torch user does to a parameter works on the master: torch.optim
(foreach or not), clip_grad_norm_, load_state_dict, HF-style
`weight.data.normal_()` and `weight.data = t` (QuantMaster.data), DCP (the state dict holds plain tensors, see
state_dict_hooks in linear). Ops that create a new tensor return plain
tensors, except the ones FSDP2 and nn.Module need to keep the subclass (views,
detach, new_zeros for FSDP2's padded shard, _to_copy for `.to(device)`, empty_like for
`to_empty(device=...)` of a model built on the meta device).

Every write into a master (an in-place op through this class, or a write into
its storage through a plain alias) raises its inner tensor's version counter,
and a write through this class (also through `weight.data`, whose alias has a
version counter of its own) counts in its WeightMeta's `writes`, for the
storage written (a clone's writes are not the master's: an EMA copy); the
quantized bytes are derived from the master at a known (version, writes) and
recomputed when either moved (units.WeightUnit, FSDPGroup.refresh).
"""
from __future__ import annotations

import inspect
import weakref
from typing import NamedTuple

import torch
from torch.utils._pytree import tree_map_only

from ... import formats as _formats

__all__ = ["QuantSpec", "WeightMeta", "QuantMaster", "is_quant_master"]


class QuantSpec(NamedTuple):
    """What a weight is quantized into (immutable; one per converted module). `format` is the
    format's name (the spec is hashed, pickled and fingerprinted); `fmt` is the format itself."""
    format: str             # the name of an mxshard.formats value: "mxfp8" | "nvfp4"
    planes: str             # "row" | "both"
    layout: str             # scale layout of the gathered primary: "compact" | "padded" | "swizzled"
    rounding: str           # MXFP8 E8M0 rounding: "ceil" | "floor" (NVFP4: "nearest")
    block: str              # NVFP4 block: "1x16" | "16x16" (MXFP8: "1x32")
    compute_dtype: torch.dtype
    round_through: str      # "bf16" (TE's master cast) | "none"

    @property
    def fmt(self):
        """The mxshard.formats value (MXFP8 or NVFP4) this spec names."""
        return _formats.get(self.format)

    def dgrad_plane(self):
        """The plane the backward's dgrad reads: the column-wise one for "both"."""
        return "col" if self.planes == "both" else "row"


class WeightMeta:
    """Identity of one converted weight, shared by every tensor derived from its master (views,
    FSDP2's padded shard, device copies): its spec, its qualified name, the full [rows, cols]
    shape, and the FSDPGroup of the model (None until convert() made one, or once the model's
    converted linears are gone).

    The group is held weakly: the converted linears hold it (module._group), and a strong
    reference from here would close a cycle through tensor subclasses (module -> its DTensor
    weight -> the QuantMaster -> this meta -> the group -> the module) that Python's collector
    cannot break: a model under fully_shard was never freed."""

    __slots__ = ("spec", "name", "rows", "cols", "_group", "writes", "unseen", "_hash")

    def __init__(self, spec, name, rows, cols, group=None):
        self.spec, self.name, self.rows, self.cols = spec, name, rows, cols
        self.group = group
        # in-place writes through any QuantMaster of this weight, per storage (count_write): `.data`
        # hands out an alias with a version counter of its own, so the inner tensor's _version
        # alone misses its writes; a copy (clone, an EMA's deepcopy) has a storage of its own, and
        # writes into it are not writes into the master
        self.writes = {}
        # the storages of masters set (`.data = t`) to an alias of memory others write unseen (a view of
        # ZeroRedundancyOptimizer's bucket, of vector_to_parameters' vector): their bytes are made at
        # every use (FSDPGroup.local_primary). Per storage, as the writes: a copy (an EMA's clone) set
        # to another alias leaves the master's entry alone
        self.unseen = set()
        self._hash = hash(self._key())   # (a dict key on the gather path: hashed once)

    @property
    def group(self):
        return self._group() if self._group is not None else None

    @group.setter
    def group(self, g):
        self._group = weakref.ref(g) if g is not None else None

    def count_write(self, data):
        """One more write into the master whose values are `data` (a plain tensor): counted for its
        storage, shared by its views and `.data` aliases, not by its copies."""
        k = _storage_id(data)
        self.writes[k] = self.writes.get(k, 0) + 1

    def writes_to(self, data):
        """The writes counted for `data`'s storage (count_write)."""
        return self.writes.get(_storage_id(data), 0)

    def rename(self, name):
        """The weight's qualified name in a larger model (convert() of a submodule, then of the model
        holding it): rehashed, so dicts keyed by this meta must be rebuilt (FSDPGroup.rename)."""
        self.name = name
        self._hash = hash(self._key())

    def __repr__(self):
        return f"WeightMeta({self.name!r}, {self.rows}x{self.cols}, {self.spec.format}, planes={self.spec.planes})"

    # equal by what it describes (torch.compile's guards compare a subclass's flatten context
    # with a copy of it); one model never holds two weights of one name
    def _key(self):
        return (self.name, self.rows, self.cols, self.spec)

    def __eq__(self, other):
        return isinstance(other, WeightMeta) and self._key() == other._key()

    def __hash__(self):
        return self._hash

    def __reduce__(self):
        # (copy, deepcopy, pickle: rebuilt, so the hash is this process's)
        return _rebuild_meta, (self.spec, self.name, self.rows, self.cols, self.group)


def _rebuild_meta(spec, name, rows, cols, group):
    # (a copy's storages are new: no write of the original's counts for them)
    return WeightMeta(spec, name, rows, cols, group)


def _aliases_more(t):
    """`t` is a view of another tensor, or a window of a larger storage: writes through the other
    tensor (a collective into a bucket) move no version counter `t` shares."""
    if getattr(t, "_base", None) is not None:
        return True
    try:
        return t.untyped_storage().nbytes() != t.numel() * t.element_size()
    except (RuntimeError, NotImplementedError):
        return False


def _storage_id(data):
    """The storage a master's values live in (its views and aliases share it); None where torch.compile
    traces (fake tensors have no data pointer: there, the version counters of the real tensors
    count the writes at run time)."""
    try:
        return data.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None


# Ops whose outputs keep the subclass. Views (and detach/alias) share the master's storage, so
# writes through them are writes to the master; new_zeros/new_empty/_to_copy/clone make the
# padded shard FSDP2 allocates, `module.to(device)` and copies the user asks for.
_VIEWS = {
    torch.ops.aten.detach.default, torch.ops.aten.alias.default, torch.ops.aten.view.default,
    torch.ops.aten._unsafe_view.default, torch.ops.aten.slice.Tensor, torch.ops.aten.as_strided.default,
    torch.ops.aten.split.Tensor, torch.ops.aten.split_with_sizes.default, torch.ops.aten.narrow.default,
    torch.ops.aten.reshape.default,
    # transposes and broadcasts keep it too (F.linear is t + addmm, matmul may expand): so that a product
    # with the master is seen (_MATMULS)
    torch.ops.aten.t.default, torch.ops.aten.transpose.int, torch.ops.aten.permute.default,
    torch.ops.aten.expand.default, torch.ops.aten.unsqueeze.default,
    # and every other view a write may go through (w[0].zero_(), w.unbind(0)[0], w.diagonal()...)
    torch.ops.aten.select.int, torch.ops.aten.unbind.int, torch.ops.aten.squeeze.default, torch.ops.aten.squeeze.dim,
    torch.ops.aten.squeeze.dims, torch.ops.aten.diagonal.default, torch.ops.aten.unfold.default,
    torch.ops.aten.chunk.default, torch.ops.aten.unsafe_split.Tensor, torch.ops.aten.view_as.default,
}
# Products with a module's weight (by the op's base name): code that multiplies by a converted linear's
# weight itself (F.linear(x, self.qkv.weight), x @ w.T) would compute with the float master, not the
# MXFP8 / NVFP4 bytes the layer trains with, silently: refused, saying to call the module (or keep it
# dense). "The weight" is the Parameter and its views (`live`); detach(), `.data` and copies are
# values the user took out on purpose, and multiply as any tensor.
_DETACHING = {torch.ops.aten.detach.default, torch.ops.aten.alias.default}
_MATMULS = {"mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "mv", "addmv", "dot", "vdot", "inner",
            "outer", "addr", "ger", "tensordot", "einsum", "bilinear", "_scaled_mm", "_int_mm", "chain_matmul",
            "linalg_multi_dot"}
_MATMUL_OPS = {getattr(torch.ops.aten, n) for n in _MATMULS if hasattr(torch.ops.aten, n)}   # op packets
_NEW = {
    torch.ops.aten.new_zeros.default, torch.ops.aten.new_empty.default, torch.ops.aten.new_empty_strided.default,
    torch.ops.aten._to_copy.default, torch.ops.aten.clone.default,
    torch.ops.aten.empty_like.default,   # module.to_empty(device=...) of a model built on meta
}


def _written_args(func, args, kwargs):
    """The QuantMaster arguments `func` writes into (its schema's mutable arguments)."""
    if func.namespace == "c10d":
        # torch.distributed's collectives write into their tensors (broadcast_, allreduce_, recv_, the
        # gathers' outputs: ZeroRedundancyOptimizer's and hand-written data parallel's syncs) while their
        # schemas mark none as written: every master a collective touches counts as written (a send
        # only makes the next use quantize once more)
        from torch.utils._pytree import tree_leaves
        return list({id(t): t for t in tree_leaves((args, kwargs)) if isinstance(t, QuantMaster)}.values())
    out = []
    schema = func._schema
    for i, a in enumerate(schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        v = args[i] if i < len(args) else kwargs.get(a.name)
        if isinstance(v, QuantMaster):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out += [x for x in v if isinstance(x, QuantMaster)]
    return out


def _broadcast_into(func, args, kwargs):
    """(master, source) when `func` would write a lower-rank float tensor of more than one element
    into a QuantMaster by broadcasting it (a bias into a weight: torch.optim.swa_utils.AveragedModel
    built before ShardedOptimizer pairs each converted weight with the next parameter, and
    square layers broadcast silently), else None. Foreach ops pair their lists by position."""
    def bad(w, t):
        return (isinstance(t, torch.Tensor) and t is not w and t.is_floating_point() and t.numel() > 1
                and t.dim() < w.dim())
    schema = func._schema
    vals = [args[i] if i < len(args) else kwargs.get(a.name) for i, a in enumerate(schema.arguments)]
    for a, v in zip(schema.arguments, vals):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        if isinstance(v, QuantMaster):
            for t in vals:
                if bad(v, t):
                    return v, t
        elif isinstance(v, (list, tuple)):
            for k, w in enumerate(v):
                if not isinstance(w, QuantMaster):
                    continue
                for t in vals:
                    if isinstance(t, (list, tuple)) and t is not v and k < len(t) and bad(w, t[k]):
                        return w, t[k]
    return None


def _is_weight(t):
    """The module's weight Parameter itself, or a view of it that was not detached."""
    return getattr(t, "_is_param", False) or getattr(t, "_live", False)


def _refuse_product(func, args, kwargs):
    from torch.utils._pytree import tree_leaves
    tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    w = next((t for t in tensors if isinstance(t, QuantMaster) and _is_weight(t)), None)
    if w is None or all(isinstance(t, QuantMaster) and _is_weight(t) for t in tensors):
        return   # (weights with weights only, as an orthogonality penalty W @ W.T computes: on the masters)
    if torch._C._current_autograd_node() is not None:
        return   # (autograd's own backward formulas of such a product: its forward was allowed)
    name, fmt = w._meta.name, w._meta.spec.format.upper()
    raise RuntimeError(
        f"mxshard: call the module to multiply by {name}.weight ({name}(x)), or keep {name} dense "
        f"(convert(..., skip=[{name!r}])): a converted linear's weight is its {w.dtype} master, and {func} on it "
        f"would compute with the master, not the {fmt} bytes the layer trains with. (The values the layer "
        f"multiplies by: mxshard.torch.dequantized_weight(module).)")


def _tracing_tensor(t):
    """torch.compile's stand-ins for a plain tensor (fake and functional tensors)."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch._subclasses.functional_tensor import FunctionalTensor
    return isinstance(t, (FakeTensor, FunctionalTensor))


_TENSOR_DATA = torch._C.TensorBase.data   # torch's `.data` descriptor (QuantMaster.data wraps it)


class QuantMaster(torch.Tensor):
    """A [rows, cols] (or FSDP2's [rows of this rank, cols]) float master of a quantized linear's
    weight. `_data` is the plain tensor holding the values; `_meta` the weight's WeightMeta."""

    @staticmethod
    def __new__(cls, data, meta, requires_grad=None, live=False, at_zero=False):
        # at_zero: the wrapper claims storage offset 0 whatever `data`'s (a Parameter whose `.data` was
        # set to a view into a larger buffer): torch's deepcopy / torch.save take a subclass's own
        # (empty) storage when its data_ptr() is not 0, and fail on it
        if type(data) is not torch.Tensor and not _tracing_tensor(data):
            raise TypeError(f"QuantMaster wraps a plain tensor, got {type(data).__name__}")
        return torch.Tensor._make_wrapper_subclass(
            cls, data.size(), strides=data.stride(), storage_offset=0 if at_zero else data.storage_offset(),
            dtype=data.dtype, layout=data.layout, device=data.device,
            requires_grad=data.requires_grad if requires_grad is None else requires_grad)

    def __init__(self, data, meta, requires_grad=None, live=False, at_zero=False):
        self._data = data
        self._meta = meta
        self._live = live   # a view of the module's weight Parameter (not detached): see _MATMULS

    def __repr__(self, *, tensor_contents=None):
        return f"QuantMaster({self._meta.name!r}, {self._meta.spec.format} planes={self._meta.spec.planes}, {self._data!r})"

    # -- `weight.data = t` (Hugging Face's _init_weights idiom, old-style device moves)
    #
    # torch's set_data swaps the storage of the outer tensor in C++, past __torch_dispatch__: the
    # wrapper would point at t while `_data` (what the bytes are made from) kept the old values.
    # The master instead takes t's values in the master's dtype as its new storage (t itself
    # when it already is a contiguous tensor of that dtype: the same aliasing as a plain
    # Parameter), and counts a write, so the next use re-derives the bytes from it.

    @property
    def data(self):
        return _TENSOR_DATA.__get__(self, type(self))

    @data.setter
    def data(self, value):
        meta = self._meta
        if isinstance(value, QuantMaster):
            value = value._data
        aliased = isinstance(value, torch.Tensor) and _aliases_more(value)
        if type(value) is not torch.Tensor and type(value) is not torch.nn.Parameter \
                and not _tracing_tensor(value):
            raise TypeError(f"mxshard: assign a plain torch.Tensor to {meta.name}.weight.data (or copy into it: "
                            f"weight.data.copy_(t)); got a {type(value).__name__}")
        if tuple(value.shape) != tuple(self.shape):
            raise ValueError(f"mxshard: assign a tensor of the weight's shape {tuple(self.shape)} to "
                             f"{meta.name}.weight.data; got {tuple(value.shape)} (a quantized weight keeps its shape)")
        if not value.is_floating_point():
            raise TypeError(f"mxshard: assign a floating-point tensor to {meta.name}.weight.data (its values become "
                            f"the {self.dtype} master); got {value.dtype}")
        new = value.detach().to(self.dtype).contiguous()
        if type(new) is torch.nn.Parameter:
            new = new.detach()
        # a view into a larger buffer at an offset (torch.nn.utils.vector_to_parameters, and
        # ZeroRedundancyOptimizer(parameters_as_bucket_view=True), whose later broadcasts into the
        # bucket must reach the master) stays a view: the master aliases the buffer, as a plain
        # Parameter would; only the wrapper claims offset 0 (at_zero)
        try:
            # the wrapper's device / strides follow
            _TENSOR_DATA.__set__(self, QuantMaster(new, meta, at_zero=True))
        except RuntimeError as e:   # (torch refuses a plain Parameter the same move: meta -> cpu)
            raise RuntimeError(
                f"mxshard: materialise {meta.name}.weight with model.to_empty(device=...) and copy into it "
                f"(weight.data.copy_(t)), or load it with load_state_dict(sd, assign=True): torch cannot move "
                f"it from {self.device} to {value.device} through `.data =` ({e})") from None
        old = _storage_id(self._data)
        self._data = new
        meta.count_write(new)   # fresh bytes at the next use (the storage changed too: a new unit)
        sid = _storage_id(new)
        meta.unseen.discard(old)
        if aliased and sid is not None and sid == _storage_id(value):
            meta.unseen.add(sid)

    # -- shared memory (nn.Module.share_memory(), torch.multiprocessing)
    #
    # The wrapper has no storage of its own (torch's Tensor.share_memory_ would move the wrapper's
    # empty storage and crash): `_data` holds the values, so it is the one moved into shared memory.
    # The values do not change, so the quantized bytes derived from them stay valid.

    def numpy(self, *, force=False):
        """The master's values as a READ-ONLY numpy array (`w.detach().cpu().numpy()`: torch refuses it
        for tensor subclasses). It shares memory with the master, but writes through numpy move no
        version counter, so the quantized bytes would never follow them: numpy refuses them (write
        with torch instead: `weight.data.copy_(torch.from_numpy(a))`)."""
        a = self._data.numpy(force=force)
        a.flags.writeable = False
        return a

    def tolist(self):
        """The master's values as nested lists, as a plain Parameter's `tolist()` (torch refuses it for
        tensor subclasses)."""
        return self._data.tolist()

    def share_memory_(self):
        self._data.share_memory_()
        return self

    def is_shared(self):
        return self._data.is_shared()

    # -- dispatch

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        metas = []

        def unwrap(t):
            metas.append(t._meta)
            return t._data

        written = _written_args(func, args, kwargs)
        if written and func.namespace != "c10d":
            hit = _broadcast_into(func, args, kwargs)
            if hit is not None:
                w, t = hit
                name = w._meta.name
                raise RuntimeError(
                    f"mxshard: write a tensor of {name}.weight's shape {tuple(w.shape)} into it, not one of shape "
                    f"{tuple(t.shape)} broadcast over it ({func}; nothing was written). An EMA "
                    f"(torch.optim.swa_utils.AveragedModel) built before ShardedOptimizer does this: the optimizer "
                    f"takes the converted weights out of model.parameters(), so the EMA pairs them with other "
                    f"parameters; keep an EMA of a ShardedOptimizer model yourself, from each converted linear's "
                    f"module.weight (the dequantized weight), or train with torch.optim / FSDP2, where "
                    f"AveragedModel works")
        if func.overloadpacket in _MATMUL_OPS:
            _refuse_product(func, args, kwargs)   # (raises for a product with the weight itself)
        uargs, ukwargs = tree_map_only(QuantMaster, unwrap, (args, kwargs))
        out = func(*uargs, **ukwargs)
        for w in written:  # a write into the master: the quantized bytes derived from it are stale
            torch.autograd.graph.increment_version(w._data)
            w._meta.count_write(w._data)
        if written:
            # in-place / out= ops return (aliases of) the arguments they wrote: give back the wrappers
            inner = {id(w._data): w for w in written}
            return tree_map_only(torch.Tensor, lambda t: inner.get(id(t), t), out)
        if func in _VIEWS or func in _NEW:
            meta = metas[0]
            live = func in _VIEWS and func not in _DETACHING and _is_weight(args[0])   # (a view's source: arg 0)

            def wrap():
                return tree_map_only(torch.Tensor,
                                     lambda t: QuantMaster(t, meta, live=live) if type(t) is torch.Tensor else t, out)
            if not torch.is_inference_mode_enabled():
                return wrap()
            # made outside inference mode: a view's wrapper takes its base's version counter, which an
            # inference tensor cannot; FSDP2's lazy init views every master, also in a first forward under
            # torch.inference_mode()
            with torch.inference_mode(False):
                return wrap()
        return out

    # torch.compile / swap_tensors (nn.Module._apply) see the subclass through these
    def __tensor_flatten__(self):
        return ["_data"], self._meta

    @staticmethod
    def __tensor_unflatten__(inner_tensors, meta, outer_size, outer_stride):
        data = inner_tensors["_data"]
        if type(data) is torch.nn.Parameter:   # (torch.export's run_decompositions hands the Parameter in)
            data = data.detach()
        return QuantMaster(data, meta)

    # -- FSDP2's all-gather extension (torch.distributed.fsdp._fully_shard._fsdp_param)

    def fsdp_pre_all_gather(self, mesh, outer_size, outer_stride, module, mp_policy):
        group = self._meta.group
        if group is None:
            raise RuntimeError(f"mxshard: {self._meta.name}: this master belongs to no converted model; build the "
                               f"module with mxshard.torch.convert(model, ...)")
        return group.pre_all_gather(self, mesh, tuple(outer_size), module)

    def fsdp_post_all_gather(self, all_gather_outputs, metadata, param_dtype, *, out=None):
        return self._meta.group.post_all_gather(self, all_gather_outputs, metadata, param_dtype, out)


# FSDP2 (torch 2.11, _fsdp_param.all_gather_inputs) calls inspect.signature on the bound
# fsdp_pre_all_gather at every all-gather, to pick the hook's calling convention; parsing the
# function each time costs tens of µs of host per gather. inspect returns a function's
# __signature__ when it has one: the same signature, computed once here.
for _hook in (QuantMaster.fsdp_pre_all_gather, QuantMaster.fsdp_post_all_gather):
    _hook.__signature__ = inspect.signature(_hook)


def is_quant_master(t) -> bool:
    """True for a QuantMaster (not for a DTensor holding one: look at its _local_tensor)."""
    return isinstance(t, QuantMaster)

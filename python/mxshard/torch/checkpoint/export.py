# SPDX-License-Identifier: MIT
"""A single-file safetensors export of a model for inference, and its loader.

    export_safetensors("model.safetensors", model)        # rank 0 writes, the other ranks return
    load_safetensors("model.safetensors", model)          # a converted model: the bytes
    load_safetensors("model.safetensors", plain_model)    # nn.Linear: the weights dequantized

The file. Every tensor of model.state_dict() under its name, in its dtype,
except each converted linear's weight, which goes as the planes its forward
multiplies by, each as the code it holds (stored_dtype):

    MXFP8   <m>.row_data   F8_E4M3 [out, in]        <m>.row_scale  U8 (E8M0), the layout's shape
    NVFP4   <m>.row_data   U8 (packed E2M1)         <m>.row_scale  F8_E4M3     <m>.amax  F32 [1]
            col_data / col_scale likewise for planes="both" (NVFP4: the transposed plane)

A tensor stored under several names (a tied embedding and LM head, a
buffer shared by layers: the same view of the same storage) is stored once,
under its first name; the metadata's "aliases" maps every other name to it
(safetensors files hold no shared storage). Metadata: "format"
(EXPORT_FORMAT), "mxshard" (JSON: per quantized module its format, shape,
planes, layout and rounding or block), "aliases" (JSON {alias: name}).

Reading it back:
  - model.load_state_dict(safetensors.torch.load_file(path)) into a converted
    model is refused by its converted linears, naming load_safetensors (the
    planes are no weight values).
  - load_safetensors(path, model) checks the file against the model first
    (quantized modules: the same format, shape, planes, layout and block;
    every key and shape), then restores the ties the file records and loads:
    into a quantized module the bytes, into an nn.Linear the row plane
    dequantized into its weight's dtype (mxshard.dequantize /
    dequantize_nvfp4 of the stored primary).
"""
from __future__ import annotations

import json
import os
import types

import torch
from torch import nn

from ... import formats as _formats
from ..zero.grads import module_owner
from .errors import CheckpointError, CheckpointMismatchError
from ..fsdp.linear import is_param_linear
from ..fsdp.units import WeightUnit



def stored_dtype(fmt, name):
    """The dtype the file stores plane `name` of a `fmt` weight as: its E4M3 planes float8_e4m3fn,
    NVFP4's amax float32, the rest uint8."""
    if name == "amax":
        return torch.float32
    return torch.float8_e4m3fn if name in _formats.get(fmt).e4m3_buffers else torch.uint8


__all__ = ["export_safetensors", "load_safetensors", "EXPORT_FORMAT"]

EXPORT_FORMAT = "mxshard.safetensors/1"
MODULUS = (1 << 31) - 1     # checksum's modulus (a Mersenne prime)


def checksum(t, offset=0):
    """Position-weighted sum mod MODULUS of the 16-bit words (bytes for 1-byte dtypes) of a piece
    that starts at element `offset` of its flat tensor: sum of (w+1)*(i mod MODULUS + 1) over words
    w at word index i. Sums of disjoint pieces add up (mod MODULUS) to the whole tensor's."""
    t = t.detach().reshape(-1).contiguous()
    if t.numel() == 0:
        return 0
    es = t.element_size()
    if es != 1 and es % 2:
        raise CheckpointError(f"keep tensors of dtype {t.dtype} out of checkpoints: they can not be checksummed")
    words, per, mask = (t.view(torch.uint8), 1, 0xFF) if es == 1 else (t.view(torch.int16), es // 2, 0xFFFF)
    total, base, step = 0, int(offset) * per, 1 << 22
    for i in range(0, words.numel(), step):
        w = words[i:i + step].to(torch.int64).bitwise_and_(mask).add_(1)
        idx = torch.arange(base + i, base + i + w.numel(), dtype=torch.int64, device=w.device)
        total += int(w.mul_(idx.remainder_(MODULUS).add_(1)).remainder_(MODULUS).sum())
    return total % MODULUS
_PLANE_KEYS = ("row_data", "row_scale", "col_data", "col_scale", "amax")   # a quantized module's buffers
_DEQUANT_DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}


def _safetensors(who):
    try:
        import safetensors.torch as st
    except ImportError as e:
        raise ImportError(f"{who} needs the safetensors package (pip install safetensors)") from e
    return st


def _check_args(path, model, who):
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{who}: path must be a str or os.PathLike, got {type(path).__name__}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"{who}: model must be an nn.Module, got {type(model).__name__}")


def _check_target(p):
    """On every rank, before any collective: a path rank 0 can write (a raise on rank 0 alone, after the
    gather, would leave the others returning as if the export had succeeded)."""
    if not p:
        raise ValueError("export_safetensors: give a file path (an empty path names no file)")
    if os.path.isdir(p):
        raise IsADirectoryError(f"export_safetensors: give a file path, not a directory: {p!r} is a directory")
    d = os.path.dirname(os.path.abspath(p))
    if not os.path.isdir(d):
        raise FileNotFoundError(f"export_safetensors: create the directory {d!r} first: the file {p!r} goes into it")
    if not os.access(d, os.W_OK):
        raise PermissionError(f"export_safetensors: give a path in a directory you can write: {d!r} is not writable")


def _every_rank(err, where, device):
    """One small all_gather of every rank's ok flag (mxshard.collectives.agree): a rank-local error
    (its own path, rank 0's write) makes every rank raise, that rank its own error, the others
    RemoteError, and no rank goes on to a collective the others skip."""
    from ... import collectives as C
    if C.agree(err is None, [], where, None, device) is None:
        raise err


# ---- pure helpers ------------------------------------------------------------------

def _module_info(m):
    """A quantized module (MXFP8Linear / NVFP4Linear, or convert()'s MXFP8ParamLinear /
    NVFP4ParamLinear through its spec) as the metadata describes it."""
    if is_param_linear(m):
        s = m.spec
        m = types.SimpleNamespace(format=s.format, out_features=m.out_features, in_features=m.in_features,
                                  planes=s.planes, layout=s.layout, rounding=s.rounding, block=s.block)
    return _INFO[_formats.get(m.format)](m)


def _mxfp8_info(m):
    # (no "format" key: the first version of the file wrote none, and readers take its absence as MXFP8)
    return {"shape": [m.out_features, m.in_features], "planes": m.planes, "layout": m.layout,
            "rounding": m.rounding, "block": 32, "data": "F8_E4M3", "scale": "E8M0 as U8"}


def _nvfp4_info(m):
    return {"format": _formats.NVFP4.name, "shape": [m.out_features, m.in_features], "planes": m.planes,
            "layout": m.layout, "block": m.block, "data": "E2M1 x2 as U8 (even index low; col_data transposed)",
            "scale": "F8_E4M3", "amax": "F32 [1]"}


_INFO = {_formats.MXFP8: _mxfp8_info, _formats.NVFP4: _nvfp4_info}   # a module's metadata, per format


def _file_format(info):
    """The name of the format of the file's quantized module `info` (absent: MXFP8, see _mxfp8_info)."""
    return info.get("format", _formats.MXFP8.name)


def _file_bufs(info):
    """The buffer names a quantized module of the metadata has in the file."""
    fmt = _formats.get(_file_format(info))
    return tuple(b for b in fmt.buffers if info["planes"] == "both" or not b.startswith("col_"))


def _view_id(t):
    """Equal for the same view of the same storage (one tensor under two names); None for an empty one."""
    if t.numel() == 0:
        return None
    return (str(t.device), t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()),
            t.dtype)


def _dedupe(state):
    """{name: tensor} -> ({name: tensor} each view once, {alias: first name})."""
    seen, kept, aliases = {}, {}, {}
    for key, t in state.items():
        vid = _view_id(t)
        if vid is not None and vid in seen:
            aliases[key] = seen[vid]
            continue
        if vid is not None:
            seen[vid] = key
        kept[key] = t
    return kept, aliases


def _options_difference(info, m):
    """How the file's quantized module `info` differs from module m (None: loadable as bytes)."""
    mine = _module_info(m)
    fmt = _file_format(info)
    if fmt != m.format:
        return f"format {fmt}, the model's {m.format}"
    for k in ("shape", "planes", "layout", "block", "rounding"):   # (NVFP4's info has no rounding: None, None)
        if info.get(k) != mine.get(k):
            return f"{k} {info.get(k)!r}, the model's {mine.get(k)!r}"
    return None


# ---- export ------------------------------------------------------------------------

def _param_linear_buffers(m, master):
    """{buffer name: tensor} of convert()'s linear `m` quantized from its full master: the library's
    writeback of a world of one, so the bytes equal the whole-tensor quantize of the master as the
    spec rounds it, which are the bytes the forward multiplies by (in one process, and gathered
    under FSDP2). Under ShardedOptimizer (the weight its replicated GatheredWeight): its planes."""
    from ..fsdp.gathered import GatheredWeight
    from ..fsdp.master import QuantMaster
    w = m._parameters.get("weight")
    if isinstance(w, GatheredWeight) and w._box.mesh is None:
        planes = w._box.planes
        return {b: getattr(planes["col" if b.startswith("col_") else "row"], b) for b in m.spec.fmt.buffers
                if (m.spec.planes == "both" or not b.startswith("col_"))
                and getattr(planes["col" if b.startswith("col_") else "row"], b, None) is not None}
    data = master._data if isinstance(master, QuantMaster) else master
    u = WeightUnit(m.meta, data.detach(), 1, 0)
    u.partial()
    u.apply(data._version)
    prim = u.local_primary()
    names = m.spec.fmt.buffers
    return {b: getattr(prim, b) for b in names if (m.spec.planes == "both" or not b.startswith("col_"))
            and getattr(prim, b, None) is not None}


def _sharded(model):
    from torch.distributed.tensor import DTensor
    return any(isinstance(p, DTensor) for p in model.parameters())


def _full_state_dict(model, keep):
    """model.state_dict() with every FSDP2 entry (a DTensor sharded on dim 0 over one mesh
    dimension) gathered whole, one entry at a time, on the CPU where `keep` (rank 0), through
    mxshard.collectives' plain all_gather: torch 2.11's functional collectives, which
    DTensor.full_tensor() and get_model_state_dict(full_state_dict=True) use, crash with gloo and
    CUDA tensors (a segmentation fault, seen on an H100 on 2 gloo ranks). Other placements: the
    DTensor's own full_tensor(). Every rank calls it, in the state dict's order."""
    from torch.distributed.tensor import DTensor, Shard
    from ... import collectives as C
    from ...fsdp_geometry import chunk_rows
    out = {}
    for key, t in model.state_dict().items():
        if isinstance(t, DTensor):
            mesh = t.device_mesh
            if mesh.ndim == 1 and tuple(t.placements) == (Shard(0),) and t.dim() >= 1:
                world, rows = mesh.size(), t.shape[0]
                local = t.to_local().detach()
                S = chunk_rows(rows, world)
                pad = local.new_zeros((S,) + tuple(t.shape[1:]))
                pad[:local.shape[0]] = local
                flat = pad.reshape(-1).view(torch.uint8)
                whole = torch.empty(world * flat.numel(), dtype=torch.uint8, device=flat.device)
                C.all_gather_bytes(whole, flat, mesh.get_group(), chunks=list(whole.view(world, -1)))
                t = whole.view(pad.dtype).view((world * S,) + tuple(t.shape[1:]))[:rows]
            else:
                t = t.full_tensor()
        if keep:
            out[key] = t.detach().to("cpu")
    return out


def export_safetensors(path, model):
    """A single-file safetensors of the whole model for inference (the module
    doc: names, dtypes, aliases, metadata). convert()'s linears are written
    as the bytes their forward multiplies by (their primaries, quantized from
    the masters), not as the masters. Rank 0 writes (atomically, through a
    temporary file): of the ShardedOptimizer's process group when one trains
    the model, else global rank 0. A model under FSDP2 (fully_shard): every
    rank calls it (the full state dict is gathered, a collective), rank 0
    writes; otherwise no collectives and the other ranks return at once
    (called on them alone, it writes nothing). Needs the `safetensors`
    package."""
    _check_args(path, model, "export_safetensors")
    st = _safetensors("export_safetensors")
    import torch.distributed as dist
    dist_on = dist.is_available() and dist.is_initialized()
    if not _sharded(model):   # (no collective: rank 0 alone writes, the others return at once)
        _check_target(os.fspath(path))
        if dist_on and not _writes_here(model):
            return
        return _write(path, model, model.state_dict(), st)
    # FSDP2: every rank gathers, so every rank learns whether a rank's path was bad, and whether
    # rank 0's write worked (a rank raising alone leaves the others in the next collective)
    dev = next(p for p in model.parameters() if p is not None).device
    err = None
    try:
        _check_target(os.fspath(path))
    except Exception as e:  # noqa: BLE001 - every rank learns of it first
        err = e
    try:
        _every_rank(err, "export_safetensors (another rank's path)", dev)
    finally:
        err = None
    full = _full_state_dict(model, keep=not dist_on or dist.get_rank() == 0)
    if dist_on and dist.get_rank() != 0:
        return _every_rank(None, "export_safetensors (rank 0's write)", dev)
    try:
        _write(path, model, full, st)
    except Exception as e:  # noqa: BLE001
        err = e
    try:
        if dist_on:
            _every_rank(err, "export_safetensors (rank 0's write)", dev)
        elif err is not None:
            raise err
    finally:
        err = None


def _writes_here(model):
    """Whether this rank writes a model no collective gathers (torch.distributed initialised): rank 0
    of the group of the ShardedOptimizer that trains it (a data-parallel group without global rank
    0, as Megatron's, wrote nothing, silently), else global rank 0."""
    import torch.distributed as dist
    opt = next((o for o in map(module_owner, model.modules()) if o is not None), None)
    return opt.rank == 0 if opt is not None else dist.get_rank() == 0


def _write(path, model, full, st):
    """Rank 0's part of export_safetensors: the file from the model's full state dict."""
    mx, fmt_of = {}, {}
    for name, m in model.named_modules(remove_duplicate=False):
        if is_param_linear(m):
            mx[name] = _module_info(m)
            fmt_of[name] = _formats.get(m.format)
        if is_param_linear(m):
            key = f"{name}.weight" if name else "weight"
            master = full.pop(key, None)
            if master is None:
                raise RuntimeError(f"export_safetensors: {key} is not in the model's state dict; export the model "
                                   f"whose linears convert() made")
            for b, t in _param_linear_buffers(m, master).items():
                full[f"{name}.{b}" if name else b] = t
    for key, t in full.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"export_safetensors: {key} is a {type(t).__name__} (a module's extra state?), not a "
                            f"tensor: a safetensors file holds tensors only")
    state, aliases = _dedupe(full)
    tensors = {}
    for key, t in state.items():
        mod, _, leaf = key.rpartition(".")
        if mod in fmt_of and leaf in fmt_of[mod].buffers:
            t = t.view(stored_dtype(fmt_of[mod], leaf))
        tensors[key] = t.detach().to("cpu").contiguous().clone()
    meta = {"format": EXPORT_FORMAT, "mxshard": json.dumps(mx, sort_keys=True),
            "aliases": json.dumps(aliases, sort_keys=True),
            # per tensor (checksum: safetensors records none): load_safetensors checks them
            "checksums": json.dumps({k: checksum(t, 0) for k, t in tensors.items()}, sort_keys=True)}
    p = os.fspath(path)
    tmp = p + ".tmp"
    try:
        st.save_file(tensors, tmp, metadata=meta)
        os.replace(tmp, p)
    except Exception as e:  # noqa: BLE001 - a full disk, a read-only file system, `<path>.tmp` a directory
        if os.path.isfile(tmp):
            os.remove(tmp)
        raise CheckpointError(f"export_safetensors: give a path you can write ({p!r} and {tmp!r} beside it): "
                              f"writing failed ({type(e).__name__}: {e})") from e


# ---- load --------------------------------------------------------------------------

def _read(p, st):
    """(tensors, quantized-module metadata, aliases) of file p; a safetensors file of
    another writer has no quantized modules and no aliases."""
    if not os.path.isfile(p):
        raise CheckpointError(f"load_safetensors: {p!r} is not a file")
    try:
        with st.safe_open(p, framework="pt", device="cpu") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # noqa: BLE001
        raise CheckpointError(f"load_safetensors: {p!r} is not a readable safetensors file "
                              f"({type(e).__name__}: {e})") from e
    fmt = meta.get("format")
    if fmt is None or (fmt != EXPORT_FORMAT and "mxshard" not in meta):
        return tensors, {}, {}
    if fmt != EXPORT_FORMAT:
        raise CheckpointError(f"load_safetensors: {p!r} is a {fmt} file; this version reads {EXPORT_FORMAT}")
    try:
        mx, aliases = json.loads(meta.get("mxshard", "{}")), json.loads(meta.get("aliases", "{}"))
        sums = json.loads(meta.get("checksums", "{}"))   # (files of the first writers have none)
    except ValueError as e:
        raise CheckpointError(f"load_safetensors: {p!r}: damaged metadata ({e})") from e
    if not (isinstance(mx, dict) and all(isinstance(v, dict) for v in mx.values()) and isinstance(aliases, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in aliases.items())
            and isinstance(sums, dict)):
        raise CheckpointError(f"load_safetensors: give a file written by export_safetensors (unedited): {p!r}'s "
                              f"'mxshard', 'aliases' or 'checksums' metadata is not of its kind")
    for name, info in mx.items():
        need = [k for k in ("shape", "planes", "layout") if k not in info]
        if need or not (isinstance(info["shape"], list) and len(info["shape"]) == 2
                        and all(isinstance(v, int) and v > 0 for v in info["shape"])):
            raise CheckpointError(f"load_safetensors: give a file written by export_safetensors (unedited): the "
                                  f"'mxshard' metadata of {name!r} lacks {need or 'a [rows, cols] shape'}")
        try:
            _formats.get(_file_format(info))
        except ValueError:
            raise CheckpointError(f"load_safetensors: give a file written by export_safetensors (unedited): the "
                                  f"'mxshard' metadata of {name!r} names the format {info.get('format')!r}, which "
                                  f"this version does not read") from None
    bad = [k for k, t in tensors.items() if k in sums and checksum(t, 0) != sums[k]]
    if bad or (sums and set(sums) != set(tensors)):
        what = f"{bad[0]!r} does not match its checksum" if bad else "its tensors differ from those it recorded"
        raise CheckpointError(f"load_safetensors: give an undamaged file: in {p!r}, {what} (a modified or damaged "
                              f"file); nothing was loaded")
    return tensors, mx, aliases


def _dequantized(name, info, get, dtype):
    """The row plane of the file's quantized module `name` as a dense [out, in] weight of `dtype`."""
    fmt = _formats.get(_file_format(info))
    rows, cols = info["shape"]
    bufs = {b: get(f"{name}.{b}") for b in _file_bufs(info)}
    bufs = {b: (t if b == "amax" else t.view(torch.uint8)) for b, t in bufs.items()}
    code = _DEQUANT_DTYPES.get(dtype, "f32")
    # the block is an option of NVFP4 weights only (MXFP8's metadata says 32, informational)
    block = info["block"] if fmt.option == "block" else None
    w = fmt.weight(rows, cols, block=block, layout=info["layout"], **bufs)
    return fmt.dequantize(w, plane="row", dtype=code).to(dtype)


def _quantized_entries(name, info, mod, get, who):
    """{state_dict key: tensor} for the file's quantized module `name` loaded into `mod`."""
    if is_param_linear(mod):
        # (a convert()ed one takes the row plane dequantized as its
        # master and quantizes it by its own spec: other options would silently be a second quantization)
        diff = _options_difference(info, mod)
        if diff:
            raise CheckpointMismatchError(
                f"{who}: {name}: the file's quantized weight has {diff}: convert the model with the file's options "
                f"(see the file's 'mxshard' metadata), or load into an unconverted model (dequantized)")
    if isinstance(mod, nn.Linear):
        want = tuple(info["shape"])
        if tuple(mod.weight.shape) != want:
            raise CheckpointMismatchError(f"{who}: {name}.weight: the file's quantized weight has shape {want}, "
                                          f"the model's {tuple(mod.weight.shape)}")
        return {f"{name}.weight": _dequantized(name, info, get, mod.weight.dtype)}
    raise CheckpointMismatchError(f"{who}: {name}: the file holds a quantized linear there, the model a "
                                  f"{type(mod).__name__}")


def _plan(model, tensors, mx, aliases, strict, who):
    """Everything checked, nothing written: (state dict to load, ties to restore [(alias, name)])."""
    def get(key):
        if key in tensors:
            return tensors[key]
        if aliases.get(key) in tensors:
            return tensors[aliases[key]]
        raise CheckpointError(f"{who}: the file lacks {key!r}")

    target = model.state_dict(keep_vars=True)
    modules = dict(model.named_modules(remove_duplicate=False))
    out, used = {}, set()
    for name, info in mx.items():
        used.update(f"{name}.{b}" for b in _file_bufs(info))
        mod = modules.get(name)
        if mod is None:
            if strict:
                raise CheckpointMismatchError(f"{who}: the file has the quantized module {name!r}, the model no module "
                                              f"of that name (strict=False skips it)")
            continue
        out.update(_quantized_entries(name, info, mod, get, who))
    for name in mx:
        if f"{name}.weight" in tensors:
            raise CheckpointMismatchError(f"{who}: give a file written by export_safetensors (unedited): it has both "
                                          f"a dense {name}.weight and {name}'s quantized planes")
    for name, mod in modules.items():
        planes = [b for b in _PLANE_KEYS if f"{name}.{b}" in tensors] if name not in mx else []
        if planes and f"{name}.weight" in target:
            raise CheckpointMismatchError(f"{who}: give a file written by export_safetensors (unedited): it has "
                                          f"{name}'s quantized planes ({', '.join(planes)}) but its 'mxshard' "
                                          f"metadata does not describe {name}, so they cannot be read")
    out.update({k: t for k, t in tensors.items() if k not in used})
    ties = []
    for alias, name in aliases.items():
        if alias in used or alias in out or name not in out:
            continue
        out[alias] = out[name]
        if alias in target and name in target and target[alias] is not target[name]:
            ties.append((alias, name))
    if strict:
        missing, unexpected = sorted(set(target) - set(out)), sorted(set(out) - set(target))
        if missing or unexpected:
            raise CheckpointMismatchError(
                f"{who}: the file and the model differ: {len(missing)} key(s) the file lacks "
                f"{missing[:3]}, {len(unexpected)} the model lacks {unexpected[:3]} (strict=False loads the rest)")
    for k, t in out.items():
        if k in target and tuple(t.shape) != tuple(target[k].shape):
            raise CheckpointMismatchError(f"{who}: {k}: the file has shape {tuple(t.shape)}, the model "
                                          f"{tuple(target[k].shape)}")
    for alias, name in ties:
        a, b = target[alias], target[name]
        if isinstance(a, nn.Parameter) != isinstance(b, nn.Parameter) or a.dtype != b.dtype or a.device != b.device:
            raise CheckpointMismatchError(f"{who}: the file ties {alias} to {name}; in the model they differ in kind, "
                                          f"dtype or device ({type(a).__name__} {a.dtype} {a.device}, "
                                          f"{type(b).__name__} {b.dtype} {b.device})")
    return out, ties


def _tie(model, alias, name):
    """Makes the model's tensor `alias` the very tensor `name` (a parameter or a buffer)."""
    mod_name, _, leaf = alias.rpartition(".")
    mod = model.get_submodule(mod_name)
    t = model.state_dict(keep_vars=True)[name]
    if leaf in mod._parameters:
        mod._parameters[leaf] = t
    else:
        mod._buffers[leaf] = t


def load_safetensors(path, model, *, strict=True):
    """Loads a file of export_safetensors into `model` (the module doc):
    ShardedOptimizer's linears take the quantized weights as bytes (exact); a
    convert()ed linear takes the row plane dequantized as its master, so its
    forward multiplies by the file's row-plane values exactly (an MXFP8
    "ceil" block may hold them under another, equivalent scale), and a
    "both" weight's column plane is derived from that master, not read from
    the file; an unconverted one (nn.Linear where the file has a quantized
    weight) takes the row plane dequantized into the weight's dtype. The ties the file
    records (a tensor stored once under several names) are restored first:
    the model's tensors at those names become one tensor (build the
    optimizer after loading). Everything is checked before anything is
    written: quantized modules of another format, shape, planes, layout or
    block raise CheckpointMismatchError, as do (strict=True) keys the file
    or the model lacks and shapes that differ. Returns load_state_dict's
    (missing_keys, unexpected_keys). No collectives: every rank may load.
    A safetensors file of another writer loads like load_state_dict (the
    quantized modules' buffers as bytes). Needs the `safetensors` package."""
    who = "load_safetensors"
    _check_args(path, model, who)
    if not isinstance(strict, bool):
        raise TypeError(f"{who}: strict must be a bool, got {type(strict).__name__}")
    if _sharded(model):
        raise CheckpointError(f"{who}: load the file into the model before fully_shard (every rank may load it: no "
                              f"collectives), or load a full state dict with torch's set_model_state_dict(..., "
                              f"StateDictOptions(full_state_dict=True)): the model's parameters are FSDP2 shards now")
    st = _safetensors(who)
    tensors, mx, aliases = _read(os.fspath(path), st)
    state, ties = _plan(model, tensors, mx, aliases, strict, who)
    for alias, name in ties:
        _tie(model, alias, name)
    return model.load_state_dict(state, strict=strict)

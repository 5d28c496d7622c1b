# SPDX-License-Identifier: MIT
"""Resharding checkpoints of a ShardedOptimizer through torch.distributed.checkpoint (DCP),
and a single-file safetensors export of the model.

    save_checkpoint(path, model, opt, extra={"step": 100}, rng=True)   # every rank
    extra = load_checkpoint(path, model, opt, rng=True)                # every rank, any DP size
    export_safetensors("model.safetensors", model)                     # rank 0 writes

Representation. Every saved quantity is ONE global 1-D tensor of DCP,
with a key per item (below), and each rank writes only its own pieces of
it: a piece is one DCP chunk (ChunkStorageMetadata offsets=(o,),
sizes=(n,)) of the global tensor (TensorStorageMetadata size=(numel,)).
The pieces come from small custom planners (_PieceSavePlanner /
_PieceLoadPlanner, subclasses of DCP's default planners that build
WriteItems of type SHARD from a list of (key, offset, tensor) and read
with DCP's own resharding helper, create_read_items_for_chunk_list).
ShardedTensor would express the same chunks but lives in the deprecated
torch.distributed._shard and its public constructor issues one collective
per tensor; DTensor can not express arbitrary ranges (its shards follow
torch.chunk). The planner interface and the metadata classes are DCP's
public extension points, so the files are plain DCP: any DCP reader sees
one tensor per key, whatever DP size it loads at.

Keys (item names as in opt.items, e.g. "b.weight"; N = numel of the item):

    mxshard/meta                  uint8: the JSON below (rank 0)
    master/<item>                 fp32 [N]  each rank its owned range (bucket shard order)
    state/<item>/<k>              inner state tensors of the master's shape (AdamW exp_avg,
                                  exp_avg_sq, SGD momentum_buffer), ranges as the master
    primary/<item>/row_data       MXFP8: float8_e4m3fn [rows*cols], split evenly over the ranks
                                  NVFP4: uint8 [ceil(rows*cols/2)] (packed E2M1), split evenly
    primary/<item>/row_scale      MXFP8: uint8 (E8M0), NVFP4: float8_e4m3fn [numel of the layout's
                                  scale plane], split evenly
    primary/<item>/col_data|col_scale   likewise, for planes="both" (NVFP4: the transposed plane)
    primary/<item>/amax           NVFP4: float32 [1], the global amax
    dense/<item>                  the parameter's dtype [N], split evenly
    model/<name>                  the rest of model.state_dict() (frozen parameters, other
                                  buffers; by state_dict name), split evenly; copied back on load
    extra/<k>                     the tensors of `extra` (rank 0's, whole)
    rng/<rank>/cpu|cuda<i>        uint8 RNG states of every rank (rng=True)

The JSON (with its own sha256): format version, the configuration
(item table: name, kind, shape, dtype with layout and rounding (NVFP4:
block and layout), group;
number of groups; inner optimizer class; round_through), the DP size it was
saved at, opt.steps, per param group the plain hyper-parameters and the
scalar inner state (e.g. AdamW's step), the plain values of `extra`, and
per key its numel, dtype and a checksum (a position-weighted sum mod
2^31-1 of its 16-bit words: every rank sums its own pieces, so it is
checked under any DP size by one small all-gather; DCP's torch.save
records carry no CRC check on load).

Loading (collective): each rank reads the pieces that overlap its new
ranges (DCP resharding), into staging buffers; nothing of the model or the
optimizer is touched until the configuration matched (a difference names
the first differing item), every key was present with its size and dtype,
and every checksum agreed. Then the masters and the inner state go in
through opt.load_state_dict(), which rebuilds the primaries and the dense
parameters by writeback; these are compared byte for byte with the saved
ones (a mismatch restores the previous state and raises
CheckpointMismatchError). Every verdict is reached by all ranks together
(one all_gather_object per phase): a rank never hangs while the others
raise, and every rank raises. Memory on load: staging for this rank's
pieces plus a backup (opt.state_dict()) while the comparison runs.

What must match: the item table (names, kinds, shapes, dtypes with layout
and rounding, param-group index), the number of param groups, the inner
optimizer's class and round_through. Not compared (free to change between
save and load): DP size, bucket_size, align, grad_reduce, max_grad_norm;
the param groups' plain hyper-parameters (lr, betas, ...) are restored
from the checkpoint, as torch.optim's load_state_dict does.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import warnings

import torch
from torch import nn

from .. import _lib as L
from . import layout as LY
from .linear import is_mxfp8
from .nvfp4_linear import is_nvfp4
from .optim import FORMAT as _OPT_FORMAT
from .optim import ShardedOptimizer, _plain

__all__ = ["save_checkpoint", "load_checkpoint", "export_safetensors", "CheckpointError",
           "CheckpointMismatchError", "FORMAT"]

FORMAT = "mxshard.torch.checkpoint/1"
EXPORT_FORMAT = "mxshard.safetensors/1"
_META = "mxshard/meta"
_P = (1 << 31) - 1          # the checksum's modulus (a Mersenne prime)
_CHUNK = 1 << 22            # words per checksum chunk
_PLANES = {"mx_row": ("row_data", "row_scale"), "mx_both": ("row_data", "row_scale", "col_data", "col_scale"),
           "nv_row": ("row_data", "row_scale", "amax"), "nv_both": ("row_data", "row_scale", "col_data", "col_scale",
                                                                     "amax")}


class CheckpointError(ValueError):
    """A checkpoint that can not be loaded: missing, unreadable, damaged
    (a truncated or modified file, a missing key, a checksum mismatch)."""


class CheckpointMismatchError(CheckpointError):
    """A valid checkpoint of another model or configuration, or one whose
    primaries differ from the ones rebuilt from its masters."""


# ---- small pure helpers ------------------------------------------------------------

def _even(n, world, r):
    """Rank r's part [lo, hi) of n elements split evenly (the first ranks get the smaller parts)."""
    return n * r // world, n * (r + 1) // world


def _dtype_name(dt):
    return str(dt).replace("torch.", "")


def _dtype_of(name):
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise CheckpointError(f"unknown dtype {name!r} in the checkpoint")
    return dt


def _checksum(t, offset):
    """Position-weighted sum mod _P of the 16-bit words (bytes for 1-byte
    dtypes) of a 1-D piece that starts at element `offset` of its global
    tensor: sum over words w at global word index i of (w+1)*(i mod _P + 1).
    Sums of disjoint pieces add up (mod _P) to the whole tensor's."""
    t = t.detach().reshape(-1).contiguous()
    if t.numel() == 0:
        return 0
    es = t.element_size()
    if es == 1:
        words, per, mask = t.view(torch.uint8), 1, 0xFF
    elif es % 2 == 0:
        words, per, mask = t.view(torch.int16), es // 2, 0xFFFF
    else:
        raise CheckpointError(f"a tensor of dtype {t.dtype} can not be checksummed")
    base = int(offset) * per
    total = 0
    for i in range(0, words.numel(), _CHUNK):
        w = words[i:i + _CHUNK].to(torch.int64).bitwise_and_(mask).add_(1)
        idx = torch.arange(base + i, base + i + w.numel(), dtype=torch.int64, device=w.device)
        idx.remainder_(_P).add_(1)
        total += int(w.mul_(idx).remainder_(_P).sum())
    return total % _P


def _config(opt):
    """What must agree between a checkpoint and the optimizer it is loaded into."""
    return {"items": [[s.name, s.kind, [int(d) for d in s.shape], s.dtype, int(s.group)] for s in opt.plan.items],
            "groups": len(opt.inner.param_groups), "inner": type(opt.inner).__name__,
            "round_through": opt.round_through}


def _item_text(x):
    name, kind, shape, dtype, group = x
    return f"{name} ({kind} {tuple(shape)} {dtype} group {group})"


def _config_difference(saved, mine):
    """The first difference between two _config() dicts as a message (None: equal)."""
    a, b = saved.get("items", []), mine["items"]
    for i in range(max(len(a), len(b))):
        x = a[i] if i < len(a) else None
        y = b[i] if i < len(b) else None
        if x != y:
            xs = _item_text(x) if x is not None else "<no item>"
            ys = _item_text(y) if y is not None else "<no item>"
            return f"item {i}: the checkpoint has {xs}, this model has {ys}"
    for k, what in (("groups", "param groups"), ("inner", "inner optimizer"), ("round_through", "round_through")):
        if saved.get(k) != mine[k]:
            return f"{what}: the checkpoint has {saved.get(k)!r}, this optimizer has {mine[k]!r}"
    return None


def _scalar(v):
    """A scalar inner-state value as JSON ([kind, dtype, shape, value]), or None when it is not one."""
    if isinstance(v, torch.Tensor):
        if v.numel() != 1:
            return None
        return ["tensor", _dtype_name(v.dtype), list(v.shape), v.detach().cpu().reshape(-1)[0].item()]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return ["number", type(v).__name__, [], v]


def _unscalar(x):
    kind, dt, shape, value = x
    if kind == "tensor":
        return torch.tensor(value, dtype=_dtype_of(dt)).reshape(shape)
    return int(value) if dt == "int" else float(value)


def _seal(body):
    text = json.dumps(body, sort_keys=True)
    return json.dumps({"sha256": hashlib.sha256(text.encode()).hexdigest(), "body": text}).encode()


def _unseal(raw):
    try:
        outer = json.loads(raw.decode())
        text = outer["body"]
        ok = hashlib.sha256(text.encode()).hexdigest() == outer["sha256"]
        body = json.loads(text)
    except Exception as e:  # noqa: BLE001
        raise CheckpointError(f"load_checkpoint: the checkpoint's {_META} record is damaged "
                              f"({type(e).__name__}: {e})") from e
    if not ok:
        raise CheckpointError(f"load_checkpoint: the checkpoint's {_META} record is damaged (sha256 mismatch)")
    if body.get("format") != FORMAT:
        raise CheckpointError(f"load_checkpoint: not a {FORMAT} checkpoint (format {body.get('format')!r})")
    return body


# ---- DCP planners -----------------------------------------------------------------

def _dcp():
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
    from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata, MetadataIndex, TensorProperties,
                                                       TensorStorageMetadata)
    from torch.distributed.checkpoint.planner import LoadPlan, SavePlan, TensorWriteData, WriteItem, WriteItemType
    from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list
    return dict(dcp=dcp, DefaultLoadPlanner=DefaultLoadPlanner, DefaultSavePlanner=DefaultSavePlanner,
                Chunk=ChunkStorageMetadata, Index=MetadataIndex, Props=TensorProperties,
                TensorMD=TensorStorageMetadata, LoadPlan=LoadPlan, SavePlan=SavePlan, TensorWriteData=TensorWriteData,
                WriteItem=WriteItem, WriteItemType=WriteItemType, read_items=create_read_items_for_chunk_list)


def _planners():
    D = _dcp()
    Size = torch.Size

    class _PieceSavePlanner(D["DefaultSavePlanner"]):
        """Writes exactly the given pieces: {key: (numel, [(offset, 1-D tensor), ...])}."""

        def __init__(self, pieces):
            super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
            self._pieces = pieces
            self._by_index = {}

        def set_up_planner(self, state_dict, storage_meta=None, is_coordinator=False):
            self.state_dict, self.is_coordinator = {}, is_coordinator

        def create_local_plan(self):
            items = []
            for key, (numel, plist) in self._pieces.items():
                for off, t in plist:
                    items.append(D["WriteItem"](
                        index=D["Index"](key, Size([off])), type=D["WriteItemType"].SHARD,
                        tensor_data=D["TensorWriteData"](chunk=D["Chunk"](offsets=Size([off]), sizes=Size([t.numel()])),
                                                         properties=D["Props"].create_from_tensor(t),
                                                         size=Size([numel]))))
                    self._by_index[(key, off)] = t
            self.plan = D["SavePlan"](items)
            return self.plan

        def resolve_data(self, write_item):
            t = self._by_index[(write_item.index.fqn, int(write_item.index.offset[0]))]
            return t.detach().contiguous().cpu()

    class _PieceLoadPlanner(D["DefaultLoadPlanner"]):
        """Reads into the given pieces: {key: (numel, offset, 1-D tensor)} (one range per key),
        from whichever saved pieces overlap it; checks presence, size, dtype and coverage."""

        def __init__(self, dests):
            super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
            self._dests = dests

        def set_up_planner(self, state_dict, metadata=None, is_coordinator=False):
            self.state_dict, self.metadata, self.is_coordinator = {}, metadata, is_coordinator

        def create_local_plan(self):
            reqs = []
            for key, (numel, off, t) in self._dests.items():
                md = self.metadata.state_dict_metadata.get(key)
                if md is None:
                    raise CheckpointError(f"the checkpoint has no key {key!r}")
                if not isinstance(md, D["TensorMD"]) or tuple(md.size) != (numel,) or md.properties.dtype != t.dtype:
                    raise CheckpointError(f"{key}: saved as {getattr(md, 'size', type(md).__name__)} "
                                          f"{getattr(getattr(md, 'properties', None), 'dtype', '')}, expected "
                                          f"a 1-D {t.dtype} tensor of {numel} elements")
                r = D["read_items"](key, md, [D["Chunk"](offsets=Size([off]), sizes=Size([t.numel()]))])
                got = sum(int(math.prod(x.lengths)) for x in r)
                if got != t.numel():
                    raise CheckpointError(f"{key}: the saved pieces cover {got} of the {t.numel()} elements "
                                          f"[{off}, {off + t.numel()}) this rank needs")
                reqs += r
            return D["LoadPlan"](reqs)

        def lookup_tensor(self, index):
            return self._dests[index.fqn][2]

        def load_bytes(self, read_item, value):
            raise CheckpointError(f"{read_item.dest_index.fqn}: a bytes record where a tensor was expected")

    return _PieceSavePlanner, _PieceLoadPlanner


@contextlib.contextmanager
def _quiet():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        yield


def _dcp_kwargs(opt):
    return {"process_group": opt.comm.group} if opt.comm.active else {"no_dist": True}


def _dcp_error(e):
    """A compact message for DCP's CheckpointException (ranks and their exceptions) or any error."""
    fails = getattr(e, "failures", None)
    if isinstance(fails, dict) and fails:
        parts = []
        for r, v in sorted(fails.items()):
            exc = v[0] if isinstance(v, tuple) else v
            parts.append(f"rank {r}: {type(exc).__name__}: {exc}")
        return "; ".join(parts)
    return f"{type(e).__name__}: {e}"


# ---- agreement ------------------------------------------------------------------

def _agree(opt, err, payload=None, where="checkpoint"):
    """Every rank's (error, payload) through ONE all_gather_object. When any
    rank failed, every rank raises: its own error where it has one, else the
    first failing rank's (CheckpointError / CheckpointMismatchError by kind,
    mxshard.RemoteError for other errors). Returns the payloads."""
    if not isinstance(opt, ShardedOptimizer) or getattr(opt, "_closed", False):
        if err is not None:   # no group to tell (not an optimizer, or a closed one)
            raise err
        raise TypeError(f"{where}: opt must be a live ShardedOptimizer")
    mine = None
    if err is not None:
        kind = "mismatch" if isinstance(err, CheckpointMismatchError) else \
            "checkpoint" if isinstance(err, CheckpointError) else "other"
        mine = (kind, f"{type(err).__name__}: {err}" if kind == "other" else str(err))
    got = opt.comm.all_gather_object((mine, payload), "checkpoint")
    bad = [(r, e) for r, (e, _) in enumerate(got) if e is not None]
    if err is not None:
        raise err
    if bad:
        r, (kind, msg) = bad[0]
        if kind == "mismatch":
            raise CheckpointMismatchError(f"{msg} (reported by rank {r})")
        if kind == "checkpoint":
            raise CheckpointError(f"{msg} (reported by rank {r})")
        raise L.remote_error(f"{where} (rank {r} failed: {msg})")
    return [p for _, p in got]


def _check_call(model, opt, path, name):
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{name}: path must be a str or os.PathLike, got {type(path).__name__}")
    if not isinstance(opt, ShardedOptimizer):
        raise TypeError(f"{name}: opt must be a ShardedOptimizer, got {type(opt).__name__}")
    if getattr(opt, "_closed", False):
        raise ValueError(f"{name}: the optimizer was closed")
    if not isinstance(model, nn.Module):
        raise TypeError(f"{name}: model must be an nn.Module, got {type(model).__name__}")
    mods = {id(m) for m in model.modules()}
    prms = {id(p) for p in model.parameters()}
    for it in opt._items:
        ok = id(it.module) in mods if it.module is not None else id(it.param) in prms
        if not ok:
            raise ValueError(f"{name}: {it.name} of the optimizer is not part of this model "
                             f"(pass the model the optimizer was built on)")


# ---- what a rank owns -------------------------------------------------------------

def _owned(opt):
    """This rank's item pieces: [(item index, name, bucket, item start, length, shard pos)]."""
    out = []
    for bk in opt._buckets:
        for p, start, length, pos in LY.item_shards(bk.spec, opt.rank):
            if length:
                out.append((p.item, opt.plan.items[p.item].name, bk.spec.index, start, length, pos))
    return out


def _primary_view(it, pn):
    """Buffer `pn` of item `it`'s primary, flat, in the dtype its key is saved as: the E4M3
    bytes (MXFP8 data, NVFP4 scales) as float8_e4m3fn, the rest as they are (uint8 E8M0
    scales, uint8 packed E2M1 data, the float32 amax)."""
    t = getattr(it.module, pn).reshape(-1)
    e4m3 = pn.endswith("_data") if it.kind in LY.MX_KINDS else pn.endswith("_scale")
    return t.view(torch.float8_e4m3fn) if e4m3 else t


def _replicated(opt):
    """The replicated keys written once (split evenly over the ranks): {key: flat view}
    for every MXFP8 / NVFP4 plane (and NVFP4 amax) and dense parameter."""
    out = {}
    for it in opt._items:
        if it.module is not None:
            for pn in _PLANES[it.kind]:
                out[f"primary/{it.name}/{pn}"] = _primary_view(it, pn)
        else:
            out[f"dense/{it.name}"] = it.param.detach().reshape(-1)
    return out


def _others(model, opt):
    """The rest of the model's state (frozen parameters, buffers other than the MXFP8
    planes of the optimizer's items), by state_dict name: {name: tensor}."""
    taken = set()
    for it in opt._items:
        if it.module is not None:
            taken.update(id(t) for t in it.module._buffers.values() if t is not None)
        else:
            taken.add(id(it.param))
    return {k: v for k, v in model.state_dict(keep_vars=True).items()
            if isinstance(v, torch.Tensor) and id(v) not in taken}


def _rng_states():
    out = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            out[f"cuda{i}"] = s
    return out


# ---- save -------------------------------------------------------------------------

def _collect_state(opt):
    """This rank's inner state: per-element pieces {key: (item numel, [(item start, tensor)])}
    (a state tensor of the view's shape) and, per group, {"scalars": {k: scalar JSON},
    "tensors": sorted per-element keys} (None where the rank holds no view of the group)."""
    owned = {}
    for i, name, b, start, length, pos in _owned(opt):
        owned.setdefault(b, []).append((pos, length, start, name, opt.plan.items[i].numel))
    pieces, groups = {}, [None] * len(opt.inner.param_groups)
    for idx, g, b, lo, hi, v in opt._inner_params():
        scal, tens = {}, []
        for k, x in opt.inner.state.get(v, {}).items():
            if isinstance(x, torch.Tensor) and tuple(x.shape) == (hi - lo,):
                tens.append(k)
                for pos, length, start, name, numel in owned.get(b, []):
                    if lo <= pos < hi:
                        pieces.setdefault(f"state/{name}/{k}", (numel, []))[1].append(
                            (start, x[pos - lo:pos - lo + length]))
                continue
            sc = _scalar(x)
            if sc is None:
                raise ValueError(f"save_checkpoint: inner optimizer state {k!r} of group {g} is neither a tensor of "
                                 f"the parameter's shape nor a scalar ({type(x).__name__} "
                                 f"{tuple(getattr(x, 'shape', ()))}): not supported")
            scal[k] = sc
        mine = {"scalars": scal, "tensors": sorted(tens)}
        if groups[g] is None:
            groups[g] = mine
        elif groups[g] != mine:
            raise ValueError(f"save_checkpoint: the inner optimizer's state differs between the parameters of group "
                             f"{g} ({groups[g]} vs {mine}): not supported")
    return pieces, groups


def _merge_groups(per_rank):
    """Every rank's per-group state summaries -> one per group (they must agree)."""
    n = len(per_rank[0])
    out = []
    for g in range(n):
        seen = [(r, x[g]) for r, x in enumerate(per_rank) if x[g] is not None]
        if not seen:
            out.append({"scalars": {}, "tensors": []})
            continue
        r0, ref = seen[0]
        for r, x in seen[1:]:
            if x != ref:
                raise ValueError(f"the inner optimizer's state of group {g} differs between rank {r0} ({ref}) and "
                                 f"rank {r} ({x})")
        out.append(ref)
    return out


def _check_extra(extra):
    if extra is None:
        return {}, {}
    if not isinstance(extra, dict):
        raise TypeError(f"save_checkpoint: extra must be a dict, got {type(extra).__name__}")
    plain, tensors = {}, {}
    for k, v in extra.items():
        if not isinstance(k, str) or not k or "/" in k:
            raise ValueError(f"save_checkpoint: extra keys must be non-empty str without '/', got {k!r}")
        if isinstance(v, torch.Tensor):
            if v.is_sparse or v.dtype.is_complex:
                raise ValueError(f"save_checkpoint: extra[{k!r}] is a sparse or complex tensor")
            tensors[k] = v.detach()
            continue
        try:
            json.dumps(v)
        except (TypeError, ValueError) as e:
            raise TypeError(f"save_checkpoint: extra[{k!r}] must be a tensor or a plain JSON value "
                            f"(numbers, str, bool, None, lists, dicts): {e}") from None
        plain[k] = v
    return plain, tensors


def save_checkpoint(path, model, opt, *, extra=None, rng=False):
    """Write a DCP checkpoint of `model` and its ShardedOptimizer `opt` to
    the directory `path` (see the module doc). Collective: every rank of the
    optimizer's group calls it; each rank writes only its own pieces.
    `extra`: plain JSON values and tensors (rank 0's are saved); `rng`: save
    every rank's torch RNG states (CPU, and CUDA when initialised)."""
    err, payload = None, None
    try:
        _check_call(model, opt, path, "save_checkpoint")
        if not isinstance(rng, bool):
            raise TypeError(f"save_checkpoint: rng must be a bool, got {type(rng).__name__}")
        plain, xt = _check_extra(extra)
        world, r = opt.world, opt.rank
        pieces = {}          # key -> (numel, [(offset, tensor)])
        for i, name, b, start, length, pos in _owned(opt):
            pieces.setdefault(f"master/{name}", (opt.plan.items[i].numel, []))[1].append(
                (start, opt._buckets[b].master[pos:pos + length]))
        spieces, groups = _collect_state(opt)
        pieces.update(spieces)
        for key, t in _replicated(opt).items():
            lo, hi = _even(t.numel(), world, r)
            pieces[key] = (t.numel(), [(lo, t[lo:hi])] if hi > lo else [])
        others = _others(model, opt)
        for k, t in others.items():
            flat = t.detach().reshape(-1)
            lo, hi = _even(flat.numel(), world, r)
            pieces[f"model/{k}"] = (flat.numel(), [(lo, flat[lo:hi])] if hi > lo else [])
        if r == 0:
            for k, t in xt.items():
                flat = t.reshape(-1)
                pieces[f"extra/{k}"] = (flat.numel(), [(0, flat)] if flat.numel() else [])
        if rng:
            for k, t in _rng_states().items():
                pieces[f"rng/{r}/{k}"] = (t.numel(), [(0, t.reshape(-1))])
        sums = {key: sum(_checksum(t, off) for off, t in plist) % _P for key, (_, plist) in pieces.items()}
        info = {key: [n, _dtype_name(plist[0][1].dtype)] for key, (n, plist) in pieces.items() if plist}
        extra_empty = {f"extra/{k}": _dtype_name(t.dtype) for k, t in xt.items() if t.numel() == 0}
        extra_empty.update({f"model/{k}": _dtype_name(t.dtype) for k, t in others.items() if t.numel() == 0})
        payload = {"sums": sums, "info": info, "groups": groups,
                   "cuda": sum(1 for k in pieces if k.startswith(f"rng/{r}/cuda"))}
        for key in list(pieces):
            pieces[key] = (pieces[key][0], [(o, t) for o, t in pieces[key][1] if t.numel()])
    except Exception as e:  # noqa: BLE001 - the group learns of it first
        err = e
    got = _agree(opt, err, payload, "save_checkpoint")
    # the same on every rank from here (the gathered payloads)
    keys, sums = {}, {}
    for p in got:
        for key, v in p["info"].items():
            keys.setdefault(key, v)
        for key, s in p["sums"].items():
            sums[key] = (sums.get(key, 0) + s) % _P
    err = None
    try:
        groups = _merge_groups([p["groups"] for p in got])
        for k, dt in extra_empty.items():
            keys.setdefault(k, [0, dt])
        body = {"format": FORMAT, "optimizer_format": _OPT_FORMAT, "torch": torch.__version__,
                "config": _config(opt), "world": opt.world, "steps": int(opt.steps),
                "keys": {k: [int(n), dt, int(sums.get(k, 0))] for k, (n, dt) in sorted(keys.items())},
                "groups": [dict(gs, options={k: (list(v) if isinstance(v, tuple) else v)
                                             for k, v in grp.items() if k != "params" and _plain(v)})
                           for gs, grp in zip(groups, opt.inner.param_groups)],
                "items": {it.name: _item_meta(opt, it) for it in opt._items},
                "model": {k: list(t.shape) for k, t in sorted(others.items())},
                "extra": {"plain": plain, "tensors": sorted(xt)},
                "rng": {"world": opt.world, "cuda": [p["cuda"] for p in got]} if rng else None}
        meta = torch.frombuffer(bytearray(_seal(body)), dtype=torch.uint8)
        if opt.rank == 0:
            pieces[_META] = (meta.numel(), [(0, meta)])
        save_planner, _ = _planners()
        with _quiet():
            _dcp()["dcp"].save({}, storage_writer=_dcp()["dcp"].FileSystemWriter(os.fspath(path)),
                               planner=save_planner(pieces), **_dcp_kwargs(opt))
    except BaseException as e:  # noqa: BLE001 - DCP's CheckpointException is a BaseException
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        err = e if isinstance(e, Exception) and not hasattr(e, "failures") else \
            CheckpointError(f"save_checkpoint: writing {os.fspath(path)!r} failed: {_dcp_error(e)}")
    _agree(opt, err, None, "save_checkpoint")


def _item_meta(opt, it):
    """An item as the record describes it (for humans and tools; _config is what is compared)."""
    if it.module is None:
        return {"kind": "dense", "shape": list(it.shape), "dtype": it.dtype}
    m = it.module
    d = {"kind": it.kind, "shape": list(it.shape), "planes": m.planes, "layout": m.layout}
    if it.kind in LY.MX_KINDS:
        d["rounding"] = opt._roundings[it.name]
    else:
        d["block"] = m.block
    for pn in _PLANES[it.kind]:
        if pn.endswith("_scale"):
            d[pn] = list(getattr(m, pn).shape)
    return d


# ---- load -------------------------------------------------------------------------

def _read_dcp_metadata(path):
    D = _dcp()
    p = os.fspath(path)
    if not os.path.isdir(p):
        raise CheckpointError(f"load_checkpoint: {p!r} is not a directory")
    if not os.path.isfile(os.path.join(p, ".metadata")):
        raise CheckpointError(f"load_checkpoint: {p!r} holds no DCP checkpoint (no .metadata file)")
    try:
        md = D["dcp"].FileSystemReader(p).read_metadata()
    except Exception as e:  # noqa: BLE001
        raise CheckpointError(f"load_checkpoint: the DCP metadata of {p!r} is unreadable "
                              f"({type(e).__name__}: {e})") from e
    m = md.state_dict_metadata.get(_META)
    if m is None or not isinstance(m, D["TensorMD"]) or m.properties.dtype != torch.uint8 or len(m.size) != 1:
        raise CheckpointError(f"load_checkpoint: {p!r} is not an mxshard checkpoint (no {_META} record)")
    return md


def _dcp_load(path, opt, dests):
    _, load_planner = _planners()
    D = _dcp()
    try:
        with _quiet():
            D["dcp"].load({}, storage_reader=D["dcp"].FileSystemReader(os.fspath(path)),
                          planner=load_planner(dests), **_dcp_kwargs(opt))
    except BaseException as e:  # noqa: BLE001 - CheckpointException is a BaseException
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        fails = getattr(e, "failures", None)
        if isinstance(fails, dict):
            for v in fails.values():
                exc = v[0] if isinstance(v, tuple) else v
                if isinstance(exc, CheckpointError):
                    raise CheckpointError(f"load_checkpoint: {exc}") from None
        raise CheckpointError(f"load_checkpoint: reading {os.fspath(path)!r} failed (a truncated or damaged "
                              f"file?): {_dcp_error(e)}") from None


def _plan_reads(model, opt, body, md, rng, strict):
    """Local: the checks against this optimizer and every staging buffer
    this rank reads into. Returns (dests, parts) where dests is the
    planner's {key: (numel, offset, tensor)} and parts says what each is."""
    diff = _config_difference(body.get("config", {}), _config(opt))
    if diff:
        raise CheckpointMismatchError(f"load_checkpoint: the checkpoint is of another model or configuration: {diff}")
    keys = body["keys"]
    have = set(md.state_dict_metadata) - {_META}
    missing = sorted(k for k in set(keys) - have if keys[k][0] > 0)   # an empty tensor has no piece
    if missing:
        raise CheckpointError(f"load_checkpoint: the checkpoint lacks {len(missing)} of its keys, e.g. {missing[0]!r}")
    unexpected = sorted(have - set(keys))
    if unexpected and strict:
        raise CheckpointError(f"load_checkpoint: the checkpoint has keys its record does not list, e.g. "
                              f"{unexpected[0]!r} (strict=False ignores them)")
    for k, (n, dt, _) in keys.items():
        if n == 0:
            continue
        m = md.state_dict_metadata[k]
        if tuple(getattr(m, "size", ())) != (n,) or _dtype_name(m.properties.dtype) != dt:
            raise CheckpointError(f"load_checkpoint: {k}: DCP metadata {tuple(getattr(m, 'size', ()))} "
                                  f"{getattr(m.properties, 'dtype', None)} differs from the record's ({n},) {dt}")
    dev, world, r = opt.device, opt.world, opt.rank
    dests, parts = {}, {"split": [], "full": []}

    def add(key, off, length, device, split):
        if key not in keys:
            raise CheckpointError(f"load_checkpoint: the checkpoint's record lacks {key!r}")
        n, dt, _ = keys[key]
        t = torch.zeros(length, dtype=_dtype_of(dt), device=device)
        dests[key] = (n, off, t)
        parts["split" if split else "full"].append(key)
        return t

    for i, name, b, start, length, pos in _owned(opt):
        add(f"master/{name}", start, length, dev, True)
        for k in body["groups"][opt.plan.items[i].group]["tensors"]:
            add(f"state/{name}/{k}", start, length, dev, True)
    for key, t in _replicated(opt).items():
        lo, hi = _even(t.numel(), world, r)
        if hi > lo:
            add(key, lo, hi - lo, dev, True)
    others = _others(model, opt)
    saved = body.get("model", {})
    for k, t in others.items():
        key = f"model/{k}"
        if key not in keys:
            raise CheckpointMismatchError(f"load_checkpoint: the checkpoint has no {k!r} (model state outside the "
                                          f"optimizer: frozen parameters, buffers)")
        if list(t.shape) != saved.get(k) or _dtype_name(t.dtype) != keys[key][1]:
            raise CheckpointMismatchError(f"load_checkpoint: {k}: the checkpoint has {tuple(saved.get(k, ()))} "
                                          f"{keys[key][1]}, this model {tuple(t.shape)} {_dtype_name(t.dtype)}")
        if t.numel():
            add(key, 0, t.numel(), t.device, False)
    extra_model = sorted(set(saved) - set(others))
    if extra_model and strict:
        raise CheckpointMismatchError(f"load_checkpoint: the checkpoint has model state this model lacks, e.g. "
                                      f"{extra_model[0]!r} (strict=False ignores it)")
    for k in body["extra"]["tensors"]:
        key = f"extra/{k}"
        if keys[key][0]:
            add(key, 0, keys[key][0], "cpu", False)
    if rng:
        saved = body.get("rng")
        why = None
        if saved is None:
            why = "it was saved without RNG states (rng=False)"
        elif saved["world"] != world:
            why = f"its RNG states are of {saved['world']} ranks, this group has {world}"
        if why and strict:
            raise CheckpointError(f"load_checkpoint: rng=True, but {why} (strict=False leaves the RNG states as "
                                  f"they are)")
        if not why:
            for key in keys:
                if key.startswith(f"rng/{r}/"):
                    add(key, 0, keys[key][0], "cpu", False)
    # the split keys every rank reads part of (the same list on every rank)
    parts["all_split"] = sorted(k for k in keys if k.split("/")[0] in ("master", "state", "primary", "dense"))
    return dests, parts


def _inner_state_dict(opt, body, dests):
    """The inner optimizer's state_dict for this rank's views, from the staged pieces."""
    by_bucket = {}
    for i, name, b, start, length, pos in _owned(opt):
        by_bucket.setdefault(b, []).append((pos, length, name))
    template = opt.inner.state_dict()
    state = {}
    for idx, g, b, lo, hi, v in opt._inner_params():
        gs = body["groups"][g]
        st = {}
        for k in gs["tensors"]:
            parts = [dests[f"state/{name}/{k}"][2] for pos, length, name in sorted(by_bucket.get(b, []))
                     if lo <= pos < hi]
            if len({p.dtype for p in parts}) > 1:
                raise CheckpointError(f"load_checkpoint: state {k!r} has several dtypes inside one parameter run")
            st[k] = torch.cat(parts) if len(parts) != 1 else parts[0].clone()
        for k, x in gs["scalars"].items():
            st[k] = _unscalar(x)
        if st:
            state[idx] = st
    groups = []
    for g, grp in enumerate(template["param_groups"]):
        cur = dict(grp)
        for k, v in body["groups"][g].get("options", {}).items():
            cur[k] = tuple(v) if isinstance(grp.get(k), tuple) and isinstance(v, list) else v
        groups.append(cur)
    return {"state": state, "param_groups": groups}


def _bytes(t):
    return t.detach().reshape(-1).contiguous().view(torch.uint8)


def load_checkpoint(path, model, opt, *, rng=False, strict=True):
    """Load a save_checkpoint() directory into `model` and its ShardedOptimizer
    `opt`, under any DP size (see the module doc). Collective: every rank
    calls it. Returns the saved `extra` (plain values as JSON round-trips
    them; tensors on the CPU). rng=True restores this rank's RNG states
    (saved at the same DP size). strict=False ignores keys the record does
    not list and, with rng=True, leaves the RNG states alone when the
    checkpoint has none for this DP size (strict: an error)."""
    # phase 1 (local): arguments, the DCP metadata
    err, md = None, None
    try:
        _check_call(model, opt, path, "load_checkpoint")
        for name, v in (("rng", rng), ("strict", strict)):
            if not isinstance(v, bool):
                raise TypeError(f"load_checkpoint: {name} must be a bool, got {type(v).__name__}")
        md = _read_dcp_metadata(path)
    except Exception as e:  # noqa: BLE001
        err = e
    _agree(opt, err, None, "load_checkpoint")
    # phase 2: the record (DCP read, errors agreed by DCP and by _agree)
    err, body = None, None
    try:
        n = int(md.state_dict_metadata[_META].size[0])
        raw = torch.zeros(n, dtype=torch.uint8)
        _dcp_load(path, opt, {_META: (n, 0, raw)})
        body = _unseal(raw.numpy().tobytes())
        dests, parts = _plan_reads(model, opt, body, md, rng, strict)
    except Exception as e:  # noqa: BLE001
        err = e
    _agree(opt, err, None, "load_checkpoint")
    # phase 3: every piece of this rank, then the checksums (one all-gather for the verdict)
    err, partial = None, None
    try:
        _dcp_load(path, opt, dests)
        keys = body["keys"]
        for k in parts["full"]:
            if _checksum(dests[k][2], 0) != keys[k][2]:
                raise CheckpointError(f"load_checkpoint: {k}: checksum mismatch (a modified or damaged file)")
        partial = {k: _checksum(dests[k][2], dests[k][1]) for k in parts["split"]}
    except Exception as e:  # noqa: BLE001
        err = e
    got = _agree(opt, err, partial, "load_checkpoint")
    bad = []
    for k in parts["all_split"]:
        s = sum(p.get(k, 0) for p in got) % _P
        if s != body["keys"][k][2]:
            bad.append(k)
    if bad:
        raise CheckpointError(f"load_checkpoint: checksum mismatch in {len(bad)} key(s), e.g. {bad[0]!r} "
                              f"(a modified or damaged file)")
    # phase 4: into the optimizer (its load_state_dict: agreement + writeback), then the byte comparison
    err, sd = None, None
    try:
        masters = []
        for bk in opt._buckets:
            masters.append(torch.zeros_like(bk.master))
        for i, name, b, start, length, pos in _owned(opt):
            masters[b][pos:pos + length].copy_(dests[f"master/{name}"][2])
        sd = {"format": _OPT_FORMAT, "world": opt.world, "rank": opt.rank, "fingerprint": opt.fingerprint,
              "step": int(body["steps"]), "buckets": masters, "inner": _inner_state_dict(opt, body, dests)}
    except Exception as e:  # noqa: BLE001
        err = e
    _agree(opt, err, None, "load_checkpoint")
    backup = opt.state_dict()
    opt.load_state_dict(sd)
    err = None
    try:
        for key, t in _replicated(opt).items():
            if key in dests:
                lo = dests[key][1]
                want = dests[key][2]
                if not torch.equal(_bytes(t[lo:lo + want.numel()]), _bytes(want)):
                    nbad = int((_bytes(t[lo:lo + want.numel()]) != _bytes(want)).sum())
                    raise CheckpointMismatchError(
                        f"load_checkpoint: {key}: the value rebuilt from the loaded masters differs from the saved one "
                        f"in {nbad} byte(s) of elements [{lo}, {lo + want.numel()}) (the checkpoint's primaries are "
                        f"not the writeback of its masters, or the writeback changed); the previous state was restored")
    except Exception as e:  # noqa: BLE001
        err = e
    try:
        _agree(opt, err, None, "load_checkpoint")
    except Exception:
        opt.load_state_dict(backup)
        raise
    del backup
    # phase 5: the rest of the model's state, RNG and extra (nothing can fail any more)
    with torch.no_grad():
        for k, t in _others(model, opt).items():
            if f"model/{k}" in dests:
                t.copy_(dests[f"model/{k}"][2].view(t.shape))
    if rng:
        for key in parts["full"]:
            if key.startswith(f"rng/{opt.rank}/"):
                what = key.split("/")[2]
                if what == "cpu":
                    torch.set_rng_state(dests[key][2])
                elif torch.cuda.is_available():
                    i = int(what[4:])
                    if i < torch.cuda.device_count():
                        torch.cuda.set_rng_state(dests[key][2], device=i)
    out = dict(body["extra"]["plain"])
    for k in body["extra"]["tensors"]:
        key = f"extra/{k}"
        out[k] = dests[key][2] if key in dests else torch.zeros(0, dtype=_dtype_of(body["keys"][key][1]))
    return out


# ---- safetensors export ------------------------------------------------------------

def export_safetensors(path, model):
    """A single-file safetensors of the whole model for inference: every
    MXFP8Linear's planes as `<module>.row_data` (F8_E4M3, [out, in]),
    `<module>.row_scale` (U8: E8M0 exponents, the layout's shape), and col
    likewise for planes="both"; every NVFP4Linear's as `<module>.row_data`
    (U8: packed E2M1, TE's shape), `<module>.row_scale` (F8_E4M3), col
    likewise, `<module>.amax` (F32 [1]); every other parameter and buffer of
    the model in its dtype (the names of model.state_dict()). The metadata
    holds the format and per quantized module its shape, planes, layout and
    rounding or block (JSON under "mxshard"). No collectives: global rank 0 writes
    (atomically, through a temporary file), the other ranks return. Needs
    the `safetensors` package."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"export_safetensors: path must be a str or os.PathLike, got {type(path).__name__}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"export_safetensors: model must be an nn.Module, got {type(model).__name__}")
    try:
        import safetensors.torch as st
    except ImportError as e:
        raise ImportError("export_safetensors needs the safetensors package (pip install safetensors)") from e
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized() and dist.get_rank() != 0:
        return
    mx, e4m3 = {}, {}   # e4m3: per quantized module, the suffix of its E4M3 buffers
    for name, m in model.named_modules():
        if is_mxfp8(m):
            mx[name] = {"shape": [m.out_features, m.in_features], "planes": m.planes, "layout": m.layout,
                        "rounding": m.rounding, "block": 32, "data": "F8_E4M3", "scale": "E8M0 as U8"}
            e4m3[name] = "_data"
        elif is_nvfp4(m):
            mx[name] = {"format": "nvfp4", "shape": [m.out_features, m.in_features], "planes": m.planes,
                        "layout": m.layout, "block": m.block, "data": "E2M1 x2 as U8 (even index low; col_data "
                        "transposed)", "scale": "F8_E4M3", "amax": "F32 [1]"}
            e4m3[name] = "_scale"
    tensors = {}
    for key, t in model.state_dict().items():
        mod, _, leaf = key.rpartition(".")
        if mod in e4m3 and leaf.endswith(e4m3[mod]):
            t = t.view(torch.float8_e4m3fn)
        tensors[key] = t.detach().to("cpu").contiguous().clone()
    meta = {"format": EXPORT_FORMAT, "mxshard": json.dumps(mx, sort_keys=True)}
    p = os.fspath(path)
    tmp = p + ".tmp"
    st.save_file(tensors, tmp, metadata=meta)
    os.replace(tmp, p)

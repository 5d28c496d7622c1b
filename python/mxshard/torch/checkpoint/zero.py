# SPDX-License-Identifier: MIT
"""Resharding checkpoints of a ShardedOptimizer through torch.distributed.checkpoint (DCP).

    save_checkpoint(path, model, opt, extra={"step": 100}, rng=True)   # every rank
    extra = load_checkpoint(path, model, opt, rng=True)                # every rank, any DP size

The single-file safetensors export and its loader (export_safetensors,
load_safetensors) live in mxshard.torch.checkpoint.export (re-exported by the package);
the DCP plumbing (planners, checksums) in pieces.py, the group side of a
call (argument checks, the every-rank rendezvous, verdicts) in group.py.

Every rank calls both. A call first meets every other rank of the
optimizer's group through the process group's store (group.py): called
on rank 0 only (torch.save's habit) it raises CheckpointError, saying
"every rank", after `timeout` seconds (60 by default) instead of waiting
in DCP for the process group's timeout (gloo: 30 minutes).

Representation. Every saved quantity is ONE global 1-D tensor of DCP,
with a key per item (below), and each rank writes only its own pieces of
it: a piece is one DCP chunk (ChunkStorageMetadata offsets=(o,),
sizes=(n,)) of the global tensor (TensorStorageMetadata size=(numel,)).
The pieces come from small custom planners (pieces.py: _PieceSavePlanner /
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

(The dtypes of the primary keys are zero.byte_buffers.stored_dtype's, one rule
with the export's.) The JSON (with its own sha256): format version, the configuration
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

import hashlib
import json
import os

import torch

from . import group as G
from . import pieces as P
from ..zero import layout as LY
from ..zero.byte_buffers import stored_dtype
from .errors import CheckpointError, CheckpointMismatchError
from .export import EXPORT_FORMAT, export_safetensors, load_safetensors
from ..zero.optim import FORMAT as _OPT_FORMAT
from ..zero.optim import ShardedOptimizer, _plain

__all__ = ["save_checkpoint", "load_checkpoint", "export_safetensors", "load_safetensors", "CheckpointError",
           "CheckpointMismatchError", "FORMAT", "EXPORT_FORMAT"]

FORMAT = "mxshard.torch.checkpoint/1"
_META = "mxshard/meta"
_PLANES = {"mx_row": ("row_data", "row_scale"), "mx_both": ("row_data", "row_scale", "col_data", "col_scale"),
           "nv_row": ("row_data", "row_scale", "amax"), "nv_both": ("row_data", "row_scale", "col_data", "col_scale",
                                                                     "amax")}


# ---- the record (pure) ---------------------------------------------------------------

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
        return ["tensor", P.dtype_name(v.dtype), list(v.shape), v.detach().cpu().reshape(-1)[0].item()]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return ["number", type(v).__name__, [], v]


def _unscalar(x):
    kind, dt, shape, value = x
    if kind == "tensor":
        return torch.tensor(value, dtype=P.dtype_of(dt)).reshape(shape)
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


# ---- every rank, or none -----------------------------------------------------------

def _enter(opt, timeout, where):
    """Opens a checkpoint call: the every-rank rendezvous over a live optimizer's group
    (CheckpointError, on the ranks that came, when some rank does not within `timeout`
    seconds). Returns the timeout argument's own error, if any, for the first verdict (the
    rendezvous then waits DEFAULT_TIMEOUT)."""
    try:
        secs, err = G.check_timeout(timeout, where), None
    except ValueError as e:
        secs, err = G.DEFAULT_TIMEOUT, e
    if isinstance(opt, ShardedOptimizer) and not getattr(opt, "_closed", False):
        G.every_rank(opt.comm, where, secs)
    return err


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
    return t.view(stored_dtype(it.module.format, pn))


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


def save_checkpoint(path, model, opt, *, extra=None, rng=False, timeout=G.DEFAULT_TIMEOUT):
    """Write a DCP checkpoint of `model` and its ShardedOptimizer `opt` to
    the directory `path` (see the module doc). Collective: every rank of the
    optimizer's group calls it; each rank writes only its own pieces.
    `extra`: plain JSON values and tensors (rank 0's are saved); `rng`: save
    every rank's torch RNG states (CPU, and CUDA when initialised).
    `timeout`: seconds (or a timedelta) the ranks wait for each other to
    enter the call; a rank that does not (e.g. called on rank 0 only) makes
    the others raise CheckpointError ("every rank") then; None: no such
    check (DCP's own collectives wait the process group's timeout)."""
    err, payload = _enter(opt, timeout, "save_checkpoint"), None
    try:
        if err is not None:
            raise err
        G.check_call(model, opt, path, "save_checkpoint")
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
            lo, hi = P.even(t.numel(), world, r)
            pieces[key] = (t.numel(), [(lo, t[lo:hi])] if hi > lo else [])
        others = _others(model, opt)
        for k, t in others.items():
            flat = t.detach().reshape(-1)
            lo, hi = P.even(flat.numel(), world, r)
            pieces[f"model/{k}"] = (flat.numel(), [(lo, flat[lo:hi])] if hi > lo else [])
        if r == 0:
            for k, t in xt.items():
                flat = t.reshape(-1)
                pieces[f"extra/{k}"] = (flat.numel(), [(0, flat)] if flat.numel() else [])
        if rng:
            for k, t in _rng_states().items():
                pieces[f"rng/{r}/{k}"] = (t.numel(), [(0, t.reshape(-1))])
        sums = {key: sum(P.checksum(t, off) for off, t in plist) % P.MODULUS for key, (_, plist) in pieces.items()}
        info = {key: [n, P.dtype_name(plist[0][1].dtype)] for key, (n, plist) in pieces.items() if plist}
        extra_empty = {f"extra/{k}": P.dtype_name(t.dtype) for k, t in xt.items() if t.numel() == 0}
        extra_empty.update({f"model/{k}": P.dtype_name(t.dtype) for k, t in others.items() if t.numel() == 0})
        payload = {"sums": sums, "info": info, "groups": groups,
                   "cuda": sum(1 for k in pieces if k.startswith(f"rng/{r}/cuda")),
                   "path": os.path.abspath(os.fspath(path))}
        for key in list(pieces):
            pieces[key] = (pieces[key][0], [(o, t) for o, t in pieces[key][1] if t.numel()])
    except Exception as e:  # noqa: BLE001 - the group learns of it first
        err = e
    got = G.agree(opt, err, payload, "save_checkpoint")
    paths = sorted({p["path"] for p in got})
    if len(paths) > 1:   # (every rank sees the same payloads: every rank raises, before anything is written)
        raise CheckpointError(f"save_checkpoint: give every rank the same path (one checkpoint folder, each rank "
                              f"writes its pieces into it): the ranks gave {len(paths)} paths, e.g. {paths[:2]}")
    # the same on every rank from here (the gathered payloads)
    keys, sums = {}, {}
    for p in got:
        for key, v in p["info"].items():
            keys.setdefault(key, v)
        for key, s in p["sums"].items():
            sums[key] = (sums.get(key, 0) + s) % P.MODULUS
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
        P.save_pieces(path, opt, pieces)
    except BaseException as e:  # noqa: BLE001 - DCP's CheckpointException is a BaseException
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        err = e if isinstance(e, Exception) and not hasattr(e, "failures") else \
            CheckpointError(f"save_checkpoint: writing {os.fspath(path)!r} failed: {P.dcp_error(e)}")
    G.agree(opt, err, None, "save_checkpoint")


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
        if tuple(getattr(m, "size", ())) != (n,) or P.dtype_name(m.properties.dtype) != dt:
            raise CheckpointError(f"load_checkpoint: {k}: DCP metadata {tuple(getattr(m, 'size', ()))} "
                                  f"{getattr(m.properties, 'dtype', None)} differs from the record's ({n},) {dt}")
    dev, world, r = opt.device, opt.world, opt.rank
    dests, parts = {}, {"split": [], "full": []}

    def add(key, off, length, device, split):
        if key not in keys:
            raise CheckpointError(f"load_checkpoint: the checkpoint's record lacks {key!r}")
        n, dt, _ = keys[key]
        t = torch.zeros(length, dtype=P.dtype_of(dt), device=device)
        dests[key] = (n, off, t)
        parts["split" if split else "full"].append(key)
        return t

    for i, name, b, start, length, pos in _owned(opt):
        add(f"master/{name}", start, length, dev, True)
        for k in body["groups"][opt.plan.items[i].group]["tensors"]:
            add(f"state/{name}/{k}", start, length, dev, True)
    for key, t in _replicated(opt).items():
        lo, hi = P.even(t.numel(), world, r)
        if hi > lo:
            add(key, lo, hi - lo, dev, True)
    others = _others(model, opt)
    saved = body.get("model", {})
    for k, t in others.items():
        key = f"model/{k}"
        if key not in keys:
            raise CheckpointMismatchError(f"load_checkpoint: the checkpoint has no {k!r} (model state outside the "
                                          f"optimizer: frozen parameters, buffers)")
        if list(t.shape) != saved.get(k) or P.dtype_name(t.dtype) != keys[key][1]:
            raise CheckpointMismatchError(f"load_checkpoint: {k}: the checkpoint has {tuple(saved.get(k, ()))} "
                                          f"{keys[key][1]}, this model {tuple(t.shape)} {P.dtype_name(t.dtype)}")
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


def load_checkpoint(path, model, opt, *, rng=False, strict=True, timeout=G.DEFAULT_TIMEOUT):
    """Load a save_checkpoint() directory into `model` and its ShardedOptimizer
    `opt`, under any DP size (see the module doc). Collective: every rank
    calls it. Returns the saved `extra` (plain values as JSON round-trips
    them; tensors on the CPU). rng=True restores this rank's RNG states
    (saved at the same DP size). strict=False ignores keys the record does
    not list and, with rng=True, leaves the RNG states alone when the
    checkpoint has none for this DP size (strict: an error). `timeout`:
    as save_checkpoint's (every rank must call it)."""
    # phase 1 (local): arguments, the DCP metadata
    err, md = _enter(opt, timeout, "load_checkpoint"), None
    try:
        if err is not None:
            raise err
        G.check_call(model, opt, path, "load_checkpoint")
        for name, v in (("rng", rng), ("strict", strict)):
            if not isinstance(v, bool):
                raise TypeError(f"load_checkpoint: {name} must be a bool, got {type(v).__name__}")
        md = P.read_metadata(path, _META)
    except Exception as e:  # noqa: BLE001
        err = e
    G.agree(opt, err, None, "load_checkpoint")
    # phase 2: the record (DCP read, errors agreed by DCP and by G.agree)
    err, body = None, None
    try:
        n = int(md.state_dict_metadata[_META].size[0])
        raw = torch.zeros(n, dtype=torch.uint8)
        P.load_pieces(path, opt, {_META: (n, 0, raw)})
        body = _unseal(raw.numpy().tobytes())
        dests, parts = _plan_reads(model, opt, body, md, rng, strict)
    except Exception as e:  # noqa: BLE001
        err = e
    G.agree(opt, err, None, "load_checkpoint")
    # phase 3: every piece of this rank, then the checksums (one all-gather for the verdict)
    err, partial = None, None
    try:
        P.load_pieces(path, opt, dests)
        keys = body["keys"]
        for k in parts["full"]:
            if P.checksum(dests[k][2], 0) != keys[k][2]:
                raise CheckpointError(f"load_checkpoint: {k}: checksum mismatch (a modified or damaged file)")
        partial = {k: P.checksum(dests[k][2], dests[k][1]) for k in parts["split"]}
    except Exception as e:  # noqa: BLE001
        err = e
    got = G.agree(opt, err, partial, "load_checkpoint")
    bad = []
    for k in parts["all_split"]:
        s = sum(p.get(k, 0) for p in got) % P.MODULUS
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
    G.agree(opt, err, None, "load_checkpoint")
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
        G.agree(opt, err, None, "load_checkpoint")
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
        out[k] = dests[key][2] if key in dests else torch.zeros(0, dtype=P.dtype_of(body["keys"][key][1]))
    return out


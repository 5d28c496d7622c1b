# SPDX-License-Identifier: MIT
"""ShardedOptimizer's resharding checkpoints: plain torch.distributed.checkpoint (DCP).

    save_checkpoint(path, model, opt, extra={"step": 100}, rng=True)   # every rank
    extra = load_checkpoint(path, model, opt, rng=True)                # every rank, any world size

Keys (one DCP tensor each; the masters and the inner state of the master's shape are the
DTensor Shard(0) of opt.state_dict(), so DCP reshards them; the rest is replicated):

    master/<item>           fp32, the item's shape (0-d: [1])
    state/<item>/<k>        inner state (AdamW exp_avg, exp_avg_sq, step, ...)
    model/<name>            the model's state outside the optimizer (buffers, frozen parameters)
    extra/<k>               the tensors of `extra` (rank 0's)
    rng/<rank>/cpu|cuda<i>  every rank's RNG states (rng=True)
    mxshard/meta            uint8: the record (JSON sealed by its sha256): format, the configuration
                            (items: name, kind, shape, format:layout:rounding|block, group; groups,
                            inner class, round_through), world, steps, param-group options, the
                            plain values of `extra`, per key [size, dtype, checksum], and a checksum
                            of every byte buffer the model computes with (primary/<item>/<buffer>,
                            dense/<item>)

What DCP guarantees, and what is checked here (DCP gives no such guarantee):
  - resharding and the sizes of what is read: DCP (its planners; a size differing from the
    one asked for raises);
  - every rank calls (group.every_rank: within `timeout`, else CheckpointError "every rank"),
    every rank raises when one fails (group.agree), nothing touched until everything matched:
    DCP reads into staging tensors, opt.load_state_dict follows the verdicts;
  - the configuration (CheckpointMismatchError naming the first differing item), the keys the
    record lists (present in DCP's metadata), the data (a position-weighted checksum per key,
    export.checksum: sums of disjoint pieces add up, so they hold at any world size; DCP's
    files carry none), the record itself (sha256);
  - the model's bytes: the primaries are not saved (the writeback rebuilds them from the
    masters), their checksums are: after the load the rebuilt ones must match, else the
    previous state is restored and CheckpointMismatchError raised.
Not compared (free to change): world size, bucket_size, grad_reduce, max_grad_norm; the
param groups' options (lr, ...) are restored from the checkpoint.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import warnings

import torch

from . import group as G
from .errors import CheckpointError, CheckpointMismatchError
from .export import MODULUS, _param_linear_buffers, checksum
from ..zero.items import plain

__all__ = ["FORMAT", "save_checkpoint", "load_checkpoint"]

FORMAT = "mxshard.checkpoint/2"
_META = "mxshard/meta"


def _dt(dt):
    return str(dt).replace("torch.", "")


def _config(opt):
    """What must agree between a checkpoint and the optimizer it is loaded into."""
    items = []
    for it in opt._items:
        s = opt._metas[it.name].spec if it.module is not None else None
        dt = _dt(it.dtype) if s is None else \
            f"{s.format}:{s.layout}:{s.rounding if s.format == 'mxfp8' else s.block}"
        items.append([it.name, it.kind, list(it.shape), dt, int(it.group)])
    return {"items": items, "groups": len(opt.inner.param_groups), "inner": type(opt.inner).__name__,
            "round_through": opt.round_through}


def _difference(saved, mine):
    a, b = saved.get("items", []), mine["items"]
    for i in range(max(len(a), len(b))):
        x, y = (a[i] if i < len(a) else None), (b[i] if i < len(b) else None)
        if x != y:
            txt = [f"{v[0]} ({v[1]} {tuple(v[2])} {v[3]} group {v[4]})" if v else "<no item>" for v in (x, y)]
            return f"item {i}: the checkpoint has {txt[0]}, this model has {txt[1]}"
    for k, what in (("groups", "param groups"), ("inner", "inner optimizer"), ("round_through", "round_through")):
        if saved.get(k) != mine[k]:
            return f"{what}: the checkpoint has {saved.get(k)!r}, this optimizer has {mine[k]!r}"
    return None


def _seal(body):
    text = json.dumps(body, sort_keys=True)
    raw = json.dumps({"sha256": hashlib.sha256(text.encode()).hexdigest(), "body": text}).encode()
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


def _unseal(raw):
    try:
        outer = json.loads(raw.numpy().tobytes().decode())
        ok = hashlib.sha256(outer["body"].encode()).hexdigest() == outer["sha256"]
        body = json.loads(outer["body"])
    except Exception as e:  # noqa: BLE001
        raise CheckpointError(f"load_checkpoint: give an undamaged checkpoint: its {_META} record is damaged "
                              f"({type(e).__name__}: {e})") from None
    if not ok:
        raise CheckpointError(f"load_checkpoint: give an undamaged checkpoint: its {_META} record is damaged "
                              f"(sha256 mismatch)")
    if body.get("format") != FORMAT:
        raise CheckpointError(f"load_checkpoint: give a {FORMAT} checkpoint (this one: {body.get('format')!r})")
    return body


# ---- what a rank holds ---------------------------------------------------------------

def _sharded(opt):
    """{key: (item, local [rows, ...] tensor, element offset of this rank's rows)}: the masters and
    the inner state of the master's shape; plus {key: tensor} of the replicated inner state and
    {key: value} of plain inner state."""
    sh, rep, scal = {}, {}, {}
    for v, b, pos in opt._views:
        it = opt._geoms[b].items[pos]
        off = opt._geoms[b].rows_of(pos, opt.rank)[0] * it.cols
        sh[f"master/{it.name}"] = (it, v, off)
        for k, x in opt.inner.state.get(v, {}).items():
            if isinstance(x, torch.Tensor) and x.shape == v.shape and x.dim():
                sh[f"state/{it.name}/{k}"] = (it, x, off)
            elif isinstance(x, torch.Tensor):
                rep[f"state/{it.name}/{k}"] = x
            else:
                scal[f"{it.name}/{k}"] = x
    return sh, rep, scal


def _others(model, opt):
    """The model's state the optimizer does not hold (buffers, frozen parameters), by name."""
    trained = {it.name for it in opt._items}
    return {k: v.detach() for k, v in model.state_dict(keep_vars=True).items()
            if k not in trained and isinstance(v, torch.Tensor)}


def _model_bytes(opt):
    """{key: tensor} of every byte buffer the model computes with (replicated on every rank)."""
    out = {}
    for it in opt._items:
        if it.module is None:
            out[f"dense/{it.name}"] = it.param.detach()
        else:
            for b, t in _param_linear_buffers(it.module, None).items():
                out[f"primary/{it.name}/{b}"] = t
    return out


def _rng_states():
    out = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out.update({f"cuda{i}": s for i, s in enumerate(torch.cuda.get_rng_state_all())})
    return out


def _check_extra(extra):
    if extra is None:
        return {}, {}
    if not isinstance(extra, dict):
        raise TypeError(f"save_checkpoint: pass extra as a dict, got {type(extra).__name__}")
    out, tensors = {}, {}
    for k, v in extra.items():
        if not isinstance(k, str) or not k or "/" in k:
            raise ValueError(f"save_checkpoint: name extra's entries with non-empty str without '/', got {k!r}")
        if isinstance(v, torch.Tensor):
            if v.is_sparse or v.dtype.is_complex:
                raise ValueError(f"save_checkpoint: pass dense real tensors in extra: extra[{k!r}] is not")
            tensors[k] = v.detach()
            continue
        try:
            json.dumps(v)
        except (TypeError, ValueError) as e:
            raise TypeError(f"save_checkpoint: pass a tensor or a plain JSON value (numbers, str, bool, None, "
                            f"lists, dicts) as extra[{k!r}]: {e}") from None
        out[k] = v
    return out, tensors


def _dcp(opt):
    import torch.distributed.checkpoint as dcp
    return dcp, ({"process_group": opt.comm.group} if opt.comm.active else {"no_dist": True})


@contextlib.contextmanager
def _quiet_dcp():
    """The scope of a DCP call: its "torch.distributed is disabled" warning (a world of one reads
    and writes with no_dist, as meant) silenced there only, not process-wide."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        yield


def _dcp_error(e):
    fails = getattr(e, "failures", None)
    if isinstance(fails, dict) and fails:
        return "; ".join(f"rank {r}: {type(v[0] if isinstance(v, tuple) else v).__name__}: "
                         f"{v[0] if isinstance(v, tuple) else v}" for r, v in sorted(fails.items()))
    return f"{type(e).__name__}: {e}"


def _enter(opt, timeout, where):
    """The every-rank rendezvous (group.every_rank); returns the timeout argument's own error."""
    try:
        secs, err = G.check_timeout(timeout, where), None
    except ValueError as e:
        secs, err = G.DEFAULT_TIMEOUT, e
    from ..zero.optim import ShardedOptimizer
    if isinstance(opt, ShardedOptimizer) and not opt._closed:
        G.every_rank(opt.comm, where, secs)
    return err


def _sum(t, off=0):
    return checksum(t, off)


# ---- save -------------------------------------------------------------------------

def save_checkpoint(path, model, opt, *, extra=None, rng=False, timeout=G.DEFAULT_TIMEOUT):
    """Writes `model` and its ShardedOptimizer `opt` to the DCP directory `path` (the module doc).
    Collective: every rank of the optimizer's group calls it. `extra`: plain JSON values and
    tensors (rank 0's are saved); `rng`: every rank's torch RNG states. `timeout`: seconds (or a
    timedelta) the ranks wait for each other to enter the call (None: no such wait)."""
    err, payload = _enter(opt, timeout, "save_checkpoint"), None
    try:
        if err is not None:
            raise err
        G.check_call(model, opt, path, "save_checkpoint")
        if not isinstance(rng, bool):
            raise TypeError(f"save_checkpoint: pass rng as a bool, got {type(rng).__name__}")
        plain_extra, xt = _check_extra(extra)
        sh, rep, scal = _sharded(opt)
        state = {k: opt._dtensor(t, it) for k, (it, t, _) in sh.items()}
        whole = dict(rep)
        whole.update({f"model/{k}": t for k, t in _others(model, opt).items()})
        if opt.rank == 0:
            whole.update({f"extra/{k}": t for k, t in xt.items()})
        if rng:
            whole.update({f"rng/{opt.rank}/{k}": t for k, t in _rng_states().items()})
        state.update(whole)
        sums = {k: _sum(t, off) for k, (it, t, off) in sh.items()}
        if opt.rank == 0 or rng:
            sums.update({k: _sum(t) for k, t in whole.items() if opt.rank == 0 or k.startswith("rng/")})
        info = {k: [list(getattr(t, "shape", ())), _dt(t.dtype)] for k, t in state.items()}
        for k, (it, t, _) in sh.items():
            info[k][0] = [it.rows] + list(it.shape[1:])
        prim = {k: _sum(t) for k, t in _model_bytes(opt).items()} if opt.rank == 0 else None
        payload = {"sums": sums, "info": info, "path": os.path.abspath(os.fspath(path)), "prim": prim,
                   "cuda": sum(k.startswith("rng/") and "/cuda" in k for k in state)}
    except Exception as e:  # noqa: BLE001 - the group learns of it first
        err = e
    got = G.agree(opt, err, payload, "save_checkpoint")
    paths = sorted({p["path"] for p in got})
    if len(paths) > 1:
        raise CheckpointError(f"save_checkpoint: give every rank the same path (one checkpoint folder): the ranks "
                              f"gave {len(paths)}, e.g. {paths[:2]}")
    keys = {}
    for p in got:
        for k, (shape, dt) in p["info"].items():
            n = keys.setdefault(k, [shape, dt, 0])
            n[2] = (n[2] + p["sums"].get(k, 0)) % MODULUS
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items() if k != "params" and plain(v)}
              for g in opt.inner.param_groups]
    body = {"format": FORMAT, "torch": torch.__version__, "config": _config(opt), "world": opt.world,
            "steps": int(opt.steps), "keys": keys, "groups": groups, "scalars": scal, "model_bytes": got[0]["prim"],
            "extra": plain_extra, "rng": {"world": opt.world, "cuda": [p["cuda"] for p in got]} if rng else None}
    if opt.rank == 0:
        state[_META] = _seal(body)
    err = None
    try:
        dcp, kw = _dcp(opt)
        with _quiet_dcp():
            dcp.save(state, storage_writer=dcp.FileSystemWriter(os.fspath(path)), **kw)
    except BaseException as e:  # noqa: BLE001 - DCP's CheckpointException is a BaseException
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        err = CheckpointError(f"save_checkpoint: give a path every rank can write: writing {os.fspath(path)!r} "
                              f"failed: {_dcp_error(e)}")
    G.agree(opt, err, None, "save_checkpoint")


# ---- load -------------------------------------------------------------------------

def _read(opt, path, state):
    dcp, kw = _dcp(opt)
    try:
        with _quiet_dcp():
            dcp.load(state, storage_reader=dcp.FileSystemReader(os.fspath(path)), **kw)
    except BaseException as e:  # noqa: BLE001
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        raise CheckpointError(f"load_checkpoint: give a complete checkpoint: reading {os.fspath(path)!r} failed "
                              f"(a missing, truncated or damaged file?): {_dcp_error(e)}") from None


def _metadata(path):
    import torch.distributed.checkpoint as dcp
    p = os.fspath(path)
    if not os.path.isdir(p):
        raise CheckpointError(f"load_checkpoint: give a checkpoint directory: {p!r} is not a directory")
    if not os.path.isfile(os.path.join(p, ".metadata")):
        raise CheckpointError(f"load_checkpoint: give a save_checkpoint directory: {p!r} holds no DCP checkpoint "
                              f"(no .metadata file)")
    try:
        md = dcp.FileSystemReader(p).read_metadata()
    except Exception as e:  # noqa: BLE001
        raise CheckpointError(f"load_checkpoint: give an undamaged checkpoint: the DCP metadata of {p!r} is "
                              f"unreadable ({type(e).__name__}: {e})") from None
    if _META not in md.state_dict_metadata:
        raise CheckpointError(f"load_checkpoint: give a save_checkpoint directory: {p!r} has no {_META} record")
    return md


def _staging(model, opt, body, md, rng, strict):
    """The tensors this rank reads: {key: tensor for DCP}, {key: (local tensor, offset)} to
    checksum by pieces, {key: tensor} to checksum whole."""
    diff = _difference(body.get("config", {}), _config(opt))
    if diff:
        raise CheckpointMismatchError(f"load_checkpoint: load a checkpoint of this model and configuration: {diff}")
    keys, have = body["keys"], set(md.state_dict_metadata)
    missing = sorted(set(keys) - have)
    if missing:
        raise CheckpointError(f"load_checkpoint: give a complete checkpoint: it lacks {len(missing)} of its keys, "
                              f"e.g. {missing[0]!r}")
    unexpected = sorted(have - set(keys) - {_META})
    if unexpected and strict:
        raise CheckpointError(f"load_checkpoint: give an unmodified checkpoint (or strict=False): it has keys its "
                              f"record does not list, e.g. {unexpected[0]!r}")

    def empty(k, device):
        shape, dt = keys[k][:2]
        return torch.empty(shape, dtype=getattr(torch, dt), device=device)
    state, pieces, whole = {}, {}, {}
    for v, b, pos in opt._views:
        it = opt._geoms[b].items[pos]
        off = opt._geoms[b].rows_of(pos, opt.rank)[0] * it.cols
        pre = f"state/{it.name}/"
        for k in [f"master/{it.name}"] + [k for k in keys if k.startswith(pre) and "/" not in k[len(pre):]]:
            if keys[k][0] == [it.rows] + list(it.shape[1:]):
                local = torch.empty(v.shape, dtype=getattr(torch, keys[k][1]), device=v.device)
                state[k], pieces[k] = opt._dtensor(local, it), (local, off)
            else:
                state[k] = whole[k] = empty(k, v.device)
    others = _others(model, opt)
    for k, t in others.items():
        key = f"model/{k}"
        if key not in keys:
            raise CheckpointMismatchError(f"load_checkpoint: load a checkpoint of this model: it has no {k!r} "
                                          f"(model state outside the optimizer: frozen parameters, buffers)")
        if keys[key][:2] != [list(t.shape), _dt(t.dtype)]:
            raise CheckpointMismatchError(f"load_checkpoint: load a checkpoint of this model: {k}: the checkpoint "
                                          f"has {tuple(keys[key][0])} {keys[key][1]}, this model {tuple(t.shape)} "
                                          f"{_dt(t.dtype)}")
        state[key] = whole[key] = empty(key, t.device)
    more = sorted(k for k in keys if k.startswith("model/") and k[6:] not in others)
    if more and strict:
        raise CheckpointMismatchError(f"load_checkpoint: load a checkpoint of this model (or strict=False): the "
                                      f"checkpoint has model state this model lacks, e.g. {more[0][6:]!r}")
    for k in keys:
        if k.startswith("extra/") or (rng and k.startswith(f"rng/{opt.rank}/")):
            state[k] = whole[k] = empty(k, "cpu")
    if rng:
        saved = body.get("rng")
        why = "it was saved without RNG states (rng=False)" if saved is None else \
            f"its RNG states are of {saved['world']} ranks, this group has {opt.world}" \
            if saved["world"] != opt.world else None
        if why and strict:
            raise CheckpointError(f"load_checkpoint: pass rng=False (or strict=False: the RNG states stay as they "
                                  f"are): rng=True, but {why}")
        if why:
            for k in [k for k in state if k.startswith("rng/")]:
                del state[k], whole[k]
    return state, pieces, whole


def _optim_state(opt, body, state):
    """opt.load_state_dict()'s form from the staged tensors."""
    names = [it.name for it in opt._items]
    st = {}
    for n in names:
        pre = f"state/{n}/"
        d = {k[len(pre):]: t for k, t in state.items() if k.startswith(pre)}
        d.update({k[len(n) + 1:]: v for k, v in body.get("scalars", {}).items() if k.startswith(n + "/")})
        if d:
            st[n] = d
    groups = []
    for g, cur in zip(body["groups"], opt.inner.param_groups):
        new = {k: (tuple(v) if isinstance(cur.get(k), tuple) and isinstance(v, list) else v) for k, v in g.items()}
        items = {id(v): opt._geoms[b].items[pos].name for v, b, pos in opt._views}
        groups.append(dict(cur, **new, params=[items[id(p)] for p in cur["params"]]))
    from ..zero.optim import FORMAT as OPT_FORMAT
    return {"format": OPT_FORMAT, "step": body["steps"], "masters": {n: state[f"master/{n}"] for n in names},
            "state": st, "param_groups": groups}


def load_checkpoint(path, model, opt, *, rng=False, strict=True, timeout=G.DEFAULT_TIMEOUT):
    """Loads a save_checkpoint() directory into `model` and its ShardedOptimizer `opt`, at any
    world size (the module doc); returns the saved `extra` (tensors on the CPU). Collective.
    rng=True restores this rank's RNG states (saved at the same world size); strict=False
    ignores keys the record does not list, model state this model lacks, and missing RNG
    states. `timeout`: as save_checkpoint's. On any error every rank raises, nothing changed."""
    err, md = _enter(opt, timeout, "load_checkpoint"), None
    try:
        if err is not None:
            raise err
        G.check_call(model, opt, path, "load_checkpoint")
        for name, v in (("rng", rng), ("strict", strict)):
            if not isinstance(v, bool):
                raise TypeError(f"load_checkpoint: pass {name} as a bool, got {type(v).__name__}")
        md = _metadata(path)
    except Exception as e:  # noqa: BLE001
        err = e
    G.agree(opt, err, None, "load_checkpoint")
    err, body = None, None
    try:   # the record, the checks, the staging (DCP's read is collective: its errors reach every rank)
        rec = {_META: torch.zeros(md.state_dict_metadata[_META].size, dtype=torch.uint8)}
        _read(opt, path, rec)
        body = _unseal(rec[_META])
        state, pieces, whole = _staging(model, opt, body, md, rng, strict)
    except Exception as e:  # noqa: BLE001
        err = e
    G.agree(opt, err, None, "load_checkpoint")
    err, part = None, None
    try:
        _read(opt, path, state)
        keys = body["keys"]
        bad = [k for k, t in whole.items() if _sum(t) != keys[k][2]]
        if bad:
            raise CheckpointError(f"load_checkpoint: give an undamaged checkpoint: {bad[0]}: checksum mismatch (a "
                                  f"modified or damaged file)")
        part = {k: _sum(t, off) for k, (t, off) in pieces.items()}
    except Exception as e:  # noqa: BLE001
        err = e
    got = G.agree(opt, err, part, "load_checkpoint")
    bad = [k for k in pieces if sum(p.get(k, 0) for p in got) % MODULUS != body["keys"][k][2]]
    if bad:
        raise CheckpointError(f"load_checkpoint: give an undamaged checkpoint: checksum mismatch in {len(bad)} "
                              f"key(s), e.g. {bad[0]!r} (a modified or damaged file)")
    backup = _backup(opt)
    opt.load_state_dict(_optim_state(opt, body, state))   # collective: a failure raises on every rank
    err = None
    try:
        saved = body.get("model_bytes") or {}
        for k, t in _model_bytes(opt).items():
            if _sum(t) != saved.get(k):
                raise CheckpointMismatchError(
                    f"load_checkpoint: load a checkpoint whose primaries are the writeback of its masters: {k}: the "
                    f"bytes rebuilt from the loaded masters differ from the saved ones (another library version, or "
                    f"a modified checkpoint); the previous state was restored")
    except Exception as e:  # noqa: BLE001
        err = e
    try:
        G.agree(opt, err, None, "load_checkpoint")
    except Exception:
        opt.load_state_dict(backup)
        raise
    del backup
    with torch.no_grad():
        for k, t in _others(model, opt).items():
            t.copy_(state[f"model/{k}"])
    for k, t in state.items():
        if k.startswith(f"rng/{opt.rank}/"):
            what = k.split("/")[2]
            if what == "cpu":
                torch.set_rng_state(t)
            elif torch.cuda.is_available() and int(what[4:]) < torch.cuda.device_count():
                torch.cuda.set_rng_state(t, device=int(what[4:]))
    out = dict(body["extra"])
    out.update({k[6:]: t for k, t in state.items() if k.startswith("extra/")})
    return out


def _backup(opt):
    """opt.state_dict() with this rank's tensors copied (restored when a loaded checkpoint is refused)."""
    sd = opt.state_dict()
    loc = lambda t: t.to_local().clone() if hasattr(t, "to_local") else t.clone() if isinstance(t, torch.Tensor) \
        else t   # noqa: E731
    sd["masters"] = {k: loc(t) for k, t in sd["masters"].items()}
    sd["state"] = {n: {k: loc(t) for k, t in st.items()} for n, st in sd["state"].items()}
    return sd

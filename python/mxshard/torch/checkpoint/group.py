# SPDX-License-Identifier: MIT
"""A checkpoint call is a call of the whole group: the checks of its
arguments, the every-rank rendezvous that opens it, and the verdicts that
every rank reaches together. Used by mxshard.torch.checkpoint.

Every rank, or none (the rendezvous). save_checkpoint and load_checkpoint
are collective; called on rank 0 alone (torch.save's habit) DCP would wait
in its first collective for the process group's timeout (gloo: 30 min).
So each call first meets the other ranks through the default process
group's key-value store, with a bounded wait:

    g = <prefix>/gen                       the call's generation (0, 1, ...)
    n = add(<prefix>/g/count, 1)           arrival; append(<prefix>/g/ranks, "r,")
    n == world   -> gen = g+1, verdict(g) := "go"       (compare_set: the first verdict wins)
    no verdict within `timeout` -> verdict(g) := "abort" -> every waiting rank raises
    a rank that finds "abort" on arrival came late to a failed call: it retries in g+1

<prefix> is mxshard/ckpt/<hash of the group's global ranks>. A rank that
never calls is named in the error of the ranks that did, which all raise
CheckpointError within `timeout` seconds; the next call of every rank meets
in a fresh generation. The last arriver of a generation deletes the keys of
the one before (every rank has left it)."""
from __future__ import annotations

import datetime
import hashlib
import os
import time

from torch import nn

from ... import _lib as L
from .errors import CheckpointError, CheckpointMismatchError
from ..zero.optim import ShardedOptimizer

DEFAULT_TIMEOUT = 60.0   # seconds the first rank of a checkpoint call waits for the last


# ---- arguments --------------------------------------------------------------------

def check_timeout(timeout, name):
    """`timeout` (seconds > 0, a datetime.timedelta, or None: no rendezvous) as seconds or None."""
    if timeout is None:
        return None
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"{name}: timeout must be a number of seconds > 0, a datetime.timedelta or None, "
                         f"got {timeout!r}")
    return float(timeout)


def check_call(model, opt, path, name):
    """The arguments every checkpoint call takes (raises naming the first bad one)."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{name}: path must be a str or os.PathLike, got {type(path).__name__}")
    if not isinstance(opt, ShardedOptimizer):
        raise TypeError(f"{name}: pass the ShardedOptimizer that trains the model (build one on it first, at any "
                        f"world size, also without a process group: a world of one); got {type(opt).__name__}. "
                        f"Models trained with torch.optim or FSDP2 use torch.distributed.checkpoint "
                        f"(get_state_dict / set_state_dict); opt must be a ShardedOptimizer")
    if getattr(opt, "_closed", False):
        raise ValueError(f"{name}: build a new ShardedOptimizer on the model: this one was closed")
    if not isinstance(model, nn.Module):
        raise TypeError(f"{name}: model must be an nn.Module, got {type(model).__name__}")
    mods = {id(m) for m in model.modules()}
    prms = {id(p) for p in model.parameters()}
    for it in opt._items:
        ok = id(it.module) in mods if it.module is not None else id(it.param) in prms
        if not ok:
            raise ValueError(f"{name}: {it.name} of the optimizer is not part of this model "
                             f"(pass the model the optimizer was built on)")


# ---- every rank, or none ------------------------------------------------------------

def _store(comm):
    """The default process group's store, or None (no store: no rendezvous)."""
    try:
        return comm.dist.distributed_c10d._get_default_store()
    except Exception:  # noqa: BLE001 - a torch without it, or a group without a store
        return None


def _prefix(comm):
    ranks = comm.dist.get_process_group_ranks(comm.group)
    return "mxshard/ckpt/" + hashlib.sha256(",".join(map(str, ranks)).encode()).hexdigest()[:16]


def _text(v):
    return v.decode() if isinstance(v, (bytes, bytearray)) else str(v)


def _next_gen(store, prefix, g):
    """Moves the generation on from g (once, whoever comes first)."""
    store.compare_set(f"{prefix}/gen", str(g), str(g + 1))


def _verdict(store, key, deadline):
    """The verdict at `key` ('go' | 'abort'), or None when none came by `deadline`
    (polls with a growing pause: no store.wait, whose timeouts log C++ warnings)."""
    pause = 0.002
    while True:
        if store.check([key]):
            return _text(store.get(key))
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        time.sleep(min(pause, left))
        pause = min(pause * 1.5, 0.05)


def _arrived(store, prefix, g):
    return sorted({int(x) for x in _text(store.get(f"{prefix}/{g}/ranks")).split(",") if x})


def _missing_error(where, comm, arrived, timeout):
    absent = [r for r in range(comm.world) if r not in arrived]
    return CheckpointError(
        f"{where} must be called on every rank of the group: rank(s) {arrived} of {comm.world} called it, "
        f"rank(s) {absent} did not within {timeout:g} s. A checkpoint is collective (every rank writes or reads its "
        f"own pieces): call {where} on every rank, not under `if rank == 0` (the torch.save habit); a rank that "
        f"is only slower to get here (e.g. rank 0 evaluates first) needs a larger timeout=")


def every_rank(comm, where, timeout):
    """Returns once every rank of comm's group has entered this call (the module doc);
    CheckpointError within `timeout` seconds when some rank does not. No-op for a world
    of one, timeout=None, or no store."""
    if not comm.active or timeout is None:
        return
    store = _store(comm)
    if store is None:
        return
    prefix = _prefix(comm)
    deadline = time.monotonic() + timeout
    while True:
        g = int(_text(store.compare_set(f"{prefix}/gen", "", "0")))
        vkey = f"{prefix}/{g}/verdict"
        n = store.add(f"{prefix}/{g}/count", 1)
        store.append(f"{prefix}/{g}/ranks", f"{comm.rank},")
        if n >= comm.world:   # the last to arrive (more: late ones of an aborted generation)
            _next_gen(store, prefix, g)
            verdict = _text(store.compare_set(vkey, "", "go"))
            if verdict == "go":
                for k in ("count", "ranks", "verdict"):
                    store.delete_key(f"{prefix}/{g - 1}/{k}")
                return
        elif store.check([vkey]) and _text(store.get(vkey)) == "abort":
            verdict = "abort"
        else:
            verdict = _verdict(store, vkey, deadline)
            if verdict is None:   # nobody decided: this rank gives up, unless the last one just came
                verdict = _text(store.compare_set(vkey, "", "abort"))
                if verdict == "go":
                    return
                _next_gen(store, prefix, g)
                raise _missing_error(where, comm, _arrived(store, prefix, g), timeout)
            if verdict == "go":
                return
            raise _missing_error(where, comm, _arrived(store, prefix, g), timeout)
        # came late to a generation another rank had given up on: the next one, in the time left
        _next_gen(store, prefix, g)
        if time.monotonic() >= deadline:
            raise _missing_error(where, comm, [comm.rank], timeout)


# ---- verdicts -----------------------------------------------------------------------

def agree(opt, err, payload=None, where="checkpoint"):
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

# SPDX-License-Identifier: MIT
"""Every collective mxshard issues, in one place (torch.distributed).

    agree(ok, key, ...)        ONE all_gather of [ok, *key, *extra] (int64): a rank that failed
                               -> the others raise RemoteError; keys that differ -> every rank
                               raises PlanMismatchError naming the ranks. Used by the bucket
                               writebacks' group setup, FSDP2's refresh agreement and
                               ShardedOptimizer's construction.
    all_gather_i64(vals, ...)  rows of small int64 vectors (one all_gather)
    all_gather_object(obj)     Python objects (checkpoint phases, plan descriptions)
    all_reduce_max(t, ...)     the ONE packed MAX reduction of a writeback / refresh (in place)
    all_reduce_sum(t, ...)     ShardedOptimizer's norm / gradient all-reduce (in place)
    all_gather_bytes(...)      byte all-gathers: into one tensor, or (gloo) into a list of views
    reduce_scatter(...)        ShardedOptimizer's gradient reduction (async handle)

Each call takes `counts` (a collections.Counter, or None) and the `kind` it
is counted under, so every path's collectives are counted the same way, and
`group` (None: the default group). A status that must reach every rank
travels inside these collectives (agree's ok entry, the status byte of a
packed MAX buffer): a rank-local error never leaves the others waiting in a
collective the failing rank skipped.
"""
from __future__ import annotations

from . import _arrays as A
from . import _lib as L

__all__ = ["dist", "initialized", "world_rank", "control_device", "agree", "all_gather_i64", "all_gather_object",
           "all_reduce_max", "all_reduce_sum", "all_gather_bytes", "reduce_scatter"]


def dist():
    """torch.distributed when torch is in use (imported: a torch caller), else None (numpy-only
    use: no import attempted, so a call costs nothing where torch is absent)."""
    if A.torch_mod() is None:
        return None
    import torch.distributed as d
    return d if d.is_available() else None


def initialized():
    d = dist()
    return d is not None and d.is_initialized()


def world_rank(group=None):
    d = dist()
    return d.get_world_size(group), d.get_rank(group)


def control_device(group=None, data_device=None):
    """Where small control tensors of `group` live: NCCL needs the current CUDA device (or the
    data's), every other backend takes CPU tensors."""
    import torch
    if "nccl" not in str(dist().get_backend(group)):
        return torch.device("cpu")
    if data_device is not None and torch.device(data_device).type == "cuda":
        return torch.device(data_device)
    return torch.device("cuda", torch.cuda.current_device())


def _count(counts, kind):
    if counts is not None:
        counts[kind] += 1


def all_gather_i64(vals, group=None, device=None, counts=None, kind="all_gather_setup"):
    """Every rank's int64 vector `vals` (the same length on every rank): a list of lists."""
    import torch
    d = dist()
    world, _ = world_rank(group)
    x = torch.tensor(vals, dtype=torch.int64, device=device if device is not None else control_device(group))
    out = [torch.empty_like(x) for _ in range(world)]
    d.all_gather(out, x, group=group)
    _count(counts, kind)
    return [o.cpu().tolist() for o in out]


def all_gather_object(obj, group=None, counts=None, kind="all_gather_object"):
    d = dist()
    world, _ = world_rank(group)
    out = [None] * world
    d.all_gather_object(out, obj, group=group)
    _count(counts, kind)
    return out


def agree(ok, key, what, group=None, device=None, extra=(), counts=None, kind="all_gather_setup",
          remote=None, mismatch=None):
    """ONE all_gather of [ok, *key, *extra]. A rank that failed passes ok=False, gets None back
    and then raises its own error; every other rank raises RemoteError (`remote(ranks)`: the
    message). When every rank is ok but the keys differ, every rank raises PlanMismatchError
    (`mismatch(ranks that differ from rank 0)`: the message). Otherwise returns every rank's
    `extra` (a list of lists)."""
    key, extra = [int(v) for v in key], [int(v) for v in extra]
    rows = all_gather_i64([1 if ok else 0] + key + extra, group, device, counts, kind)
    if not ok:
        return None
    if not all(r[0] for r in rows):
        bad = [i for i, r in enumerate(rows) if not r[0]]
        raise _with_ranks(L.remote_error(remote(bad) if remote else f"{what} (ranks {bad} failed)"), bad)
    n = 1 + len(key)
    if any(r[1:n] != rows[0][1:n] for r in rows):
        bad = [i for i, r in enumerate(rows) if r[1:n] != rows[0][1:n]]
        raise _with_ranks(L.status_error(L.status_code("MXS_ERR_PLAN_MISMATCH"),
                                         mismatch(bad) if mismatch else f"{what} (ranks {bad} differ from rank 0)"),
                          bad)
    return [r[n:] for r in rows]


def _with_ranks(exc, ranks):
    """exc with .ranks (which ranks failed or differ). A helper, so that no frame that raises it
    holds it in a local: a frame <-> traceback cycle would keep the callers' objects (and their
    process group) alive until the next collection."""
    exc.ranks = ranks
    return exc


def all_reduce_max(t, group=None, counts=None, kind="all_reduce_max"):
    d = dist()
    d.all_reduce(t, op=d.ReduceOp.MAX, group=group)
    _count(counts, kind)


def all_reduce_sum(t, group=None, counts=None, kind="all_reduce", async_op=False):
    d = dist()
    work = d.all_reduce(t, op=d.ReduceOp.SUM, group=group, async_op=async_op)
    _count(counts, kind)
    return work


def all_gather_bytes(out, inp, group=None, chunks=None, counts=None, kind="all_gather"):
    """inp from every rank into `out` (world * inp.numel()); with `chunks` (gloo: the list
    all_gather every torch version has) into those views of out instead."""
    d = dist()
    if chunks is not None:
        d.all_gather(chunks, inp, group=group)
    else:
        d.all_gather_into_tensor(out, inp, group=group)
    _count(counts, kind)


def reduce_scatter(out, inp, group=None, counts=None, kind="reduce_scatter", async_op=True):
    d = dist()
    work = d.reduce_scatter_tensor(out, inp, op=d.ReduceOp.SUM, group=group, async_op=async_op)
    _count(counts, kind)
    return work

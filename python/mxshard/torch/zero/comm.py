# SPDX-License-Identifier: MIT
"""The collectives of ShardedOptimizer over its group (through
mxshard.collectives, where every collective of mxshard is issued), counted
by kind, with the gloo fallbacks:

- gradient reduction: ``reduce_scatter_tensor`` (NCCL and any backend that
  has it) into a separate shard; gloo has none, so the whole bucket is
  ``all_reduce``-d in place and each rank reads its slice (same sums, dp
  times the traffic);
- all-gather: ``all_gather_into_tensor``; on gloo the list ``all_gather``
  into views of the output (every torch version has it).

A world of one (torch.distributed not initialised, or a group of one rank)
issues no collectives and counts none.
"""
from __future__ import annotations

from collections import Counter

import torch

from ... import collectives as C


def _dist():
    import torch.distributed as dist
    return dist if dist.is_available() else None


class Done:
    """A finished reduction (world of one): wait() does nothing."""

    def wait(self):
        return True


class Comm:
    """One process group's collectives. `counts` is the Counter the calls are
    counted in (the caller may swap it, e.g. setup vs per-step counts)."""

    def __init__(self, group=None):
        dist = _dist()
        live = dist is not None and dist.is_initialized()
        if group is not None and not live:
            raise ValueError("process_group given but torch.distributed is not initialised")
        self.dist = dist if live else None
        self.group = (group if group is not None else dist.group.WORLD) if live else None
        self.world = dist.get_world_size(self.group) if live else 1
        self.rank = dist.get_rank(self.group) if live else 0
        self.backend = str(dist.get_backend(self.group)) if live else None
        self.gloo = self.backend is not None and "gloo" in self.backend
        self.active = live and self.world > 1
        self.counts = Counter()

    # ---- properties ---------------------------------------------------------

    @property
    def has_reduce_scatter(self) -> bool:
        """False on gloo: gradients are all-reduced in place, then sliced."""
        return self.active and not self.gloo

    def small_device(self, data_device=None):
        """Where small control tensors live: for NCCL the data's CUDA device
        (or the current one), else the CPU."""
        if self.backend is not None and "nccl" in self.backend:
            if data_device is not None and torch.device(data_device).type == "cuda":
                return torch.device(data_device)
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def count(self, kind, n=1):
        if self.active and n:
            self.counts[kind] += n

    # ---- collectives --------------------------------------------------------

    def reduce_grad(self, buf, shard, async_op=True):
        """Sum `buf` (the whole bucket, [world*S]) over ranks into this rank's
        `shard` ([S]; on gloo and in a world of one `shard` must be the slice
        buf[rank*S:(rank+1)*S]). Returns a handle with wait()."""
        if not self.active:
            return Done()
        if self.has_reduce_scatter:
            w = C.reduce_scatter(shard, buf, self.group, self.counts, "reduce_scatter", async_op)
        else:
            w = C.all_reduce_sum(buf, self.group, self.counts, "all_reduce_grad", async_op)
        return w if w is not None else Done()

    def all_reduce(self, t, kind, op="sum"):
        """In-place all_reduce (SUM or MAX) of a small tensor, synchronous."""
        if not self.active:
            return t
        (C.all_reduce_sum if op == "sum" else C.all_reduce_max)(t, self.group, self.counts, kind)
        return t

    def all_gather_into(self, out, inp, kind):
        """out = concat over ranks of inp (equal sizes); out may contain inp
        (an in-place gather). gloo: the list all_gather into out's chunks."""
        if not self.active:
            if out.data_ptr() != inp.data_ptr():
                out[:inp.numel()].copy_(inp)
            return
        C.all_gather_bytes(out, inp, self.group, list(out.chunk(self.world)) if self.gloo else None, self.counts,
                           kind)

    def all_gather_i64(self, vals, kind):
        """Every rank's list of ints (same length everywhere)."""
        if not self.active:
            return [list(vals)]
        return C.all_gather_i64(list(vals), self.group, self.small_device(), self.counts, kind)

    def agree(self, ok, key, what, kind, **kw):
        """mxshard.collectives.agree over this group (a world of one: nothing to agree on)."""
        if not self.active:
            return [[]]
        return C.agree(ok, key, what, self.group, self.small_device(), counts=self.counts, kind=kind, **kw)

    def all_gather_object(self, obj, kind):
        """Every rank's picklable object (only on error paths)."""
        if not self.active:
            return [obj]
        return C.all_gather_object(obj, self.group, self.counts, kind)

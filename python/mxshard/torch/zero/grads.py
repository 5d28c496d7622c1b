# SPDX-License-Identifier: MIT
"""ShardedOptimizer's gradient path: every trainable parameter's gradient
goes into its bucket's rank-major buffer, and each bucket is reduced once.

    backward   autograd's p.grad (a converted weight's too: its GatheredWeight Parameter gets the
               wgrad, as under FSDP2) -> the post-accumulate-grad hook adds its rows into the
               bucket's [world * S] buffer (items.add_rows), sets p.grad = HeldGrad (held_grad:
               a later micro-batch's gradient goes into the buffer through it, a read raises)
               -> a bucket whose items all reported is launched (overlap=True, outside no_sync,
               in bucket order): reduce_scatter into this rank's [S] (gloo: all_reduce, slice)
    step()     the rest launched, all waited; "mean": / world on the shard; bf16 buffers upcast

Whether a gradient arrived: the buffers' version counters move at every add.
"""
from __future__ import annotations

import torch

from .held_grad import HeldGrad
from .items import add_rows

__all__ = ["GRAD_DTYPES", "Gradients", "module_owner", "hook_owner", "owned_hook", "sum_squares"]

GRAD_DTYPES = (torch.float32, torch.bfloat16)


def hook_owner(hook):
    """The live ShardedOptimizer `hook` belongs to, or None."""
    ref = getattr(hook, "_mxs_owner", None)
    return ref() if ref is not None else None


def owned_hook(hook):
    return hook_owner(hook) is not None


def module_owner(module):
    """The live ShardedOptimizer that trains converted linear `module`, or None."""
    ref = getattr(module, "_mxs_owner", None)
    return ref() if ref is not None else None


class _Into:
    """Where HeldGrad adds a later micro-batch's gradient of one item: its rank-major chunks."""

    def __init__(self, chunks, it, world):
        self.chunks, self.it, self.world = chunks, it, world
        self.shape = it.shape
        self.held = None   # the HeldGrad the item's Parameter shows once its gradient is in here (attach)

    def held_for(self, p):
        """The HeldGrad Parameter `p` shows: the one made at attach, or, once p was cast or moved
        (step() then raises, saying to cast before), one of p's dtype and device."""
        h = self.held
        return h if h.dtype == p.dtype and h.device == p.device else HeldGrad(p, self, self.it.name)

    def add_(self, g, alpha=1):
        add_rows(self.chunks, g if alpha == 1 else g * alpha, self.it.rows, self.it.cols, self.world)


def grad_hook(ref, b, pos):
    def hook(p):
        opt = ref()
        g = p.grad
        if g is None or opt is None:
            return
        if not isinstance(g, HeldGrad):
            into = opt._into[b][pos]
            try:
                into.add_(g.detach())
            except Exception as e:  # noqa: BLE001 - surfaces in step(), never inside backward
                opt._hook_errors.append(f"{into.it.name}: {e}")
                return
            p.grad = into.held_for(p)
        opt._report(b, pos)
    hook._mxs_owner = ref
    return hook


def zero_pending_hook(ref):
    """Forward pre-hook: the first forward with grad enabled after a step() that no zero_grad()
    followed zeroes the gradient buffers first (model.zero_grad() cannot reach them)."""
    def hook(module, args):
        o = ref()
        if o is not None and o._zero_pending and torch.is_grad_enabled():
            o._zero_grads(True)
    hook._mxs_owner = ref
    return hook


def sum_squares(g, total=None, chunk=1 << 22):
    """total + the sum of squares of g, accumulated in fp64 (no host synchronisation)."""
    g = g.reshape(-1)
    for i in range(0, g.numel(), chunk):
        c = g[i:i + chunk].double()
        d = torch.dot(c, c)
        total = d if total is None else total + d
    return total


class Gradients:
    """The gradient half of ShardedOptimizer (a mixin over its _geoms, _grad, _shard, comm)."""

    def _report(self, b, pos):
        if not (self._sync and self.overlap) or self._closed:
            return
        if self._work[b] is not None:
            name = self._geoms[b].items[pos].name
            task = torch._C._current_graph_task_id()
            (self._reused if task != -1 and task == self._task[b] else self._late).append(name)
            return
        self._seen[b].add(pos)
        while self._next < len(self._geoms) and len(self._seen[self._next]) == len(self._geoms[self._next].items):
            self._launch(self._next)
            self._next += 1

    def _launch(self, b):
        self._task[b] = torch._C._current_graph_task_id()
        self._work[b] = self.comm.reduce_grad(self._grad[b], self._shard[b], async_op=True)

    def _flush(self, errs):
        """Gradients set outside the hooks (p.grad = t, or a backward the hooks did not see)."""
        for b, into in enumerate(self._into):
            for pos, it in enumerate(self._geoms[b].items):
                g = it.live_param().grad
                if g is None or isinstance(g, HeldGrad):
                    continue
                if self._work[b] is not None:
                    errs.append(f"{it.name}: a gradient was set after its bucket's reduction started")
                    continue
                try:
                    into[pos].add_(g.detach())
                except Exception as e:  # noqa: BLE001
                    errs.append(f"{it.name}: {e}")
                    continue
                it.live_param().grad = into[pos].held_for(it.live_param())

    def _reduce_all(self):
        for b in range(len(self._geoms)):
            if self._work[b] is None:
                self._launch(b)
        for b, w in enumerate(self._work):
            w.wait()

    def _grads_arrived(self):
        return any(g._version != v for g, v in zip(self._grad, self._grad_seen))

    def _fp32_shards(self):
        """This rank's reduced shards in fp32, divided by the world size for "mean"."""
        out = []
        for s in self._shard:
            g = s.float() if s.dtype != torch.float32 else s
            if self.grad_reduce == "mean" and self.world > 1:
                g = g.div_(self.world) if g is s else g.div_(self.world)
            out.append(g)
        return out

    def _reset(self):
        self._work = [None] * len(self._geoms)
        self._task = [-1] * len(self._geoms)
        self._seen = [set() for _ in self._geoms]
        self._next = 0
        self._late, self._reused, self._hook_errors = [], [], []

    def _zero_grads(self, set_to_none=True):
        for g in self._grad:
            g.zero_()
        for s, g in zip(self._shard, self._grad):
            if s.data_ptr() != g.data_ptr():
                s.zero_()
        for geom in self._geoms:
            for it in geom.items:
                p = it.live_param()
                if isinstance(p.grad, HeldGrad) or set_to_none:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.zero_()
        self._reset()
        self._grad_seen = [g._version for g in self._grad]
        self._zero_pending = False

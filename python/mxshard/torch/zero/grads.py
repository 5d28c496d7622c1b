# SPDX-License-Identifier: MIT
"""ShardedOptimizer's gradient path: the backward hooks, the readiness of the
buckets, the reductions, the fp32 gradient shards the inner optimizer reads,
zeroing, and whether any gradient arrived at all.

    backward:  MXFP8Linear / NVFP4Linear wgrad -> main_grad (a view of the bucket's
               gradient buffer) -> _mx_hook; dense p.grad -> _dense_hook adds it into
               the buffer, sets p.grad = HeldGrad (held_grad: a later backward's
               gradient goes into the buffer through it, a read of it raises)
               -> _report: a bucket whose items all reported is launched (in bucket order)
    step():    _flush (dense .grad set outside the hooks), grads_arrived, _reduce_all
               (launch the rest, wait), fp32_shards (upcast a bf16 shard; "mean": / world)

Gradient buffers are in ``grad_dtype``: float32 (4 bytes per element of the
bucket) or bfloat16 (2 bytes; Megatron's grad_reduce_in_fp32=False). With
bfloat16 the accumulation (every wgrad and dense gradient added into the
buffer, every micro-batch of no_sync) rounds to bf16 at each addition, the
reduction is the backend's bf16 SUM (NCCL: fp32 arithmetic, bf16 rounding
per hop), and only this rank's reduced shard is upcast to fp32, divided by
the world size there ("mean"), and handed to the inner optimizer.

Whether a gradient arrived: any in-place write into a bucket's gradient
buffer since the last zero_grad() or step() bumps the buffer's version
counter (torch's, shared by every view of it: main_grad, the hooks' views),
so comparing the counters with the ones recorded then tells, with no hook
needed (gradients written straight into main_grad count too).
"""
from __future__ import annotations

import torch

from .held_grad import HeldGrad

__all__ = ["mx_hook", "dense_hook", "owned_hook", "hook_owner", "module_owner", "sum_squares", "GRAD_DTYPES",
           "Gradients"]

GRAD_DTYPES = (torch.float32, torch.bfloat16)


def mx_hook(ref, b, pos):
    """The hook a quantized linear calls after adding its wgrad into main_grad."""
    def hook():
        opt = ref()
        if opt is not None:
            opt._report(b, pos)
    hook._mxs_owner = ref
    return hook


def hook_owner(hook):
    """The live ShardedOptimizer `hook` belongs to, or None."""
    ref = getattr(hook, "_mxs_owner", None)
    return ref() if ref is not None else None


def module_owner(module):
    """The live ShardedOptimizer whose gradient hook `module` (a quantized linear) carries, or None."""
    return hook_owner(getattr(module, "_mxs_grad_hook", None))


def owned_hook(hook):
    """True when `hook` belongs to a ShardedOptimizer that is still alive."""
    return hook_owner(hook) is not None


def zero_pending_hook(ref):
    """Forward pre-hook of every module that owns a trainable item: the first forward with grad
    enabled after a step() that no zero_grad() followed zeroes the gradient buffers first."""
    def hook(module, args):
        o = ref()
        if o is not None and o._zero_pending and torch.is_grad_enabled():
            o._zero_grads(True)
    hook._mxs_owner = ref
    return hook


def dense_hook(ref, b, pos, gview):
    """A dense parameter's post-accumulate-grad hook: add .grad into the bucket, leave a HeldGrad
    in its place (it raises, saying what to use, where .grad would be read)."""
    def hook(p):
        g = p.grad
        opt = ref()
        if g is None or opt is None:  # an optimizer that is gone leaves the gradient alone
            return
        if not isinstance(g, HeldGrad):  # (a HeldGrad took this backward's gradient itself)
            name = opt._items[opt.plan.buckets[b].items[pos].item].name
            try:
                gview.add_(g.reshape(gview.shape))
            except Exception as e:  # noqa: BLE001 - surfaces in step(), never inside backward
                opt._hook_errors.append(f"{name}: {e}")
                return
            p.grad = HeldGrad(p, gview, name)
        opt._report(b, pos)
    hook._mxs_owner = ref
    return hook


def sum_squares(g, total=None, chunk=1 << 22):
    """total + sum of squares of an fp32 tensor, accumulated in fp64 (chunked),
    as a 0-d fp64 tensor on g's device: no host synchronization."""
    for i in range(0, g.numel(), chunk):
        c = g[i:i + chunk].double()
        d = torch.dot(c, c)
        total = d if total is None else total + d
    return total


class Gradients:
    """The gradient half of ShardedOptimizer (a mixin: it reads the
    optimizer's _buckets, _items, plan, comm, _expect, overlap, _sync)."""

    def _report(self, b, pos):
        """Hook: item `pos` of bucket `b` has its gradient for this backward."""
        if not (self._sync and self.overlap) or getattr(self, "_closed", False):
            return
        bk = self._buckets[b]
        if bk.work is not None:
            name = self._items[bk.spec.items[pos].item].name
            # in the backward that launched the bucket: a module called more than once in one forward
            task = torch._C._current_graph_task_id()
            (self._reused if task != -1 and task == bk.task else self._late).append(name)
            return
        bk.seen.add(pos)
        while self._next < len(self._buckets) and \
                len(self._buckets[self._next].seen) == len(self._buckets[self._next].spec.items):
            self._launch(self._next, async_op=True)

    def _launch(self, b, async_op):
        bk = self._buckets[b]
        bk.task = torch._C._current_graph_task_id()   # (-1 outside a backward: at step())
        bk.work = self.comm.reduce_grad(bk.grad, bk.grad_shard, async_op=async_op)
        self._next = b + 1

    def _flush(self, errs):
        """Dense .grad set outside the hooks (or by hooks that did not report)
        goes into the gradient buffers of the buckets not launched yet."""
        late = []
        for it, view, gview in self._expect:
            if it.param is None or it.param.grad is None or isinstance(it.param.grad, HeldGrad):
                continue
            b, _ = self._where[id(it)]
            if self._buckets[b].work is not None:
                late.append(it.name)
                continue
            try:
                gview.add_(it.param.grad.reshape(gview.shape))
                it.param.grad = None
            except Exception as e:  # noqa: BLE001
                errs.append(f"{it.name}: {e}")
        if late:
            errs.append(f"{', '.join(late)}: a gradient arrived after its bucket was reduced (is the model also "
                        f"wrapped in DistributedDataParallel? ShardedOptimizer reduces the gradients itself: do not "
                        f"wrap it)")

    @property
    def _where(self):
        w = getattr(self, "_where_cache", None)
        if w is None:
            w = {id(it): self.plan.where[i] for i, it in enumerate(self._items)}
            self._where_cache = w
        return w

    def _reduce_all(self, errs):
        """Launch what is left (in bucket order), wait for everything."""
        while self._next < len(self._buckets):
            self._launch(self._next, async_op=True)
        for bk in self._buckets:
            try:
                bk.work.wait()
            except Exception as e:  # noqa: BLE001
                errs.append(f"bucket {bk.spec.index} reduction: {e}")

    def _fp32_shards(self):
        """This rank's reduced gradient shard of every bucket in fp32, "mean"
        divided by the world size: the shard itself for float32 buffers, an
        upcast copy for bfloat16 ones (freed after the step)."""
        out = []
        for bk in self._buckets:
            g = bk.grad_shard if bk.grad_shard.dtype == torch.float32 else bk.grad_shard.float()
            if self.grad_reduce == "mean" and self.world > 1:
                g.div_(self.world)
            out.append(g)
        return out

    def _grad_versions(self):
        return [bk.grad._version for bk in self._buckets]

    def _grads_arrived(self):
        """Local: was any gradient buffer written since the last zero_grad() / step()?"""
        return self._grad_versions() != self._grads_seen

    def _reset(self):
        for bk in self._buckets:
            bk.seen = set()
            bk.work = None
        self._next = 0
        self._late = []
        self._reused = []
        self._hook_errors = []

    def _zero_grads(self, set_to_none):
        """Every gradient buffer zeroed (they stay: main_grad views stay); a
        dense parameter's .grad (only ever there when set outside the hooks)
        set to None or zeroed in place, as torch.optim does."""
        self._zero_pending = False
        for bk in self._buckets:
            if bk.work is not None:
                bk.work.wait()
            bk.grad.zero_()
            if not bk.shard_is_view:
                bk.grad_shard.zero_()
        for it, _, _ in self._expect:
            p = it.param
            if p is None or p.grad is None:
                continue
            if set_to_none or isinstance(p.grad, HeldGrad):
                p.grad = None
            else:
                if p.grad.grad_fn is not None:
                    p.grad.detach_()
                else:
                    p.grad.requires_grad_(False)
                p.grad.zero_()
        self._reset()
        self._grads_seen = self._grad_versions()

# SPDX-License-Identifier: MIT
"""ShardedOptimizer's side of the model's weights: the writeback that makes
them the masters again (MXFP8 / NVFP4 bucket writebacks, dense casts and
gathers), and the guard that the model's storage is still the optimizer's.

Two things are checked at every step(), on every rank (a failure on any rank
makes every rank raise):

- nothing MOVED: every optimizer buffer, every module plane and main_grad,
  every dense parameter's storage is where construction put it (replacing a
  .data, .to(), a new main_grad);
- nothing was WRITTEN from outside: the version counter of every tensor the
  model exposes (each dense Parameter, each MXFP8Linear / NVFP4Linear plane
  buffer) is the one recorded after the last writeback. model.load_state_dict()
  copies into them in place and bumps them; module.set_master_() bumps them
  too (its quantization writes the bytes outside torch).

A third, _check_trainable: no item's requires_grad changed (a dense
Parameter's, a quantized linear's weight flag set by module.requires_grad_ /
module.weight.requires_grad_) and no parameter frozen at construction was
unfrozen: what trains is fixed at construction. Without this check the next
  writeback would silently put the fp32 masters back over what was loaded.
  (Writes through ``p.data`` escape every version counter, torch's autograd
  checks included: after such a write call masters_from_model() yourself.)
"""
from __future__ import annotations

import torch

from ... import _lib as L
from . import layout as LY

__all__ = ["PLANE_BUFFERS", "Writeback"]

# a bucket's buffers of quantized planes (and NVFP4 amaxes)
PLANE_BUFFERS = ("rowbuf", "colbuf", "rowscale", "colscale", "nvrow", "nvcol", "nvrowscale", "nvcolscale", "nvamax")


def names_shown(names, sep=", "):
    """The first four of `names` for an error message, then how many more ("a, b, c, d and 3 more";
    with sep "; ": "a; b; c; d; and 3 more")."""
    more = f"{sep if sep != ', ' else ' '}and {len(names) - 4} more" if len(names) > 4 else ""
    return sep.join(names[:4]) + more


class Writeback:
    """The model-facing half of ShardedOptimizer (a mixin: it reads the
    optimizer's _buckets, _items, _expect, comm, world, rank, plan)."""

    def _writeback_and_gather(self, local, remote):
        """Every weight from the masters, on every rank whatever happened; errors collected."""
        group = self.comm.group if self.comm.dist is not None else None
        for bk in self._buckets:
            for wb, reduce_kind, gathers in ((bk.wb, "all_reduce_max", [f"all_gather_{pn}" for pn in bk.wb_planes]),
                                             (bk.nvwb, "all_reduce_nvfp4",
                                              [f"all_gather_nvfp4_{pn}" for pn in bk.nv_planes])):
                if wb is None:
                    continue
                self.comm.count(reduce_kind)
                try:
                    # after a local failure (e.g. in the inner step) run() joins the one all-reduce
                    # with this rank's status byte set, so every other rank raises RemoteError
                    wb.run(group, error=local[0] if local else None)
                    for kind in gathers:
                        self.comm.count(kind)
                except L.RemoteError as e:
                    remote.append(e)
                except Exception as e:  # noqa: BLE001
                    if all(e is not x for x in local):  # run() re-raises the error it was handed
                        local.append(e)
        for bk in self._buckets:
            for s in bk.gathers:
                try:
                    dst, src = s["cast"]
                    dst.copy_(src)          # this rank's piece, straight into place
                    if s["kind"] == "padded":
                        s["send"][:s["n"]].copy_(dst)
                except Exception as e:  # noqa: BLE001 - still join the gather
                    local.append(e)
                if not self.comm.active:
                    continue
                if s["kind"] == "inplace":
                    self.comm.all_gather_into(s["out"], s["inp"], "all_gather_dense")
                else:
                    self.comm.all_gather_into(s["recv"].view(torch.uint8), s["send"].view(torch.uint8),
                                              "all_gather_dense")
                    for dst, src in s["unpack"]:
                        dst.copy_(src)
        self._versions = self._model_versions()

    def _status_then_writeback(self, err, where, apply=None):
        """The collective tail of load_state_dict / masters_from_model /
        model_from_masters: every rank learns whether any rank's checks failed
        (`err`: this rank's error; nothing was written anywhere yet), then, when
        none did, `apply()` writes this rank's masters and every weight is
        written from the masters. An error of apply() travels in the
        writebacks' status bytes (every rank raises, nobody hangs)."""
        flag = torch.tensor([1.0 if err is not None else 0.0], dtype=torch.float64,
                            device=self.comm.small_device(self.device))
        self.comm.all_reduce(flag, "all_reduce_status")
        if err is not None:
            try:
                raise err
            finally:
                err = None  # no frame <-> traceback cycle keeps the optimizer alive
        if flag.item():
            raise L.remote_error(f"ShardedOptimizer.{where} (another rank failed)")
        local, remote = [], []
        if apply is not None:
            try:
                apply()
            except Exception as e:  # noqa: BLE001 - the writebacks tell the others
                local.append(e)
        self._writeback_and_gather(local, remote)
        if local or remote:
            raise (local + remote)[0]

    # ---- what the model sees -------------------------------------------------------

    def _model_tensors(self):
        """(item name, tensor) of every tensor of the model the optimizer owns:
        each dense Parameter, each quantized linear's plane buffers (and amax)."""
        for it, a, _ in self._expect:
            if it.module is not None:
                for k in a:
                    yield it.name, it.module._buffers.get(k)
            else:
                yield it.name, it.param

    def _model_versions(self):
        return [None if t is None else t._version for _, t in self._model_tensors()]

    def _written_from_outside(self):
        """Names of the items whose model tensors were written since the last writeback."""
        names = []
        for (name, t), v in zip(self._model_tensors(), self._versions):
            if t is not None and t._version != v and name not in names:
                names.append(name)
        return names

    def _seed_masters(self):
        """This rank's master shards from the model's current values: a quantized
        weight's master is its row plane dequantized to fp32 (master_init()), a
        dense parameter's its value in fp32. Everything is read before anything
        is written (a failure leaves the masters as they were)."""
        new = []
        for b in self._buckets:
            for p, start, length, pos in LY.item_shards(b.spec, self.rank):
                if length == 0:
                    continue
                it = self._items[p.item]
                full = it.module.master_init() if it.module is not None else it.param.detach()
                new.append((b.master[pos:pos + length], full.reshape(-1)[start:start + length].to(torch.float32)))
        for dst, src in new:
            dst.copy_(src)

    # ---- storage checks ---------------------------------------------------------------

    def _pointers(self):
        out = []
        for b in self._buckets:
            for t in (b.master, b.grad, b.grad_shard) + tuple(getattr(b, k) for k in PLANE_BUFFERS):
                out.append(None if t is None else t.data_ptr())
        return out

    def _check_storage(self, written=True):
        """Local: nothing moved since construction, and (`written`) nothing was
        written into the model's weights since the last writeback. Returns
        error strings (each one's first sentence says what to do)."""
        errs = []
        if self._pointers() != self._ptrs:
            errs.append("an optimizer buffer moved")
        moved = []
        for it, a, gview in self._expect:
            if it.module is not None:
                m = it.module
                bufs = m._buffers  # the module's buffers ARE the primary's planes (its primary property)
                for k, v in a.items():
                    t = bufs.get(k)
                    if t is None or (t is not v and (t.data_ptr() != v.data_ptr() or t.shape != v.shape)):
                        moved.append(f"{it.name}: module {k} was replaced or reshaped")
                mg = m.__dict__.get("main_grad")
                if mg is None or mg.data_ptr() != gview.data_ptr() or tuple(mg.shape) != it.shape:
                    errs.append(f"{it.name}: module main_grad was replaced (write into it in place)")
            else:
                p = it.param
                if p.data_ptr() != a.data_ptr() or tuple(p.shape) != it.shape or p.dtype != a.dtype \
                        or p.device != a.device:
                    moved.append(f"{it.name}: the parameter's storage was replaced or reshaped"
                                 + (f" (now {p.dtype}, built as {a.dtype})" if p.dtype != a.dtype else "")
                                 + (f" (now on {p.device}, built on {a.device})" if p.device != a.device else ""))
        if moved:
            shown = names_shown(moved, "; ")
            errs.append(f"Cast or move the model (model.to(dtype / device), .half(), .bfloat16(), .cuda()) before "
                        f"building ShardedOptimizer, not after: it owns the model's storage from its construction "
                        f"on (to change it now: opt.close(), then build a new ShardedOptimizer on the model; it starts "
                        f"from the model's current values, with a fresh optimizer state). After the optimizer was "
                        f"built: {shown}")
        if written and not errs:
            written = self._written_from_outside()
            if written:
                shown = names_shown(written)
                errs.append(f"Right after writing into the model's weights, call opt.masters_from_model() on every "
                            f"rank (the written values become the fp32 masters; a quantized weight's master becomes "
                            f"its dequantized row plane), or opt.model_from_masters() to undo the write; to restore "
                            f"a whole training state use mxt.load_checkpoint(). The model's weights were written from "
                            f"outside the optimizer since its last writeback ({shown}: model.load_state_dict(), "
                            f"module.set_master_(w), an in-place copy into a parameter or a quantized linear's "
                            f"buffer, or DistributedDataParallel(model) after the optimizer was built: unwrap it, "
                            f"ShardedOptimizer reduces the gradients itself), and this step would write the fp32 "
                            f"masters back over them")
        return errs

    def _check_trainable(self):
        """Local: every item still trains (requires_grad) and no parameter frozen at
        construction was unfrozen since. Returns error strings."""
        frozen, unfrozen = [], []
        for it in self._items:
            if it.module is not None:
                if not getattr(it.module, "_mxs_weight_requires_grad", True):
                    frozen.append(it.name)
            elif not it.param.requires_grad:
                frozen.append(it.name)
        for name, p in getattr(self, "_frozen_params", ()):
            if p.requires_grad:
                unfrozen.append(name)
        if not frozen and not unfrozen:
            return []
        what = "; ".join(x for x in (f"frozen after it was built: {names_shown(frozen)}" if frozen else "",
                                     f"unfrozen after it was built: {names_shown(unfrozen)}" if unfrozen else "")
                         if x)
        return [f"Freeze or unfreeze parameters (requires_grad_) before building ShardedOptimizer: its trainable "
                f"items, buckets and shards are fixed at construction, so it would keep stepping a frozen "
                f"parameter (and never an unfrozen one). To change what trains, undo the change, or opt.close() "
                f"and build a new ShardedOptimizer on the model (it starts from the model's current values, with a "
                f"fresh optimizer state); to hold parameters still for a while, give them a param group at "
                f"construction and set its lr and weight_decay to 0. "
                f"requires_grad changed ({what})"]

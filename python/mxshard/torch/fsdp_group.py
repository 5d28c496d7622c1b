# SPDX-License-Identifier: MIT
"""FSDPGroup: every converted (fsdp=True) weight of one model, and the ONE
small collective per step that their bytes need.

    after opt.step() the masters' versions moved; the first all-gather of the next forward asks
    pre_all_gather for bytes, finds its unit stale, and refreshes EVERY weight of the model:

      build / reuse units (fsdp_units.WeightUnit)        one per weight, this rank's rows
      partial                                             the library, per unit, local
      ONE all_reduce(MAX, int32) of the shared entries    skipped when no weight has one
         + a status entry (a rank that failed: all raise) (row-only MXFP8 evenly sharded:
         + a configuration fingerprint (x and -x)          nothing to reduce, no collective)
      apply                                               fragments + scales, per unit

    then each FSDP2 all-gather moves one plane's bytes (pre_all_gather -> send,
    post_all_gather -> assemble into a GatheredWeight).

The decision to refresh depends only on version counters that every rank's
optimizer moved alike, so the ranks agree on it without a collective. A world
of one without FSDP2 (the weight a plain Parameter) uses the same units with
no collective at all (local_primary).

Collectives this module issues are counted in `collectives` by kind
("refresh_all_reduce", "fetch_all_gather").
"""
from __future__ import annotations

import hashlib
from collections import Counter

import torch
import torch.distributed as dist

from .. import _lib as L
from .fsdp_gathered import GatheredWeight, _Box
from .fsdp_master import QuantMaster
from .fsdp_units import WeightUnit, scratch_bytes, shared_entry_count

__all__ = ["FSDPGroup"]

_FP_ENTRIES = 4  # a 64-bit fingerprint as four 16-bit int32 entries (and their negations)


def _in_backward():
    """True inside the autograd engine (FSDP2's pre-backward unshard and its prefetches)."""
    return torch._C._current_graph_task_id() != -1


def _fingerprint(masters, world):
    h = hashlib.sha256(repr([(l._meta.name, l._meta.rows, l._meta.cols, tuple(l._meta.spec)) for _, l, _ in masters]
                            + [world]).encode()).digest()
    v = int.from_bytes(h[:8], "little")
    return [(v >> (16 * i)) & 0xFFFF for i in range(_FP_ENTRIES)]


class FSDPGroup:
    """The converted weights of one model (see the module docstring)."""

    def __init__(self):
        self.members = []        # (qualified name, module), in model order
        self.units = {}          # WeightMeta -> WeightUnit
        self.collectives = Counter()
        self.refreshes = 0

    def add(self, name, module):
        self.members.append((name, module))

    # ---- which masters FSDP2 manages now -------------------------------------------------

    def _sharded_masters(self):
        """[(module, sharded local QuantMaster, mesh)] for every member FSDP2 manages, in model
        order; checks what mxshard supports (Shard(0) on a 1-D mesh)."""
        from torch.distributed.tensor import DTensor, Shard
        out = []
        for name, mod in self.members:
            w = mod._parameters.get("weight")
            if isinstance(w, DTensor):
                mesh = w.device_mesh
                if mesh.ndim != 1:
                    raise NotImplementedError(
                        f"mxshard: {name}.weight lives on a {mesh.ndim}-D device mesh {mesh.mesh_dim_names}: quantized "
                        f"FSDP2 weights support one data-parallel mesh dimension (no HSDP, no tensor parallel)")
                if tuple(w.placements) != (Shard(0),):
                    raise NotImplementedError(
                        f"mxshard: {name}.weight is sharded as {tuple(w.placements)}: quantized FSDP2 weights need "
                        f"fully_shard's default Shard(0) (drop shard_placement_fn for them)")
                local = w._local_tensor
            elif isinstance(w, GatheredWeight):
                local, mesh = w.source, w._box.mesh
            elif isinstance(w, QuantMaster):
                continue  # not under FSDP2: a world of one (local_primary)
            else:
                raise RuntimeError(_replaced_message(name, w))
            if not isinstance(local, QuantMaster):
                raise RuntimeError(_replaced_message(name, local))
            out.append((mod, local, mesh))
        return out

    # ---- the step's refresh: ONE reduction for the model -------------------------------

    def refresh(self, mesh):
        """Partial -> one MAX all-reduce of every shared entry (when any) -> apply, for every
        FSDP2-managed weight. Every rank calls it at the same point of the same program."""
        masters = self._sharded_masters()
        world, rank = mesh.size(), mesh.get_local_rank()
        pg = mesh.get_group()
        for _, _, m in masters:
            if m.get_group() is not pg:
                raise NotImplementedError("mxshard: the converted weights are sharded over different process groups; "
                                          "fully_shard them over one data-parallel mesh")
        counts = [shared_entry_count(l._meta.spec, l._meta.rows, l._meta.cols, world) for _, l, _ in masters]
        n = sum(counts)
        dev = masters[0][1].device if masters else torch.device("cpu")
        wire = torch.zeros(n + 1 + 2 * _FP_ENTRIES, dtype=torch.int32, device=dev)
        units, err = [], None
        try:
            for _, local, _ in masters:
                u = self.units.get(local._meta)
                if u is None or not u.matches(local._data, world, rank):
                    u = WeightUnit(local._meta, local._data, world, rank)
                    self.units[local._meta] = u
                units.append(u)
            at = 0
            for u, c in zip(units, counts):
                u.partial()
                if c:
                    wire[at:at + c] = u.entries()
                at += c
            fp = torch.tensor(_fingerprint(masters, world), dtype=torch.int32)
            wire[n + 1:n + 1 + _FP_ENTRIES] = fp
            wire[n + 1 + _FP_ENTRIES:] = -fp
        except Exception as e:  # noqa: BLE001 - every rank learns of it through the status entry
            err = e
            wire.zero_()
            wire[n] = 1
        if n > 0:
            dist.all_reduce(wire, op=dist.ReduceOp.MAX, group=pg)
            self.collectives["refresh_all_reduce"] += 1
        if err is not None:
            raise err
        if n > 0:
            if int(wire[n]) != 0:
                raise L.remote_error("mxshard FSDP2 refresh (another rank failed before the reduction)")
            fp = wire[n + 1:].cpu()
            if not torch.equal(fp[:_FP_ENTRIES], -fp[_FP_ENTRIES:]):
                raise L.status_error(L.status_code("MXS_ERR_PLAN_MISMATCH"),
                                     "mxshard FSDP2 refresh: the ranks' converted models differ (names, shapes, "
                                     "formats or options); build the same model on every rank")
        at = 0
        for (_, local, _), u, c in zip(masters, units, counts):
            if c:
                u.set_entries(wire[at:at + c])
            at += c
            u.apply(local._data._version)
        self.refreshes += 1

    # ---- FSDP2's hooks -------------------------------------------------------------------

    def pre_all_gather(self, local, mesh, outer_size, module):
        """This rank's bytes of the plane this unshard needs: the row plane in forward, the
        dgrad plane in backward."""
        meta = local._meta
        w = module._parameters.get("weight")
        if getattr(w, "_local_tensor", None) is not local:
            raise NotImplementedError(
                f"mxshard: {meta.name}: FSDP2 all-gathers a copy of the sharded master (CPUOffloadPolicy?); "
                f"quantized weights keep their master on the device: drop offload_policy for them")
        if tuple(outer_size) != (meta.rows, meta.cols):
            raise RuntimeError(f"mxshard: {meta.name}: FSDP2 gathers a {tuple(outer_size)} weight, the module's is "
                               f"[{meta.rows}, {meta.cols}]")
        world, rank = mesh.size(), mesh.get_local_rank()
        u = self.units.get(meta)
        if u is None or not u.matches(local._data, world, rank) or not u.fresh(local._data):
            self.refresh(mesh)
            u = self.units[meta]
        plane = meta.spec.dgrad_plane() if _in_backward() else "row"
        return u.send(plane), (plane, mesh)

    def post_all_gather(self, local, outputs, metadata, param_dtype, out):
        """The GatheredWeight of the plane just gathered (first time), or the same one refilled
        (out=: FSDP2 re-allocated its scratch)."""
        plane, mesh = metadata
        meta = local._meta
        u = self.units[meta]
        if out is not None:
            box = out._box
            box.source, box.mesh = local, mesh
            box.planes = {plane: u.assemble(plane, outputs, box.scratch)}
            return None
        box = _Box(local, mesh)
        box.scratch = torch.empty(scratch_bytes(meta.spec, meta.rows, meta.cols), dtype=torch.uint8,
                                  device=outputs[0].device)
        box.planes = {plane: u.assemble(plane, outputs, box.scratch)}
        return GatheredWeight((meta.rows, meta.cols), param_dtype, outputs[0].device, box), (box.scratch,)

    # ---- planes on demand, and a world of one -------------------------------------------

    def fetch_plane(self, gathered, plane):
        """All-gathers `plane` of an unsharded weight that does not hold it (one collective) and
        returns its primary; the caller uses it once and drops it."""
        box = gathered._box
        meta = box.source._meta
        u = self.units[meta]
        pg = box.mesh.get_group()
        ins = u.send(plane)
        flat = torch.cat([t.reshape(-1) for t in ins])
        outb = torch.empty(u.world * flat.numel(), dtype=torch.uint8, device=flat.device)
        dist.all_gather_into_tensor(outb, flat, group=pg)
        self.collectives["fetch_all_gather"] += 1
        g = outb.view(u.world, -1)
        outs, at = [], 0
        for t in ins:
            outs.append(g[:, at:at + t.numel()].reshape(-1))
            at += t.numel()
        scratch = torch.empty(scratch_bytes(meta.spec, meta.rows, meta.cols), dtype=torch.uint8, device=flat.device)
        return u.assemble(plane, outs, scratch)

    def local_primary(self, master):
        """The whole weight's primary for a master FSDP2 does not manage (a world of one, no
        collective), refreshed when the master moved."""
        meta = master._meta
        u = self.units.get(meta)
        if u is None or not u.matches(master._data, 1, 0):
            u = WeightUnit(meta, master._data, 1, 0)
            self.units[meta] = u
        if not u.fresh(master._data) or u.cached is None:
            u.partial()
            u.apply(master._data._version)
            u.cached = u.local_primary()
        return u.cached


def _replaced_message(name, w):
    return (f"mxshard: {name}.weight is a {type(w).__name__}, not the module's QuantMaster: it was replaced "
            f"(a tied weight, load_state_dict(assign=True), a new Parameter?). Keep the converted weight: load "
            f"values with load_state_dict(..., assign=False) / weight.data.copy_(...), and keep tied weights dense")

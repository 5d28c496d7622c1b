# SPDX-License-Identifier: MIT
"""FSDPGroup: every converted weight of one model, and the ONE
small collective per step that their bytes need.

    after opt.step() the masters' versions moved; the first all-gather of the next forward asks
    pre_all_gather for bytes, finds its unit stale, and refreshes EVERY weight of the model:

      build / reuse units (units.WeightUnit)        one per weight, this rank's rows
      partial                                             the library, per unit, local
      ONE all_reduce(MAX, int32) of the shared entries    skipped when no weight has one
         + a status entry (a rank that failed: all raise) (row-only MXFP8 evenly sharded:
                                                            nothing to reduce, no collective)
      (at the first refresh at a world size: one all_gather of the entry count and a
       fingerprint of the converted model, whether or not any entry is shared: ranks that
       differ all raise PlanMismatchError, none goes on to a collective the others skip)
      apply                                               fragments + scales, per unit

    then each FSDP2 all-gather moves one plane's bytes (pre_all_gather -> send,
    post_all_gather -> assemble into a GatheredWeight).

When to refresh must be the same decision on every rank (the refresh may be a
collective), so it follows events every rank sees alike, counted in
`generation`: a step of any torch.optim optimizer holding one of the model's
masters (a global optimizer step post-hook, installed once), a
load_state_dict into a converted module, and masters_changed() (for writes
mxshard cannot see: call it on every rank). A rank's own version counters
are only a safety net: a weight whose bytes need no reduction is simply
redone locally; one that needs it must not have moved unseen (FSDP2
re-padding a shard into new storage with the same values is fine): found at
the next forward pass of an evaluation before any use (one flag all-reduced,
_check), every rank refreshes; else every rank raises naming masters_changed()
at that check or at the next refresh (its status entry),
while the gather in between sends the bytes every rank made (a rank that
raised alone would leave the others waiting in FSDP2's all-gather). A world of one without FSDP2 (the weight
a plain Parameter) uses the same units with no collective at all
(local_primary).

Collectives this module issues are counted in `collectives` by kind
("refresh_all_reduce", "check_all_reduce", "fetch_all_gather").
"""
from __future__ import annotations

import hashlib
from collections import Counter

import torch
import torch.distributed as dist

from ... import _lib as L
from ... import collectives as C
from .gathered import GatheredWeight, _Box
from .master import QuantMaster, _storage_id
from .units import WeightUnit, apply_reduced, pack_partials, scratch_bytes, shared_entry_count

__all__ = ["FSDPGroup"]

_FP_ENTRIES = 4  # a 64-bit fingerprint as four 16-bit entries


def _in_backward():
    """True inside the autograd engine (FSDP2's pre-backward unshard and its prefetches)."""
    return torch._C._current_graph_task_id() != -1


def _fingerprint(masters, world):
    h = hashlib.sha256(repr([(l._meta.name, l._meta.rows, l._meta.cols, tuple(l._meta.spec)) for _, l, _ in masters]
                            + [world]).encode()).digest()
    v = int.from_bytes(h[:8], "little")
    return [(v >> (16 * i)) & 0xFFFF for i in range(_FP_ENTRIES)]


def _check_one_group(pg, meshes):
    """Every converted weight is sharded over the same ranks, in the same order, as `pg` (the
    group the refresh reduces over). Not necessarily the same group object: each fully_shard
    call without a mesh makes its own DeviceMesh, and on a machine with CUDA and a gloo default
    group each such mesh gets a new gloo group over the same ranks (torch 2.11 DeviceMesh)."""
    ranks = None
    for mesh in meshes:
        g = mesh.get_group()
        if g is pg:
            continue
        if ranks is None:
            ranks = dist.get_process_group_ranks(pg)
        if dist.get_process_group_ranks(g) != ranks:
            raise NotImplementedError("mxshard: the converted weights are sharded over different sets of ranks; "
                                      "fully_shard them over one data-parallel mesh")


class FSDPGroup:
    """The converted weights of one model (see the module docstring)."""

    def __init__(self):
        self.members = []        # (qualified name, module), in model order
        self.units = {}          # WeightMeta -> WeightUnit
        self.collectives = Counter()
        self.refreshes = 0
        self.generation = 1      # moves when the masters moved (see the module docstring)
        self._agreed = None      # the world size whose ranks checked they reduce the same entries
        self.refreshed = 0       # the generation the units' bytes were made at
        self._stale = None       # a weight found written unseen on this rank where no collective could say so
        self._passed = set()     # weights gathered in forward since the last refresh or check
        self.backward_ran = False  # a converted linear's backward ran since then (fsdp.ops sets it)
        self.root = None         # weakref of the model convert() was given (convert sets it)
        _install_step_hook()

    def add(self, name, module):
        self.members.append((name, module))
        module.register_load_state_dict_post_hook(self._loaded)

    def rename(self, names):
        """{module: its qualified name in the model convert() was given now}: a model converted in
        parts (a submodule first, then the model holding it) names each weight from the root, so
        that two weights of one model never share a name (their units are keyed by it)."""
        for module, name in names.items():
            if module.meta.name != name:
                module.meta.rename(name)
        self.members = [(m.meta.name, m) for _, m in self.members]
        self.units = {u.meta: u for u in self.units.values()}

    def _loaded(self, module, incompatible_keys):
        self.masters_changed()

    # torch.save(model) / copy.deepcopy pickle the group with its modules: the units (the bytes
    # derived from the masters, and the library objects behind them) are rebuilt at the next use.
    # The members are not pickled: each copied converted linear joins its group's copy itself
    # (_ParamLinear.__setstate__), so a copy of one block (deepcopy(model.layers[-1]), torch.save
    # of a submodule) holds its own linears, not copies of every linear of the model
    def __getstate__(self):
        state = dict(self.__dict__)
        state.update(members=[], units={}, _agreed=None, refreshed=0, generation=self.generation + 1, _stale=None,
                     _passed=set(), backward_ran=False, root=None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        _install_step_hook()

    def masters_changed(self):
        """The masters were written: the next all-gather refreshes every weight's bytes (call it on
        every rank; optimizer steps and load_state_dict do it themselves)."""
        self.generation += 1

    def announced(self):
        """mxshard.torch.masters_changed(model): as masters_changed(), and the bytes of the weights
        FSDP2 does not shard (one process) are made again at their next use (writes mxshard cannot
        see: through numpy, or into a buffer the master aliases)."""
        self.masters_changed()
        for u in self.units.values():
            u.cached = None

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
                        f"mxshard: fully_shard the modules holding converted weights over a 1-D mesh (e.g. "
                        f"mesh['shard'] of your mesh, or init_device_mesh(device, (world,))), or keep them dense: "
                        f"{name}.weight lives on a {mesh.ndim}-D device mesh {mesh.mesh_dim_names}, and quantized "
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
        _check_one_group(pg, [m for _, _, m in masters])
        counts = [shared_entry_count(l._meta.spec, l._meta.rows, l._meta.cols, world) for _, l, _ in masters]
        n = sum(counts)
        dev = masters[0][1].device if masters else torch.device("cpu")
        if self._agreed != world:  # whatever the policy: only then is every rank's next step the same
            self._agree(pg, world, n, _fingerprint(masters, world), dev, self._unsupported_resharding())
        wire = torch.zeros(n + 1, dtype=torch.int32, device=dev)
        units, err = [], None
        try:
            for _, local, _ in masters:
                u = self.units.get(local._meta)
                if u is None or not u.matches(local._data, world, rank):
                    u = WeightUnit(local._meta, local._data, world, rank)
                    self.units[local._meta] = u
                units.append(u)
            pack_partials(units, counts, wire)
        except Exception as e:  # noqa: BLE001 - every rank learns of it through the status entry
            err = e
            wire.zero_()
            wire[n] = _FAILED
        stale, self._stale, self._passed, self.backward_ran = self._stale, None, set(), False
        if stale is not None and err is None:  # (n > 0: only a weight with shared entries is ever stale)
            wire[n] = _STALE
        if n > 0:
            C.all_reduce_max(wire, pg, self.collectives, "refresh_all_reduce")
        if err is not None:
            raise err
        status = int(wire[n]) if n > 0 else 0
        if status == _STALE:
            raise RuntimeError(_stale_message(stale))
        if status != 0:
            raise L.remote_error("mxshard FSDP2 refresh (another rank failed before the reduction)")
        apply_reduced(units, counts, wire, [local._data._version for _, local, _ in masters])
        self.refreshes += 1
        self.refreshed = self.generation

    def _agree(self, pg, world, n, fp, dev, problem=None):
        """Once per world size, before the first reduction: one all_gather of (entry count,
        fingerprint of names, shapes and options); ranks that differ all raise PlanMismatchError
        (a reduction of unequal buffers would hang or mix unrelated entries). `problem`: this
        rank's message for a setup it refuses (every other rank raises RemoteError)."""
        got = C.agree(problem is None, [n] + fp, "mxshard FSDP2 refresh", pg, dev, counts=self.collectives,
                      kind="setup_all_gather",
                      mismatch=lambda bad: f"mxshard FSDP2: build and convert the same model on every rank: ranks "
                                           f"{bad} converted a different model than rank 0 (names, shapes, formats, "
                                           f"planes or options of the quantized linears)")
        if got is None:
            raise NotImplementedError(problem)
        self._agreed = world

    def _unsupported_resharding(self):
        """The message for an FSDP2 module that reshards converted weights after forward onto a
        smaller mesh (reshard_after_forward=<int>: torch's post-forward reshard keeps one float
        all-gather output, and a quantized weight gathers bytes), or None. Looks below the model
        convert() was given (self.root)."""
        root = self.root() if getattr(self, "root", None) is not None else None
        if root is None:
            return None
        from torch.distributed.fsdp import FSDPModule
        for name, mod in root.named_modules():
            state = mod._get_fsdp_state() if isinstance(mod, FSDPModule) else None
            pg = getattr(state, "_fsdp_param_group", None)
            if pg is None or not getattr(pg, "_use_post_forward_mesh", False):
                continue
            if any(isinstance(getattr(p.sharded_param, "_local_tensor", None), QuantMaster) for p in pg.fsdp_params):
                return (f"mxshard: pass reshard_after_forward=True or False to fully_shard of {name or 'the root'} "
                        f"(or keep its converted linears dense): an int reshards the gathered weights onto a "
                        f"smaller mesh after forward, which FSDP2 does for float parameters only, and a converted "
                        f"weight gathers quantized bytes")
        return None

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
        forward = not _in_backward()
        if self.refreshed != self.generation:
            self.refresh(mesh)
        elif forward and meta in self._passed:   # a new forward pass without a refresh
            if self.backward_ran and (torch.is_grad_enabled() or module.training):
                # (gradient accumulation's next micro-batch, a reentrant checkpoint's no-grad forward
                # included: the next refresh tells, no collective more)
                self._passed, self.backward_ran = set(), False
            else:   # (evaluation: eval() and no grad, also between micro-batches): say now what was written unseen
                self._check(mesh, local.device)
        if forward:
            self._passed.add(meta)
        u = self._ready(local, world, rank)
        plane = "row" if forward else meta.spec.dgrad_plane()
        return u.send(plane), (plane, mesh)

    def _check(self, mesh, dev):
        """At the first gather of a forward pass that follows another forward pass with no
        backward and no refresh in between (evaluation): one all_reduce(MAX) of one flag, set by
        a rank that holds a weight whose master was written since its bytes were made (unseen: no
        optimizer step, load_state_dict or masters_changed) and whose bytes need the ranks'
        reduction. Found before any use (an EMA's update_parameters, an in-place dcp.load between
        evaluations): every rank refreshes, as after masters_changed (every rank saw the flag, so
        the refresh's collective is every rank's). Stale bytes already sent in an earlier forward
        of the loop (self._stale): every rank raises, naming masters_changed. (After a backward,
        gradient accumulation's next micro-batch, it is skipped: what a rank found waits for the
        next refresh's status entry, one collective per optimizer step as before.)"""
        used = self._stale
        found = used or next((u.meta.name for u in self.units.values()
                              if u.n_shared and u.version is not None and not u.fresh(u.local)), None)
        self._stale, self._passed, self.backward_ran = None, set(), False
        flag = torch.tensor([2 if used is not None else 1 if found is not None else 0], dtype=torch.int32, device=dev)
        C.all_reduce_max(flag, mesh.get_group(), self.collectives, "check_all_reduce")
        if int(flag[0]) == 2:
            raise RuntimeError(_stale_message(used))
        if int(flag[0]) == 1:
            self.masters_changed()
            self.refresh(mesh)

    def _ready(self, local, world, rank):
        """The unit of `local` with bytes of its current values, without a collective (see the
        module docstring on versions)."""
        meta = local._meta
        u = self.units.get(meta)
        if u is None:
            raise RuntimeError(f"mxshard: {meta.name}: no bytes were made for this weight (it was not under "
                               f"FSDP2 at the last refresh); call mxshard.torch.masters_changed(model) on every rank")
        if u.matches(local._data, world, rank) and u.fresh(local._data):
            return u
        if u.n_shared == 0:  # nothing to agree on: redo it here
            if not u.matches(local._data, world, rank):
                u = WeightUnit(meta, local._data, world, rank)
                self.units[meta] = u
            u.partial()
            u.apply(local._data._version)
            return u
        if u.matches(local._data, world, rank) or u.local.shape != local._data.shape or \
                not torch.equal(u.local, local._data):
            # written unseen, and the bytes need the ranks' reduction: a raise here alone would leave
            # the other ranks waiting in this all-gather, so this gather sends the bytes every rank
            # made at the last refresh, and the next refresh or no-grad check raises on every rank
            self._stale = self._stale or meta.name
            return u
        new = WeightUnit(meta, local._data, world, rank)  # FSDP2 moved the shard (same values): redo here
        new.partial()
        new.set_entries(u.reduced)
        new.apply(local._data._version)
        self.units[meta] = new
        return new

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
        C.all_gather_bytes(outb, flat, pg, counts=self.collectives, kind="fetch_all_gather")
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
        # (a master in CPU shared memory, Hogwild-style: another process's writes move neither this
        # process's version counter nor its write count; nor do writes into a buffer the master
        # aliases (`.data` set to a view of it: ZeroRedundancyOptimizer's bucket views, whose
        # broadcasts move no version counter; meta.unseen): their bytes are made again at every use)
        d = master._data
        unseen = (d.device.type == "cpu" and d.is_shared()) or (bool(meta.unseen) and _storage_id(d) in meta.unseen)
        if not u.fresh(d) or u.cached is None or unseen:
            u.partial()
            u.apply(master._data._version)
            u.cached = u.local_primary()
        return u.cached


_STEP_HOOK = []  # the handle of the one optimizer step post-hook (installed by the first FSDPGroup)


def _install_step_hook():
    if not _STEP_HOOK:
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
        _STEP_HOOK.append(register_optimizer_step_post_hook(_after_optimizer_step))
        _STEP_HOOK.append(register_optimizer_step_pre_hook(_before_optimizer_step))


def _before_optimizer_step(optimizer, args, kwargs):
    """Before any torch.optim step: an optimizer that holds a weight convert() replaced (built
    before convert(), or over a list of the parameters taken before it) would train nothing of
    that linear, silently: it raises."""
    old = [n for g in optimizer.param_groups for p in g["params"]
           if (n := getattr(p, "_mxs_converted_to", None)) is not None]
    if old:
        shown = ", ".join(f"{n or '<root>'}.weight" for n in old[:4]) + (f" and {len(old) - 4} more" if len(old) > 4
                                                                        else "")
        raise RuntimeError(f"mxshard: build the optimizer after convert() (over model.parameters() then): it holds "
                           f"the weights convert() replaced ({shown}: now each converted linear's master "
                           f"Parameter), so it would never train them")


def _after_optimizer_step(optimizer, args, kwargs):
    """After any torch.optim step: the groups whose masters it holds must refresh."""
    from torch.distributed.tensor import DTensor
    groups = {}
    for g in optimizer.param_groups:
        for p in g["params"]:
            m = p._local_tensor if isinstance(p, DTensor) else p
            grp = m._meta.group if isinstance(m, QuantMaster) else None
            if grp is not None:
                groups[id(grp)] = grp
    for grp in groups.values():
        grp.masters_changed()


_FAILED, _STALE = 2, 1   # the refresh's status entry (a MAX: a failure wins)


def _stale_message(name):
    who = f"This rank wrote {name}'s master" if name is not None else "Another rank wrote a master"
    return (f"mxshard: call mxshard.torch.masters_changed(model) on every rank after writing masters outside an "
            f"optimizer step (weight.data writes, an in-place dcp.load into a state_dict; load_state_dict and "
            f"set_model_state_dict call it for you). {who} since its bytes were made, and they need the "
            f"ranks' one reduction, so every rank must know")


def _replaced_message(name, w):
    if type(w) is torch.Tensor:   # torch.func.functional_call / nn.utils.stateless put plain tensors in
        return (f"mxshard: pass torch.func.functional_call a QuantMaster for {name}.weight (e.g. "
                f"{name}.weight.detach().clone() with your values copied in, requires_grad_() for fast weights), "
                f"or leave {name} out of convert(): {name}.weight is a plain tensor here, and a converted linear "
                f"multiplies by the quantized bytes of its master, which a plain tensor does not carry")
    return (f"mxshard: keep a converted weight's Parameter: load values into it (load_state_dict, "
            f"weight.data.copy_(...)) and keep tied weights dense. {name}.weight is a {type(w).__name__}, not the "
            f"module's QuantMaster: it was replaced (a tie, a new Parameter, or torch.func.functional_call with a "
            f"plain tensor for it: pass a QuantMaster there, e.g. {name}.weight.detach().clone() with your "
            f"values copied in, or leave {name} out of convert())")

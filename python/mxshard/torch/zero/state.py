# SPDX-License-Identifier: MIT
"""ShardedOptimizer's state dict, in DCP's form (a mixin of ShardedOptimizer).

    state_dict()   {"format", "step", "masters": {item name: DTensor Shard(0) of its full shape},
                    "state": {item name: {key: DTensor (the master's shape) or scalar}},
                    "param_groups": [options, "params": [item names]]}

Every rank holds its rows of the same tensors, so torch.distributed.checkpoint
(dcp.save / dcp.load of {"optim": opt}, mxt.save_checkpoint) saves each piece
once and reshards on load. load_state_dict() checks everything on every rank
before anything is loaded (one status all-reduce), then writes the model's
weights from the loaded masters.
"""
from __future__ import annotations

import math

import torch

from ... import _lib as L
from . import compat

__all__ = ["FORMAT", "StateDict"]

FORMAT = "mxshard.sharded_optimizer/2"


class StateDict:
    """The state-dict half of ShardedOptimizer (reads its _views, _geoms, inner, comm)."""

    def _mesh(self):
        from torch.distributed.device_mesh import DeviceMesh
        if getattr(self, "_dm", None) is None:
            self._dm = DeviceMesh.from_group(self.comm.group, self.device.type)
        return self._dm

    def _dtensor(self, local, it):
        if not self.comm.active:
            return local
        from torch.distributed.tensor import DTensor, Shard
        shape = (it.rows,) + it.shape[1:]
        stride = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
        return DTensor.from_local(local, self._mesh(), [Shard(0)], run_check=False, shape=torch.Size(shape),
                                  stride=stride)

    def state_dict(self):
        """{"format", "step", "masters": {item name: DTensor}, "state": {item name: {key: DTensor or
        scalar}}, "param_groups": [options, "params": [item names]]}: every rank's part of the same
        tensors (DCP saves and reshards it: mxt.save_checkpoint / dcp.save({"optim": opt}))."""
        compat.refuse_dcp_helpers()
        names = {id(v): self._geoms[b].items[pos] for v, b, pos in self._views}
        state = {}
        for v, st in self.inner.state.items():
            it = names[id(v)]
            state[it.name] = {k: self._dtensor(t, it) if isinstance(t, torch.Tensor) and t.shape == v.shape and t.dim()
                              else t for k, t in st.items()}
        groups = [dict({k: x for k, x in g.items() if k != "params"},
                       params=[names[id(p)].name for p in g["params"]]) for g in self.inner.param_groups]
        return {"format": FORMAT, "step": self.steps,
                "masters": {self._geoms[b].items[pos].name: self._dtensor(v, self._geoms[b].items[pos])
                            for v, b, pos in self._views},
                "state": state, "param_groups": groups}

    def _init_state(self):
        """The inner optimizer's state created (a step with zero gradients and lr 0, as torch's
        DCP helpers do) when empty, so that a DCP load has tensors to load into."""
        if self.inner.state:
            return
        lrs = [g.get("lr") for g in self.inner.param_groups]
        for v, _, _ in self._views:
            v.grad = torch.zeros_like(v)
        try:
            for g in self.inner.param_groups:
                if "lr" in g:
                    g["lr"] = torch.tensor(0.0) if isinstance(g["lr"], torch.Tensor) else 0.0
            self.inner.step()
        finally:
            for g, lr in zip(self.inner.param_groups, lrs):
                if lr is not None:
                    g["lr"] = lr
            self._hold_view_grads()

    def load_state_dict(self, state_dict):
        """Loads state_dict()'s form (the same world, or DCP's resharded load into it), then
        rebuilds the model's weights. Collective: every rank calls it; a rank whose checks fail
        makes every rank raise before anything is loaded anywhere."""
        self._check_open("load_state_dict")
        compat.refuse_dcp_helpers()
        err, plan = None, None
        try:
            plan = self._load_plan(state_dict)
        except Exception as e:  # noqa: BLE001 - the group learns of it first
            err = e
        try:
            self._status(err, "load_state_dict")
        finally:
            err = None
        inner, copies, step = plan
        try:
            self.inner.load_state_dict(inner)
            for dst, src in copies:
                dst.copy_(src)
            self.steps = step
        except Exception as e:  # noqa: BLE001 - the writeback's status entry tells the others
            err = e
        try:
            self._writeback(err)
        finally:
            err = None

    def _load_plan(self, sd):
        """Everything load_state_dict applies, checked, nothing written: (the inner optimizer's
        state dict, [(master view, loaded local rows)], step)."""
        if not isinstance(sd, dict) or sd.get("format") != FORMAT:
            raise ValueError(f"ShardedOptimizer.load_state_dict: load a {FORMAT} state dict (opt.state_dict() or "
                             f"mxt.save_checkpoint's)")
        by_name = {self._geoms[b].items[pos].name: v for v, b, pos in self._views}
        if set(sd["masters"]) != set(by_name):
            raise ValueError("ShardedOptimizer.load_state_dict: build the optimizer over the model that saved "
                             "it: the items differ")
        local = {k: (t.to_local() if hasattr(t, "to_local") else t) for k, t in sd["masters"].items()}
        for k, v in by_name.items():
            if tuple(local[k].shape) != tuple(v.shape):
                raise ValueError(f"ShardedOptimizer.load_state_dict: {k} holds {tuple(local[k].shape)} on this "
                                 f"rank, expected {tuple(v.shape)}; load at another world size with "
                                 f"mxt.load_checkpoint")
        compat.check_inner(self, sd, by_name)
        idx = {}
        for g in self.inner.param_groups:
            for p in g["params"]:
                idx[id(p)] = len(idx)
        inner = {"state": {idx[id(by_name[k])]: {kk: (t.to_local() if hasattr(t, "to_local") else t)
                                                  for kk, t in st.items()}
                           for k, st in sd["state"].items()},
                 "param_groups": [dict({k: x for k, x in g.items() if k != "params"},
                                       params=[idx[id(by_name[n])] for n in g["params"]])
                                  for g in sd["param_groups"]]}
        copies = [(v, local[k]) for k, v in by_name.items() if local[k].data_ptr() != v.data_ptr()]
        return inner, copies, int(sd["step"])

    def _status(self, err, where):
        """One all_reduce(MAX) of every rank's failure flag: this rank raises its own error, the
        others RemoteError (a world of one: its own error)."""
        flag = torch.tensor([1 if err is not None else 0], dtype=torch.int32,
                            device=self.comm.small_device(self.device))
        self.comm.all_reduce(flag, "all_reduce_status", op="max")
        if err is not None:
            raise err
        if int(flag[0]):
            raise L.remote_error(f"ShardedOptimizer.{where} (another rank failed)")

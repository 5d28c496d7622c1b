# SPDX-License-Identifier: MIT
"""The PyTorch habits ShardedOptimizer cannot follow, each detected once and
answered with what to do instead (pure functions; ShardedOptimizer calls them):

- an inner optimizer that is not ELEMENTWISE (Adafactor, Muon, LBFGS,
  SparseAdam, anything factored or matrix-shaped): it is handed flat fp32
  views that span several parameters and cut parameters at shard
  boundaries, so it would silently compute something else;
- a model that is, or contains, a DistributedDataParallel: ShardedOptimizer
  reduces the gradients itself, DDP would reduce them a second time;
- torch.distributed.checkpoint.state_dict (get_state_dict, set_state_dict,
  get_optimizer_state_dict, ...): the inner optimizer's parameters are
  shards of the masters, not the model's parameters, so DCP cannot name
  them: mxt.save_checkpoint / load_checkpoint are DCP underneath;
- ranks built with different configurations: PlanMismatchError, said in the
  terms of the Python call;
- opt.load_state_dict of another rank's, world size's or configuration's
  state dict (torch.distributed.checkpoint.save of opt.state_dict() gives
  back one rank's copy): what to load instead, and the first difference.
"""
from __future__ import annotations

import sys

import torch

from ... import _lib as L


__all__ = ["ELEMENTWISE", "FACTORY_NOTE", "check_elementwise", "check_not_ddp", "called_from_dcp_state_dict",
           "dcp_error", "plan_mismatch", "check_state_identity"]

# torch.optim's elementwise optimizers: the update of an element depends only on its own
# gradient and state and on scalars (step count, hyper-parameters), so stepping a vector
# cut anywhere into views equals stepping it whole (test_torch_optim_habits checks each).
ELEMENTWISE = tuple(getattr(torch.optim, n) for n in ("SGD", "Adam", "AdamW", "Adamax", "NAdam", "RAdam",
                                                       "Adagrad", "Adadelta", "RMSprop", "ASGD", "Rprop")
                    if hasattr(torch.optim, n))

# torch.distributed.checkpoint's state_dict helpers, and dcp.save / dcp.load, which call a Stateful's
# state_dict() / load_state_dict() (an optimizer is one): from either, ShardedOptimizer's rank-local
# dict would be taken for replicated (DCP keeps one rank's copy of a plain tensor)
_DCP_MODULES = ("torch.distributed.checkpoint.state_dict", "torch.distributed.checkpoint.state_dict_saver",
                "torch.distributed.checkpoint.state_dict_loader")

# added to an exception of optimizer_factory (Muon refuses 1-D parameters, for one)
FACTORY_NOTE = ("ShardedOptimizer: optimizer_factory raised. It is given param groups of this rank's rows of each "
                "parameter (fp32 [rows, ...] views of the master shards, FSDP2's dim-0 chunks; some may be empty), "
                "so the inner optimizer must be elementwise: torch.optim.SGD, Adam, AdamW, Adamax, NAdam, RAdam, "
                "Adagrad, Adadelta, RMSprop, ASGD or Rprop")


def check_elementwise(inner, assume):
    """Raises TypeError unless `inner` is one of ELEMENTWISE (or a subclass), or `assume` is True."""
    if assume or isinstance(inner, ELEMENTWISE):
        return
    names = ", ".join(c.__name__ for c in ELEMENTWISE)
    raise TypeError(f"ShardedOptimizer: the inner optimizer {type(inner).__name__} is not known to be elementwise. "
                    f"It is given this rank's rows of each parameter (FSDP2's dim-0 chunks), so an optimizer whose update of an element depends on other elements or on the "
                    f"parameters' shapes (factored or matrix-shaped: Adafactor, Muon, Shampoo; LBFGS; SparseAdam) "
                    f"would silently compute something else. Use an elementwise one (torch.optim.{names}); if "
                    f"{type(inner).__name__} is elementwise, pass assume_elementwise=True")


def check_not_ddp(model):
    """Raises ValueError when `model` is, or contains, a DistributedDataParallel."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    for name, m in model.named_modules():
        if isinstance(m, DDP):
            where = "the model is" if not name else f"the model contains ({name!r})"
            raise ValueError(f"ShardedOptimizer: {where} a DistributedDataParallel. ShardedOptimizer reduces the "
                             f"gradients itself (its backward hooks reduce each bucket); DDP would reduce them a "
                             f"second time. Build the optimizer on the bare model and do not wrap it in DDP "
                             f"(DDP's no_sync(): use opt.no_sync())")


def called_from_dcp_state_dict(depth=8):
    """True when one of the `depth` callers of our caller is in
    torch.distributed.checkpoint.state_dict (its get_state_dict initialises an
    optimizer's state by calling step() with zero gradients, then reads
    state_dict() in torch.optim's form), or in dcp.save / dcp.load (they call a
    Stateful's state_dict(): this rank's shards, which DCP would take for a
    replicated tensor and keep from one rank only)."""
    f = sys._getframe(2)
    for _ in range(depth):
        if f is None:
            return False
        if f.f_globals.get("__name__") in _DCP_MODULES:
            return True
        f = f.f_back
    return False


def dcp_error():
    return NotImplementedError(
        "Use mxt.save_checkpoint(path, model, opt) / mxt.load_checkpoint(path, model, opt) for a ShardedOptimizer "
        "(DCP underneath, any DP size). torch.distributed.checkpoint.state_dict's helpers (get_state_dict, "
        "set_state_dict, get_optimizer_state_dict, set_optimizer_state_dict) and dcp.save / dcp.load of the optimizer "
        "do not work with it: the inner optimizer's parameters are shards of the fp32 masters, not the model's "
        "parameters, so DCP cannot name them, and its state_dict() is this rank's part only")


def plan_mismatch(rank, diff):
    """The PlanMismatchError of ranks whose configurations differ (rank 0 vs `rank`: `diff`)."""
    code = L.host_lib().codes.get("MXS_ERR_PLAN_MISMATCH", 9)
    return L.PlanMismatchError(
        code, "MXS_ERR_PLAN_MISMATCH",
        f"configuration differs between ranks (rank 0 vs rank {rank}: {diff}). Every rank must build the same model "
        f"(the same trainable parameters and quantized linears, in the same order, shapes and formats) and pass "
        f"the same arguments (bucket_size, align, grad_reduce, grad_dtype, max_grad_norm, round_through, rounding, "
        f"param_groups and their options, the inner optimizer and its hyper-parameters)", "ShardedOptimizer")


def check_state_identity(sd, world, rank, fingerprint, config):
    """ValueError unless state dict `sd` was saved at this world size, by this rank, with this
    configuration (`fingerprint`; `config`: the plan's describe() lines, to name the first
    difference)."""
    reshard = ("mxt.save_checkpoint / mxt.load_checkpoint, which save every rank's part through "
               "torch.distributed.checkpoint and load it at any world size")
    if sd.get("world") != world:
        raise ValueError(f"load_state_dict: load a state dict saved at this world size ({world}), or use "
                         f"{reshard}; it was saved at {sd.get('world')!r}")
    if sd.get("rank") != rank:
        raise ValueError(f"load_state_dict: load this rank's own state dict (opt.state_dict() holds one rank's "
                         f"master shards: torch.save it per rank, e.g. f'opt-{{rank}}.pt'), or use {reshard}. "
                         f"This is rank {rank}, the state dict rank {sd.get('rank')!r}'s "
                         f"(torch.distributed.checkpoint.save of opt.state_dict() keeps one rank's copy)")
    if sd.get("fingerprint") != fingerprint:
        saved = sd.get("config")
        diff = None
        raise ValueError(f"load_state_dict: build the ShardedOptimizer as the one that saved the state dict (the "
                         f"same model, param groups and options), or use mxt.load_checkpoint, which loads "
                         f"across bucket sizes and world sizes and restores the saved lr; the configurations "
                         f"differ" + (f": saved {diff}" if diff else
                                      f" (fingerprint {sd.get('fingerprint')!r}, this optimizer's {fingerprint!r})"))


def check_inner(opt, inner):
    """The inner optimizer's part: its groups and, per parameter (a view of a master shard), state
    tensors of the view's shape (scalars aside) and, where this optimizer has state already, the
    same keys; numeric options stay numbers. (A wrong one was loaded over everything and the next
    step() raised.)"""
    first = "load_state_dict: give a state dict this optimizer's state_dict() made (the same world, " \
            "rank and configuration): "
    cur = opt.inner.state_dict()
    if not isinstance(inner, dict) or not isinstance(inner.get("state"), dict) \
            or not isinstance(inner.get("param_groups"), list) \
            or len(inner["param_groups"]) != len(cur["param_groups"]):
        raise ValueError(first + f"'inner' must be the inner optimizer's state_dict() with "
                                 f"{len(cur['param_groups'])} param group(s)")
    views = [v for *_, v in opt._inner_params()]
    for i, st in inner["state"].items():
        if not isinstance(i, int) or not 0 <= i < len(views) or not isinstance(st, dict):
            raise ValueError(first + f"inner state has an entry {i!r} for no parameter of it")
        for k, t in st.items():
            if isinstance(t, torch.Tensor) and t.dim() > 0 and tuple(t.shape) != tuple(views[i].shape):
                raise ValueError(first + f"inner state {k!r} of parameter {i} has shape {tuple(t.shape)}, "
                                         f"the shard view {tuple(views[i].shape)}")
        if i in cur["state"] and set(cur["state"][i]) != set(st):
            raise ValueError(first + f"inner state of parameter {i} has keys {sorted(st)}, this optimizer's "
                                     f"{sorted(cur['state'][i])}")
    for g, (new, old) in enumerate(zip(inner["param_groups"], cur["param_groups"])):
        if not isinstance(new, dict):
            raise ValueError(first + f"inner param group {g} is a {type(new).__name__}")
        for k, v in old.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k in new \
                    and (isinstance(new[k], bool) or not isinstance(new[k], (int, float, torch.Tensor))):
                raise ValueError(first + f"inner param group {g}'s {k!r} is {new[k]!r}, not a number")

# SPDX-License-Identifier: MIT
"""The PyTorch habits ShardedOptimizer cannot follow, each detected once and
answered with what to do instead (pure functions; ShardedOptimizer calls them):

- an inner optimizer that is not ELEMENTWISE (Adafactor, Muon, LBFGS,
  SparseAdam, anything factored or matrix-shaped): it is handed this rank's
  rows of each parameter, so it would silently compute something else;
- a model that is, or contains, a DistributedDataParallel: ShardedOptimizer
  reduces the gradients itself, DDP would reduce them a second time;
- ranks built with different configurations: PlanMismatchError, said in the
  terms of the Python call.
"""
from __future__ import annotations

import torch

from ... import _lib as L


__all__ = ["ELEMENTWISE", "FACTORY_NOTE", "check_elementwise", "check_not_ddp", "plan_mismatch",
           "refuse_dcp_helpers"]

# torch.optim's elementwise optimizers: the update of an element depends only on its own
# gradient and state and on scalars (step count, hyper-parameters), so stepping a vector
# cut anywhere into views equals stepping it whole (test_torch_optim_habits checks each).
ELEMENTWISE = tuple(getattr(torch.optim, n) for n in ("SGD", "Adam", "AdamW", "Adamax", "NAdam", "RAdam",
                                                       "Adagrad", "Adadelta", "RMSprop", "ASGD", "Rprop")
                    if hasattr(torch.optim, n))

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
                    f"It is given this rank's rows of each parameter (FSDP2's dim-0 chunks), so an optimizer "
                    f"whose update of an element depends on other elements or on the "
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


def refuse_dcp_helpers(depth=6):
    """Raises NotImplementedError when one of the `depth` callers of our caller is in
    torch.distributed.checkpoint.state_dict: its get_state_dict / set_state_dict (and the
    optimizer-only ones) map the optimizer's parameters to the model's by identity, and
    ShardedOptimizer's are this rank's rows of the fp32 masters (a KeyError deep in torch)."""
    import sys
    f = sys._getframe(2)
    for _ in range(depth):
        if f is None:
            return
        if f.f_globals.get("__name__") == "torch.distributed.checkpoint.state_dict":
            raise NotImplementedError(
                "Use mxt.save_checkpoint(path, model, opt) / mxt.load_checkpoint(path, model, opt) for a "
                "ShardedOptimizer (or dcp.save / dcp.load of {'optim': opt}: its state_dict() is DCP's form). "
                "torch.distributed.checkpoint.state_dict's helpers (get_state_dict, set_state_dict, "
                "get_optimizer_state_dict, set_optimizer_state_dict) name the optimizer's parameters by the model's, "
                "and its parameters are this rank's rows of the fp32 masters, not the model's parameters")
        f = f.f_back


def plan_mismatch(rank, diff):
    """The PlanMismatchError of ranks whose configurations differ (rank 0 vs `rank`: `diff`)."""
    code = L.host_lib().codes.get("MXS_ERR_PLAN_MISMATCH", 9)
    return L.PlanMismatchError(
        code, "MXS_ERR_PLAN_MISMATCH",
        f"configuration differs between ranks (rank 0 vs rank {rank}: {diff}). Every rank must build the same model "
        f"(the same trainable parameters and quantized linears, in the same order, shapes and formats) and pass "
        f"the same arguments (bucket_size, align, grad_reduce, grad_dtype, max_grad_norm, round_through, rounding, "
        f"param_groups and their options, the inner optimizer and its hyper-parameters)", "ShardedOptimizer")


def check_inner(opt, sd, by_name):
    """ValueError unless state dict `sd`'s inner part fits: as many param groups, each a dict; per item
    (by_name: {item name: its master view}) state tensors of the view's shape on this rank (scalars
    aside) and, where the inner optimizer has state already, the same keys; numeric options stay
    numbers. (A wrong one was loaded over everything and the next step() raised.)"""
    first = "ShardedOptimizer.load_state_dict: give a state dict this optimizer's state_dict() made (the same " \
            "model and configuration; another world size: mxt.load_checkpoint): "
    groups, state = sd.get("param_groups"), sd.get("state")
    cur = opt.inner.param_groups
    if not isinstance(state, dict) or not isinstance(groups, list) or len(groups) != len(cur):
        raise ValueError(first + f"'state' must be a dict and 'param_groups' a list of {len(cur)} group(s)")
    for name, st in state.items():
        if name not in by_name or not isinstance(st, dict):
            raise ValueError(first + f"inner state has an entry {name!r} for no item of it")
        v = by_name[name]
        for k, t in st.items():
            t = t.to_local() if hasattr(t, "to_local") else t
            if isinstance(t, torch.Tensor) and t.dim() > 0 and tuple(t.shape) != tuple(v.shape):
                raise ValueError(first + f"inner state {k!r} of {name} has shape {tuple(t.shape)} on this rank, "
                                         f"the master's rows {tuple(v.shape)}")
        have = opt.inner.state.get(v)
        if have and set(have) != set(st):
            raise ValueError(first + f"inner state of {name} has keys {sorted(st)}, this optimizer's {sorted(have)}")
    for g, (new, old) in enumerate(zip(groups, cur)):
        if not isinstance(new, dict):
            raise ValueError(first + f"param group {g} is a {type(new).__name__}")
        for k, v in old.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k in new \
                    and (isinstance(new[k], bool) or not isinstance(new[k], (int, float, torch.Tensor))):
                raise ValueError(first + f"param group {g}'s {k!r} is {new[k]!r}, not a number")

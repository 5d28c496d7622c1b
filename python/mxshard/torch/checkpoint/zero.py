# SPDX-License-Identifier: MIT
"""ShardedOptimizer's checkpoints: torch.distributed.checkpoint (DCP) of the
optimizer as a Stateful (its state_dict(): every master and inner state
tensor a DTensor Shard(0) of its full shape, keyed by the item's name) and
the model's other state (buffers, frozen parameters). DCP reshards: a
checkpoint saved at one world size loads at any other.

    save_checkpoint(path, model, opt)   collective: every rank of opt's group
    load_checkpoint(path, model, opt)   collective; then the model's weights are the
                                        loaded masters' (one writeback)
"""
from __future__ import annotations

FORMAT = "mxshard.checkpoint/2"

__all__ = ["FORMAT", "save_checkpoint", "load_checkpoint"]


def _model_state(model, opt):
    """The model's state the optimizer does not hold: buffers and frozen parameters."""
    trained = {it.name for it in opt._items}
    sd = model.state_dict(keep_vars=True)
    return {k: v.detach() for k, v in sd.items() if k not in trained and hasattr(v, "detach")}


def _check(model, opt, where):
    from ..zero.optim import ShardedOptimizer
    if not isinstance(opt, ShardedOptimizer):
        raise TypeError(f"{where}: pass the model's ShardedOptimizer (for torch.optim or FSDP2, save with "
                        f"torch.distributed.checkpoint directly), got {type(opt).__name__}")
    if opt._model_ref is None or opt._model_ref() is not model:
        raise ValueError(f"{where}: pass the model this ShardedOptimizer was built on")


def save_checkpoint(path, model, opt):
    """Writes `model` and its ShardedOptimizer `opt` to the DCP directory `path` (collective)."""
    import torch.distributed.checkpoint as dcp
    _check(model, opt, "save_checkpoint")
    dcp.save({"model": _model_state(model, opt), "optim": opt}, checkpoint_id=str(path),
             process_group=opt.comm.group)


def load_checkpoint(path, model, opt):
    """Loads a save_checkpoint() directory into `model` and `opt`, at any world size (collective)."""
    import torch.distributed.checkpoint as dcp
    _check(model, opt, "load_checkpoint")
    opt._init_state()
    state = {"model": _model_state(model, opt), "optim": opt}
    dcp.load(state, checkpoint_id=str(path), process_group=opt.comm.group)

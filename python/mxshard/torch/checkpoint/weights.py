# SPDX-License-Identifier: MIT
"""load_checkpoint_weights: the weights of a ShardedOptimizer checkpoint (mxt.save_checkpoint) into a
model that no ShardedOptimizer holds, to train it on with torch.optim or FSDP2, or to evaluate it:

    mxt.save_checkpoint(path, model, opt)                 # trained under ShardedOptimizer
    model = mxt.convert(build(), policy)                  # later, anywhere: one process, any world size
    mxt.load_checkpoint_weights(path, model)              # the FP32 masters, exactly

A convert()ed model takes the FP32 masters (`master/<name>`: a converted linear's weight is its
master, bit for bit: the bytes it computes with are the same quantization), a plain one the same
values; dense parameters take their master in their dtype (the optimizer's writeback), the rest
of the state dict `model/<name>`. The optimizer's state does not move. No collectives (DCP's
no_dist read): every rank, or one process, may call it. Every key read is checked against the
checkpoint record's checksum.
"""
from __future__ import annotations

import os

import torch
from torch import nn

from .errors import CheckpointError, CheckpointMismatchError
from .export import checksum
from .zero import _META, _dcp_error, _quiet_dcp, _unseal

__all__ = ["load_checkpoint_weights"]


def _tied_to_loaded(name, target, loaded):
    t = target[name]
    return any(n in loaded and target[n].data_ptr() == t.data_ptr() and target[n].shape == t.shape for n in target)


def load_checkpoint_weights(path, model, *, strict=True):
    """Loads the weights of checkpoint `path` (mxt.save_checkpoint) into `model`, a convert()ed or
    plain model that no ShardedOptimizer holds and fully_shard has not sharded (the module doc).
    Everything is checked before anything is written: strict=True raises CheckpointMismatchError
    for a name either side lacks (a tie counts as loaded), and any size that differs. Returns
    load_state_dict's (missing_keys, unexpected_keys)."""
    who = "load_checkpoint_weights"
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{who}: pass path as a str or os.PathLike, got {type(path).__name__}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"{who}: pass an nn.Module as model, got {type(model).__name__}")
    from ..zero.grads import module_owner
    if any(module_owner(m) is not None for m in model.modules()):
        raise CheckpointError(f"{who}: load into a model that convert() made (or a plain one), not one a "
                              f"ShardedOptimizer holds: for that, mxt.load_checkpoint(path, model, opt)")
    from torch.distributed.tensor import DTensor
    if any(isinstance(p, DTensor) for p in model.parameters()):
        raise CheckpointError(f"{who}: load the weights before fully_shard (every rank may load them: no "
                              f"collectives): the model's parameters are FSDP2 shards now")
    import torch.distributed.checkpoint as dcp
    reader = dcp.FileSystemReader(os.fspath(path))
    try:
        md = reader.read_metadata()
    except Exception as e:  # noqa: BLE001
        raise CheckpointError(f"{who}: give the folder of a mxt.save_checkpoint checkpoint: {os.fspath(path)!r} "
                              f"has no readable checkpoint metadata ({type(e).__name__}: {e})") from e
    if _META not in md.state_dict_metadata:
        raise CheckpointError(f"{who}: give the folder of a mxt.save_checkpoint checkpoint: {os.fspath(path)!r} "
                              f"holds no ShardedOptimizer weights (a plain DCP checkpoint loads with dcp.load and "
                              f"set_model_state_dict)")
    found = {}
    for key, meta in md.state_dict_metadata.items():
        kind, _, name = key.partition("/")
        if kind in ("master", "model") and hasattr(meta, "size"):
            found[name] = (key, meta)
    target = model.state_dict()
    missing = [n for n in target if n not in found and not _tied_to_loaded(n, target, found)]
    unexpected = [n for n in found if n not in target]
    if strict and (missing or unexpected):
        raise CheckpointMismatchError(f"{who}: build the model the checkpoint was saved from (the same names): "
                                      f"{len(missing)} name(s) the checkpoint lacks {missing[:3]}, {len(unexpected)} "
                                      f"the model lacks {unexpected[:3]} (strict=False loads the rest)")
    bufs = {}
    for n, t in target.items():
        if n in found:
            key, meta = found[n]
            if meta.size.numel() != t.numel():
                raise CheckpointMismatchError(f"{who}: build the model the checkpoint was saved from: {n}: the "
                                              f"checkpoint has {tuple(meta.size)}, the model {tuple(t.shape)}")
            bufs[key] = torch.empty(meta.size, dtype=meta.properties.dtype)
    bufs[_META] = torch.zeros(md.state_dict_metadata[_META].size, dtype=torch.uint8)
    try:
        with _quiet_dcp():
            dcp.load(bufs, storage_reader=reader, no_dist=True)
    except BaseException as e:  # noqa: BLE001 - DCP's CheckpointException is a BaseException
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        raise CheckpointError(f"{who}: give a complete checkpoint folder: reading {os.fspath(path)!r} failed (a "
                              f"missing, truncated or damaged file?): {_dcp_error(e)}") from None
    keys = _unseal(bufs.pop(_META)).get("keys", {})   # (the record's own sha256 is checked)
    for key, t in bufs.items():
        if key not in keys or checksum(t) != keys[key][2]:
            raise CheckpointError(f"{who}: give an undamaged checkpoint: {key} does not match its checksum in the "
                                  f"checkpoint's record (a modified or damaged file); nothing was loaded")
    sd = {n: bufs[found[n][0]].view(t.shape).to(t.dtype) for n, t in target.items() if n in found}
    return model.load_state_dict(sd, strict=False)

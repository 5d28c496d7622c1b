# SPDX-License-Identifier: MIT
"""load_checkpoint_weights: the weights of a ShardedOptimizer checkpoint (mxt.save_checkpoint) into a
model that no ShardedOptimizer holds, to train it on with torch.optim or FSDP2, or to evaluate it:

    mxt.save_checkpoint(path, model, opt)                 # trained under ShardedOptimizer
    model = mxt.convert(build(), policy)                  # later, anywhere: one process, any world size
    mxt.load_checkpoint_weights(path, model)              # the FP32 masters, exactly; then
    opt = torch.optim.AdamW(model.parameters())           # or fully_shard(model) first

A convert()ed model takes the FP32 masters (`master/<name>`: its converted linears' weights, bit
for bit: the bytes they compute with are the same quantization), a plain one the same values
(the masters are the values of its nn.Linear weights); dense parameters (`dense/<name>`) and the
rest of the state dict (`model/<name>`) load as they are. The optimizer's state does not move
(it is the shards' of another optimizer). No collectives: every rank, or one process, may call it.
"""
from __future__ import annotations

import os

import torch
from torch import nn

from ..zero.linear import is_quantized
from . import pieces as P
from .errors import CheckpointError, CheckpointMismatchError
from .zero import _META, _unseal

__all__ = ["load_checkpoint_weights"]

_KINDS = ("master", "dense", "model")   # the weight keys of zero.py's checkpoint (its module doc)


def _tied_to_loaded(name, target, loaded):
    """A state dict name the checkpoint holds under another name: the same tensor (a tie)."""
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
        raise TypeError(f"{who}: path must be a str or os.PathLike, got {type(path).__name__}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"{who}: model must be an nn.Module, got {type(model).__name__}")
    if any(is_quantized(m) for m in model.modules()):
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
    found = {}
    for key, meta in md.state_dict_metadata.items():
        kind, _, name = key.partition("/")
        if kind in _KINDS and hasattr(meta, "size"):
            found[name] = (key, meta)
    if _META not in md.state_dict_metadata or \
            not any(k.startswith("master/") or k.startswith("dense/") for k in md.state_dict_metadata):
        raise CheckpointError(f"{who}: give the folder of a mxt.save_checkpoint checkpoint: {os.fspath(path)!r} "
                              f"holds no ShardedOptimizer weights (a plain DCP checkpoint loads with dcp.load and "
                              f"set_model_state_dict)")
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
                raise CheckpointMismatchError(f"{who}: {n}: the checkpoint has {meta.size.numel()} elements, the "
                                              f"model {tuple(t.shape)}")
            bufs[key] = torch.empty(meta.size, dtype=meta.properties.dtype)
    raw = bufs[_META] = torch.zeros(int(md.state_dict_metadata[_META].size[0]), dtype=torch.uint8)
    try:
        dcp.load(bufs, storage_reader=reader, no_dist=True)
    except BaseException as e:  # noqa: BLE001 - DCP's CheckpointException is a BaseException
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        raise CheckpointError(f"{who}: give a complete checkpoint folder: reading {os.fspath(path)!r} failed (a "
                              f"missing, truncated or damaged file?): {P.dcp_error(e)}") from None
    keys = _unseal(raw.numpy().tobytes()).get("keys", {})   # (the record's own sha256 is checked)
    for key, t in bufs.items():
        if key != _META and (key not in keys or P.checksum(t, 0) != keys[key][2]):
            raise CheckpointError(f"{who}: give an undamaged checkpoint: {key} does not match its checksum in the "
                                  f"checkpoint's record (a modified or damaged file); nothing was loaded")
    sd = {n: bufs[found[n][0]].view(t.shape).to(t.dtype) for n, t in target.items() if n in found}
    return model.load_state_dict(sd, strict=False)

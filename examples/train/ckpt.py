# SPDX-License-Identifier: MIT
"""The example's checkpoint glue; the checkpoints themselves are the library's
(mxshard.torch.save_checkpoint / load_checkpoint: a torch.distributed.checkpoint
directory, each rank writing its shard, loadable under any DP size;
export_safetensors: one plain file of the model for inference).

    save(path, model, opt, step, a)     -> collective; `extra` = the loop's position and data settings
    load(path, model, opt, a)           -> the step to resume at (collective; raises on any mismatch)
    export(path, model)
    read_dcp(path)                      -> {key: value} of a checkpoint directory, in one process
"""
from __future__ import annotations

import json
import os
import tempfile


def _lib(name):
    import mxshard.torch as mxt
    f = getattr(mxt, name, None)
    if f is None:
        raise SystemExit(f"mxshard.torch.{name} is not available in this mxshard (the DCP checkpoint API, "
                         f"python/mxshard/torch/checkpoint/)")
    return f


def _extra(a, step, world):
    return {"step": int(step), "dp": int(world), "data_seed": int(a.data_seed), "markov_alpha": float(a.markov_alpha),
            "variant": a.variant, "config": json.dumps(a.cfg, sort_keys=True)}


def save(path, model, opt, step, a, world):
    _lib("save_checkpoint")(path, model, opt, extra=_extra(a, step, world))


def load(path, model, opt, a):
    """Loads (the library rebuilds the primaries from the masters and compares
    them byte for byte with the saved ones: a mismatch raises) and checks that the
    data settings match. Returns (step, saved extra)."""
    extra = _lib("load_checkpoint")(path, model, opt)
    want = _extra(a, 0, 0)
    for k in ("data_seed", "markov_alpha", "variant", "config"):
        if extra.get(k) != want[k]:
            raise SystemExit(f"checkpoint {path}: {k}={extra.get(k)!r}, this run has {want[k]!r}")
    return int(extra["step"]), extra


def export(path, model):
    _lib("export_safetensors")(path, model)


def read_dcp(path):
    """Every entry of a torch.distributed.checkpoint directory, in one process
    (no process group), nested containers flattened: {dotted key: value}."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    with tempfile.TemporaryDirectory() as tmp:
        f = os.path.join(tmp, "ckpt.pt")
        dcp_to_torch_save(path, f)
        sd = torch.load(f, map_location="cpu", weights_only=False)
    out = {}

    def walk(prefix, v):
        if isinstance(v, dict):
            for k, x in v.items():
                walk(f"{prefix}.{k}" if prefix else str(k), x)
        elif isinstance(v, (list, tuple)) and any(isinstance(x, (dict, torch.Tensor)) for x in v):
            for i, x in enumerate(v):
                walk(f"{prefix}.{i}", x)
        else:
            out[prefix] = v
    walk("", sd)
    return out

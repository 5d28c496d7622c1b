# SPDX-License-Identifier: MIT
"""Checkpoints and export, whichever way the model trained.

    save_checkpoint / load_checkpoint   ShardedOptimizer's resharding DCP checkpoints (zero.py;
                                        group.py: the every-rank rendezvous and the verdicts)
    export_safetensors / load_safetensors
                                        one safetensors file holding the bytes every converted
                                        linear computes with (export.py)
    load_checkpoint_weights             such a checkpoint's weights into a model no ShardedOptimizer
                                        holds: to train on with torch.optim or FSDP2 (weights.py)
    CheckpointError, CheckpointMismatchError (errors.py)

A model under FSDP2 or plain torch.optim checkpoints with plain DCP: its
state dict holds the masters as ordinary tensors.
"""
from .errors import CheckpointError, CheckpointMismatchError
from .export import EXPORT_FORMAT, export_safetensors, load_safetensors
from .weights import load_checkpoint_weights
from .zero import FORMAT, load_checkpoint, save_checkpoint

__all__ = ["save_checkpoint", "load_checkpoint", "load_checkpoint_weights", "export_safetensors", "load_safetensors",
           "EXPORT_FORMAT", "FORMAT", "CheckpointError", "CheckpointMismatchError"]

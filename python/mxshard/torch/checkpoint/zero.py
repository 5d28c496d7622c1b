# SPDX-License-Identifier: MIT
"""WIP: ShardedOptimizer checkpoints through DCP (opt is a Stateful)."""
FORMAT = "mxshard.checkpoint/2"


def save_checkpoint(path, model, opt, **kw):
    import torch.distributed.checkpoint as dcp
    dcp.save({"optim": opt}, checkpoint_id=str(path))


def load_checkpoint(path, model, opt, **kw):
    import torch.distributed.checkpoint as dcp
    dcp.load({"optim": opt}, checkpoint_id=str(path))

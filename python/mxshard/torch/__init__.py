# SPDX-License-Identifier: MIT
"""mxshard.torch: MXFP8 and NVFP4 weights for PyTorch models, one converted weight for every loop.

    import torch, mxshard.torch as mxt
    model = mxt.convert(model, {"*.mlp.*": "row", "*.attn.*": "both"})   # nn.Linear -> MXFP8ParamLinear
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)                 # one process, or after fully_shard
    # or: opt = mxt.ShardedOptimizer(model, lambda groups: torch.optim.AdamW(groups, lr=1e-3))   (ZeRO-1)
    for x, y in data:
        loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    mxt.export_safetensors("model.safetensors", model)   # the bytes the forward multiplied by

The package, floor by floor (each imports only from the floors below it):

    face        convert.py (convert), options.py (the options' checks), __init__.py
    zero/       ShardedOptimizer: ZeRO-1 over the same converted model (FSDP2's pieces)
    checkpoint/ ShardedOptimizer's resharding DCP checkpoints; export_safetensors / load_safetensors
    fsdp/       MXFP8ParamLinear / NVFP4ParamLinear, QuantMaster, FSDP2's all-gather of the bytes
    gemm/       the GEMM paths (dequantize reference, Triton kernels reading the planes)
    below       mxshard (the formats, the writeback, mxshard.collectives: every collective)

docs/architecture.md draws it.
"""
from .checkpoint import (CheckpointError, CheckpointMismatchError, export_safetensors, load_checkpoint,
                         load_checkpoint_weights, load_safetensors, save_checkpoint)
from .convert import MXFP8Linear, NVFP4Linear, convert
from .fsdp.linear import (MXFP8ParamLinear, NVFP4ParamLinear, dequantized_weight, is_mxfp8, is_nvfp4, is_param_linear,
                          masters_changed)
from .fsdp.master import QuantMaster
from .zero.optim import ShardedOptimizer

__all__ = ["MXFP8Linear", "NVFP4Linear", "is_mxfp8", "is_nvfp4", "MXFP8ParamLinear", "NVFP4ParamLinear", "QuantMaster", "dequantized_weight",
           "masters_changed",
           "is_param_linear", "convert", "ShardedOptimizer", "save_checkpoint",
           "load_checkpoint", "load_checkpoint_weights", "export_safetensors", "load_safetensors", "CheckpointError",
           "CheckpointMismatchError"]

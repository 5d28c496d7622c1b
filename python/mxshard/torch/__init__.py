# SPDX-License-Identifier: MIT
"""mxshard.torch: MXFP8 and NVFP4 linears and a sharded optimizer for PyTorch models.

    import torch, mxshard.torch as mxt
    model = mxt.convert(model, policy="row")          # nn.Linear -> MXFP8Linear (weights as MXFP8 primaries)
    opt = mxt.ShardedOptimizer(model, lambda groups: torch.optim.AdamW(groups, lr=1e-3))
    for x, y in data:
        loss = loss_fn(model(x), y)
        loss.backward()                                # per-bucket gradient reductions start in the hooks
        opt.step()                                     # sharded fp32 update, then the MXFP8 writeback
        opt.zero_grad()

convert(model, policy, format="nvfp4", block="1x16") makes NVFP4Linear
modules instead (weights as NVFP4 primaries). Under torch.distributed (gloo
or NCCL) every rank runs the same script; without it the optimizer is a
world of one. MXFP8Linear and is_mxfp8 live in mxshard.torch.linear, convert
in mxshard.torch.convert, NVFP4Linear and is_nvfp4 in
mxshard.torch.nvfp4_linear, ShardedOptimizer in
mxshard.torch.optim, the pure bucket geometry in mxshard.torch.layout,
resharding DCP checkpoints in mxshard.torch.checkpoint, the safetensors
export and its loader in mxshard.torch.export (both re-exported by
mxshard.torch.checkpoint).
"""
from .linear import MXFP8Linear, is_mxfp8
from .convert import convert
from .fsdp_linear import MXFP8ParamLinear, NVFP4ParamLinear, dequantized_weight, is_param_linear, masters_changed
from .fsdp_master import QuantMaster
from .nvfp4_linear import NVFP4Linear, is_nvfp4
from .optim import ShardedOptimizer
from .checkpoint import (CheckpointError, CheckpointMismatchError, export_safetensors, load_checkpoint, load_safetensors,
                         save_checkpoint)

__all__ = ["MXFP8Linear", "NVFP4Linear", "MXFP8ParamLinear", "NVFP4ParamLinear", "QuantMaster", "dequantized_weight",
           "masters_changed",
           "is_param_linear", "convert", "is_mxfp8", "is_nvfp4", "ShardedOptimizer", "save_checkpoint",
           "load_checkpoint", "export_safetensors", "load_safetensors", "CheckpointError", "CheckpointMismatchError"]

# SPDX-License-Identifier: MIT
"""A small GPT (pre-norm, learned positions, GELU MLP, untied output head)
written functionally: the parameters are not nn.Parameters but views into
the training loop's buffers, handed in every step by a ParamStore.

Linear weights [out, in] go through WeightLinear, whose backward takes the
weight it multiplies grad_out by from the store:

  * BF16 weights: the bf16 parameter itself (forward and backward);
  * row-only MXFP8 primaries: the row-wise plane dequantized to bf16, in the
    forward and again in the backward (nothing bf16 is kept between them:
    this is the high-precision backward override);
  * bidirectional MXFP8 primaries: the row-wise plane in the forward, the
    column-wise plane (blocks down the `out` dimension, the one the backward
    GEMM reduces over) in the backward: grad_in = grad_out @ dequant(col).

GEMMs are torch.matmul in bf16 on dequantized weights; no FP8 GEMM is used
(an FP8 GEMM would read the same planes). The weight gradient grad_out^T @ x
(bf16, fp32 accumulation inside the GEMM) is written into the parameter's
slice of the flat FP32 gradient buffer, as Megatron's main_grad.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from shard import KIND_BOTH, KIND_DENSE, KIND_ROW, ParamSpec


@dataclass
class GPTConfig:
    vocab: int = 256
    seq: int = 256
    d: int = 512
    layers: int = 4
    heads: int = 8
    mlp: int = 4
    attn: str = "math"   # "math" (explicit softmax; deterministic) | "sdpa"


def param_specs(cfg: GPTConfig, variant: str, bidir: set[str]):
    """Parameters in module order. variant 'mxfp8': the block linears are MXFP8
    primaries (row-only, or bidirectional when named in `bidir`); 'bf16': all dense."""
    std = 0.02
    out_std = 0.02 / math.sqrt(2 * cfg.layers)
    d, h = cfg.d, cfg.mlp * cfg.d

    def lin(name, shape, s):
        if variant == "bf16":
            kind = KIND_DENSE
        else:
            kind = KIND_BOTH if name in bidir or "*" in bidir else KIND_ROW
        return ParamSpec(name, shape, kind, True, f"normal:{s}", linear=True)

    specs = [ParamSpec("wte", (cfg.vocab, d), KIND_DENSE, False, f"normal:{std}"),
             ParamSpec("wpe", (cfg.seq, d), KIND_DENSE, False, f"normal:{std}")]
    for i in range(cfg.layers):
        p = f"h{i}."
        specs += [ParamSpec(p + "ln1.w", (d,), KIND_DENSE, False, "ones"),
                  ParamSpec(p + "ln1.b", (d,), KIND_DENSE, False, "zeros"),
                  lin(p + "qkv", (3 * d, d), std),
                  lin(p + "proj", (d, d), out_std),
                  ParamSpec(p + "ln2.w", (d,), KIND_DENSE, False, "ones"),
                  ParamSpec(p + "ln2.b", (d,), KIND_DENSE, False, "zeros"),
                  lin(p + "fc1", (h, d), std),
                  lin(p + "fc2", (d, h), out_std)]
    specs += [ParamSpec("lnf.w", (d,), KIND_DENSE, False, "ones"),
              ParamSpec("lnf.b", (d,), KIND_DENSE, False, "zeros"),
              ParamSpec("head", (cfg.vocab, d), KIND_DENSE, True, f"normal:{std}")]
    return specs


class WeightLinear(torch.autograd.Function):
    """y = x @ W^T with W supplied by `store` (see the module docstring)."""

    @staticmethod
    def forward(ctx, x, store, name):
        w = store.weight_fwd(name)
        ctx.store, ctx.name = store, name
        ctx.save_for_backward(x)
        y = torch.matmul(x, w.t())
        del w
        return y

    @staticmethod
    def backward(ctx, gy):
        (x,) = ctx.saved_tensors
        store, name = ctx.store, ctx.name
        gy2 = gy.reshape(-1, gy.shape[-1])
        x2 = x.reshape(-1, x.shape[-1])
        store.put_weight_grad(name, torch.matmul(gy2.t(), x2))
        wb = store.weight_bwd(name)
        gx = torch.matmul(gy, wb)
        return gx, None, None


def _attention(q, k, v, mode):
    # q, k, v: [B, H, T, hd]
    if mode == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = q.shape[-2]
    att = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).triu_(1)
    att = att.masked_fill(mask, float("-inf"))
    att = torch.softmax(att.float(), dim=-1).to(q.dtype)
    return torch.matmul(att, v)


def forward_loss(cfg: GPTConfig, store, tokens: torch.Tensor, denom: int) -> torch.Tensor:
    """Sum of next-token cross-entropy over the local batch divided by `denom`
    (the global token count), so that the sum over ranks of the gradients is
    the gradient of the global mean loss."""
    x_in, y = tokens[:, :-1], tokens[:, 1:]
    B, T = x_in.shape
    d, H = cfg.d, cfg.heads
    P = store.dense
    x = F.embedding(x_in, P("wte")) + P("wpe")[:T].unsqueeze(0)
    for i in range(cfg.layers):
        p = f"h{i}."
        h = F.layer_norm(x, (d,), P(p + "ln1.w"), P(p + "ln1.b"))
        qkv = WeightLinear.apply(h, store, p + "qkv")
        q, k, v = qkv.view(B, T, 3, H, d // H).permute(2, 0, 3, 1, 4)
        a = _attention(q, k, v, cfg.attn).transpose(1, 2).reshape(B, T, d)
        x = x + WeightLinear.apply(a, store, p + "proj")
        h = F.layer_norm(x, (d,), P(p + "ln2.w"), P(p + "ln2.b"))
        h = F.gelu(WeightLinear.apply(h, store, p + "fc1"), approximate="tanh")
        x = x + WeightLinear.apply(h, store, p + "fc2")
    x = F.layer_norm(x, (d,), P("lnf.w"), P("lnf.b"))
    logits = torch.matmul(x, P("head").t())
    loss = F.cross_entropy(logits.float().reshape(-1, cfg.vocab), y.reshape(-1), reduction="sum")
    return loss / denom

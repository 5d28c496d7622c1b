# SPDX-License-Identifier: MIT
"""The model: a small GPT (pre-norm, learned positions, GELU MLP, untied head)
as an ordinary nn.Module with nn.Linear layers, and how it becomes an MXFP8
model: mxshard.torch.convert turns the block linears into MXFP8Linear
(row-only, or bidirectional for the ones named in `bidir`); the head,
embeddings and layer norms stay dense (bf16).

    model = build(cfg, "mxfp8", {"h.0.qkv", "h.0.fc2"}, device, seed=1234)
    loss = model(tokens, denom)        # sum of next-token cross-entropy / denom

The initial weights are a pure function of (seed, parameter name, shape):
identical for every DP size and every process. Everything the optimizer and
the checkpoints do is the library's (train.py).
"""
from __future__ import annotations

import fnmatch
import math
import re
import zlib
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

LINEARS = ("qkv", "proj", "fc1", "fc2")   # per block; proj and fc2 get the scaled init


@dataclass
class GPTConfig:
    vocab: int = 256
    seq: int = 256
    d: int = 512
    layers: int = 4
    heads: int = 8
    mlp: int = 4
    attn: str = "math"   # "math" (explicit softmax: deterministic) | "sdpa" (flash attention)


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


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        d, h = cfg.d, cfg.mlp * cfg.d
        self.cfg = cfg
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, h, bias=False)
        self.fc2 = nn.Linear(h, d, bias=False)

    def forward(self, x):
        B, T, d = x.shape
        H = self.cfg.heads
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, H, d // H).permute(2, 0, 3, 1, 4)
        a = _attention(q, k, v, self.cfg.attn).transpose(1, 2).reshape(B, T, d)
        x = x + self.proj(a)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab, cfg.d)
        self.wpe = nn.Embedding(cfg.seq, cfg.d)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.lnf = nn.LayerNorm(cfg.d)
        self.head = nn.Linear(cfg.d, cfg.vocab, bias=False)

    def forward(self, tokens: torch.Tensor, denom: int) -> torch.Tensor:
        """Sum of the next-token cross-entropy over this rank's batch divided by
        `denom` (the global token count): summed over ranks, the gradients are
        those of the global mean loss (the optimizer reduces with grad_reduce="sum")."""
        x_in, y = tokens[:, :-1], tokens[:, 1:]
        T = x_in.shape[1]
        x = self.wte(x_in) + self.wpe.weight[:T].unsqueeze(0)
        for blk in self.h:
            x = blk(x)
        logits = self.head(self.lnf(x))
        loss = F.cross_entropy(logits.float().reshape(-1, self.cfg.vocab), y.reshape(-1), reduction="sum")
        return loss / denom


def linear_names(cfg: GPTConfig):
    return [f"h.{i}.{n}" for i in range(cfg.layers) for n in LINEARS]


def decay_names(cfg: GPTConfig):
    """Parameters with AdamW weight decay: the block linears and the head (the
    item names ShardedOptimizer gives them, the same for nn.Linear and MXFP8Linear)."""
    return [n + ".weight" for n in linear_names(cfg)] + ["head.weight"]


def parse_bidir(text: str):
    """'h0.qkv,h.1.*' -> {'h.0.qkv', 'h.1.*'}: fnmatch patterns on the block
    linear names ('*' = all, '' = none; the old 'h<i>.<name>' spelling is accepted)."""
    return {re.sub(r"^h(\d+)\.", r"h.\1.", x.strip()) for x in text.split(",") if x.strip()}


def policy(cfg: GPTConfig, bidir):
    """convert's policy: every block linear 'row', or 'both' when a pattern of
    `bidir` matches its name; the head stays dense."""
    pats = set(bidir)

    def decide(name, mod):
        if name not in set(linear_names(cfg)):
            return "dense"
        return "both" if any(fnmatch.fnmatchcase(name, p) for p in pats) else "row"
    return decide


@torch.no_grad()
def init_weights(model: GPT, seed: int):
    """N(0, 0.02) (proj and fc2: 0.02 / sqrt(2 layers)), layer norms 1 / 0; each
    parameter drawn from its own generator seeded by (seed, name)."""
    out_std = 0.02 / math.sqrt(2 * model.cfg.layers)
    for name, p in model.named_parameters():
        if ".ln" in name or name.startswith("lnf."):
            p.fill_(1.0 if name.endswith(".weight") else 0.0)
            continue
        std = out_std if name.endswith((".proj.weight", ".fc2.weight")) else 0.02
        g = torch.Generator(device=p.device).manual_seed(seed * 100_003 + zlib.crc32(name.encode()))
        p.normal_(0.0, std, generator=g)


def build(cfg: GPTConfig, variant: str, bidir, device, seed: int, *, init_device=None, layout="padded",
          rounding="ceil"):
    """The model on `device`: drawn in fp32 (on `init_device`, default the CPU:
    bit-identical everywhere), then variant 'mxfp8': the block linears
    converted to MXFP8Linear (their fp32 weights become the initial masters);
    the dense parameters cast to bf16 (both variants)."""
    import mxshard.torch as mxt
    init_device = torch.device(init_device or "cpu")
    with torch.device(init_device):
        model = GPT(cfg)
    init_weights(model, seed)
    model.to(device)
    if variant == "mxfp8":
        mxt.convert(model, policy(cfg, bidir), layout=layout, rounding=rounding, compute_dtype=torch.bfloat16)
    elif variant != "bf16":
        raise ValueError(f"variant {variant!r}: 'mxfp8' or 'bf16'")
    return model.to(torch.bfloat16)     # MXFP8Linear's planes are uint8 and its kept master fp32: unchanged

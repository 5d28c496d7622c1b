# SPDX-License-Identifier: MIT
"""The models of bench/fsdp_bench.py and bench/fsdp_project.py, and which of their linears each
variant converts.

mlp    an embedding, `blocks` residual MLP blocks (LayerNorm, fc1 d->h, fc2 h->d, GELU), a dense
       head. Converted: fc1, fc2 (2 per block).
llama  a Llama-like decoder: an embedding, `blocks` blocks of
           x + o(attn(rope(qkv(rmsnorm(x)))))          fused qkv d->3d, SDPA causal, RoPE
           x + down(silu(gate(h)) * up(h)), h = rmsnorm(x)   SwiGLU, gate and up SEPARATE d->ffn
       (as Llama's gate_proj / up_proj; --fuse-gate-up: one gate_up d->2ffn), a final RMSNorm
       and a dense head. Converted: qkv, o, gate, up, down (5 per block; 4 with --fuse-gate-up).
       Defaults of the ~1B config: d 2048, ffn 5632, 16 heads, 16 blocks, vocab 32000.

Variants (every FSDP2 variant: each block its own fully_shard, the root another):
    fsdp-bf16      nothing converted (FSDP2 gathers BF16)
    fsdp-mx-row    every converted linear row-only MXFP8
    fsdp-mx-both   MXFP8, the linears reading the normalised input "both" (mlp: fc1; llama: qkv,
                   gate, up / gate_up), the others (fc2; o, down) row-only
    fsdp-nv-row    every converted linear row-only NVFP4 1x16
    sharded-row    ShardedOptimizer, row-only MXFP8 (memory mode only)
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, h, bias=False)
        self.fc2 = nn.Linear(h, d, bias=False)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class Model(nn.Module):
    def __init__(self, vocab, d, h, blocks):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, h) for _ in range(blocks))
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, tok):
        x = self.emb(tok)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def _rope(x, cos, sin):
    """x [B, H, S, Dh]; cos, sin [S, Dh/2]: rotates the two halves of each head."""
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Attention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.o = nn.Linear(d, d, bias=False)

    def forward(self, x, cos, sin):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, s, d))


class SwiGLU(nn.Module):
    def __init__(self, d, ffn, fused):
        super().__init__()
        self.fused = fused
        if fused:
            self.gate_up = nn.Linear(d, 2 * ffn, bias=False)
        else:
            self.gate = nn.Linear(d, ffn, bias=False)
            self.up = nn.Linear(d, ffn, bias=False)
        self.down = nn.Linear(ffn, d, bias=False)

    def forward(self, x):
        if self.fused:
            g, u = self.gate_up(x).chunk(2, dim=-1)
        else:
            g, u = self.gate(x), self.up(x)
        return self.down(F.silu(g) * u)


class LlamaBlock(nn.Module):
    def __init__(self, d, ffn, heads, fused):
        super().__init__()
        self.attn_norm = nn.RMSNorm(d, eps=1e-5)
        self.attn = Attention(d, heads)
        self.mlp_norm = nn.RMSNorm(d, eps=1e-5)
        self.mlp = SwiGLU(d, ffn, fused)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    def __init__(self, vocab, d, ffn, blocks, heads, seq, fused=False):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(LlamaBlock(d, ffn, heads, fused) for _ in range(blocks))
        self.norm = nn.RMSNorm(d, eps=1e-5)
        self.head = nn.Linear(d, vocab, bias=False)
        dh = d // heads
        inv = 1.0 / (10000.0 ** (torch.arange(0, dh, 2, dtype=torch.float32) / dh))
        ang = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)

    def forward(self, tok):
        x = self.emb(tok)
        s = tok.shape[1]
        cos, sin = self.cos[:s].to(x.dtype), self.sin[:s].to(x.dtype)
        for b in self.blocks:
            x = b(x, cos, sin)
        return self.head(self.norm(x))


def make(args):
    """The model of args.model (fp32 parameters, on the CPU)."""
    if getattr(args, "model", "mlp") == "llama":
        assert args.hidden % args.heads == 0 and (args.hidden // args.heads) % 2 == 0, "head dim must be even"
        return Llama(args.vocab, args.hidden, args.ffn, args.blocks, args.heads, args.seq,
                     fused=getattr(args, "fuse_gate_up", False))
    return Model(args.vocab, args.hidden, args.ffn, args.blocks)


def policy(model, variant):
    """(convert policy, format) of a variant on model 'mlp' or 'llama'; (None, None): nothing converted."""
    if variant == "fsdp-bf16":
        return None, None
    if model == "llama":
        row = {"blocks.*.attn.*": "row", "blocks.*.mlp.*": "row"}
        both = {"blocks.*.attn.qkv": "both", "blocks.*.mlp.gate*": "both", "blocks.*.mlp.up": "both",
                "blocks.*.attn.o": "row", "blocks.*.mlp.down": "row"}
    else:
        row = {"blocks.*.fc*": "row"}
        both = {"blocks.*.fc1": "both", "blocks.*.fc2": "row"}
    if variant in ("fsdp-mx-row", "sharded-row"):
        return row, "mxfp8"
    if variant == "fsdp-mx-both":
        return both, "mxfp8"
    if variant == "fsdp-nv-row":
        return row, "nvfp4"
    raise ValueError(f"unknown variant {variant}")


def convertible(model_name, m):
    """Qualified names of the linears the converting variants convert (the block linears)."""
    pol, _ = policy(model_name, "fsdp-mx-row")
    import fnmatch
    return [n for n, x in m.named_modules() if type(x) is nn.Linear and any(fnmatch.fnmatch(n, p) for p in pol)]


def matmul_params(unit):
    """Parameters of a unit's linears (their weights' numel: the unit's share of the step's GEMMs)."""
    return sum(x.weight.numel() for x in unit.modules() if isinstance(x, nn.Linear))


def describe(args):
    n = sum(p.numel() for p in make_meta(args).parameters())
    return f"{args.model} d {args.hidden} ffn {args.ffn} blocks {args.blocks} vocab {args.vocab}: {n / 1e6:.1f} M params"


def make_meta(args):
    with torch.device("meta"):
        return make(args)


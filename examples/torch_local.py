# SPDX-License-Identifier: MIT
"""Train your own model in one process with MXFP8 (or NVFP4) weights: convert,
then any torch.optim optimizer, clip_grad_norm_ and a scheduler as usual;
export the weights the model computed with, and load them into the plain
model for inference.

    pip install .                                            # builds and bundles the libraries
    python examples/torch_local.py                           # CPU (the GPU when there is one)
    python examples/torch_local.py --format nvfp4 --out m.safetensors

The recipe (the model is an ordinary nn.Module):

    model = mxt.convert(model, {"blocks.*.fc1": "both", "blocks.*.fc2": "row"})
    opt = torch.optim.AdamW(model.parameters(), lr=...)
    ... loss.backward(); clip_grad_norm_(model.parameters(), 1.0); opt.step(); opt.zero_grad()
    mxt.export_safetensors(path, model)      # the quantized bytes its forward multiplied by
    mxt.load_safetensors(path, plain_model)  # an unconverted model: the same outputs

It prints the loss, the parameter count (the converted weights are
Parameters like any other) and how far the plain model's outputs are from the
converted one's after the reload.
"""
import argparse
import os
import sys
import tempfile

import torch
import torch.nn.functional as F

import mxshard.torch as mxt
from torch_fsdp import TinyLM   # the same model as the FSDP2 example (examples/torch_fsdp.py)


def batch(step, n, window, vocab, device):
    g = torch.Generator().manual_seed(step)
    seq = torch.randint(0, vocab, (n, window + 1), generator=g)
    seq[:, -1] = (seq[:, 0] + 1) % vocab                    # a learnable rule
    return seq[:, :-1].to(device), seq[:, -1].to(device)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--format", default="mxfp8", choices=["mxfp8", "nvfp4"])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--vocab", type=int, default=64)
    ap.add_argument("--window", type=int, default=4)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=160)
    ap.add_argument("--blocks", type=int, default=2)
    ap.add_argument("--out", default=None, help="the safetensors file (default: a temporary one)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    torch.manual_seed(0)

    model = TinyLM(args.vocab, args.window, args.d, args.hidden, args.blocks).to(device)
    plain = TinyLM(args.vocab, args.window, args.d, args.hidden, args.blocks).to(device)   # for inference later
    n_plain = sum(p.numel() for p in model.parameters())
    model = mxt.convert(model, {"blocks.*.fc1": "both", "blocks.*.fc2": "row"}, format=args.format)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 5))
    first = last = None
    for step in range(args.steps):
        ctx, y = batch(step, 64, args.window, args.vocab, device)
        loss = F.cross_entropy(model(ctx).float(), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        first = loss.item() if first is None else first
        last = loss.item()

    path = args.out or os.path.join(tempfile.mkdtemp(), "torch_local.safetensors")
    mxt.export_safetensors(path, model)
    mxt.load_safetensors(path, plain)
    ctx, _ = batch(10 ** 6, 16, args.window, args.vocab, device)
    with torch.no_grad():
        a, b = model(ctx).float(), plain(ctx).float()
    err = ((a - b).abs().max() / a.abs().max()).item()
    n_conv = sum(p.numel() for p in model.parameters())
    print(f"torch_local: {args.format} on {device.type}: loss {first:.4f} -> {last:.4f} in {args.steps} steps; "
          f"parameters {n_conv} (unconverted: {n_plain}); exported to {path}; the plain model reloaded from it: "
          f"max |logit difference| / max |logit| = {err:.2e}, argmax agreement "
          f"{(a.argmax(1) == b.argmax(1)).float().mean().item():.3f}", flush=True)
    return n_conv == n_plain and last < first


if __name__ == "__main__":
    sys.exit(0 if main() else 1)

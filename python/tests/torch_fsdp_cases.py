# SPDX-License-Identifier: MIT
"""FSDP2 cases for MXFP8ParamLinear / NVFP4ParamLinear, run by every rank of
gloo groups spawned by test_torch_fsdp.py (and by a world of one). Each case
returns a small summary or raises.

Exactness needs gradients every rank and the reference agree on bit for bit:
every converted linear gets the identity as input and the loss sum(y * G)
with G dyadic (small integers * 2^-10), so its weight gradient is exactly
G^T on every rank and FSDP2's mean over ranks is one rounding of an exact sum,
as the reference's mean is."""
import contextlib
import os
import zlib

import torch
import torch.distributed as dist
from torch import nn

import mxshard
import torch_harness as H
import mxshard.torch as mxt
from mxshard.torch import fsdp_linear as FL

# name, format, planes, layout, rounding | block, (in, out): even / uneven / rows < world / aligned at 3
MODULES = [
    ("a", "mxfp8", "row", "compact", "ceil", (48, 40)),
    ("b", "mxfp8", "both", "padded", "ceil", (40, 96)),
    ("c", "mxfp8", "row", "swizzled", "floor", (70, 33)),
    ("d", "mxfp8", "both", "swizzled", "floor", (17, 3)),
    ("e", "mxfp8", "both", "compact", "ceil", (5, 1)),
]


class Net(nn.Module):
    """Independent linears called by one forward: {name: child(x)} for the given {name: x}."""

    def forward(self, xs):
        return {n: getattr(self, n)(x) for n, x in xs.items()}


def build(seed=0, modules=MODULES, dense=True):
    """One nn.Linear (no bias: see the module doc) per entry, converted with fsdp=True, plus a dense
    nn.Linear "f" with a bias (a plain FSDP2 parameter beside them)."""
    torch.manual_seed(seed)
    m = Net()
    for name, fmt, planes, layout, opt, (cin, cout) in modules:
        setattr(m, name, nn.Linear(cin, cout, bias=False))
    if dense:
        m.f = nn.Linear(9, 4)
    for name, fmt, planes, layout, opt, _ in modules:
        kw = {"rounding": opt} if fmt == "mxfp8" else {"block": opt}
        mxt.convert(m, {name: planes}, format=fmt, layout=layout, fsdp=True, **kw)
    return m


def grad_for(name, shape, step, rank):
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()) * 1000 + step * 17 + rank)
    return torch.randint(-8, 9, tuple(shape), generator=g).float() * 2.0 ** -10


def loss_of(m, modules, step, grads):
    """sum over the converted linears of sum(lin(I) * G), + the dense one's; grads(name, shape)."""
    xs = {name: torch.eye(cin, dtype=torch.bfloat16, requires_grad=True) for name, _, _, _, _, (cin, _) in modules}
    if hasattr(m, "f"):
        xs["f"] = torch.eye(9)
    ys = m(xs)
    return sum((y.float() * grads(n, (y.shape[0], y.shape[1]))).sum() for n, y in ys.items())


def shard_all(m, **kw):
    from torch.distributed.fsdp import fully_shard
    for c in m.children():
        fully_shard(c, **kw)
    fully_shard(m, **kw)
    return m


def quantize_whole(spec, master):
    """The whole-tensor quantize of a [rows, cols] master: what every gathered plane must equal."""
    rows, cols = master.shape
    src = master.detach().to(torch.bfloat16 if spec.round_through == "bf16" else master.dtype)
    if spec.format == "mxfp8":
        w = mxshard.MXFP8Weight.empty(rows, cols, planes=spec.planes, layout=spec.layout, device=master.device)
        return mxshard.quantize(w, src, rounding=spec.rounding)
    w = mxshard.NVFP4Weight.empty(rows, cols, planes=spec.planes, block=spec.block, layout=spec.layout,
                                    device=master.device)
    return mxshard.quantize_nvfp4(w, src)


def plane_bytes(p, plane):
    out = {"data": getattr(p, f"{plane}_data").reshape(-1).clone(), "scale": getattr(p, f"{plane}_scale").reshape(-1).clone()}
    if hasattr(p, "amax") and p.amax is not None:
        out["amax"] = p.amax.reshape(-1).clone()
    return out


@contextlib.contextmanager
def record_planes():
    """Every primary the linears use: [(module name, plane, bytes)]."""
    seen = []
    orig = FL._primary

    def spy(module, w, plane):
        p = orig(module, w, plane)
        seen.append((module.meta.name, plane, plane_bytes(p, plane)))
        return p
    FL._primary = spy
    try:
        yield seen
    finally:
        FL._primary = orig


@contextlib.contextmanager
def count_collectives():
    """torch.distributed calls by name, with the bytes of all-gather inputs."""
    names = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast")
    orig = {n: getattr(dist, n) for n in names}
    calls = {"bytes_all_gather_into_tensor": 0}

    def wrap(n, f):
        def g(*a, **k):
            calls[n] = calls.get(n, 0) + 1
            if n == "all_gather_into_tensor":
                inp = k.get("input_tensor", a[1] if len(a) > 1 else None)
                calls["bytes_all_gather_into_tensor"] += inp.numel() * inp.element_size()
            return f(*a, **k)
        return g
    for n in names:
        setattr(dist, n, wrap(n, orig[n]))
    try:
        yield calls
    finally:
        for n in names:
            setattr(dist, n, orig[n])


def full_masters(m):
    """{param name: full fp32 value} (a collective per DTensor: every rank calls it)."""
    out = {}
    for n, p in m.named_parameters():
        t = p.full_tensor() if hasattr(p, "full_tensor") else p.detach()
        t = t._data if isinstance(t, mxt.QuantMaster) else t
        out[n] = t.detach().clone()
    return out


# ---- the cases -------------------------------------------------------------------------

def case_exact(rank, world, steps=3, modules=MODULES, opt="adamw"):
    """Masters bit-identical to a world of one (same optimizer, the mean gradient); every plane
    the linears use (forward and backward) byte-identical to the whole-tensor quantize of the
    master; the reductions counted."""
    m = shard_all(build(modules=modules))
    ref = build(modules=modules)
    make = {"adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.05),
            "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01)}[opt]
    o, ro = make(m.parameters()), make(ref.parameters())
    specs = {name: getattr(ref, name).spec for name, *_ in modules}
    checked, reduces = 0, []
    for s in range(steps):
        masters = full_masters(m)
        with count_collectives() as calls, record_planes() as seen:
            loss_of(m, modules, s, lambda n, sh: grad_for(n, sh, s, rank)).backward()
        reduces.append(calls.get("all_reduce", 0))
        for name, plane, got in seen:
            want = plane_bytes(quantize_whole(specs[name], masters[f"{name}.weight"]), plane)
            for k in want:
                assert torch.equal(got[k], want[k]), f"step {s} {name} {plane} {k}: gathered bytes differ"
            checked += 1
        o.step()
        o.zero_grad()
        for r in range(world):  # every rank's gradient, summed exactly, then FSDP2's mean: one division
            loss_of(ref, modules, s, lambda n, sh: grad_for(n, sh, s, r)).backward()
        for p in ref.parameters():
            p.grad.div_(world)
        ro.step()
        ro.zero_grad()
    got, want = full_masters(m), full_masters(ref)
    bad = {n: (got[n] - want[n]).abs().max().item() for n in want if not torch.equal(got[n], want[n])}
    assert not bad, f"masters differ from the world of one (max |d|): {bad}"
    return {"checked": checked, "reduces": reduces, "group": dict(m.a._group.collectives)}


def plan(root):
    return [("exact", "exact", {}), ("exact_sgd", "exact", {"opt": "sgd", "steps": 2})]


CASES = {"exact": case_exact}


def worker(rank, world, port, q, plan=None):
    H.run_rank(rank, world, port, q, plan, CASES, gloo_timeout=30)


if os.environ.get(H.WARM_UP_VAR) == "1":
    torch.set_num_threads(1)

# SPDX-License-Identifier: MIT
"""The FSDP2 test model and its probes, shared by torch_fsdp_cases (the cases every rank
runs): the device, fully_shard on it, the converted linears of every format / layout / plane
set (MODULES), the dyadic gradients that make every rank and the reference agree bit for
bit, the whole-tensor quantize every gathered plane must equal, and spies on the planes the
linears read and on the collectives."""
import contextlib
import os
import zlib

import torch
import torch.distributed as dist
from torch import nn

import mxshard
import mxshard.torch as mxt
from mxshard.torch.fsdp import ops as FO


DEV = os.environ.get("MXS_FSDP_DEVICE", "cpu")


def dev():
    return torch.device("cuda", torch.cuda.current_device()) if DEV == "cuda" else torch.device("cpu")


def fsdp(module, **kw):
    """fully_shard on this run's device. The mesh is explicit: FSDP2's default mesh is the
    accelerator's wherever one exists, so a CPU run on a GPU machine would move every
    parameter to cuda:0."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    kw.setdefault("mesh", init_device_mesh(dev().type, (dist.get_world_size(),)))
    return fully_shard(module, **kw)


# name, format, planes, layout, rounding | block, (in, out): even / uneven / rows < world / aligned at 3
MODULES = [
    ("a", "mxfp8", "row", "compact", "ceil", (48, 40)),
    ("b", "mxfp8", "both", "padded", "ceil", (40, 96)),
    ("c", "mxfp8", "row", "swizzled", "floor", (70, 33)),
    ("d", "mxfp8", "both", "swizzled", "floor", (17, 3)),
    ("e", "mxfp8", "both", "compact", "ceil", (5, 1)),
    ("g", "nvfp4", "row", "padded", "1x16", (48, 40)),
    ("h", "nvfp4", "both", "swizzled", "16x16", (32, 33)),
    ("i", "nvfp4", "both", "compact", "1x16", (20, 50)),
]


class Net(nn.Module):
    """Independent linears called by one forward: {name: child(x)} for the given {name: x}."""

    def forward(self, xs):
        return {n: getattr(self, n)(x) for n, x in xs.items()}


def build(seed=0, modules=MODULES, dense=True, meta=False):
    """One nn.Linear (no bias: see the module doc) per entry, converted, plus a dense
    nn.Linear "f" with a bias (a plain FSDP2 parameter beside them)."""
    torch.manual_seed(seed)
    with torch.device("meta") if meta else contextlib.nullcontext():
        m = Net()
        for name, fmt, planes, layout, opt, (cin, cout) in modules:
            setattr(m, name, nn.Linear(cin, cout, bias=False))
        if dense:
            m.f = nn.Linear(9, 4)
    if not meta:
        m = m.to(dev())
    for name, fmt, planes, layout, opt, _ in modules:
        kw = {"rounding": opt} if fmt == "mxfp8" else {"block": opt}
        mxt.convert(m, {name: planes}, format=fmt, layout=layout, **kw)
    return m


def grad_for(name, shape, step, rank):
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()) * 1000 + step * 17 + rank)
    return torch.randint(-8, 9, tuple(shape), generator=g).float() * 2.0 ** -10


def loss_of(m, modules, step, grads):
    """sum over the converted linears of sum(lin(I) * G), + the dense one's; grads(name, shape)."""
    xs = {name: torch.eye(cin, dtype=torch.bfloat16, device=dev(), requires_grad=True)
          for name, _, _, _, _, (cin, _) in modules}
    if hasattr(m, "f"):
        xs["f"] = torch.eye(9, device=dev())
    ys = m(xs)
    return sum((y.float() * grads(n, (y.shape[0], y.shape[1])).to(y.device)).sum() for n, y in ys.items())


def shard_all(m, **kw):
    for c in m.children():
        fsdp(c, **kw)
    fsdp(m, **kw)
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
    orig = FO._primary

    def spy(module, w, plane):
        p = orig(module, w, plane)
        seen.append((module.meta.name, plane, plane_bytes(p, plane)))
        return p
    FO._primary = spy
    try:
        yield seen
    finally:
        FO._primary = orig


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


def full_masters(m, named=None):
    """{param name: full value} (a collective per FSDP2 parameter: every rank calls it; `named`: the
    (name, sharded parameter) pairs to read instead of m.named_parameters()). Gathered from
    the local shards with a plain all_gather (FSDP2's dim-0 shards), not DTensor.full_tensor: gloo's
    functional collectives crash on CUDA tensors (torch 2.11, seen on the H200)."""
    out = {}
    for n, p in named if named is not None else m.named_parameters():
        local = getattr(p, "_local_tensor", None)
        if local is None:
            t = p.detach()
        else:
            local = local._data if isinstance(local, mxt.QuantMaster) else local
            world = dist.get_world_size()
            s = -(-p.shape[0] // world)
            pad = torch.zeros((s,) + tuple(p.shape[1:]), dtype=local.dtype, device=local.device)
            pad[:local.shape[0]] = local
            outs = [torch.empty_like(pad) for _ in range(world)]
            dist.all_gather(outs, pad)
            t = torch.cat(outs)[:p.shape[0]]
        t = t._data if isinstance(t, mxt.QuantMaster) else t
        out[n] = t.detach().clone()
    return out

# SPDX-License-Identifier: MIT
"""ShardedOptimizer cases with NVFP4Linear weights, run by every rank of a
gloo group of 2 spawned by test_torch_nvfp4_optim.py, and in a world of one
in the test process itself (the reference the group's bytes must equal).
Each case returns a small summary or raises."""
import os
import zlib

import torch
from torch import nn

import mxshard
import torch_dist_cases as C
import torch_harness as H
from mxshard.torch import (MXFP8Linear, NVFP4Linear, ShardedOptimizer, is_mxfp8, is_nvfp4, load_checkpoint,
                           save_checkpoint)
from mxshard.torch.zero import layout as LY
from mxshard.torch.zero.linear import is_quantized

# every plane set x block x layout, at odd and even shapes (in, out): rows*cols odd for some
NV_MODULES = [
    ("row", "1x16", "compact", (33, 17)), ("row", "1x16", "padded", (16, 8)), ("row", "1x16", "swizzled", (40, 3)),
    ("row", "16x16", "compact", (9, 5)), ("row", "16x16", "padded", (48, 20)), ("row", "16x16", "swizzled", (17, 33)),
    ("both", "1x16", "compact", (20, 9)), ("both", "1x16", "padded", (65, 7)), ("both", "1x16", "swizzled", (32, 32)),
    ("both", "16x16", "compact", (1, 1)), ("both", "16x16", "padded", (31, 18)),
    ("both", "16x16", "swizzled", (24, 37)),
]


def build_model(seed=0, with_mx=True, modules=NV_MODULES):
    """An NVFP4Linear per entry of `modules`, an MXFP8Linear (with_mx), an
    Embedding, a LayerNorm and a bf16 parameter; a frozen parameter."""
    torch.manual_seed(seed)
    m = nn.Module()
    m.emb = nn.Embedding(5, 12)
    for i, (planes, block, layout, (inf, outf)) in enumerate(modules):
        setattr(m, f"nv{i}", NVFP4Linear(inf, outf, bias=i % 3 != 0, planes=planes, block=block, layout=layout))
    if with_mx:
        m.mx = MXFP8Linear(40, 9, planes="both", layout="padded")
    m.ln = nn.LayerNorm(17)
    m.h = nn.Parameter(torch.randn(3, 5).to(torch.bfloat16))
    m.frozen = nn.Parameter(torch.randn(3), requires_grad=False)
    return m


def grad_for(name, shape, step, rank):
    """Dyadic gradients (integers in [-8, 8] * 2^-10): sums and means over 2 ranks are exact."""
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()) * 1000 + step * 17 + rank)
    return torch.randint(-8, 9, tuple(shape), generator=g).float() * 2.0 ** -10


def inject(m, step, rank, world, as_one=False):
    """This rank's gradients; as_one: the mean of all `world` ranks' (a world of one that must
    reproduce a group of `world` with grad_reduce='mean')."""
    for n, o in C.item_table(m):
        shape = (o.out_features, o.in_features) if is_quantized(o) else tuple(o.shape)
        if as_one:
            g = sum(grad_for(n, shape, step, r) for r in range(world)) / world
        else:
            g = grad_for(n, shape, step, rank)
        if is_quantized(o):
            o.main_grad.copy_(g)
        else:
            o.grad = g.to(o.dtype)


def full_masters(opt):
    """Every item's full fp32 master, assembled from every rank's shards."""
    shards = C._gather_obj([b.master.cpu().clone() for b in opt._buckets])
    out = {it.name: torch.zeros(it.numel) for it in opt.plan.items}
    for r, mine in enumerate(shards):
        for bi in range(len(opt.plan.buckets)):
            for item, s, n, pos in LY.shard_to_items(opt.plan, bi, r):
                out[opt.plan.items[item].name][s:s + n] = mine[bi][pos:pos + n]
    return out


def _u8(t):
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def check_primaries(m, full, round_through="bf16"):
    """Every NVFP4Linear's buffers (data, scales, amax) == quantize_nvfp4 of its whole master
    (rounded through bf16), every MXFP8Linear's == quantize; dense == master cast. Returns the
    number of NVFP4 buffers compared."""
    n = 0
    for name, o in C.item_table(m):
        src = full[name].reshape(o.out_features, o.in_features).contiguous() if is_quantized(o) else None
        if is_nvfp4(o):
            w = mxshard.NVFP4Weight.empty(o.out_features, o.in_features, planes=o.planes, block=o.block,
                                          layout=o.layout, device="cpu")
            mxshard.quantize_nvfp4(w, src, round_through=round_through)
            for k in ("row_data", "row_scale", "col_data", "col_scale", "amax"):
                a, b = getattr(o, k), getattr(w, k)
                assert (a is None) == (b is None), f"{name}.{k} presence"
                if a is not None:
                    assert torch.equal(_u8(a), _u8(b)), \
                        f"{name}.{k}: {int((_u8(a) != _u8(b)).sum())} bytes differ from quantize_nvfp4 of the master"
                    n += 1
        elif is_mxfp8(o):
            w = mxshard.MXFP8Weight.empty(o.out_features, o.in_features, planes=o.planes, layout=o.layout,
                                          device="cpu")
            mxshard.quantize(w, src.to(torch.bfloat16), rounding=o.rounding)
            for k in ("row_data", "row_scale", "col_data", "col_scale"):
                if getattr(o, k) is not None:
                    assert torch.equal(_u8(getattr(o, k)), _u8(getattr(w, k))), f"{name}.{k}"
        else:
            assert torch.equal(_u8(o.detach()), _u8(full[name].reshape(o.shape).to(o.dtype))), name
    return n


def check_even(opt):
    """Every NVFP4 item sits at an even bucket offset and every rank boundary is even."""
    for bs in opt.plan.buckets:
        for p in bs.items:
            if opt.plan.items[p.item].kind in LY.NV_KINDS:
                assert p.offset % 2 == 0, f"{opt.plan.items[p.item].name} at odd offset {p.offset}"
                assert bs.shard % 2 == 0, f"bucket {bs.index}: odd shard {bs.shard}"
                for r in range(bs.dp):
                    for q, s, n, _ in LY.item_shards(bs, r):
                        if q is p and n:
                            assert s % 2 == 0 and ((s + n) % 2 == 0 or s + n == p.numel), (s, n, p.numel)


def expected_per_step(opt):
    """The documented collective counts per step (world > 1)."""
    c = {"reduce_scatter" if opt.comm.has_reduce_scatter else "all_reduce_grad": len(opt.plan.buckets),
         "all_reduce_norm": 1}
    bks = opt.plan.buckets
    c["all_reduce_max"] = c["all_gather_row"] = sum(b.has_mx for b in bks)
    c["all_gather_col"] = sum(b.has_col for b in bks)
    c["all_reduce_nvfp4"] = c["all_gather_nvfp4_row"] = sum(b.has_nv for b in bks)
    # a stage per bucket holding a "both" 1x16 NVFP4 weight (16x16 "both" rebuilds its column plane from the row's)
    c["all_gather_nvfp4_stage"] = sum(
        any(opt.plan.items[p.item].kind == "nv_both" and ":1x16:" in opt.plan.items[p.item].dtype for p in b.items)
        for b in bks)
    c["all_gather_dense"] = sum(len(b.dense) for b in bks)
    return {k: v for k, v in c.items() if v}


def digest(m, opt):
    """Bytes of everything a rank holds that must agree: the model's state (primaries, amaxes,
    dense values) and the full masters."""
    return {"model": {k: bytes(_u8(t).numpy()) for k, t in m.state_dict().items()},
            "masters": {k: bytes(_u8(t).numpy()) for k, t in full_masters(opt).items()}}


def _factory():
    return lambda g: torch.optim.AdamW(g, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.05)


# ---- the cases -------------------------------------------------------------------

def case_exact(rank, world, bucket_size=700, align=128, steps=3, as_world=None, with_mx=True, round_through="bf16"):
    """NVFP4 (and MXFP8, dense) weights trained with injected dyadic gradients: after every
    step each primary equals quantize_nvfp4 of its whole master, NVFP4 items sit at even
    offsets and shards; collective counts as documented and equal to the calls issued.
    as_world: a world of one that injects the mean gradient of `as_world` ranks (the
    reference the group's bytes must equal). Returns the digest of the final bytes."""
    m = build_model(with_mx=with_mx)
    o = ShardedOptimizer(m, _factory(), bucket_size=bucket_size, align=align, round_through=round_through)
    check_even(o)
    check_primaries(m, full_masters(o), round_through)
    issued = 0
    for s in range(steps):
        inject(m, s, rank, as_world or world, as_one=as_world is not None)
        with C.count_dist_calls() as calls:
            o.step()
        issued += calls["n"]
        o.zero_grad()
        nb = check_primaries(m, full_masters(o), round_through)
    exp = expected_per_step(o) if world > 1 else {}
    assert dict(o.collectives) == {k: v * steps for k, v in exp.items()}, (dict(o.collectives), exp)
    if world > 1:
        assert issued == sum(o.collectives.values()), (issued, dict(o.collectives))
    split = sum(1 for bs in o.plan.buckets for p in bs.items if o.plan.items[p.item].kind in LY.NV_KINDS
                and LY.owner(bs, p.offset) != LY.owner(bs, p.end - 1))
    out = digest(m, o)
    o.close()
    return dict(out, buffers=nb, buckets=len(o.plan.buckets), nv_split=split, per_step=exp)


def case_failure(rank, world):
    """A rank-local failure raises on every rank (the failing rank its own error, the
    others RemoteError through the NVFP4 writeback's status entry); nobody hangs; then
    training goes on and the primaries are still the quantization of the masters."""
    bad = 1
    out = {}
    m = build_model(with_mx=False)   # only the NVFP4 writebacks can carry an inner-step failure
    o = ShardedOptimizer(m, _factory(), bucket_size=700)
    inject(m, 0, rank, world)
    if rank == bad:
        def boom(*a, **k):
            raise ValueError("injected inner failure")
        o.inner.step = boom
    out["inner"] = C._expect_raise(o.step, rank, bad, ValueError, "injected")
    if rank == bad:
        del o.inner.step
    o.zero_grad()
    # a failure inside the first NVFP4 bucket's partial on rank 1
    wb = next(b.nvwb for b in o._buckets if b.nvwb is not None)
    inject(m, 1, rank, world)
    if rank == bad:
        wb._fault = ValueError("injected partial failure")
    out["partial"] = C._expect_raise(o.step, rank, bad, ValueError, "injected partial")
    wb._fault = None
    o.zero_grad()
    # an amax buffer replaced after construction on rank 1
    own = m.nv0.amax
    if rank == bad:
        m.nv0.amax = own.clone()
    inject(m, 2, rank, world)
    out["replaced"] = C._expect_raise(o.step, rank, bad, RuntimeError, "amax was replaced")
    o.zero_grad()
    m.nv0.amax = own
    inject(m, 3, rank, world)
    o.step()
    check_primaries(m, full_masters(o))
    o.close()
    return out


def case_ckpt(rank, world, root, k=2, more=2):
    """Save after k steps (DCP), continue; a fresh model + optimizer of another bucket geometry
    loads it: byte-identical primaries (amax included), masters and dense values, then the same
    steps give the same bytes. Rank 0 writes the references for the DP=1 load in the test process."""
    path = os.path.join(root, "nv_ckpt")
    m1 = build_model()
    o1 = ShardedOptimizer(m1, _factory(), bucket_size=700)
    for s in range(k):
        inject(m1, s, rank, world)
        o1.step()
        o1.zero_grad()
    save_checkpoint(path, m1, o1, extra={"step": k})
    at_k = digest(m1, o1)
    for s in range(k, k + more):
        inject(m1, s, rank, world)
        o1.step()
        o1.zero_grad()
    after = digest(m1, o1)
    m2 = build_model(seed=5)
    o2 = ShardedOptimizer(m2, _factory(), bucket_size=3000, align=8)
    assert load_checkpoint(path, m2, o2) == {"step": k}
    assert digest(m2, o2) == at_k, "the loaded state differs from the saved one"
    for s in range(k, k + more):
        inject(m2, s, rank, world)
        o2.step()
        o2.zero_grad()
    assert digest(m2, o2) == after, "the resumed run differs from the uninterrupted one"
    if rank == 0:
        torch.save({"at_k": at_k, "after": after, "k": k, "more": more, "world": world},
                   os.path.join(root, "nv_ref.pt"))
    o1.close()
    o2.close()
    return {"keys": len(at_k["model"])}


def resume_as_one(root):
    """The test process (a world of one) loads the group's checkpoint: bytes equal to the saved
    state, then `more` steps with the group's mean gradients give the group's bytes."""
    ref = torch.load(os.path.join(root, "nv_ref.pt"), weights_only=False)
    m = build_model(seed=9)
    o = ShardedOptimizer(m, _factory(), bucket_size=10 ** 6)
    assert load_checkpoint(os.path.join(root, "nv_ckpt"), m, o) == {"step": ref["k"]}
    assert digest(m, o) == ref["at_k"], "DP=1 load of the DP=2 checkpoint differs from the saved state"
    for s in range(ref["k"], ref["k"] + ref["more"]):
        inject(m, s, 0, ref["world"], as_one=True)
        o.step()
        o.zero_grad()
    assert digest(m, o) == ref["after"], "DP=1 continuation differs from the DP=2 one"
    return o


CASES = {"exact": case_exact, "failure": case_failure, "ckpt": case_ckpt}


def plan(root):
    return [("exact", "exact", {}),
            ("exact_odd_align", "exact", {"align": 3, "bucket_size": 1200, "steps": 2}),
            ("failure", "failure", {}),
            ("ckpt", "ckpt", {"root": root})]


def worker(rank, world, port, q, plan=None):
    H.run_rank(rank, world, port, q, plan, CASES, gloo_timeout=20)


if os.environ.get(H.WARM_UP_VAR) == "1":
    torch.set_num_threads(1)

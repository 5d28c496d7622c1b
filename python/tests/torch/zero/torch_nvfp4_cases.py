# SPDX-License-Identifier: MIT
"""ShardedOptimizer cases with NVFP4Linear weights (convert()'s NVFP4ParamLinear), run by every
rank of a gloo group of 2 and one of 3 spawned by test_torch_nvfp4_optim.py, and in a world of
one in the test process itself. Each case returns a small summary or raises.

NVFP4 weights follow FSDP2's shard rule (mxshard.formats NVFP4.check_shards): rank k holds rows
[k*ch, (k+1)*ch) of the [out, in] master (ch = ceil(out/world)); its packed fragment must start
at an even element, so ch*in must be even unless one rank holds every row. NV_MODULES (the
shapes of the flat layout's tests: odd ones among them) must raise that NotImplementedError on
every rank (no hang); NV_EVEN (every plane set x block x layout, odd row lengths and odd element
counts where the rule allows them at worlds 2 and 3) trains bit-exactly."""
import os
import zlib

import torch
from torch import nn

import mxshard
import torch_dist_cases as C
import torch_harness as H
from mxshard import fsdp_geometry as FG
from mxshard.torch import (MXFP8Linear, NVFP4Linear, ShardedOptimizer, is_mxfp8, is_nvfp4, is_param_linear,
                           load_checkpoint, save_checkpoint)

# every plane set x block x layout, at odd and even shapes (in, out): rows*cols odd for some
NV_MODULES = [
    ("row", "1x16", "compact", (33, 17)), ("row", "1x16", "padded", (16, 8)), ("row", "1x16", "swizzled", (40, 3)),
    ("row", "16x16", "compact", (9, 5)), ("row", "16x16", "padded", (48, 20)), ("row", "16x16", "swizzled", (17, 33)),
    ("both", "1x16", "compact", (20, 9)), ("both", "1x16", "padded", (65, 7)), ("both", "1x16", "swizzled", (32, 32)),
    ("both", "16x16", "compact", (1, 1)), ("both", "16x16", "padded", (31, 18)),
    ("both", "16x16", "swizzled", (24, 37)),
]
# the same grid at shapes FSDP2's rule shards at worlds 2 and 3 (ceil(out/2) and ceil(out/3) even
# where in is odd): odd in_features (33, 9, 17, 65, 31), odd element counts (11x33, 11x31, 1x1),
# rows that split unevenly (11, 3, 9, 37) or leave ranks without rows (1x1)
NV_EVEN = [
    ("row", "1x16", "compact", (33, 11)), ("row", "1x16", "padded", (16, 8)), ("row", "1x16", "swizzled", (40, 3)),
    ("row", "16x16", "compact", (9, 4)), ("row", "16x16", "padded", (48, 20)), ("row", "16x16", "swizzled", (17, 12)),
    ("both", "1x16", "compact", (20, 9)), ("both", "1x16", "padded", (65, 12)), ("both", "1x16", "swizzled", (32, 32)),
    ("both", "16x16", "compact", (1, 1)), ("both", "16x16", "padded", (31, 11)),
    ("both", "16x16", "swizzled", (24, 37)),
]
BUFS = ("row_data", "row_scale", "col_data", "col_scale", "amax")


def build_model(seed=0, with_mx=True, modules=NV_EVEN):
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


def grad_for(name, shape, step, rank, world):
    """Dyadic gradients (integers in [-8, 8] * 2^-10, the last rank's adjusted so that every
    element's sum over the `world` ranks is a multiple of world): sums and means over the ranks
    are exact, in fp32 and in bf16 (a world of one fed the mean reproduces the group)."""
    ks = []
    for r in range(world):
        g = torch.Generator().manual_seed(zlib.crc32(name.encode()) * 1000 + step * 17 + r)
        ks.append(torch.randint(-8, 9, tuple(shape), generator=g))
    ks[-1] = ks[-1] - torch.remainder(sum(ks), world)
    return ks[rank].float() * 2.0 ** -10


def mean_grad(name, shape, step, world):
    return sum(grad_for(name, shape, step, r, world) for r in range(world)) / world


def inject(opt, step, rank, world, as_one=False):
    """This rank's gradients, through autograd into every item's live Parameter (the optimizer's
    hooks; a converted weight's is its replicated GatheredWeight); as_one: the mean of all
    `world` ranks' (a world of one that must reproduce a group of `world`, grad_reduce='mean')."""
    ps = [it.live_param() for it in opt._items]
    gs = [(mean_grad(it.name, it.shape, step, world) if as_one else grad_for(it.name, it.shape, step, rank, world))
          .to(p.dtype) for it, p in zip(opt._items, ps)]
    torch.autograd.backward(ps, gs)


def initial_masters(m):
    """{item name: its fp32 master before any optimizer took the model} (a converted weight's
    QuantMaster data, a dense parameter's values)."""
    return {n: (C.master_value(o) if is_param_linear(o) else o.detach()).float().reshape(shape).clone()
            for n, o in C.item_table(m) for shape in [C.shape_of(o)]}


class Reference:
    """One process's torch optimizer over every item's full fp32 tensor, fed the mean of every
    rank's gradients (what the group's masters must equal bit for bit)."""

    def __init__(self, m, world):
        self.world = world
        self.vals = initial_masters(m)
        self.inner = _factory()([{"params": list(self.vals.values())}])

    def step(self, s):
        for n, v in self.vals.items():
            v.grad = mean_grad(n, v.shape, s, self.world)
        self.inner.step()


def full_masters(opt):
    """Every item's full fp32 master, its rows gathered from every rank's view (opt._views)."""
    mine = [v.detach().cpu().clone() for v, _, _ in opt._views]
    every = C._gather_obj(mine)
    out = {}
    for i, (v, b, pos) in enumerate(opt._views):
        it = opt.buckets[b].items[pos]
        out[it.name] = torch.cat([every[r][i].reshape((-1,) + it.shape[1:]) for r in range(len(every))]) \
            .reshape(it.shape)
    return out


def _u8(t):
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def planes_of(o):
    return o._parameters["weight"]._box.planes


def check_primaries(m, full, round_through="bf16"):
    """Every NVFP4Linear's replicated planes (data, scales, amax on each plane) == quantize_nvfp4
    of its whole master (rounded through bf16), every MXFP8Linear's == quantize; dense == master
    cast. Returns the number of NVFP4 buffers compared."""
    n = 0
    for name, o in C.item_table(m):
        if is_param_linear(o):
            src = full[name].reshape(o.out_features, o.in_features).contiguous()
            planes = planes_of(o)
            assert set(planes) == ({"row", "col"} if o.planes == "both" else {"row"}), (name, set(planes))
            assert o.primary is planes["row"]
        if is_nvfp4(o):
            w = mxshard.NVFP4Weight.empty(o.out_features, o.in_features, planes=o.planes, block=o.block,
                                          layout=o.layout, device="cpu")
            mxshard.quantize_nvfp4(w, src, round_through=round_through)
            for k in BUFS:
                a = [getattr(planes[p], k, None) for p in planes if k == "amax" or p == k[:3]]
                b = getattr(w, k)
                assert (not a or a[0] is None) == (b is None), f"{name}.{k} presence"
                for x in a:
                    if x is not None:
                        assert torch.equal(_u8(x), _u8(b)), \
                            f"{name}.{k}: {int((_u8(x) != _u8(b)).sum())} bytes differ from quantize_nvfp4 of the master"
                if b is not None:
                    n += 1
        elif is_mxfp8(o):
            w = mxshard.MXFP8Weight.empty(o.out_features, o.in_features, planes=o.planes, layout=o.layout,
                                          device="cpu")
            mxshard.quantize(w, src.to(torch.bfloat16) if round_through == "bf16" else src, rounding=o.rounding)
            for k in ("row_data", "row_scale", "col_data", "col_scale"):
                if getattr(w, k) is not None:
                    assert torch.equal(_u8(getattr(planes[k[:3]], k)), _u8(getattr(w, k))), f"{name}.{k}"
        else:
            assert torch.equal(_u8(o.detach()), _u8(full[name].reshape(o.shape).to(o.dtype))), name
    return n


def packing_kept(rows, cols, world):
    """Whether every rank's rows of an NVFP4 [rows, cols] weight start at an even element (its
    packed fragment starts at a byte), or one rank holds them all."""
    spans = [FG.rank_rows(rows, world, r) for r in range(world)]
    holders = [s for s in spans if s[1] > s[0]]
    return len(holders) == 1 or all((r0 * cols) % 2 == 0 and ((r1 - r0) * cols) % 2 == 0 for r0, r1 in holders[:-1])


def check_geometry(geoms, world):
    """Every item's rows are held once over the ranks (contiguous spans, FSDP2's dim-0 rule); item
    offsets are consecutive padded chunks; every NVFP4 item's rank rows keep the packing. Returns
    the number of NVFP4 items whose rows are split between ranks."""
    split = 0
    for g in geoms:
        at = 0
        for pos, it in enumerate(g.items):
            assert g.offsets[pos] == at, (it.name, g.offsets[pos], at)
            at += FG.chunk_rows(it.rows, world) * it.cols
            spans = [g.rows_of(pos, r) for r in range(world)]
            nxt = 0
            for r0, r1 in spans:
                if r1 > r0:
                    assert r0 == nxt, (it.name, spans)
                    nxt = r1
            assert nxt == it.rows, (it.name, spans)
            if it.kind.startswith("nvfp4"):
                assert packing_kept(it.rows, it.cols, world), (it.name, it.shape, world)
                split += sum(r1 > r0 for r0, r1 in spans) > 1
        assert g.shard == at
    return split


def digest(m, opt):
    """Bytes of everything a rank holds that must agree: every converted linear's replicated
    planes (data, scales, amax), the model's state (dense values, the frozen parameter) and the
    full masters."""
    model = {k: bytes(_u8(t).numpy()) for k, t in m.state_dict().items()}
    for name, o in C.item_table(m):
        if is_param_linear(o):
            for p, pl in planes_of(o).items():
                for k in BUFS:
                    t = getattr(pl, k, None)
                    if t is not None:
                        model[f"{name}:{p}:{k}"] = bytes(_u8(t).numpy())
    return {"model": model, "masters": {k: bytes(_u8(t).numpy()) for k, t in full_masters(opt).items()}}


def _factory():
    return lambda g: torch.optim.AdamW(g, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.05)


# ---- the cases -------------------------------------------------------------------

def case_exact(rank, world, bucket_size=700, align=128, steps=3, as_world=None, with_mx=True, round_through="bf16",
               modules=NV_EVEN):
    """NVFP4 (and MXFP8, dense) weights trained with injected dyadic gradients: after every
    step the full masters equal a one-process torch AdamW's bit for bit and each replicated
    plane equals quantize_nvfp4 of its whole master; the geometry keeps every NVFP4 packing;
    collective counts are the formula and equal the calls issued. as_world: a world of one
    that injects the mean gradient of `as_world` ranks (the reference the group's bytes must
    equal). Returns the digest of the final bytes."""
    m = build_model(with_mx=with_mx, modules=modules)
    ref = Reference(m, as_world or world)
    o = ShardedOptimizer(m, _factory(), bucket_size=bucket_size, align=align, round_through=round_through)
    split = check_geometry(o.buckets, world)
    assert [(it.name, it.kind) for it in o.items] == \
        [(n, "dense" if not is_param_linear(x) else f"{x.format}_{x.planes}") for n, x in C.item_table(m)]
    check_primaries(m, full_masters(o), round_through)
    issued, nb = 0, 0
    for s in range(steps):
        with C.count_dist_calls() as calls:   # (full buckets reduce from the backward's hooks: overlap)
            inject(o, s, rank, as_world or world, as_one=as_world is not None)
            o.step()
        issued += calls["n"]
        ref.step(s)
        o.zero_grad()
        full = full_masters(o)
        for n, v in ref.vals.items():
            assert torch.equal(full[n].view(torch.int32), v.detach().view(torch.int32)), \
                f"step {s}: the master of {n} differs from the one-process AdamW's"
        nb = check_primaries(m, full, round_through)
    exp = C.expected_per_step(o) if world > 1 else {}
    assert dict(o.collectives) == {k: v * steps for k, v in exp.items()}, (dict(o.collectives), exp)
    if world > 1:
        assert issued == sum(o.collectives.values()), (issued, dict(o.collectives))
    out = digest(m, o)
    o.close()
    return dict(out, buffers=nb, buckets=len(o.buckets), nv_split=split, per_step=exp)


def case_odd(rank, world):
    """The flat layout's NVFP4 shapes: the model raises the shard rule's NotImplementedError on
    EVERY rank (each its own, none a RemoteError; no hang) naming a weight that breaks it, and
    leaves the model as it was; each such module alone names itself; the modules the rule
    accepts at this world build. The group works afterwards."""
    out = {}
    m = build_model(modules=NV_MODULES)
    before = C.untouched_check(m)
    bad = [i for i, (_, _, _, (inf, outf)) in enumerate(NV_MODULES) if not packing_kept(outf, inf, world)]
    assert bad, "no NV_MODULES shape breaks the packing at this world"
    out["model"] = C._expect_raise(lambda: ShardedOptimizer(m, _factory(), bucket_size=700), rank, None,
                                   NotImplementedError, "use an even in_features")
    C.assert_untouched(m, before)
    out["each"] = {}
    for i, spec in enumerate(NV_MODULES):
        one = build_model(with_mx=False, modules=[spec])
        if i in bad:
            inf, outf = spec[3]
            out["each"][i] = C._expect_raise(lambda: ShardedOptimizer(one, _factory()), rank, None,
                                             NotImplementedError, f"for nv0 ({outf}x{inf}, NVFP4) over {world} ranks")
        else:
            o = ShardedOptimizer(one, _factory())
            inject(o, 0, rank, world)
            o.step()
            check_primaries(one, full_masters(o))
            o.close()
            out["each"][i] = "built"
    out["bad"] = bad
    return out


def case_failure(rank, world):
    """A rank-local failure raises on every rank (the failing rank its own error, the
    others RemoteError through the writeback's status entry); nobody hangs; then
    training goes on and the planes are still the quantization of the masters."""
    bad = 1
    out = {}
    m = build_model(with_mx=False)   # only NVFP4 weights carry the writeback's partial
    o = ShardedOptimizer(m, _factory(), bucket_size=700)
    inject(o, 0, rank, world)
    if rank == bad:
        def boom(*a, **k):
            raise ValueError("injected inner failure")
        o.inner.step = boom
    out["inner"] = C._expect_raise(o.step, rank, bad, ValueError, "injected")
    if rank == bad:
        del o.inner.step
    o.zero_grad()
    # a failure inside the first NVFP4 weight's partial (the writeback's WeightUnit) on rank 1
    it, unit = next((it, u) for it, u in o._refresh.units if it.kind.startswith("nvfp4"))
    inject(o, 1, rank, world)
    if rank == bad:
        def partial_boom(*a, **k):
            raise ValueError("injected partial failure")
        unit.partial = partial_boom
    out["partial"] = C._expect_raise(o.step, rank, bad, ValueError, "injected partial")
    if rank == bad:
        del unit.partial
    o.zero_grad()
    # nv0's weight Parameter replaced after construction on rank 1 (the flat layout's replaced amax)
    own = m.nv0._parameters["weight"]
    inject(o, 2, rank, world)
    if rank == bad:
        m.nv0.weight = nn.Parameter(torch.zeros(m.nv0.out_features, m.nv0.in_features))
    masters = [t.clone() for t in o._master]
    out["replaced"] = C._expect_raise(o.step, rank, bad, RuntimeError, "nv0.weight was replaced")
    assert all(torch.equal(a, b) for a, b in zip(masters, o._master)), "a refused step moved masters"
    o.zero_grad()
    m.nv0._parameters["weight"] = own
    inject(o, 3, rank, world)
    o.step()
    check_primaries(m, full_masters(o))
    d = C._gather_obj(digest(m, o))
    assert all(x == d[0] for x in d), "ranks hold different bytes after the failures"
    o.close()
    return out


def case_ckpt(rank, world, root, k=2, more=2):
    """Save after k steps (DCP), continue; a fresh model + optimizer of another bucket geometry
    loads it: byte-identical planes (amax included), masters and dense values, then the same
    steps give the same bytes. Rank 0 writes the references for the DP=1 load in the test process."""
    path = os.path.join(root, f"nv_ckpt_{world}")
    m1 = build_model()
    o1 = ShardedOptimizer(m1, _factory(), bucket_size=700)
    for s in range(k):
        inject(o1, s, rank, world)
        o1.step()
        o1.zero_grad()
    save_checkpoint(path, m1, o1, extra={"step": k})
    at_k = digest(m1, o1)
    for s in range(k, k + more):
        inject(o1, s, rank, world)
        o1.step()
        o1.zero_grad()
    after = digest(m1, o1)
    m2 = build_model(seed=5)
    o2 = ShardedOptimizer(m2, _factory(), bucket_size=3000, align=8)
    assert len(o2.buckets) != len(o1.buckets)
    assert digest(m2, o2) != at_k
    assert load_checkpoint(path, m2, o2) == {"step": k}
    assert digest(m2, o2) == at_k, "the loaded state differs from the saved one"
    for s in range(k, k + more):
        inject(o2, s, rank, world)
        o2.step()
        o2.zero_grad()
    assert digest(m2, o2) == after, "the resumed run differs from the uninterrupted one"
    if rank == 0:
        torch.save({"at_k": at_k, "after": after, "k": k, "more": more, "world": world},
                   os.path.join(root, f"nv_ref_{world}.pt"))
    o1.close()
    o2.close()
    return {"keys": len(at_k["model"])}


def resume_as_one(root, world):
    """The test process (a world of one) loads the group's checkpoint: bytes equal to the saved
    state, then `more` steps with the group's mean gradients give the group's bytes."""
    ref = torch.load(os.path.join(root, f"nv_ref_{world}.pt"), weights_only=False)
    m = build_model(seed=9)
    o = ShardedOptimizer(m, _factory(), bucket_size=10 ** 6)
    assert load_checkpoint(os.path.join(root, f"nv_ckpt_{world}"), m, o) == {"step": ref["k"]}
    assert digest(m, o) == ref["at_k"], f"DP=1 load of the DP={world} checkpoint differs from the saved state"
    for s in range(ref["k"], ref["k"] + ref["more"]):
        inject(o, s, 0, ref["world"], as_one=True)
        o.step()
        o.zero_grad()
    assert digest(m, o) == ref["after"], f"DP=1 continuation differs from the DP={world} one"
    return o


CASES = {"exact": case_exact, "odd": case_odd, "failure": case_failure, "ckpt": case_ckpt}


def plan(root):
    return [("exact", "exact", {}),
            ("exact_odd_align", "exact", {"align": 3, "bucket_size": 1200, "steps": 2}),
            ("odd", "odd", {}),
            ("failure", "failure", {}),
            ("ckpt", "ckpt", {"root": root})]


def worker(rank, world, port, q, plan=None):
    H.run_rank(rank, world, port, q, plan, CASES, gloo_timeout=20)


if os.environ.get(H.WARM_UP_VAR) == "1":
    torch.set_num_threads(1)

# SPDX-License-Identifier: MIT
"""ShardedOptimizer cases run by every rank of a gloo group spawned by
test_torch_optim.py (one group of 2 and one of 3 processes; each runs all
cases), and some of them in a world of one in the test process itself.
Each case returns a small summary or raises."""
import contextlib
import io
import math
import os
import zlib

import torch
import torch.distributed as dist
from torch import nn

import mxshard
import torch_harness as H
from mxshard.torch import MXFP8Linear, ShardedOptimizer, dequantized_weight, is_mxfp8, is_param_linear
from mxshard.torch.fsdp.master import QuantMaster

EPS32 = 2.0 ** -24


def _live():
    return dist.is_available() and dist.is_initialized()


def _gather_obj(x):
    if not _live():
        return [x]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, x)
    return out


# ---- models -----------------------------------------------------------------------

def build_model(layout="padded", planes_c="both", seed=0, b_rows=33, extra_dense=None, device="cpu"):
    """Several MXFP8Linear of odd shapes (1x40, 33x65, 128x96), fp32 and bf16
    dense parameters (an Embedding, a LayerNorm, an fp32 bias and a bf16
    bias, a bare bf16 parameter) and a frozen parameter."""
    torch.manual_seed(seed)
    m = nn.Module()
    m.emb = nn.Embedding(11, 40)
    m.a = MXFP8Linear(40, 1, planes="row", layout=layout)
    m.b = MXFP8Linear(65, b_rows, planes="both", layout=layout)
    m.c = MXFP8Linear(96, 128, bias=False, planes=planes_c, layout=layout)
    m.ln = nn.LayerNorm(33)
    m.b.bias = nn.Parameter(m.b.bias.detach().to(torch.bfloat16))
    m.h = nn.Parameter(torch.randn(5, 7).to(torch.bfloat16))
    m.frozen = nn.Parameter(torch.randn(3), requires_grad=False)
    if extra_dense is not None:
        m.extra = nn.Parameter(extra_dense)
    return m.to(device) if device != "cpu" else m


def groups_of(m):
    """Two param groups (decay / no decay) naming items in every supported way."""
    return [{"params": [m.a, "b", m.c, m.emb.weight, "h"], "weight_decay": 0.1},
            {"params": [m.a.bias, m.b.bias, m.ln.weight, "ln.bias"], "weight_decay": 0.0}]


def item_table(m):
    """(name, obj) of every trainable item in model order (the optimizer's: items.collect):
    obj is the converted linear (MXFP8Linear, NVFP4Linear) for its weight, else the Parameter."""
    out, seen = [], set()
    for mn, mod in m.named_modules():
        for pn, p in mod.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            name = f"{mn}.{pn}" if mn else pn
            if is_param_linear(mod) and pn == "weight":
                out.append((name, mod))
            elif p.requires_grad:
                out.append((name, p))
    return out


def shape_of(o):
    return (o.out_features, o.in_features) if is_param_linear(o) else tuple(o.shape)


def master_value(o):
    """A converted linear's fp32 master before any optimizer took it (its QuantMaster's data), else
    the values its forward uses (the row plane dequantized)."""
    w = o._parameters["weight"]
    return w._data.float() if isinstance(w, QuantMaster) else dequantized_weight(o)


def initial_values(m):
    return {n: (master_value(o) if is_param_linear(o) else o.detach()).float().reshape(-1).clone()
            for n, o in item_table(m)}


def grad_for(name, shape, step, rank):
    """Dyadic gradients (small integers * 2^-10): sums are exact in any order."""
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()) * 1000 + step * 17 + rank)
    return torch.randint(-8, 9, tuple(shape), generator=g).float() * 2.0 ** -10


def inject(m, step, rank):
    """Sets every item's .grad (a converted linear's on its weight Parameter, as autograd would):
    the optimizer takes gradients set outside its hooks at step()."""
    for n, o in item_table(m):
        p = o._parameters["weight"] if is_param_linear(o) else o
        p.grad = grad_for(n, shape_of(o), step, rank).to(dtype=p.dtype, device=p.device)


FACTORIES = {
    "adamw": lambda fe: (lambda g: torch.optim.AdamW(g, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.05,
                                                     foreach=fe)),
    "sgd": lambda fe: (lambda g: torch.optim.SGD(g, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01,
                                                 foreach=fe)),
}


class Reference:
    """ONE process's plain optimizer over the full fp32 vectors (one per param
    group) with the summed or mean gradients of every rank."""

    def __init__(self, m, factory, use_groups, world, grad_reduce="mean", max_grad_norm=None, idle=None):
        self.table = item_table(m)
        init = initial_values(m)
        self.world, self.grad_reduce, self.max_grad_norm = world, grad_reduce, max_grad_norm
        self.idle = idle  # a rank that runs no backward: its gradients count as zeros
        if use_groups:
            opts = groups_of(m)
            names = {}
            for gi, g in enumerate(opts):
                for e in g["params"]:
                    names[self._name(m, e)] = gi
            rest = [n for n, _ in self.table if n not in names]
            if rest:  # the optimizer's default group: no overrides
                names.update({n: len(opts) for n in rest})
                opts = opts + [{"params": []}]
        else:
            opts = [{"params": []}]
            names = {n: 0 for n, _ in self.table}
        self.members = [[n for n, _ in self.table if names[n] == gi] for gi in range(len(opts))]
        self.vecs = [torch.cat([init[n] for n in mem]) for mem in self.members]
        self.inner = factory([dict({k: v for k, v in o.items() if k != "params"}, params=[v])
                              for o, v in zip(opts, self.vecs)])
        self.norm = None

    def _name(self, m, e):
        if isinstance(e, str):
            return e if any(n == e for n, _ in self.table) else e + ".weight"
        for n, o in self.table:
            if o is e:
                return n
        raise KeyError(e)

    def step(self, step):
        shapes = {n: shape_of(o) for n, o in self.table}
        for v, mem in zip(self.vecs, self.members):
            parts = []
            for n in mem:
                acc = torch.zeros(int(torch.Size(shapes[n]).numel()), device=v.device)
                for r in range(self.world):
                    if r != self.idle:
                        acc += grad_for(n, shapes[n], step, r).reshape(-1).to(v.device)
                if self.grad_reduce == "mean" and self.world > 1:
                    acc /= self.world
                parts.append(acc)
            v.grad = torch.cat(parts)
        total = 0.0
        for v in self.vecs:
            c = v.grad.double()
            total += float(torch.dot(c, c))
        self.norm = total ** 0.5
        if self.max_grad_norm is not None:
            coef = self.max_grad_norm / (self.norm + 1e-6)
            if coef < 1.0:
                for v in self.vecs:
                    v.grad.mul_(coef)
        self.inner.step()

    def values(self):
        out = {}
        for v, mem in zip(self.vecs, self.members):
            o = 0
            for n in mem:
                numel = int(torch.Size(shape_of(dict(self.table)[n])).numel())
                out[n] = v.detach()[o:o + numel]
                o += numel
        return out


# ---- checks --------------------------------------------------------------------

def _bits(t):
    return t.contiguous().view(torch.int32) if t.dtype == torch.float32 else t.contiguous().view(torch.int16)


def my_rows(opt, b, pos):
    """(item, r0, r1): the rows of item `pos` of bucket `b` this rank holds."""
    g = opt.buckets[b]
    r0, r1 = g.rows_of(pos, opt.rank)
    return g.items[pos], r0, r1


def check_masters(opt, ref_vals):
    """This rank's master shards (its rows of every item, FSDP2's dim-0 rule) equal the
    reference, bit for bit; the shards' padding is 0. Returns the elements this rank owns."""
    n = 0
    covered = [torch.zeros(g.shard, dtype=torch.bool) for g in opt.buckets]
    for v, b, pos in opt._views:
        it, r0, r1 = my_rows(opt, b, pos)
        want = ref_vals[it.name].reshape(it.rows, it.cols)[r0:r1].reshape(v.shape)
        assert torch.equal(_bits(v.cpu()), _bits(want.cpu())), \
            f"rank {opt.rank} master of {it.name} rows [{r0}:{r1}] differs: max |d| = {(v.cpu() - want.cpu()).abs().max()}"
        o = opt.buckets[b].offsets[pos]
        covered[b][o:o + v.numel()] = True
        n += v.numel()
    assert len(opt._views) == len(opt.items)
    for b, c in enumerate(covered):
        assert (opt._master[b].cpu()[~c] == 0).all(), "padding of a master shard is not zero"
    return n


def planes_of(o):
    """A converted linear's replicated planes under the optimizer: {"row": .., "col": ..}."""
    return o._parameters["weight"]._box.planes


def check_weights(m, full):
    """Every converted linear's planes == whole-tensor quantize of bf16(master) (every rank),
    module.primary is the row plane, and every dense parameter == master cast to its dtype."""
    for n, o in item_table(m):
        if is_param_linear(o):
            assert is_mxfp8(o), n
            w = mxshard.MXFP8Weight.empty(o.out_features, o.in_features, planes=o.planes, layout=o.layout,
                                          device="cpu")
            src = full[n].cpu().reshape(o.out_features, o.in_features).to(torch.bfloat16).contiguous()
            mxshard.quantize(w, src, rounding=o.rounding)
            planes = planes_of(o)
            assert set(planes) == ({"row", "col"} if o.planes == "both" else {"row"}), (n, set(planes))
            assert o.primary is planes["row"]
            for k in ("row_data", "row_scale", "col_data", "col_scale"):
                a = getattr(planes[k[:3]], k, None) if k[:3] in planes else None
                b = getattr(w, k)
                assert (a is None) == (b is None), f"{n}.{k} presence"
                if a is not None:
                    a = a.cpu()
                    assert torch.equal(a.reshape(-1), b.reshape(-1)), \
                        f"{n}.{k}: {(a.reshape(-1) != b.reshape(-1)).sum()} bytes differ from the whole-tensor quantize"
        else:
            want = full[n].cpu().reshape(o.shape).to(o.dtype)
            assert torch.equal(_bits(o.detach().cpu()), _bits(want)), f"{n} differs from its master cast to {o.dtype}"


def full_masters(opt):
    """The full master of every item (flat fp32), assembled from every rank's rows."""
    mine = [v.detach().cpu().clone() for v, _, _ in opt._views]
    every = _gather_obj(mine) if opt.world > 1 else [mine]
    out = {}
    for i, (v, b, pos) in enumerate(opt._views):
        it = opt.buckets[b].items[pos]
        t = torch.cat([every[r][i].reshape(-1) for r in range(opt.world)])
        assert t.numel() == it.numel, (it.name, t.numel(), it.numel)
        out[it.name] = t
    return out


def expected_per_step(opt):
    """One reduction per bucket, the norm all-reduce, one MAX all-reduce (every converted weight's
    shared entries and the status), one all_gather per bucket."""
    nb = len(opt.buckets)
    c = {"reduce_scatter" if opt.comm.has_reduce_scatter else "all_reduce_grad": nb, "all_reduce_norm": 1,
         "all_reduce_max": 1, "all_gather": nb}
    return c


def untouched_check(m):
    """What a construction would attach to `m`: (parameter objects, buffer data pointers, hooks)."""
    return ({n: id(p) for n, p in m.named_parameters()}, {n: p.data_ptr() for n, p in m.named_parameters()},
            {n: t.data_ptr() for n, t in m.named_buffers()},
            sum(len(getattr(p, "_post_accumulate_grad_hooks", None) or {}) for p in m.parameters()),
            sum(len(mod._forward_pre_hooks) for mod in m.modules()),
            [getattr(mod, "_mxs_owner", None) for mod in m.modules()])


def assert_untouched(m, before):
    now = untouched_check(m)
    what = ("parameter objects", "parameter storage", "buffer storage", "gradient hooks", "forward pre-hooks",
            "owners")
    for k, a, b in zip(what, before, now):
        if k == "owners":
            assert all(x is None or x() is None for x in b), "a failed construction left the module owned"
        else:
            assert a == b, f"a failed construction changed the model's {k}"
    for _, o in item_table(m):
        if is_param_linear(o):
            assert isinstance(o._parameters["weight"], QuantMaster), "a failed construction left a replaced weight"


@contextlib.contextmanager
def count_dist_calls():
    """Counts every torch.distributed collective the package issues."""
    names = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor")
    orig = {n: getattr(dist, n) for n in names}
    calls = {"n": 0}

    def wrap(f):
        def g(*a, **k):
            calls["n"] += 1
            return f(*a, **k)
        return g
    for n in names:
        setattr(dist, n, wrap(orig[n]))
    try:
        yield calls
    finally:
        for n in names:
            setattr(dist, n, orig[n])


def _expect_raise(f, rank, bad_rank, local_exc, local_match=None):
    """f() must raise: `local_exc` on bad_rank (None: every rank raises it),
    RemoteError elsewhere."""
    try:
        f()
    except mxshard.RemoteError as e:
        assert bad_rank is not None and rank != bad_rank, f"rank {rank}: unexpected RemoteError {e}"
        return "remote"
    except local_exc as e:
        assert bad_rank is None or rank == bad_rank, f"rank {rank}: unexpected {type(e).__name__}: {e}"
        if local_match:
            assert local_match in str(e), f"{local_match!r} not in {e}"
        return "local"
    raise AssertionError(f"rank {rank}: no exception")


# ---- the cases -------------------------------------------------------------------

def case_exact(rank, world, layout="padded", opt="adamw", foreach=False, groups=True, bucket_size=2500,
               max_grad_norm=None, grad_reduce="mean", planes_c="both", align=128, steps=3, extra=0,
               device="cpu", direct=False, grad_dtype=torch.float32, idle=False):
    """Injected dyadic gradients; masters bit-identical to the one-process
    reference (also with bf16 gradient buffers: the dyadic gradients and
    their sums over <= 3 ranks are exact in bf16); primaries and dense params
    == whole-tensor quantize / cast of the master on every rank; collective
    counts as documented. idle=True: the last rank (of 2 or more) runs no
    backward in any step; its gradients count as zeros, in the norm and the
    clipping too (issue 34 item 8)."""
    idle_rank = world - 1 if idle and world > 1 else None
    def build():
        torch.manual_seed(7)
        ex = torch.randn(extra) if extra else None
        return build_model(layout, planes_c, extra_dense=ex, device=device)
    m = build()
    factory = FACTORIES[opt](foreach)
    ref = Reference(build(), factory, groups, world, grad_reduce, max_grad_norm, idle_rank)
    with direct_collectives(direct):
        o = ShardedOptimizer(m, factory, bucket_size=bucket_size, param_groups=groups_of(m) if groups else None,
                             max_grad_norm=max_grad_norm, grad_reduce=grad_reduce, align=align, grad_dtype=grad_dtype)
    assert o.comm.has_reduce_scatter == (direct and world > 1)
    check_weights(m, ref.values())  # construction's writeback: quantize(bf16(master)) already
    # items whose rows are split between ranks
    split = sum(1 for g in o.buckets for pos in range(len(g.items))
                if sum(1 for r in range(world) if g.rows_of(pos, r)[1] > g.rows_of(pos, r)[0]) > 1)
    # a rank that owns no row of a bucket's MXFP8 weights (it still takes part in their writeback)
    no_mx = sum(1 for g in o.buckets for r in range(world)
                if any(it.module is not None for it in g.items)
                and not any(g.rows_of(pos, r)[1] > g.rows_of(pos, r)[0]
                            for pos, it in enumerate(g.items) if it.module is not None))
    assert [(it.name, it.kind) for it in o.items] == \
        [(n, "dense" if not is_param_linear(x) else f"mxfp8_{x.planes}") for n, x in item_table(m)]
    with count_dist_calls() as calls:
        for s in range(steps):
            if rank != idle_rank:
                inject(m, s, rank)
            o.step()
            ref.step(s)
            o.zero_grad()
            if max_grad_norm is not None and grad_reduce == "sum":
                assert o.last_grad_norm == ref.norm, (o.last_grad_norm, ref.norm)  # exact sums
            else:
                assert abs(o.last_grad_norm - ref.norm) <= 1e-12 * ref.norm
    n = check_masters(o, ref.values())
    check_weights(m, ref.values())
    exp = expected_per_step(o) if world > 1 else {}
    assert dict(o.collectives) == {k: v * steps for k, v in exp.items()}, (dict(o.collectives), exp)
    if world > 1:
        assert calls["n"] == sum(o.collectives.values())
    return {"owned": n, "total": sum(math.prod(it.shape) for it in o.items), "buckets": len(o.buckets),
            "rank_without_mx": no_mx, "split_items": split, "per_step": exp,
            "norm": ref.norm}


@contextlib.contextmanager
def direct_collectives(on=True):
    """The NCCL code path on gloo (torch >= 2.x gloo has reduce_scatter_tensor
    and all_gather_into_tensor on CPU): gradients reduce-scattered into a
    separate shard, dense gathers with all_gather_into_tensor."""
    from mxshard.torch.zero import comm as comm
    if not on:
        yield
        return
    orig = comm.Comm.__init__

    def init(self, group=None):
        orig(self, group)
        self.gloo = False
    comm.Comm.__init__ = init
    try:
        yield
    finally:
        comm.Comm.__init__ = orig


class MLP(nn.Module):
    def __init__(self, layout):
        super().__init__()
        self.up = MXFP8Linear(40, 33, planes="both", layout=layout)
        self.ln = nn.LayerNorm(33)
        self.mid = nn.Linear(33, 20)
        self.down = MXFP8Linear(20, 8, planes="row", layout=layout)

    def forward(self, x):
        h = torch.nn.functional.gelu(self.up(x).float())
        h = self.mid(self.ln(h))
        return self.down(h).float()


def _data(rank, step, k=0, device="cpu"):
    g = torch.Generator().manual_seed(rank * 1000 + step * 10 + k)
    return torch.randn(6, 40, generator=g).to(device)


def _grads_of(mod):
    """Every item's gradient of the reference model (no optimizer: autograd's .grad, a converted
    weight's on its master Parameter), flat fp32; cleared."""
    out = {}
    for n, o in item_table(mod):
        p = o._parameters["weight"] if is_param_linear(o) else o
        out[n] = p.grad.detach().float().reshape(-1).clone()
        p.grad = None
    return out


@torch.no_grad()
def _sync_ref(ref, net, opt, x):
    """The reference model (no optimizer) takes the optimizer's full masters: its forward
    quantizes them as the optimizer's writeback did (checked on `x`: the outputs are equal)."""
    full = full_masters(opt)
    for (n, o), (_, r) in zip(item_table(net), item_table(ref)):
        if is_param_linear(o):
            r._parameters["weight"].copy_(full[n].reshape(o.out_features, o.in_features))
        else:
            r.data.copy_(o.data)
    assert torch.equal(ref(x), net(x)), "the reference model does not compute what the optimizer's model does"


def case_fwdbwd(rank, world, layout="padded", steps=3, device="cpu"):
    """A real forward/backward through the hooks (different data per rank):
    the reduced gradient equals the reference sum of every rank's gradient
    within world * 2^-24 * sum|g_r| (fp32 sums in another order; exact for
    2 ranks); the hooks launch reductions during backward; collective
    counts as documented; no_sync accumulation; a second backward without
    no_sync makes every rank raise; then training goes on."""
    torch.manual_seed(3)
    net = MLP(layout).to(device)
    torch.manual_seed(3)
    ref = MLP(layout).to(device)
    o = ShardedOptimizer(net, lambda g: torch.optim.AdamW(g, lr=1e-3), bucket_size=700, grad_reduce="sum")
    names = [n for n, _ in item_table(net)]
    worst = 0.0
    with_counts = {}

    def reference_grads(step, micro):
        _sync_ref(ref, net, o, _data(rank, step, 0, device))
        per = []
        for r in range(world):
            for k in range(micro):
                ref(_data(r, step, k, device)).pow(2).sum().backward()
            per.append(_grads_of(ref))
        tot = {n: per[0][n].clone() for n in names}
        mag = {n: per[0][n].abs() for n in names}
        for g in per[1:]:
            for n in names:
                tot[n] += g[n]
                mag[n] += g[n].abs()
        return tot, mag

    def compare(tot, mag):
        nonlocal worst
        for v, b, pos in o._views:
            it, r0, r1 = my_rows(o, b, pos)
            n = it.name
            got = o.buckets[b].view(o._shard[b], pos, rank).float().reshape(-1)
            want = tot[n][r0 * it.cols:r1 * it.cols]
            bound = world * EPS32 * mag[n][r0 * it.cols:r1 * it.cols] + 1e-30
            d = (got - want).abs()
            assert (d <= bound).all(), f"{n}: reduced gradient off by {d.max()} (bound {bound.max()})"
            if world == 2:
                assert torch.equal(got, want), f"{n}: 2-rank sums are exact"
            if d.numel():
                worst = max(worst, float((d / bound).max()))

    for s in range(steps):
        tot, mag = reference_grads(s, 1)
        with count_dist_calls() as calls:
            before = dict(o.collectives)
            net(_data(rank, s, 0, device)).pow(2).sum().backward()
            launched_in_backward = o.collectives.get("all_reduce_grad", 0) - before.get("all_reduce_grad", 0)
            o.step()
        delta = {k: o.collectives[k] - before.get(k, 0) for k in o.collectives if o.collectives[k] != before.get(k, 0)}
        with_counts = delta
        if world > 1:
            assert delta == expected_per_step(o), (delta, expected_per_step(o))
            assert calls["n"] == sum(delta.values())
            assert launched_in_backward >= 1, "no bucket reduction was launched by the backward hooks"
        compare(tot, mag)
        o.zero_grad()
    # gradient accumulation: 2 micro-batches, the first under no_sync
    tot, mag = reference_grads(50, 2)
    with o.no_sync():
        net(_data(rank, 50, 0, device)).pow(2).sum().backward()
    net(_data(rank, 50, 1, device)).pow(2).sum().backward()
    o.step()
    compare(tot, mag)
    o.zero_grad()
    # two backwards without no_sync: every rank raises (late gradients), nobody hangs
    net(_data(rank, 60, 0, device)).pow(2).sum().backward()
    net(_data(rank, 61, 0, device)).pow(2).sum().backward()
    try:
        o.step()
        raise AssertionError("step() accepted gradients that arrived after their bucket's reduction")
    except RuntimeError as e:
        assert "after their bucket" in str(e) or isinstance(e, mxshard.RemoteError), e
        # the fix first (issue 33): what to do, then the names
        assert isinstance(e, mxshard.RemoteError) or str(e).startswith(
            "ShardedOptimizer.step: accumulate over several backwards inside `with opt.no_sync():`"), e
    o.zero_grad()
    net(_data(rank, 70, 0, device)).pow(2).sum().backward()
    o.step()
    o.zero_grad()
    full = full_masters(o)
    check_weights(net, full)
    digests = _gather_obj([bytes(t.cpu().view(torch.uint8).numpy().tobytes()) for t in net.state_dict().values()])
    assert all(d == digests[0] for d in digests), "ranks hold different weights"
    return {"worst_over_bound": worst, "per_step": with_counts, "buckets": len(o.buckets)}


def _local_parts(sd):
    """A state dict with every DTensor replaced by this rank's part (to_local())."""
    if isinstance(sd, dict):
        return {k: _local_parts(v) for k, v in sd.items()}
    if isinstance(sd, list):
        return [_local_parts(v) for v in sd]
    return sd.to_local() if hasattr(sd, "to_local") else sd


def case_resume(rank, world, layout="swizzled", k=2, more=2):
    """state_dict after k steps; a fresh model+optimizer loads it and goes on
    bit-identically to the uninterrupted run (masters and primaries)."""
    factory = FACTORIES["adamw"](True)

    def make():
        m = build_model(layout)
        return m, ShardedOptimizer(m, factory, bucket_size=2500, param_groups=groups_of(m))

    m1, o1 = make()
    for s in range(k):
        inject(m1, s, rank)
        o1.step()
        o1.zero_grad()
    buf = io.BytesIO()
    # (torch.save of the DTensors themselves fails in world > 1: "Attempted to access the data pointer on
    # an invalid python storage"; this rank's parts, which load_state_dict takes as well)
    torch.save(_local_parts(o1.state_dict()), buf)
    at_k = {n: t.clone() for n, t in m1.state_dict().items()}
    for s in range(k, k + more):
        inject(m1, s, rank)
        o1.step()
        o1.zero_grad()
    m2, o2 = make()
    buf.seek(0)
    sd = torch.load(buf, weights_only=False)
    o2.load_state_dict(sd)
    for n, t in m2.state_dict().items():
        assert torch.equal(_bits(t) if t.is_floating_point() else t, _bits(at_k[n]) if t.is_floating_point()
                           else at_k[n]), f"{n} not restored"
    assert o2.steps == k
    for s in range(k, k + more):
        inject(m2, s, rank)
        o2.step()
        o2.zero_grad()
    assert len(o1._master) == len(o2._master)
    for b1, b2 in zip(o1._master, o2._master):
        assert torch.equal(_bits(b1), _bits(b2))
    for (n, t1), (_, t2) in zip(m1.state_dict().items(), m2.state_dict().items()):
        assert torch.equal(t1.view(torch.uint8) if t1.dtype == torch.uint8 else _bits(t1),
                           t2.view(torch.uint8) if t2.dtype == torch.uint8 else _bits(t2)), f"{n} differs"
    # a bad state dict on one rank (another model's items): that rank ValueError, the others RemoteError
    first = next(iter(sd["masters"]))
    bad = dict(sd, masters={("x" + k if k == first else k): v for k, v in sd["masters"].items()}) \
        if rank == min(1, world - 1) else sd
    before = [t.clone() for t in o2._master]
    got = _expect_raise(lambda: o2.load_state_dict(bad), rank, min(1, world - 1) if world > 1 else None,
                        ValueError, "the items differ")
    assert all(torch.equal(_bits(a), _bits(b)) for a, b in zip(before, o2._master)), "a refused load changed masters"
    return {"resumed_steps": more, "bad_load": got}


def case_mismatch(rank, world):
    """Ranks that differ raise on every rank instead of hanging; the model of
    a failed construction is left as it was."""
    bad = 1
    out = {}
    factory = FACTORIES["adamw"](False)
    # 1. another bucket_size on rank 1
    m = build_model()
    before = untouched_check(m)
    out["bucket_size"] = _expect_raise(
        lambda: ShardedOptimizer(m, factory, bucket_size=2500 if rank != bad else 3000), rank, None,
        mxshard.PlanMismatchError, "differs between ranks")
    assert_untouched(m, before)
    # 2. another model shape on rank 1
    m = build_model(b_rows=33 if rank != bad else 34)
    before = untouched_check(m)
    out["shape"] = _expect_raise(lambda: ShardedOptimizer(m, factory, bucket_size=2500), rank, None,
                                 mxshard.PlanMismatchError, "b.weight")
    assert_untouched(m, before)
    # 3. a rank-local failure at construction (a float64 parameter on rank 1)
    m = build_model(extra_dense=torch.zeros(4, dtype=torch.float64) if rank == bad else torch.zeros(4))
    before = untouched_check(m)
    out["local"] = _expect_raise(lambda: ShardedOptimizer(m, factory, bucket_size=2500), rank, bad, TypeError,
                                 "float64")
    assert_untouched(m, before)
    # 4. another learning rate on rank 1 (plain numbers of the groups are in the fingerprint)
    m = build_model()
    out["lr"] = _expect_raise(
        lambda: ShardedOptimizer(m, lambda g: torch.optim.SGD(g, lr=0.1 if rank != bad else 0.2)), rank, None,
        mxshard.PlanMismatchError, "lr")
    # the group still works afterwards
    m = build_model()
    o = ShardedOptimizer(m, factory, bucket_size=2500)
    inject(m, 0, rank)
    o.step()
    return out


def case_step_failure(rank, world, device="cpu"):
    """A rank-local failure in step() makes every rank raise; nobody hangs;
    after a failure of the inner step (on one rank) training goes on."""
    bad = 1
    out = {}
    factory = FACTORIES["adamw"](False)
    # 1. a parameter's storage replaced after construction on rank 1
    m = build_model(device=device)
    o = ShardedOptimizer(m, factory, bucket_size=2500)
    if rank == bad:
        m.ln.weight.data = m.ln.weight.data.clone()
    inject(m, 0, rank)
    out["replaced"] = _expect_raise(o.step, rank, bad, RuntimeError, "ln.weight")
    # 2. the inner optimizer fails on rank 1: others learn of it through the writeback status bytes
    m = build_model(device=device)
    o = ShardedOptimizer(m, factory, bucket_size=2500)
    inject(m, 0, rank)
    if rank == bad:
        def boom(*a, **k):
            raise ValueError("injected inner failure")
        o.inner.step = boom
    out["inner"] = _expect_raise(o.step, rank, bad, ValueError, "injected")
    if rank == bad:
        del o.inner.step
    o.zero_grad()
    inject(m, 1, rank)
    o.step()
    # 3. a converted linear's weight Parameter replaced on rank 1 (where its gradient arrives)
    inject(m, 2, rank)
    if rank == bad:
        m.b.weight = nn.Parameter(torch.zeros(m.b.out_features, m.b.in_features, device=device))
    masters = [t.clone() for t in o._master]
    out["weight_replaced"] = _expect_raise(o.step, rank, bad, RuntimeError, "b.weight was replaced")
    assert all(torch.equal(_bits(a), _bits(b)) for a, b in zip(masters, o._master)), "a refused step moved masters"
    return out


CASES = {"exact": case_exact, "fwdbwd": case_fwdbwd, "resume": case_resume, "mismatch": case_mismatch,
         "step_failure": case_step_failure}

# (case id, case, kwargs) run by every spawned group
PLAN = [
    ("exact_adamw_padded", "exact", {"layout": "padded", "opt": "adamw", "foreach": False}),
    ("exact_adamw_foreach_swizzled", "exact", {"layout": "swizzled", "opt": "adamw", "foreach": True,
                                               "align": 8, "bucket_size": 1800}),
    ("exact_sgd_clip_padded", "exact", {"layout": "padded", "opt": "sgd", "foreach": False, "max_grad_norm": 0.05,
                                        "grad_reduce": "sum", "planes_c": "row"}),
    ("exact_sgd_clip_idle_rank", "exact", {"layout": "padded", "opt": "sgd", "max_grad_norm": 0.05,
                                           "grad_reduce": "sum", "idle": True}),
    ("exact_adamw_clip_idle_rank_mean", "exact", {"max_grad_norm": 0.05, "idle": True, "bucket_size": 1800}),
    ("exact_sgd_foreach_compact_onegroup", "exact", {"layout": "compact", "opt": "sgd", "foreach": True,
                                                     "groups": False, "bucket_size": 10 ** 6}),
    ("exact_adamw_default_group_rank_without_mx", "exact", {"bucket_size": 500, "extra": 20000}),
    ("exact_direct_collectives", "exact", {"direct": True, "foreach": True, "bucket_size": 1800}),
    ("fwdbwd", "fwdbwd", {}),
    ("resume", "resume", {}),
    ("mismatch", "mismatch", {}),
    ("step_failure", "step_failure", {}),
]


# the same on one CUDA device (2 gloo ranks sharing it; test_torch_optim.py::test_cuda_*)
PLAN_CUDA = [
    ("cuda_exact_adamw", "exact", {"device": "cuda", "foreach": True}),
    ("cuda_exact_sgd_clip", "exact", {"device": "cuda", "opt": "sgd", "max_grad_norm": 0.05, "grad_reduce": "sum",
                                      "layout": "swizzled"}),
    ("cuda_fwdbwd", "fwdbwd", {"device": "cuda"}),
    ("cuda_step_failure", "step_failure", {"device": "cuda"}),
]


def warm_up():
    """Imports and first-call costs paid once in the forkserver that test_torch_optim
    forks the ranks from (torch.optim's lazy torch._dynamo import, the first bf16
    GEMM / layer_norm / gelu / backward), single-threaded so that no thread pool
    exists at fork time."""
    import torch._dynamo  # noqa: F401  (imported lazily by the first optimizer step)
    torch.set_num_threads(1)
    m = MLP("padded")
    m(torch.randn(2, 40)).pow(2).sum().backward()
    o = torch.optim.AdamW([torch.zeros(3)], foreach=False)
    o.param_groups[0]["params"][0].grad = torch.ones(3)
    o.step()


if os.environ.get(H.WARM_UP_VAR) == "1":
    warm_up()


def worker(rank, world, port, q, plan=None):
    H.run_rank(rank, world, port, q, plan or PLAN, CASES, gloo_timeout=20)

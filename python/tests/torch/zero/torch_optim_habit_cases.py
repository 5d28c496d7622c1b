# SPDX-License-Identifier: MIT
"""ShardedOptimizer and the habits of torch.optim users (issue 24): cases run
by every rank of the gloo groups test_torch_optim.py spawns (after every case
of torch_dist_cases.PLAN, in the same groups: PLAN here is both), and a few
helpers the world-of-one tests of test_torch_optim_habits.py share. Each case
returns a small summary or raises."""
import gc

import torch
from torch import nn

import mxshard
import torch_dist_cases as C
import torch_harness as H
from mxshard.torch import ShardedOptimizer, dequantized_weight


def snapshot(m, opt):
    """Everything a step may change: masters, inner state, the model's tensors (a converted
    weight's: its row plane dequantized), steps."""
    return {"masters": [t.clone() for t in opt._master],
            "inner": {id(v): {k: x.clone() if isinstance(x, torch.Tensor) else x for k, x in st.items()}
                      for v, st in opt.inner.state.items()},
            "model": {k: v.clone() for k, v in m.state_dict().items()}, "steps": opt.steps}


def same(a, b):
    """Bit-equal snapshots (the names of what differs, else [])."""
    diff = []
    for i, (x, y) in enumerate(zip(a["masters"], b["masters"])):
        if not torch.equal(x.view(torch.int32), y.view(torch.int32)):
            diff.append(f"master {i}")
    if a["inner"].keys() != b["inner"].keys():
        diff.append("inner state keys")
    for k, st in a["inner"].items():
        for n, x in st.items():
            y = b["inner"].get(k, {}).get(n)
            if not (torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y):
                diff.append(f"inner state {n}")
    for k, v in a["model"].items():
        if not torch.equal(v.view(torch.uint8) if v.dtype == torch.uint8 else v, b["model"][k]):
            diff.append(k)
    if a["steps"] != b["steps"]:
        diff.append("steps")
    return diff


def values(m):
    """Every item's value as the forward sees it, fp32 flat: a converted weight's row plane
    dequantized, a dense parameter."""
    return {n: (dequantized_weight(o) if C.is_param_linear(o) else o.detach()).float().reshape(-1).clone()
            for n, o in C.item_table(m)}


def _walk_tb(tb):
    import traceback
    return list(traceback.walk_tb(tb))


def alive_optimizers():
    """ShardedOptimizers still in memory (gc tracks objects in unreachable cycles too)."""
    return sum(1 for o in gc.get_objects() if type(o) is ShardedOptimizer)


def _adamw(g):
    return torch.optim.AdamW(g, lr=1e-2, weight_decay=0.1)


def converted(fmt="mxfp8", policy="row", seed=0, bias0=True):
    """The QA probes' model: Linear(64, 96), GELU, Linear(96, 64), convert()ed."""
    import mxshard.torch as mxt
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(64, 96, bias=bias0), nn.GELU(), nn.Linear(96, 64))
    return mxt.convert(m, policy, format=fmt)


def backward(m, rank, step):
    """One forward and backward of `m` (a converted() model) on this rank's batch `step`."""
    g = torch.Generator().manual_seed(100 + 10 * rank + step)
    x, y = torch.randn(16, 64, generator=g), torch.randn(16, 64, generator=g)
    torch.nn.functional.mse_loss(m(x).float(), y).backward()


def first_sentence(e):
    return str(e).split(". ")[0]


# ---- the cases -------------------------------------------------------------------

def case_no_gradient_step(rank, world):
    """No backward on any rank: step() changes nothing on every rank (and issues
    only the reductions and the norm all-reduce); a gradient on rank 0 only:
    every rank steps (the others' zeros count), and the ranks agree."""
    m = C.build_model()
    o = ShardedOptimizer(m, _adamw, bucket_size=2500)
    C.inject(m, 0, rank)
    o.step()
    o.zero_grad()
    before, n0 = snapshot(m, o), dict(o.collectives)
    o.step()
    diff = same(before, snapshot(m, o))
    assert not diff, f"a step without gradients changed {diff}"
    kinds = {k for k, v in o.collectives.items() if v != n0.get(k, 0)}
    assert kinds <= {"all_reduce_grad", "all_reduce_norm"}, kinds
    if rank == 0:
        C.inject(m, 1, rank)
    o.step()
    assert o.steps == 2
    digests = C._gather_obj([bytes(t.view(torch.uint8).numpy().tobytes()) if t.dtype == torch.uint8 else
                             t.float().numpy().tobytes() for t in m.state_dict().values()])
    assert all(d == digests[0] for d in digests), "ranks hold different weights"
    return {"noop_collectives": sorted(kinds)}


def case_model_written(rank, world):
    """model.load_state_dict() on rank 1 only: the next step raises on every
    rank (rank 1 naming masters_from_model, the others RemoteError) and
    changes nothing; masters_from_model() (collective) makes the loaded
    values the masters; model_from_masters() undoes a write."""
    bad = 1
    m = C.build_model()
    o = ShardedOptimizer(m, _adamw, bucket_size=2500)
    C.inject(m, 0, rank)
    o.step()
    o.zero_grad()
    trained = {k: v.clone() for k, v in m.state_dict().items() if k != "frozen"}  # (not the optimizer's)
    if rank == bad:
        m.load_state_dict(C.build_model(seed=5).state_dict())
    before = snapshot(m, o)
    assert not same(before, snapshot(m, o))
    C.inject(m, 1, rank)
    got = C._expect_raise(o.step, rank, bad, RuntimeError, "masters_from_model")
    diff = same(before, snapshot(m, o))
    assert not diff, f"a refused step changed {diff}"
    # undo: every rank writes its weights from the masters again
    o.model_from_masters()
    assert all(torch.equal(m.state_dict()[k], v) for k, v in trained.items()), "model_from_masters did not undo"
    # train on from loaded values: every rank loads, then masters_from_model
    sd5 = C.build_model(seed=5).state_dict()
    m.load_state_dict(sd5)
    loaded = {n: sd5[n].float().reshape(-1) for n, _ in C.item_table(m)}   # (a converted weight: its
    converted = {n for n, obj in C.item_table(m) if not isinstance(obj, torch.Tensor)}   # FP32 master exactly)
    o.masters_from_model()
    full = C.full_masters(o)
    for n, v in loaded.items():
        assert torch.equal(full[n], v), f"{n}: the master is not the loaded value"
    assert all(getattr(x, "_mxs_loaded", None) is None for x in m.modules()), "masters_from_model kept a copy"
    after = values(m)
    for n, v in loaded.items():  # a dense parameter holds the loaded value; a converted weight its quantize
        if n in converted:       # (check_weights: the whole-tensor quantize of the loaded master)
            assert not torch.equal(after[n], v), f"{n}: the loaded FP32 values should not be representable"
        else:
            assert torch.equal(after[n], v), f"{n}: the writeback after masters_from_model changed its values"
    C.check_weights(m, full)
    o.zero_grad()
    C.inject(m, 2, rank)
    o.step()
    C.check_weights(m, C.full_masters(o))
    return {"refused": got}


def case_set_master(rank, world):
    """A new weight written into a converted linear the optimizer owns (module.load_state_dict, the
    way the removed set_master_ went): on one rank only, the next step raises on every rank (that
    rank naming masters_from_model) and changes nothing; on every rank followed by
    masters_from_model(), the masters take the new values and training goes on from them. A write
    through module.weight is refused, its first sentence saying to load and masters_from_model."""
    bad = 1
    out = {}
    for fmt, policy in (("mxfp8", "row"), ("nvfp4", "both")):
        m = converted(fmt, policy)
        o = ShardedOptimizer(m, _adamw)
        backward(m, rank, 0)
        o.step()
        o.zero_grad()
        before = snapshot(m, o)
        try:
            with torch.no_grad():
                m[0].weight.mul_(0)
            raise AssertionError("a write into module.weight was accepted")
        except RuntimeError as e:
            first = first_sentence(e)
            assert first.startswith("mxshard: write 0.weight through model.load_state_dict(sd) and then "
                                    "opt.masters_from_model() on every rank"), e
            assert "ParamLinear" not in str(e), e
        diff = same(before, snapshot(m, o))
        assert not diff, f"a refused write into module.weight changed {diff}"
        if rank == bad:
            m[0].load_state_dict({"weight": torch.zeros(96, 64)}, strict=False)
        backward(m, rank, 1)
        out[f"{fmt}_one_rank"] = C._expect_raise(o.step, rank, bad, RuntimeError,
                                                 "ShardedOptimizer.step: call opt.masters_from_model() (train on "
                                                 "from what was written) or opt.model_from_masters() (undo it) on "
                                                 "every rank: 0.weight was written")
        diff = same(before, snapshot(m, o))   # (the loaded value waits on the module: nothing changed yet)
        assert not diff, diff
        o.model_from_masters()   # (undo rank 1's write)
        assert getattr(m[0], "_mxs_loaded", None) is None and not same(before, snapshot(m, o))
        o.zero_grad()
        backward(m, rank, 1)
        o.step()                 # (the undone write no longer refuses a step)
        o.zero_grad()
        w = torch.linspace(-0.5, 0.5, 96 * 64).reshape(96, 64)
        m[0].load_state_dict({"weight": w}, strict=False)
        o.masters_from_model()
        full = C.full_masters(o)
        assert torch.equal(full["0.weight"], w.reshape(-1)), "the master is not the value written"
        written = dequantized_weight(m[0])
        assert 0 < (written - w).abs().max() <= 0.2 * w.abs().max()   # the planes: w quantized
        backward(m, rank, 2)
        o.step()
        moved = (C.full_masters(o)["0.weight"] - w.reshape(-1)).abs().max().item()
        assert 0 < moved < 0.05, f"the step after a load + masters_from_model moved the master by {moved}"
        o.close()
    return out


def case_requires_grad_changed(rank, world):
    """requires_grad changed on one rank after the optimizer was built (a dense parameter
    frozen; a converted weight frozen through module.weight or the module, with or without a
    bias; a parameter frozen at construction unfrozen): the next step raises on every rank,
    that rank first saying to freeze before building the optimizer, and changes nothing;
    undone, training goes on."""
    bad = 1

    def frozen_extra(m):
        m.register_parameter("extra", nn.Parameter(torch.zeros(3), requires_grad=False))
        return m
    changes = {
        "dense": (lambda m: m[2].bias.requires_grad_(False), lambda m: m[2].bias.requires_grad_(True), True),
        "weight": (lambda m: m[0].weight.requires_grad_(False), lambda m: m[0].weight.requires_grad_(True), True),
        "module_no_bias": (lambda m: m[0].requires_grad_(False), lambda m: m[0].requires_grad_(True), False),
        "unfrozen": (lambda m: m.extra.requires_grad_(True), lambda m: m.extra.requires_grad_(False), True),
    }
    out = {}
    for what, (change, undo, bias0) in changes.items():
        m = frozen_extra(converted(bias0=bias0))
        o = ShardedOptimizer(m, _adamw)
        backward(m, rank, 0)
        o.step()
        o.zero_grad()
        if rank == bad:
            change(m)
        before = snapshot(m, o)
        backward(m, rank, 1)
        out[what] = C._expect_raise(o.step, rank, bad, RuntimeError,
                                    "ShardedOptimizer.step: freeze or unfreeze parameters before building the "
                                    "ShardedOptimizer")
        diff = same(before, snapshot(m, o))
        assert not diff, f"{what}: a refused step changed {diff}"
        if rank == bad:
            undo(m)
        o.zero_grad()
        backward(m, rank, 2)
        o.step()
        assert o.steps == 2
        o.close()
    return out


def case_closure_raises(rank, world):
    """step(closure) whose closure raises on one rank, after its backward or before it: that
    rank raises its own exception, the others RemoteError, after the step's collectives (the
    other ranks used to abort in gloo: the failing rank had left step() before them); nothing
    changed; after zero_grad() training goes on."""
    bad = 1
    out = {}
    for when in ("after_backward", "before_backward"):
        m = converted()
        o = ShardedOptimizer(m, _adamw)
        backward(m, rank, 0)
        o.step()
        o.zero_grad()
        before = snapshot(m, o)

        def closure():
            if when == "after_backward":
                backward(m, rank, 1)
            if rank == bad:
                raise FloatingPointError("a non-finite loss")
            if when == "before_backward":
                backward(m, rank, 1)
            return torch.zeros(())
        out[when] = C._expect_raise(lambda: o.step(closure), rank, bad, FloatingPointError, "a non-finite loss")
        diff = same(before, snapshot(m, o))
        assert not diff, f"{when}: a refused step changed {diff}"
        o.zero_grad()
        backward(m, rank, 2)
        o.step()
        assert o.steps == 2
        o.close()
    return out


def case_ddp(rank, world):
    """A model that is, or contains, a DistributedDataParallel is refused on
    every rank, before anything of it is touched."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    out = {}
    for what in ("is", "contains"):
        inner = C.build_model()
        ddp = DDP(inner)
        m = ddp if what == "is" else nn.Sequential(nn.Linear(2, 2), ddp)
        ptrs = {n: p.data_ptr() for n, p in m.named_parameters()}
        try:
            ShardedOptimizer(m, _adamw)
            raise AssertionError("a DDP model was accepted")
        except ValueError as e:
            assert "DistributedDataParallel" in str(e) and "reduces the gradients itself" in str(e), e
            out[what] = "refused"
        assert {n: p.data_ptr() for n, p in m.named_parameters()} == ptrs
    # wrapped after construction: DDP's constructor (it flattens the replicated weights) or, at the
    # latest, the first step raises on every rank, naming DDP
    net = C.MLP("padded")
    o = ShardedOptimizer(net, _adamw)
    try:
        DDP(net)(C._data(rank, 0)).pow(2).sum().backward()
        o.step()
        raise AssertionError("a step through DDP was accepted")
    except RuntimeError as e:
        assert "DistributedDataParallel" in str(e), e
        out["wrapped_after"] = "raised"
    o.close()
    # a converted model wrapped after construction: DDP's reducer meets a dense .grad the optimizer holds
    m = converted()
    o = ShardedOptimizer(m, _adamw)
    try:
        backward(DDP(m), rank, 0)
        o.step()
        raise AssertionError("a step through DDP was accepted")
    except RuntimeError as e:
        assert "DistributedDataParallel" in str(e), e
        out["converted_wrapped_after"] = "raised"
    o.close()
    return out


def case_bf16_exact(rank, world):
    """grad_dtype=bfloat16: masters bit-identical to the fp32 one-process
    reference (dyadic gradients), with all_reduce (gloo) and with
    reduce_scatter into a separate bf16 shard."""
    a = C.case_exact(rank, world, grad_dtype=torch.bfloat16, max_grad_norm=0.05, steps=2)
    b = C.case_exact(rank, world, grad_dtype=torch.bfloat16, direct=True, foreach=True, bucket_size=1800,
                     steps=1)
    return {"per_step": a["per_step"], "direct": b["per_step"]}


def case_failed_construction_frees(rank, world):
    """Failed constructions (configurations that differ; a local failure on one
    rank) leave no ShardedOptimizer in memory once their exception is handled
    (no reference cycle: what held the process group is gone before
    destroy_process_group), and the mismatch says what to do in Python terms."""
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        base = alive_optimizers()
        msgs = []
        for kw, model in (({"bucket_size": 2500 + 500 * rank}, C.build_model()),
                          ({}, C.build_model(extra_dense=torch.zeros(4, dtype=torch.float64 if rank == 1
                                                                     else torch.float32)))):
            try:
                ShardedOptimizer(model, _adamw, **kw)
                raise AssertionError("constructed")
            except (mxshard.PlanMismatchError, mxshard.RemoteError, TypeError) as e:
                msgs.append(str(e))
                held = [f.f_locals["self"] for f, _ in _walk_tb(e.__traceback__.tb_next)  # (not this frame:
                        if type(f.f_locals.get("self")) is ShardedOptimizer]    # its f_locals would hold e)
                assert held and all(o.comm.group is None and o._closed for o in held), \
                    "a failed optimizer (reachable from its exception) still holds the process group"
                del held
        left = alive_optimizers() - base
    finally:
        if enabled:
            gc.enable()
    assert left == 0, f"{left} failed ShardedOptimizer(s) still in memory (a reference cycle)"
    assert "bucket_size" in msgs[0] and "every rank must build the same model" in msgs[0].lower(), msgs[0]
    assert "mxs_wb_make_plan" not in msgs[0], msgs[0]
    return {"left": left}


def case_fsdp_after(rank, world):
    """fully_shard (FSDP2) applied to a model after ShardedOptimizer took it over: over the
    converted linears (themselves, or the root that holds them) fully_shard itself raises on every
    rank; on a dense submodule only, the forward and backward run and step() raises on every rank;
    the first sentence says to use one of the two; the masters stay unchanged."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    advice = "Use ShardedOptimizer or FSDP2's fully_shard for a model, not both"
    mesh = init_device_mesh("cpu", (world,))
    out = {}
    for what in ("linears_and_root", "root", "dense_sub"):
        m = converted()
        if what == "dense_sub":
            m.append(nn.Linear(64, 64))
        o = ShardedOptimizer(m, _adamw)
        masters = [t.clone() for t in o._master]

        def train():
            if what == "linears_and_root":
                fully_shard(m[0], mesh=mesh)
                fully_shard(m[2], mesh=mesh)
            if what == "dense_sub":
                fully_shard(m[3], mesh=mesh)
            else:
                fully_shard(m, mesh=mesh)
            backward(m, rank, 0)
            o.step()
        try:
            train()
            raise AssertionError(f"{what}: training a fully_shard'ed model under ShardedOptimizer was accepted")
        except RuntimeError as e:
            first = first_sentence(e)
            assert advice in first, e
            assert first.startswith(advice if what != "dense_sub" else "ShardedOptimizer.step: " + advice), e
            out[what] = "fully_shard" if "ShardedOptimizer.step" not in str(e) else "step"
        assert all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(masters, o._master)), \
            f"{what}: a refused step changed the masters"
        o.close()
    return out


def case_export_subgroup(rank, world):
    """ShardedOptimizer over a data-parallel group without global rank 0 (new_group([1, 2]) of 3
    ranks, Megatron's layout): export_safetensors on its members writes the file (it waited for
    global rank 0, which is not in the group, and nobody wrote, silently); the file holds the
    bytes the members' forward uses."""
    import os
    import tempfile
    import torch.distributed as dist
    import mxshard.torch as mxt
    if world != 3:
        return {"skipped": world}
    sub = dist.new_group([1, 2])   # (every rank calls new_group)
    if rank == 0:
        dist.barrier()
        return {"member": False}
    torch.manual_seed(0)
    m = mxt.convert(nn.Sequential(nn.Linear(40, 48), nn.GELU(), nn.Linear(48, 8)), "row")
    o = ShardedOptimizer(m, lambda g: torch.optim.AdamW(g, lr=1e-2), process_group=sub)
    x = torch.randn(4, 40)
    m(x).pow(2).sum().backward()
    o.step()
    name = [tempfile.mkdtemp() if rank == 1 else None]
    dist.broadcast_object_list(name, src=1, group=sub)
    path = os.path.join(name[0], "model.safetensors")
    mxt.export_safetensors(path, m)
    dist.barrier(sub)
    written = os.path.exists(path)
    plain = nn.Sequential(nn.Linear(40, 48), nn.GELU(), nn.Linear(48, 8))
    mxt.load_safetensors(path, plain)
    same = all(torch.equal(plain[i].weight.detach(), dequantized_weight(m[i])) for i in (0, 2))
    o.close()
    dist.barrier(sub)
    if rank == 1:
        os.remove(path)
        os.rmdir(name[0])
    dist.barrier()
    return {"member": True, "written": written, "same": same}


CASES = dict(C.CASES, no_gradient_step=case_no_gradient_step, model_written=case_model_written, ddp=case_ddp,
             bf16_exact=case_bf16_exact, failed_construction_frees=case_failed_construction_frees,
             set_master=case_set_master, requires_grad_changed=case_requires_grad_changed,
             fsdp_after=case_fsdp_after, closure_raises=case_closure_raises, export_subgroup=case_export_subgroup)

HABITS = [
    ("no_gradient_step", "no_gradient_step", {}),
    ("model_written", "model_written", {}),
    ("ddp", "ddp", {}),
    ("bf16_exact", "bf16_exact", {}),
    ("failed_construction_frees", "failed_construction_frees", {}),
    ("set_master", "set_master", {}),
    ("requires_grad_changed", "requires_grad_changed", {}),
    ("fsdp_after", "fsdp_after", {}),
    ("closure_raises", "closure_raises", {}),
    ("export_subgroup", "export_subgroup", {}),
]
PLAN = C.PLAN + HABITS


def worker(rank, world, port, q, plan=None):
    H.run_rank(rank, world, port, q, plan or PLAN, CASES, gloo_timeout=20)

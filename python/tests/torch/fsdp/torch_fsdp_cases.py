# SPDX-License-Identifier: MIT
"""FSDP2 cases for MXFP8ParamLinear / NVFP4ParamLinear, run by every rank of
gloo groups spawned by test_torch_fsdp.py (and by a world of one). Each case
returns a small summary or raises.

Exactness needs gradients every rank and the reference agree on bit for bit:
every converted linear gets the identity as input and the loss sum(y * G)
with G dyadic (small integers * 2^-10), so its weight gradient is exactly
G^T on every rank and FSDP2's mean over ranks is one rounding of an exact sum,
as the reference's mean is."""
import os

import torch
import torch.distributed as dist
from torch import nn

import mxshard
import mxshard.torch as mxt
import torch_harness as H
from mxshard.torch.fsdp import linear as FL
from torch_dp_habit_cases import (case_collectives_into_weights, case_convert_after_ddp,
                                  case_save_checkpoint_split_paths, case_zero_redundancy)
from torch_fsdp_habit_cases import (case_assign, case_dcp_inplace, case_ema_copy, case_inference_first,
                                    case_product_in_forward, case_reshard_int, case_tied_embedding,
                                    case_assign_on_meta, case_export_rank_local_path, case_root_kept_gathered)
from torch_fsdp_model import (DEV, MODULES, Net, build, count_collectives, dev, fsdp, full_masters, grad_for,
                              loss_of, plane_bytes, quantize_whole, record_planes, shard_all)


# ---- the cases -------------------------------------------------------------------------

def case_exact(rank, world, steps=3, modules=MODULES, opt="adamw"):
    """Masters bit-identical to a world of one (same optimizer, the mean gradient); every plane
    the linears use (forward and backward) byte-identical to the whole-tensor quantize of the
    master; the reductions counted."""
    m = shard_all(build(modules=modules))
    ref = build(modules=modules)
    # On CUDA, torch's multi-tensor kernels on plain tensors and its per-DTensor dispatch of the
    # same foreach ops are not bit-identical (a scalar divisor is a reciprocal multiply in some
    # CUDA kernels, not in others): both optimizers take the single-tensor path there, the same
    # kernels for the sharded and the whole tensors. On CPU the default path (bit-identical too).
    kw = {"foreach": False} if DEV == "cuda" else {}
    make = {"adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.05, **kw),
            "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01, **kw)}[opt]
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
        for p in ref.parameters():   # FSDP2's mean: gloo divides on the host, correctly rounded
            p.grad.copy_(p.grad.cpu().div_(world))
        ro.step()
        ro.zero_grad()
    got, want = full_masters(m), full_masters(ref)
    bad = {n: (got[n] - want[n]).abs().max().item() for n in want if not torch.equal(got[n], want[n])}
    assert not bad, f"masters differ from the world of one (max |d|): {bad}"
    return {"checked": checked, "reduces": reduces, "group": dict(m.a._group.collectives)}


# ---- a small transformer-like model for the feature cases ------------------------------

class Block(nn.Module):
    def __init__(self, d, h, ac=False):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, h)
        self.down = nn.Linear(h, d, bias=False)
        self.ac = ac

    def _inner(self, x):
        return self.down(torch.nn.functional.gelu(self.up(self.norm(x))))

    def forward(self, x):
        if self.ac:
            return x + torch.utils.checkpoint.checkpoint(self._inner, x, use_reentrant=False)
        return x + self._inner(x)


class Toy(nn.Module):
    def __init__(self, d=40, h=72, vocab=11, n=2, ac=False):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, h, ac) for _ in range(n))
        self.head = nn.Linear(d, vocab)

    def forward(self, tok):
        x = self.emb(tok)
        for b in self.blocks:
            x = b(x)
        return self.head(x).float()


def toy(seed=0, ac=False, fmt="mxfp8"):
    torch.manual_seed(seed)
    m = Toy(ac=ac).to(dev())
    mxt.convert(m, {"blocks.*.up": "both", "blocks.*.down": "row"}, format=fmt)
    return m


def batch(step, rank, n=6, seq=5):
    g = torch.Generator().manual_seed(1000 * step + rank)
    tok = torch.randint(0, 11, (n, seq + 1), generator=g).to(dev())
    return tok[:, :-1], tok[:, 1:]


def _last_planes_match(m, seen, masters):
    specs = {mod.meta.name: mod.spec for mod in m.modules() if FL.is_param_linear(mod)}
    n = 0
    for name, plane, got in seen:
        want = plane_bytes(quantize_whole(specs[name], masters[f"{name}.weight"]), plane)
        for k in want:
            assert torch.equal(got[k], want[k]), f"{name} {plane} {k}: gathered bytes differ"
        n += 1
    return n


def case_features(rank, world, steps=5):
    """What FSDP2 users rely on, together: MixedPrecisionPolicy (bf16 params, fp32 reduce),
    activation checkpointing (the recomputed forward fetches the row plane of "both" weights on
    demand), reshard_after_forward False on one block, gradient accumulation with
    set_requires_gradient_sync, clip_grad_norm_, an LR scheduler. The loss falls, the planes of
    the last step equal the whole-tensor quantize, one reduction per optimizer step."""
    from torch.distributed.fsdp import MixedPrecisionPolicy
    m = toy(ac=True)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    fsdp(m.blocks[0], mp_policy=mp)
    fsdp(m.blocks[1], mp_policy=mp, reshard_after_forward=False)
    fsdp(m, mp_policy=mp)
    o = torch.optim.AdamW(m.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1.0 / (1 + 0.1 * s))
    lossf = nn.CrossEntropyLoss()
    losses, reduces, norms, fetches = [], [], [], []
    for s in range(steps):
        masters = full_masters(m)
        group = m.blocks[0].up._group
        f0 = group.collectives["fetch_all_gather"]
        with count_collectives() as calls, record_planes() as seen:
            total = 0.0
            for micro in range(2):
                m.set_requires_gradient_sync(micro == 1)
                tok, tgt = batch(micro, rank)  # the same two micro-batches: the loss must fall
                loss = lossf(m(tok).reshape(-1, 11), tgt.reshape(-1)) / 2
                loss.backward()
                total += float(loss.detach())
            if DEV == "cpu":  # DTensor norms use functional collectives, which crash on gloo + CUDA (torch 2.11)
                norms.append(float(torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0).full_tensor()))
            o.step()
            sched.step()
            o.zero_grad()
        reduces.append(calls.get("all_reduce", 0))
        fetches.append(group.collectives["fetch_all_gather"] - f0)
        checked = _last_planes_match(m, seen, masters)
        losses.append(total)
    assert all(x > 0 and x == x for x in norms), norms
    assert losses[-1] < losses[0], losses
    # an eval forward leaves blocks[1] (reshard_after_forward=False) gathered: reading its weight
    # says to reshard first, and after reshard() it reads like any parameter
    m.eval()
    with torch.no_grad():
        m(batch(0, rank)[0])
    w = dict(m.named_parameters())["blocks.1.up.weight"]
    try:
        w.detach().clone()
        read_gathered = None
    except NotImplementedError as e:
        read_gathered = str(e)
    from torch.distributed.fsdp import FSDPModule
    for mod in m.modules():   # (the message's advice)
        if isinstance(mod, FSDPModule):
            mod.reshard()
    # this rank's rows (not full_tensor(): torch 2.11's functional collectives crash with gloo on
    # CUDA tensors, the MXS_FSDP_DEVICE=cuda run of these cases)
    resharded = float(dict(m.named_parameters())["blocks.1.up.weight"].detach().to_local().abs().sum())
    return {"losses": losses, "reduces": reduces, "fetches": fetches, "checked": checked,
            "lr": o.param_groups[0]["lr"], "read_gathered": read_gathered, "resharded": resharded}


def case_compile(rank, world, steps=3):
    """torch.compile of each block under fully_shard (torchtitan's habit; issue 35): no graph break
    at all (the converted linears are the custom ops mxshard::param_linear and its backward; the
    gathered weight a traceable subclass), and compiled training equals eager bit for bit: losses
    and masters, both formats, "both" and row-only weights. aot_eager: dynamo's tracing, the
    custom ops and AOT autograd as inductor sees them, with eager's kernels (inductor's own GELU
    and LayerNorm round differently from eager's)."""
    import torch._dynamo as D
    from torch.distributed.fsdp import MixedPrecisionPolicy
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    lossf = nn.CrossEntropyLoss()
    out = {}
    for fmt in ("mxfp8", "nvfp4"):
        runs = {}
        for compiled in (False, True):
            m = toy(fmt=fmt)
            for b in m.blocks:
                if compiled:
                    b.compile(backend="aot_eager")
                fsdp(b, mp_policy=mp)
            fsdp(m, mp_policy=mp)
            o = torch.optim.AdamW(m.parameters(), lr=1e-2, foreach=False)
            D.utils.counters.clear()
            losses = []
            tok, tgt = batch(0, rank)   # one batch: the loss must fall
            for _ in range(steps):
                loss = lossf(m(tok).reshape(-1, 11), tgt.reshape(-1))
                loss.backward()
                o.step()
                o.zero_grad()
                losses.append(float(loss.detach()))
            breaks = sum(D.utils.counters["graph_break"].values())
            runs[compiled] = (losses, full_masters(m), breaks, D.utils.counters["stats"]["unique_graphs"])
        (le, me, _, _), (lc, mc, breaks, graphs) = runs[False], runs[True]
        differ = [n for n in me if not torch.equal(me[n], mc[n])]
        out[fmt] = {"same_losses": le == lc, "differ": differ, "breaks": breaks, "graphs": graphs,
                    "falls": lc[-1] < lc[0]}
    return out


def case_failure(rank, world):
    """A rank-local failure before the reduction (rank 1's partial raises): rank 1 raises its
    error, the others RemoteError, nobody hangs; then a model converted differently on rank 1:
    every rank raises PlanMismatchError before any reduction."""
    from mxshard.torch.fsdp import units as FU
    out = {}
    m = shard_all(build())
    orig = FU.WeightUnit.partial

    def broken(self):
        raise RuntimeError("injected partial failure")
    if rank == 1:
        FU.WeightUnit.partial = broken
    try:
        loss_of(m, MODULES, 0, lambda n, sh: grad_for(n, sh, 0, rank)).backward()
        out["partial"] = "none"
    except mxshard.RemoteError:
        out["partial"] = "remote"
    except RuntimeError as e:
        assert "injected" in str(e), e
        out["partial"] = "local"
    finally:
        FU.WeightUnit.partial = orig
    mods = [x if (rank == 0 or x[0] != "b") else ("b", "mxfp8", "row", "padded", "ceil", (40, 96)) for x in MODULES]
    m2 = shard_all(build(modules=mods))
    try:
        loss_of(m2, mods, 0, lambda n, sh: grad_for(n, sh, 0, rank)).backward()
        out["mismatch"] = "none"
    except mxshard.PlanMismatchError as e:
        assert "different model" in str(e), e
        out["mismatch"] = "raised"
    # a policy that differs between ranks where only one rank's weight shares scale entries (issue
    # 34: rank 0 "row" has nothing to reduce, rank 1 "both" 96x80 cut mid-block): every rank raises
    one = [("p", "mxfp8", "row" if rank == 0 else "both", "padded", "ceil", (80, 96))]
    m3 = shard_all(build(modules=one, dense=False))
    try:
        loss_of(m3, one, 0, lambda n, sh: grad_for(n, sh, 0, rank)).backward()
        out["policy"] = "none"
    except mxshard.PlanMismatchError as e:
        assert "different model" in str(e), e
        out["policy"] = "raised"
    return out


def case_unsupported(rank, world):
    """What mxshard cannot do raises a clear error naming it, before any collective of ours:
    Shard(1) placements, CPU offload, a converted submodule called alone while sharded, a weight
    replaced by a plain Parameter."""
    from torch.distributed.fsdp import CPUOffloadPolicy
    from torch.distributed.tensor import Shard
    out = {}

    def expect(key, f, exc, words):
        try:
            f()
            out[key] = "no error"
        except exc as e:
            assert all(w in str(e) for w in words), (key, str(e))
            out[key] = "ok"
    m = build(modules=[MODULES[0]], dense=False)
    fsdp(m.a, shard_placement_fn=lambda p: Shard(1))
    fsdp(m)
    expect("shard1", lambda: m({"a": torch.eye(48, dtype=torch.bfloat16, device=dev())}), NotImplementedError, ["Shard(0)"])
    m = build(modules=[MODULES[0]], dense=False)
    fsdp(m.a, offload_policy=CPUOffloadPolicy(pin_memory=False))
    fsdp(m)
    expect("offload", lambda: m({"a": torch.eye(48, dtype=torch.bfloat16, device=dev())}), NotImplementedError, ["offload"])
    m = shard_all(build(modules=[MODULES[0]], dense=False))
    expect("sharded", lambda: m.a.forward(torch.eye(48, dtype=torch.bfloat16, device=dev())), RuntimeError, ["still sharded"])
    m = build(modules=[MODULES[0]], dense=False)
    m.a.weight = nn.Parameter(torch.zeros(40, 48, device=dev()))
    expect("replaced", lambda: m({"a": torch.eye(48, dtype=torch.bfloat16, device=dev())}), RuntimeError, ["replaced"])
    # each weight on its own group object over the same ranks (a mesh per fully_shard call: what
    # DeviceMesh makes on a CUDA machine with a gloo default group) is one data-parallel mesh: it runs
    from torch.distributed.device_mesh import DeviceMesh
    xs = {"a": torch.eye(48, dtype=torch.bfloat16, device=dev()), "b": torch.ones(3, 40, dtype=torch.bfloat16, device=dev())}
    m = build(modules=MODULES[:2], dense=False)
    for c in m.children():
        fsdp(c, mesh=DeviceMesh.from_group(dist.new_group(list(range(world))), dev().type))
    fsdp(m)
    ys = m(xs)
    out["own_groups"] = "ok" if all(torch.isfinite(y.float()).all() for y in ys.values()) else "not finite"
    # a weight sharded over other ranks (this rank alone) than the rest: raises on every rank
    alone, _ = dist.new_subgroups(1)
    m = build(modules=MODULES[:2], dense=False)
    fsdp(m.a, mesh=DeviceMesh.from_group(alone, dev().type))
    fsdp(m)
    expect("ranks", lambda: m(xs), NotImplementedError, ["different sets of ranks", "one data-parallel mesh"])
    # convert after fully_shard: says to convert first (issue 34 item 6)
    late = Net()
    late.a = nn.Linear(48, 40, bias=False).to(dev())
    fsdp(late)
    expect("convert_late", lambda: mxt.convert(late, "row"), ValueError, ["call convert(model, ...) before fully_shard"])
    # writes through .data after a forward (HF-style init, issue 34 item 9) into a weight whose bytes
    # need the reduction ("both" b, cut mid-block at 2 ranks): the next no-grad forward finds them
    # before any use (one flag all-reduced) and every rank refreshes (it raised, naming
    # masters_changed); masters_changed itself works as well
    m = shard_all(build(modules=MODULES[:2], dense=False))
    xs = {"a": torch.eye(48, dtype=torch.bfloat16, device=dev()), "b": torch.eye(40, dtype=torch.bfloat16, device=dev())}

    def planes_are_the_masters(seen):
        masters = full_masters(m)
        for name, plane, got in seen:
            want = plane_bytes(quantize_whole(getattr(m, name).spec, masters[f"{name}.weight"].to(dev())), plane)
            assert all(torch.equal(got[k].cpu(), want[k].cpu()) for k in got), (name, plane)
        return len(seen)
    with torch.no_grad():
        y0 = m(xs)
        for c in (m.a, m.b):
            c.weight.data.neg_()
        with record_planes() as seen:
            y1 = m(xs)
    n = planes_are_the_masters(seen)
    out["data_write"] = "ok" if (torch.equal(y1["a"], -y0["a"]) and torch.equal(y1["b"], -y0["b"]) and n == 2) \
        else "stale"
    with torch.no_grad():
        for c in (m.a, m.b):
            c.weight.data.neg_()
        mxt.masters_changed(m)
        with record_planes() as seen:
            y2 = m(xs)
    n = planes_are_the_masters(seen)
    out["data_write_after"] = "ok" if (torch.equal(y2["a"], y0["a"]) and n == 2) else "stale"
    # the same write on ONE rank (it used to leave the other ranks waiting in the all-gather): a
    # no-grad forward refreshes on every rank; a grad-enabled pass runs on the bytes every rank
    # made at the last refresh (nobody waits) and the next refresh raises on every rank; then,
    # told, the next forward uses the new master
    words = ["call mxshard.torch.masters_changed(model) on every rank"]
    with torch.no_grad():
        if rank == 0:
            m.b.weight.data.mul_(2)
        with record_planes() as seen:
            m(xs)
        out["one_rank_eval"] = "ok" if planes_are_the_masters(seen) == 2 else "stale"

    def train_pass():
        sum(v.float().sum() for v in m(xs).values()).backward()
    train_pass()
    if rank == 0:
        m.b.weight.data.mul_(2)
    train_pass()
    mxt.masters_changed(m)   # (an optimizer step would do the same)
    expect("one_rank_train", train_pass, RuntimeError, words + ["wrote"])
    with record_planes() as seen:
        train_pass()
    masters = full_masters(m)
    for name, plane, got in seen:
        want = plane_bytes(quantize_whole(getattr(m, name).spec, masters[f"{name}.weight"].to(dev())), plane)
        assert all(torch.equal(got[k].cpu(), want[k].cpu()) for k in got), (name, plane)
    out["one_rank_after"] = "ok" if len(seen) >= 2 else f"{len(seen)} planes seen"
    return out


def case_bytes(rank, world):
    """Bytes every rank puts on the all-gather per forward: a row-only MXFP8 weight R x C evenly
    sharded sends S*C + S*ceil(C/32) (S = R/world) and needs no reduction; row-only NVFP4 1x16
    sends S*C/2 + S*ceil(C/16) (its tensor amax: one small all-reduce); FSDP2 bf16 sends 2*S*C."""
    from torch.distributed.fsdp import MixedPrecisionPolicy
    R, C = 64 * world, 96
    torch.manual_seed(0)
    out = {}
    for kind in ("mxfp8", "nvfp4", "bf16"):
        m = Net()
        m.a = nn.Linear(C, R, bias=False)
        m = m.to(dev())
        if kind != "bf16":
            mxt.convert(m, "row", format=kind)
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
        fsdp(m.a, mp_policy=mp)
        fsdp(m, mp_policy=mp)
        x = {"a": torch.ones(3, C, dtype=torch.bfloat16, device=dev())}
        with torch.no_grad():
            m(x)                     # the first refresh checks the ranks agree (a setup all_gather, once)
            mxt.masters_changed(m)   # as after an optimizer step: the next gather refreshes
            with count_collectives() as calls:
                m(x)
        out[kind] = {"bytes": calls["bytes_all_gather_into_tensor"], "all_reduce": calls.get("all_reduce", 0)}
    S = R // world
    assert out["mxfp8"]["bytes"] == S * C + S * (-(-C // 32)), out
    assert out["nvfp4"]["bytes"] == S * C // 2 + S * (-(-C // 16)), out
    assert out["bf16"]["bytes"] == 2 * S * C, out
    assert out["mxfp8"]["all_reduce"] == 0 and out["nvfp4"]["all_reduce"] == (1 if world > 1 else 0), out
    out["table"] = _bytes_table(world) if world != 3 else []   # (1, 2 and 4 ranks: even and uneven shards)
    return out


def _touched(R, S, world, h):
    """The most h-row blocks the rows of one rank touch (brute force over the ranks' row ranges)."""
    most = 0
    for k in range(world):
        r0, r1 = min(k * S, R), min((k + 1) * S, R)
        if r1 > r0:
            most = max(most, (r1 - 1) // h - r0 // h + 1)
    return most


def _bytes_table(world):
    """docs/fsdp.md's bytes table, every row counted: per rank and all-gather, forward (row plane)
    and backward (the dgrad plane) alike, for row-only and "both" weights of both formats (NVFP4
    in both block shapes), evenly and unevenly sharded:
        evenly (R % W == 0), S = R/W:    MXFP8  S*C   + max(S*ceil(C/32), "both": T32*C)
                                         NVFP4  S*C/2 + max(S*ceil(C/16), "both": T16*C)
            (T_h: the most h-row blocks one rank's rows touch; the larger plane's scale window
             travels, so that the forward's and the backward's inputs have one size)
        unevenly, S = ceil(R/W):         S*C for both formats (FSDP2's padded-shard rule)
        BF16:                            2*S*C"""
    from torch.distributed.fsdp import MixedPrecisionPolicy
    rows = {"even": 40 * world, "uneven": 40 * world + 1} if world > 1 else {"even": 40}
    C = 80
    got = []
    for how, R in rows.items():
        S = -(-R // world)
        for fmt, planes, block in (("mxfp8", "row", None), ("mxfp8", "both", None), ("nvfp4", "row", "1x16"),
                                   ("nvfp4", "both", "1x16"), ("nvfp4", "both", "16x16"), ("bf16", None, None)):
            torch.manual_seed(0)
            m = Net()
            m.a = nn.Linear(C, R, bias=False)
            m = m.to(dev())
            if fmt != "bf16":
                mxt.convert(m, planes, format=fmt, **({"block": block} if block else {}))
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
            fsdp(m.a, mp_policy=mp)
            fsdp(m, mp_policy=mp)
            x = {"a": torch.ones(3, C, dtype=torch.bfloat16, device=dev())}
            m(x)["a"].float().sum().backward()   # the first refresh (its agreement) out of the count
            if fmt != "bf16":
                mxt.masters_changed(m)
            with count_collectives() as calls:
                y = m(x)["a"]
            fwd = calls["bytes_all_gather_into_tensor"]
            with count_collectives() as calls:
                y.float().sum().backward()
            bwd = calls["bytes_all_gather_into_tensor"]
            if fmt == "bf16":
                want = 2 * S * C
            elif how == "uneven":
                want = S * C
            elif fmt == "mxfp8":
                want = S * C + max(S * -(-C // 32), _touched(R, S, world, 32) * C if planes == "both" else 0)
            else:
                want = S * C // 2 + max(S * -(-C // 16), _touched(R, S, world, 16) * C if planes == "both" else 0)
            assert fwd == bwd == want, (how, R, C, fmt, planes, block, fwd, bwd, want)
            got.append((how, R, C, fmt, planes, block, fwd))
    return got


def _adamw(params):
    return torch.optim.AdamW(params, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.05)


def _world_free_step(m, o, s):
    """A step whose mean gradient is the same at any DP size (every rank uses rank 0's G)."""
    loss_of(m, MODULES, s, lambda n, sh: grad_for(n, sh, s, 0)).backward()
    o.step()
    o.zero_grad()


def case_dcp_save(rank, world, root, k=2, steps=4):
    """Steps 0..k-1, a DCP checkpoint with get_state_dict (the masters are the checkpoint: plain
    tensors), then steps k..steps-1; rank 0 keeps the final masters for case_dcp_load."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    m = shard_all(build())
    o = _adamw(m.parameters())
    for s in range(steps):
        if s == k:
            msd, osd = get_state_dict(m, o)
            assert not any(isinstance(getattr(v, "_local_tensor", v), mxt.QuantMaster) for v in msd.values())
            dcp.save({"model": msd, "optim": osd}, checkpoint_id=os.path.join(root, "ckpt"))
        _world_free_step(m, o, s)
    final = full_masters(m)
    if rank == 0:
        torch.save(final, os.path.join(root, "final.pt"))
    return {"keys": sorted(msd)}


def case_dcp_load(rank, world, root, k=2, steps=4):
    """A new model and optimizer at another DP size load the checkpoint (dcp.load, then
    set_state_dict) and continue: the final masters are bit-identical to the saving run's."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    m = shard_all(build(seed=123))   # other initial values: everything must come from the checkpoint
    o = _adamw(m.parameters())
    msd, osd = get_state_dict(m, o)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=os.path.join(root, "ckpt"))
    set_state_dict(m, o, model_state_dict=state["model"], optim_state_dict=state["optim"])
    for s in range(k, steps):
        _world_free_step(m, o, s)
    got, want = full_masters(m), torch.load(os.path.join(root, "final.pt"))
    bad = {n: (got[n] - want[n]).abs().max().item() for n in want if not torch.equal(got[n], want[n])}
    assert not bad, f"continuation at DP={world} differs from the saving run (max |d|): {bad}"
    return {"params": len(want)}


def case_vs_sharded(rank, world, steps=3):
    """The same model, initial values and gradients under ShardedOptimizer (its replicated
    weights, its writeback) and under FSDP2 (torch.optim.AdamW): every plane
    FSDP2 gathers equals the primary ShardedOptimizer holds, byte for byte, every step."""
    mods = [x for x in MODULES if x[4] == "ceil"]  # MXFP8; ShardedOptimizer takes one rounding per bucket

    def sharded_model():
        torch.manual_seed(0)
        sm = Net()
        for name, fmt, planes, layout, opt, (cin, cout) in mods:
            setattr(sm, name, nn.Linear(cin, cout, bias=False))
        sm = sm.to(dev())
        for name, fmt, planes, layout, opt, _ in mods:
            mxt.convert(sm, {name: planes}, layout=layout, rounding=opt)
        return sm
    m = shard_all(build(modules=mods, dense=False))
    o = _adamw(m.parameters())
    sm = sharded_model()
    so = mxt.ShardedOptimizer(sm, _adamw)
    compared = 0
    for s in range(steps):
        with record_planes() as seen:
            loss_of(m, mods, s, lambda n, sh: grad_for(n, sh, s, rank)).backward()
        for name, plane, got in seen:
            held = getattr(sm, name).weight._box.planes[plane]   # the optimizer's replicated weight
            for k in ("data", "scale"):
                assert torch.equal(got[k], getattr(held, f"{plane}_{k}").reshape(-1)), (s, name, plane, k)
            compared += 1
        o.step()
        o.zero_grad()
        for name, *_, (cin, cout) in mods:   # (a .grad set outside the hooks: step() adds it into the bucket)
            getattr(sm, name).weight.grad = grad_for(name, (cin, cout), s, rank).t().contiguous().to(dev())
        so.step()
        so.zero_grad()
    return {"compared": compared}


def case_export(rank, world, root):
    """export_safetensors of an FSDP2 model after a step (every rank calls it, rank 0 writes): per
    converted linear the file holds exactly the row plane the next forward gathers (data, scales,
    NVFP4's amax), and no master."""
    try:
        from safetensors.torch import load_file
    except ImportError:
        return {"skipped": "safetensors is not installed"}
    m = shard_all(build())
    o = _adamw(m.parameters())
    _world_free_step(m, o, 0)
    path = os.path.join(root, "fsdp-export.safetensors")
    mxt.export_safetensors(path, m)
    dist.barrier()
    with torch.no_grad(), record_planes() as seen:
        loss_of(m, MODULES, 1, lambda n, sh: grad_for(n, sh, 1, 0))
    f = load_file(path)
    checked = 0
    for name, plane, got in seen:
        assert f"{name}.weight" not in f, name          # the bytes, not the master
        for k in got:
            key = f"{name}.{plane}_{k}" if k != "amax" else f"{name}.amax"
            want = got[k].cpu().reshape(-1).view(torch.uint8)
            assert torch.equal(f[key].reshape(-1).view(torch.uint8), want), (name, plane, k)
        checked += 1
    return {"checked": checked}


def case_meta(rank, world):
    """torchtitan's order: the model built on the meta device, converted, fully_shard'ed, then
    to_empty() and initialised (here: the values of a model built normally, through
    load_state_dict): the masters are those values and every plane the first forward and
    backward gather is their whole-tensor quantize."""
    m = shard_all(build(meta=True))
    m.to_empty(device=dev())
    ref = build()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    set_model_state_dict(m, ref.state_dict(), options=StateDictOptions(full_state_dict=True))
    masters = full_masters(m)
    for name, _, _, _, _, _ in MODULES:
        assert torch.equal(masters[f"{name}.weight"].cpu(), ref.get_submodule(name).weight.detach()._data.cpu()), name
    with record_planes() as seen:
        loss_of(m, MODULES, 0, lambda n, sh: grad_for(n, sh, 0, rank)).backward()
    for name, plane, got in seen:
        want = plane_bytes(quantize_whole(getattr(m, name).spec, masters[f"{name}.weight"].to(dev())), plane)
        assert all(torch.equal(got[k].cpu(), want[k].cpu()) for k in got), (name, plane)
    return {"checked": len(seen)}


def case_freed(rank, world):
    """A converted model under fully_shard is freed once dropped (a garbage collection): its
    weights' metadata hold the model's FSDPGroup weakly (a strong reference closed a cycle through
    the tensor subclasses that the collector could not break, and every model stayed alive)."""
    import gc
    import weakref
    m = shard_all(build())
    o = torch.optim.AdamW(m.parameters(), lr=1e-3)
    loss_of(m, MODULES, 0, lambda n, sh: grad_for(n, sh, 0, rank)).backward()
    o.step()
    refs = [weakref.ref(m), weakref.ref(m.a)]
    del m, o
    gc.collect()
    return {"alive": sum(r() is not None for r in refs)}


def only_at(world_needed, case):
    """`case` at one world size; the other groups of the same plan skip it."""
    def run(rank, world, **kw):
        return case(rank, world, **kw) if world == world_needed else {"skipped": world}
    return run


def plan_a(root):
    """Groups of 2, 3 and 4: the exact case everywhere; the rest at 2 (and its checkpoint)."""
    return [("exact", "exact", {}), ("exact_sgd", "exact", {"opt": "sgd", "steps": 2}),
            ("features", "features@2", {}), ("failure", "failure@2", {}), ("unsupported", "unsupported@2", {}),
            ("bytes", "bytes", {}), ("dcp_save", "dcp_save@2", {"root": root}), ("vs_sharded", "vs_sharded@2", {}),
            ("export", "export@2", {"root": root}), ("meta", "meta", {}), ("compile", "compile@2", {}),
            ("freed", "freed@2", {}), ("assign", "assign@2", {}), ("ema_copy", "ema_copy@2", {}),
            ("inference_first", "inference_first@2", {}), ("product", "product@2", {}),
            ("dcp_inplace", "dcp_inplace@2", {"root": root}), ("tied", "tied@2", {}),
            ("collectives", "collectives@2", {}), ("zero", "zero@2", {}), ("zero_view", "zero@2", {"bucket_view": True}),
            ("ddp_convert", "ddp_convert@2", {}), ("reshard_int", "reshard_int@4", {}),
            ("assign_meta", "assign_meta@2", {}), ("export_path", "export_path@2", {"root": root}),
            ("split_paths", "split_paths@2", {"root": root}),
            ("root_gathered", "root_gathered@2", {})]


def plan_b(root):
    """Groups of 1 and 3: load the checkpoint the group of 2 saved."""
    return [("dcp_load", "dcp_load", {"root": root})]


CASES = {"exact": case_exact, "features": case_features, "failure": case_failure, "unsupported": case_unsupported,
         "bytes": case_bytes, "dcp_save": case_dcp_save, "dcp_load": case_dcp_load,
         "features@2": only_at(2, case_features), "failure@2": only_at(2, case_failure),
         "unsupported@2": only_at(2, case_unsupported), "dcp_save@2": only_at(2, case_dcp_save),
         "vs_sharded@2": only_at(2, case_vs_sharded), "export@2": only_at(2, case_export), "meta": case_meta,
         "compile@2": only_at(2, case_compile), "freed@2": only_at(2, case_freed),
         "assign@2": only_at(2, case_assign), "ema_copy@2": only_at(2, case_ema_copy),
         "inference_first@2": only_at(2, case_inference_first), "product@2": only_at(2, case_product_in_forward),
         "dcp_inplace@2": only_at(2, case_dcp_inplace), "tied@2": only_at(2, case_tied_embedding),
         "collectives@2": only_at(2, case_collectives_into_weights), "zero@2": only_at(2, case_zero_redundancy),
         "ddp_convert@2": only_at(2, case_convert_after_ddp), "reshard_int@4": only_at(4, case_reshard_int),
         "assign_meta@2": only_at(2, case_assign_on_meta), "export_path@2": only_at(2, case_export_rank_local_path),
         "split_paths@2": only_at(2, case_save_checkpoint_split_paths),
         "root_gathered@2": only_at(2, case_root_kept_gathered)}


def worker(rank, world, port, q, plan=None):
    if DEV == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    H.run_rank(rank, world, port, q, plan, CASES, gloo_timeout=30)


if os.environ.get(H.WARM_UP_VAR) == "1":
    torch.set_num_threads(1)

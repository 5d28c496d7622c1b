# SPDX-License-Identifier: MIT
"""FSDP2 cases for habits of a PyTorch user that once went wrong (run by the groups of
torch_fsdp_cases.plan_a, each at a world of 2). Each returns a small summary or raises."""
import torch
from torch import nn

from torch_fsdp_model import (MODULES, Net, build, dev, fsdp, full_masters, grad_for, loss_of, plane_bytes,
                              quantize_whole, record_planes, shard_all)


def case_ema_copy(rank, world):
    """An EMA kept as copies of the parameters (`p.detach().clone()`, updated with lerp_ between
    evaluations): writes into a copy are not writes into the master. They were counted as such
    (a copy shared the weight's write counter), and the next forward raised on every rank, asking
    for masters_changed, for weights whose bytes need the ranks' reduction ("both" MXFP8 cut
    mid-block, NVFP4). The copies move, the masters do not, and every plane gathered after the
    EMA update is still the whole-tensor quantize of the masters."""
    mods = [MODULES[i] for i in (1, 3, 5, 6)]   # MXFP8 "both" (40x96 over 2: a block cut), NVFP4 row / both
    m = shard_all(build(modules=mods))
    o = torch.optim.AdamW(m.parameters(), lr=1e-2)
    ema = [p.detach().clone() for p in m.parameters()]
    loss_of(m, mods, 0, lambda n, sh: grad_for(n, sh, 0, rank)).backward()
    o.step()
    o.zero_grad()
    before = full_masters(m)
    with torch.no_grad():
        loss_of(m, mods, 1, lambda n, sh: grad_for(n, sh, 1, rank))
        for e, p in zip(ema, m.parameters()):
            e.lerp_(p.detach(), 0.1)
        with record_planes() as seen:
            loss_of(m, mods, 2, lambda n, sh: grad_for(n, sh, 2, rank))
    after = full_masters(m)
    assert all(torch.equal(after[k], before[k]) for k in before), "an EMA update moved a master"
    for name, plane, b in seen:
        ref = plane_bytes(quantize_whole(getattr(m, name).spec, after[f"{name}.weight"]), plane)
        assert all(torch.equal(b[k].cpu(), ref[k].cpu()) for k in ref), (name, plane)
    moved = sum(not torch.equal(e.to_local(), p.detach().to_local()) for e, p in zip(ema, m.parameters()))
    return {"checked": len(seen), "ema_moved": moved}


def case_inference_first(rank, world):
    """The first forward of a converted model under fully_shard inside torch.inference_mode() (an
    evaluation before any training step): FSDP2's lazy init views every master there, and making
    the view's wrapper raised "Cannot set version_counter for inference tensor" on every rank. It
    now gives what a no_grad forward gives, and training goes on after it."""
    mods = [MODULES[i] for i in (0, 1, 5)]
    m = shard_all(build(modules=mods))
    xs = {name: torch.eye(cin, dtype=torch.bfloat16, device=dev()) for name, _, _, _, _, (cin, _) in mods}
    with torch.inference_mode():
        first = m(xs)
    with torch.no_grad():
        again = m(xs)
    assert all(torch.equal(first[k], again[k]) for k in xs), "inference_mode and no_grad forwards differ"
    o = torch.optim.AdamW(m.parameters(), lr=1e-2)
    before = full_masters(m)
    loss_of(m, mods, 0, lambda n, sh: grad_for(n, sh, 0, rank)).backward()
    o.step()
    after = full_masters(m)
    return {"outputs": len(first), "params": len(before),
            "moved": sum(not torch.equal(after[k], before[k]) for k in before)}


class _Attn(torch.nn.Module):
    """BEiT / EVA's attention input: F.linear with the converted qkv's weight and a bias of its own."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(40, 48, bias=False)
        self.q_bias = torch.nn.Parameter(torch.zeros(48))

    def forward(self, x):
        return torch.nn.functional.linear(x, self.qkv.weight, self.q_bias)


def case_product_in_forward(rank, world):
    """A forward that multiplies by a converted linear's weight itself (F.linear(x, self.qkv.weight))
    under fully_shard: every rank raises saying to call the module or keep it dense (the message
    said to call reshard()). Returns the error's first words."""
    import mxshard.torch as mxt
    torch.manual_seed(0)
    m = mxt.convert(_Attn(), "row").to(dev())
    fsdp(m)   # the root holds qkv.weight: its forward gathers it (a child fully_shard'ed on its own stays sharded)
    try:
        m(torch.randn(3, 40, device=dev()))
    except NotImplementedError as e:
        return {"raised": str(e)[:106]}
    return {"raised": None}


def case_assign(rank, world):
    """load_state_dict(sd, assign=True) of the model's own sharded state dict after a step (it
    used to fail inside FSDP2's copy-out at the next forward, on every rank): the masters take the
    saved values, the next forward and backward gather their whole-tensor quantize, and the
    optimizer made before keeps training them. A full (plain tensor) state dict with assign=True
    raises on every rank saying what to use. `weight.data = t` on a sharded weight does what it
    does to a plain FSDP2 parameter (torch 2.11: nothing), with no error and no hang."""
    mods = [MODULES[i] for i in (0, 1, 5, 6)]   # MXFP8 / NVFP4, row-only / "both"
    m = shard_all(build(modules=mods))
    o = torch.optim.AdamW(m.parameters(), lr=1e-2)

    def step(s, opt=True):
        loss_of(m, mods, s, lambda n, sh: grad_for(n, sh, s, rank)).backward()
        if opt:
            o.step()
            o.zero_grad()
    step(0)
    sd = {k: v.clone() for k, v in m.state_dict().items()}
    want = full_masters(m)
    step(1)
    assert any(not torch.equal(v, want[k]) for k, v in full_masters(m).items()), "the step moved nothing"
    m.load_state_dict(sd, assign=True)
    got = full_masters(m)
    bad = [k for k in want if not torch.equal(got[k], want[k])]
    assert not bad, f"assign=True did not load {bad}"
    with record_planes() as seen:
        step(2, opt=False)
    for name, plane, b in seen:
        ref = plane_bytes(quantize_whole(getattr(m, name).spec, got[f"{name}.weight"].to(dev())), plane)
        assert all(torch.equal(b[k].cpu(), ref[k].cpu()) for k in ref), (name, plane)
    o.step()
    o.zero_grad()
    after = full_masters(m)
    # (the dense "f" gets torch's assign: new Parameters, which the optimizer made before does not hold)
    still = [k for k in want if not k.startswith("f.") and torch.equal(after[k], got[k])]
    assert not still, f"the optimizer no longer trains {still} after assign=True"
    out = {"checked": len(seen)}
    try:
        m.load_state_dict({k: v.to(dev()) for k, v in want.items()}, assign=True)
        out["full_assign"] = "no error"
    except RuntimeError as e:
        assert str(e).startswith("mxshard: load a.weight with load_state_dict(sd) (the default assign=False"), str(e)
        out["full_assign"] = "ok"
    step(3)   # still trains, nothing left waiting
    # weight.data = t on a sharded weight: as on a plain FSDP2 parameter
    torch.manual_seed(0)
    plain = Net()
    plain.a = nn.Linear(48, 40, bias=False).to(dev())
    shard_all(plain)
    x = {"a": torch.eye(48, dtype=torch.bfloat16, device=dev())}
    changed = {}
    for label, model in (("plain", plain), ("converted", m)):
        before = full_masters(model)["a.weight"]
        model.a.weight.data = torch.zeros_like(model.a.weight)
        y = model({"a": x["a"].to(torch.float32) if label == "plain" else x["a"]})["a"]
        assert torch.isfinite(y.float()).all(), label
        changed[label] = not torch.equal(full_masters(model)["a.weight"], before)
    out["data_changed"] = changed
    return out


def case_dcp_inplace(rank, world, root):
    """dcp.load into model.state_dict() in place (DCP's own way of loading) after a forward, with
    no set_model_state_dict and no masters_changed: the state dict's tensors had version counters
    of their own, so the masters took the values unseen and the evaluation after the load
    multiplied by the old bytes on every rank. Row-only MXFP8 weights are now redone on each rank;
    weights whose bytes need the ranks' reduction (a "both" weight cut mid-block, NVFP4) are found
    stale before use at the evaluation's first gather, and every rank refreshes (the load's writes
    now move the masters' version counters). Either way the evaluation equals the saved model's."""
    import torch.distributed.checkpoint as dcp
    import mxshard.torch as mxt
    out = {}
    for label, mods in (("row", [MODULES[0]]), ("cut", [MODULES[1], MODULES[5]])):
        path = f"{root}/dcp_inplace_{label}"
        src = shard_all(build(seed=0, modules=mods, dense=False))
        dcp.save({"model": src.state_dict()}, checkpoint_id=path)
        m = shard_all(build(seed=1, modules=mods, dense=False))
        xs = {name: torch.eye(cin, dtype=torch.bfloat16, device=dev()) for name, _, _, _, _, (cin, _) in mods}
        with torch.no_grad():
            m(xs)
            dcp.load({"model": m.state_dict()}, checkpoint_id=path)
            try:
                got = m(xs)
                out[label] = "no error"
            except RuntimeError as e:
                out[label] = str(e)[:60]
                mxt.masters_changed(m)
                got = m(xs)
            want = src(xs)
        out[label + "_equal"] = all(torch.equal(got[k], want[k]) for k in want)
    return out


def case_tied_embedding(rank, world):
    """An embedding tied to a converted head after convert() (emb.weight = head.weight), then
    fully_shard: the embedding reads the gathered bytes, and every rank raised saying to call
    reshard(), which fixes nothing. Every rank now raises saying to keep the tied linear dense."""
    import mxshard.torch as mxt

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.head = nn.Embedding(48, 32), nn.Linear(32, 48, bias=False)

        def forward(self, t):
            return self.head(self.emb(t))
    torch.manual_seed(0)
    m = mxt.convert(LM(), "row").to(dev())
    m.emb.weight = m.head.weight
    fsdp(m)
    try:
        m(torch.arange(8, device=dev()))
    except NotImplementedError as e:
        return {"raised": str(e)[:61]}
    return {"raised": None}


def case_reshard_int(rank, world):
    """reshard_after_forward=2 on 4 ranks (reshard onto a smaller mesh after forward): FSDP2 does
    that for float parameters only, and every rank failed inside torch ("Expected 1
    all_gather_output, got 2", or "only Tensors of floating point dtype can require gradients").
    Every rank now raises before the first gather, saying what to pass."""
    m = shard_all(build(modules=[MODULES[0], MODULES[1]]), reshard_after_forward=2)
    try:
        loss_of(m, [MODULES[0], MODULES[1]], 0, lambda n, sh: grad_for(n, sh, 0, rank)).backward()
    except NotImplementedError as e:
        return {"raised": str(e)[:60]}
    return {"raised": None}


def case_assign_on_meta(rank, world):
    """torchtune's load (load_from_full_model_state_dict): the model built on meta, converted and
    fully_shard'ed, then load_state_dict(assign=True) of distribute_tensor shards of a full state
    dict, no to_empty(). It raised on every rank; the shards now become the masters (a QuantMaster
    in a new DTensor Parameter), the full masters equal the source's, and the planes gathered by a
    training step are their whole-tensor quantize."""
    from torch.distributed.tensor import distribute_tensor
    mods = [MODULES[i] for i in (0, 1, 5, 6)]
    src = build(seed=7, modules=mods)
    full = {k: v.detach().clone() for k, v in src.state_dict().items()}
    m = shard_all(build(modules=mods, meta=True))
    meta_sd = m.state_dict()
    sharded = {k: nn.Parameter(distribute_tensor(full[k].to(v.dtype).to(dev()), v.device_mesh, v.placements),
                               requires_grad=False) for k, v in meta_sd.items()}
    m.load_state_dict(sharded, strict=True, assign=True)
    got = full_masters(m)
    bad = [k for k in full if not torch.equal(got[k].cpu(), full[k].cpu())]
    assert not bad, f"assign=True on meta did not load {bad}"
    with record_planes() as seen:
        loss_of(m, mods, 0, lambda n, sh: grad_for(n, sh, 0, rank)).backward()
    for name, plane, b in seen:
        ref = plane_bytes(quantize_whole(getattr(m, name).spec, got[f"{name}.weight"].to(dev())), plane)
        assert all(torch.equal(b[k].cpu(), ref[k].cpu()) for k in ref), (name, plane)
    o = torch.optim.AdamW(m.parameters(), lr=1e-2)
    o.step()
    moved = sum(not torch.equal(v, got[k]) for k, v in full_masters(m).items())
    return {"checked": len(seen), "moved": moved, "params": len(got)}


def case_export_rank_local_path(rank, world, root):
    """export_safetensors of an FSDP2 model where only rank 0's path is bad (its own directory
    missing): rank 0 raised before the gather, rank 1 gathered alone, and the next collective
    aborted the job. Every rank raises now (rank 0 its error, the others RemoteError), and training
    goes on; with a good path on every rank the export works."""
    import mxshard.torch as mxt
    mods = [MODULES[0], MODULES[5]]
    m = shard_all(build(modules=mods))
    path = f"{root}/no_such_dir/m.safetensors" if rank == 0 else f"{root}/export_rank_local.safetensors"
    out = {}
    try:
        mxt.export_safetensors(path, m)
        out["bad"] = "no error"
    except Exception as e:  # noqa: BLE001
        out["bad"] = type(e).__name__
    loss_of(m, mods, 0, lambda n, sh: grad_for(n, sh, 0, rank)).backward()
    good = f"{root}/export_rank_local.safetensors"
    mxt.export_safetensors(good, m)
    import os
    out["written"] = os.path.isfile(good)
    return out


def case_root_kept_gathered(rank, world):
    """NVFP4 weights FSDP2 keeps gathered between passes (in the root's group: the root is not
    resharded after its forward) beside an MXFP8 one in a group of its own, new master values
    written between no-grad evaluations (an EMA swapped in) and announced with masters_changed()
    on every rank. The next pass gathers the MXFP8 weight, which refreshes every unit: that
    weight takes the new values, the kept ones keep the bytes of the last quantize (as a plain
    FSDP2 parameter kept unsharded keeps its values); after reshard() every weight takes the
    new values. The refresh moved the units' tensor amax under the kept NVFP4 weights, which
    read it with their old codes: the bytes of neither quantize."""
    import mxshard.torch as mxt
    mods = [MODULES[i] for i in (1, 5, 6, 7)]   # MXFP8 "both" cut mid-block, NVFP4 row / both 16x16 / 1x16
    m = build(modules=mods)
    fsdp(m.b)
    fsdp(m)                                      # g, h, i in the root's group
    named = list(m.named_parameters())           # the sharded parameters (while gathered the names give the planes)
    o = torch.optim.AdamW(m.parameters(), lr=1e-2)
    loss_of(m, mods, 0, lambda n, sh: grad_for(n, sh, 0, rank)).backward()
    o.step()
    o.zero_grad()
    m.eval()
    g = torch.Generator().manual_seed(11 + rank)
    passes = []
    with torch.no_grad():
        loss_of(m, mods, 1, lambda n, sh: grad_for(n, sh, 1, rank))
        before = full_masters(m, named)
        for _, p in named:
            local = p.to_local()
            local.mul_(1.5).add_(0.05 * torch.randn(local.shape, generator=g).to(local))
        mxt.masters_changed(m)
        for step in (2, 3):
            with record_planes() as seen:
                loss_of(m, mods, step, lambda n, sh: grad_for(n, sh, step, rank))
            passes.append(seen)
            m.reshard()
    after = full_masters(m, named)
    assert all(not torch.equal(after[k], before[k]) for k in before), "a write did not reach a master"
    kept = {"g", "h", "i"}
    for step, seen in zip((2, 3), passes):
        assert {name for name, _, _ in seen} == {name for name, *_ in mods}, seen
        for name, plane, b in seen:
            src = before if step == 2 and name in kept else after
            ref = plane_bytes(quantize_whole(getattr(m, name).spec, src[f"{name}.weight"]), plane)
            bad = [k for k in ref if not torch.equal(b[k].cpu(), ref[k].cpu())]
            assert not bad, (step, name, plane, bad)
    return {"checked": sum(len(s) for s in passes)}

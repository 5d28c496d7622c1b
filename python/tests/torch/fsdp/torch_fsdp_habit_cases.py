# SPDX-License-Identifier: MIT
"""FSDP2 cases for habits of a PyTorch user that once went wrong (run by the groups of
torch_fsdp_cases.plan_a, each at a world of 2). Each returns a small summary or raises."""
import torch

from torch_fsdp_model import MODULES, build, full_masters, grad_for, loss_of, plane_bytes, quantize_whole, \
    record_planes, shard_all


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

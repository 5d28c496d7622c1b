# SPDX-License-Identifier: MIT
"""mxshard.torch.fsdp.units on simulated ranks (one process, no torch.distributed):
every rank's WeightUnit over its FSDP2 dim-0 shard, the MAX of their shared
entries (what FSDPGroup.refresh's one all-reduce does), apply, the
concatenated all-gather inputs (what FSDP2's all-gather does), assemble ->
every plane byte-identical to the whole-tensor quantize, for random shapes
(1-element dims, non-multiples of the block), worlds (uneven shards, ranks
with no rows), plane sets, layouts, roundings and master dtypes."""
import random

import pytest

from conftest import torch_lib_or_skip


def _simulate(torch, spec, master, world, versions=1):
    """Every rank's unit, the reduction, apply; returns (units, {plane: per-rank send tuples})."""
    from mxshard import fsdp_geometry as G
    from mxshard.torch.fsdp.master import WeightMeta
    from mxshard.torch.fsdp.units import WeightUnit, shared_entry_count
    R, C = master.shape
    meta = WeightMeta(spec, "w", R, C)
    units = []
    for k in range(world):
        r0, r1 = G.rank_rows(R, world, k)
        units.append(WeightUnit(meta, master[r0:r1], world, k))
    n = shared_entry_count(spec, R, C, world)
    for u in units:
        u.partial()
    if n:
        red = torch.stack([u.entries() for u in units]).amax(0)
        for u in units:
            assert u.entries().numel() == n
            u.set_entries(red)
    for u in units:
        u.apply(versions)
    return units


def _gather(torch, units, plane):
    sends = [u.send(plane) for u in units]
    return [torch.cat([s[i].reshape(-1) for s in sends]) for i in range(len(sends[0]))]


@pytest.mark.parametrize("seed", range(24))
def test_gathered_planes_equal_the_whole_tensor_quantize(seed):
    torch = torch_lib_or_skip()
    import mxshard
    from mxshard.torch.fsdp.linear import make_spec
    from mxshard.torch.fsdp.units import scratch_bytes
    rnd = random.Random(seed)
    R = rnd.choice([1, 2, 3, 31, 32, 33, 40, 64, 65, 96, 130])
    C = rnd.choice([1, 5, 17, 31, 32, 33, 64, 70])
    world = rnd.choice([1, 2, 3, 4, 5, 8])
    planes = rnd.choice(["row", "both"])
    layout = rnd.choice(["compact", "padded", "swizzled"])
    rounding = rnd.choice(["ceil", "floor"])
    rt = rnd.choice(["bf16", "none"])
    mdt = rnd.choice([torch.float32, torch.bfloat16])
    spec = make_spec("mxfp8", planes, layout, rounding, None, torch.bfloat16, rt)
    g = torch.Generator().manual_seed(seed)
    master = (torch.randn(R, C, generator=g) * torch.exp2(torch.randint(-20, 20, (R, 1), generator=g).float()))
    master = master.to(mdt)
    if seed % 5 == 0:
        master[rnd.randrange(R), rnd.randrange(C)] = 0.0
    units = _simulate(torch, spec, master, world)
    want = mxshard.MXFP8Weight.empty(R, C, planes=planes, layout=layout, device="cpu")
    src = master.to(torch.bfloat16) if rt == "bf16" else master
    mxshard.quantize(want, src, rounding=rounding)
    for plane in (("row", "col") if planes == "both" else ("row",)):
        outs = _gather(torch, units, plane)
        scratch = torch.full((scratch_bytes(spec, R, C) + 16,), 0xA5, dtype=torch.uint8)
        got = units[rnd.randrange(world)].assemble(plane, outs, scratch[:-16])
        assert torch.equal(getattr(got, f"{plane}_data").reshape(-1), getattr(want, f"{plane}_data").reshape(-1)), \
            (R, C, world, planes, layout, plane)
        assert torch.equal(getattr(got, f"{plane}_scale").reshape(-1), getattr(want, f"{plane}_scale").reshape(-1)), \
            (R, C, world, planes, layout, plane)
        assert torch.all(scratch[-16:] == 0xA5), "assemble wrote past its scratch"
    if world == 1:
        one = units[0].local_primary()
        for plane in (("row", "col") if planes == "both" else ("row",)):
            assert torch.equal(getattr(one, f"{plane}_data").reshape(-1), getattr(want, f"{plane}_data").reshape(-1))
            assert torch.equal(getattr(one, f"{plane}_scale").reshape(-1), getattr(want, f"{plane}_scale").reshape(-1))


@pytest.mark.parametrize("seed", range(24))
def test_nvfp4_gathered_planes_equal_the_whole_tensor_quantize(seed):
    torch = torch_lib_or_skip()
    import mxshard
    from mxshard import fsdp_geometry as G
    from mxshard.torch.fsdp.linear import make_spec
    from mxshard.torch.fsdp.units import scratch_bytes
    rnd = random.Random(1000 + seed)
    while True:  # NVFP4 shards start at even elements: ceil(R/world) * C even
        R = rnd.choice([1, 2, 3, 15, 16, 17, 31, 33, 40, 64, 65, 96])
        C = rnd.choice([1, 2, 5, 16, 17, 32, 33, 40, 70])
        world = rnd.choice([1, 2, 3, 4, 5, 8])
        if G.chunk_rows(R, world) >= R or (G.chunk_rows(R, world) * C) % 2 == 0:
            break
    planes = rnd.choice(["row", "both"])
    block = rnd.choice(["1x16", "16x16"])
    layout = rnd.choice(["compact", "padded", "swizzled"])
    rt = rnd.choice(["bf16", "none"])
    spec = make_spec("nvfp4", planes, layout, None, block, torch.bfloat16, rt)
    g = torch.Generator().manual_seed(seed)
    master = torch.randn(R, C, generator=g) * torch.exp2(torch.randint(-6, 6, (R, 1), generator=g).float())
    units = _simulate(torch, spec, master, world)
    want = mxshard.NVFP4Weight.empty(R, C, planes=planes, block=block, layout=layout, device="cpu")
    mxshard.quantize_nvfp4(want, master, round_through="bf16" if rt == "bf16" else None)
    for plane in (("row", "col") if planes == "both" else ("row",)):
        outs = _gather(torch, units, plane)
        scratch = torch.full((scratch_bytes(spec, R, C) + 16,), 0xA5, dtype=torch.uint8)
        got = units[rnd.randrange(world)].assemble(plane, outs, scratch[:-16])
        ctx = (R, C, world, planes, block, layout, plane)
        for k in ("data", "scale"):
            assert torch.equal(getattr(got, f"{plane}_{k}").reshape(-1), getattr(want, f"{plane}_{k}").reshape(-1)), \
                (k,) + ctx
        assert torch.equal(got.amax, want.amax), ctx
        assert torch.all(scratch[-16:] == 0xA5), "assemble wrote past its scratch"


def test_nvfp4_odd_shard_starts_are_refused_alike_on_every_rank():
    torch = torch_lib_or_skip()
    from mxshard.torch.fsdp.linear import make_spec
    from mxshard.torch.fsdp.units import check_supported
    spec = make_spec("nvfp4", "row", "padded", None, "1x16", torch.bfloat16, "bf16")
    check_supported(spec, 36, 17, 2, "w")           # 18 x 17 elements per rank: even starts
    with pytest.raises(NotImplementedError, match="^mxshard: use an even in_features.*odd number of elements"):
        check_supported(spec, 34, 17, 2, "w")       # 17 x 17: rank 1 would start mid-byte
    check_supported(spec, 33, 17, 1, "w")           # a world of one has no cut
    check_supported(spec, 1, 17, 4, "w")            # rank 0 holds the one row


def test_evenly_sharded_row_only_weights_share_nothing():
    torch = torch_lib_or_skip()
    from mxshard.torch.fsdp.linear import make_spec
    from mxshard.torch.fsdp.units import shared_entry_count
    row = make_spec("mxfp8", "row", "padded", "ceil", None, torch.bfloat16, "bf16")
    both = make_spec("mxfp8", "both", "padded", "ceil", None, torch.bfloat16, "bf16")
    assert shared_entry_count(row, 4096, 4096, 8) == 0
    assert shared_entry_count(both, 4096, 4096, 8) == 0          # 512 rows per rank: no column block cut
    assert shared_entry_count(both, 96, 40, 2) == 40             # 48 rows: one column block row cut
    assert shared_entry_count(row, 33, 64, 2) == 33 * 2          # uneven: every scale rides the reduction
    assert shared_entry_count(both, 33, 64, 2) == 33 * 2 + 2 * 64


def test_send_shapes_are_the_same_for_every_plane_and_padded_when_uneven():
    torch = torch_lib_or_skip()
    from mxshard.torch.fsdp.linear import make_spec
    spec = make_spec("mxfp8", "both", "padded", "ceil", None, torch.bfloat16, "bf16")
    units = _simulate(torch, spec, torch.randn(33, 40), 4)   # uneven: rows 9, 9, 9, 6
    for u in units:
        assert [tuple(t.shape) for t in u.send("row")] == [(9, 40)] == [tuple(t.shape) for t in u.send("col")]
    units = _simulate(torch, spec, torch.randn(96, 40), 2)   # even
    shapes = {tuple(tuple(t.shape) for t in u.send(p)) for u in units for p in ("row", "col")}
    assert len(shapes) == 1 and next(iter(shapes))[0] == (48, 40)

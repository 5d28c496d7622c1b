# SPDX-License-Identifier: MIT
"""NVFP4BucketWriteback over 2 and 3 gloo processes (one process group per
world size) against a whole-tensor quantize, with exactly one MAX all-reduce
per bucket per update: random buckets, odd shard boundaries, a rank-local
failure, a plan mismatch, FSDP fragments. The cases run in processes spawned
by torch_harness.spawn_ranks, which import this module for _worker."""
import datetime
import os
import traceback

import numpy as np
import pytest

import mxshard
from nvfp4_harness import LAYOUTS, _check_fragment_gather, _fsdp_item, _whole, make_src, weights_equal
from torch_harness import spawn_ranks


# ---- the writeback over gloo: 2 and 3 processes -------------------------------------------


class _Count:
    """Counts torch.distributed.all_reduce / all_gather calls (what the package calls)."""

    def __init__(self):
        import torch.distributed as dist
        self.dist, self.calls = dist, {"all_reduce": 0, "all_gather": 0, "all_gather_into_tensor": 0}
        self.orig = {k: getattr(dist, k) for k in self.calls}
        self.reduced = []  # (op, dtype, numel) of each all_reduce

    def __enter__(self):
        for k in self.calls:
            def wrap(*a, _k=k, **kw):
                self.calls[_k] += 1
                if _k == "all_reduce":
                    self.reduced.append((kw.get("op"), a[0].dtype, a[0].numel()))
                return self.orig[_k](*a, **kw)
            setattr(self.dist, k, wrap)
        return self

    def __exit__(self, *exc):
        for k, f in self.orig.items():
            setattr(self.dist, k, f)

    @property
    def any(self):
        return sum(self.calls.values())


def _bucket(rank, world, seed, kind):
    """A random bucket: weights at even bucket offsets, the bucket padded to a
    multiple of 2*world, rank chunks (equal, or random even cuts); some row
    planes in one shared storage (a Megatron-style buffer); a replicated
    weight; a weight only rank 0 owns. Returns (items, specs, full masters)."""
    import torch
    g = np.random.default_rng(seed)
    n_w = int(g.integers(3, 6))
    specs = []
    for _ in range(n_w):
        rows, cols = int(g.integers(1, 40)), int(g.integers(1, 40))
        planes = ["row", "col", "both"][g.integers(3)]
        block, layout = ["1x16", "16x16"][g.integers(2)], LAYOUTS[g.integers(3)]
        specs.append((rows, cols, planes, block, layout))
    offs, end = [], 0
    for r, c, *_ in specs:
        end += end & 1                       # mxs_nvfp4_bucket_place
        offs.append(end)
        end += r * c
    total = -(-end // (2 * world)) * (2 * world)  # mxs_nvfp4_bucket_elems
    if g.integers(2):
        cuts = [total * k // world for k in range(world + 1)]
    else:
        cuts = [0] + sorted(2 * int(v) for v in g.integers(0, total // 2 + 1, world - 1)) + [total]
    lo, hi = cuts[rank], cuts[rank + 1]
    mdt = [torch.float32, torch.bfloat16, torch.float16][g.integers(3)]
    shared = kind == "torch" and g.integers(2)
    row_store = torch.zeros(sum((r * c + 1) // 2 for r, c, *_ in specs) + 8, dtype=torch.uint8)
    items, weights, at = [], [], 0
    for (rows, cols, planes, block, layout), off in zip(specs, offs):
        dev = None if kind == "numpy" else "cpu"
        w = mxshard.NVFP4Weight.empty(rows, cols, planes=planes, block=block, layout=layout, device=dev)
        if shared and w.has_row:
            nb = (rows * cols + 1) // 2
            w = mxshard.NVFP4Weight.from_buffers(rows, cols, block=block, layout=layout,
                                                 row_data=row_store[at:at + nb], row_scale=w.row_scale,
                                                 col_data=w.col_data, col_scale=w.col_scale, amax=w.amax)
            at += nb
        s, e = max(lo, off), min(hi, off + rows * cols)
        start, length = (s - off, e - s) if e > s else (0, 0)
        items.append([w, None, start, length])
        weights.append(w)
    rep = mxshard.NVFP4Weight.empty(20, 18, planes="both", block="16x16",
                                    device=None if kind == "numpy" else "cpu")
    lonely = mxshard.NVFP4Weight.empty(9, 11, planes="col", device=None if kind == "numpy" else "cpu")
    specs += [(20, 18, "both", "16x16", "padded"), (9, 11, "col", "1x16", "padded")]
    items += [[rep, None, 0, 360], [lonely, None, 0, 99 if rank == 0 else 0]]
    return items, specs, mdt


def _fill(items, specs, mdt, step, kind):
    """This update's full masters (in the master dtype) and each rank's shard."""
    import torch
    fulls = []
    for i, ((rows, cols, *_), it) in enumerate(zip(specs, items)):
        gen = torch.Generator().manual_seed(1000 * step + i)
        x = torch.randn(rows * cols, generator=gen) * torch.exp2(torch.randint(-8, 8, (rows * cols,), generator=gen))
        x = x.to(mdt)
        fulls.append(x)
        shard = x[it[2]:it[2] + it[3]].clone()
        if kind == "numpy":  # bf16 as raw uint16 bits (the package's raw16="bf16")
            shard = shard.view(torch.int16).numpy().view(np.uint16) if mdt == torch.bfloat16 else shard.numpy()
        if it[1] is None:
            it[1] = shard
        else:
            it[1][...] = shard
    return fulls


def case_random(rank, world, seeds=(0, 1, 2, 3)):
    import torch
    import torch.distributed as dist
    out = []
    for seed in seeds:
        kind = "numpy" if seed % 4 == 3 else "torch"
        rt = ["bf16", None, "f16"][seed % 3]
        items, specs, mdt = _bucket(rank, world, 100 * world + seed, kind)
        _fill(items, specs, mdt, 0, kind)
        with _Count() as setup_c:
            wb = mxshard.NVFP4BucketWriteback([tuple(it) for it in items], round_through=rt, group=dist.group.WORLD)
        assert setup_c.calls["all_reduce"] == 0
        for step in range(2):
            fulls = _fill(items, specs, mdt, step, kind)
            with _Count() as c:
                wb.run(dist.group.WORLD)
            assert c.calls["all_reduce"] == 1, c.calls
            assert c.reduced == [(dist.ReduceOp.MAX, torch.int32, wb.packed_count)], c.reduced
            for it, spec, x in zip(items, specs, fulls):
                weights_equal(it[0], _whole(x.float().numpy(), *spec, rt))
        out.append((seed, wb.entry_bytes, c.calls["all_gather"]))
    return out


def case_odd(rank, world):
    """Odd shard boundaries: rejected before any collective (no group: no
    collective at all; with a group: only the setup exchange, every rank raises)."""
    import torch.distributed as dist
    w = mxshard.NVFP4Weight.empty(5, 9, planes="both")
    bad_start = 11 if rank == world - 1 else 0
    m = np.ones(6, np.float32)
    with _Count() as c:
        try:
            mxshard.NVFP4BucketWriteback([(w, m, 1 + 2 * rank)])
            raise AssertionError("odd start accepted")
        except mxshard.RangeError as e:
            assert "odd boundary" in str(e) and "even flat index" in str(e)
    assert c.any == 0, c.calls
    with _Count() as c:
        try:
            mxshard.NVFP4BucketWriteback([(w, m, bad_start)], group=dist.group.WORLD)
            raise AssertionError("no error")
        except mxshard.RangeError:
            got = "local"
            assert rank == world - 1
        except mxshard.RemoteError:
            got = "remote"
            assert rank != world - 1
    assert c.calls["all_reduce"] == 0
    assert not w.row_data.any() and not w.row_scale.any() and w.amax[0] == 0
    return got


def case_failure(rank, world):
    """A rank-local failure (before partial's C call, then inside the C
    partial) raises on every rank, nothing is applied anywhere, and the next
    run works."""
    import torch.distributed as dist
    n = 40 * 30
    cuts = [2 * (n * k // (2 * world)) for k in range(world)] + [n]
    w = mxshard.NVFP4Weight.empty(40, 30, planes="both")
    full = np.arange(n, dtype=np.float32) / 7
    m = full[cuts[rank]:cuts[rank + 1]].copy()
    wb = mxshard.NVFP4BucketWriteback([(w, m, cuts[rank])], group=dist.group.WORLD)
    got = []
    for failing, how in ((world - 1, "fault"), (0, "c")):
        saved = None
        if rank == failing:
            if how == "fault":
                wb._fault = ValueError("injected rank-local failure")
            else:
                saved = wb._citems[0].len
                wb._citems[0].len = saved - 2  # the batch no longer matches its plan
        with _Count() as c:
            try:
                wb.run()
                raise AssertionError("run() did not raise")
            except mxshard.RemoteError:
                got.append("remote")
                assert rank != failing
            except (ValueError, mxshard.PlanMismatchError):
                got.append("local")
                assert rank == failing
        assert c.calls["all_reduce"] == 1 and c.calls["all_gather"] == 0, c.calls
        assert not w.row_data.any() and not w.col_scale.any() and w.amax[0] == 0, "applied after a failure"
        wb._fault = None
        if saved is not None:
            wb._citems[0].len = saved
    wb.run()
    weights_equal(w, _whole(full, 40, 30, "both", "1x16", "padded", "bf16"))
    return got


def case_mismatch(rank, world):
    import torch.distributed as dist
    w = mxshard.NVFP4Weight.empty(10, 10 + 2 * rank)
    try:
        mxshard.NVFP4BucketWriteback([(w, np.ones(4, np.float32), 0)], group=dist.group.WORLD)
    except mxshard.PlanMismatchError:
        return "mismatch"
    raise AssertionError("no error")


def case_fragments(rank, world):
    """FSDP over gloo: every rank keeps fragments only (CPU tensors): run()
    makes ONE all_reduce and no gather (the fragments are the caller's); the
    fragments all-gathered by hand == the whole-tensor quantize_nvfp4, the
    column-wise plane through nvfp4_stage_to_col; two updates."""
    import torch.distributed as dist
    specs = [(17, 33, "both", "1x16", "padded"), (16, 40, "both", "16x16", "swizzled"),
             (5, 9, "col", "1x16", "compact"), (21, 3, "row", "16x16", "compact")]
    rng = np.random.default_rng(7)  # the same masters and choices on every rank
    ranks_rng = np.random.default_rng(100 + rank)
    for step in range(2):
        xs = [make_src(rng, spec[:2]) for spec in specs]
        cuts = [[2 * (r * c * k // (2 * world)) for k in range(world)] + [r * c] for r, c, *_ in specs]
        made = [_fsdp_item(ranks_rng, spec, x, cut[rank], cut[rank + 1], "torch") for spec, x, cut in
                zip(specs, xs, cuts)]
        items = [it for it, _ in made]
        wb = mxshard.NVFP4BucketWriteback(items, round_through="bf16", group=dist.group.WORLD)
        with _Count() as c:
            wb.run(dist.group.WORLD)
        assert c.calls["all_reduce"] == 1 and c.calls["all_gather"] == 0 and c.calls["all_gather_into_tensor"] == 0, \
            c.calls
        got = [None] * world
        dist.all_gather_object(got, [(it.row_fragment, it.stage_fragment) for it in items])
        for i, (spec, x) in enumerate(zip(specs, xs)):
            per_rank = []
            for k in range(world):
                it = items[i]._replace(row_fragment=got[k][i][0], stage_fragment=got[k][i][1])
                per_rank.append((it if k != rank else items[i], cuts[i][k], cuts[i][k + 1]))
            _check_fragment_gather(spec, x.astype(np.float32), "bf16", per_rank)
        wb.close()
    return "fragments"


CASES = {"random": case_random, "odd": case_odd, "failure": case_failure, "mismatch": case_mismatch,
         "fragments": case_fragments}


def _worker(rank, world, port, cases, q):
    import torch.distributed as dist
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=30))
        for name in cases:
            q.put((rank, name, "ok", CASES[name](rank, world)))
    except BaseException:  # noqa: BLE001 - the parent reports it
        q.put((rank, "?", "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _spawn(world, cases, timeout=90):
    pytest.importorskip("torch")
    return spawn_ranks(world, _worker, lambda r, port: (r, world, port, cases), world * len(cases), timeout,
                       stop_on_error=True)


@pytest.mark.parametrize("world", [2, 3])
def test_gloo_writeback(world):
    res = _spawn(world, ["random", "odd", "failure", "mismatch", "fragments"])
    for r in range(world):
        assert [e for _, e, _ in res[(r, "random")]] == [2, 4, 4, 2]
        assert res[(r, "odd")] == ("local" if r == world - 1 else "remote")
        assert res[(r, "failure")] == [("local" if r == world - 1 else "remote"), ("local" if r == 0 else "remote")]
        assert res[(r, "mismatch")] == "mismatch"
        assert res[(r, "fragments")] == "fragments"

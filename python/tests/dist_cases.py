# SPDX-License-Identifier: MIT
"""Multi-rank cases of the bucket writeback through torch.distributed, run
by every rank: under torchrun (NCCL, one GPU per rank: test_torchrun.py) and
in processes spawned by test_dist.py (gloo, CPU tensors, numpy arrays, or
CUDA tensors of one device). Each case returns a small summary or raises."""
import os
import traceback

import numpy as np

import mxshard

SHAPES = [(40, 70), (65, 97), (1, 1), (33, 1), (129, 64), (7, 300), (64, 64)]
PLANES = ["row", "both", "both", "row", "col", "both", "row"]


def _full(step, numel):
    import torch
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(numel, generator=g) * torch.exp2(torch.randint(-6, 6, (numel,), generator=g).float())
    return x.float()


def _to_np(x):
    return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)


def _whole_quantize(x, rows, cols, planes, layout, round_through):
    """The whole-tensor quantize on the host (numpy): what every rank must hold."""
    from reference import round_through as rt_fn
    x = _to_np(x).reshape(rows, cols).astype(np.float32)
    if round_through:
        x = rt_fn(x, round_through)
    w = mxshard.MXFP8Weight.empty(rows, cols, planes=planes, layout=layout)
    return mxshard.quantize(w, np.ascontiguousarray(x))


def _planes_equal(w, ref):
    for pn in ("row", "col"):
        a, b = getattr(w, f"{pn}_data"), getattr(ref, f"{pn}_data")
        assert (a is None) == (b is None), f"{pn} plane presence"
        if a is None:
            continue
        assert np.array_equal(_to_np(a).reshape(-1), b.reshape(-1)), f"{pn} data differs"
        assert np.array_equal(_to_np(getattr(w, f"{pn}_scale")).reshape(-1),
                              getattr(ref, f"{pn}_scale").reshape(-1)), f"{pn} scales differ"


def _ptrs(ws):
    out = []
    for w in ws:
        for a in (w.row_data, w.row_scale, w.col_data, w.col_scale):
            if a is not None:
                out.append(a.data_ptr() if hasattr(a, "data_ptr") else a.ctypes.data)
    return out


class CountAllReduce:
    """Wraps torch.distributed.all_reduce (the function the package calls)."""

    def __init__(self):
        import torch.distributed as dist
        self.dist, self.orig, self.calls = dist, dist.all_reduce, 0

    def __enter__(self):
        def counting(*a, **k):
            self.calls += 1
            return self.orig(*a, **k)
        self.dist.all_reduce = counting
        return self

    def __exit__(self, *exc):
        self.dist.all_reduce = self.orig


def case_bucket(rank, world, device, backend="torch", round_through="bf16", mode="fused", steps=2):
    """Mixed row-only / bidirectional / column-only weights in one bucket:
    most in Megatron-style contiguous plane buffers with unaligned rank cuts,
    plus a replicated weight (every rank owns it all) and one whose shard is
    empty on every rank but 0. `steps` updates; each must leave every rank's
    primaries equal to a whole-tensor quantize, storage unmoved, after
    exactly one all-reduce."""
    import torch
    import torch.distributed as dist
    dev = None if backend == "numpy" else device
    bb = mxshard.BucketBuffers(SHAPES, PLANES, layout="padded", device=dev)
    n = bb.numel
    bounds = [0] + [min(n, n * r // world + 13 * r) for r in range(1, world)] + [n]
    lo, hi = bounds[rank], bounds[rank + 1]
    master = np.zeros(hi - lo, np.float32) if backend == "numpy" else torch.zeros(hi - lo, device=device)
    items = bb.shard_items(master, lo, hi)
    # replicated: every rank owns all of it; lonely: only rank 0 owns anything
    rep = mxshard.MXFP8Weight.empty(48, 80, planes="both", layout="swizzled", device=dev)
    lonely = mxshard.MXFP8Weight.empty(31, 33, planes="row", device=dev)
    rep_m = np.zeros(48 * 80, np.float32) if backend == "numpy" else torch.zeros(48 * 80, device=device)
    lon_m = (np.zeros(31 * 33 if rank == 0 else 0, np.float32) if backend == "numpy"
             else torch.zeros(31 * 33 if rank == 0 else 0, device=device))
    items += [(rep, rep_m, 0), (lonely, lon_m, 0)]
    weights = bb.weights + [rep, lonely]
    group = dist.group.WORLD
    wb = mxshard.BucketWriteback(items, round_through=round_through, mode=mode, group=group)
    ptrs0 = _ptrs(weights)
    kinds = [s["kind"] for s in wb._setups[mxshard._bucket.gkey(group)]["sched"] if s is not None]
    counts = []
    for step in range(steps):
        full = _full(step, n)
        rep_full, lon_full = _full(100 + step, 48 * 80), _full(200 + step, 31 * 33)
        if backend == "numpy":
            master[...] = full[lo:hi].numpy()
            rep_m[...] = rep_full.numpy()
            lon_m[...] = lon_full.numpy()[:lon_m.size]
        else:
            master.copy_(full[lo:hi])
            rep_m.copy_(rep_full)
            lon_m.copy_(lon_full[:lon_m.numel()])
        with CountAllReduce() as c:
            wb.run(group)
        counts.append(c.calls)
        if str(device).startswith("cuda"):
            torch.cuda.synchronize()
        for i, ((rows, cols), p) in enumerate(zip(SHAPES, PLANES)):
            x = full[bb.offsets[i]:bb.offsets[i] + rows * cols]
            _planes_equal(bb.weights[i], _whole_quantize(x, rows, cols, p, "padded", round_through))
        _planes_equal(rep, _whole_quantize(rep_full, 48, 80, "both", "swizzled", round_through))
        _planes_equal(lonely, _whole_quantize(lon_full, 31, 33, "row", "padded", round_through))
        assert _ptrs(weights) == ptrs0, "storage moved"
    assert counts == [1] * steps, f"all_reduce calls per run: {counts}"
    wb.close()
    return {"all_reduce_per_run": counts, "gather_kinds": kinds}


def case_inplace_gather(rank, world, device, backend="torch"):
    """Row-only weights whose bytes split evenly: the in-place gather path."""
    import torch
    import torch.distributed as dist
    dev = None if backend == "numpy" else device
    shapes = [(64, 96)] * 3 + [(32, 64)]
    bb = mxshard.BucketBuffers(shapes, "row", device=dev)
    n = bb.numel
    assert n % world == 0
    lo, hi = bb.shard_range(n, world, rank)
    master = np.zeros(hi - lo, np.float32) if backend == "numpy" else torch.zeros(hi - lo, device=device)
    wb = mxshard.BucketWriteback(bb.shard_items(master, lo, hi), group=dist.group.WORLD)
    kinds = [s["kind"] for s in wb._setups[mxshard._bucket.gkey(dist.group.WORLD)]["sched"] if s is not None]
    assert kinds == ["inplace"], kinds
    full = _full(7, n)
    if backend == "numpy":
        master[...] = full[lo:hi].numpy()
    else:
        master.copy_(full[lo:hi])
    with CountAllReduce() as c:
        wb.run()
    assert c.calls == 1
    for i, (rows, cols) in enumerate(shapes):
        x = full[bb.offsets[i]:bb.offsets[i] + rows * cols]
        _planes_equal(bb.weights[i], _whole_quantize(x, rows, cols, "row", "padded", None))
    return {"gather_kinds": kinds}


def case_failure(rank, world, device, backend="torch"):
    """Rank 1 fails before its C call: it raises its own error, every other
    rank RemoteError; strict mode: nothing written anywhere; nobody hangs;
    the next run works."""
    import torch
    import torch.distributed as dist
    dev = None if backend == "numpy" else device
    w = mxshard.MXFP8Weight.empty(40, 70, planes="both", device=dev)
    n = 2800
    lo, hi = n * rank // world, n * (rank + 1) // world
    m = np.ones(hi - lo, np.float32) if backend == "numpy" else torch.ones(hi - lo, device=device)
    wb = mxshard.BucketWriteback([(w, m, lo)], mode="strict", group=dist.group.WORLD)
    before = [_to_np(a).copy() for a in (w.row_data, w.row_scale, w.col_data, w.col_scale)]
    if rank == 1:
        wb._fault = ValueError("injected rank-local failure")
    try:
        with CountAllReduce() as c:
            wb.run()
        raise AssertionError("run() did not raise")
    except mxshard.RemoteError as e:
        got = "remote"
        assert rank != 1 and "MXS_ERR_REMOTE" in str(e)
    except ValueError as e:
        got = "local"
        assert rank == 1 and "injected" in str(e)
    assert c.calls == 1
    for a, b in zip((w.row_data, w.row_scale, w.col_data, w.col_scale), before):
        assert np.array_equal(_to_np(a), b), "strict mode wrote before a failed reduction"
    wb._fault = None
    wb.run()
    ref = _whole_quantize(np.ones(n, np.float32), 40, 70, "both", "padded", None)
    _planes_equal(w, ref)
    return {"first_run": got}


def case_build_failure(rank, world, device, backend="torch"):
    """Rank 1's items fail the Python checks inside a constructor that has a
    group: every rank raises there (rank 1 its ValueError, the others
    RemoteError); no rank hangs."""
    import torch
    import torch.distributed as dist
    dev = None if backend == "numpy" else device
    w = mxshard.MXFP8Weight.empty(40, 70, planes="row", device=dev)
    m = torch.ones(100, device=device) if backend != "numpy" else np.ones(100, np.float32)
    start = 2750 if rank == 1 else 0  # out of range on rank 1
    try:
        mxshard.BucketWriteback([(w, m, start)], group=dist.group.WORLD)
    except mxshard.RemoteError:
        assert rank != 1
        return {"raised": "remote"}
    except ValueError:
        assert rank == 1
        return {"raised": "local"}
    raise AssertionError("no error")


def case_ungatherable_root(rank, world, device, backend="torch"):
    """Rank 1's row_data is a contiguous column of a Fortran-ordered array (a root the gather cannot
    address): found in the group setup, where it used to raise on rank 1 alone, before the
    agreement, and leave the others waiting. Every rank raises (rank 1 its ValueError, the others
    RemoteError), for MXFP8 and NVFP4."""
    import torch.distributed as dist
    out = {}
    for fmt in ("mxfp8", "nvfp4"):
        R, C = 32, 64
        n = R * C if fmt == "mxfp8" else R * C // 2
        rd = np.zeros((n, 2), np.uint8, order="F")[:, 0] if rank == 1 else np.zeros(n, np.uint8)
        if fmt == "mxfp8":
            w = mxshard.MXFP8Weight.from_buffers(R, C, row_data=rd,
                                                 row_scale=np.zeros(mxshard.scale_shape(R, C, "row", "padded"), np.uint8))
            cls = mxshard.BucketWriteback
        else:
            w = mxshard.NVFP4Weight.from_buffers(R, C, row_data=rd, amax=np.zeros(1, np.float32),
                                                 row_scale=np.zeros(mxshard.nvfp4_scale_shape(R, C, "row", "padded"),
                                                                    np.uint8))
            cls = mxshard.NVFP4BucketWriteback
        half = R * C // 2
        m = np.ones(half, np.float32)
        try:
            cls([(w, m, rank * half)], group=dist.group.WORLD)
            out[fmt] = "no error"
        except mxshard.RemoteError:
            out[fmt] = "remote"
        except ValueError as e:
            assert "root array is not contiguous" in str(e), e
            out[fmt] = "local"
    return out


def case_plan_mismatch(rank, world, device, backend="torch"):
    import torch
    import torch.distributed as dist
    dev = None if backend == "numpy" else device
    w = mxshard.MXFP8Weight.empty(40 + rank, 70, planes="row", device=dev)
    m = torch.ones(10, device=device) if backend != "numpy" else np.ones(10, np.float32)
    try:
        mxshard.BucketWriteback([(w, m, 0)], group=dist.group.WORLD)
    except mxshard.PlanMismatchError:
        return {"raised": "plan_mismatch"}
    raise AssertionError("no error")


CASES = {"bucket": case_bucket, "inplace": case_inplace_gather, "failure": case_failure,
         "build_failure": case_build_failure, "plan_mismatch": case_plan_mismatch,
         "ungatherable_root": case_ungatherable_root}


def worker(rank, world, port, backend, device, cases, q):
    """Entry of a spawned process (gloo)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch.distributed as dist
    try:
        import datetime
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
        if str(device).startswith("cuda"):
            import torch
            torch.cuda.set_device(torch.device(device))
        seen = {}
        for name, kw in cases:
            seen[name] = seen.get(name, 0) + 1
            key = name if seen[name] == 1 else f"{name}#{seen[name]}"
            q.put((rank, key, "ok", CASES[name](rank, world, device, **kw)))
    except Exception:  # noqa: BLE001
        q.put((rank, "?", "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()

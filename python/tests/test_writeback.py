# SPDX-License-Identifier: MIT
"""Bucket writeback over simulated ranks in one process (host library,
numpy): several BucketWriteback objects, a Python MAX reduce of their packed
buffers, apply, a simulated byte gather; the primaries must equal a
whole-tensor quantize byte for byte."""
import numpy as np
import pytest

import mxshard
import reference as ref

# (rows, cols, planes): mixed row-only / bidirectional / column-only, odd sizes
WEIGHTS = [(40, 70, "row"), (65, 97, "both"), (1, 1, "both"), (33, 1, "row"), (129, 64, "col"),
           (7, 300, "both"), (32, 32, "row")]


def shard_sets(numel, world, rng, kind):
    """Per rank (start, len) covering [0, numel)."""
    if kind == "even":
        per = -(-numel // world)
        return [(min(r * per, numel), max(0, min(per, numel - r * per))) for r in range(world)]
    if kind == "random":
        cuts = sorted(rng.integers(0, numel + 1, size=world - 1).tolist())
        b = [0] + cuts + [numel]
        return [(b[r], b[r + 1] - b[r]) for r in range(world)]
    if kind == "replicated":  # every rank owns everything
        return [(0, numel)] * world
    if kind == "empty":  # rank 0 owns all, the others nothing
        return [(0, numel)] + [(0, 0)] * (world - 1)
    raise ValueError(kind)


def master_values(rng, n, dtype):
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-8, 8, size=n))).astype(np.float32)
    if dtype == "f32":
        return x, x
    if dtype == "f16":
        h = x.astype(np.float16)
        return h, h.astype(np.float32)
    b = ref.f32_to_bf16_bits(x)
    return b, ref.bf16_bits_to_f32(b)


def simulate(rng, world, weights, shard_kind, dtype="f32", rounding="ceil", round_through=None, mode="fused",
             layout="padded", fragments=False, steps=2):
    masters = []
    per_rank_shards = []
    for (rows, cols, _) in weights:
        per_rank_shards.append(shard_sets(rows * cols, world, rng, shard_kind))
    ranks = []
    for r in range(world):
        prims = [mxshard.MXFP8Weight.empty(rows, cols, planes=p, layout=layout) for rows, cols, p in weights]
        ranks.append({"prims": prims, "masters": [], "frags": [], "wb": None})
    ptrs0 = None
    for step in range(steps):
        full = [master_values(rng, rows * cols, dtype) for rows, cols, _ in weights]
        masters.append(full)
        for r in range(world):
            R = ranks[r]
            if R["wb"] is None:
                items = []
                for i, w in enumerate(R["prims"]):
                    s, n = per_rank_shards[i][r]
                    m = np.empty(n, dtype=full[i][0].dtype)
                    R["masters"].append(m)
                    fr = (None, None)
                    if fragments:
                        fr = (np.zeros(n, np.uint8) if w.has_row else None,
                              np.zeros(n, np.uint8) if w.has_col else None)
                    R["frags"].append(fr)
                    items.append((w, m, s, n, fr) if fragments else (w, m, s, n))
                R["wb"] = mxshard.BucketWriteback(items, rounding=rounding, round_through=round_through,
                                                  mode=mode)
            for i in range(len(weights)):  # the optimizer updates the shard in place
                s, n = per_rank_shards[i][r]
                R["masters"][i][...] = full[i][0][s:s + n]
        for R in ranks:
            R["wb"].partial()
        red = np.maximum.reduce([R["wb"].packed for R in ranks])
        assert red[ranks[0]["wb"].status_offset] == 0
        for R in ranks:
            R["wb"].packed[...] = red
            R["wb"].apply()
        # the byte gather: every rank's shard bytes to every rank
        for i, (rows, cols, planes) in enumerate(weights):
            for pn in ("row", "col"):
                if not getattr(ranks[0]["prims"][i], f"has_{pn}"):
                    continue
                for src_rank in range(world):
                    s, n = per_rank_shards[i][src_rank]
                    if fragments:
                        bytes_ = ranks[src_rank]["frags"][i][0 if pn == "row" else 1]
                    else:
                        bytes_ = getattr(ranks[src_rank]["prims"][i], f"{pn}_data").reshape(-1)[s:s + n]
                    for R in ranks:
                        getattr(R["prims"][i], f"{pn}_data").reshape(-1)[s:s + n] = bytes_
        # every rank equals the whole-tensor quantize
        for i, (rows, cols, planes) in enumerate(weights):
            x = full[i][1].reshape(rows, cols)
            if round_through:
                x = ref.round_through(x, round_through)
            want = ref.quantize(x, planes, layout, rounding)
            for r, R in enumerate(ranks):
                w = R["prims"][i]
                for pn, (data, scale) in want.items():
                    assert np.array_equal(getattr(w, f"{pn}_data"), data), f"step {step} rank {r} item {i} {pn}"
                    assert np.array_equal(getattr(w, f"{pn}_scale").reshape(-1), scale), \
                        f"step {step} rank {r} item {i} {pn} scales"
        ptrs = [[a.ctypes.data for w in R["prims"] for a in (w.row_data, w.row_scale, w.col_data, w.col_scale)
                 if a is not None] for R in ranks]
        if ptrs0 is None:
            ptrs0 = ptrs
        assert ptrs == ptrs0  # storage never moves
    return ranks


@pytest.mark.parametrize("shard_kind", ["even", "random", "replicated", "empty"])
@pytest.mark.parametrize("world", [1, 3])
def test_simulated_ranks_equal_whole_quantize(rng, shard_kind, world):
    simulate(rng, world, WEIGHTS, shard_kind)


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("rounding", ["ceil", "floor"])
@pytest.mark.parametrize("mode", ["fused", "strict"])
def test_options(rng, dtype, rounding, mode):
    simulate(rng, 2, WEIGHTS, "random", dtype=dtype, rounding=rounding, mode=mode)


@pytest.mark.parametrize("rt", ["bf16", "f16"])
@pytest.mark.parametrize("layout", ["compact", "padded", "swizzled"])
def test_round_through_and_layouts(rng, rt, layout):
    simulate(rng, 3, WEIGHTS, "random", round_through=rt, layout=layout)


def test_fragments(rng):
    simulate(rng, 3, WEIGHTS, "random", fragments=True)


def test_bucket_buffers_layout(rng):
    shapes = [(40, 70), (65, 97), (1, 1), (129, 64)]
    planes = ["row", "both", "both", "row"]
    bb = mxshard.BucketBuffers(shapes, planes)
    assert bb.data["row"].size == sum(r * c for r, c in shapes)
    assert bb.data["col"].size == 65 * 97 + 1
    n = bb.numel
    full = rng.standard_normal(n).astype(np.float32)
    world = 3
    bufs = [mxshard.BucketBuffers(shapes, planes) for _ in range(world)]
    wbs, shards = [], []
    for r in range(world):
        lo, hi = mxshard.BucketBuffers.shard_range(n, world, r)
        m = full[lo:hi].copy()
        wbs.append(mxshard.BucketWriteback(bufs[r].shard_items(m, lo, hi)))
        shards.append((lo, hi))
    for wb in wbs:
        wb.partial()
    red = np.maximum.reduce([wb.packed for wb in wbs])
    for wb in wbs:
        wb.packed[...] = red
        wb.apply()
    for pn in ("row",):  # the row buffer has the master's flat layout: gather is one range per rank
        for r, (lo, hi) in enumerate(shards):
            for b in bufs:
                b.data[pn][lo:hi] = bufs[r].data[pn][lo:hi]
    for i, ((rows, cols), p) in enumerate(zip(shapes, planes)):
        x = full[bb.offsets[i]:bb.offsets[i] + rows * cols].reshape(rows, cols)
        want = ref.quantize(x, p, "padded", "ceil")
        for b in bufs:
            assert np.array_equal(b.weights[i].row_data, want["row"][0])
            assert np.array_equal(b.weights[i].row_scale.reshape(-1), want["row"][1])


def test_world_of_one_run(rng):
    w = mxshard.MXFP8Weight.empty(40, 70, planes="both")
    m = rng.standard_normal(2800).astype(np.float32)
    wb = mxshard.BucketWriteback([(w, m, 0)])
    wb.run()
    want = ref.quantize(m.reshape(40, 70), "both", "padded", "ceil")
    assert np.array_equal(w.row_data, want["row"][0]) and np.array_equal(w.col_data, want["col"][0])


def test_remote_failure_protocol(rng):
    """A rank whose partial fails marks its buffer (zeros, status byte 1) and
    raises; after the MAX reduce every other rank's apply raises RemoteError
    and writes nothing."""
    ws = [mxshard.MXFP8Weight.empty(40, 70, planes="both") for _ in range(2)]
    ms = [rng.standard_normal(1400).astype(np.float32) for _ in range(2)]
    wbs = [mxshard.BucketWriteback([(ws[r], ms[r], 1400 * r)]) for r in range(2)]
    snap = [w.row_scale.copy() for w in ws]
    wbs[1]._fault = ValueError("injected")  # a rank-local failure before the C call
    wbs[0].partial()
    with pytest.raises(ValueError):
        wbs[1].partial()
    assert wbs[1].packed[wbs[1].status_offset] == 1 and not wbs[1].packed[:-1].any()
    red = np.maximum(wbs[0].packed, wbs[1].packed)
    wbs[0].packed[...] = red
    with pytest.raises(mxshard.RemoteError) as ei:
        wbs[0].apply()
    assert "MXS_ERR_REMOTE" in str(ei.value)
    assert np.array_equal(ws[0].row_scale, snap[0])


@pytest.mark.parametrize("case", ["range", "len_mismatch", "master_dtype", "frag_size", "frag_absent_plane",
                                  "noncontig", "type", "rounding", "mode", "round_through"])
def test_build_rejections(rng, case):
    w = mxshard.MXFP8Weight.empty(40, 70, planes="row")
    before = (w.row_data.copy(), w.row_scale.copy())
    m = rng.standard_normal(100).astype(np.float32)
    item, kw = (w, m, 0), {}
    if case == "range":
        item = (w, m, 2750)
    elif case == "len_mismatch":
        item = (w, m, 0, 99)
    elif case == "master_dtype":
        item = (w, m.astype(np.float64), 0)
    elif case == "frag_size":
        item = (w, m, 0, 100, (np.zeros(99, np.uint8), None))
    elif case == "frag_absent_plane":
        item = (w, m, 0, 100, (None, np.zeros(100, np.uint8)))
    elif case == "noncontig":
        item = (w, rng.standard_normal(200).astype(np.float32)[::2], 0)
    elif case == "type":
        item = (w.row_data, m, 0)
    elif case == "rounding":
        kw = {"rounding": "up"}
    elif case == "mode":
        kw = {"mode": "lazy"}
    elif case == "round_through":
        kw = {"round_through": "f64"}
    with pytest.raises((ValueError, TypeError)):
        mxshard.BucketWriteback([item], **kw)
    assert np.array_equal(w.row_data, before[0]) and np.array_equal(w.row_scale, before[1])


def test_c_rejects_overlapping_outputs(rng):
    """Two items writing the same primary: the plan's aliasing check (C)."""
    w = mxshard.MXFP8Weight.empty(40, 70, planes="row")
    m = rng.standard_normal(100).astype(np.float32)
    with pytest.raises(mxshard.MxsError) as ei:
        mxshard.BucketWriteback([(w, m, 0), (w, m, 0)])
    assert ei.value.name in ("MXS_ERR_ALIASING", "MXS_ERR_INVALID_ARGUMENT")
    assert ei.value.text.startswith(ei.value.name)


def test_host_overhead_200_weights(rng, capsys):
    """Per-step Python overhead of a 200-weight bucket on the host path:
    run() (world of one) minus the C calls themselves."""
    import time
    ws, items = [], []
    for i in range(200):
        w = mxshard.MXFP8Weight.empty(32, 32, planes="row" if i % 3 else "both")
        m = rng.standard_normal(16).astype(np.float32)
        items.append((w, m, 7))
        ws.append(w)
    wb = mxshard.BucketWriteback(items, round_through="bf16")
    h = mxshard._lib.host_lib()
    for _ in range(20):
        wb.run()

    def best(fn, n=200):
        t = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            t.append((time.perf_counter() - t0) / n)
        return min(t)

    def raw():
        h.wb_partial(wb._bp, wb._pp, wb._packed_ptr)
        h.wb_apply(wb._bp, wb._pp, wb._packed_ptr)
    t_run, t_raw = best(wb.run), best(raw)

    class Stub:  # the C calls replaced by no-ops: what is left is the Python side of run()
        wb_partial = wb_apply = staticmethod(lambda *a: 0)
    wb._host = Stub
    t_py = best(wb.run, 2000)
    wb._host = h
    with capsys.disabled():
        print(f"\n[overhead] 200-weight host bucket, world of one: run() {t_run * 1e6:.1f} us = C partial+apply "
              f"{t_raw * 1e6:.1f} us + Python; run() with the C calls stubbed: {t_py * 1e6:.2f} us")
    assert t_py < 50e-6

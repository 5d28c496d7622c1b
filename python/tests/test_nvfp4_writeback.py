# SPDX-License-Identifier: MIT
"""NVFP4BucketWriteback in one process (mxshard.nvfp4): a world of one and
simulated ranks driven phase by phase against a whole-tensor quantize, the
rejections, FSDP fragments (the gathered fragments == the whole-tensor
quantize, the replaced planes untouched) and nvfp4_stage_to_col. CUDA
tensors: test_nvfp4.py; over gloo processes: test_nvfp4_gloo.py."""
import numpy as np
import pytest

import mxshard
from nvfp4_harness import (_POISON, _check_fragment_gather, _fsdp_item, _np, _whole, make_src, ref_pack, ref_unpack,
                           weights_equal)


# ---- the writeback in one process ------------------------------------------------------------


def test_writeback_world_of_one_and_simulated_ranks(rng):
    """run() without torch.distributed (a world of one), and 3 simulated
    ranks driven step by step: partial, MAX over the entries, apply, copy of
    each rank's byte ranges (the gather), finish."""
    for rt in ("bf16", None):
        cases = [(17, 33, "both", "1x16", "padded"), (16, 48, "both", "16x16", "swizzled"),
                 (5, 9, "col", "16x16", "compact"), (40, 7, "row", "1x16", "compact")]
        xs = [make_src(rng, (r, c)) for r, c, *_ in cases]
        ws = [mxshard.NVFP4Weight.empty(r, c, planes=p, block=b, layout=lay) for r, c, p, b, lay in cases]
        wb = mxshard.NVFP4BucketWriteback([(w, x.reshape(-1), 0) for w, x in zip(ws, xs)], round_through=rt)
        assert wb.entry_bytes == (2 if rt == "bf16" else 4)
        wb.run()
        for w, x, (r, c, p, b, lay) in zip(ws, xs, cases):
            weights_equal(w, _whole(x, r, c, p, b, lay, rt))
        # 3 simulated ranks, even cuts
        world = 3
        ranks = []
        for k in range(world):
            items, prim = [], []
            for (r, c, p, b, lay), x in zip(cases, xs):
                n = r * c
                cut = [0] + [min(n, 2 * (n * j // (2 * world))) for j in range(1, world)] + [n]
                w = mxshard.NVFP4Weight.empty(r, c, planes=p, block=b, layout=lay)
                items.append((w, x.reshape(-1)[cut[k]:cut[k + 1]].copy(), cut[k]))
                prim.append((w, cut[k], cut[k + 1]))
            ranks.append((mxshard.NVFP4BucketWriteback(items, round_through=rt), prim))
        for wbk, _ in ranks:
            wbk.partial()
        red = np.maximum.reduce([wbk.entries() for wbk, _ in ranks])
        for wbk, _ in ranks:
            wbk.entries()[...] = red
            wbk.apply()
        for i in range(len(cases)):  # the gather: every rank's bytes [start/2, ceil(end/2))
            for src_wb, src_p in ranks:
                w0, lo, hi = src_p[i]
                for dst_wb, dst_p in ranks:
                    w1 = dst_p[i][0]
                    bl, bh = lo // 2, (hi + 1) // 2
                    if w0.has_row:
                        w1.row_data.reshape(-1)[bl:bh] = w0.row_data.reshape(-1)[bl:bh]
                    if src_wb._stages[i] is not None:
                        dst_wb._stages[i].obj[bl:bh] = src_wb._stages[i].obj[bl:bh]
        for wbk, prim in ranks:
            wbk.finish()
            for (w, _, _), x, (r, c, p, b, lay) in zip(prim, xs, cases):
                weights_equal(w, _whole(x, r, c, p, b, lay, rt))


def test_writeback_rejections_single_process():
    w = mxshard.NVFP4Weight.empty(3, 7, planes="both")
    m = np.ones(21, np.float32)
    with pytest.raises(mxshard.RangeError, match="odd boundary"):
        mxshard.NVFP4BucketWriteback([(w, m[:5], 5)])
    with pytest.raises(mxshard.RangeError, match="odd boundary"):
        mxshard.NVFP4BucketWriteback([(w, m[:5], 0)])
    mxshard.NVFP4BucketWriteback([(w, m[:11], 10)])           # ends at rows*cols = 21: fine
    mxshard.NVFP4BucketWriteback([(w, m[:0], 5)])             # empty: any start
    with pytest.raises(ValueError, match="outside"):
        mxshard.NVFP4BucketWriteback([(w, m[:4], 18)])
    with pytest.raises(ValueError, match="shard length"):
        mxshard.NVFP4BucketWriteback([(w, m, 0, 20)])
    with pytest.raises(TypeError, match="NVFP4Weight"):
        mxshard.NVFP4BucketWriteback([(mxshard.MXFP8Weight.empty(3, 7), m, 0)])
    with pytest.raises(ValueError, match="col_stage"):
        mxshard.NVFP4BucketWriteback([(mxshard.NVFP4Weight.empty(3, 7), m, 0, 21, np.zeros(11, np.uint8))])
    with pytest.raises(ValueError, match="needs 11"):
        mxshard.NVFP4BucketWriteback([(w, m, 0, 21, np.zeros(10, np.uint8))])
    with pytest.raises(mxshard.AliasingError):
        mxshard.NVFP4BucketWriteback([(w, m, 0), (w, m, 0)])
    with pytest.raises(mxshard.AliasingError):
        mxshard.NVFP4BucketWriteback([(w, w.col_scale.reshape(-1)[:84].view(np.float32), 0)])
    with pytest.raises(ValueError, match="round_through"):
        mxshard.NVFP4BucketWriteback([(w, m, 0)], round_through="f8")
    wb = mxshard.NVFP4BucketWriteback([(w, m, 0)])
    wb.close()
    with pytest.raises(ValueError, match="closed"):
        wb.run()


# ---- fragments (FSDP) ----------------------------------------------------------------------


def test_writeback_fragments_simulated_ranks(rng):
    """FSDP through NVFP4BucketWriteback on 1..4 simulated ranks (random even
    cuts, empty shards included), numpy arrays and CPU tensors: the fragments
    receive the shard's bytes, kept data planes and stages stay untouched (the
    fragment wins), the bucket gathers none of them, finish skips them; the
    gathered fragments == the whole-tensor quantize_nvfp4."""
    specs = [(17, 33, "both", "1x16", "padded"), (16, 48, "both", "16x16", "swizzled"),
             (5, 9, "col", "16x16", "compact"), (40, 7, "row", "1x16", "compact"), (1, 1, "both", "1x16", "padded"),
             (3, 7, "both", "16x16", "compact"), (9, 30, "col", "1x16", "swizzled")]
    for trial in range(8):
        kind = "torch" if trial % 2 else "numpy"
        if kind == "torch":
            pytest.importorskip("torch")
        rt = ("bf16", None, "f16")[trial % 3]
        world = 1 + trial % 4
        xs = [make_src(rng, spec[:2]) for spec in specs]
        cuts = []
        for r, c, *_ in specs:
            n = r * c
            cuts.append([0] + sorted(min(n, 2 * int(v)) for v in rng.integers(0, n // 2 + 1, world - 1)) + [n])
        ranks = []
        for k in range(world):
            made = [_fsdp_item(rng, spec, x, cut[k], cut[k + 1], kind) for spec, x, cut in zip(specs, xs, cuts)]
            wb = mxshard.NVFP4BucketWriteback([it for it, _ in made], round_through=rt)
            assert wb._plane_regions() == [], "fragments: nothing for the bucket to gather"
            ranks.append((wb, made))
        for wb, _ in ranks:
            wb.partial()
        red = np.maximum.reduce([wb.entries() for wb, _ in ranks])
        for wb, _ in ranks:
            wb.entries()[...] = red
            wb.apply()
            wb.finish()
        for i, (spec, x) in enumerate(zip(specs, xs)):
            per_rank = [(made[i][0], cuts[i][k], cuts[i][k + 1]) for k, (_, made) in enumerate(ranks)]
            _check_fragment_gather(spec, x, rt, per_rank)
            for _, made in ranks:  # the fragment wins: kept planes and given stages untouched
                it, keep = made[i]
                for d in list(keep.values()) + ([it.col_stage] if it.col_stage is not None else []):
                    assert (_np(d) == _POISON).all(), "a replaced plane was written"
        for wb, _ in ranks:
            wb.close()


def test_writeback_fragment_rejections():
    w = mxshard.NVFP4Weight.empty(3, 7, planes="both")
    row = mxshard.NVFP4Weight.empty(3, 7, planes="row")
    fsdp = mxshard.NVFP4Weight.from_buffers(3, 7, row_scale=w.row_scale, col_scale=w.col_scale, amax=w.amax)
    m = np.ones(11, np.float32)
    f6 = np.zeros(6, np.uint8)
    with pytest.raises(ValueError, match="no column-wise plane"):
        mxshard.NVFP4BucketWriteback([mxshard.NVFP4WritebackItem(row, m, 10, stage_fragment=f6)])
    with pytest.raises(ValueError, match="needs 6"):
        mxshard.NVFP4BucketWriteback([mxshard.NVFP4WritebackItem(w, m, 10, row_fragment=np.zeros(5, np.uint8))])
    with pytest.raises(ValueError, match="neither data nor a fragment"):
        mxshard.NVFP4BucketWriteback([mxshard.NVFP4WritebackItem(fsdp, m, 10, stage_fragment=f6)])
    with pytest.raises(ValueError, match="no data"):
        mxshard.NVFP4BucketWriteback([mxshard.NVFP4WritebackItem(fsdp, m, 10, row_fragment=f6)])
    with pytest.raises(mxshard.RangeError, match="odd boundary"):
        mxshard.NVFP4BucketWriteback([mxshard.NVFP4WritebackItem(w, m[:10], 11, row_fragment=f6)])
    with pytest.raises(mxshard.AliasingError):  # the fragment over the master
        mxshard.NVFP4BucketWriteback([mxshard.NVFP4WritebackItem(w, m, 10, row_fragment=m.view(np.uint8)[:6])])
    with pytest.raises(mxshard.AliasingError):  # two fragments share bytes
        mxshard.NVFP4BucketWriteback([mxshard.NVFP4WritebackItem(fsdp, m, 10, row_fragment=f6, stage_fragment=f6)])
    # an empty shard: 0-byte fragments, nothing written; the scales complete
    e = mxshard.NVFP4BucketWriteback([mxshard.NVFP4WritebackItem(fsdp, m[:0], 5, row_fragment=f6[:0],
                                                                 stage_fragment=np.zeros(0, np.uint8))])
    e.run()
    assert e._plane_regions() == []


def test_stage_to_col(rng):
    """nvfp4_stage_to_col == the column-wise plane of quantize_nvfp4, from the
    column values in row-major order (1x16: the stage; 16x16: the row-wise
    plane too), numpy and CPU tensors; bad input rejected before writing."""
    for rows, cols in ((17, 33), (16, 48), (1, 1), (3, 7), (32, 8)):
        x = make_src(rng, (rows, cols))
        for block in ("1x16", "16x16"):
            w = _whole(x, rows, cols, "both", block, "padded", "bf16")
            n = rows * cols
            colq = ref_unpack(_np(w.col_data).reshape(-1), n).reshape(cols, rows)
            stage = ref_pack(colq.T.reshape(-1))  # the column values, row-major
            if block == "16x16":
                assert np.array_equal(stage, _np(w.row_data).reshape(-1))
            g = mxshard.NVFP4Weight.empty(rows, cols, planes="col", block=block)
            mxshard.nvfp4_stage_to_col(g, stage)
            assert np.array_equal(_np(g.col_data).reshape(-1), _np(w.col_data).reshape(-1))
            torch = pytest.importorskip("torch")
            gt = mxshard.NVFP4Weight.empty(rows, cols, planes="both", block=block, device="cpu")
            mxshard.nvfp4_stage_to_col(gt, torch.from_numpy(stage))
            assert np.array_equal(_np(gt.col_data).reshape(-1), _np(w.col_data).reshape(-1))
            assert not _np(gt.row_data).any(), "only col_data is written"
    g = mxshard.NVFP4Weight.empty(3, 7, planes="both")
    with pytest.raises(ValueError, match="needs 11"):
        mxshard.nvfp4_stage_to_col(g, np.zeros(10, np.uint8))
    with pytest.raises(ValueError, match="no column-wise"):
        mxshard.nvfp4_stage_to_col(mxshard.NVFP4Weight.empty(3, 7, planes="row"), np.zeros(11, np.uint8))
    with pytest.raises(mxshard.AliasingError):
        mxshard.nvfp4_stage_to_col(g, g.col_data)
    with pytest.raises(TypeError):
        mxshard.nvfp4_stage_to_col(mxshard.MXFP8Weight.empty(3, 7, planes="both"), np.zeros(11, np.uint8))
    assert not g.col_data.any()

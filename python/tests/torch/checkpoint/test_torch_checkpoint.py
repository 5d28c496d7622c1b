# SPDX-License-Identifier: MIT
"""mxshard.torch.checkpoint (DCP): a gloo group of 2, one of 3 and one of 1
process, started at once from a forkserver that imported torch once, run
every case of torch_ckpt_cases.plan(): DP=2 trains and saves, DP=3 and DP=1
load (resharding) and go on; damaged and mismatched checkpoints are rejected
on every rank; the safetensors export reads back; a save or load called on
some ranks only (rank 0 alone: torch.save's habit) raises "every rank" on
those within its timeout, at DP=2 and DP=3. Skips without torch or gloo.
A rank that hangs or dies fails the tests within DEADLINE (its process is
killed), it never blocks the run. The export's round trips:
test_torch_export.py."""
import os

import pytest

import torch_harness as H
from conftest import gloo_or_skip

WORLDS = (2, 3, 1)
DEADLINE = 120  # seconds for all groups


def spawn(worlds, plan):
    """Every case of `plan` in one gloo group per world size, all groups at once; never blocks past DEADLINE."""
    import torch_ckpt_cases as C
    return H.spawn_groups(worlds, C.worker, plan, ["torch_ckpt_cases"], DEADLINE)


@pytest.fixture(scope="module")
def ckpt_results(tmp_path_factory):
    gloo_or_skip()
    import torch_ckpt_cases as C
    root = str(tmp_path_factory.mktemp("dcp"))
    for tag in ("padded", "swizzled", "curve"):
        os.makedirs(os.path.join(root, tag), exist_ok=True)
    return spawn(WORLDS, C.plan(root))


def _case(res, cid, worlds=WORLDS):
    return H.case_results(res, cid, worlds)


def test_reshard_2_to_3_and_1_byte_identical(ckpt_results):
    for cid in ("reshard_padded_both", "reshard_swizzled_row"):
        out = _case(ckpt_results, cid)
        print(f"{cid}: save at DP=2 {out[(2, 0)]['save_s']:.2f} s, load at DP=3 {out[(3, 0)]['load_s']:.2f} s, "
              f"at DP=1 {out[(1, 0)]['load_s']:.2f} s")


def test_resume_other_dp_stays_on_curve(ckpt_results):
    out = _case(ckpt_results, "curve")
    for w in WORLDS:
        o = out[(w, 0)]
        print(f"resume at DP={w} of a DP=2 checkpoint, next steps: max |master - uninterrupted DP=2| = "
              f"{['%.3g' % x for x in o['max_diff']]}, |loss diff| = {['%.3g' % x for x in o['loss_diff']]}"
              + (f" (one step moves masters by up to {o['moved']:.3g})" if "moved" in o else " (bit-identical)"))


def test_corrupted_and_mismatched_rejected_everywhere(ckpt_results):
    out = _case(ckpt_results, "reject", worlds=(3,))
    kinds = set(out[(3, 0)]) - {"seconds", "save_bad_extra"}
    assert kinds == {"truncated", "flipped", "flipped_state", "flipped_model", "missing_key", "no_metadata", "record", "badprim",
                     "shape", "layout", "inner", "rng_other_dp"}, kinds
    assert [out[(3, r)]["save_bad_extra"] for r in range(3)] == ["remote", "local", "remote"]
    for (w, r), o in out.items():
        assert set(o) - {"seconds", "save_bad_extra"} == kinds, (w, r)   # every rank rejected every one
    for k in sorted(kinds):
        print(f"{k}: {out[(3, 0)][k][:160]}")


def test_export_safetensors(ckpt_results):
    out = _case(ckpt_results, "export", worlds=(1,))
    if "skipped" in out[(1, 0)]:
        pytest.skip(out[(1, 0)]["skipped"])
    assert out[(1, 0)]["tensors"] > 10


def test_save_and_load_on_some_ranks_only_raise_every_rank(ckpt_results):
    for w in (2, 3):
        out = _case(ckpt_results, f"every_rank_{w}", worlds=(w,))
        assert out[(w, 0)]["save_alone"] is not None and all(out[(w, r)]["save_alone"] is None for r in range(1, w))
        print(f"DP={w}: save_checkpoint on rank 0 alone raised after {out[(w, 0)]['save_alone']:.2f} s, "
              f"load_checkpoint after {out[(w, 0)]['load_alone']:.2f} s (timeout 0.5 s)")


def test_no_hang_and_runtime(ckpt_results):
    assert not ckpt_results["hung"], f"ranks (world, rank) never finished: {ckpt_results['hung']}"
    print(f"gloo groups of {WORLDS}: {ckpt_results['seconds']:.1f} s")


# ---- a world of one, in this process -------------------------------------------------

def test_world_of_one_and_bad_arguments(tmp_path):
    torch = gloo_or_skip()
    import torch.distributed as dist
    if dist.is_initialized():
        pytest.skip("torch.distributed is initialised in the test process")
    import torch_ckpt_cases as CC
    from mxshard.torch import CheckpointError, load_checkpoint, save_checkpoint
    m, o = CC.make("compact", "both", seed=0, bucket_size=3000)
    CC.train(m, o, range(2))
    d = str(tmp_path / "w1")
    before = CC.local_digest(m, o)
    for call, exc, words in [
            (lambda: save_checkpoint(d, m, o, extra={"x": {1, 2}}), TypeError, "extra['x']"),
            (lambda: save_checkpoint(d, m, o, extra={"a/b": 1}), ValueError, "without '/'"),
            (lambda: save_checkpoint(d, m, o, extra=[1]), TypeError, "pass extra as a dict"),
            (lambda: save_checkpoint(d, m, o, rng=1), TypeError, "pass rng as a bool"),
            (lambda: save_checkpoint(3, m, o), TypeError, "path must be"),
            (lambda: save_checkpoint(d, torch.nn.Linear(2, 2), o), ValueError, "not part of this model"),
            (lambda: save_checkpoint(d, m, object()), TypeError, "ShardedOptimizer"),
            (lambda: load_checkpoint(d, m, o), CheckpointError, "is not a directory"),
            (lambda: load_checkpoint(str(tmp_path), m, o), CheckpointError, "no .metadata"),
            (lambda: load_checkpoint(d, m, o, strict=None), TypeError, "pass strict as a bool"),
            (lambda: save_checkpoint(d, m, o, timeout=0), ValueError, "timeout must be"),
            (lambda: load_checkpoint(d, m, o, timeout="1"), ValueError, "timeout must be")]:
        with pytest.raises(exc) as ei:
            call()
        assert words in str(ei.value), (words, str(ei.value))
    assert not os.path.exists(d)
    assert CC.local_digest(m, o) == before
    # a round trip without torch.distributed: byte-identical into another bucket geometry, then the same steps
    save_checkpoint(d, m, o, extra={"step": 2}, rng=True)
    snap = CC.snapshot(m, o)
    m2, o2 = CC.make("compact", "both", seed=3, bucket_size=10 ** 6)
    assert load_checkpoint(d, m2, o2, rng=True) == {"step": 2}
    CC.compare(CC.snapshot(m2, o2), snap, "world of one")
    CC.train(m, o, range(2, 4))
    CC.train(m2, o2, range(2, 4))
    CC.compare(CC.snapshot(m2, o2), CC.snapshot(m, o), "world of one, continued")

# SPDX-License-Identifier: MIT
"""mxshard.torch.ShardedOptimizer: a group of 2 and a group of 3 gloo
processes (started once each, concurrently, from a forkserver that imported
torch once; spawned where CUDA works) run every case of
torch_dist_cases.PLAN; a world of one and the input checks run here; the
CUDA tests (one device, 2 gloo ranks sharing it) skip without a GPU.
Skips without torch or gloo. A rank that hangs or dies fails the tests
within DEADLINE (its process is killed), it never blocks the run."""
import pytest

import torch_harness as H
from conftest import gloo_or_skip, raises_untouched

WORLDS = (2, 3)
DEADLINE = 90  # seconds for all groups; a hang fails the tests (children killed), never blocks CI


def spawn(worlds, plan=None):
    """Runs every case of `plan` (default torch_optim_habit_cases.PLAN: every case
    of torch_dist_cases.PLAN, then the torch.optim-habit cases) in one gloo group
    per world size, all groups at once. Never blocks past DEADLINE."""
    import torch_optim_habit_cases as HC
    return H.spawn_groups(worlds, HC.worker, plan, ["torch_dist_cases", "torch_optim_habit_cases"], DEADLINE)


@pytest.fixture(scope="module")
def dist_results():
    gloo_or_skip()
    return spawn(WORLDS)


_case = H.case_results


def test_exact_vs_one_process_reference(dist_results):
    import torch_dist_cases as C
    for cid, case, _ in C.PLAN:
        if case != "exact":
            continue
        out = _case(dist_results, cid)
        for w in WORLDS:
            # every item element is owned by exactly one rank
            assert sum(out[(w, r)]["owned"] for r in range(w)) == out[(w, 0)]["total"]
            assert out[(w, 0)]["split_items"] >= 1, f"{cid}: no item split between ranks"
            assert out[(w, 0)]["buckets"] >= 1
            if "rank_without_mx" in cid:
                # (FSDP2's dim-0 rows: a 1-row weight alone among a bucket's converted weights)
                assert out[(w, 0)]["rank_without_mx"] >= 1 and out[(w, 0)]["buckets"] >= 2


def test_forward_backward_hooks_and_counts(dist_results):
    out = _case(dist_results, "fwdbwd")
    for w in WORLDS:
        per = out[(w, 0)]["per_step"]
        assert per == {"all_reduce_norm": 1, "all_reduce_grad": out[(w, 0)]["buckets"], "all_reduce_max": 1,
                       "all_gather": out[(w, 0)]["buckets"]}, per
        assert all(o["worst_over_bound"] <= 1.0 for (ww, _), o in out.items() if ww == w)


def test_save_resume_same_world(dist_results):
    out = _case(dist_results, "resume")
    for (w, r), o in out.items():
        assert o["bad_load"] == ("local" if r == 1 else "remote")


def test_mismatched_ranks_raise_everywhere(dist_results):
    out = _case(dist_results, "mismatch")
    for (w, r), o in out.items():
        assert o["bucket_size"] == o["shape"] == o["lr"] == "local"   # PlanMismatchError on every rank
        assert o["local"] == ("local" if r == 1 else "remote")


def test_rank_local_step_failure_raises_everywhere(dist_results):
    out = _case(dist_results, "step_failure")
    for (w, r), o in out.items():
        for k in ("replaced", "inner", "weight_replaced"):
            assert o[k] == ("local" if r == 1 else "remote"), (w, r, k, o)


def test_step_without_any_gradient_changes_nothing_on_every_rank(dist_results):
    out = _case(dist_results, "no_gradient_step")
    for o in out.values():
        assert o["noop_collectives"] == ["all_reduce_grad", "all_reduce_norm"]


def test_weights_written_from_outside_raise_on_every_rank_until_told(dist_results):
    for (w, r), o in _case(dist_results, "model_written").items():
        assert o["refused"] == ("local" if r == 1 else "remote"), (w, r, o)


def test_ddp_model_refused_on_every_rank(dist_results):
    for o in _case(dist_results, "ddp").values():
        assert o == {"is": "refused", "contains": "refused", "wrapped_after": "raised",
                     "converted_wrapped_after": "raised"}


def test_set_master_under_the_optimizer_raises_on_every_rank_until_told(dist_results):
    for (w, r), o in _case(dist_results, "set_master").items():
        assert o == {k: ("local" if r == 1 else "remote") for k in ("mxfp8_one_rank", "nvfp4_one_rank")}, (w, r, o)


def test_fully_shard_after_the_optimizer_raises_on_every_rank(dist_results):
    for (w, r), o in _case(dist_results, "fsdp_after").items():
        assert o == {"linears_and_root": "fully_shard", "root": "fully_shard", "dense_sub": "step"}, (w, r, o)


def test_requires_grad_changed_after_construction_raises_on_every_rank(dist_results):
    for (w, r), o in _case(dist_results, "requires_grad_changed").items():
        assert o == {k: ("local" if r == 1 else "remote") for k in ("dense", "weight", "module_no_bias", "unfrozen")}, \
            (w, r, o)


def test_a_closure_raising_on_one_rank_raises_on_every_rank(dist_results):
    """step(closure) whose closure raises on rank 1 (after or before its backward): rank 1 raises
    its own exception, the others RemoteError, nothing changes, training goes on."""
    for (w, r), o in _case(dist_results, "closure_raises").items():
        assert o == {k: ("local" if r == 1 else "remote") for k in ("after_backward", "before_backward")}, (w, r, o)


def test_bf16_gradient_buffers_exact_vs_fp32_reference(dist_results):
    out = _case(dist_results, "bf16_exact")
    for (w, r), o in out.items():
        assert o["per_step"]["all_reduce_grad"] >= 1 and o["direct"]["reduce_scatter"] >= 1, o


def test_failed_construction_leaves_nothing_alive(dist_results):
    for o in _case(dist_results, "failed_construction_frees").values():
        assert o["left"] == 0


def test_no_hang_and_runtime(dist_results):
    assert not dist_results["hung"], f"ranks (world, rank) never finished: {dist_results['hung']}"
    print(f"gloo groups of {WORLDS}: {dist_results['seconds']:.1f} s")


# ---- a world of one, in this process ----------------------------------------------------

def test_world_of_one_exact():
    gloo_or_skip()
    import torch.distributed as dist
    if dist.is_initialized():
        pytest.skip("torch.distributed is initialised in the test process")
    import torch_dist_cases as C
    r = C.case_exact(0, 1, layout="padded", opt="adamw", foreach=False, bucket_size=2500)
    assert r["per_step"] == {}
    C.case_exact(0, 1, layout="compact", opt="sgd", foreach=True, max_grad_norm=0.05, grad_reduce="sum", steps=2)


def test_bad_input_raises_before_anything():
    torch = gloo_or_skip()
    from torch import nn
    import torch_dist_cases as C
    from mxshard.torch import ShardedOptimizer

    def adam(g):
        return torch.optim.AdamW(g, lr=1e-3)

    m = C.build_model()
    m.extra = nn.Parameter(torch.zeros(3, device="meta"))
    raises_untouched(m, lambda: ShardedOptimizer(m, adam), ValueError, "one device")
    m = C.build_model(extra_dense=torch.zeros(4, dtype=torch.float64))
    raises_untouched(m, lambda: ShardedOptimizer(m, adam), TypeError, "float64")
    m = C.build_model()
    raises_untouched(m, lambda: ShardedOptimizer(m, adam, param_groups=[{"params": [m.a, m.ln.weight]},
                                                                  {"params": [m.ln.weight]}]),
              ValueError, "list ln.weight once: it is in group 0 and in group 1")
    raises_untouched(m, lambda: ShardedOptimizer(m, adam, param_groups=[{"params": ["a", m.a]}]), ValueError,
                     "list a.weight once")
    raises_untouched(m, lambda: ShardedOptimizer(m, adam, param_groups=[{"params": [m.frozen]}]), ValueError,
              "not a trainable item")
    raises_untouched(m, lambda: ShardedOptimizer(m, adam, param_groups=[{"params": [nn.Parameter(torch.zeros(2))]}]),
              ValueError, "not a trainable item")
    raises_untouched(m, lambda: ShardedOptimizer(m, adam, param_groups=[{"params": ["nope"]}]), ValueError, "'nope'")
    raises_untouched(m, lambda: ShardedOptimizer(m, adam, param_groups={"params": []}), TypeError, "list of dicts")
    raises_untouched(m, lambda: ShardedOptimizer(m, adam, bucket_size=0), ValueError, "bucket_size")
    raises_untouched(m, lambda: ShardedOptimizer(m, adam, grad_reduce="avg"), ValueError, "grad_reduce")
    raises_untouched(m, lambda: ShardedOptimizer(m, adam, round_through="fp8"), ValueError, "round_through")
    raises_untouched(m, lambda: ShardedOptimizer(m, adam, max_grad_norm=-1.0), ValueError, "max_grad_norm")
    raises_untouched(m, lambda: ShardedOptimizer(m, adam, rounding="up"), ValueError, "rounding")
    raises_untouched(m, lambda: ShardedOptimizer(m, lambda g: torch.optim.AdamW([torch.zeros(2, requires_grad=True)])),
              ValueError, "exactly the param groups")
    raises_untouched(m, lambda: ShardedOptimizer(m, lambda g: object()), TypeError,
                     "return a torch.optim.Optimizer, not object")
    with pytest.raises(ValueError, match="trainable parameters"):
        ShardedOptimizer(nn.Module(), adam)
    frozen = nn.Linear(3, 3).requires_grad_(False)
    with pytest.raises(ValueError, match="trainable parameters"):
        ShardedOptimizer(frozen, adam)
    with pytest.raises(TypeError, match="nn.Module"):
        ShardedOptimizer([nn.Parameter(torch.zeros(2))], adam)
    # a good construction afterwards works on the same model, and repr/items/state are sane
    o = ShardedOptimizer(m, adam, bucket_size=2500)
    assert "ShardedOptimizer(world=1" in repr(o) and len(o.items) == len(C.item_table(m))
    assert o.param_groups is o.inner.param_groups
    with pytest.raises(ValueError, match="load a mxshard.sharded_optimizer/2 state dict"):
        o.load_state_dict({"format": "x"})
    with pytest.raises(ValueError, match="close the ShardedOptimizer that trains a first"):
        ShardedOptimizer(m, adam)
    del o
    import gc
    gc.collect()
    o = ShardedOptimizer(m, adam)  # the first one is gone: its hooks do nothing, the model can be taken over
    C.inject(m, 0, 0)
    o.step()


# ---- one CUDA device (skips without one) ----------------------------------------------------

def _cuda_or_skip():
    from conftest import cuda_or_skip
    gloo_or_skip()
    return cuda_or_skip()


def test_cuda_world_of_one():
    _cuda_or_skip()
    import torch_dist_cases as C
    C.case_exact(0, 1, device="cuda", foreach=True)
    C.case_exact(0, 1, device="cuda", opt="sgd", max_grad_norm=0.05, grad_reduce="sum", layout="compact")
    C.case_fwdbwd(0, 1, device="cuda")


def test_cuda_two_gloo_ranks_one_device():
    _cuda_or_skip()
    import torch_dist_cases as C
    res = spawn((2,), C.PLAN_CUDA)
    for cid, _, _ in C.PLAN_CUDA:
        _case(res, cid)
    assert not res["hung"]


def test_export_from_a_data_parallel_group_without_global_rank_0_writes_the_file(dist_results):
    """ShardedOptimizer over new_group([1, 2]) of 3 ranks: export_safetensors on its members writes
    the file, holding the bytes their forward uses (it waited for global rank 0: no file, no error)."""
    out = _case(dist_results, "export_subgroup")
    assert out[(3, 0)] == {"member": False}
    for r in (1, 2):
        assert out[(3, r)] == {"member": True, "written": True, "same": True}, out[(3, r)]

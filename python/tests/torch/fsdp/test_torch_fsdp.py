# SPDX-License-Identifier: MIT
"""FSDP2 (fully_shard) with MXFP8ParamLinear weights on gloo groups of 2, 3
and 4 processes (forkserver; spawn where CUDA works), then groups of 1 and 3
that load the checkpoint the group of 2 saved (torch_fsdp_cases has the
cases). Skips without torch, gloo or the host library; a rank that hangs or
dies fails the tests within DEADLINE (its process killed), never blocks."""
import os

import re

import pytest

import torch_harness as H
from conftest import gloo_or_skip

DEADLINE = 150  # seconds per phase


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("fsdp"))


@pytest.fixture(scope="module")
def phase_a(root):
    gloo_or_skip(host_lib=True)
    import torch_fsdp_cases as F
    return H.spawn_groups((2, 3, 4), F.worker, F.plan_a(root), ["torch_fsdp_cases"], DEADLINE)


@pytest.fixture(scope="module")
def phase_b(root, phase_a):
    import torch_fsdp_cases as F
    H.case_results(phase_a, "dcp_save", (2,))
    return H.spawn_groups((1, 3), F.worker, F.plan_b(root), ["torch_fsdp_cases"], DEADLINE)


@pytest.mark.parametrize("cid", ["exact", "exact_sgd"])
def test_masters_bit_identical_and_every_gathered_plane_is_the_whole_tensor_quantize(phase_a, cid):
    """2, 3 and 4 ranks (even and uneven shards, a weight of one row: ranks that own none, "both"
    weights with column blocks cut by a shard boundary; MXFP8 and NVFP4, both block shapes, every
    layout): the FP32 masters equal a one-process
    torch.optim run bit for bit, every plane the linears read in forward and backward equals the
    whole-tensor quantize of the master, and each step makes exactly one reduction."""
    import torch_fsdp_cases as F
    out = H.case_results(phase_a, cid)
    for (w, r), o in out.items():
        steps = 3 if cid == "exact" else 2
        assert o["checked"] == 2 * len(F.MODULES) * steps, (w, r, o)   # forward + backward plane per step
        assert o["reduces"] == [1] * steps, (w, r, o)      # uneven weights at every world size here
        assert o["group"].get("fetch_all_gather", 0) == 0, (w, r, o)


def test_fsdp_features_train_and_stay_exact(phase_a):
    """MixedPrecisionPolicy, activation checkpointing, reshard_after_forward=False, gradient
    accumulation, clip_grad_norm_, LambdaLR: the loss falls, the last step's planes are exact, one
    reduction per optimizer step (not per micro-batch), and the "both" weights' row plane is
    fetched on demand for the recomputed forward / the un-resharded block's backward."""
    out = H.case_results(phase_a, "features", (2,))
    for r, o in ((r, out[(2, r)]) for r in (0, 1)):
        assert o["losses"][-1] < 0.9 * o["losses"][0], o
        assert o["reduces"] == [1] * len(o["losses"]), o
        assert o["fetches"] == [4] * len(o["losses"]), o
        assert o["checked"] > 0 and abs(o["lr"] - 1e-2 / 1.5) < 1e-12, o
        assert re.match(r"mxshard: call reshard\(\) on the fully_shard module that holds blocks\.1\.up\.weight "
                        r"\(model\.reshard\(\).*or run the module \(module\(x\)\), before reading "
                        r"blocks\.1\.up\.weight: under FSDP2 \(reshard_after_forward=False", o["read_gathered"] or ""), o
        assert o["resharded"] > 0, o


def test_torch_compile_of_each_block_under_fsdp2_has_no_graph_break_and_equals_eager(phase_a):
    """Issue 35: each block compiled, then fully_shard (2 gloo ranks): no graph break, and the
    compiled training run's losses and masters equal eager's bit for bit, MXFP8 and NVFP4."""
    out = H.case_results(phase_a, "compile", (2,))
    for o in out.values():
        for fmt in ("mxfp8", "nvfp4"):
            r = o[fmt]
            assert r["breaks"] == 0 and r["graphs"] >= 1, o
            assert r["same_losses"] and not r["differ"] and r["falls"], o


def test_a_dropped_fsdp2_model_is_freed(phase_a):
    """A converted model under fully_shard, after a step, is freed once dropped (it never was)."""
    out = H.case_results(phase_a, "freed", (2,))
    assert all(o["alive"] == 0 for o in out.values()), out


def test_assign_true_loads_into_the_sharded_masters_and_data_assignment_matches_plain_fsdp2(phase_a):
    """load_state_dict(sd, assign=True) after a step (MXFP8 / NVFP4, row-only / "both"): the masters
    take the values, the gathered planes are their quantize, the optimizer keeps training them; a
    full state dict with assign=True raises on every rank; `weight.data = t` on a sharded converted
    weight does what it does to a plain FSDP2 parameter, without an error or a hang."""
    out = H.case_results(phase_a, "assign", (2,))
    for o in out.values():
        assert o["checked"] == 2 * 4 and o["full_assign"] == "ok", o
        assert o["data_changed"]["converted"] == o["data_changed"]["plain"], o


def test_an_ema_kept_as_parameter_copies_is_not_a_write_into_the_masters(phase_a):
    """EMA copies (p.detach().clone(), lerp_ between evaluations) of MXFP8 "both" and NVFP4 weights:
    no rank raises, the masters stay, the planes gathered after the update are their quantize."""
    out = H.case_results(phase_a, "ema_copy", (2,))
    for o in out.values():
        assert o["checked"] == 4 and o["ema_moved"] > 0, o


def test_weights_kept_gathered_between_evaluations_take_announced_writes(phase_a):
    """NVFP4 linears in the root's group (FSDP2 keeps them gathered after the forward) beside an MXFP8
    one resharded, new master values written between no-grad evaluations and announced with
    masters_changed(): the next pass refreshes every unit; the kept weights multiply by the bytes of
    the last quantize (NVFP4's tensor amax included: it moved under them), the other by the new
    one; after reshard() every weight by the whole-tensor quantize of the new masters."""
    out = H.case_results(phase_a, "root_gathered", (2,))
    for o in out.values():
        assert o["checked"] == 2 * 4, o


def test_a_first_forward_under_inference_mode_works_and_training_follows(phase_a):
    """An evaluation before any training step, in torch.inference_mode(), under fully_shard: the
    outputs of a no_grad forward, then a step moves every master (it raised on every rank)."""
    out = H.case_results(phase_a, "inference_first", (2,))
    for o in out.values():
        assert o["outputs"] == 3 and o["moved"] == o["params"] >= 4, o


def test_a_product_with_a_sharded_converted_weight_in_a_forward_raises_on_every_rank(phase_a):
    """F.linear(x, self.qkv.weight) in a forward under fully_shard: every rank raises, saying to call
    the module or keep it dense."""
    out = H.case_results(phase_a, "product", (2,))
    for o in out.values():
        assert o["raised"] == ("mxshard: call the module to multiply by qkv.weight (qkv(x)), or keep qkv dense "
                               "(convert(..., skip=['qkv'])"), o


def test_a_rank_local_failure_or_a_different_model_raises_on_every_rank(phase_a):
    out = H.case_results(phase_a, "failure", (2,))
    assert out[(2, 0)] == {"partial": "remote", "mismatch": "raised", "policy": "raised"}, out
    assert out[(2, 1)] == {"partial": "local", "mismatch": "raised", "policy": "raised"}, out


def test_unsupported_configurations_fail_clearly(phase_a):
    out = H.case_results(phase_a, "unsupported", (2,))
    for o in out.values():
        assert o["shard1"] == o["sharded"] == o["replaced"] == o["own_groups"] == o["ranks"] == "ok", o
        assert o["convert_late"] == o["data_write"] == o["data_write_after"] == "ok", o
        assert o["one_rank_eval"] == o["one_rank_train"] == o["one_rank_after"] == "ok", o
        # CPUOffloadPolicy on CPU tensors gathers the shard itself (nothing is copied): it works; on a
        # GPU the device copy FSDP2 gathers is rejected (MXS_FSDP_DEVICE=cuda, scripts/gpu-fsdp.sh)
        assert o["offload"] == ("ok" if os.environ.get("MXS_FSDP_DEVICE") == "cuda" else "no error"), o


def test_row_only_weights_gather_mxfp8_or_nvfp4_bytes(phase_a):
    """Row-only MXFP8: 0.516x the BF16 bytes and no reduction; NVFP4 1x16: 0.281x, one tiny all-reduce
    (the tensor amax) per step (exact byte counts asserted in the case)."""
    out = H.case_results(phase_a, "bytes")
    for (w, r), o in out.items():
        assert o["mxfp8"]["all_reduce"] == 0
        assert o["mxfp8"]["bytes"] < 0.52 * o["bf16"]["bytes"], o
        assert o["nvfp4"]["bytes"] < 0.29 * o["bf16"]["bytes"], o
        # every row of docs/fsdp.md's bytes table (the formulas are asserted in the case)
        assert len(o["table"]) == {1: 6, 2: 12, 3: 0, 4: 12}[w], o["table"]


def test_dcp_checkpoint_reshards_2_to_3_and_1_bit_identically(phase_b):
    import torch_fsdp_cases as F
    out = H.case_results(phase_b, "dcp_load")
    assert len(out) == 4 and all(o["params"] == len(F.MODULES) + 2 for o in out.values())


def test_no_hang(phase_a, phase_b):
    assert not phase_a["hung"] and not phase_b["hung"], (phase_a["hung"], phase_b["hung"])
    print(f"fsdp groups: {phase_a['seconds']:.1f} s + {phase_b['seconds']:.1f} s")


def test_sharded_optimizer_and_fsdp2_hold_the_same_bytes(phase_a):
    """The same model, initial values and gradients under ShardedOptimizer and under FSDP2 +
    torch.optim.AdamW: every plane FSDP2 gathers equals ShardedOptimizer's primary, every step."""
    out = H.case_results(phase_a, "vs_sharded", (2,))
    assert all(o["compared"] == 3 * 2 * 3 for o in out.values()), out


def test_fsdp2_model_exports_the_bytes_its_forward_gathers(phase_a):
    """export_safetensors on every rank of an FSDP2 model: the file's planes are the ones FSDP2
    gathers for the forward after the step, byte for byte (MXFP8 and NVFP4, every layout)."""
    import torch_fsdp_cases as F
    out = H.case_results(phase_a, "export", (2,))
    for o in out.values():
        assert o.get("skipped") or o["checked"] == len(F.MODULES), o


def test_a_model_built_on_meta_then_sharded_then_materialised(phase_a):
    """meta device -> convert -> fully_shard -> to_empty -> load values (torchtitan's order), on 2, 3
    and 4 ranks: the masters hold the loaded values and every gathered plane is their quantize."""
    import torch_fsdp_cases as F
    for o in H.case_results(phase_a, "meta").values():
        assert o["checked"] == 2 * len(F.MODULES), o


def test_an_in_place_dcp_load_into_the_state_dict_reaches_the_evaluation(phase_a):
    """dcp.load into model.state_dict() after a forward: the evaluation after it is the saved
    model's (it used the old bytes, silently): row-only MXFP8 weights are redone on each rank,
    "both" cut mid-block and NVFP4 by a refresh every rank runs (one flag says so)."""
    out = H.case_results(phase_a, "dcp_inplace", (2,))
    for o in out.values():
        assert o["row"] == "no error" and o["row_equal"], o
        assert o["cut"] == "no error" and o["cut_equal"], o


def test_an_embedding_tied_to_a_converted_head_says_keep_it_dense(phase_a):
    out = H.case_results(phase_a, "tied", (2,))
    for o in out.values():
        assert o["raised"] == "mxshard: keep head dense (convert(..., skip=['head'])) while ", o


def test_collectives_into_converted_weights_reach_the_forward(phase_a):
    """dist.broadcast / all_reduce into converted weights (hand-written data parallel's syncs):
    the bytes are the quantize of the new masters, and the ranks' forwards agree."""
    out = H.case_results(phase_a, "collectives", (2,))
    for o in out.values():
        assert all(all(v) for k, v in o.items() if k != "same_forward") and o["same_forward"], o


@pytest.mark.parametrize("cid", ["zero", "zero_view"])
def test_ddp_with_zero_redundancy_optimizer_is_one_process_adamw_bit_for_bit(phase_a, cid):
    """DDP + ZeroRedundancyOptimizer (parameters_as_bucket_view False / True), the same batch on
    both ranks: masters, forward and bytes equal a one-process AdamW run (the ranks diverged)."""
    out = H.case_results(phase_a, cid, (2,))
    for o in out.values():
        assert all(o["masters"]) and o["forward"] and all(o["fresh"]), o


def test_convert_after_ddp_raises_on_every_rank(phase_a):
    out = H.case_results(phase_a, "ddp_convert", (2,))
    for o in out.values():
        assert o["raised"] == "convert: convert the model before wrapping it in DistributedDataParallel (D", o


def test_reshard_after_forward_int_raises_on_every_rank_saying_what_to_pass(phase_a):
    out = H.case_results(phase_a, "reshard_int", (4,))
    for o in out.values():
        assert o["raised"] == "mxshard: pass reshard_after_forward=True or False to fully_s", o


def test_torchtune_assign_load_into_a_meta_built_sharded_model(phase_a):
    """load_state_dict(assign=True) of distribute_tensor shards into a model built on meta and
    fully_shard'ed (torchtune's loader): the masters are the state dict's, the gathered planes
    their quantize, and the optimizer trains them."""
    out = H.case_results(phase_a, "assign_meta", (2,))
    for o in out.values():
        assert o["checked"] == 2 * 4 and o["moved"] == o["params"], o


def test_export_with_a_bad_path_on_one_rank_raises_on_every_rank(phase_a):
    out = H.case_results(phase_a, "export_path", (2,))
    assert out[(2, 0)]["bad"] == "FileNotFoundError" and out[(2, 1)]["bad"] == "RemoteError", out
    assert all(o["written"] for o in out.values()), out


def test_save_checkpoint_with_a_path_per_rank_raises_on_every_rank(phase_a):
    out = H.case_results(phase_a, "split_paths", (2,))
    for o in out.values():
        assert o["raised"] == "save_checkpoint: give every rank the same path (on" and not o["written"], o

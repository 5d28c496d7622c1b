# SPDX-License-Identifier: MIT
"""mxshard.torch with a real client: tiny Hugging Face transformers causal
LMs (LlamaForCausalLM with MXFP8, Qwen2ForCausalLM with NVFP4 and a tied
embedding), built from a config with random init (no download), converted,
trained under FSDP2 on 2 gloo ranks, checkpointed with DCP, exported with
export_safetensors and reloaded into a plain HF model with matching logits
(hf_cases has the cases); and, in one process, what HF's own
save_pretrained / from_pretrained make of a converted model.

Skips, saying why, without torch, transformers (.ci/run installs it),
safetensors, gloo or the host library; collects without any of them (torch
and transformers are imported inside the tests). A rank that hangs or dies
fails the tests within DEADLINE (its process killed), never blocks."""
import math
import os

import pytest

import torch_harness as H
from conftest import gloo_or_skip, torch_lib_or_skip

DEADLINE = 120  # seconds for the whole group
ARCHS = ("llama", "qwen2")   # hf_cases.ARCHS (kept here too: collection imports no torch)
STEPS = 3                    # hf_cases.STEPS: the steps before the checkpoint (then one more)
# fp32 on both sides (compute_dtype=torch.float32, the plain model's fp32 weights): the same weight
# values, the same attention code; only the GEMMs' summation order may differ (a dequantized
# matmul against F.linear), a few fp32 ulps of the logits (|logits| < ~2 here; on CPU the
# difference measured is 0: the converted linears' CPU path is dequantize + torch matmul)
ATOL, RTOL = 1e-5, 1e-4


def deps_or_skip(gloo=False):
    """torch (+ gloo), the host library, transformers and safetensors, else skip with the reason."""
    torch = gloo_or_skip(host_lib=True) if gloo else torch_lib_or_skip()
    pytest.importorskip("transformers", reason="transformers is not installed (.ci/run installs it: "
                                               "python3 -m pip install transformers)")
    pytest.importorskip("safetensors", reason="safetensors is not installed (pip install safetensors)")
    return torch


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    deps_or_skip(gloo=True)
    import hf_cases
    root = str(tmp_path_factory.mktemp("hf"))
    return H.spawn_groups((2,), hf_cases.worker, hf_cases.plan(root), ["hf_cases"], DEADLINE)


@pytest.mark.parametrize("arch", ARCHS)
def test_fsdp2_trains_checkpoints_exports_and_reloads_into_plain_hf(group, arch):
    """2 gloo ranks, each decoder layer then the root fully_shard'ed after convert(): 3 AdamW steps
    on one batch lower the loss; the DCP checkpoint (get_state_dict: plain tensors, no QuantMaster)
    loads into a model of other initial values bit for bit (masters, logits, and a further step:
    the optimizer state came along); export_safetensors writes the linears as bytes (no master),
    and a plain HF model loaded from it (load_safetensors) holds exactly the dequantized weights the
    FSDP2 forward multiplies by (read with FSDPModule.unshard + dequantized_weight), the dense
    tensors (embeddings, norms, lm_head tied for qwen2, its q/k/v biases) exactly, and gives the converted model's
    logits (fp32 compute on both sides: ATOL / RTOL) with the same argmax everywhere."""
    out = H.case_results(group, arch)
    for (w, r), o in out.items():
        where = (arch, r, o)
        assert o["same_init"], where
        losses = o["losses"]
        assert all(math.isfinite(x) for x in losses), where
        assert len(losses) == STEPS + 1 and losses[STEPS - 1] < losses[0] and losses[STEPS] < losses[STEPS - 1], where
        assert o["plain_state"], where
        assert o["masters_loaded"] == "equal" and o["logits_loaded"] == 0.0, where
        assert o["continued"], where
        assert o["deq_names"], where
        assert o["file_masters"] == [] and o["file_missing_bytes"] == [], where
        assert o["load_keys"] == ([], []), where
        assert o["plain_is_deq"] == "equal" and o["dense_equal"] == "equal", where
        assert o["dense_checked"][0] == o["dense_checked"][1] > 0, where   # every other tensor, biases included
        assert o["tied"] == (arch == "qwen2"), where
        c = o["logits"]
        assert c["max_abs"] <= ATOL + RTOL * c["scale"], where
        assert c["argmax"] == 1.0, where


def test_no_hang(group):
    assert not group["hung"], group["hung"]
    secs = {k[2]: round(v[1]["seconds"], 1) for k, v in group["res"].items() if k[1] == 0 and v[0] == "ok"}
    print(f"hf group of 2: {group['seconds']:.1f} s (rank 0's cases: {secs})")


@pytest.mark.parametrize("arch", ARCHS)
def test_hf_save_pretrained_writes_the_masters(arch, tmp_path):
    """HF's own save_pretrained of a converted model (one process, after an AdamW step) writes the
    MASTERS: model.state_dict() holds each converted linear's master as a plain fp32 tensor under
    `<m>.weight`, no quantized bytes; from_pretrained(dir) into the plain HF class therefore gives the
    masters, NOT the values the converted forward multiplies by. To get a plain model that computes
    what the converted one does, use export_safetensors + load_safetensors (the FSDP2 test), or
    replace each converted weight by mxt.dequantized_weight(module): then the logits match."""
    torch = deps_or_skip()
    import hf_cases as C
    import mxshard.torch as mxt
    from safetensors import safe_open
    m = C.build(arch)
    names = C.converted_names(m)
    assert len(names) == 2 * len(C.PROJ)
    opt = C.adamw(m)
    C.train_step(m, opt, C.tokens(1))
    m.save_pretrained(str(tmp_path))
    files = sorted(os.listdir(tmp_path))
    assert "config.json" in files and "model.safetensors" in files, files
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        keys = set(f.keys())
        for n in names:
            t = f.get_tensor(f"{n}.weight")
            assert t.dtype == torch.float32 and torch.equal(t, getattr(m.get_submodule(n), "weight").detach()), n
    assert not [k for k in keys if k.rpartition(".")[2] in ("row_data", "row_scale", "col_data", "col_scale", "amax")]

    cls = C.ARCHS[arch][1]
    p = cls.from_pretrained(str(tmp_path))          # fp32: the file's dtype (v5's "auto") and v4's default
    assert not any(mxt.is_param_linear(x) for x in p.modules())
    sd, psd = m.state_dict(), p.state_dict()
    assert sorted(sd) == sorted(psd)
    assert [k for k in sd if not torch.equal(sd[k], psd[k])] == []      # the masters, everything else too
    ids = C.tokens(3, batch=3, seq=13)
    want = C.logits(m, ids)
    masters = C.compare(C.logits(p, ids), want)
    assert masters["max_abs"] > 100 * (ATOL + RTOL * masters["scale"]), masters   # masters != quantized values
    with torch.no_grad():
        for n in names:
            p.get_submodule(n).weight.copy_(mxt.dequantized_weight(m.get_submodule(n)))
    c = C.compare(C.logits(p, ids), want)
    assert c["max_abs"] <= ATOL + RTOL * c["scale"] and c["argmax"] == 1.0, c


def test_default_bf16_compute_against_the_plain_fp32_model():
    """convert()'s default compute_dtype (bf16) against the plain fp32 model holding the same
    dequantized weights (export + load_safetensors, one process): the weights are identical, only
    the activations differ (every converted linear takes its input in bf16 and returns a bf16
    result, relative rounding 2^-9 each, 7 linears deep): the logits agree to a few percent of their
    scale and on nearly every argmax, and far better than the masters' logits would (the
    quantization error of the weights)."""
    torch = deps_or_skip()
    import hf_cases as C
    import mxshard.torch as mxt
    import tempfile
    m = C.build("llama", compute_dtype=torch.bfloat16)
    ids = C.tokens(4, batch=4, seq=16)
    want = C.logits(m, ids)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.safetensors")
        mxt.export_safetensors(path, m)
        p = C.plain("llama", seed=5)
        mxt.load_safetensors(path, p)
    c = C.compare(C.logits(p, ids), want)
    masters = C.compare(C.logits(C.plain("llama", seed=0), ids), want)
    print("bf16 compute vs plain fp32:", c, "masters:", masters)
    assert c["max_abs"] <= 0.02 * c["scale"], c
    assert c["argmax"] >= 0.9, c
    assert c["max_abs"] < masters["max_abs"] / 4, (c, masters)


def test_gpt2_conv1d_is_named():
    """GPT-2 (HF Conv1D, weight [in, out]) is not converted: convert names the modules and the fix."""
    deps_or_skip()
    import mxshard.torch as mxt
    from transformers import GPT2Config, GPT2LMHeadModel
    m = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=16))
    with pytest.raises(ValueError, match=r"Conv1D.*transformer\.h\.0\.attn\.c_attn"):
        mxt.convert(m, "row", skip="lm_head")

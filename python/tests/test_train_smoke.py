# SPDX-License-Identifier: MIT
"""CPU smoke of the end-to-end training loop (examples/train, issue 12): a
tiny GPT, 2 processes over gloo, a few steps with MXFP8 primaries (row-only
and bidirectional) written back by one bucket (one uint8 MAX all-reduce per
step); a checkpoint half-way; resume under DP=2 (byte-identical continuation)
and DP=1 (primaries rewritten from the reloaded masters byte-identical to
the saved ones). Skips cleanly without torch or without the host library."""
import json
import os
import subprocess
import sys

import pytest

from conftest import torch_or_skip

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(REPO, "examples", "train")


def _need():
    torch = torch_or_skip()
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    import mxshard
    try:
        mxshard.library_info()
    except mxshard.LibraryNotFoundError as e:
        pytest.skip(f"libmxshard_host not found: {str(e).splitlines()[0]}")
    return torch


def _train(tmp_path, name, *args, timeout=600, check=True):
    js = tmp_path / f"{name}.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(REPO, "python") + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    cmd = [sys.executable, os.path.join(TRAIN, "train.py"), "--config", "tiny", "--device", "cpu",
           "--log-every", "100", "--out-json", str(js)] + [str(a) for a in args]
    r = subprocess.run(cmd, env=env, timeout=timeout, capture_output=True, text=True)
    if not check and r.returncode != 0:
        if any(w in r.stderr for w in ("not supported", "does not support", "NotImplemented")):
            return None
    assert r.returncode == 0, f"{name} failed:\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    return json.loads(js.read_text())


def test_checkpoint_format_roundtrip(tmp_path):
    torch = torch_or_skip()
    sys.path.insert(0, TRAIN)
    import ckpt
    g = torch.Generator().manual_seed(3)
    tens = {"master": torch.randn(1000, generator=g),
            "primary.w.row_data": torch.randint(0, 256, (7, 33), generator=g, dtype=torch.uint8)
            .view(torch.float8_e4m3fn),
            "primary.w.row_scale": torch.randint(0, 256, (128, 4), generator=g, dtype=torch.uint8),
            "bf16.b": torch.randn(5, generator=g).to(torch.bfloat16), "empty": torch.zeros(0)}
    meta = {"format": "mxshard-train-v1", "step": "3"}
    writers = [False] + ([True] if ckpt._have_pkg() else [])
    for w in writers:
        p = str(tmp_path / f"x{int(w)}.safetensors")
        ckpt.save(tens, meta, p, use_package=w)
        for r in writers:
            out, m = ckpt.load(p, use_package=r)
            assert m["step"] == "3" and set(out) == set(tens)
            for k, v in tens.items():
                assert out[k].dtype == v.dtype and out[k].shape == v.shape
                assert torch.equal(out[k].view(torch.uint8) if v.numel() else out[k],
                                   v.view(torch.uint8) if v.numel() else v)


def test_train_dp2_gloo_checkpoint_resume(tmp_path):
    _need()
    ck = tmp_path / "ck"
    steps, k = 8, 4
    base = ["--steps", steps, "--warmup", 2, "--ckpt-dir", ck]
    a = _train(tmp_path, "a", *base, "--dp", 2, "--save-at", k, "--save-final", ck / "a.safetensors")
    assert a["backend"] == "gloo" and a["dp"] == 2
    assert a["pointers_unchanged"]
    assert a["whole_tensor_check"]["identical"], a["whole_tensor_check"]
    # one bucket writeback = exactly one uint8 MAX all-reduce per step (counted at torch.distributed)
    assert a["collectives_per_step_torch"].get("all_reduce:uint8:MAX") == 1.0, a["collectives_per_step_torch"]
    assert a["collectives_per_step_comm"]["all_reduce_max_u8"] == 1.0
    losses = [v for _, v, _ in a["losses"]]
    assert len(losses) == steps and losses[-1] < losses[0]
    saved = ck / f"mxfp8-dp2-step{k}.safetensors"
    assert saved.exists()

    # same DP: byte-identical continuation
    b = _train(tmp_path, "b", *base, "--dp", 2, "--resume", saved, "--save-final", ck / "b.safetensors")
    assert b["reload_check"]["identical"], b["reload_check"]
    assert [x[2] for x in b["losses"]] == [x[2] for x in a["losses"][k:]]
    sys.path.insert(0, TRAIN)
    from compare import compare_ckpts
    c = compare_ckpts(str(ck / "a.safetensors"), str(ck / "b.safetensors"))
    assert c["identical"], c

    # other DP: the primaries written back from the reloaded masters equal the saved ones
    d = _train(tmp_path, "d", *base, "--dp", 1, "--resume", saved)
    assert d["reload_check"]["identical"], d["reload_check"]
    assert d["reload_whole_tensor_check"]["identical"]
    diff = max(abs(x[1] - y[1]) for x, y in zip(d["losses"], a["losses"][k:]))
    assert diff < 1e-2, diff


def test_train_bf16_baseline_runs(tmp_path):
    _need()
    r = _train(tmp_path, "bf", "--steps", 3, "--variant", "bf16")
    assert r["variant"] == "bf16" and len(r["losses"]) == 3


def test_train_direct_collectives_match_staged(tmp_path):
    """The NCCL code path (reduce_scatter_tensor, in-place all_gather_into_tensor)
    run over gloo on CPU tensors gives the same bytes as the gloo path."""
    _need()
    ck = tmp_path / "ck"
    base = ["--steps", 4, "--warmup", 2, "--dp", 2]
    _train(tmp_path, "staged", *base, "--save-final", ck / "staged.safetensors")
    os.environ["MXS_TRAIN_DIRECT_COLLECTIVES"] = "1"
    try:
        d = _train(tmp_path, "direct", *base, "--save-final", ck / "direct.safetensors", check=False)
    finally:
        del os.environ["MXS_TRAIN_DIRECT_COLLECTIVES"]
    if d is None:
        pytest.skip("this torch's gloo lacks reduce_scatter_tensor / all_gather_into_tensor")
    assert d["grad_sync"] == "reduce_scatter_tensor"
    assert d["collectives_per_step_torch"].get("reduce_scatter_tensor:float32:SUM") == 1.0
    sys.path.insert(0, TRAIN)
    from compare import compare_ckpts
    c = compare_ckpts(str(ck / "staged.safetensors"), str(ck / "direct.safetensors"))
    assert c["identical"], c

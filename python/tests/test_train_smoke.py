# SPDX-License-Identifier: MIT
"""CPU smoke of the training example (examples/train, rebuilt on mxshard.torch):
a tiny GPT converted to MXFP8Linear (row-only + bidirectional) under
ShardedOptimizer(AdamW), 2 gloo processes, a few steps; a checkpoint half-way
(mxshard.torch.save_checkpoint, DCP); resume under DP=2 with torchrun
(bit-identical loss, final checkpoint and exported model; resharding to other DP
sizes is test_torch_checkpoint.py's); per-rank collective traces; a
checkpoint of another configuration is rejected; the BF16 baseline runs; the
two-panel loss plot is written. Skips cleanly without torch, gloo, the host
library or the library's checkpoint API."""
import json
import os
import sys

import pytest

from conftest import gloo_or_skip
from launch import Launch, user_env

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(REPO, "examples", "train")


def _need(ckpt=False):
    torch = gloo_or_skip(host_lib=True)
    if ckpt:
        import mxshard.torch as mxt
        if not all(hasattr(mxt, n) for n in ("save_checkpoint", "load_checkpoint", "export_safetensors")):
            pytest.skip("mxshard.torch has no save_checkpoint/load_checkpoint/export_safetensors yet")
        try:
            import safetensors  # noqa: F401 - the run exports and compares .safetensors files
        except ImportError:
            pytest.skip("safetensors is not installed (the run exports the model; .ci/run installs it)")
    return torch


class _Run:
    """train.py started in a subprocess (torchrun=N: under torchrun with N ranks), not waited for:
    independent runs overlap; result() waits and returns its JSON (ok=False: its output, the run
    must have failed)."""

    def __init__(self, tmp_path, name, *args, timeout=120, ok=True, torchrun=0):
        self.js = tmp_path / f"{name}.json"
        self.name, self.ok = name, ok
        env = user_env()
        launch = []
        if torchrun:
            env.setdefault("GLOO_SOCKET_IFNAME", "lo")   # every rank on this host
            launch += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={torchrun}"]
        cmd = launch + [os.path.join(TRAIN, "train.py"), "--config", "tiny", "--device", "cpu",
                        "--log-every", "100", "--out-json", self.js] + list(args)
        self.run = Launch(cmd, tmp_path, name, timeout=timeout, env=env)

    def result(self):
        rc, stdout, stderr = self.run.wait()
        if not self.ok:
            assert rc != 0, f"{self.name} should have failed:\n{stdout[-2000:]}"
            return stdout + stderr
        assert rc == 0, f"{self.name} failed ({rc}):\n{stdout[-3000:]}\n{stderr[-5000:]}"
        return json.loads(self.js.read_text())

    def stop(self):
        self.run.stop()


def _train(tmp_path, name, *args, **kw):
    """train.py in a subprocess (torchrun=N: under torchrun with N ranks); its JSON."""
    return _Run(tmp_path, name, *args, **kw).result()


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory):
    """The BF16 baseline's run, started once the module's first test asks for it
    (test_train_dp2_gloo_checkpoint_resume does, so that it runs beside that test's first run);
    test_train_bf16_baseline checks it."""
    _need()
    run = _Run(tmp_path_factory.mktemp("bf16"), "bf", "--steps", 3, "--variant", "bf16")
    yield run
    run.stop()


def _compare():
    if TRAIN not in sys.path:
        sys.path.insert(0, TRAIN)
    import compare
    return compare


def test_train_dp2_gloo_checkpoint_resume(tmp_path, bf16_run):
    # bf16_run: the BF16 baseline runs beside this test's first run (its own test checks it)
    _need(ckpt=True)
    ck = tmp_path / "ck"
    steps, k = 8, 4
    base = ["--steps", steps, "--warmup", 2, "--ckpt-dir", ck]
    a = _train(tmp_path, "a", *base, "--dp", 2, "--save-at", k, "--save-final", ck / "a-final",
               "--export", ck / "a.safetensors")
    assert a["backend"] == "gloo" and a["dp"] == 2 and a["launcher"] == "mp.spawn"
    assert a["n_both"] > 0 and a["n_mx"] > a["n_both"], a   # row-only and bidirectional linears
    assert a["whole_tensor_check"]["identical"], a["whole_tensor_check"]
    # per step exactly one MAX all-reduce (the writeback's: every converted weight's shared entries and the
    # status, int32 in the thin ShardedOptimizer), counted at torch.distributed
    torch_calls = a["collectives_per_step_torch"]
    assert torch_calls.get("all_reduce:int32:MAX") == 1.0, torch_calls
    assert sum(v for k, v in torch_calls.items() if k.endswith(":MAX")) == 1.0, torch_calls
    assert a["collectives_per_step_lib"]["all_reduce_max"] == 1.0, a["collectives_per_step_lib"]
    losses = [v for _, v, _ in a["losses"]]
    assert len(losses) == steps and losses[-1] < losses[0] - 0.2, losses
    saved = ck / f"mxfp8-dp2-step{k}"
    assert saved.is_dir()

    # same DP, under torchrun: a bit-identical continuation (loss bits, final checkpoint, exported model);
    # the per-rank collective trace
    b_run = _Run(tmp_path, "b", *base, "--resume", saved, "--save-final", ck / "b-final",
                 "--export", ck / "b.safetensors", "--trace-collectives", tmp_path / "trace", torchrun=2)
    # a checkpoint of another configuration (other bidirectional set) is rejected: a run of its own,
    # beside b (both only read the step-k checkpoint; checked below)
    e_run = _Run(tmp_path, "e", *base, "--resume", saved, "--bidir", "", "--reload-only", ok=False)
    try:
        b = b_run.result()
        out = e_run.result()
    finally:
        b_run.stop()
        e_run.stop()
    assert b["launcher"] == "torchrun" and b["dp"] == 2
    assert b["reload_check"]["identical"] and b["resumed_from"]["step"] == k, b.get("reload_check")
    assert [x[2] for x in b["losses"]] == [x[2] for x in a["losses"][k:]]
    cmp = _compare()
    c = cmp.compare_ckpts(str(ck / "a-final"), str(ck / "b-final"))
    assert c["identical"], c
    f = cmp.compare_files(str(ck / "a.safetensors"), str(ck / "b.safetensors"))
    assert f["identical"], f
    for r in (0, 1):
        lines = (tmp_path / "trace" / f"collectives-rank{r}.log").read_text().splitlines()
        assert any(" all_reduce dtype=int32 " in x and "op=MAX" in x and "step=7" in x for x in lines), lines[-5:]
        assert any("MARK load_checkpoint done" in x for x in lines) and "MARK exit" in lines[-1], lines[-3:]

    # other DP sizes (a DP=2 checkpoint loaded at DP=1 and 3, primaries rebuilt and byte-compared):
    # test_torch_checkpoint.py::test_reshard_2_to_3_and_1_byte_identical

    # a checkpoint of another configuration (other bidirectional set) is rejected (run e, above)
    assert "CheckpointMismatchError" in out and "h.0.qkv.weight" in out, out[-2000:]


def test_train_bf16_baseline(bf16_run):
    r = bf16_run.result()
    assert r["variant"] == "bf16" and r["n_mx"] == 0 and len(r["losses"]) == 3
    assert r["whole_tensor_check"]["identical"] and r["whole_tensor_check"]["dense_params"] > 0


@pytest.mark.parametrize("writer", ["builtin", "matplotlib"])
def test_loss_plot(tmp_path, monkeypatch, writer):
    """examples/train/plot.py: the two-panel PNG with matplotlib when installed, else its built-in
    rasteriser (forced here by hiding matplotlib), and the SVG either way."""
    if writer == "builtin":
        monkeypatch.setitem(sys.modules, "matplotlib", None)   # `import matplotlib` raises ImportError
    else:
        pytest.importorskip("matplotlib", reason="matplotlib is not installed (optional: the plot falls back to "
                                                 "its built-in PNG writer, test_loss_plot[builtin])")
    monkeypatch.syspath_prepend(TRAIN)
    import plot as P
    mx = [(s, 4.0 - 0.1 * s) for s in range(20)]
    bf = [(s, 4.0 - 0.1 * s + 0.01 * (s % 3 - 1)) for s in range(20)]
    png = tmp_path / "loss.png"
    got = P.plot([("MXFP8", mx), ("BF16", bf)], 1.5, str(png), "t", diff_label="MXFP8 - BF16")
    assert got == writer and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = (tmp_path / "loss.svg").read_text()
    assert "loss difference" in svg and "MXFP8 - BF16, per step" in svg
    assert P.difference(mx, bf)[4] == (4, mx[4][1] - bf[4][1])

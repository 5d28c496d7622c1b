# SPDX-License-Identifier: MIT
"""examples/torch_local.py, the README's one-process recipe, run as a user runs
it: convert, torch.optim.AdamW + clip_grad_norm_ + a scheduler, export, reload
into the plain model. It must exit 0, the loss must fall, the converted
weights must be among the parameters, and the plain model must give the
converted one's answers. Skips cleanly without torch or the host library."""
import os
import re
import subprocess
import sys

import pytest

from conftest import torch_lib_or_skip

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(REPO, "examples", "torch_local.py")


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_torch_local_example(tmp_path, fmt):
    torch_lib_or_skip()
    pytest.importorskip("safetensors")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(REPO, "python") + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    cmd = [sys.executable, EXAMPLE, "--device", "cpu", "--format", fmt, "--out", str(tmp_path / "m.safetensors")]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    m = re.search(r"loss ([0-9.]+) -> ([0-9.]+) in \d+ steps; parameters (\d+) \(unconverted: (\d+)\).*"
                  r"max \|logit difference\| / max \|logit\| = ([0-9.e+-]+), argmax agreement ([0-9.]+)", out)
    assert m, out[-4000:]
    first, last, n_conv, n_plain, err, agree = (float(g) for g in m.groups())
    assert last < 0.5 * first and n_conv == n_plain, out
    # bf16 compute against the plain fp32 model with the same (dequantized) weights
    assert err < 1e-2 and agree == 1.0, out
    assert (tmp_path / "m.safetensors").is_file()

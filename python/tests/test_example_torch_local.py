# SPDX-License-Identifier: MIT
"""examples/torch_local.py, the README's one-process recipe, run as a user runs
it: convert, torch.optim.AdamW + clip_grad_norm_ + a scheduler, export, reload
into the plain model. It must exit 0, the loss must fall, the converted
weights must be among the parameters, and the plain model must give the
converted one's answers. Skips cleanly without torch or the host library."""
import os
import re

import pytest

from conftest import torch_lib_or_skip
from launch import REPO, Launch

EXAMPLE = os.path.join(REPO, "examples", "torch_local.py")
FORMATS = ["mxfp8", "nvfp4"]


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory):
    """The example once per format the session selected, all started at once (each run is mostly
    interpreter start-up and `import torch`: they overlap); {fmt: (Launch, its folder)}."""
    torch_lib_or_skip()
    pytest.importorskip("safetensors")
    fmts = [f for f in FORMATS if any(getattr(getattr(it, "callspec", None), "params", {}).get("fmt") == f
                                      for it in request.session.items if it.module is request.module)]
    out = {}
    for fmt in fmts:
        d = tmp_path_factory.mktemp(f"local_{fmt}")
        out[fmt] = (Launch([EXAMPLE, "--device", "cpu", "--format", fmt, "--out", d / "m.safetensors"], d, fmt), d)
    yield out
    for run, _ in out.values():
        run.stop()


@pytest.mark.parametrize("fmt", FORMATS)
def test_torch_local_example(runs, fmt):
    run, folder = runs[fmt]
    rc, stdout, stderr = run.wait()
    out = stdout + stderr
    assert rc == 0, out[-4000:]
    m = re.search(r"loss ([0-9.]+) -> ([0-9.]+) in \d+ steps; parameters (\d+) \(unconverted: (\d+)\).*"
                  r"max \|logit difference\| / max \|logit\| = ([0-9.e+-]+), argmax agreement ([0-9.]+)", out)
    assert m, out[-4000:]
    first, last, n_conv, n_plain, err, agree = (float(g) for g in m.groups())
    assert last < 0.5 * first and n_conv == n_plain, out
    # bf16 compute against the plain fp32 model with the same (dequantized) weights
    assert err < 1e-2 and agree == 1.0, out
    assert (folder / "m.safetensors").is_file()

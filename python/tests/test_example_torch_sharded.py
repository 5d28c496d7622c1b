# SPDX-License-Identifier: MIT
"""examples/torch_sharded.py, the README's "train your own model" program,
run as a user runs it: 2 gloo ranks on CPU, a few steps. It must exit 0,
print that every rank holds the same primaries, and the loss must fall.
Skips cleanly without torch, gloo or the host library."""
import os
import re
import subprocess
import sys

from conftest import gloo_or_skip

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(REPO, "examples", "torch_sharded.py")


def test_torch_sharded_example_two_gloo_ranks():
    gloo_or_skip(host_lib=True)
    if os.environ.get("MXS_RECIPE_CHECKED"):
        import pytest
        pytest.skip(f"already checked: {os.environ['MXS_RECIPE_CHECKED']}")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(REPO, "python") + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    cmd = [sys.executable, EXAMPLE, "--device", "cpu", "--nproc", "2", "--steps", "16", "--layout", "swizzled"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    m = re.search(r"loss ([0-9.]+) -> ([0-9.]+) in 16 steps .*primaries identical on all ranks: (\w+)", out)
    assert m, out[-4000:]
    first, last, same = float(m.group(1)), float(m.group(2)), m.group(3)
    assert same == "True", out[-4000:]
    assert last < first - 0.3, f"the loss did not fall enough: {first} -> {last}"
    # the documented per-step collective counts: B + 1 + 2M + C + D, all > 0 here
    assert "'all_reduce_max'" in out and "'all_gather_col'" in out and "'all_gather_dense'" in out

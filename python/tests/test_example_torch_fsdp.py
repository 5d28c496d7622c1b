# SPDX-License-Identifier: MIT
"""examples/torch_fsdp.py, the README's FSDP2 recipe, run as a user runs it:
2 gloo ranks on CPU, a few steps, a DCP checkpoint at the end. It must exit
0 and the loss must fall. Skips cleanly without torch, gloo or the host
library."""
import os
import re
import subprocess
import sys

from conftest import gloo_or_skip

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(REPO, "examples", "torch_fsdp.py")


def test_torch_fsdp_example_two_gloo_ranks(tmp_path):
    gloo_or_skip(host_lib=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(REPO, "python") + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    ck = tmp_path / "ck"
    cmd = [sys.executable, EXAMPLE, "--device", "cpu", "--nproc", "2", "--steps", "10", "--lr", "1e-2",
           "--hidden", "128", "--layout", "swizzled", "--save", str(ck)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    m = re.search(r"loss ([0-9.]+) -> ([0-9.]+) in 10 steps .*all-gather bytes sent by rank 0: (\d+)", out)
    assert m, out[-4000:]
    first, last = float(m.group(1)), float(m.group(2))
    assert last < first - 0.15, f"the loss did not fall enough: {first} -> {last}"
    assert (ck / ".metadata").is_file(), "no DCP checkpoint written"

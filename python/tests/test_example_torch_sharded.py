# SPDX-License-Identifier: MIT
"""examples/torch_sharded.py, the README's "train your own model" program,
run as a user runs it: 2 gloo ranks on CPU, a few steps. It must exit 0,
print that every rank holds the same primaries, and the loss must fall.
Under scripts/test-python.sh the run checked is the one that script makes
with the pip-installed package (`pip install .`, no MXSHARD_* variables),
beside pytest, with these arguments (MXS_RECIPE_LOG names its output): the
program runs once, not twice. Skips cleanly without torch, gloo or the host
library."""
import ast
import os
import re
import time

from conftest import gloo_or_skip
from launch import REPO, Launch

EXAMPLE = os.path.join(REPO, "examples", "torch_sharded.py")
ARGS = ["--device", "cpu", "--nproc", "2", "--steps", "16", "--layout", "swizzled"]
WAIT = 300   # seconds for scripts/test-python.sh's run (its pip install . first)


def _recipe_run(log):
    """(exit code, output) of scripts/test-python.sh's run, once it ended."""
    rc_file = os.path.splitext(log)[0] + ".rc"   # recipe.log: recipe.rc, recipe.args beside it
    end = time.time() + WAIT
    while not os.path.exists(rc_file) or not os.path.getsize(rc_file):
        assert time.time() < end, f"scripts/test-python.sh's run of {EXAMPLE} gave no exit code in {WAIT} s"
        time.sleep(0.2)
    time.sleep(0.05)   # the rc file is written after the program exited: its line is complete
    rc = open(rc_file).read().strip()
    with open(os.path.join(os.path.dirname(log), "recipe.args")) as f:
        args = f.read().split()
    assert args == ARGS, f"scripts/test-python.sh ran {EXAMPLE} with {args}, this test checks {ARGS}"
    out = open(log).read() if os.path.exists(log) else ""
    return (int(rc) if rc.lstrip("-").isdigit() else rc), out


def test_torch_sharded_example_two_gloo_ranks(tmp_path):
    gloo_or_skip(host_lib=True)
    log = os.environ.get("MXS_RECIPE_LOG")
    if log:
        rc, out = _recipe_run(log)
    else:
        rc, stdout, stderr = Launch([EXAMPLE] + ARGS, tmp_path, "sharded").wait()
        out = stdout + stderr
    assert rc == 0, f"exit {rc}:\n{out[-4000:]}"
    m = re.search(r"loss ([0-9.]+) -> ([0-9.]+) in 16 steps .*primaries identical on all ranks: (\w+)", out)
    assert m, out[-4000:]
    first, last, same = float(m.group(1)), float(m.group(2)), m.group(3)
    assert same == "True", out[-4000:]
    assert last < first - 0.3, f"the loss did not fall enough: {first} -> {last}"
    # the documented per-step collective counts over the 16 steps: 2B + 2 per step (B buckets: one
    # reduction each (gloo: all_reduce_grad), one all_gather each; one norm and one MAX all-reduce)
    b = re.search(r"ShardedOptimizer\(world=2, rank=0, (\d+) buckets", out)
    c = re.search(r"collectives: (\{[^}]*\})", out)
    assert b and c, out[-4000:]
    B, got = int(b.group(1)), ast.literal_eval(c.group(1))
    assert B >= 2 and got == {"all_reduce_grad": 16 * B, "all_reduce_norm": 16, "all_reduce_max": 16,
                              "all_gather": 16 * B}, (B, got)

# SPDX-License-Identifier: MIT
"""The bucket writeback through torch.distributed with 2 processes over
gloo on this machine: CPU tensors and numpy arrays (host library), and CUDA
tensors of one device when there is one. Skips without torch."""
import pytest

from conftest import torch_or_skip
from torch_harness import spawn_ranks

WORLD = 2
TIMEOUT = 180


def spawn(cases, backend="torch", device="cpu", world=WORLD):
    torch_or_skip()
    import dist_cases
    cases = [(c, dict(kw, backend=backend)) for c, kw in cases]
    return spawn_ranks(world, dist_cases.worker, lambda r, port: (r, world, port, backend, device, cases),
                       world * len(cases), TIMEOUT)


@pytest.mark.parametrize("backend", ["torch", "numpy"])
def test_gloo_bucket_two_updates(backend):
    res = spawn([("bucket", {}), ("bucket", {"mode": "strict", "round_through": None}), ("inplace", {})],
                backend=backend)
    for r in range(WORLD):
        assert res[(r, "bucket")]["all_reduce_per_run"] == [1, 1]
        assert res[(r, "bucket#2")]["all_reduce_per_run"] == [1, 1]
        assert "padded" in res[(r, "bucket")]["gather_kinds"]
        assert res[(r, "inplace")]["gather_kinds"] == ["inplace"]


def test_gloo_failures_never_hang():
    res = spawn([("failure", {}), ("build_failure", {}), ("plan_mismatch", {}), ("ungatherable_root", {})])
    assert res[(1, "failure")]["first_run"] == "local" and res[(0, "failure")]["first_run"] == "remote"
    assert res[(1, "build_failure")]["raised"] == "local" and res[(0, "build_failure")]["raised"] == "remote"
    assert all(res[(r, "plan_mismatch")]["raised"] == "plan_mismatch" for r in range(WORLD))
    for r in range(WORLD):   # (a root the gather cannot address, on rank 1: found in the setup, told to all)
        assert res[(r, "ungatherable_root")] == dict.fromkeys(("mxfp8", "nvfp4"), "local" if r == 1 else "remote")


def test_gloo_cuda_tensors_one_device():
    """CUDA tensors through gloo, both processes on one GPU (the collective
    logic of the CUDA path without a second GPU)."""
    from conftest import cuda_or_skip
    cuda_or_skip()
    try:
        spawn([("bucket", {}), ("failure", {})], backend="torch", device="cuda:0")
    except AssertionError as e:
        if "not supported" in str(e).lower() or "unsupported" in str(e).lower():
            pytest.skip(f"gloo lacks an operation on CUDA tensors: {str(e)[-300:]}")
        raise

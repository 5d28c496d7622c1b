# SPDX-License-Identifier: MIT
"""The bucket writeback through torch.distributed with 2 processes over
gloo on this machine: CPU tensors and numpy arrays (host library), and CUDA
tensors of one device when there is one. Skips without torch."""
import multiprocessing as mp
import os
import sys

import pytest

from conftest import torch_or_skip

HERE = os.path.dirname(os.path.abspath(__file__))
WORLD = 2
TIMEOUT = 180


def spawn(cases, backend="torch", device="cpu", world=WORLD):
    torch_or_skip()
    import dist_cases
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    env_pp = os.pathsep.join([HERE, os.path.dirname(HERE)] + [p for p in sys.path if p])
    os.environ["PYTHONPATH"] = env_pp
    port = dist_cases.free_port()
    cases = [(c, dict(kw, backend=backend)) for c, kw in cases]
    procs = [ctx.Process(target=dist_cases.worker, args=(r, world, port, backend, device, cases, q))
             for r in range(world)]
    for p in procs:
        p.start()
    results = {}
    expected = world * len(cases)
    errors = []
    import queue
    import time
    deadline = time.time() + TIMEOUT
    while len(results) + len(errors) < expected and time.time() < deadline:
        try:
            rank, name, status, payload = q.get(timeout=1)
        except queue.Empty:
            if not any(p.is_alive() for p in procs) and q.empty():
                break
            continue
        if status == "ok":
            results[(rank, name)] = payload
        else:
            errors.append(f"rank {rank}:\n{payload}")
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
            errors.append(f"rank process {p.pid} hung (killed)")
    assert not errors, "\n".join(errors)
    assert len(results) == expected, f"missing results: got {sorted(results)}"
    return results


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
    res = spawn([("failure", {}), ("build_failure", {}), ("plan_mismatch", {})])
    assert res[(1, "failure")]["first_run"] == "local" and res[(0, "failure")]["first_run"] == "remote"
    assert res[(1, "build_failure")]["raised"] == "local" and res[(0, "build_failure")]["raised"] == "remote"
    assert all(res[(r, "plan_mismatch")]["raised"] == "plan_mismatch" for r in range(WORLD))


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

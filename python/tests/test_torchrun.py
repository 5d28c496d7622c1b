# SPDX-License-Identifier: MIT
"""Under torchrun with 2+ GPUs (NCCL, one GPU per rank):

    NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \\
    torchrun --standalone --nproc_per_node=2 -m pytest python/tests/test_torchrun.py

Every rank runs the same cases; they skip when not launched by torchrun
with a world of >= 2. With fewer GPUs than ranks (a one-GPU machine) every
rank uses GPU 0 and the group is gloo instead of NCCL (gloo runs the same
collectives on CUDA tensors): the bucket logic, the one all-reduce per
writeback and the never-hang protocol are the same; only the wire differs."""
import os

import pytest

import dist_cases
from conftest import cuda_or_skip


@pytest.fixture(scope="module")
def nccl_group():
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world < 2:
        pytest.skip("not under torchrun with a world of >= 2 (WORLD_SIZE unset or 1)")
    torch = cuda_or_skip()
    import torch.distributed as dist
    rank = int(os.environ["RANK"])
    shared = torch.cuda.device_count() < world  # one GPU for every rank: gloo
    torch.cuda.set_device(0 if shared else int(os.environ.get("LOCAL_RANK", rank)))
    if not dist.is_initialized():
        import datetime
        timeout = datetime.timedelta(seconds=120)  # a mismatch fails, never hangs
        if shared:
            dist.init_process_group("gloo", timeout=timeout)
        else:
            dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()),
                                    timeout=timeout)
    yield rank, world, f"cuda:{torch.cuda.current_device()}"
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.parametrize("kw", [{}, {"mode": "strict", "round_through": None}])
def test_bucket(nccl_group, kw):
    rank, world, dev = nccl_group
    res = dist_cases.case_bucket(rank, world, dev, **kw)
    assert res["all_reduce_per_run"] == [1, 1]


def test_inplace_gather(nccl_group):
    rank, world, dev = nccl_group
    dist_cases.case_inplace_gather(rank, world, dev)


def test_failure(nccl_group):
    rank, world, dev = nccl_group
    res = dist_cases.case_failure(rank, world, dev)
    assert res["first_run"] == ("local" if rank == 1 else "remote")


def test_build_failure(nccl_group):
    rank, world, dev = nccl_group
    dist_cases.case_build_failure(rank, world, dev)


def test_plan_mismatch(nccl_group):
    rank, world, dev = nccl_group
    dist_cases.case_plan_mismatch(rank, world, dev)

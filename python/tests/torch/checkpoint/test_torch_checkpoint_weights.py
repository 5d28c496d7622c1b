# SPDX-License-Identifier: MIT
"""load_checkpoint_weights round trips: a model trained under ShardedOptimizer on 2 gloo ranks and
saved with save_checkpoint (its masters DTensor shards of both ranks), loaded in this one process
into a fresh convert()ed model (its masters bit for bit the trained full masters, its forward the
trained model's exactly) and into a plain model (the same values); a model of other names or
shapes raises CheckpointMismatchError, one a ShardedOptimizer holds CheckpointError, saying what to
do, and nothing is written. Skips without torch, gloo or the host library."""
import datetime
import io
import os
import traceback

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
pytest.importorskip("torch.distributed.checkpoint")

from conftest import gloo_or_skip, host_lib_or_skip  # noqa: E402

host_lib_or_skip(module_level=True)

import torch.nn as nn  # noqa: E402

import mxshard.torch as mxt  # noqa: E402
from torch_harness import spawn_ranks  # noqa: E402

STEPS = 3
X = torch.randn(5, 32, generator=torch.Generator().manual_seed(11))


class Net(nn.Module):
    """Two linears convert() quantizes, a dense LayerNorm, a frozen parameter and a buffer."""

    def __init__(self, seed=0, width=48):
        super().__init__()
        torch.manual_seed(seed)
        self.up = nn.Linear(32, width)
        self.down = nn.Linear(width, 40)
        self.norm = nn.LayerNorm(40)
        self.gain = nn.Parameter(torch.rand(40) + 0.5, requires_grad=False)
        self.register_buffer("shift", torch.randn(40))

    def forward(self, x):
        return self.norm(self.down(torch.nn.functional.gelu(self.up(x)))) * self.gain + self.shift


def converted(fmt, seed=0, **kw):
    return mxt.convert(Net(seed, **kw), "row", format=fmt, compute_dtype=torch.float32)


def full_masters(opt):
    """{item name: fp32 full master} gathered over the ranks (opt._views, dim-0 chunks)."""
    import torch.distributed as dist
    out = {}
    for v, b, pos in opt._views:
        it = opt.buckets[b].items[pos]
        parts = [None] * opt.world
        dist.all_gather_object(parts, v.detach().clone())
        out[it.name] = torch.cat(parts, 0).reshape(it.shape)
    return out


def _train_and_save(rank, world, fmt, path):
    m = converted(fmt)
    opt = mxt.ShardedOptimizer(m, lambda g: torch.optim.AdamW(g, lr=1e-2))
    for s in range(STEPS):
        x = torch.randn(4, 32, generator=torch.Generator().manual_seed(100 * s + rank))   # each rank its batch
        m(x).pow(2).sum().backward()
        opt.step()
        opt.zero_grad()
    mxt.save_checkpoint(path, m, opt)
    res = {"masters": full_masters(opt), "out": m(X).detach(), "shift": m.shift.clone(), "gain": m.gain.clone()}
    opt.close()
    return res


def _worker(rank, world, port, jobs, q):
    import torch.distributed as dist
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
        torch.set_num_threads(1)
        for fmt, path in jobs:   # (as bytes: a tensor in the queue is a shared-memory handle, gone when this exits)
            buf = io.BytesIO()
            torch.save(_train_and_save(rank, world, fmt, path), buf)
            q.put((rank, fmt, "ok", buf.getvalue()))
    except BaseException:  # noqa: BLE001 - the parent reports it
        q.put((rank, "?", "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


FMTS = ("mxfp8", "nvfp4")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    gloo_or_skip(host_lib=True)
    root = tmp_path_factory.mktemp("ckw")
    jobs = [(fmt, str(root / fmt)) for fmt in FMTS]
    res = spawn_ranks(2, _worker, lambda r, port: (r, 2, port, jobs), 2 * len(jobs), 180, stop_on_error=True)
    res = {k: torch.load(io.BytesIO(v)) for k, v in res.items()}
    return {fmt: (path, res[(0, fmt)], res[(1, fmt)]) for fmt, path in jobs}


def u8(t):
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def state(m):
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


@pytest.mark.parametrize("fmt", FMTS)
def test_into_a_converted_model_the_masters_bit_for_bit_and_the_forward(fmt, saved):
    path, r0, r1 = saved[fmt]
    assert all(torch.equal(u8(r0["masters"][k]), u8(r1["masters"][k])) for k in r0["masters"])
    assert torch.equal(r0["out"], r1["out"])            # the replicated weights: one model on both ranks
    masters = r0["masters"]
    assert set(masters) == {"up.weight", "up.bias", "down.weight", "down.bias", "norm.weight", "norm.bias"}
    fresh = converted(fmt, seed=5)
    assert not torch.equal(fresh(X), r0["out"])
    assert tuple(mxt.load_checkpoint_weights(path, fresh)) == ([], [])
    sd = fresh.state_dict()
    for k, t in masters.items():    # a converted weight's state dict entry is its master
        assert sd[k].dtype == torch.float32 and torch.equal(u8(sd[k]), u8(t)), k
    assert torch.equal(fresh.up.weight.detach()._data, masters["up.weight"])
    assert torch.equal(sd["shift"], r0["shift"]) and torch.equal(sd["gain"], r0["gain"])
    assert torch.equal(fresh(X), r0["out"])             # the same quantization: the same bytes, the same forward
    before = fresh.up.weight.detach()._data.clone()     # and torch.optim trains on from there
    o = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    fresh(X).pow(2).sum().backward()
    o.step()
    assert not torch.equal(fresh.up.weight.detach()._data, before)


@pytest.mark.parametrize("fmt", FMTS)
def test_into_a_plain_model_the_same_values(fmt, saved):
    path, r0, _ = saved[fmt]
    plain = Net(seed=6)
    assert tuple(mxt.load_checkpoint_weights(path, plain)) == ([], [])
    sd = plain.state_dict()
    for k, t in r0["masters"].items():
        assert torch.equal(u8(sd[k]), u8(t)), k
    assert torch.equal(sd["shift"], r0["shift"]) and torch.equal(sd["gain"], r0["gain"])
    half = Net(seed=6).to(torch.bfloat16)               # a plain model of another dtype: the values cast
    mxt.load_checkpoint_weights(path, half)
    assert all(torch.equal(half.state_dict()[k], t.to(torch.bfloat16)) for k, t in r0["masters"].items())


@pytest.mark.parametrize("fmt", FMTS)
def test_a_mismatch_raises_and_writes_nothing(fmt, saved, tmp_path):
    path = saved[fmt][0]
    for other, words in [(converted(fmt, seed=7, width=56), r"up.weight: the checkpoint has \(48, 32\), the "
                                                            r"model \(56, 32\)"),
                         (nn.Sequential(nn.Linear(32, 48)), r"2 name\(s\) the checkpoint lacks \['0.weight', "
                                                            r"'0.bias'\]")]:
        snap = state(other)
        with pytest.raises(mxt.CheckpointMismatchError, match=r"^load_checkpoint_weights: build the model the "
                                                              r"checkpoint was saved from.*" + words):
            mxt.load_checkpoint_weights(path, other)
        assert all(torch.equal(u8(v), u8(snap[k])) for k, v in other.state_dict().items())
    extra = Net(seed=8)
    extra.more = nn.Linear(2, 2)
    with pytest.raises(mxt.CheckpointMismatchError, match=r"more.weight"):
        mxt.load_checkpoint_weights(path, extra)
    assert tuple(mxt.load_checkpoint_weights(path, extra, strict=False)) == (["more.weight", "more.bias"], [])
    held = converted(fmt, seed=9)
    with mxt.ShardedOptimizer(held, lambda g: torch.optim.AdamW(g, lr=1e-2)):
        snap = state(held)
        with pytest.raises(mxt.CheckpointError, match=r"^load_checkpoint_weights: load into a model that convert\(\) "
                                                      r"made \(or a plain one\), not one a ShardedOptimizer holds"):
            mxt.load_checkpoint_weights(path, held)
        assert all(torch.equal(u8(v), u8(snap[k])) for k, v in held.state_dict().items())
    with pytest.raises(mxt.CheckpointError, match=r"^load_checkpoint_weights: give the folder of a "
                                                  r"mxt.save_checkpoint checkpoint"):
        mxt.load_checkpoint_weights(tmp_path, Net())

# SPDX-License-Identifier: MIT
"""Damaged and edited files (one process): export_safetensors records a checksum per tensor and
load_safetensors checks them, the metadata's kinds, and a file's planes against its metadata,
before anything is written; load_checkpoint_weights checks a ShardedOptimizer checkpoint's
checksums and wraps DCP's read errors; export refuses paths it cannot write, leaving no temporary
file; ShardedOptimizer.load_state_dict checks the inner optimizer's state. Each once went through
silently, or with an error that did not say what to do."""
import json
import os

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
pytest.importorskip("safetensors", reason="safetensors is not installed (pip install safetensors)")

from conftest import host_lib_or_skip  # noqa: E402

host_lib_or_skip(module_level=True)

import safetensors.torch as st  # noqa: E402
import torch.nn as nn  # noqa: E402
from safetensors import safe_open  # noqa: E402

import mxshard.torch as mxt  # noqa: E402
from mxshard.torch import CheckpointError, CheckpointMismatchError  # noqa: E402


def net(seed=0, **kw):
    torch.manual_seed(seed)
    return mxt.convert(nn.Sequential(nn.Linear(64, 48), nn.GELU(), nn.Linear(48, 8)), "row", **kw)


def snapshot(m):
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


def unchanged(m, snap):
    return all(torch.equal(v, snap[k]) for k, v in m.state_dict().items())


def rewrite(src, dst, edit_tensors=None, edit_meta=None):
    """A copy of safetensors file src with its tensors / metadata edited."""
    with safe_open(src, framework="pt") as f:
        meta = dict(f.metadata())
        tensors = {k: f.get_tensor(k).clone() for k in f.keys()}
    if edit_tensors:
        edit_tensors(tensors)
    if edit_meta:
        edit_meta(meta)
    st.save_file(tensors, dst, metadata=meta)
    return dst


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4"])
def test_a_damaged_or_edited_export_is_refused_before_anything_is_written(fmt, tmp_path):
    src = str(tmp_path / "a.safetensors")
    mxt.export_safetensors(src, net(0, format=fmt))
    m = net(1, format=fmt)
    snap = snapshot(m)

    def flip(key):
        def edit(t):
            b = t[key].view(torch.uint8).reshape(-1)
            b[b.numel() // 2] ^= 0x5A
        return edit
    cases = [
        (flip("0.row_scale"), None, CheckpointError, r"^load_safetensors: give an undamaged file: .*'0.row_scale'"),
        (flip("0.row_data"), None, CheckpointError, r"^load_safetensors: give an undamaged file: .*'0.row_data'"),
        (None, lambda md: md.update(mxshard="[1, 2]"), CheckpointError,
         r"^load_safetensors: give a file written by export_safetensors \(unedited\)"),
        (None, lambda md: md.update(mxshard=json.dumps({k: dict(v, format="fp6") for k, v in
                                                        json.loads(md["mxshard"]).items()})), CheckpointError,
         r"names the format 'fp6'"),
        # (a writer that records no checksums, e.g. the first one: the plan's own checks)
        (lambda t: t.update({"0.weight": torch.zeros(48, 64)}), lambda md: md.pop("checksums"),
         CheckpointMismatchError, r"^load_safetensors: give a file written by export_safetensors \(unedited\): it "
                                  r"has both a dense 0.weight"),
        (None, lambda md: (md.pop("checksums"), md.update(mxshard=json.dumps(
            {k: v for k, v in json.loads(md["mxshard"]).items() if k != "2"}))), CheckpointMismatchError,
         r"it has 2's quantized planes"),
    ]
    for i, (et, em, exc, words) in enumerate(cases):
        path = rewrite(src, str(tmp_path / f"e{i}.safetensors"), et, em)
        for strict in (True, False):
            with pytest.raises(exc, match=words):
                mxt.load_safetensors(path, m, strict=strict)
            assert unchanged(m, snap), (i, strict)
    mxt.load_safetensors(src, m)   # the undamaged file loads
    assert not unchanged(m, snap)


def test_an_export_of_another_rounding_is_a_mismatch(tmp_path):
    """A "ceil" export into a "floor" model was quantized again silently (28 values differed)."""
    p = str(tmp_path / "c.safetensors")
    mxt.export_safetensors(p, net(0, rounding="ceil"))
    m = net(1, rounding="floor")
    snap = snapshot(m)
    with pytest.raises(CheckpointMismatchError, match="rounding 'ceil', the model's 'floor'"):
        mxt.load_safetensors(p, m)
    assert unchanged(m, snap)


def test_export_refuses_paths_it_cannot_write_and_leaves_no_temporary_file(tmp_path):
    m = net()
    with pytest.raises(ValueError, match=r"^export_safetensors: give a file path"):
        mxt.export_safetensors("", m)
    assert not os.path.exists(".tmp")
    (tmp_path / "x.safetensors.tmp").mkdir()
    with pytest.raises(CheckpointError, match=r"^export_safetensors: give a path you can write"):
        mxt.export_safetensors(str(tmp_path / "x.safetensors"), m)
    assert not (tmp_path / "x.safetensors").exists()


def test_load_checkpoint_weights_checks_the_checkpoint(tmp_path):
    """A ShardedOptimizer checkpoint with a flipped byte in a master loaded silently; a truncated
    shard raised DCP's CheckpointException (a BaseException, not caught by `except Exception`)."""
    import torch.distributed.checkpoint as dcp
    m = net(0)
    with mxt.ShardedOptimizer(m, lambda g: torch.optim.AdamW(g, lr=1e-2)) as o:
        mxt.save_checkpoint(str(tmp_path / "ck"), m, o)
    md = dcp.FileSystemReader(str(tmp_path / "ck")).read_metadata()
    info = next(v for k, v in md.storage_data.items() if k.fqn == "master/0.weight")
    blob = tmp_path / "ck" / info.relative_path
    data = bytearray(blob.read_bytes())
    keep = bytes(data)
    data[info.offset + info.length // 2] ^= 0x5A
    blob.write_bytes(bytes(data))
    target = net(1)
    snap = snapshot(target)
    with pytest.raises(CheckpointError, match=r"^load_checkpoint_weights: give an undamaged checkpoint: "
                                              r"master/0.weight"):
        mxt.load_checkpoint_weights(str(tmp_path / "ck"), target)
    blob.write_bytes(keep[:info.offset + 4])
    with pytest.raises(CheckpointError, match=r"^load_checkpoint_weights: give a complete checkpoint folder"):
        mxt.load_checkpoint_weights(str(tmp_path / "ck"), target)
    assert unchanged(target, snap)
    blob.write_bytes(keep)
    mxt.load_checkpoint_weights(str(tmp_path / "ck"), target)
    assert not unchanged(target, snap)


def test_sharded_optimizer_load_state_dict_checks_the_inner_state():
    """An exp_avg of another shape, missing state keys, or a string lr were loaded over the masters
    and the state, and the next step() failed. They raise first; nothing changes (the masters, the
    inner state, the options, the model's weights)."""
    m = net()
    with mxt.ShardedOptimizer(m, lambda g: torch.optim.AdamW(g, lr=1e-2)) as o:
        m(torch.randn(4, 64)).sum().backward()
        o.step()
        good = o.state_dict()
        before = [v.clone() for v, _, _ in o._views]
        inner = {id(v): {k: t.clone() if isinstance(t, torch.Tensor) else t for k, t in o.inner.state[v].items()}
                 for v, _, _ in o._views}
        lrs = [g["lr"] for g in o.inner.param_groups]
        weights = snapshot(m)
        name = o.items[0].name
        assert set(good["state"][name]) == {"step", "exp_avg", "exp_avg_sq"}
        edits = [lambda sd: sd["state"][name].update(exp_avg=torch.zeros(3)),
                 lambda sd: sd["state"][name].pop("exp_avg_sq"),
                 lambda sd: sd["param_groups"][0].update(lr="fast")]
        for edit in edits:
            sd = o.state_dict()
            sd["state"] = {n: dict(st) for n, st in sd["state"].items()}
            sd["param_groups"] = [dict(g) for g in sd["param_groups"]]
            edit(sd)
            with pytest.raises(ValueError, match=r"^ShardedOptimizer.load_state_dict: give a state dict this "
                                                 r"optimizer's state_dict\(\) made"):
                o.load_state_dict(sd)
            assert all(torch.equal(a, v) for a, (v, _, _) in zip(before, o._views))
            for v, _, _ in o._views:
                st = o.inner.state[v]
                assert set(st) == set(inner[id(v)])
                assert all(torch.equal(t, inner[id(v)][k]) for k, t in st.items())
            assert [g["lr"] for g in o.inner.param_groups] == lrs
            assert unchanged(m, weights)
        o.load_state_dict(good)
        m(torch.randn(4, 64)).sum().backward()
        o.step()
        assert not all(torch.equal(a, v) for a, (v, _, _) in zip(before, o._views))

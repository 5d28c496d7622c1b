# SPDX-License-Identifier: MIT
"""mxshard.torch.checkpoint cases run by test_torch_checkpoint.py: one gloo
group of 2, one of 3 and one of 1 process, started at once; each runs every
case of PLAN for its world size. The DP=2 group trains, saves the
checkpoints and writes the references (full tensors, torch.save-d by its
rank 0) next to them, then a READY marker; the DP=3 and DP=1 groups wait for
the marker and load. every_rank runs in the DP=3 group first (while it
waits) and in the DP=2 group last. Each case returns a small summary or
raises."""
import hashlib
import os
import pickle
import shutil
import time

import torch
import torch.distributed as dist

import mxshard
import torch_harness as H
from mxshard.torch import (CheckpointError, CheckpointMismatchError, ShardedOptimizer, export_safetensors,
                           load_checkpoint, save_checkpoint)
from torch_dist_cases import MLP, _gather_obj, _live, build_model, grad_for, groups_of  # noqa: F401  (shared)

WAIT = 60.0      # seconds a loading group waits for the DP=2 group's marker
SAVE_WORLD = 2
LR_CURVE = 1e-3


def _barrier():
    if _live() and dist.get_world_size() > 1:
        dist.barrier()


def _rank0():
    return not _live() or dist.get_rank() == 0


def _u8(t):
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def _ready(root, tag):
    """Written by the DP=2 group's rank 0 when `tag`'s files are complete (or FAILED)."""
    if _rank0():
        with open(os.path.join(root, f"{tag}.tmp"), "w") as f:
            f.write("ok")
        os.replace(os.path.join(root, f"{tag}.tmp"), os.path.join(root, f"{tag}.READY"))


def _failed(root, tag, rank):
    with open(os.path.join(root, f"{tag}.FAILED.{rank}"), "w") as f:
        f.write("failed")


def _wait(root, tag):
    t0 = time.time()
    while time.time() < t0 + WAIT:
        if os.path.exists(os.path.join(root, f"{tag}.READY")):
            return
        if any(n.startswith(f"{tag}.FAILED") for n in os.listdir(root)):
            raise RuntimeError(f"the DP={SAVE_WORLD} group failed to write {tag} (see its error)")
        time.sleep(0.05)
    raise RuntimeError(f"no {tag}.READY from the DP={SAVE_WORLD} group within {WAIT} s")


# ---- full views (every rank's shards assembled) -------------------------------------------

def _pieces(opt):
    """This rank's (item, first row, {"master": rows, inner state key: rows}) of every item."""
    out = []
    for v, b, pos in opt._views:
        it = opt.buckets[b].items[pos]
        d = {"master": v.detach().cpu().clone()}
        for k, x in opt.inner.state.get(v, {}).items():
            d[k] = x.detach().cpu().clone() if isinstance(x, torch.Tensor) and x.shape == v.shape and x.dim() else \
                float(x)
        out.append((it.name, it.shape, opt.buckets[b].rows_of(pos, opt.rank)[0], d))
    return out


def _assemble(opt):
    """{name: {"master" | state key: full tensor}} and {"name|k": scalar} from every rank's rows:
    every row owned by exactly one rank."""
    full, scal, seen = {}, {}, {}
    for pieces in _gather_obj(_pieces(opt)):
        for name, shape, r0, d in pieces:
            rows = shape[0] if shape else 1
            for k, x in d.items():
                if isinstance(x, float):
                    assert scal.setdefault(f"{name}|{k}", x) == x, f"scalar state {name}|{k} differs between ranks"
                    continue
                t = full.setdefault(name, {}).setdefault(k, torch.zeros((rows,) + tuple(shape[1:]), dtype=x.dtype))
                owned = seen.setdefault((name, k), torch.zeros(rows, dtype=torch.int32))
                t[r0:r0 + x.shape[0]] = x
                owned[r0:r0 + x.shape[0]] += 1
    for (name, k), owned in seen.items():
        assert bool((owned == 1).all()), f"{name} {k}: rows not owned by exactly one rank: {owned.tolist()}"
    return full, scal


def full_masters(opt):
    """The full fp32 master of every item, assembled from every rank's rows (collective)."""
    full, _ = _assemble(opt)
    return {n: d["master"].reshape(-1) for n, d in full.items()}


def full_state(opt):
    """{"name|k": full tensor} of the inner state tensors and {"name|k": value} of the scalars."""
    full, scal = _assemble(opt)
    return {f"{n}|{k}": t.reshape(-1) for n, d in full.items() for k, t in d.items() if k != "master"}, scal


def snapshot(m, opt):
    """Everything a checkpoint restores, as full tensors (collective)."""
    st, scal = full_state(opt)
    return {"masters": {k: v.clone() for k, v in full_masters(opt).items()}, "state": st, "scalars": scal,
            "model": {k: v.detach().cpu().clone() for k, v in m.state_dict().items()}, "steps": opt.steps,
            "lr": [g["lr"] for g in opt.param_groups]}


def compare(a, b, what):
    """Byte-identical snapshots (raises naming the first difference)."""
    for part in ("masters", "state", "model"):
        assert a[part].keys() == b[part].keys(), f"{what}: {part} keys differ"
        for k in a[part]:
            x, y = a[part][k], b[part][k]
            assert x.dtype == y.dtype and x.shape == y.shape, f"{what}: {part} {k} dtype/shape"
            assert torch.equal(_u8(x), _u8(y)), f"{what}: {part} {k}: {int((_u8(x) != _u8(y)).sum())} bytes differ"
    assert a["scalars"] == b["scalars"], f"{what}: scalar state {a['scalars']} vs {b['scalars']}"
    assert a["steps"] == b["steps"] and a["lr"] == b["lr"], f"{what}: steps/lr"


def local_digest(m, opt):
    """This rank's model bytes, master shards and inner state (nothing of it may change on a rejected load)."""
    h = hashlib.sha256()
    for k, v in m.state_dict().items():
        h.update(k.encode() + _u8(v).numpy().tobytes())
    for buf in opt._master:
        h.update(_u8(buf).numpy().tobytes())
    for i, st in sorted(opt.inner.state_dict()["state"].items()):
        for k, v in sorted(st.items()):
            b = _u8(v).numpy().tobytes() if isinstance(v, torch.Tensor) else repr(v).encode()
            h.update(f"{i}{k}".encode() + b)
    h.update(repr([{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]).encode())
    h.update(str(opt.steps).encode())
    return h.hexdigest()


# ---- models -------------------------------------------------------------------------

def inject(opt, step, rank):
    """Every item's gradient through autograd into its live Parameter (the optimizer's hooks)."""
    ps = [it.live_param() for it in opt._items]
    torch.autograd.backward(ps, [grad_for(it.name, it.shape, step, rank).to(p.dtype)
                                 for it, p in zip(opt._items, ps)])


FACTORIES = {
    "adamw": lambda fe: (lambda g: torch.optim.AdamW(g, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.05,
                                                     foreach=fe)),
    "sgd": lambda fe: (lambda g: torch.optim.SGD(g, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01,
                                                 foreach=fe)),
}
FACTORY = FACTORIES["adamw"](True)


def make(layout, planes_c, seed, bucket_size, factory=FACTORY, b_rows=33):
    m = build_model(layout, planes_c, seed=seed, b_rows=b_rows)
    return m, ShardedOptimizer(m, factory, bucket_size=bucket_size, param_groups=groups_of(m))


def train(m, o, steps):
    """World-independent dyadic gradients (rank 0's on every rank): the mean is the same at any DP,
    so a run resumed at another DP continues bit-identically."""
    for s in steps:
        inject(o, s, 0)
        o.step()
        o.zero_grad()


def _bucket_size(world):
    return {1: 10 ** 6, 2: 2500, 3: 1800}[world]


# ---- cases --------------------------------------------------------------------------

K, MORE = 3, 2


def case_reshard(rank, world, root, tag, layout, planes_c):
    """DP=2: train K steps, save, go on MORE steps (references); a resume at DP=2 is byte-identical
    and continues bit-identically. DP=3 / DP=1: the load is byte-identical to the saved state
    (masters, optimizer state, primaries, dense and frozen parameters, steps, lr, extra) and MORE
    steps continue bit-identically to the uninterrupted DP=2 run."""
    d = os.path.join(root, tag)
    if world == SAVE_WORLD:
        return _save_reshard(root, rank, d, tag, layout, planes_c)
    _wait(root, tag)
    ref = torch.load(os.path.join(d, "ref.pt"), weights_only=False)
    m, o = make(layout, planes_c, seed=11 + world, bucket_size=_bucket_size(world))
    t0 = time.time()
    extra = load_checkpoint(os.path.join(d, "ckpt"), m, o, strict=True)
    dt = time.time() - t0
    compare(snapshot(m, o), ref["at"], f"DP={SAVE_WORLD} -> DP={world} load")
    assert extra["step"] == K and extra["data"] == [1, 2, {"x": None}]
    assert torch.equal(extra["pos"], torch.arange(5) * 3)
    train(m, o, range(K, K + MORE))
    compare(snapshot(m, o), ref["after"], f"DP={world} continued")
    return {"load_s": dt, "buckets": len(o.buckets)}


def _save_reshard(root, rank, d, tag, layout, planes_c):
    try:
        m, o = make(layout, planes_c, seed=0, bucket_size=_bucket_size(SAVE_WORLD))
        train(m, o, range(K))
        o.param_groups[0]["lr"] *= 0.5   # a scheduler's change: saved and restored
        t0 = time.time()
        save_checkpoint(os.path.join(d, "ckpt"), m, o, rng=True,
                        extra={"step": K, "data": [1, 2, {"x": None}], "pos": torch.arange(5) * 3})
        save_s = time.time() - t0
        at = snapshot(m, o)
        rng_after_save = torch.get_rng_state()
        train(m, o, range(K, K + MORE))
        after = snapshot(m, o)
        if rank == 0:
            torch.save({"at": at, "after": after}, os.path.join(d, "ref.pt"))
        # same DP: byte-identical load, RNG restored, bit-identical continuation
        m2, o2 = make(layout, planes_c, seed=5, bucket_size=_bucket_size(SAVE_WORLD))
        torch.manual_seed(1234)
        load_checkpoint(os.path.join(d, "ckpt"), m2, o2, rng=True)
        assert torch.equal(torch.get_rng_state(), rng_after_save), "RNG state not restored"
        compare(snapshot(m2, o2), at, "same-DP load")
        train(m2, o2, range(K, K + MORE))
        compare(snapshot(m2, o2), after, "same-DP continued")
        # a checkpoint whose primaries are not the writeback of its masters (one byte changed)
        with torch.no_grad():
            m2.b.weight._box.planes["row"].row_data.view(torch.uint8).view(-1)[7] ^= 1
        save_checkpoint(os.path.join(d, "badprim"), m2, o2)
        _barrier()
        _ready(root, tag)
        return {"save_s": save_s}
    except Exception:
        _failed(root, tag, rank)
        raise


def _global_batch(step, n=12, k=40):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(n, k, generator=g)


def _curve_step(net, o, step, world, rank):
    x = _global_batch(step)
    lo, hi = x.shape[0] * rank // world, x.shape[0] * (rank + 1) // world
    loss = net(x[lo:hi]).pow(2).sum() / x.shape[0]
    loss.backward()
    o.step()
    o.zero_grad()
    t = torch.tensor([float(loss.detach())], dtype=torch.float64)
    if _live() and dist.get_world_size() > 1:
        dist.all_reduce(t)
    return float(t)


def _curve_model(seed):
    torch.manual_seed(seed)
    net = MLP("padded")
    o = ShardedOptimizer(net, lambda g: torch.optim.AdamW(g, lr=LR_CURVE), bucket_size=700, grad_reduce="sum")
    return net, o


def case_curve(rank, world, root, tag="curve", steps=3, more=3):
    """A real forward/backward with a fixed global batch of 12 split over the ranks (sum of the
    per-rank losses): DP=2 trains, saves after `steps`, goes on `more` steps; a resume at DP=2 is
    bit-identical; resumes at DP=3 and DP=1 stay on the curve (differences reported)."""
    d = os.path.join(root, tag)
    if world == SAVE_WORLD:
        try:
            net, o = _curve_model(3)
            for s in range(steps):
                _curve_step(net, o, s, world, rank)
            save_checkpoint(os.path.join(d, "ckpt"), net, o)
            start = full_masters(o)
            ref, losses = [], []
            for s in range(steps, steps + more):
                losses.append(_curve_step(net, o, s, world, rank))
                ref.append(full_masters(o))
            if rank == 0:
                torch.save({"start": start, "ref": ref, "losses": losses}, os.path.join(d, "ref.pt"))
            net2, o2 = _curve_model(9)
            load_checkpoint(os.path.join(d, "ckpt"), net2, o2)
            for i, s in enumerate(range(steps, steps + more)):
                loss = _curve_step(net2, o2, s, world, rank)
                assert loss == losses[i], f"same-DP resume: loss {loss} vs {losses[i]} at step {s}"
                got = full_masters(o2)
                for k in got:
                    assert torch.equal(got[k].view(torch.int32), ref[i][k].view(torch.int32)), \
                        f"same-DP resume: master {k} differs at step {s}"
            _barrier()
            _ready(root, tag)
            return {"max_diff": [0.0] * more, "loss_diff": [0.0] * more}
        except Exception:
            _failed(root, tag, rank)
            raise
    _wait(root, tag)
    r = torch.load(os.path.join(d, "ref.pt"), weights_only=False)
    net, o = _curve_model(9)
    load_checkpoint(os.path.join(d, "ckpt"), net, o)
    got0 = full_masters(o)
    for k in got0:
        assert torch.equal(got0[k].view(torch.int32), r["start"][k].view(torch.int32)), f"load: master {k}"
    diffs, ldiffs, moved = [], [], 0.0
    for i, s in enumerate(range(steps, steps + more)):
        loss = _curve_step(net, o, s, world, rank)
        got = full_masters(o)
        diffs.append(max(float((got[k] - r["ref"][i][k]).abs().max()) for k in got))
        moved = max(moved, max(float((r["ref"][i][k] - r["start"][k]).abs().max()) for k in got))
        ldiffs.append(abs(loss - r["losses"][i]))
    # on the curve: the masters stay far closer to the DP=2 run than one step moves them
    assert max(diffs) <= 0.05 * LR_CURVE, f"DP={world} resume left the curve: max |d master| {diffs}"
    assert max(ldiffs) <= 1e-3 * abs(r["losses"][-1]) + 1e-6, f"DP={world} resume: loss differences {ldiffs}"
    return {"max_diff": diffs, "loss_diff": ldiffs, "moved": moved}


def _expect_reject(f, cls, words):
    try:
        f()
    except cls as e:
        msg = str(e)
        for w in words:
            assert w in msg, f"{w!r} not in the error: {msg}"
        return f"{type(e).__name__}: {msg}"
    except Exception as e:  # noqa: BLE001
        raise AssertionError(f"expected {cls.__name__}, got {type(e).__name__}: {e}") from e
    raise AssertionError(f"expected {cls.__name__}, nothing raised")


def _copy(src, dst):
    if _rank0():
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst)


def _storage(path, key):
    """(file, offset, length) of the first saved piece of `key`, from the DCP metadata."""
    import torch.distributed.checkpoint as dcp
    md = dcp.FileSystemReader(path).read_metadata()
    for idx, info in md.storage_data.items():
        if idx.fqn == key:
            return os.path.join(path, info.relative_path), info.offset, info.length
    raise KeyError(key)


def _flip_in_data(path, key):
    """Changes the lowest bit of one element of a saved piece of `key` (inside its raw bytes)."""
    import io
    fn, off, length = _storage(path, key)
    with open(fn, "rb") as f:
        f.seek(off)
        blob = bytearray(f.read(length))
    t = torch.load(io.BytesIO(bytes(blob)), weights_only=True)
    raw = _u8(t).numpy().tobytes()
    at = blob.find(raw)
    assert at >= 0
    with open(fn, "r+b") as f:
        f.seek(off + at + t.element_size() * (t.numel() // 2))
        b = f.read(1)
        f.seek(off + at + t.element_size() * (t.numel() // 2))
        f.write(bytes([b[0] ^ 1]))


def _drop_key(path, key):
    import torch.distributed.checkpoint as dcp
    md = dcp.FileSystemReader(path).read_metadata()
    del md.state_dict_metadata[key]
    for idx in [i for i in md.storage_data if i.fqn == key]:
        del md.storage_data[idx]
    with open(os.path.join(path, ".metadata"), "wb") as f:
        pickle.dump(md, f)


def case_reject(rank, world, root, tag, layout, planes_c):
    """At DP=3, from copies of the DP=2 checkpoint: a truncated data file, a flipped bit in a
    master piece, a key missing from the DCP metadata, no .metadata at all, a checkpoint whose
    primaries are not the writeback of its masters, another model shape, another layout and
    another inner optimizer are each rejected on EVERY rank with a clear error, nothing of the
    model or the optimizer modified; afterwards the good checkpoint still loads."""
    if world != 3:
        return {}
    _wait(root, tag)
    d = os.path.join(root, tag)
    good = os.path.join(d, "ckpt")
    w = os.path.join(root, f"{tag}-bad")   # rank 0 prepares each damaged copy, every rank loads it
    m, o = make(layout, planes_c, seed=21, bucket_size=_bucket_size(world))
    train(m, o, range(1))
    before = local_digest(m, o)
    out = {}

    def check(name, cls, words, prepare=None, model=None, **kw):
        if prepare is not None:
            _copy(good, w)
            if _rank0():
                prepare(w)
            _barrier()
        mm, oo = model if model is not None else (m, o)
        dig = local_digest(mm, oo)
        out[name] = _expect_reject(lambda: load_checkpoint(w if prepare is not None else good, mm, oo, **kw), cls,
                                   words)
        assert local_digest(mm, oo) == dig, f"{name}: the rejected load modified the model or the optimizer"
        _barrier()

    def truncate(p):
        files = sorted(f for f in os.listdir(p) if f.endswith(".distcp"))
        fn = os.path.join(p, files[-1])
        with open(fn, "r+b") as f:
            f.truncate(os.path.getsize(fn) // 2)
    check("truncated", CheckpointError, ["truncated or damaged"], truncate)
    check("flipped", CheckpointError, ["checksum mismatch"], lambda p: _flip_in_data(p, "master/c.weight"))
    # (the primaries are not saved any more: the writeback rebuilds them; a flipped bit in the inner
    # state's shards and in a replicated key instead)
    check("flipped_state", CheckpointError, ["checksum mismatch", "state/b.weight/exp_avg"],
          lambda p: _flip_in_data(p, "state/b.weight/exp_avg"))
    check("flipped_model", CheckpointError, ["checksum mismatch", "model/frozen"],
          lambda p: _flip_in_data(p, "model/frozen"))
    check("missing_key", CheckpointError, ["lacks", "state/c.weight/exp_avg"],
          lambda p: _drop_key(p, "state/c.weight/exp_avg"))
    check("no_metadata", CheckpointError, ["no .metadata"], lambda p: os.remove(os.path.join(p, ".metadata")))
    check("record", CheckpointError, ["record is damaged"], lambda p: _flip_in_data(p, "mxshard/meta"))
    out["badprim"] = _expect_reject(lambda: load_checkpoint(os.path.join(d, "badprim"), m, o),
                                    CheckpointMismatchError, ["primary/b.weight/row_data", "restored"])
    assert local_digest(m, o) == before, "a rejected primaries check did not restore the previous state"
    _barrier()
    check("shape", CheckpointMismatchError, ["b.weight", "(33, 65)", "(34, 65)"],
          model=make(layout, planes_c, seed=1, bucket_size=1800, b_rows=34))
    other = "compact" if layout != "compact" else "padded"
    check("layout", CheckpointMismatchError, [f"mxfp8:{layout}", f"mxfp8:{other}"],
          model=make(other, planes_c, seed=1, bucket_size=1800))
    check("inner", CheckpointMismatchError, ["inner optimizer", "AdamW", "SGD"],
          model=make(layout, planes_c, seed=1, bucket_size=1800, factory=FACTORIES["sgd"](False)))
    check("rng_other_dp", CheckpointError, ["RNG states are of 2 ranks"], rng=True)
    assert local_digest(m, o) == before
    # a save that fails on one rank (an extra value that is not JSON): that rank TypeError, the others
    # RemoteError, nothing written, nobody hangs
    never = os.path.join(root, f"{tag}-never")
    try:
        save_checkpoint(never, m, o, extra={"x": object()} if rank == 1 else None)
        raise AssertionError("save_checkpoint accepted an extra that is not JSON")
    except TypeError as e:
        assert rank == 1 and "extra['x']" in str(e), (rank, e)
        out["save_bad_extra"] = "local"
    except mxshard.RemoteError as e:
        assert rank != 1 and "rank 1" in str(e), (rank, e)
        out["save_bad_extra"] = "remote"
    assert not os.path.exists(os.path.join(never, ".metadata"))
    load_checkpoint(good, m, o)  # the group is fine afterwards
    return out


def case_export(rank, world, root, tag, layout, planes_c):
    """export_safetensors of a loaded model (DP=1): names, dtypes, shapes and bytes read back."""
    if world != 1:
        return {}
    try:
        from safetensors import safe_open
    except ImportError:
        return {"skipped": "safetensors is not installed"}
    import json
    _wait(root, tag)
    m, o = make(layout, planes_c, seed=2, bucket_size=_bucket_size(world))
    load_checkpoint(os.path.join(root, tag, "ckpt"), m, o)
    fn = os.path.join(root, f"{tag}.safetensors")
    export_safetensors(fn, m)
    # the file holds the bytes the forward multiplies by: every converted weight's replicated planes
    # (its GatheredWeight's), the rest of the state dict as it is
    sd = {k: v for k, v in m.state_dict().items() if k not in ("a.weight", "b.weight", "c.weight")}
    for mod in ("a", "b", "c"):
        planes = getattr(m, mod).weight._box.planes
        for leaf in ("row_data", "row_scale", "col_data", "col_scale"):
            t = getattr(planes.get("col" if leaf.startswith("col") else "row"), leaf, None)
            if t is not None and (getattr(m, mod).spec.planes == "both" or leaf.startswith("row")):
                sd[f"{mod}.{leaf}"] = t
    with safe_open(fn, framework="pt") as f:
        names = set(f.keys())
        meta = f.metadata()
        got = {k: f.get_tensor(k) for k in names}
    assert names == set(sd), (names ^ set(sd))
    mx = json.loads(meta["mxshard"])
    assert meta["format"] == "mxshard.safetensors/1" and set(mx) == {"a", "b", "c"}
    assert mx["b"] == {"shape": [33, 65], "planes": "both", "layout": layout, "rounding": "ceil", "block": 32,
                       "data": "F8_E4M3", "scale": "E8M0 as U8"}
    for k, t in got.items():
        mod, _, leaf = k.rpartition(".")
        want = torch.float8_e4m3fn if leaf in ("row_data", "col_data") else \
            torch.uint8 if leaf in ("row_scale", "col_scale") else sd[k].dtype
        assert t.dtype == want and t.numel() == sd[k].numel(), (k, t.dtype, want, t.shape)
        assert torch.equal(_u8(t), _u8(sd[k])), k
    assert got["h"].dtype == torch.bfloat16 and got["ln.weight"].dtype == torch.float32
    assert ("c.col_data" in got) == (planes_c == "both")
    return {"tensors": len(got)}


EVERY_T = 0.5    # seconds: the rendezvous timeout of the calls one rank does not make


def _alone(call, ranks, rank, world, where):
    """`call` made by `ranks` only (the torch.save habit): each of them raises CheckpointError, saying "every
    rank" and naming the others, within EVERY_T (+ a margin for a loaded machine). Returns its seconds."""
    out = None
    if rank in ranks:
        t0 = time.time()
        msg = _expect_reject(call, CheckpointError, [f"{where} must be called on every rank", f"rank(s) {ranks} of "
                             f"{world} called it", f"rank(s) {[r for r in range(world) if r not in ranks]} did not"])
        out = time.time() - t0
        assert EVERY_T * 0.9 <= out < EVERY_T + 10, f"{where}: raised after {out:.1f} s, timeout {EVERY_T} s"
        assert "if rank == 0" in msg and "timeout=" in msg, msg
    _barrier()
    return out


def case_every_rank(rank, world, root, worlds):
    """save_checkpoint on rank 0 only raises there within the timeout and writes nothing; then every rank saves;
    load_checkpoint on rank 0 only (and at DP=3 on ranks 0 and 1) raises there, the model untouched; then every
    rank loads (a fresh generation: the store's keys of the failed calls are not in the way); a timeout that
    is bad on one rank only is that rank's ValueError and a RemoteError elsewhere, never a hang."""
    if world not in worlds:
        return {}
    d = os.path.join(root, f"every-{world}")
    m, o = make("padded", "row", seed=4, bucket_size=_bucket_size(world))
    train(m, o, range(1))
    out = {"save_alone": _alone(lambda: save_checkpoint(d, m, o, timeout=EVERY_T), [0], rank, world,
                                "save_checkpoint")}
    assert not os.path.exists(os.path.join(d, ".metadata"))
    save_checkpoint(d, m, o)
    before = local_digest(m, o)
    out["load_alone"] = _alone(lambda: load_checkpoint(d, m, o, timeout=EVERY_T), [0], rank, world,
                               "load_checkpoint")
    if world == 3:
        out["load_two"] = _alone(lambda: load_checkpoint(d, m, o, timeout=EVERY_T), [0, 1], rank, world,
                                 "load_checkpoint")
    assert local_digest(m, o) == before
    try:
        load_checkpoint(d, m, o, timeout=-1 if rank == 1 else 30)
        raise AssertionError("load_checkpoint took timeout=-1")
    except ValueError as e:
        assert rank == 1 and "timeout must be a number of seconds > 0" in str(e), (rank, e)
    except mxshard.RemoteError as e:
        assert rank != 1 and "rank 1" in str(e), (rank, e)
    train(m, o, range(1, 2))
    load_checkpoint(d, m, o)
    assert local_digest(m, o) == before
    return out


CASES = {"reshard": case_reshard, "curve": case_curve, "reject": case_reject, "export": case_export,
         "every_rank": case_every_rank}


def plan(root):
    return [
        # DP=3 while it waits for the DP=2 group's files; DP=2 when it has written them (last)
        ("every_rank_3", "every_rank", {"root": root, "worlds": (3,)}),
        ("reshard_padded_both", "reshard", {"root": root, "tag": "padded", "layout": "padded", "planes_c": "both"}),
        ("reshard_swizzled_row", "reshard", {"root": root, "tag": "swizzled", "layout": "swizzled",
                                             "planes_c": "row"}),
        ("curve", "curve", {"root": root}),
        ("reject", "reject", {"root": root, "tag": "padded", "layout": "padded", "planes_c": "both"}),
        ("export", "export", {"root": root, "tag": "swizzled", "layout": "swizzled", "planes_c": "row"}),
        ("every_rank_2", "every_rank", {"root": root, "worlds": (2,)}),
    ]


def worker(rank, world, port, q, plan_):
    H.run_rank(rank, world, port, q, plan_, CASES, gloo_timeout=30, timed=True)

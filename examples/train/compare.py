# SPDX-License-Identifier: MIT
"""Compare training runs: two checkpoints tensor by tensor (their bytes), two
exported safetensors files byte by byte, two loss logs step by step; and,
inside a run, the weights against the gathered masters.

    python compare.py ckpt DIR_A DIR_B            (torch.distributed.checkpoint directories)
    python compare.py file A.safetensors B.safetensors
    python compare.py losses A.json B.json [--from STEP]
"""
from __future__ import annotations

import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def compare_ckpts(pa, pb):
    """Per entry: tensors by their bytes, other values by equality."""
    import torch
    from ckpt import read_dcp
    ta, tb = read_dcp(pa), read_dcp(pb)
    names = sorted(set(ta) | set(tb))
    diff, other, missing, nbytes, ntens = [], [], [], 0, 0
    maxabs = {}
    for k in names:
        if k not in ta or k not in tb:
            missing.append(k)
            continue
        a, b = ta[k], tb[k]
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            ntens += 1
            x = a.detach().contiguous().reshape(-1).view(torch.uint8)
            y = b.detach().contiguous().reshape(-1).view(torch.uint8)
            nbytes += x.numel()
            if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(x, y):
                diff.append(k)
                if a.dtype == torch.float32 and a.shape == b.shape:
                    maxabs[k] = float((a - b).abs().max())
        elif not _same(a, b):
            other.append(k)
    return {"entries": len(names), "tensors": ntens, "bytes": nbytes, "differing": diff[:20],
            "n_differing": len(diff), "other_differing": other[:20], "missing": missing[:20],
            "max_abs_diff_f32": dict(list(maxabs.items())[:20]),
            "identical": not diff and not missing and not other and ntens > 0}


def _same(a, b):
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - values without a plain ==
        return repr(a) == repr(b)


def _safetensors(path):
    """(header dict, data bytes) of a safetensors file."""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), raw[8 + n:], raw


def compare_files(pa, pb):
    """Two exported safetensors files: the parsed headers (tensor names, dtypes,
    shapes, offsets, metadata) and the data bytes must be equal; whether the
    whole files are byte-identical is reported too (the safetensors writer
    serializes the metadata map in hash order, so its header bytes may differ
    between processes for the same content)."""
    ha, da, ra = _safetensors(pa)
    hb, db, rb = _safetensors(pb)
    n = next((i for i, (x, y) in enumerate(zip(da, db)) if x != y), None)
    meta_a, meta_b = ha.get("__metadata__", {}), hb.get("__metadata__", {})
    meta_same = {k: (json.loads(v) if k == "mxshard" else v) for k, v in meta_a.items()} == \
        {k: (json.loads(v) if k == "mxshard" else v) for k, v in meta_b.items()}
    tensors_a = {k: v for k, v in ha.items() if k != "__metadata__"}
    tensors_b = {k: v for k, v in hb.items() if k != "__metadata__"}
    return {"tensors": len(tensors_a), "data_bytes": len(da), "first_data_difference": n,
            "header_same": tensors_a == tensors_b and meta_same, "file_bytes_identical": ra == rb,
            "identical": tensors_a == tensors_b and meta_same and da == db and len(da) > 0}


def compare_losses(ja, jb, from_step=0):
    """Losses at common steps >= from_step: bitwise equality and differences."""
    la = {s: (v, h) for s, v, h in json.load(open(ja))["losses"]}
    lb = {s: (v, h) for s, v, h in json.load(open(jb))["losses"]}
    common = sorted(s for s in set(la) & set(lb) if s >= from_step)
    if not common:
        return {"steps": 0}
    d = [lb[s][0] - la[s][0] for s in common]
    rel = [abs(x) / abs(la[s][0]) for x, s in zip(d, common)]
    same = sum(1 for s in common if la[s][1] == lb[s][1])
    last = common[-1]
    return {"steps": len(common), "first": common[0], "last": last, "bitwise_equal_steps": same,
            "bitwise_identical": same == len(common), "max_abs_diff": max(abs(x) for x in d),
            "mean_abs_diff": sum(abs(x) for x in d) / len(d), "max_rel_diff": max(rel),
            "mean_signed_diff": sum(d) / len(d), "final_a": la[last][0], "final_b": lb[last][0],
            "final_rel_diff": (lb[last][0] - la[last][0]) / la[last][0]}


def _gather(t, world):
    import torch
    import torch.distributed as dist
    if world == 1:
        return t
    gloo = "gloo" in str(dist.get_backend())
    x = t.cpu() if gloo else t
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x)
    return torch.cat(parts).to(t.device)


def verify_weights(model, opt, round_through="none"):
    """Collective. The library's invariant, checked from outside: every MXFP8
    primary (data and scales of each plane the forward uses: the converted
    linear's replicated GatheredWeight planes) equals mxshard.quantize of the
    whole gathered FP32 master (rounded through bf16 first when round-through is
    on), and every dense parameter equals its master cast to its dtype. Uses
    opt.state_dict() (each master a DTensor Shard(0), or the whole tensor at a
    world of one), opt.items and the modules."""
    import torch
    import mxshard
    masters = opt.state_dict()["masters"]
    params = dict(model.named_parameters())
    planes = bad = dense = dense_bad = 0
    err2 = ref2 = 0.0
    for it in opt.items:
        t = masters[it.name]
        local = t.to_local() if hasattr(t, "to_local") else t
        if opt.world > 1:   # Shard(0): every rank's rows, padded to the first rank's count
            rows = -(-(int(it.shape[0]) if it.shape else 1) // opt.world)
            pad = local.new_zeros((rows,) + tuple(local.shape[1:]))
            pad[:local.shape[0]] = local
            local = _gather(pad.contiguous(), opt.world)
        src = local[:int(it.shape[0]) if it.shape else 1].reshape(it.shape)
        if it.kind == "dense":
            p = params[it.name].detach()
            dense += 1
            dense_bad += int((p.contiguous().view(torch.uint8).reshape(-1) !=
                              src.to(p.dtype).contiguous().view(torch.uint8).reshape(-1)).sum())
            continue
        m = model.get_submodule(it.name[:-len(".weight")])
        spec = m.spec
        box = m.weight._box.planes
        q_src = src.to(torch.bfloat16) if round_through == "bf16" else src
        ref = mxshard.MXFP8Weight.empty(*it.shape, planes=spec.planes, layout=spec.layout, device=src.device)
        mxshard.quantize(ref, q_src.contiguous(), rounding=spec.rounding)
        for pn in ("row_data", "row_scale", "col_data", "col_scale"):
            x = getattr(box["col" if pn.startswith("col") else "row"], pn, None) if spec.planes == "both" or \
                pn.startswith("row") else None
            y = getattr(ref, pn)
            if x is None:
                continue
            planes += 1
            bad += int((x.reshape(-1).view(torch.uint8) != y.reshape(-1).view(torch.uint8)).sum())
        q = box["row"].dequantize(plane="row", dtype="f32")
        err2 += float(((q - src) ** 2).sum())
        ref2 += float((src ** 2).sum())
    return {"planes": planes, "mismatched_bytes": bad, "dense_params": dense, "dense_mismatched_bytes": dense_bad,
            "identical": bad == 0 and dense_bad == 0 and planes + dense > 0,
            "weight_rel_rms_err": (err2 / ref2) ** 0.5 if ref2 > 0 else None}


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "ckpt":
        print(json.dumps(compare_ckpts(sys.argv[2], sys.argv[3]), indent=1))
    elif what == "file":
        print(json.dumps(compare_files(sys.argv[2], sys.argv[3]), indent=1))
    else:
        fs = int(sys.argv[5]) if len(sys.argv) > 5 and sys.argv[4] == "--from" else 0
        print(json.dumps(compare_losses(sys.argv[2], sys.argv[3], fs), indent=1))

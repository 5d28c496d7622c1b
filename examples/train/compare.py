# SPDX-License-Identifier: MIT
"""Compare two training runs: checkpoints byte by byte, loss logs step by step.

    python compare.py ckpt A.safetensors B.safetensors
    python compare.py losses A.json B.json [--from STEP]
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def compare_ckpts(pa, pb):
    """Per tensor: equal bytes? Returns a summary dict."""
    import torch
    import ckpt
    ta, ma = ckpt.load(pa)
    tb, mb = ckpt.load(pb)
    names = sorted(set(ta) | set(tb))
    diff, missing, nbytes = [], [], 0
    maxabs = {}
    for k in names:
        if k not in ta or k not in tb:
            missing.append(k)
            continue
        a = ta[k].contiguous().view(torch.uint8).reshape(-1)
        b = tb[k].contiguous().view(torch.uint8).reshape(-1)
        nbytes += a.numel()
        if a.numel() != b.numel() or not torch.equal(a, b):
            diff.append(k)
            if ta[k].dtype == torch.float32 and ta[k].shape == tb[k].shape:
                maxabs[k] = float((ta[k] - tb[k]).abs().max())
    return {"tensors": len(names), "bytes": nbytes, "differing": diff[:20], "n_differing": len(diff),
            "missing": missing, "max_abs_diff_f32": maxabs, "step_a": ma.get("step"), "step_b": mb.get("step"),
            "identical": not diff and not missing}


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


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "ckpt":
        print(json.dumps(compare_ckpts(sys.argv[2], sys.argv[3]), indent=1))
    else:
        fs = int(sys.argv[5]) if len(sys.argv) > 5 and sys.argv[4] == "--from" else 0
        print(json.dumps(compare_losses(sys.argv[2], sys.argv[3], fs), indent=1))

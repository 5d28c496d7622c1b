# SPDX-License-Identifier: MIT
"""Issue 35 item 4: the exposed communication and the step time of FSDP2 (BF16 and mxshard
variants) at DP 8, 64 and 512 over 400 Gb/s and 900 GB/s links, projected from the all-gather /
reduce-scatter bytes of one step, measured on gloo ranks on the CPU, and the compute time of the
GPU step (bench/fsdp_bench.py step --json, a world of one).

    python bench/fsdp_project.py --model llama --step-json step-llama.json          # measures the bytes
    python bench/fsdp_project.py --model llama --bytes-json bytes.json --compute-ms 120
    python bench/fsdp_project.py --model llama --measure-world 2 --save-bytes bytes.json --no-project

BYTES. Each variant's model (the dims given; --measure-blocks blocks, default 2: every block is
alike) runs two steps on `--measure-world` gloo ranks (fully_shard per block and root, bf16
param_dtype, fp32 reduce_dtype, SGD); the second step's calls of all_gather_into_tensor,
reduce_scatter_tensor and all_reduce are recorded per call (this rank's input bytes) and assigned to
the FSDP units in issue order (forward: root, block 0..; backward: blocks in reverse; the
reduce-scatters likewise, the root's last). The same bytes are computed per parameter from the
layout rules of docs/fsdp.md "What moves on the wire" (dense: 2 bytes per element of a
ceil(R/N)-row shard; row-only MXFP8 S*C + S*ceil(C/32), NVFP4 S*C/2 + S*ceil(C/16); "both" the
larger scale window; an unevenly sharded weight S*C; gradients 4 bytes per element of the padded
unsharded tensor); the table "measured vs rules" at the measured world checks them, and the
projection at DP N uses the rules at N.

MODEL (stated in the output):
* ring collectives, bandwidth only: at DP N an all-gather whose per-rank input is g bytes sends and
  receives (N-1)*g bytes per rank ((N-1)/N of the unsharded bytes); a reduce-scatter of an
  unsharded fp32 gradient of G bytes (N-1)/N*G; an all-reduce of A bytes 2(N-1)/N*A; time = bytes /
  (link * efficiency) (--eff, default 0.8) + (N-1) * --hop-us per collective (default 0);
  links: 400 Gb/s = 50 GB/s and 900 GB/s, each the per-rank bandwidth in one direction;
* compute per rank does not change with N (the per-rank batch is fixed): the measured step time
  (--compute: each variant's own GPU step, or BF16's for all) split 1/3 forward, 2/3 backward
  (the optimizer and clipping inside those shares), over the units in proportion to their GEMM
  work (linear weights' elements, plus seq*d per block for causal attention in llama);
* one link, first come first served; FSDP2's prefetch of one unit: the all-gather of unit i+1
  starts once unit i's has ended and unit i's compute has started; in backward the all-gather of
  block i-1 is issued when block i's backward starts and block i's reduce-scatter when it ends;
  the root (embedding, final norm, head) is gathered before the first block and kept for backward;
  its reduce-scatter comes after the whole backward; mxshard's refresh all-reduce (if any) precedes
  the first all-gather. The step ends when the compute and the link are both done;
* exposed = projected step - compute.
"""
import argparse
import fnmatch
import json
import math
import os
import socket
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import fsdp_models as models  # noqa: E402

VARIANTS = ("fsdp-bf16", "fsdp-mx-row", "fsdp-nv-row", "fsdp-mx-both")
LINKS = (("400 Gb/s", 50e9), ("900 GB/s", 900e9))


# ---------------------------------------------------------------- the bytes by the rules

def _units(args):
    """[(name, [(qualname, shape)], gemm_weight)]: root first, then the blocks."""
    m = models.make_meta(args)
    root = [(n, tuple(p.shape)) for n, p in m.named_parameters() if not n.startswith("blocks.")]
    out = [("root", root, sum(x.weight.numel() for n, x in m.named_modules()
                              if isinstance(x, nn.Linear) and not n.startswith("blocks.")))]
    attn = args.seq * args.hidden if args.model == "llama" else 0
    for i, b in enumerate(m.blocks):
        ps = [(f"blocks.{i}.{n}", tuple(p.shape)) for n, p in b.named_parameters()]
        out.append((f"block {i}", ps, models.matmul_params(b) + attn))
    return out


def _kind(variant, args, qual):
    """'dense' or (format, planes) of a parameter under a variant (convert's first-match rule)."""
    pol, fmt = models.policy(args.model, variant)
    if pol is None or not qual.endswith(".weight"):
        return "dense"
    mod = qual[: -len(".weight")]
    for pat, val in pol.items():
        if fnmatch.fnmatch(mod, pat):
            return (fmt, val)
    return "dense"


def _window(r, n, h):
    """The most h-row blocks the rows of one rank touch (rows sharded as torch.chunk)."""
    s = math.ceil(r / n)
    t = 0
    for k in range(n):
        lo, hi = k * s, min(r, (k + 1) * s)
        if hi > lo:
            t = max(t, (hi - 1) // h - lo // h + 1)
    return t


def gather_bytes(kind, shape, n):
    """Bytes this rank puts into the all-gather of one parameter at DP n (docs/fsdp.md)."""
    r, c = shape[0], (shape[1] if len(shape) > 1 else 1)
    s = math.ceil(r / n)
    if kind == "dense":
        return 2 * s * c
    fmt, planes = kind
    if r % n:
        return s * c
    if fmt == "mxfp8":
        rows = s * math.ceil(c / 32)
        return s * c + (max(rows, _window(r, n, 32) * c) if planes == "both" else rows)
    rows = s * math.ceil(c / 16)
    return s * c // 2 + (max(rows, _window(r, n, 16) * c) if planes == "both" else rows)


def grad_bytes(shape, n):
    """Bytes of the unsharded fp32 gradient a reduce-scatter reduces (padded to n shards)."""
    r, c = shape[0], (shape[1] if len(shape) > 1 else 1)
    return 4 * math.ceil(r / n) * n * c


def rule_bytes(variant, args, n):
    """Per unit: (gather bytes of this rank, gradient bytes) at DP n."""
    return [(name, sum(gather_bytes(_kind(variant, args, q), sh, n) for q, sh in ps),
             sum(grad_bytes(sh, n) for _, sh in ps)) for name, ps, _ in _units(args)]


# ---------------------------------------------------------------- the bytes measured on gloo ranks

def _record():
    import torch.distributed as dist
    calls = []
    orig = {k: getattr(dist, k) for k in ("all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce",
                                          "all_gather")}

    def nb(t):
        return t.numel() * t.element_size()

    def wrap(name, tag, pos, kw):
        def g(*a, **k):
            t = k[kw] if kw in k else a[pos]
            calls.append((tag, nb(t)))
            return orig[name](*a, **k)
        return g
    ag = wrap("all_gather_into_tensor", "ag", 1, "input_tensor")
    rs = wrap("reduce_scatter_tensor", "rs", 1, "input")
    ar = wrap("all_reduce", "ar", 0, "tensor")
    agl = wrap("all_gather", "agl", 1, "tensor")
    dist.all_gather_into_tensor, dist.reduce_scatter_tensor, dist.all_reduce, dist.all_gather = ag, rs, ar, agl

    def restore():
        for k, f in orig.items():
            setattr(dist, k, f)
    return calls, restore


def _measure_rank(rank, world, port, args, q):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    import torch.distributed as dist
    import torch.nn.functional as F
    dist.init_process_group("gloo", rank=rank, world_size=world)
    import fsdp_bench
    res = {}
    try:
        for v in args.variants:
            a = argparse.Namespace(**vars(args))
            a.blocks, a.compile = args.measure_blocks, False
            m, _ = fsdp_bench.build(v, a, torch.device("cpu"))
            opt = torch.optim.SGD(m.parameters(), lr=1e-4)
            tok = torch.randint(0, args.vocab, (1, args.measure_seq), generator=torch.Generator().manual_seed(rank))
            for step in range(2):
                if step == 1:
                    calls, restore = _record()
                loss = F.cross_entropy(m(tok).float().reshape(-1, args.vocab), tok.reshape(-1))
                if step == 1:
                    calls.append(("bwd", 0))
                loss.backward()
                opt.step()
                opt.zero_grad()
            restore()
            res[v] = calls
            del m, opt
            print(f"fsdp_project: measured {v} at world {world}", file=sys.stderr, flush=True)
        q.put((rank, res))
    except BaseException as e:
        q.put((rank, {"error": f"{type(e).__name__}: {e}"}))
        raise
    finally:
        dist.destroy_process_group()


def measure(args):
    import torch.multiprocessing as mp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_measure_rank, args=(r, args.measure_world, port, args, q))
             for r in range(args.measure_world)]
    for p in procs:
        p.start()
    got = dict(q.get(timeout=3600) for _ in procs)
    bad = [f"rank {r}: {g['error']}" for r, g in got.items() if "error" in g]
    if bad:
        for p in procs:
            p.join(timeout=30)
        sys.exit("fsdp_project: measuring failed: " + "; ".join(bad))
    for p in procs:
        p.join()
    return {"world": args.measure_world, "blocks": args.measure_blocks, "calls": got[0],
            "calls_max_rank": {v: max(sum(b for k, b in got[r][v] if k == "ag") for r in got) for v in got[0]}}


def assign(calls, nblocks):
    """Recorded calls of one step -> per unit {ag_fwd, ag_bwd, rs} plus the all-reduce bytes."""
    units = {"root": {"ag_fwd": 0, "ag_bwd": 0, "rs": 0}}
    for i in range(nblocks):
        units[f"block {i}"] = {"ag_fwd": 0, "ag_bwd": 0, "rs": 0}
    fwd_order = ["root"] + [f"block {i}" for i in range(nblocks)]
    bwd_order = [f"block {i}" for i in reversed(range(nblocks))]
    rs_order = bwd_order + ["root"]
    phase, nf, nb, nr, ar, extra = "fwd", 0, 0, 0, 0, []
    for k, b in calls:
        if k == "bwd":
            phase = "bwd"
        elif k == "ag" and phase == "fwd" and nf < len(fwd_order):
            units[fwd_order[nf]]["ag_fwd"] += b
            nf += 1
        elif k == "ag" and phase == "bwd" and nb < len(bwd_order):
            units[bwd_order[nb]]["ag_bwd"] += b
            nb += 1
        elif k == "rs" and nr < len(rs_order):
            units[rs_order[nr]]["rs"] += b
            nr += 1
        elif k == "ar":
            ar += b
        else:
            extra.append((k, b))
    return units, ar, extra


# ---------------------------------------------------------------- the projection

def simulate(ag_f, ag_b, rs, comp_f, comp_b, ar, root_fwd_ms, head_f, head_b):
    """Times in ms. ag_f/ag_b/rs/comp_*: per block (forward order); root gathered first (root_fwd_ms),
    the head's compute after the last block (head_f) and first in backward (head_b). Returns
    (step end, total compute, total link time)."""
    nb = len(comp_f)
    link = ar + root_fwd_ms  # refresh all-reduce, then the root's gather
    t = link                  # the embedding needs the root
    ag_end = [0.0] * nb
    if nb:
        ag_end[0] = link + ag_f[0]
        link = ag_end[0]
    for i in range(nb):
        start = max(t, ag_end[i])
        if i + 1 < nb:  # prefetch one unit ahead
            s = max(link, start)
            ag_end[i + 1] = s + ag_f[i + 1]
            link = ag_end[i + 1]
        t = start + comp_f[i]
    t += head_f
    # backward: head first (root kept), blocks in reverse, root's reduce-scatter last
    bend = [0.0] * nb
    if nb:
        s = max(link, t)
        bend[nb - 1] = s + ag_b[nb - 1]
        link = bend[nb - 1]
    t += head_b
    for i in reversed(range(nb)):
        start = max(t, bend[i])
        if i > 0:
            s = max(link, start)
            bend[i - 1] = s + ag_b[i - 1]
            link = bend[i - 1]
        t = start + comp_b[i]
        link = max(link, t) + rs[i]
    return t, link


def project(args, bytes_by_variant, compute, out):
    units = _units(args)
    blocks = [u for u in units if u[0] != "root"]
    wsum = sum(w for _, _, w in units)
    rows = []
    for basis, comp_of in compute:
        out.append(f"\n### Projection, compute = {basis}\n")
        out.append("| variant | DP | link | all-gather ms | reduce-scatter ms | all-reduce ms | comm ms | compute ms "
                   "| exposed ms | projected step ms | x BF16 |")
        out.append("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for n in args.dps:
            for lname, bw in LINKS:
                bwe = bw * args.eff / 1e3  # bytes per ms
                hop = (n - 1) * args.hop_us / 1e3
                base = None
                for v in args.variants:
                    if v not in bytes_by_variant or comp_of(v) is None:
                        continue
                    T = comp_of(v)
                    rb = {name: (g, gr) for name, g, gr in rule_bytes(v, args, n)}
                    ar_b = bytes_by_variant[v]["all_reduce"]
                    agt = lambda g: (n - 1) * g / bwe + hop  # noqa: E731
                    rst = lambda gr: (n - 1) / n * gr / bwe + hop  # noqa: E731
                    ag_blk = [agt(rb[b[0]][0]) for b in blocks]
                    rs_blk = [rst(rb[b[0]][1]) for b in blocks]
                    cf = [T / 3 * w / wsum for _, _, w in blocks]
                    cb = [2 * T / 3 * w / wsum for _, _, w in blocks]
                    head_w = units[0][2] / wsum
                    ar_ms = (2 * (n - 1) / n * ar_b / bwe + hop) if ar_b else 0.0
                    root_ag = agt(rb["root"][0])
                    root_rs = rst(rb["root"][1])
                    t, link = simulate(ag_blk, ag_blk, rs_blk, cf, cb, ar_ms, root_ag, T / 3 * head_w, 2 * T / 3 * head_w)
                    link = max(link, t) + root_rs
                    step = max(t, link)
                    ag_ms = root_ag + 2 * sum(ag_blk)
                    rs_ms = root_rs + sum(rs_blk)
                    comm = ag_ms + rs_ms + ar_ms
                    if v == "fsdp-bf16":
                        base = step
                    ratio = f"{step / base:.3f}" if base else "-"
                    out.append(f"| {v} | {n} | {lname} | {ag_ms:.1f} | {rs_ms:.1f} | {ar_ms:.2f} | {comm:.1f} | {T:.1f} | "
                               f"{step - T:.1f} | {step:.1f} | {ratio} |")
                    rows.append({"basis": basis, "variant": v, "dp": n, "link": lname, "ag_ms": ag_ms, "rs_ms": rs_ms,
                                 "ar_ms": ar_ms, "comm_ms": comm, "compute_ms": T, "exposed_ms": step - T,
                                 "step_ms": step, "ratio_to_bf16": step / base if base else None})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=["mlp", "llama"], default="llama")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--ffn", type=int, default=None, help="default 5632 (llama), 8192 (mlp)")
    ap.add_argument("--blocks", type=int, default=None, help="default 16 (llama), 24 (mlp)")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--fuse-gate-up", action="store_true")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--dps", default="8,64,512")
    ap.add_argument("--eff", type=float, default=0.8, help="link efficiency")
    ap.add_argument("--hop-us", type=float, default=0.0, help="latency per ring step, us")
    ap.add_argument("--step-json", default=None, help="bench/fsdp_bench.py step --json output (compute times)")
    ap.add_argument("--compute-ms", type=float, default=None, help="compute ms per step for every variant")
    ap.add_argument("--bytes-json", default=None, help="bytes measured earlier (--save-bytes)")
    ap.add_argument("--save-bytes", default=None)
    ap.add_argument("--measure-world", type=int, default=2)
    ap.add_argument("--measure-blocks", type=int, default=2)
    ap.add_argument("--measure-seq", type=int, default=16)
    ap.add_argument("--no-measure", action="store_true", help="the bytes by the rules only")
    ap.add_argument("--no-project", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    llama = args.model == "llama"
    args.ffn = args.ffn or (5632 if llama else 8192)
    args.blocks = args.blocks or (16 if llama else 24)
    args.variants = [v for v in args.variants.split(",") if v]
    args.dps = [int(x) for x in args.dps.split(",")]
    out = [f"## FSDP2 communication projection: {models.describe(args)}, {args.batch}x{args.seq} tokens per rank",
           "", "Model: " + " ".join(__doc__.split("MODEL (stated in the output):")[1].split()), "",
           f"link efficiency {args.eff}, {args.hop_us} us per ring step"]
    meas = None
    if args.bytes_json:
        with open(args.bytes_json) as f:
            meas = json.load(f)
    elif not args.no_measure:
        meas = measure(args)
        if args.save_bytes:
            with open(args.save_bytes, "w") as f:
                json.dump(meas, f, indent=1)
    by_variant = {}
    if meas:
        w = meas["world"]
        out += ["", f"### Bytes per rank of one step, measured on {w} gloo ranks ({meas['blocks']} blocks) "
                f"vs the rules at N = {w}", "",
                "| variant | unit | all-gather fwd (measured) | all-gather bwd (measured) | rule | reduce-scatter "
                "(measured) | rule | all-reduce B | other calls |", "|---|---|---:|---:|---:|---:|---:|---:|---|"]
        a2 = argparse.Namespace(**vars(args))
        a2.blocks = meas["blocks"]
        checks = []
        for v in args.variants:
            if v not in meas["calls"]:
                continue
            units, ar, extra = assign(meas["calls"][v], meas["blocks"])
            rb = {name: (g, gr) for name, g, gr in rule_bytes(v, a2, w)}
            for name, u in units.items():
                out.append(f"| {v} | {name} | {u['ag_fwd']} | {u['ag_bwd']} | {rb[name][0]} | {u['rs']} | "
                           f"{rb[name][1]} | {ar if name == 'root' else ''} | {extra if name == 'root' else ''} |")
            by_variant[v] = {"all_reduce": ar, "units": units}
            same = all(u["ag_fwd"] == rb[nm][0] and u["rs"] == rb[nm][1] and u["ag_bwd"] in (0, rb[nm][0])
                       for nm, u in units.items())
            checks.append(f"{v}: {'the rules give the measured bytes' if same else 'MEASURED != RULES'}")
        out += [""] + checks
    else:
        by_variant = {v: {"all_reduce": 0} for v in args.variants}
    out.append("")
    out.append("| variant | all-gather bytes per rank per step at DP 8 (rules, whole model, fwd + bwd) | x BF16 |")
    out.append("|---|---:|---:|")
    bf = None
    for v in args.variants:
        rb = rule_bytes(v, args, 8)
        tot = rb[0][1] + 2 * sum(g for name, g, _ in rb[1:])
        bf = bf or tot
        out.append(f"| {v} | {tot:,} | {tot / bf:.3f} |")
    rows = []
    if not args.no_project:
        compute = []
        if args.compute_ms is not None:
            compute.append((f"{args.compute_ms} ms for every variant (given)", lambda v: args.compute_ms))
        if args.step_json:
            with open(args.step_json) as f:
                sj = json.load(f)
            med = {r["variant"]: r["step_ms_median"] for r in sj["rows"] if not r.get("compile")}
            src = f"{args.step_json}: {sj['meta'].get('device')}, {sj['meta'].get('model')}"
            if "fsdp-bf16" in med:
                compute.append((f"BF16's GPU step ({med['fsdp-bf16']:.1f} ms) for every variant, {src}",
                                lambda v: med["fsdp-bf16"]))
            compute.append((f"each variant's own GPU step (median), {src}", lambda v: med.get(v)))
        if not compute:
            sys.exit("fsdp_project: give --step-json or --compute-ms for the projection (or --no-project)")
        rows = project(args, by_variant, compute, out)
    text = "\n".join(out)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": {k: v for k, v in vars(args).items()}, "measured": meas, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

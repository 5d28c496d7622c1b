# SPDX-License-Identifier: MIT
"""One quantized linear against nn.Linear on one GPU: fwd+bwd time and transient memory (issue 25).

    python bench/torch_layer.py                      # the per-layer table, markdown to stdout
    python bench/torch_layer.py --parts table,legacy,profile,sweep,models --out layer.md

Parts:
  table    fwd+bwd of one layer, bf16 activations (bias=False, as the example's models),
           median of --iters runs after warm-up, each timed with CUDA events around
           `y = layer(x); y.backward(gy)`; x.grad is dropped between runs (every run
           allocates it). Variants: bf16 nn.Linear; bf16 nn.Linear whose bf16 wgrad is
           added into an fp32 main_grad by a post-accumulate-grad hook (what a dense weight
           pays under ShardedOptimizer: `gview.add_(p.grad)`, then p.grad = None); MXFP8Linear
           and NVFP4Linear (1x16), planes row and both, padded scales. Transient peak:
           torch.cuda.max_memory_allocated during one fwd+bwd minus what was allocated
           before it (module, x, gy, main_grad / .grad: resident).
  legacy   the same quantized rows with the GEMMs as before issue 25 (the library's
           dequantize of the whole plane + torch matmul; wgrad as a bf16 product added to
           main_grad): the "before" columns.
  profile  torch.profiler on the GPU, 4096x4096 at 2048 tokens: the top kernels of each
           variant (µs per fwd+bwd) and the host time per fwd+bwd.
  sweep    the GEMMs alone against tokens, per path (fused / chunked / dequant) and
           CHUNK_BYTES: what the measured rule in mxshard/torch/_gemm.py rests on.
  models   examples/train's parity model ("small") fwd+bwd and the ~1B model's step
           (ShardedOptimizer), bf16 vs MXFP8 (before / after).
"""
import argparse
import contextlib
import os
import statistics
import sys
import time

import torch
import torch.nn as nn

import mxshard.torch as mxt
from mxshard.torch import _gemm

SHAPES = [((4096, 4096), (2048, 8192)), ((14336, 4096), (2048, 16384)), ((8192, 8192), (2048, 16384))]
QUANT = [("MXFP8 row", "mxfp8", "row"), ("MXFP8 both", "mxfp8", "both"),
         ("NVFP4 row", "nvfp4", "row"), ("NVFP4 both", "nvfp4", "both")]


# ---- the "before" GEMMs (python/mxshard/torch/_gemm.py before issue 25) ---------------------

def _legacy_wgrad(gy2, x2, acc=None, dtype=None):
    g = torch.matmul(gy2.t(), x2)
    if acc is not None:
        acc.add_(g)
        return acc
    return g if dtype is None or g.dtype == dtype else g.to(dtype)


@contextlib.contextmanager
def legacy():
    """The GEMMs as before: whole-plane library dequantize + torch matmul, bf16 wgrad + add_."""
    new = _gemm.linear_wgrad
    _gemm.linear_wgrad = _legacy_wgrad
    try:
        with _gemm.forced_path("dequant"):
            yield
    finally:
        _gemm.linear_wgrad = new


@contextlib.contextmanager
def patched(obj, name, value):
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


# ---- the layers -------------------------------------------------------------------------------

def make_layer(kind, out_f, in_f, dev):
    """kind: 'bf16', 'bf16+mg', or (format, planes). Returns the module (bf16 compute)."""
    if kind in ("bf16", "bf16+mg"):
        lin = nn.Linear(in_f, out_f, bias=False, device=dev, dtype=torch.bfloat16)
        if kind == "bf16+mg":
            lin.main_grad = torch.zeros(out_f, in_f, dtype=torch.float32, device=dev)

            def hook(p):
                lin.main_grad.add_(p.grad)
                p.grad = None
            lin.weight.register_post_accumulate_grad_hook(hook)
        return lin
    fmt, planes = kind
    lin = nn.Linear(in_f, out_f, bias=False, device=dev, dtype=torch.float32)
    kw = dict(format=fmt, layout="padded", compute_dtype=torch.bfloat16)
    m = mxt.convert(lin, planes, **kw)
    m.release_master_init()
    m.main_grad = torch.zeros(out_f, in_f, dtype=torch.float32, device=dev)
    return m


def step_fn(m, x, gy):
    def run():
        x.grad = None
        y = m(x)
        y.backward(gy)
    return run


def time_fn(fn, iters, warmup=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    return statistics.median(ts)


def transient_mib(fn):
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2 ** 20


def measure(kind, shape, tokens, iters, dev, ctx=contextlib.nullcontext):
    out_f, in_f = shape
    torch.manual_seed(0)
    m = make_layer(kind, out_f, in_f, dev)
    x = torch.randn(tokens, in_f, device=dev, dtype=torch.bfloat16, requires_grad=True)
    gy = torch.randn(tokens, out_f, device=dev, dtype=torch.bfloat16)
    fn = step_fn(m, x, gy)
    with ctx():
        _gemm.path_counts.clear()
        us = time_fn(fn, iters)
        paths = sorted({f"{op}:{p}" for (op, p, _) in _gemm.path_counts})
        mib = transient_mib(fn)
    del m, x, gy, fn
    torch.cuda.empty_cache()
    return us, mib, paths


# ---- parts ------------------------------------------------------------------------------------

def part_table(a, dev, out, with_legacy):
    out.append("| weight [out x in] | tokens | variant | µs | vs bf16 | vs bf16+fp32 main_grad | transient MiB | paths |")
    out.append("|---|---|---|---:|---:|---:|---:|---|")
    rows = []
    for shape, toks in SHAPES:
        for t in toks:
            if a.quick and t > 8192:
                continue
            base = {}
            for name, kind in (("bf16", "bf16"), ("bf16 + fp32 main_grad", "bf16+mg")):
                us, mib, _ = measure(kind, shape, t, a.iters, dev)
                base[kind] = us
                out.append(f"| {shape[0]}x{shape[1]} | {t} | {name} | {us:.0f} | {us / base['bf16']:.2f}x | "
                           f"{us / base.get('bf16+mg', us):.2f}x | {mib:.0f} | |")
            variants = [(n, (f, p), contextlib.nullcontext, "") for n, f, p in QUANT]
            if with_legacy:
                variants = [(n, (f, p), legacy, " (before)") for n, f, p in QUANT] + variants
            for name, kind, ctx, tag in variants:
                try:
                    us, mib, paths = measure(kind, shape, t, a.iters, dev, ctx)
                except Exception as e:  # noqa: BLE001 - a benchmark reports and goes on
                    out.append(f"| {shape[0]}x{shape[1]} | {t} | {name}{tag} | error: {type(e).__name__}: "
                               f"{str(e)[:200]} | | | | |")
                    continue
                out.append(f"| {shape[0]}x{shape[1]} | {t} | {name}{tag} | {us:.0f} | {us / base['bf16']:.2f}x | "
                           f"{us / base['bf16+mg']:.2f}x | {mib:.0f} | {' '.join(paths) or 'legacy'} |")
                rows.append((shape, t, name + tag, us, base["bf16"], base["bf16+mg"], mib))
            print("\n".join(out[-(2 + len(variants)):]), flush=True)
    return rows


def part_profile(a, dev, out):
    from torch.profiler import ProfilerActivity, profile
    shape, t = (4096, 4096), 2048
    kinds = [("bf16", "bf16", contextlib.nullcontext), ("bf16 + fp32 main_grad", "bf16+mg", contextlib.nullcontext)]
    for n, f, p in QUANT[:2] + QUANT[2:3]:
        kinds += [(n + " (before)", (f, p), legacy), (n, (f, p), contextlib.nullcontext)]
    n_it = 10
    for name, kind, ctx in kinds:
        torch.manual_seed(0)
        m = make_layer(kind, *shape, dev)
        x = torch.randn(t, shape[1], device=dev, dtype=torch.bfloat16, requires_grad=True)
        gy = torch.randn(t, shape[0], device=dev, dtype=torch.bfloat16)
        fn = step_fn(m, x, gy)
        with ctx():
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(n_it):
                    fn()
                torch.cuda.synchronize()
            wall = (time.perf_counter() - t0) / n_it * 1e6
        evs = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA
               or getattr(e, "self_device_time_total", 0) > 0]
        evs = sorted(prof.key_averages(), key=lambda e: -getattr(e, "self_device_time_total", 0))
        gpu = sum(getattr(e, "self_device_time_total", 0) for e in prof.key_averages()) / n_it
        out.append(f"\n**{name}**, 4096x4096 @ 2048 tokens: GPU kernels {gpu:.0f} µs per fwd+bwd, "
                   f"wall (profiled) {wall:.0f} µs\n")
        out.append("| kernel | calls per fwd+bwd | µs per fwd+bwd |")
        out.append("|---|---:|---:|")
        for e in evs[:8]:
            d = getattr(e, "self_device_time_total", 0) / n_it
            if d <= 0:
                break
            out.append(f"| `{e.key[:90]}` | {e.count / n_it:.1f} | {d:.1f} |")
        print("\n".join(out[-12:]), flush=True)
        del m, x, gy, fn, prof
        torch.cuda.empty_cache()


def _warm_task(task):
    """Compile (into Triton's on-disk cache) the kernels one format / path / token count uses."""
    fmt, path, tokens = task
    dev = torch.device("cuda")
    m = make_layer((fmt, "both"), 4096, 4096, dev)
    x = torch.randn(tokens, 4096, device=dev, dtype=torch.bfloat16)
    t0 = time.perf_counter()
    with _gemm.forced_path(path):
        _gemm.linear_fwd(x, m.primary, None, torch.bfloat16)
        for plane in ("row", "col"):
            _gemm.linear_dgrad(x, m.primary, plane, torch.bfloat16)
    torch.cuda.synchronize()
    return f"{fmt} {path} {tokens}: {time.perf_counter() - t0:.1f} s"


def part_warm(a, dev, out):
    """The kernels of the sweep, table and models parts compiled in parallel processes first
    (Triton compiles each specialisation once, on the host, and caches it on disk)."""
    import multiprocessing as mp
    tasks = [(fmt, "fused", t) for fmt in ("mxfp8", "nvfp4") for t in (16, 64, 256)] + \
        [(fmt, "chunked", 256) for fmt in ("mxfp8", "nvfp4")]
    with mp.get_context("spawn").Pool(len(tasks)) as pool:
        for line in pool.imap_unordered(_warm_task, tasks):
            out.append(f"- warm {line}")
            print(out[-1], flush=True)


SWEEP_TOKENS = (16, 64, 256, 1024, 2048, 8192)
CHUNK_CAPS = (8 << 20, 16 << 20, 32 << 20)


def derive_rule(fused_vs_chunked, chunk_totals):
    """The measured rule from the sweep: per GEMM, the largest token count up to which the
    fused kernel is at least as fast as the chunked path at every swept count (over every
    format and plane); CHUNK_BYTES: the cap with the least total time over the table's shapes."""
    limits = {}
    for (op, _variant), rows in fused_vs_chunked.items():
        lim = 0
        for t, fused, chunked in sorted(rows):
            if not fused <= chunked:
                break
            lim = t
        limits[op] = min(limits.get(op, lim), lim)
    cap = min(chunk_totals, key=chunk_totals.get) if chunk_totals else _gemm.CHUNK_BYTES
    return limits, cap


def part_sweep(a, dev, out):
    """GEMM time against tokens for each path; 4096x4096 (and CHUNK_BYTES at the table's shapes).
    Returns (FUSED_MAX_TOKENS, CHUNK_BYTES) derived from it."""
    fvc = {}
    out.append("| GEMM | weight | tokens | bf16 cuBLAS µs | fused µs | chunked µs | dequant µs |")
    out.append("|---|---|---:|---:|---:|---:|---:|")
    for fmt, planes, plane in (("mxfp8", "both", "row"), ("mxfp8", "both", "col"), ("nvfp4", "both", "row"),
                               ("nvfp4", "both", "col")):
        shape = (4096, 4096)
        m = make_layer((fmt, planes), *shape, dev)
        w = torch.randn(*shape, device=dev, dtype=torch.bfloat16)
        for t in SWEEP_TOKENS:
            x = torch.randn(t, shape[1], device=dev, dtype=torch.bfloat16)
            gy = torch.randn(t, shape[0], device=dev, dtype=torch.bfloat16)
            ops = [("fwd", lambda: _gemm.linear_fwd(x, m.primary, None, torch.bfloat16), lambda: x @ w.t())] \
                if plane == "row" else []
            ops.append((f"dgrad {plane}", lambda: _gemm.linear_dgrad(gy, m.primary, plane, torch.bfloat16),
                        lambda: gy @ w))
            for op, f, ref in ops:
                r = [time_fn(ref, 20)]
                for path in ("fused", "chunked", "dequant"):
                    with _gemm.forced_path(path):
                        try:
                            r.append(time_fn(f, 20))
                        except Exception as e:  # noqa: BLE001
                            r.append(float("nan"))
                            print(f"sweep {fmt} {op} {path} {t}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                out.append(f"| {op} | {fmt} {shape[0]}x{shape[1]} | {t} | " + " | ".join(f"{v:.1f}" for v in r) + " |")
                print(out[-1], flush=True)
                fvc.setdefault((op.split()[0], (fmt, op)), []).append((t, r[1], r[2]))
        del m
    out.append("\nchunked path against CHUNK_BYTES (fwd + dgrad row, MXFP8), µs:\n")
    out.append("| weight | tokens | bf16 fwd+dgrad | 8 MiB | 16 MiB | 32 MiB | whole (not allowed) |")
    out.append("|---|---:|---:|---:|---:|---:|---:|")
    old = _gemm.CHUNK_BYTES
    totals = {}
    for shape, toks in SHAPES:
        m = make_layer(("mxfp8", "row"), *shape, dev)
        w = torch.randn(*shape, device=dev, dtype=torch.bfloat16)
        for t in toks:
            x = torch.randn(t, shape[1], device=dev, dtype=torch.bfloat16)
            gy = torch.randn(t, shape[0], device=dev, dtype=torch.bfloat16)
            r = [time_fn(lambda: (x @ w.t(), gy @ w), 10)]
            for cb in CHUNK_CAPS + (None,):
                _gemm.CHUNK_BYTES = cb or old
                # None: the whole weight in one chunk (what _chunk never does), for comparison
                whole = contextlib.nullcontext() if cb else patched(_gemm, "_chunk", lambda extent, other, dt: extent)
                with _gemm.forced_path("chunked"), whole:
                    r.append(time_fn(lambda: (_gemm.linear_fwd(x, m.primary, None, torch.bfloat16),
                                              _gemm.linear_dgrad(gy, m.primary, "row", torch.bfloat16)), 10))
                if cb:
                    totals[cb] = totals.get(cb, 0.0) + r[-1] / r[0]
            _gemm.CHUNK_BYTES = old
            out.append(f"| {shape[0]}x{shape[1]} | {t} | " + " | ".join(f"{v:.0f}" for v in r) + " |")
            print(out[-1], flush=True)
        del m
    _gemm.CHUNK_BYTES = old
    out.append("\nwgrad, 4096x4096, µs: bf16 mm | bf16 mm + fp32 add_ | mm(out_dtype=fp32) + add_ | "
               "addmm(out_dtype=fp32, out=main_grad)\n")
    for t in (2048, 8192):
        gy = torch.randn(t, 4096, device=dev, dtype=torch.bfloat16)
        x = torch.randn(t, 4096, device=dev, dtype=torch.bfloat16)
        mg = torch.zeros(4096, 4096, device=dev)
        r = [time_fn(lambda: gy.t() @ x, 20), time_fn(lambda: mg.add_(gy.t() @ x), 20),
             time_fn(lambda: mg.add_(torch.mm(gy.t(), x, out_dtype=torch.float32)), 20),
             time_fn(lambda: torch.addmm(mg, gy.t(), x, out_dtype=torch.float32, out=mg), 20)]
        out.append(f"- {t} tokens: " + " | ".join(f"{v:.0f}" for v in r))
        print(out[-1], flush=True)
    limits, cap = derive_rule(fvc, totals)
    out.append(f"\nmeasured rule: FUSED_MAX_TOKENS = {limits}, CHUNK_BYTES = {cap >> 20} MiB "
               f"(chunk time / bf16 summed over the table's shapes: "
               + ", ".join(f"{k >> 20} MiB {v:.3f}" for k, v in sorted(totals.items())) + ")")
    print(out[-1], flush=True)
    return limits, cap


def part_models(a, dev, out):
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "examples", "train"))
    from model import GPTConfig, build   # examples/train/model.py
    out.append("| model | variant | µs (median) | vs bf16 |")
    out.append("|---|---|---:|---:|")
    for cfgname, cfg, batch, with_step, iters in (
            ("parity (small: d 512, 4 layers, 32 x 256 tokens) fwd+bwd",
             GPTConfig(vocab=256, seq=256, d=512, layers=4, heads=8, attn="math"), 32, False, 20),
            ("~1B (d 2048, 20 layers, 8 x 1024 tokens) step",
             GPTConfig(vocab=512, seq=1024, d=2048, layers=20, heads=16, attn="sdpa"), 8, True, 8)):
        base = None
        for vname, variant, ctx in (("bf16", "bf16", contextlib.nullcontext),
                                    ("MXFP8 (before)", "mxfp8", legacy), ("MXFP8", "mxfp8", contextlib.nullcontext)):
            if time.perf_counter() - T0 > a.budget_s:
                out.append(f"| {cfgname} | {vname} | skipped: the time budget ({a.budget_s} s) | |")
                continue
            try:
                us = model_time(cfg, variant, batch, with_step, iters, dev, ctx, build)
            except Exception as e:  # noqa: BLE001 - a benchmark reports and goes on
                out.append(f"| {cfgname} | {vname} | error: {type(e).__name__}: {str(e)[:200]} | |")
                print(out[-1], flush=True)
                continue
            base = base or us
            out.append(f"| {cfgname} | {vname} | {us:.0f} | {us / base:.3f}x |")
            print(out[-1], flush=True)


def model_time(cfg, variant, batch, with_step, iters, dev, ctx, build):
    """Median µs of one fwd+bwd (+ ShardedOptimizer step) of the example's model."""
    model = build(cfg, variant, {"h.0.qkv", "h.0.fc2"}, dev, 1234, init_device=dev)
    toks = torch.randint(0, cfg.vocab, (batch, cfg.seq + 1), device=dev)
    opt = None
    if with_step:
        opt = mxt.ShardedOptimizer(model, lambda groups: torch.optim.AdamW(groups, lr=1e-4), bucket_size=1 << 28)

    def fn():
        loss = model(toks, toks.numel())
        loss.backward()
        if opt is not None:
            opt.step()
            opt.zero_grad()
        elif variant == "bf16":
            model.zero_grad(set_to_none=True)
    try:
        with ctx():
            return time_fn(fn, iters, warmup=3)
    finally:
        if opt is not None:
            opt.close()
        del model, opt, toks
        torch.cuda.empty_cache()


T0 = time.perf_counter()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", default="table")
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--quick", action="store_true", help="tokens <= 8192 only")
    p.add_argument("--budget-s", type=float, default=1e9, help="skip model runs started after this many seconds")
    p.add_argument("--out", default=None, help="also write the markdown here")
    p.add_argument("--apply-rule", action="store_true",
                   help="the parts after sweep use the rule it measured (instead of _gemm's constants)")
    a = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("torch_layer.py needs a CUDA device")
    dev = torch.device("cuda")
    parts = a.parts.split(",")
    out = [f"# torch_layer.py on {torch.cuda.get_device_name(dev)}, torch {torch.__version__}", ""]
    try:
        import triton
        out.append(f"triton {triton.__version__}; FUSED_MAX_TOKENS {_gemm.FUSED_MAX_TOKENS}, "
                   f"CHUNK_BYTES {_gemm.CHUNK_BYTES >> 20} MiB\n")
    except ImportError:
        out.append("triton: not installed\n")
    for part in parts:
        t0 = time.perf_counter()
        out.append(f"\n## {part}\n")
        if part in ("table", "legacy"):
            if part == "legacy" and "table" in parts:
                continue
            part_table(a, dev, out, with_legacy="legacy" in parts)
        elif part == "warm":
            part_warm(a, dev, out)
        elif part == "profile":
            part_profile(a, dev, out)
        elif part == "sweep":
            limits, cap = part_sweep(a, dev, out)
            if a.apply_rule:
                _gemm.FUSED_MAX_TOKENS.update(limits)
                _gemm.CHUNK_BYTES = cap
                out.append(f"(applied to the parts that follow: FUSED_MAX_TOKENS {_gemm.FUSED_MAX_TOKENS}, "
                           f"CHUNK_BYTES {cap >> 20} MiB)")
        elif part == "models":
            part_models(a, dev, out)
        else:
            raise SystemExit(f"unknown part {part!r}")
        out.append(f"\n({part}: {time.perf_counter() - t0:.0f} s)")
        print(out[-1], flush=True)
        if a.out:
            with open(a.out, "w") as f:
                f.write("\n".join(out) + "\n")
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()

# SPDX-License-Identifier: MIT
"""One quantized linear against nn.Linear on one GPU: fwd+bwd time and transient memory (issue 25).

    python bench/torch_layer.py                      # the per-layer table, markdown to stdout
    python bench/torch_layer.py --parts warm,sweep,table,profile,models --apply-rule --out layer.md

Code variants measured side by side (same process):
  pre-25   the GEMMs as before issue 25, verbatim (mxshard/torch/_gemm.py at 7ff5b5b): the
           library's whole-plane dequantize + torch matmul, wgrad a torch product (added into
           `acc` when one is passed; today's converted linear passes none).
  run-14   issue 25 as run 14 measured it, emulated on today's code: fused up to 64 tokens, else
           chunked in at least two chunks of <= 32 MiB, Triton's dispatch for every launch and
           the plane description rebuilt every call.
  after    today's _gemm (the measured rule, one chunk when the copy fits in CHUNK_BYTES, cached
           plans, kernels launched through their compiled handle).

Parts:
  table    fwd+bwd of one layer, bf16 activations (bias=False, as the example's models),
           median of --iters runs after warm-up, each timed with CUDA events around
           `y = layer(x); y.backward(gy)` and waited for; x.grad is dropped between runs (every
           run allocates it). Variants: bf16 nn.Linear; bf16 nn.Linear whose bf16 wgrad is
           added into an fp32 buffer ("main_grad" in the table) by a post-accumulate-grad hook
           (what a dense weight pays under ShardedOptimizer: its hook adds p.grad into the
           bucket, then p.grad is let go); converted linears (mxt.MXFP8Linear(in, out, ...) and
           NVFP4Linear (1x16), convert()'s MXFP8ParamLinear / NVFP4ParamLinear), planes row and
           both, padded scales, in the three code variants, each one's fp32 weight.grad added
           into an fp32 buffer by the same hook (what ShardedOptimizer pays for a converted
           weight: the gradient arrives in weight.grad and its hook adds it into the bucket).
           Transient peak: torch.cuda.max_memory_allocated during one fwd+bwd minus what was
           allocated before it (module with its master and cached primary, x, gy, the fp32
           buffer / .grad: resident).
  profile  host and GPU time per fwd+bwd and per GEMM (see host_gpu), and torch.profiler's
           CPU time per op (self, µs per fwd+bwd) of each code variant.
  sweep    the dequantize tile candidates, then the GEMMs alone on a grid of weight sizes x
           token counts, per path (fused / chunked / dequant), host and GPU µs per call: the
           measured rule of mxshard/torch/gemm/paths.py (printed as the RULE literal).
  models   examples/train's parity model ("small") fwd+bwd and the ~1B model's step
           (ShardedOptimizer), bf16 vs MXFP8 in the three code variants.
  warm     compile the Triton kernels of the other parts in parallel processes first.
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
from mxshard.torch.gemm import paths as _gemm

SHAPES = [((4096, 4096), (2048, 8192)), ((14336, 4096), (2048, 16384)), ((8192, 8192), (2048, 16384))]
QUANT = [("MXFP8 row", "mxfp8", "row"), ("MXFP8 both", "mxfp8", "both"),
         ("NVFP4 row", "nvfp4", "row"), ("NVFP4 both", "nvfp4", "both")]


# ---- the code variants ----------------------------------------------------------------------

def _pre25_fwd(x, primary, b, dt):
    w = _gemm.dequant(primary, "row", dt)
    return torch.nn.functional.linear(x, w, b)


def _pre25_dgrad(gy, primary, plane, dt):
    w = _gemm.dequant(primary, plane, dt)
    return torch.matmul(gy, w)


def _pre25_wgrad(gy2, x2, acc=None, dtype=None):
    g = torch.matmul(gy2.t(), x2)
    if acc is not None:
        acc.add_(g)
        return acc
    return g if dtype is None or g.dtype == dtype else g.to(dtype)


@contextlib.contextmanager
def pre25():
    """The GEMMs as before issue 25 (_gemm.py at 7ff5b5b, verbatim): whole-plane library dequantize
    + torch matmul, bf16 wgrad + add_."""
    with patched(_gemm, "linear_fwd", _pre25_fwd), patched(_gemm, "linear_dgrad", _pre25_dgrad), \
            patched(_gemm, "linear_wgrad", _pre25_wgrad):
        yield


legacy = pre25   # the name run 14 used


def _run14_rule(fmt, gemm, elems, tokens):
    return ("fused", "run 14: tokens <= 64") if tokens <= 64 else ("chunked", "run 14: tokens > 64")


def _run14_chunk(extent, other, dt):
    per_row = other * dt.itemsize
    n = max(128, (32 << 20) // per_row // 128 * 128)
    if extent > 128:
        n = min(n, (-(-extent // 2) + 127) // 128 * 128)
    return n


@contextlib.contextmanager
def run14():
    """Issue 25 as run 14 measured it: fused <= 64 tokens, else >= 2 chunks of <= 32 MiB, Triton's
    dispatch for every launch, the plane description rebuilt every call."""
    k = _gemm._kernels()
    with patched(_gemm, "_rule_path", _run14_rule), patched(_gemm, "_chunk", _run14_chunk), \
            patched(_gemm, "_PLAN_CACHE", False), patched(k, "FAST_LAUNCH", False):
        yield


VARIANTS = (("pre-25", pre25), ("run-14", run14), ("after", contextlib.nullcontext))


@contextlib.contextmanager
def patched(obj, name, value):
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


# ---- the layers -------------------------------------------------------------------------------

def grad_into_buffer(lin):
    """An fp32 buffer of the weight's shape (lin.grad_buffer) that a post-accumulate-grad hook
    adds weight.grad into, then lets the gradient go: what ShardedOptimizer's hook does with a
    weight's gradient (its bucket), dense or converted alike."""
    lin.grad_buffer = torch.zeros(lin.out_features, lin.in_features, dtype=torch.float32,
                                  device=lin.weight.device)

    def hook(p):
        lin.grad_buffer.add_(p.grad)
        p.grad = None
    lin.weight.register_post_accumulate_grad_hook(hook)
    return lin


def make_layer(kind, out_f, in_f, dev):
    """kind: 'bf16', 'bf16+mg', or (format, planes). Returns the module (bf16 compute); every
    kind but 'bf16' adds its weight.grad into an fp32 buffer (grad_into_buffer)."""
    if kind in ("bf16", "bf16+mg"):
        lin = nn.Linear(in_f, out_f, bias=False, device=dev, dtype=torch.bfloat16)
        return grad_into_buffer(lin) if kind == "bf16+mg" else lin
    fmt, planes = kind
    kw = dict(bias=False, planes=planes, layout="padded", compute_dtype=torch.bfloat16, device=dev)
    if fmt == "mxfp8":
        m = mxt.MXFP8Linear(in_f, out_f, **kw)
    else:
        m = mxt.NVFP4Linear(in_f, out_f, block="1x16", **kw)
    _ = m.primary   # the quantized planes made now, before any measurement (resident, as the optimizer's)
    return grad_into_buffer(m)


def step_fn(m, x, gy):
    def run():
        x.grad = None
        y = m(x)
        y.backward(gy)
    return run


def time_fn(fn, iters, warmup=5):
    """Median µs of fn, each run timed with CUDA events around it and waited for (host time the
    GPU waits for counts)."""
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


_CYCLES_PER_US = None


def _cycles_per_us():
    global _CYCLES_PER_US
    if _CYCLES_PER_US is None:
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1000)
        a.record()
        torch.cuda._sleep(20_000_000)
        b.record()
        b.synchronize()
        _CYCLES_PER_US = 20_000_000 / (a.elapsed_time(b) * 1e3)
    return _CYCLES_PER_US


def host_gpu(fn, iters=10, warmup=2):
    """(host µs, GPU µs) per call of fn: `iters` calls issued back to back while the GPU sleeps
    (torch.cuda._sleep, long enough to outlast the issuing), so the host time is the issuing
    alone (no wait on the GPU; a host sync would show as the sleep) and the GPU time, between
    events after the sleep and after the last call, is the kernels back to back."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    est = time.perf_counter() - t0
    torch.cuda.synchronize()
    for attempt in range(3):
        cycles = int((est * iters * 1.5 * 2 ** attempt + 300e-6) * 1e6 * _cycles_per_us())
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(cycles)
        a.record()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        host = time.perf_counter() - t0
        covered = not a.query()     # the GPU still asleep when the host was done
        b.record()
        b.synchronize()
        if covered:
            break
    return host / iters * 1e6, a.elapsed_time(b) / iters * 1e3


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
        host, gpu = host_gpu(fn, 5)
    del m, x, gy, fn
    torch.cuda.empty_cache()
    return us, mib, paths, host, gpu


# ---- parts ------------------------------------------------------------------------------------

def part_table(a, dev, out):
    out.append("| weight [out x in] | tokens | variant | code | µs | vs bf16 | vs bf16+fp32 main_grad | host µs | "
               "GPU µs | transient MiB | paths |")
    out.append("|---|---|---|---|---:|---:|---:|---:|---:|---:|---|")
    rows = []
    for shape, toks in SHAPES:
        for t in toks:
            if a.quick and t > 8192:
                continue
            base = {}
            n0 = len(out)
            for name, kind in (("bf16", "bf16"), ("bf16 + fp32 main_grad", "bf16+mg")):
                us, mib, _, host, gpu = measure(kind, shape, t, a.iters, dev)
                base[kind] = us
                out.append(f"| {shape[0]}x{shape[1]} | {t} | {name} | | {us:.0f} | {us / base['bf16']:.2f}x | "
                           f"{us / base.get('bf16+mg', us):.2f}x | {host:.0f} | {gpu:.0f} | {mib:.0f} | |")
            for name, f, p in QUANT:
                for code, ctx in VARIANTS:
                    try:
                        us, mib, paths, host, gpu = measure((f, p), shape, t, a.iters, dev, ctx)
                    except Exception as e:  # noqa: BLE001 - a benchmark reports and goes on
                        out.append(f"| {shape[0]}x{shape[1]} | {t} | {name} | {code} | error: {type(e).__name__}: "
                                   f"{str(e)[:200]} | | | | | | |")
                        continue
                    out.append(f"| {shape[0]}x{shape[1]} | {t} | {name} | {code} | {us:.0f} | {us / base['bf16']:.2f}x"
                               f" | {us / base['bf16+mg']:.2f}x | {host:.0f} | {gpu:.0f} | {mib:.0f} | "
                               f"{' '.join(paths) or 'pre-25'} |")
                    rows.append((shape, t, name, code, us, base["bf16"], base["bf16+mg"], mib))
            print("\n".join(out[n0:]), flush=True)
    return rows


def _prof_table(prof, n_it, out, top=8):
    """torch.profiler's CPU time per op (self, µs per fwd+bwd) and the kernels' GPU time."""
    evs = prof.key_averages()
    gpu = sum(getattr(e, "self_device_time_total", 0) for e in evs) / n_it
    cpu = sorted(evs, key=lambda e: -e.self_cpu_time_total)
    out.append(f"GPU kernels {gpu:.0f} µs per fwd+bwd; CPU self time by op (µs per fwd+bwd, calls):\n")
    out.append("| op | calls | CPU self µs | CPU total µs |")
    out.append("|---|---:|---:|---:|")
    for e in cpu[:top]:
        out.append(f"| `{e.key[:70]}` | {e.count / n_it:.0f} | {e.self_cpu_time_total / n_it:.1f} | "
                   f"{e.cpu_time_total / n_it:.1f} |")


PROFILE_LAYERS = (((4096, 4096), 2048), ((2048, 512), 8192))
GEMM_HOST = (((4096, 4096), 2048), ((2048, 512), 8192), ((512, 2048), 8192), ((4096, 4096), 16))


def part_profile(a, dev, out):
    from torch.profiler import ProfilerActivity, profile
    out.append("**Host and GPU time per GEMM** (`host_gpu`: 10 calls issued while the GPU sleeps; host = "
               "the issuing, GPU = the kernels back to back), MXFP8 both planes, bf16:\n")
    out.append("| weight | tokens | GEMM | code | path | host µs | GPU µs |")
    out.append("|---|---:|---|---|---|---:|---:|")
    for shape, t in GEMM_HOST:
        m = make_layer(("mxfp8", "both"), *shape, dev)
        x = torch.randn(t, shape[1], device=dev, dtype=torch.bfloat16)
        gy = torch.randn(t, shape[0], device=dev, dtype=torch.bfloat16)
        w = torch.randn(*shape, device=dev, dtype=torch.bfloat16)
        for gname, f, ref in (("fwd", lambda: _gemm.linear_fwd(x, m.primary, None, torch.bfloat16),
                               lambda: torch.nn.functional.linear(x, w)),
                              ("dgrad col", lambda: _gemm.linear_dgrad(gy, m.primary, "col", torch.bfloat16),
                               lambda: torch.matmul(gy, w))):
            h, g = host_gpu(ref)
            out.append(f"| {shape[0]}x{shape[1]} | {t} | {gname} | bf16 matmul | | {h:.1f} | {g:.1f} |")
            for code, ctx in VARIANTS:
                with ctx():
                    _gemm.path_counts.clear()
                    h, g = host_gpu(f)
                    paths = " ".join(sorted({p for (_, p, _) in _gemm.path_counts})) or "pre-25"
                out.append(f"| {shape[0]}x{shape[1]} | {t} | {gname} | {code} | {paths} | {h:.1f} | {g:.1f} |")
        print("\n".join(out[-8:]), flush=True)
        del m, x, gy, w
    n_it = 10
    for shape, t in PROFILE_LAYERS:
        kinds = [("bf16 + fp32 main_grad", "bf16+mg", "", contextlib.nullcontext)]
        kinds += [("MXFP8 row", ("mxfp8", "row"), code, ctx) for code, ctx in VARIANTS]
        for name, kind, code, ctx in kinds:
            torch.manual_seed(0)
            m = make_layer(kind, *shape, dev)
            x = torch.randn(t, shape[1], device=dev, dtype=torch.bfloat16, requires_grad=True)
            gy = torch.randn(t, shape[0], device=dev, dtype=torch.bfloat16)
            fn = step_fn(m, x, gy)
            with ctx():
                host, gpu = host_gpu(fn, 10)
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                    for _ in range(n_it):
                        fn()
                    torch.cuda.synchronize()
            out.append(f"\n**{name}{' ' + code if code else ''}**, {shape[0]}x{shape[1]} @ {t} tokens: host "
                       f"{host:.0f} µs, GPU {gpu:.0f} µs per fwd+bwd (host_gpu); profiled:\n")
            _prof_table(prof, n_it, out)
            print("\n".join(out[-13:]), flush=True)
            del m, x, gy, fn, prof
            torch.cuda.empty_cache()


def _warm_task(task):
    """Compile (into Triton's on-disk cache) the kernels one format / path / token count uses."""
    fmt, path, tokens, tile = task
    dev = torch.device("cuda")
    k = _gemm._kernels()
    if tile is not None:
        k.DEQUANT_TILE = tile
    t0 = time.perf_counter()
    for n in (512, 4096):
        m = make_layer((fmt, "both"), n, n, dev)
        x = torch.randn(tokens, n, device=dev, dtype=torch.bfloat16)
        with _gemm.forced_path(path):
            _gemm.linear_fwd(x, m.primary, None, torch.bfloat16)
            for plane in ("row", "col"):
                _gemm.linear_dgrad(x, m.primary, plane, torch.bfloat16)
    torch.cuda.synchronize()
    return f"{fmt} {path} {tokens} {tile}: {time.perf_counter() - t0:.1f} s"


def part_warm(a, dev, out):
    """The kernels of the other parts compiled in parallel processes first (Triton compiles each
    specialisation once, on the host, and caches it on disk)."""
    import multiprocessing as mp
    tasks = [(fmt, "fused", t, None) for fmt in ("mxfp8", "nvfp4") for t in (16, 256)] + \
        [(fmt, "chunked", 256, tile) for fmt in ("mxfp8", "nvfp4") for tile in TILES]
    with mp.get_context("spawn").Pool(min(len(tasks), 12)) as pool:
        for line in pool.imap_unordered(_warm_task, tasks):
            out.append(f"- warm {line}")
            print(out[-1], flush=True)


TILES = ((32, 128, 4), (32, 256, 4))   # run 14b's first call also had (64, 128, 4) 370.1 and (64, 256, 8) 398.3 µs
GRID_N = (512, 1024, 2048, 4096, 8192)          # square weights: 2^18 .. 2^26 elements (_gemm.RULE_ELEMS)
GRID_TOKENS = (16, 256, 2048, 8192, 16384)      # _gemm.RULE_TOKENS
FUSED_UPTO = 2048   # the fused kernel is not measured above (run 14: 5x cuBLAS's time at 2048 and beyond)
TIE = 0.10          # within 10 % of the fastest (host noise is ~5 µs): chunked, then fused, is preferred
                    # (they hold no full-size copy of the weight; the library's dequantize does)


def sweep_tiles(a, dev, out):
    """The dequantize tile candidates on the 8192x8192 planes: the sum of µs over the planes."""
    k = _gemm._kernels()
    out.append("| tile (rows x cols, warps) | MXFP8 row µs | MXFP8 col µs | NVFP4 row µs | NVFP4 col µs | sum |")
    out.append("|---|---:|---:|---:|---:|---:|")
    ms = {f: make_layer((f, "both"), 8192, 8192, dev) for f in ("mxfp8", "nvfp4")}
    best = None
    for tile in TILES:
        k.DEQUANT_TILE = tile
        r = []
        for f in ("mxfp8", "nvfp4"):
            for plane in ("row", "col"):
                op = _gemm.plane_operand(ms[f].primary, plane)
                launch = k.dequant_launch(op, 0, op.R, 0, op.C, torch.bfloat16)
                r.append(host_gpu(launch.run, 10)[1])
        out.append(f"| {tile[0]}x{tile[1]}, {tile[2]} | " + " | ".join(f"{v:.1f}" for v in r) + f" | {sum(r):.1f} |")
        print(out[-1], flush=True)
        if best is None or sum(r) < best[1]:
            best = (tile, sum(r))
    k.DEQUANT_TILE = best[0]
    out.append(f"\nfastest: {best[0]} (8192x8192 bf16 = 128 MiB out + 64 / 32 MiB in per plane)")
    del ms
    torch.cuda.empty_cache()
    return best[0]


def part_sweep(a, dev, out):
    """The dequantize tile, then host and GPU µs per GEMM per path on the grid; returns the RULE
    (and the tile) it measured."""
    tile = sweep_tiles(a, dev, out)
    _gemm.set_rule()   # plans built with the old tile are dropped
    out.append("\n| format | weight | tokens | GEMM | bf16 cuBLAS host / GPU µs | fused | chunked | dequant | "
               "fastest (max of host, GPU) |")
    out.append("|---|---|---:|---|---|---|---|---|---|")
    costs = {}
    for fmt in ("mxfp8", "nvfp4"):
        for n in GRID_N:
            m = make_layer((fmt, "both"), n, n, dev)
            w = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
            for t in GRID_TOKENS:
                x = torch.randn(t, n, device=dev, dtype=torch.bfloat16)
                gy = torch.randn(t, n, device=dev, dtype=torch.bfloat16)
                iters = 10 if n * n * t < (1 << 36) else 5
                ref = host_gpu(lambda: torch.nn.functional.linear(x, w), iters)
                for gemm, f in (("fwd", lambda: _gemm.linear_fwd(x, m.primary, None, torch.bfloat16)),
                                ("dgrad row", lambda: _gemm.linear_dgrad(gy, m.primary, "row", torch.bfloat16)),
                                ("dgrad col", lambda: _gemm.linear_dgrad(gy, m.primary, "col", torch.bfloat16))):
                    r = {}
                    for path in ("fused", "chunked", "dequant"):
                        if path == "fused" and t > FUSED_UPTO:
                            continue
                        with _gemm.forced_path(path):
                            try:
                                r[path] = host_gpu(f, iters)
                            except Exception as e:  # noqa: BLE001
                                print(f"sweep {fmt} {n} {t} {gemm} {path}: {type(e).__name__}: {str(e)[:300]}",
                                      flush=True)
                    cost = {p: max(v) for p, v in r.items()}
                    lo = min(cost.values())
                    win = min(cost, key=cost.get)
                    for pref in ("chunked", "fused"):
                        if pref in cost and cost[pref] <= lo * (1 + TIE):
                            win = pref
                            break
                    costs[(fmt, gemm, n, t)] = win
                    cell = lambda p: f"{r[p][0]:.0f} / {r[p][1]:.0f}" if p in r else "-"  # noqa: E731
                    out.append(f"| {fmt} | {n}x{n} | {t} | {gemm} | {ref[0]:.0f} / {ref[1]:.0f} | {cell('fused')} | "
                               f"{cell('chunked')} | {cell('dequant')} | {win} |")
                    print(out[-1], flush=True)
            del m, w
            torch.cuda.empty_cache()
    rule = {}
    for fmt in ("mxfp8", "nvfp4"):
        for gemm in ("fwd", "dgrad row", "dgrad col"):
            rule[(fmt, gemm)] = tuple("".join(costs[(fmt, gemm, n, t)][0].upper() for t in GRID_TOKENS)
                                      for n in GRID_N)
    out.append("\nmeasured rule (_gemm.RULE; rows: weights 512^2 .. 8192^2, columns: 16 .. 16384 tokens; "
               f"F fused, C chunked, D dequant), DEQUANT_TILE = {tile}:\n")
    out.append("```\n" + "\n".join(f"{k!r}: {v!r}," for k, v in rule.items()) + "\n```")
    print("\n".join(out[-3:]), flush=True)
    return rule, tile


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
        for vname, variant, ctx in (("bf16", "bf16", contextlib.nullcontext),) + tuple(
                (f"MXFP8 {code}", "mxfp8", c) for code, c in VARIANTS):
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
    """Median µs of one fwd+bwd (+ ShardedOptimizer step: its converted weights replicated
    GatheredWeights, every gradient added into its bucket by the hooks) of the example's model. (host_gpu does
    not apply: the parity model's fwd+bwd waits for the GPU inside, run 14b's first call.)"""
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
                   help="the parts after sweep use the rule (and tile) it measured instead of _gemm's")
    a = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("torch_layer.py needs a CUDA device")
    dev = torch.device("cuda")
    parts = a.parts.split(",")
    out = [f"# torch_layer.py on {torch.cuda.get_device_name(dev)}, torch {torch.__version__}", ""]
    try:
        import triton
        k = _gemm._kernels()
        out.append(f"triton {triton.__version__}; CHUNK_BYTES {_gemm.CHUNK_BYTES >> 20} MiB, FAST_LAUNCH "
                   f"{k.FAST_LAUNCH}, DEQUANT_TILE {k.DEQUANT_TILE}\n")
    except ImportError:
        out.append("triton: not installed\n")
    for part in parts:
        t0 = time.perf_counter()
        out.append(f"\n## {part}\n")
        if part == "table":
            part_table(a, dev, out)
        elif part == "warm":
            part_warm(a, dev, out)
        elif part == "profile":
            part_profile(a, dev, out)
        elif part == "sweep":
            rule, tile = part_sweep(a, dev, out)
            if a.apply_rule:
                _gemm.set_rule(rule)
                out.append(f"(applied to the parts that follow; DEQUANT_TILE {tile})")
            else:
                _gemm._kernels().DEQUANT_TILE = _TILE0
                _gemm.set_rule()
        elif part == "models":
            part_models(a, dev, out)
        else:
            raise SystemExit(f"unknown part {part!r}")
        out.append(f"\n({part}: {time.perf_counter() - t0:.0f} s)")
        print(out[-1], flush=True)
        k = _gemm._kernels()
        if k is not None and part != "warm":
            print(f"launches so far: {dict(k.launch_counts)}", flush=True)
        if a.out:
            with open(a.out, "w") as f:
                f.write("\n".join(out) + "\n")
    k = _gemm._kernels()
    if k is not None:
        out.append(f"\nTriton launches (kernel, how): {dict(k.launch_counts)}")
    if a.out:
        with open(a.out, "w") as f:
            f.write("\n".join(out) + "\n")


_TILE0 = _gemm._kernels().DEQUANT_TILE if _gemm._kernels() is not None else None

if __name__ == "__main__":
    main()

# SPDX-License-Identifier: MIT
"""Host CPU time of bench/fsdp_bench.py step: blocking CUDA synchronisation (so that waiting for the
GPU costs no CPU time) and the cProfile summaries (top functions, mxshard's functions per step,
host time per kind of code).

cProfile and threads: on Python 3.12+ cProfile is built on sys.monitoring and records every thread
of the interpreter, the autograd engine's device thread included (where a CUDA backward runs: its
FSDP2 hooks and mxshard's backward); its call tree then interleaves the threads, but tottime per
function stays the time spent in that function's own code. On Python <= 3.11 it records the thread
that enabled it only (a CPU backward runs there; a CUDA backward does not).
"""
import ctypes
import io
import os
import pstats
import sys

_S = os.sep
CATEGORIES = (  # (name, path fragments): first match wins; "~" is a built-in (C) function
    ("mxshard", (_S + "mxshard" + _S,)),
    ("torch fsdp", (_S.join(("torch", "distributed", "fsdp", "")),)),
    ("torch distributed", (_S.join(("torch", "distributed", "")),)),
    ("torch autograd", (_S.join(("torch", "autograd", "")),)),
    ("torch compile", tuple(_S.join(("torch", d, "")) for d in ("_dynamo", "_inductor", "_functorch", "fx"))),
    ("torch nn", (_S.join(("torch", "nn", "")),)),
    ("torch optim", (_S.join(("torch", "optim", "")),)),
    ("torch other", (_S + "torch" + _S,)),
    ("built-in (C)", ("~",)),
)


def blocking_sync(ordinal):
    """Makes the CUDA primary context of `ordinal` block (not spin) in synchronisations, through the
    driver API, before torch creates the context: a spinning wait would count the GPU's time as
    host CPU time. Returns a string saying what happened (never raises)."""
    try:
        cu = ctypes.CDLL("libcuda.so.1")
        dev = ctypes.c_int()
        if cu.cuInit(0) != 0 or cu.cuDeviceGet(ctypes.byref(dev), ordinal) != 0:
            return "blocking sync: cuInit/cuDeviceGet failed"
        fn = getattr(cu, "cuDevicePrimaryCtxSetFlags_v2", None) or cu.cuDevicePrimaryCtxSetFlags
        rc = fn(dev, 0x04)  # CU_CTX_SCHED_BLOCKING_SYNC
        return "blocking sync: on" if rc == 0 else f"blocking sync: cuDevicePrimaryCtxSetFlags rc {rc}"
    except (OSError, AttributeError) as e:
        return f"blocking sync: unavailable ({e})"


def _category(path):
    for name, frags in CATEGORIES:
        if any(f in path for f in frags):
            return name
    return "other"


def _short(path):
    i = path.rfind(os.sep + "mxshard" + os.sep)
    if i >= 0:
        return path[i + 1:]
    i = path.rfind(os.sep + "torch" + os.sep)
    return path[i + 1:] if i >= 0 else os.path.basename(path)


def summary(prof, steps, top=25):
    """A cProfile.Profile of `steps` steps -> (text, dict): the top functions by tottime and by
    cumtime, mxshard's functions (paths under .../mxshard/) summed per function, and the tottime of
    each kind of code; times in ms per step."""
    st = pstats.Stats(prof)
    rows = []
    for (path, line, name), (cc, nc, tt, ct, _callers) in st.stats.items():
        rows.append({"file": _short(path), "line": line, "func": name, "calls": nc / steps,
                     "tottime_ms": tt * 1e3 / steps, "cumtime_ms": ct * 1e3 / steps, "kind": _category(path)})
    total = sum(r["tottime_ms"] for r in rows)
    kinds = {}
    for r in rows:
        kinds[r["kind"]] = kinds.get(r["kind"], 0.0) + r["tottime_ms"]
    mx = {}
    for r in rows:
        if r["kind"] != "mxshard":
            continue
        k = (r["file"], r["func"])
        a = mx.setdefault(k, {"file": r["file"], "func": r["func"], "calls": 0.0, "tottime_ms": 0.0, "cumtime_ms": 0.0})
        a["calls"] += r["calls"]
        a["tottime_ms"] += r["tottime_ms"]
        a["cumtime_ms"] = max(a["cumtime_ms"], r["cumtime_ms"])  # recursion-safe: the largest entry
    mx = sorted(mx.values(), key=lambda a: -a["tottime_ms"])
    by_tt = sorted(rows, key=lambda r: -r["tottime_ms"])[:top]
    by_ct = sorted(rows, key=lambda r: -r["cumtime_ms"])[:top]

    def table(title, rs, with_kind=True):
        out = [title, "| function | calls/step | tottime ms/step | cumtime ms/step |" + (" kind |" if with_kind else ""),
               "|---|---:|---:|---:|" + ("---|" if with_kind else "")]
        for r in rs:
            where = f"{r['file']}:{r['line']}({r['func']})" if "line" in r else f"{r['file']}({r['func']})"
            out.append(f"| {where} | {r['calls']:.1f} | {r['tottime_ms']:.3f} | {r['cumtime_ms']:.3f} |"
                       + (f" {r['kind']} |" if with_kind else ""))
        return "\n".join(out)

    text = [f"profiled tottime: {total:.2f} ms/step over {steps} steps (Python {sys.version.split()[0]}: "
            + ("every thread" if sys.version_info >= (3, 12) else "the profiling thread only") + ")",
            "| kind | tottime ms/step | share |", "|---|---:|---:|"]
    text += [f"| {k} | {v:.2f} | {v / max(total, 1e-9):.1%} |" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])]
    text.append(table(f"top {top} by tottime", by_tt))
    text.append(table(f"top {top} by cumtime", by_ct))
    text.append(table(f"mxshard functions (summed per function), {sum(a['tottime_ms'] for a in mx):.2f} ms/step",
                      mx[:40], with_kind=False))
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(0)  # the header line: calls, seconds
    return "\n\n".join(text), {"steps": steps, "tottime_ms": total, "kinds": kinds, "top_tottime": by_tt,
                                "top_cumtime": by_ct, "mxshard": mx, "header": s.getvalue().strip()}

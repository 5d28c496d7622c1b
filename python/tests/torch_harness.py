# SPDX-License-Identifier: MIT
"""The multi-process harness of the torch tests: a free port, the rank
worker loop (gloo group init, every case of a plan, a traceback per failed
case) and the parent side that starts one gloo group per world size at once
(forkserver that imported the cases once, spawn where CUDA works), collects
the results and never blocks past a deadline (children killed).

Imports torch only inside the functions: the test modules import this at
collection time, also where torch is missing (they skip)."""
import datetime
import multiprocessing as mp
import os
import queue
import socket
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
WARM_UP_VAR = "MXS_TORCH_CASES_WARM_UP"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_pythonpath():
    """PYTHONPATH for the children: the tests, the package source and this process's sys.path."""
    os.environ["PYTHONPATH"] = os.pathsep.join([HERE, os.path.dirname(HERE)] + [p for p in sys.path if p])


# ---- in a rank -------------------------------------------------------------------------

def run_rank(rank, world, port, q, plan, cases, gloo_timeout, timed=False):
    """The body of a rank: init the gloo group, run every (cid, case, kwargs) of `plan`
    (cases[case](rank, world, **kwargs)), put (world, rank, cid, "ok"|"err", result|traceback)
    on `q` per case, then (world, rank, "<done>", "ok", None) and exit without the interpreter's
    teardown. timed=True adds the case's "seconds" to its result. MXS_TEST_GLOO_TIMEOUT
    overrides gloo_timeout (seconds)."""
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)  # several ranks share few cores
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=float(os.environ.get("MXS_TEST_GLOO_TIMEOUT",
                                                                                        str(gloo_timeout)))))
    except Exception:  # noqa: BLE001
        q.put((world, rank, "<init>", "err", traceback.format_exc()))
        return
    for cid, case, kw in plan:
        try:
            t0 = time.time()
            res = cases[case](rank, world, **kw)
            if timed:
                res = dict(res or {}, seconds=time.time() - t0)
            q.put((world, rank, cid, "ok", res))
        except Exception:  # noqa: BLE001
            q.put((world, rank, cid, "err", traceback.format_exc()))
    try:
        dist.barrier()
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        pass
    q.put((world, rank, "<done>", "ok", None))
    q.close()
    q.join_thread()
    os._exit(0)  # skip the interpreter's teardown of torch (seconds on a loaded 2-core machine)


# ---- in the test process ---------------------------------------------------------------

def start_context():
    """The multiprocessing context the ranks start from. forkserver where CUDA does not work: one
    server process per test session, started by the first call, imports torch and every module
    whose worker the ranks run once (rank_preload, with the warm-ups: WARM_UP_VAR), and every rank
    of every test is forked from it (a fresh interpreter, no state of the test process: as safe as
    spawn, seconds less per rank on 2 cores). spawn where CUDA works: the warm-up initialises the
    driver, and forked children cannot."""
    import torch
    fork_ok = "forkserver" in mp.get_all_start_methods() and not torch.cuda.is_available()
    ctx = mp.get_context("forkserver" if fork_ok else "spawn")
    if fork_ok:
        # one list for the whole session: the server starts once and keeps its first preload
        ctx.set_forkserver_preload(["rank_preload"])
    child_pythonpath()
    return ctx


def start(procs):
    """Starts `procs` (the first start of a session starts the forkserver: WARM_UP_VAR set then)."""
    os.environ[WARM_UP_VAR] = "1"
    try:
        for p in procs:
            p.start()
    finally:
        del os.environ[WARM_UP_VAR]


def spawn_groups(worlds, worker, plan, preload, deadline):
    """Runs worker(rank, world, port, q, plan) in one gloo group per world size, all groups at
    once. Returns {"res": {(world, rank, cid): (status, payload)}, "hung": [(world, rank) that
    never finished], "codes": {(world, rank): exit code}, "seconds", "worlds"}; never blocks past
    `deadline` seconds. `preload`: the modules the ranks import (rank_preload.MODULES must name
    them, so that the forkserver imported them already)."""
    import rank_preload
    missing = [m for m in preload if m not in rank_preload.MODULES]
    assert not missing, f"add {missing} to rank_preload.MODULES (python/tests/rank_preload.py)"
    ctx = start_context()
    q = ctx.Queue()
    procs = {}
    for world in worlds:
        port = free_port()
        for r in range(world):
            procs[(world, r)] = ctx.Process(target=worker, args=(r, world, port, q, plan), daemon=True)
    t0 = time.time()
    start(procs.values())
    res, done = {}, set()
    want = set(procs)
    while done != want and time.time() < t0 + deadline:
        try:
            world, rank, cid, status, payload = q.get(timeout=0.5)
        except queue.Empty:
            if not any(p.is_alive() for p in procs.values()):
                break
            continue
        if cid == "<done>":
            done.add((world, rank))
        else:
            res[(world, rank, cid)] = (status, payload)
    hung, codes = [], {}  # hung: ranks that never finished their cases (one that did may take a while to exit)
    for key, p in procs.items():
        p.join(timeout=10 if key in done else 0.1)
        if p.is_alive():
            p.kill()
            p.join(timeout=5)
            if key not in done:
                hung.append(key)
        codes[key] = p.exitcode
    return {"res": res, "hung": hung, "codes": codes, "seconds": time.time() - t0, "worlds": worlds}


def case_results(results, cid, worlds=None):
    """{(world, rank): result} of case `cid` on every rank of `worlds` (default: all spawned);
    fails with every failed rank's traceback, or the ranks that gave no result."""
    out, errors = {}, []
    for w in worlds or results["worlds"]:
        for r in range(w):
            got = results["res"].get((w, r, cid))
            if got is None:
                errors.append(f"world {w} rank {r}: no result (hung or died, exit code "
                              f"{results['codes'].get((w, r))}; unfinished ranks: {results['hung']})")
            elif got[0] != "ok":
                errors.append(f"world {w} rank {r}:\n{got[1]}")
            else:
                out[(w, r)] = got[1]
    assert not errors, "\n".join(errors)
    return out


def spawn_ranks(world, target, make_args, expected, timeout, stop_on_error=False):
    """One process per rank (start_context: forked from the session's forkserver, or spawned where
    CUDA works), target(*make_args(rank, port)); each puts (rank, name, "ok"|other,
    result|traceback) on the queue, the last of make_args. Returns {(rank, name): result} once
    `expected` results came; fails with the ranks' tracebacks (the first one alone with
    stop_on_error), or names the ranks that hung (killed) or the missing results, never blocking
    past `timeout` seconds."""
    ctx = start_context()
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=target, args=make_args(r, port) + (q,)) for r in range(world)]
    start(procs)
    results, errors = {}, []
    end = time.time() + timeout
    while len(results) + len(errors) < expected and not (stop_on_error and errors) and time.time() < end:
        try:
            rank, name, status, payload = q.get(timeout=0.5)
        except queue.Empty:
            if not any(p.is_alive() for p in procs) and q.empty():
                break
            continue
        if status == "ok":
            results[(rank, name)] = payload
        else:
            errors.append(f"rank {rank}:\n{payload}")
    for p in procs:
        p.join(timeout=1 if errors else 5)
        if p.is_alive():
            p.kill()
            p.join(timeout=5)
            errors.append(f"rank process {p.pid} hung (killed)")
    assert not errors, "\n".join(errors)
    assert len(results) == expected, f"missing results (timeout or crash): got {sorted(results)}"
    return results

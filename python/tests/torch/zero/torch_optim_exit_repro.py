# SPDX-License-Identifier: MIT
"""Issue 24 item 5: does a failed ShardedOptimizer construction make the process
abort at exit ("terminate called without an active exception")?

    python3 python/tests/torch/zero/torch_optim_exit_repro.py --runs 30 [--keep]

Each run starts 2 gloo ranks (fresh interpreters). Every rank makes three
constructions fail (bucket_size differs between the ranks: PlanMismatchError
on both; a float64 parameter on rank 1: TypeError there, RemoteError on rank
0; the learning rate differs), then calls destroy_process_group() and exits
normally (no os._exit). --keep keeps the three exceptions alive until the
exit, as a user who stores an error for later would. Printed: per run any
rank whose exit code is not 0 (with the last line of its stderr), the failed
optimizers each rank still had in memory after its except blocks (a
reference cycle holding the process group), and the count of aborted runs.
Not part of the test suite (minutes); test_torch_optim*.py check the cause
(nothing left alive) in seconds."""
import argparse
import datetime
import os
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))  # python/tests/torch/zero
TESTS = os.path.dirname(os.path.dirname(HERE))  # python/tests: torch_harness


def rank_main(rank, port, keep):
    sys.path[:0] = [HERE, TESTS, os.path.dirname(TESTS)]
    import gc

    import torch
    import torch.distributed as dist

    import mxshard
    import torch_dist_cases as C
    from mxshard.torch import ShardedOptimizer
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=30))

    def adamw(g):
        return torch.optim.AdamW(g, lr=1e-3)
    cases = [(C.build_model(), adamw, 2500 + 500 * rank),
             (C.build_model(extra_dense=torch.zeros(4, dtype=torch.float64 if rank == 1 else torch.float32)),
              adamw, 2500),
             (C.build_model(), lambda g: torch.optim.SGD(g, lr=0.1 * (rank + 1)), 2500)]
    kept = []
    for m, f, bs in cases:
        try:
            ShardedOptimizer(m, f, bucket_size=bs)
            raise SystemExit("a construction that should fail did not")
        except (mxshard.PlanMismatchError, mxshard.RemoteError, TypeError) as e:
            if keep:
                kept.append(e)
    alive = sum(type(o) is ShardedOptimizer for o in gc.get_objects())
    print(f"alive {alive}", flush=True)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--keep", action="store_true", help="keep the exceptions alive until the exit")
    p.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.rank is not None:
        rank_main(a.rank, a.port, a.keep)
        return 0
    env = dict(os.environ, OMP_NUM_THREADS="1")
    aborted, alive, t0 = 0, [], time.time()
    for i in range(a.runs):
        port = free_port()
        cmd = [sys.executable, os.path.abspath(__file__), "--port", str(port)] + (["--keep"] if a.keep else [])
        procs = [subprocess.Popen(cmd + ["--rank", str(r)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for r in range(2)]
        outs = [pr.communicate(timeout=300) for pr in procs]
        bad = [(r, pr.returncode, err.strip().splitlines()[-1:] if err.strip() else [])
               for r, (pr, (_, err)) in enumerate(zip(procs, outs)) if pr.returncode != 0]
        alive += [int(line.split()[1]) for out, _ in outs for line in out.splitlines() if line.startswith("alive")]
        if bad:
            aborted += 1
            print(f"run {i + 1}: " + "; ".join(f"rank {r} exit {c} {tail}" for r, c, tail in bad), flush=True)
    print(f"failed optimizers alive after their except blocks, per rank and run: max {max(alive, default=0)} "
          f"(sum {sum(alive)} over {len(alive)})")
    print(f"aborted runs: {aborted} of {a.runs} ({time.time() - t0:.0f} s)")
    return 1 if aborted else 0


if __name__ == "__main__":
    sys.exit(main())

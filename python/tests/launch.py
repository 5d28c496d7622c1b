# SPDX-License-Identifier: MIT
"""A program the tests run as a user runs it (the examples, examples/train/train.py), in a
subprocess started now and waited for later: independent runs overlap (each is mostly interpreter
start-up and `import torch`, seconds on 2 cores). Its output goes to files, not pipes (nobody reads
a pipe while the run goes on)."""
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def user_env(**extra):
    """The environment of a user's run: this process's, the package from the source tree first on
    PYTHONPATH, one OpenMP thread unless set (several processes share few cores)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(REPO, "python") + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra)
    return env


class Launch:
    """`cmd` started in a subprocess (output into folder/name.stdout, .stderr); wait() returns
    (exit code, stdout, stderr) and kills it past `timeout` seconds; stop() kills it if it still
    runs (its test failed or was deselected before waiting)."""

    def __init__(self, cmd, folder, name, timeout=240, env=None):
        self.name, self.timeout = name, timeout
        self.files = [open(os.path.join(str(folder), f"{name}.{x}"), "w+") for x in ("stdout", "stderr")]
        self.p = subprocess.Popen([sys.executable] + [str(c) for c in cmd], env=env or user_env(),
                                  stdout=self.files[0], stderr=self.files[1])

    def wait(self):
        try:
            rc = self.p.wait(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            rc = f"killed after {self.timeout} s"
        out = []
        for f in self.files:
            f.seek(0)
            out.append(f.read())
            f.close()
        return rc, out[0], out[1]

    def stop(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()

# SPDX-License-Identifier: MIT
"""Library loading: the first mxshard call may be a CUDA one."""
import os
import subprocess
import sys

PKG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_loading_the_cuda_library_first_does_not_deadlock():
    # cuda_lib() loads the host library (for status texts) under the loader
    # lock: a fresh interpreter whose first call is cuda_lib() must finish,
    # with the library or with LibraryNotFoundError, never hang.
    code = ("import mxshard, mxshard._lib as L\n"
            "try:\n    L.cuda_lib()\n    print('loaded')\n"
            "except mxshard.LibraryNotFoundError:\n    print('not found')\n")
    env = dict(os.environ, PYTHONPATH=PKG + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() in ("loaded", "not found")

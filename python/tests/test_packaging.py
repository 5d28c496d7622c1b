# SPDX-License-Identifier: MIT
"""Packaging: one version everywhere, library_info()'s bundle fields, the
lookup of a bundled mxshard/lib/ (a copy of the package laid out the way
`pip install .` lays it out, made here without pip; scripts/test-python.sh
checks the real `pip install .`), and tools/pybuild.py (the configure-time
helper: GPU architecture names, the generated _build_info.py)."""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

import mxshard
import mxshard._lib as L

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PYBUILD = os.path.join(REPO, "tools", "pybuild.py")

sys.path.insert(0, os.path.dirname(PYBUILD))
import pybuild  # noqa: E402  (tools/pybuild.py)

sys.path.remove(os.path.dirname(PYBUILD))


def _read(*parts):
    with open(os.path.join(REPO, *parts), encoding="utf-8") as f:
        return f.read()


def test_one_version():
    meson = re.search(r"project\('mxshard',.*?version: '([^']+)'", _read("meson.build"), re.S).group(1)
    setuptools = re.search(r'^version = "([^"]+)"', _read("python", "pyproject.toml"), re.M).group(1)
    assert mxshard.__version__ == meson == setuptools
    # the root pyproject takes meson's (meson-python: dynamic version)
    root = _read("pyproject.toml")
    assert re.search(r'^dynamic = \["version"\]', root, re.M) and not re.search(r"^version =", root, re.M)
    major, minor, patch = (int(x) for x in meson.split("."))
    assert mxshard.host_version() == major * 10000 + minor * 100 + patch  # MXS_VERSION_CODE


def test_source_tree_is_not_bundled():
    if L.bundle_info() is not None:
        pytest.skip("this mxshard is a bundled install")
    i = mxshard.library_info()
    assert i["bundled"] is False
    assert i["bundled_dir"] is None and i["bundled_cuda"] is None
    assert i["bundled_sm_archs"] == [] and i["bundled_note"] == ""
    assert os.path.isfile(i["host"]) and i["host_version"] == mxshard.host_version()


def _fake_bundle(tmp_path, cuda_note):
    """A copy of the package with the host library in mxshard/lib/ and a
    _build_info.py from tools/pybuild.py info, as python/meson.build makes it."""
    pkg = tmp_path / "site" / "mxshard"
    shutil.copytree(os.path.dirname(mxshard.__file__), pkg,
                    ignore=shutil.ignore_patterns("__pycache__", "_build_info.py"))
    (pkg / "lib").mkdir()
    shutil.copyfile(mxshard.library_info()["host"], pkg / "lib" / "libmxshard_host.so")
    out = subprocess.run([sys.executable, PYBUILD, "info", f"version={mxshard.__version__}",
                          "host=libmxshard_host.so", "cuda=", "sm_archs=", f"cuda_note={cuda_note}"],
                         capture_output=True, text=True, check=True).stdout
    (pkg / "_build_info.py").write_text(out)
    return pkg


_PROBE = r"""
import json, sys, mxshard, mxshard._lib as L
i = mxshard.library_info()
i["cuda_loaded"] = L._cuda is not None
try:
    mxshard.library_info(cuda=True)
    i["cuda_error"] = None
except mxshard.LibraryNotFoundError as e:
    i["cuda_error"] = str(e)
print(json.dumps(i))
"""


def _probe(site, extra_env=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MXSHARD_") and k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)
    env["PATH"] = ""  # no pkg-config, so the lookup ends where the bundle is
    env.update(extra_env or {})
    r = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env, cwd=str(site),
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_bundled_library_found_without_environment(tmp_path):
    note = "not built: no GPU visible at configure time (test)"
    pkg = _fake_bundle(tmp_path, note)
    i = _probe(pkg.parent)
    lib = str(pkg / "lib")
    assert i["bundled"] is True and i["bundled_dir"] == lib
    assert i["host"] == os.path.join(lib, "libmxshard_host.so") and i["host_version"] == mxshard.host_version()
    assert i["bundled_cuda"] is None and i["bundled_sm_archs"] == [] and i["bundled_note"] == note
    assert i["cuda_loaded"] is False  # library_info() without cuda=True loads no CUDA library
    # (unless one is on this machine's loader path) asking for it names why none is bundled
    if i["cuda_error"] is not None:
        assert "This install bundles no CUDA library: " + note in i["cuda_error"]


def test_environment_overrides_the_bundle(tmp_path):
    pkg = _fake_bundle(tmp_path, "not built: -Dcuda=disabled")
    other = tmp_path / "other"
    other.mkdir()
    shutil.copyfile(mxshard.library_info()["host"], other / "libmxshard_host.so")
    for env in ({"MXSHARD_LIBDIR": str(other)}, {"MXSHARD_HOST_LIB": str(other / "libmxshard_host.so")}):
        i = _probe(pkg.parent, env)
        assert i["host"] == str(other / "libmxshard_host.so"), env
        assert i["bundled"] is True and i["bundled_dir"] == str(pkg / "lib")


@pytest.mark.parametrize("cap, arch", [("9.0", "90"), ("10.0", "100"), ("8.6", "86"), (" 12.0\n", "120")])
def test_sm_arch(cap, arch):
    assert pybuild.sm_arch(cap) == arch


@pytest.mark.parametrize("cap", ["", "9", "[N/A]", "9.x", "9.10", "a.0"])
def test_sm_arch_rejects(cap):
    with pytest.raises(ValueError):
        pybuild.sm_arch(cap)


def test_build_info_module():
    text = pybuild.build_info(["version=1.2.3", "host=libmxshard_host.so", "cuda=libmxshard_cuda.so",
                               "sm_archs=90,100", "cuda_note="])
    ns = {}
    exec(compile(text, "_build_info.py", "exec"), ns)
    assert ns["BUILD"] == {"version": "1.2.3", "lib_dir": "lib", "host": "libmxshard_host.so",
                           "cuda": "libmxshard_cuda.so", "sm_archs": ["90", "100"], "cuda_note": ""}
    for bad in (["version=1"], ["version=1", "host=h", "cuda=", "sm_archs=", "cuda_note=", "colour=red"]):
        with pytest.raises(SystemExit):
            pybuild.build_info(bad)

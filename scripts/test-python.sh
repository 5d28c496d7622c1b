#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The Python package's CPU tests: installs pytest and numpy from PyPI (never
# torch), builds libmxshard_host in $MXS_BUILDDIR (default build/; reused
# when configured), checks that `pip install ./python` + `import mxshard`
# work, then runs python/tests with pytest. Tests that need torch, CUDA or
# two GPUs skip with their reason (pytest -rs lists them).
#   scripts/test-python.sh              all CPU tests
#   scripts/test-python.sh -k writeback extra arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
py=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

echo "test-python: Python package mxshard (python/): CPU tests with numpy and the host library"
if ! "$py" -c 'import numpy, pytest' 2>/dev/null; then
  echo "test-python: installing pytest and numpy from PyPI"
  "$py" -m pip install -q pytest numpy
fi

builddir=${MXS_BUILDDIR:-build}
case $builddir in /*) ;; *) builddir=$root/$builddir ;; esac
if [ ! -f "$builddir/build.ninja" ]; then
  echo "test-python: configuring $builddir (host library only: -Dcuda=disabled)"
  meson setup "$builddir" -Dcuda=disabled -Dtests=disabled -Dbench=false -Ddemo=false >/dev/null
fi
echo "test-python: building libmxshard_host in $builddir"
meson compile -C "$builddir" mxshard_host >/dev/null
libdir=$builddir/src/host
[ -d "$builddir/cuda" ] && libdir=$libdir:$builddir/cuda
export MXSHARD_LIBDIR=$libdir

# pip install ./python into a scratch target, then import it from there
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -r python "$tmp/src"
rm -rf "$tmp/src/build" "$tmp/src"/*.egg-info
"$py" -m pip install -q --no-deps --target "$tmp/site" "$tmp/src" >"$tmp/pip.log" 2>&1 || {
  cat "$tmp/pip.log"; echo "test-python: FAIL: pip install ./python"; exit 1; }
(cd "$tmp" && PYTHONPATH="$tmp/site" "$py" -c \
  'import mxshard, sys; i = mxshard.library_info(); print("test-python: pip install ./python + import mxshard: OK;", "host library", i["host"], "version", i["host_version"])') || {
  echo "test-python: FAIL: import mxshard after pip install"; exit 1; }

if "$py" -c 'import torch' 2>/dev/null; then
  echo "test-python: torch found: CPU-tensor and 2-process gloo tests run"
else
  echo "test-python: torch not installed: torch, gloo and GPU tests skip (this script never installs torch)"
fi
cd python
set +e
"$py" -m pytest tests -q -rs -p no:cacheprovider "$@"
rc=$?
set -e
if [ $rc -eq 0 ]; then echo "test-python: PASS"; else echo "test-python: FAIL (pytest exit $rc)"; fi
exit $rc

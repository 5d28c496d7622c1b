#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The Python package's CPU tests: installs pytest and numpy from PyPI (never
# torch), builds libmxshard_host in $MXS_BUILDDIR (default build/; reused
# when configured), checks both installs into scratch directories:
#   - `pip install ./python` (pure Python) + `import mxshard` with
#     MXSHARD_LIBDIR pointing at the build;
#   - the one-command `pip install .` (meson-python, host library only:
#     -Dcuda=disabled) + `import mxshard` with no MXSHARD_* variable, which
#     must load the library bundled in mxshard/lib/; both installs must
#     carry the same Python files;
#   - with torch: examples/torch_sharded.py (the README's recipe) on 2 gloo
#     ranks with that install (python/tests/test_example_torch_sharded.py
#     checks its output: MXS_RECIPE_LOG);
# and runs python/tests with pytest beside those checks (their lines follow
# pytest's). Tests that need torch, CUDA or two GPUs skip with their reason
# (pytest -rs lists them).
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
if [ "${MXS_PY_BUILT:-0}" = 1 ]; then  # scripts/test.sh built it and is building the rest beside us
  echo "test-python: libmxshard_host already built in $builddir"
else
  echo "test-python: building libmxshard_host in $builddir"
  meson compile -C "$builddir" mxshard_host >/dev/null
fi
libdir=$builddir/src/host
[ -d "$builddir/cuda" ] && libdir=$libdir:$builddir/cuda
export MXSHARD_LIBDIR=$libdir

tmp=$(mktemp -d)
bg_pid=
trap '[ -z "$bg_pid" ] || kill "$bg_pid" 2>/dev/null || true; rm -rf "$tmp"' EXIT
install_rc=0
noenv=()
for v in $(compgen -e | grep '^MXSHARD_' || true); do noenv+=(-u "$v"); done
torch_ok=0   # one `import torch` (seconds on 2 cores), not one per question
[ "${MXS_PY_NO_TORCH:-0}" = 1 ] || ! "$py" -c 'import torch' 2>/dev/null || torch_ok=1
# The README recipe as a user runs it after the one install command, with the arguments of
# python/tests/test_example_torch_sharded.py, which checks this run's output (MXS_RECIPE_LOG)
# instead of running the program a second time.
recipe_args=(--device cpu --nproc 2 --steps 16 --layout swizzled)

# The install checks (a subshell: its `exit 1` ends the checks, not the script). They run beside
# pytest (below): their lines are printed after pytest's.
install_checks() (
# pip install ./python into a scratch target, then import it from there
cp -r python "$tmp/src"
rm -rf "$tmp/src/build" "$tmp/src"/*.egg-info
"$py" -m pip install -q --no-deps --target "$tmp/site" "$tmp/src" >"$tmp/pip.log" 2>&1 || {
  cat "$tmp/pip.log"; echo "test-python: FAIL: pip install ./python"; exit 1; }
(cd "$tmp" && PYTHONPATH="$tmp/site" "$py" -c \
  'import mxshard, sys; i = mxshard.library_info(); assert not i["bundled"], i; print("test-python: pip install ./python + import mxshard: OK;", "host library", i["host"], "version", i["host_version"])') || {
  echo "test-python: FAIL: import mxshard after pip install ./python"; exit 1; }

# The one command: pip install . (meson-python builds and bundles the host
# library; -Dcuda=disabled keeps it fast). Without build isolation when
# meson-python, meson and ninja are here already (no download; CI installs
# them), else pip fetches them from PyPI for the build.
t0=$SECONDS
iso=()
if "$py" -c 'import mesonpy' 2>/dev/null && command -v meson >/dev/null && command -v ninja >/dev/null; then
  iso=(--no-build-isolation)
fi
echo "test-python: pip install . (meson-python, -Dcuda=disabled${iso:+, ${iso[*]}}) into a scratch target"
"$py" -m pip install -q --no-deps "${iso[@]}" --target "$tmp/bundle" . -Csetup-args=-Dcuda=disabled \
  >"$tmp/pip-root.log" 2>&1 || {
  cat "$tmp/pip-root.log"; echo "test-python: FAIL: pip install . (repository root)"; exit 1; }
(cd "$tmp" && env "${noenv[@]}" PYTHONPATH="$tmp/bundle" "$py" -c '
import os, sys, mxshard, mxshard._lib as L
i = mxshard.library_info()
lib = os.path.join(sys.argv[1], "mxshard", "lib")
assert i["bundled"] and i["bundled_dir"] == lib, i
assert os.path.dirname(i["host"]) == lib, "host library not the bundled one: %s" % i["host"]
assert i["bundled_cuda"] is None and i["bundled_sm_archs"] == [] and "cuda=disabled" in i["bundled_note"], i
assert L._cuda is None, "library_info() loaded the CUDA library"
print("test-python: pip install . + import mxshard (no MXSHARD_* variables): OK; bundled host library", i["host"])
' "$tmp/bundle") || { echo "test-python: FAIL: import mxshard after pip install ."; exit 1; }
# both installs carry the same Python files (python/pyproject.toml lists its packages)
# (a difference fails the run after pytest)
rc=0
pyfiles() { (cd "$1" && find mxshard -name '*.py' ! -name _build_info.py | sort); }
if ! pydiff=$(diff <(pyfiles "$tmp/site") <(pyfiles "$tmp/bundle")); then
  printf '%s\n' "$pydiff" | sed 's/^/test-python:   /'
  echo "test-python: FAIL: pip install ./python (<) and pip install . (>) install different Python files"
  echo "test-python:   (a new subpackage must be listed in python/pyproject.toml's [tool.setuptools] packages)"
  rc=1
else
  echo "test-python: both installs carry the same $(pyfiles "$tmp/bundle" | wc -l) Python files"
fi
echo "test-python: pip install . check: $((SECONDS - t0)) s"
if [ "$torch_ok" = 1 ]; then
  # the installed package (bundled library, no MXSHARD_* variables), 2 gloo ranks
  t1=$SECONDS
  printf '%s\n' "${recipe_args[@]}" >"$tmp/recipe.args"
  r=0
  (cd "$tmp" && env "${noenv[@]}" PYTHONPATH="$tmp/bundle" OMP_NUM_THREADS=1 "$py" "$root/examples/torch_sharded.py" \
    "${recipe_args[@]}" >"$tmp/recipe.log" 2>&1) || r=$?
  echo "$r" >"$tmp/recipe.rc"
  if [ "$r" = 0 ] && grep -q "primaries identical on all ranks: True" "$tmp/recipe.log"; then
    echo "test-python: after pip install .: examples/torch_sharded.py on 2 gloo ranks: OK ($((SECONDS - t1)) s): $(grep '^torch_sharded: loss' "$tmp/recipe.log" | cut -c1-60)"
  else
    cat "$tmp/recipe.log"; echo "test-python: FAIL: examples/torch_sharded.py with the pip-installed package"; rc=1
  fi
fi
exit $rc
)

if [ "${MXS_PY_QUICK:-0}" = 1 ]; then
  echo "test-python: --quick: no pip-install checks (scripts/test.sh runs them)"
else
  echo "test-python: the pip-install checks run beside pytest (their lines follow pytest's)"
  ( r=0; install_checks || r=$?
    # the recipe did not run (an install check before it failed): its test must not wait for it
    [ "$torch_ok" = 0 ] || [ -f "$tmp/recipe.rc" ] ||
      echo "not run: a pip-install check before it failed (scripts/test-python.sh prints which)" >"$tmp/recipe.rc"
    exit $r ) >"$tmp/install.log" 2>&1 &
  bg_pid=$!
  if [ "$torch_ok" = 1 ]; then
    # python/tests/test_example_torch_sharded.py checks that run instead of running the program again
    export MXS_RECIPE_LOG=$tmp/recipe.log
  fi
fi

if [ "${MXS_PY_NO_TORCH:-0}" = 1 ]; then
  # scripts/test.sh --quick: torch-free even where torch is installed (an
  # import of torch raises ModuleNotFoundError, so every torch test skips)
  mkdir -p "$tmp/notorch/torch"
  echo 'raise ModuleNotFoundError("torch is disabled: scripts/test.sh --quick runs no torch test", name="torch")' >"$tmp/notorch/torch/__init__.py"
  export PYTHONPATH="$tmp/notorch${PYTHONPATH:+:$PYTHONPATH}"
  echo "test-python: --quick: torch disabled, torch and gloo tests skip"
elif [ "$torch_ok" = 1 ] && [ -z "$bg_pid" ]; then
  echo "test-python: torch found: CPU-tensor and 2-process gloo tests run (no pip-install recipe check: MXS_PY_QUICK)"
elif [ "$torch_ok" = 1 ]; then
  echo "test-python: torch found: CPU-tensor and 2-process gloo tests run; examples/torch_sharded.py runs with the pip-installed package (the README's recipe) beside pytest, and test_example_torch_sharded.py checks that run"
else
  echo "test-python: torch not installed: torch, gloo and GPU tests skip, each saying why (this script never installs torch: python3 -m pip install 'torch==2.11.*' runs them)"
fi
cd python
set +e
"$py" -m pytest tests -q -rs -p no:cacheprovider "$@"
rc=$?
if [ -n "$bg_pid" ]; then
  wait "$bg_pid"
  install_rc=$?
  bg_pid=
  cat "$tmp/install.log"
fi
set -e
if [ $rc -ne 0 ]; then echo "test-python: FAIL (pytest exit $rc)"
elif [ $install_rc -ne 0 ]; then rc=1; echo "test-python: FAIL (the install checks above)"
else echo "test-python: PASS"; fi
exit $rc

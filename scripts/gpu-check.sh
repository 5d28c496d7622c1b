#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# One command for the GPU machine: configure + build (release, all cores),
# run the cuda and nccl suites, run the benchmark, run the demo on the GPU if
# it can. Everything is teed to ${OUT:-/tmp}/gpu-check.log, the benchmark
# table to ${OUT:-/tmp}/bench.md. Exit status nonzero on any failure.
set -uo pipefail
cd "$(dirname "$0")/.."
# meson, ninja and python3 come from PATH, or from the virtual environment
# MXS_VENV names (e.g. MXS_VENV=/opt/torch/.venv), or the active $VIRTUAL_ENV.
venv=${MXS_VENV:-${VIRTUAL_ENV:-}}
if [ -n "$venv" ]; then export PATH="$venv/bin:$PATH"; fi
export PATH=$PATH:/usr/local/cuda/bin NCCL_NVLS_ENABLE=0
if ! command -v meson >/dev/null; then
  echo "gpu-check: no meson on PATH; set MXS_VENV to a virtual environment that has meson and ninja" >&2
  exit 1
fi
out=${OUT:-/tmp}
mkdir -p "$out"
log=$out/gpu-check.log
: > "$log"
builddir=${MXS_GPU_BUILDDIR:-build-gpu}
status=0

step() { # step NAME CMD...: run, tee, remember failure
  local name=$1; shift
  echo "=== $name: $*" | tee -a "$log"
  local t0=$SECONDS
  "$@" 2>&1 | tee -a "$log"
  local rc=${PIPESTATUS[0]}
  echo "=== $name: rc=$rc ($((SECONDS - t0)) s)" | tee -a "$log"
  [ "$rc" -eq 0 ] || [ "$rc" -eq 77 ] || status=1  # 77: skipped
  return "$rc"
}

{ date -u; nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv 2>&1; } | tee -a "$log"

if [ -f "$builddir/build.ninja" ]; then
  step configure meson setup --reconfigure "$builddir" -Dcuda=enabled -Dnccl=auto -Dtests=auto --buildtype=release || exit 1
else
  step configure meson setup "$builddir" -Dcuda=enabled -Dnccl=auto -Dtests=auto --buildtype=release || exit 1
fi
if ! step build meson compile -C "$builddir" -j "$(nproc)"; then
  # keep going with whatever builds, so one broken target does not hide the rest
  step build-keep-going ninja -C "$builddir" -k 0 -j "$(nproc)"
fi

suites=(--suite cuda)
if meson test -C "$builddir" --list 2>/dev/null | grep -q 'nccl'; then suites+=(--suite nccl); fi
step tests meson test -C "$builddir" "${suites[@]}" --print-errorlogs --num-processes 1 --no-rebuild

if [ -x "$builddir/bench/cuda_bench" ]; then
  MXS_BENCH_MD="$out/bench.md" step bench "$builddir/bench/cuda_bench"
fi

demo=$builddir/tools/mxshard-demo
if [ -x "$demo" ] && "$demo" --help 2>&1 | grep -q -- '--device'; then
  step demo "$demo" --device cuda --hidden 4096
fi

echo "=== gpu-check: $([ $status -eq 0 ] && echo PASS || echo FAIL)" | tee -a "$log"
exit $status

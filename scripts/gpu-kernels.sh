#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The kernel layer on one GPU (issue 9): build with -Dsm_archs=90, run the
# cuda suite (and the nccl suite, which skips below 2 GPUs), then run every
# cuda test binary but test_big under compute-sanitizer memcheck and
# racecheck, and print a summary. Everything is teed to
# ${OUT:-/tmp}/gpu-kernels.log. Exit status nonzero on any failure.
#
#   scripts/gpu-kernels.sh                 # build dir: build-kernels
#   MXS_KERNELS_BUILDDIR=dir scripts/gpu-kernels.sh
#   MXS_KERNELS_BENCH=1 scripts/gpu-kernels.sh   # also run bench/cuda_bench
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0
out=${OUT:-/tmp}
mkdir -p "$out"
log=$out/gpu-kernels.log
: > "$log"
builddir=${MXS_KERNELS_BUILDDIR:-build-kernels}
declare -a summary=()
status=0

step() { # step NAME CMD...: run, tee, record the verdict
  local name=$1; shift
  echo "=== $name: $*" | tee -a "$log"
  local t0=$SECONDS
  "$@" 2>&1 | tee -a "$log"
  local rc=${PIPESTATUS[0]} verdict
  case $rc in 0) verdict=PASS ;; 77) verdict=SKIP ;; *) verdict="FAIL (rc=$rc)"; status=1 ;; esac
  echo "=== $name: $verdict ($((SECONDS - t0)) s)" | tee -a "$log"
  summary+=("$(printf '%-40s %s (%d s)' "$name" "$verdict" $((SECONDS - t0)))")
  return "$rc"
}

{ date -u; nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv 2>&1; git log --oneline -1 2>&1; } | tee -a "$log"

if [ -f "$builddir/build.ninja" ]; then
  step configure meson setup --reconfigure "$builddir" -Dcuda=enabled -Dnccl=auto -Dtests=auto -Dsm_archs=90 --buildtype=release
else
  step configure meson setup "$builddir" -Dcuda=enabled -Dnccl=auto -Dtests=auto -Dsm_archs=90 --buildtype=release
fi || { echo "configure failed" | tee -a "$log"; exit 1; }
# keep going past a broken target so that one failure does not hide the rest
step build ninja -C "$builddir" -k 0 -j "$(nproc)"

step suite-cuda meson test -C "$builddir" --suite cuda --print-errorlogs --num-processes 1 --no-rebuild
if meson test -C "$builddir" --list 2>/dev/null | grep -q 'nccl'; then
  step suite-nccl meson test -C "$builddir" --suite nccl --print-errorlogs --num-processes 1 --no-rebuild
fi

# compute-sanitizer over the cuda binaries (test_big: 2.1e9 elements, far
# too slow under the sanitizer; it runs in the suite above)
if command -v compute-sanitizer > /dev/null; then
  for exe in "$builddir"/tests/cuda/test_cuda_*; do
    [ -x "$exe" ] && [ -f "$exe" ] || continue
    name=$(basename "$exe")
    [ "$name" = test_cuda_big ] && continue
    for tool in memcheck racecheck; do
      # MXS_SANITIZER: test_bucket skips its deliberately failed launch
      step "$tool $name" env MXS_SANITIZER=1 compute-sanitizer --tool "$tool" --error-exitcode 99 "$exe"
    done
  done
else
  echo "compute-sanitizer not found" | tee -a "$log"
  summary+=("compute-sanitizer                        MISSING")
  status=1
fi

if [ "${MXS_KERNELS_BENCH:-0}" = 1 ] && [ -x "$builddir/bench/cuda_bench" ]; then
  MXS_BENCH_MD="$out/bench.md" step bench "$builddir/bench/cuda_bench"
fi

{
  echo
  echo "==== gpu-kernels summary ===="
  printf '%s\n' "${summary[@]}"
  echo "==== gpu-kernels: $([ $status -eq 0 ] && echo PASS || echo FAIL) (log: $log)"
} | tee -a "$log"
exit $status

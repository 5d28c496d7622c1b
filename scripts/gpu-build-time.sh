#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The CUDA library's build time on the GPU machine (issue 36), then the checks
# that what it built still runs there, in one device call:
#   1. configure ${MXS_BUILDTIME_DIR:-build-gpu} (-Dsm_archs=90, release, the
#      cuda tests - the cpu suite needs Criterion, which that machine lacks -
#      no NCCL glue), from scratch
#   2. time `meson compile mxshard_host mxshard_cuda` with -j $(nproc): the
#      wall time, and each translation unit's from .ninja_log, slowest first
#      -> $OUT/tu-times.txt
#      With MXS_BUILDTIME_SOLO=1 the slowest unit is then compiled again
#      alone, with nvcc --time (-> $OUT/solo-time.csv): the floor of the
#      build's wall time on any number of cores
#   3. one line per kernel of the library's machine code (scripts/sass-digest.py)
#      -> $OUT/sass-digest.txt: compare with a build made elsewhere with
#      `scripts/sass-digest.py --diff`
#   4. build the cuda tests and bench/cuda_bench; meson test --suite cuda
#   5. compute-sanitizer memcheck and racecheck on the writeback test binaries
#   6. bench/cuda_bench --cases dp1,dp8 on two shapes -> $OUT/bench.md: a
#      sanity number for the kernels, not a tuning run
# Everything printed goes to $OUT/build-time.log; `meson test`'s log to
# $OUT/testlog.txt. Steps 4-6 can be skipped: MXS_BUILDTIME_ONLY=1; extra
# meson options: MXS_BUILDTIME_ARGS (e.g. -Dgpu_code=check for a dry run of
# this script on a machine without a GPU).
# Exit status nonzero if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
log=${OUT:-/tmp}/build-time.log
. scripts/gpu-env.sh # PATH, NCCL_NVLS_ENABLE=0, step, summary, status
b=${MXS_BUILDTIME_DIR:-build-gpu}
jobs=$(nproc)

{ date -u; nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv 2>&1; nvcc --version | tail -2
  echo "cores: $jobs"; lscpu 2>/dev/null | grep -E '^(Model name|Thread|Core|Socket)'; git log -1 --format='commit %H %s' 2>/dev/null; git status --short 2>/dev/null | head -30
} | tee -a "$log"

rm -rf "$b"
# shellcheck disable=SC2086
step configure meson setup "$b" -Dsm_archs=90 -Dtests=auto -Dcuda=enabled -Dnccl=disabled \
  --buildtype=release ${MXS_BUILDTIME_ARGS:-} || exit 1
t0=$(date +%s.%N)
step lib-build meson compile -C "$b" -j "$jobs" mxshard_host mxshard_cuda
t1=$(date +%s.%N)
wall=$(python3 -c "print(f'{$t1 - $t0:.1f}')")
# .ninja_log: start ms, end ms, mtime, output, command hash (one line per output)
{
  echo "meson compile mxshard_host mxshard_cuda, -j $jobs: wall $wall s"
  echo "per output (s), slowest first:"
  awk -F'\t' '!/^#/ { printf "%8.1f  %s\n", ($2 - $1) / 1000, $4 }' "$b/.ninja_log" | sort -rn
} | tee "$out/tu-times.txt" | tee -a "$log"

if [ "${MXS_BUILDTIME_SOLO:-0}" = 1 ]; then
  slowest=$(awk -F'\t' '!/^#/ && $4 ~ /\.cu\.o$/ { print $2 - $1, $4 }' "$b/.ninja_log" | sort -rn | head -1 | cut -d' ' -f2)
  # shellcheck disable=SC2317
  solo() { (cd "$b" && eval "$(ninja -t commands "$slowest" | tail -1) --time '$out/solo-time.csv'"); }
  step "solo-$(basename "$slowest")" solo
fi
for lib in "$b"/cuda/libmxshard_cuda.so.*.*.*; do
  [ -f "$lib" ] && step sass-digest sh -c "python3 scripts/sass-digest.py '$lib' > '$out/sass-digest.txt'"
done

if [ "${MXS_BUILDTIME_ONLY:-0}" != 1 ]; then
  # the programs of the cuda suite (tests/cuda, examples): the ninja targets among the tests' commands
  tests=$(bash scripts/cuda-suite-programs.sh "$b")
  # shellcheck disable=SC2086
  step build-rest ninja -C "$b" -j "$jobs" $tests bench/cuda_bench
  step suite-cuda meson test -C "$b" --suite cuda --no-rebuild --print-errorlogs --num-processes 1
  cp "$b/meson-logs/testlog.txt" "$out/testlog.txt" 2>/dev/null
  for name in test_cuda_wb_paths test_cuda_bucket test_cuda_writeback test_cuda_nvfp4; do
    for tool in memcheck racecheck; do
      # MXS_SANITIZER: test_bucket skips its deliberately failed launch
      step "$tool-$name" env MXS_SANITIZER=1 timeout 120 compute-sanitizer --tool "$tool" --error-exitcode 99 \
        "$b/tests/cuda/$name"
    done
  done
  step bench timeout 180 "$b/bench/cuda_bench" --cases dp1,dp8 --shapes 8192x8192,28672x4096 --out "$out/bench.md"
fi
{
  echo "==== gpu-build-time summary (library build: $wall s on $jobs cores)"
  printf '%s\n' "${summary[@]}"
} | tee -a "$log"
exit "$status"

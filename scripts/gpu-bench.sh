#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The benchmark on the GPU machine, in one call: configure + build only what
# bench/cuda_bench needs (sm_90 machine code, release, no tests), then run it.
#   ${OUT:-/tmp}/bench.md   the tables (markdown, for bench/RESULTS.md)
#   ${OUT:-/tmp}/bench.csv  one line per measurement
#   ${OUT:-/tmp}/bench.log  everything printed (build, nvidia-smi, bench)
# Extra arguments go to cuda_bench (e.g. --shapes 8192x8192 --reps 10).
# Build dir: ${MXS_BENCH_BUILDDIR:-build-bench}. Exit status: the bench's
# (1 on an error or a failed byte check), or the failing build step's.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH NCCL_NVLS_ENABLE=0
out=${OUT:-/tmp}
mkdir -p "$out"
log=$out/bench.log
: > "$log"
builddir=${MXS_BENCH_BUILDDIR:-build-bench}

run() { # run CMD...: print it, tee its output to the log, return its status
  echo "=== $*" | tee -a "$log"
  local t0=$SECONDS
  "$@" 2>&1 | tee -a "$log"
  local rc=${PIPESTATUS[0]}
  echo "=== rc=$rc ($((SECONDS - t0)) s)" | tee -a "$log"
  return "$rc"
}

{ date -u; git log -1 --format='commit %H %s' 2>/dev/null; git status --short 2>/dev/null | head -20
  nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv 2>&1
} | tee -a "$log"

opts=(-Dsm_archs=90 -Dbench=true -Dcuda=enabled -Dnccl=disabled -Dtests=disabled --buildtype=release)
if [ -f "$builddir/build.ninja" ]; then
  run meson setup --reconfigure "$builddir" "${opts[@]}" || exit 1
else
  run meson setup "$builddir" "${opts[@]}" || exit 1
fi
run ninja -C "$builddir" bench/cuda_bench || exit 1

run timeout 600 "$builddir/bench/cuda_bench" --out "$out/bench.md" --csv "$out/bench.csv" "$@"
rc=$?
echo "=== results: $out/bench.md, $out/bench.csv, $log" | tee -a "$log"
exit $rc

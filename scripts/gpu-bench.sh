#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The benchmark on the GPU machine, in one call: configure + build only what
# the selected benches need (sm_90 machine code, release, no tests), then run
# them.
#   MXS_BENCH_PARTS="mxfp8 nvfp4" (default; comma or space separated):
#     mxfp8  bench/cuda_bench   -> ${OUT:-/tmp}/bench.md, bench.csv
#     nvfp4  bench/nvfp4_bench  -> ${OUT:-/tmp}/nvfp4.md, nvfp4.csv (builds
#            only mxs_nvfp4.cu of the library; about 20 s to build on 16
#            cores and under 80 s to run on an H200 (--budget 75 caps it):
#            MXS_BENCH_PARTS=nvfp4 scripts/gpu-bench.sh)
#   ${OUT:-/tmp}/bench.log  everything printed (build, nvidia-smi, benches)
# Extra arguments go to every selected bench (both take --shapes RxC,...
# --reps N --k K --no-graph; nvfp4_bench also --budget SECONDS).
# Build dir: ${MXS_BENCH_BUILDDIR:-build-bench}. Exit status: 0, or the first
# failing bench's (1 on an error or a failed byte check), or the failing
# build step's.
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
parts=${MXS_BENCH_PARTS:-mxfp8 nvfp4}
parts=${parts//,/ }
targets=()
for p in $parts; do
  case $p in
    mxfp8) targets+=(bench/cuda_bench) ;;
    nvfp4) targets+=(bench/nvfp4_bench) ;;
    *) echo "gpu-bench.sh: unknown part '$p' in MXS_BENCH_PARTS (want mxfp8, nvfp4)" | tee -a "$log" >&2; exit 2 ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || { echo "gpu-bench.sh: MXS_BENCH_PARTS is empty" | tee -a "$log" >&2; exit 2; }
run ninja -C "$builddir" "${targets[@]}" || exit 1

rc=0
results=()
for p in $parts; do
  case $p in
    mxfp8) run timeout 600 "$builddir/bench/cuda_bench" --out "$out/bench.md" --csv "$out/bench.csv" "$@"
           r=$?; results+=("$out/bench.md" "$out/bench.csv") ;;
    nvfp4) run timeout 300 "$builddir/bench/nvfp4_bench" --out "$out/nvfp4.md" --csv "$out/nvfp4.csv" "$@"
           r=$?; results+=("$out/nvfp4.md" "$out/nvfp4.csv") ;;
  esac
  [ "$rc" = 0 ] && rc=$r
done
echo "=== results: ${results[*]}, $log" | tee -a "$log"
exit $rc

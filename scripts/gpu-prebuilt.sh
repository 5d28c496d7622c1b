#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The kernel layer from binaries built elsewhere (this machine has nvcc but
# no GPU; the GPU machine then needs no build): the cuda suite, optionally
# compute-sanitizer, bench/cuda_bench and bench/wb_profile timings; with
# --nvfp4 the NVFP4 path instead: sanitizers on test_cuda_nvfp4 and
# bench/nvfp4_bench.
#   MXS_PREBUILT=dir scripts/gpu-prebuilt.sh [--sanitize] [--no-bench] [--nvfp4] [-- bench args]
# dir holds libmxshard_cuda.so*, test_cuda_*, cuda_bench, wb_profile,
# nvfp4_bench (see scripts/prebuild.sh). Output: ${OUT:-/tmp}/prebuilt.log,
# bench.md (nvfp4.md).
set -uo pipefail
cd "$(dirname "$0")/.."
log=${OUT:-/tmp}/prebuilt.log
. scripts/gpu-env.sh
pre=${MXS_PREBUILT:?set MXS_PREBUILT}
export LD_LIBRARY_PATH=$pre${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} MXS_VECTORS_DIR=$PWD/tests/vectors
san=0 bench=1 nv=0
while [ $# -gt 0 ]; do
  case $1 in --sanitize) san=1 ;; --no-bench) bench=0 ;; --nvfp4) nv=1 ;; --) shift; break ;; esac
  shift
done
{ date -u; nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv 2>&1; } | tee -a "$log"
for exe in "$pre"/test_cuda_*; do
  step "$(basename "$exe")" "$exe"
done
sanitized="test_cuda_wb_paths test_cuda_bucket test_cuda_writeback"
[ $nv = 1 ] && sanitized=test_cuda_nvfp4
if [ $san = 1 ]; then
  for name in $sanitized; do
    for tool in memcheck racecheck; do
      step "$tool-$name" env MXS_SANITIZER=1 compute-sanitizer --tool "$tool" --error-exitcode 99 "$pre/$name"
    done
  done
fi
if [ $bench = 1 ] && [ $nv = 1 ]; then
  step nvfp4_bench "$pre/nvfp4_bench" --out "$out/nvfp4.md" "$@"
elif [ $bench = 1 ]; then
  step cuda_bench "$pre/cuda_bench" --out "$out/bench.md" "$@"
  MXS_PREBUILT=$pre scripts/gpu-profile.sh --no-ncu > /dev/null 2>&1
  grep "^wb_profile:" "$out/profile.log" | tee -a "$log"
fi
printf '%s\n' "${summary[@]}" | tee -a "$log"
exit $status

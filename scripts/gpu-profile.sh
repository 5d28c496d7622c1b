#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Profiler evidence for the writeback kernels (issue 17): bench/wb_profile
# (one bucket configuration per line, see there) timed, then under ncu with
# the memory counters. Needs prebuilt binaries:
#   MXS_PREBUILT=dir scripts/gpu-profile.sh [--no-ncu]
# dir holds wb_profile and libmxshard_cuda.so*; output in ${OUT:-/tmp}:
# profile.log, ncu.csv (every configuration, each after a '# config N: ...' line).
set -uo pipefail
cd "$(dirname "$0")/.."
log=${OUT:-/tmp}/profile.log
. scripts/gpu-env.sh
pre=${MXS_PREBUILT:?set MXS_PREBUILT to the folder with wb_profile}
export LD_LIBRARY_PATH=$pre${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
ncu=1
[ "${1:-}" = --no-ncu ] && ncu=0
configs=(
  "--shape 8192x8192 --planes row --layout compact"
  "--shape 8192x8192 --planes both --layout compact"
  "--shape 8192x8192 --planes both --layout swizzled"
  "--shape 8192x8192 --planes row --layout compact --dp 8 --rank 3"
  "--shape 8192x8192 --planes row --layout compact --dp 8 --rank 3 --shift 13"
  "--shape 8192x8192 --planes row --layout compact --dp 8 --rank 3 --shift 13 --elem-aligned"
  "--shape 8200x8192 --weights 200 --planes row --layout compact"
  "--shape 8200x8192 --weights 200 --planes both --layout swizzled"
  "--megatron --planes both --layout swizzled --dp 8 --rank 3 --elem-aligned"
  "--megatron --planes both --layout swizzled --dp 64 --rank 3 --elem-aligned"
)
metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__grid_size,launch__occupancy_limit_registers,lts__t_sectors_op_read.sum,lts__t_sectors_op_write.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum
n=0
for c in "${configs[@]}"; do
  n=$((n + 1))
  # shellcheck disable=SC2086
  step "time-$n" "$pre/wb_profile" $c --iters 20
  if [ $ncu = 1 ] && command -v ncu > /dev/null; then
    # shellcheck disable=SC2086
    echo "# config $n: $c" >> "${OUT:-/tmp}/ncu.csv"
    ncu --clock-control none --metrics "$metrics" --csv --page raw "$pre/wb_profile" $c --iters 1 \
      >> "${OUT:-/tmp}/ncu.csv" 2>> "$log" || echo "ncu $n failed" | tee -a "$log"
  fi
done
printf '%s\n' "${summary[@]}" | tee -a "$log"
exit $status

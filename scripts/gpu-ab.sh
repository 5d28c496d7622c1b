#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A/B of the kernel layer on the GPU machine: the same bench, in the same
# call, against several prebuilt folders (scripts/prebuild.sh; a folder may
# hold only libmxshard_cuda.so* and use the bench binaries of the first).
#   scripts/gpu-ab.sh BENCH 'ARGS' NAME=DIR [NAME=DIR ...]
# BENCH: cuda_bench, nvfp4_bench or wb_profile. Each folder's run writes
# ${OUT:-/tmp}/ab-NAME.md (the bench's --out; wb_profile: its stdout), and
# ab-BENCH.log collects everything. The folders run in the order given, then
# once more in reverse (NAME-2.md), so that a drift of the machine shows.
set -uo pipefail
cd "$(dirname "$0")/.."
bench=${1:?bench} args=${2-}
shift 2
log=${OUT:-/tmp}/ab-$bench.log
. scripts/gpu-env.sh
[ $# -ge 1 ] || { echo "gpu-ab.sh: name one folder at least (NAME=DIR)" >&2; exit 2; }
first=${1#*=}
run() { # NAME DIR SUFFIX
  local exe=$2/$bench
  [ -x "$exe" ] || exe=$first/$bench
  if [ "$bench" = wb_profile ]; then
    # shellcheck disable=SC2086
    step "$1$3" env LD_LIBRARY_PATH="$2" "$exe" $args > "$out/ab-$1$3.md"
  else
    # shellcheck disable=SC2086
    step "$1$3" env LD_LIBRARY_PATH="$2" "$exe" $args --out "$out/ab-$1$3.md"
  fi
}
pairs=("$@")
for p in "${pairs[@]}"; do run "${p%%=*}" "${p#*=}" ""; done
for ((i = ${#pairs[@]} - 1; i >= 0; i--)); do p=${pairs[$i]}; run "${p%%=*}" "${p#*=}" -2; done
printf '%s\n' "${summary[@]}" | tee -a "$log"
exit $status

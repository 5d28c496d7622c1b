# SPDX-License-Identifier: MIT
# Sourced by the scripts/gpu-*.sh parts: the GPU machine's environment and one
# `step` helper. Before sourcing, set `log` (the log file); afterwards
# `status` is 1 once any step failed and `summary` holds one line per step.
#   step NAME CMD...   run CMD, tee its output to $log, record the verdict
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
out=${OUT:-/tmp}
mkdir -p "$out"
: > "$log"
status=0
declare -a summary=()
step() {
  local name=$1; shift
  echo "=== $name: $*" | tee -a "$log"
  local t0=$SECONDS
  "$@" 2>&1 | tee -a "$log"
  local rc=${PIPESTATUS[0]}
  local v=PASS
  [ "$rc" -eq 0 ] || { v="FAIL (rc=$rc)"; status=1; }
  summary+=("$(printf '%-12s %s (%d s)' "$name" "$v" $((SECONDS - t0)))")
  echo "=== $name: $v ($((SECONDS - t0)) s)" | tee -a "$log"
  return "$rc"
}

# a build folder's CUDA library (the real file, not the .p object folder), for the A/B scripts
lib_in() {
  local f
  for f in "$1"/libmxshard_cuda.so.*.*.*; do [ -f "$f" ] && { echo "$f"; return 0; }; done
  return 1
}
# copy a CUDA library (its file and soname links) into folder $2
copy_lib() {
  local f
  mkdir -p "$2"
  for f in "$1"/libmxshard_cuda.so*; do case $f in *.p) ;; *) cp -a "$f" "$2/" ;; esac; done
}

#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Everything that needs a GPU, in parts (each part builds what it needs into
# its own build dir and writes its log under ${OUT:-/tmp}):
#
#   kernels  scripts/gpu-kernels.sh  cuda + nccl suites, compute-sanitizer
#                                    memcheck + racecheck of the cuda suite
#   bench    scripts/gpu-bench.sh    bench/cuda_bench -> $OUT/bench.md (+ .csv)
#   python   scripts/gpu-python.sh   pytest on the GPU, torchrun tests (2 GPUs),
#                                    examples/torch_writeback.py
#   train    scripts/gpu-train.sh    examples/train: parity, checkpoint/reshard,
#                                    ~1B scale run, loss plot -> $OUT
#   demo     mxshard-demo --device cuda (one process per GPU over NCCL)
#
#   scripts/gpu-check.sh                         all parts (about 12 min on one H200)
#   MXS_GPU_PARTS=kernels,bench scripts/gpu-check.sh
#
# The device tool limits one command to 10 minutes: run kernels,bench,python
# in one call and train (about 3-5 min) in another. Exit status nonzero if
# any part failed.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=${MXS_VENV:-${VIRTUAL_ENV:-/opt/torch/.venv}}/bin:/usr/local/cuda/bin:$PATH
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
out=${OUT:-/tmp}
mkdir -p "$out"
parts=${MXS_GPU_PARTS:-kernels,bench,python,train,demo}
declare -a summary=()
status=0

part() { # part NAME CMD...: run one part, record its verdict
  local name=$1; shift
  case ",$parts," in *",$name,"*) ;; *) return 0 ;; esac
  echo "##### gpu-check: $name: $*"
  local t0=$SECONDS
  "$@"
  local rc=$?
  local verdict=PASS
  [ "$rc" -eq 0 ] || { verdict="FAIL (rc=$rc)"; status=1; }
  summary+=("$(printf '%-8s %s (%d s)' "$name" "$verdict" $((SECONDS - t0)))")
}

demo() {
  local b=${MXS_GPU_BUILDDIR:-build-kernels}
  [ -x "$b/tools/mxshard-demo" ] || { meson setup "$b" -Dcuda=enabled -Dtests=auto -Dsm_archs=90 >/dev/null &&
    ninja -C "$b" tools/mxshard-demo >/dev/null; } || return 1
  "$b/tools/mxshard-demo" --device cuda --hidden 4096 2>&1 | tee "$out/demo.log"
}

{ date -u; nvidia-smi --query-gpu=name,memory.total --format=csv 2>&1; } | tee "$out/gpu-check.log"
part kernels bash scripts/gpu-kernels.sh
part bench bash scripts/gpu-bench.sh
part python bash scripts/gpu-python.sh
part train bash scripts/gpu-train.sh
part demo demo

{
  echo "##### gpu-check summary"
  printf '%s\n' "${summary[@]}"
  echo "##### gpu-check: $([ $status -eq 0 ] && echo PASS || echo FAIL)"
} | tee -a "$out/gpu-check.log"
exit $status

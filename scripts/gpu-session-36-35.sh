#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# One device call for issues 36 and 35 (2026-12-06): the CUDA library's build time and checks
# (scripts/gpu-build-time.sh: build, cuda suite, compute-sanitizer, kernel bench), then
# bench/fsdp_bench.py step (a world of one over NCCL) for this tree and for the tree given in
# MXS_STEP_BASE (a folder holding python/ and bench/ of another commit), same libraries, same run.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${OUT:-/tmp}
bash scripts/gpu-build-time.sh
rc=$?
export MXSHARD_LIBDIR=$PWD/build-gpu/src/host:$PWD/build-gpu/cuda NCCL_NVLS_ENABLE=0 \
  TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
args=(step --vocab 32000 --hidden 2048 --ffn 8192 --blocks 24 --batch 4 --seq 2048 --steps ${MXS_STEP_STEPS:-8}
      --warmup 3 --variants "${MXS_STEP_VARIANTS:-fsdp-bf16,fsdp-mx-row,fsdp-nv-row}")
for tree in new ${MXS_STEP_BASE:+base}; do
  root=$PWD; [ "$tree" = base ] && root=$(cd "$MXS_STEP_BASE" && pwd)
  echo "=== fsdp_bench step: $tree ($root)"
  (cd "$root" && PYTHONPATH=$root/python timeout 200 torchrun --standalone --nproc_per_node=1 bench/fsdp_bench.py \
     "${args[@]}") > "$out/step-$tree.md" 2>&1 || { echo "step $tree failed"; rc=1; }
  tail -n 20 "$out/step-$tree.md"
done
exit $rc

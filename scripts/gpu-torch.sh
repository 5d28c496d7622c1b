#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# mxshard.torch and NVFP4 on one GPU (issues 15 and 18), one device call:
#   1. libraries: prebuilt ones from $MXS_PREBUILT (a folder with
#      libmxshard_host.so*, libmxshard_cuda.so* and test_cuda_nvfp4, built
#      elsewhere with -Dsm_archs=90) when they load here, else a meson build
#   2. tests/cuda test_cuda_nvfp4 (GPU NVFP4 == host, graphs, writeback)
#   3. pytest on the GPU: MXFP8Linear, ShardedOptimizer, NVFP4 binding, the
#      example (2 gloo ranks)
#   4. examples/torch_sharded.py on the GPU (a world of one over NCCL)
#   5. bench/torch_step.py: step() host overhead (200 parameters), backward
#      with and without the hooks, peak memory of MXFP8Linear vs nn.Linear
# Log and JSON under ${OUT:-/tmp}. Exit status nonzero on any failure.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
log=${OUT:-/tmp}/gpu-torch.log
. scripts/gpu-env.sh
{ date -u; nvidia-smi --query-gpu=name,memory.total --format=csv 2>&1; git log --oneline -1 2>&1; } | tee -a "$log"

libdir=""
pre=${MXS_PREBUILT:-}
if [ -n "$pre" ] && [ -f "$pre/libmxshard_cuda.so" ] &&
   MXSHARD_LIBDIR=$root/$pre PYTHONPATH=python python3 -c 'import mxshard; mxshard.library_info(cuda=True)' >>"$log" 2>&1; then
  libdir=$root/$pre
  nvfp4_test=$root/$pre/test_cuda_nvfp4
  echo "gpu-torch: using the prebuilt libraries in $pre" | tee -a "$log"
else
  b=${MXS_GPU_TORCH_BUILDDIR:-build-gpu-torch}
  echo "gpu-torch: building with meson in $b" | tee -a "$log"
  step build bash -c "meson setup $b -Dcuda=enabled -Dsm_archs=90 -Dtests=auto -Dbench=false -Ddemo=false >/dev/null &&
    ninja -C $b src/host/libmxshard_host.so.0.2.0 cuda/libmxshard_cuda.so.0.2.0 tests/cuda/test_cuda_nvfp4" || exit 1
  libdir=$root/$b/src/host:$root/$b/cuda
  nvfp4_test=$root/$b/tests/cuda/test_cuda_nvfp4
fi
export MXSHARD_LIBDIR=$libdir MXS_VECTORS_DIR=$root/tests/vectors

step nvfp4-cuda env LD_LIBRARY_PATH="$libdir:${LD_LIBRARY_PATH:-}" "$nvfp4_test"
step pytest bash -c "cd python && python3 -m pytest -q -rs -p no:cacheprovider tests/torch/zero/test_torch_linear.py tests/torch/zero/test_torch_optim.py \
  tests/torch/zero/test_torch_layout.py tests/test_nvfp4.py tests/test_example_torch_sharded.py tests/test_gpu.py"
step example env PYTHONPATH=python python3 examples/torch_sharded.py --device cuda --steps 200 --d 64 --hidden 1024 \
  --blocks 4 --batch 512 --bucket-size 2000000 --lr 1e-3
step bench env PYTHONPATH=python python3 bench/torch_step.py --json "$out/torch_step.json"
{
  echo "##### gpu-torch summary"
  printf '%s\n' "${summary[@]}"
  echo "##### gpu-torch: $([ $status -eq 0 ] && echo PASS || echo FAIL)"
} | tee -a "$log"
exit $status

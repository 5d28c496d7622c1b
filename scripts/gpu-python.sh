#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The Python package on the GPU machine: builds libmxshard_host and
# libmxshard_cuda (meson, -Dsm_archs=90 unless MXS_SM_ARCHS says otherwise),
# runs the whole pytest suite on one GPU (GPU-vs-host byte equality, the
# prepared bucket, 2-process gloo tests with CPU and CUDA tensors), the
# torchrun NCCL tests when there are >= 2 GPUs (they skip otherwise), and
# the example. Log: ${OUT:-/tmp}/gpu-python.log. Exit status nonzero on any
# failure. Uses the machine's Python (torch, numpy, pytest); installs nothing.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
log=${OUT:-/tmp}/gpu-python.log
. scripts/gpu-env.sh
builddir=${MXS_GPU_PY_BUILDDIR:-build-gpu-py}
archs=${MXS_SM_ARCHS:-90}

{ date -u; nvidia-smi --query-gpu=name,memory.total --format=csv 2>&1; python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'; } 2>&1 | tee -a "$log"

if [ -f "$builddir/build.ninja" ]; then
  step configure meson setup --reconfigure "$builddir" -Dcuda=enabled -Dsm_archs="$archs" -Dtests=disabled -Dbench=false -Ddemo=false || exit 1
else
  step configure meson setup "$builddir" -Dcuda=enabled -Dsm_archs="$archs" -Dtests=disabled -Dbench=false -Ddemo=false || exit 1
fi
step build meson compile -C "$builddir" -j "$(nproc)" mxshard_host mxshard_cuda || exit 1
export MXSHARD_LIBDIR=$root/$builddir/src/host:$root/$builddir/cuda
export PYTHONPATH=$root/python${PYTHONPATH:+:$PYTHONPATH}

step pytest-1gpu python3 -m pytest python/tests -q -rs -p no:cacheprovider
ngpu=$(python3 -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
if [ "$ngpu" -ge 2 ]; then
  step pytest-torchrun torchrun --standalone --nproc_per_node=2 -m pytest python/tests/test_torchrun.py -q -rs -p no:cacheprovider
  step example-2gpu torchrun --standalone --nproc_per_node=2 examples/torch_writeback.py --steps 30
else
  # one GPU: both ranks share it over gloo (test_torchrun.py switches by itself)
  step pytest-torchrun-shared-gpu torchrun --standalone --nproc_per_node=2 -m pytest python/tests/test_torchrun.py -q -rs -p no:cacheprovider
fi
step example-1gpu torchrun --standalone --nproc_per_node=1 examples/torch_writeback.py --steps 30
step example-gloo-cpu torchrun --standalone --nproc_per_node=2 examples/torch_writeback.py --device cpu --hidden 128 --layers 8 --steps 5

echo "=== gpu-python: $([ $status -eq 0 ] && echo PASS || echo FAIL)" | tee -a "$log"
exit $status

#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Issue 25 on the GPU machine, in one command: the libraries (carried, or built here), the GEMM
# tests on CUDA (python/tests/torch/gemm/test_torch_gemm.py: the kernels' up-conversion against the
# library's dequantize for every code, the paths against the exact product), then
# bench/torch_layer.py's parts. Logs and markdown under ${OUT:-/tmp}.
#
#   scripts/gpu-layer.sh [PARTS] [TEST_K]     PARTS for bench/torch_layer.py (default table)
#   MXS_PREBUILT=dir scripts/gpu-layer.sh ...  libmxshard_host.so + libmxshard_cuda.so built elsewhere
#   MXS_LAYER_TESTS=0                          skip phase A (tests + warm-up)
#   MXS_LAYER_ARGS="--apply-rule ..."          more arguments for bench/torch_layer.py
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
out=${OUT:-/tmp}
parts=${1:-table}
testk=${2:-}
t0=$SECONDS
status=0
say() { echo "=== $* ($((SECONDS - t0)) s)" | tee -a "$out/layer.log"; }
{ date -u; nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv 2>&1;
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; } 2>&1 | tee -a "$out/layer.log"

if [ -n "${MXS_PREBUILT:-}" ] && [ -f "$MXS_PREBUILT/libmxshard_cuda.so" ]; then
  lib=$(cd "$MXS_PREBUILT" && pwd)
  export MXSHARD_LIBDIR=$lib
else
  B=build-layer
  [ -f "$B/build.ninja" ] || meson setup "$B" -Dcuda=enabled -Dsm_archs=90 -Dtests=disabled -Dbench=false \
      -Ddemo=false -Dnccl=disabled -Dstrict=false --buildtype=release >> "$out/layer.log" 2>&1
  meson compile -C "$B" mxshard_host mxshard_cuda >> "$out/layer.log" 2>&1 || { say "FAIL: build"; exit 1; }
  export MXSHARD_LIBDIR=$PWD/$B/src/host:$PWD/$B/cuda
fi
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
python3 -c 'import mxshard; print(mxshard.library_info(cuda=True))' 2>&1 | tee -a "$out/layer.log"

# phase A, in parallel (Triton compiles on the host, one kernel at a time per process): the GEMM
# tests in groups, the linear modules' CUDA cases, and the bench's kernels compiled into the cache
if [ "${MXS_LAYER_TESTS:-1}" = 1 ]; then
  say "phase A: tests in parallel groups + bench warm-up"
  groups=("upconversion" "kernel_dequantize or chunks" "gemm_paths and bfloat16" "gemm_paths and float16 and not bfloat16"
          "gemm_paths and float32" "reads_exactly or fallbacks or triton or rule or wgrad or interpreter or plans or launch")
  pids=()
  for i in "${!groups[@]}"; do
    timeout ${MXS_LAYER_TEST_S:-150} python3 -m pytest python/tests/torch/gemm/test_torch_gemm.py -q -rs -p no:cacheprovider \
      --durations=3 -k "${groups[$i]}" > "$out/t$i.txt" 2>&1 &
    pids+=($!)
  done
  timeout ${MXS_LAYER_TEST_S:-150} python3 -m pytest python/tests/torch/zero/test_torch_linear.py \
    python/tests/torch/zero/test_torch_nvfp4_linear.py -q -rs -p no:cacheprovider -k cuda > "$out/t9.txt" 2>&1 &
  pids+=($!)
  timeout ${MXS_LAYER_TEST_S:-150} python3 bench/torch_layer.py --parts warm > "$out/warm.log" 2>&1 &
  wpid=$!
  for p in "${pids[@]}"; do wait "$p" || status=1; done
  wait "$wpid"
  for f in "$out"/t*.txt; do echo "---- $f"; cat "$f"; done > "$out/tests.log"; rm -f "$out"/t*.txt
  grep -E "passed|failed|error" "$out/tests.log" | tee -a "$out/layer.log"
  say "phase A done (status $status)"
fi
say "bench/torch_layer.py --parts $parts"
timeout ${MXS_LAYER_BENCH_S:-400} python3 bench/torch_layer.py --parts "$parts" --out "$out/layer.md" \
  ${MXS_LAYER_ARGS:-} 2>&1 | tee "$out/bench.log" | grep -v '^|' | tail -30
[ "${PIPESTATUS[0]}" = 0 ] || status=1
say "gpu-layer: status $status"
exit $status

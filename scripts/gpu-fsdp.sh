#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# FSDP2 with mxshard weights on the GPU machine (issue 23), in one command; logs under ${OUT:-/tmp}:
#   1. the libraries (MXS_PREBUILT=dir: carried from scripts/prebuild.sh; else built here)
#   2. the NVFP4 CUDA suite (fragments included) and compute-sanitizer memcheck of it, when the
#      prebuilt folder has test_cuda_nvfp4
#   3. the FSDP2 cases on CUDA tensors (python/tests/torch/fsdp/test_torch_fsdp.py with MXS_FSDP_DEVICE=cuda:
#      gloo groups of 1-4 processes sharing the GPUs), examples/torch_fsdp.py over NCCL with torchrun
#      (one process per GPU)
#   4. bench/fsdp_bench.py step: the ~1B model, FSDP2 BF16 against FSDP2 + mxshard (MXFP8 row, both,
#      NVFP4 row), NCCL over every GPU here
#   5. the ~1B ShardedOptimizer scale run with fp32 and with bf16 gradient buffers (docs/training.md's
#      memory table, issue 24 item 9)
#   MXS_FSDP_PARTS=cuda,tests,example,bench,train1b (default all)
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
out=${OUT:-/tmp}
parts=${MXS_FSDP_PARTS:-cuda,tests,example,bench,train1b}
t0=$SECONDS
status=0
say() { echo "=== $* ($((SECONDS - t0)) s)" | tee -a "$out/fsdp.log"; }
want() { case ",$parts," in *",$1,"*) return 0 ;; esac; return 1; }
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
{ date -u; nvidia-smi --query-gpu=name,memory.total --format=csv 2>&1; echo "GPUs: $ngpu"; } | tee -a "$out/fsdp.log"

if [ -n "${MXS_PREBUILT:-}" ] && [ -f "$MXS_PREBUILT/libmxshard_cuda.so" ]; then
  lib=$(cd "$MXS_PREBUILT" && pwd)
else
  B=build-fsdp
  [ -f "$B/build.ninja" ] || meson setup "$B" -Dcuda=enabled -Dsm_archs=90 -Dtests=disabled -Dbench=false \
      -Ddemo=false -Dnccl=disabled --buildtype=release >> "$out/fsdp.log" 2>&1
  meson compile -C "$B" mxshard_host mxshard_cuda >> "$out/fsdp.log" 2>&1 || { say "FAIL: build"; exit 1; }
  lib=$PWD/$B/src/host:$PWD/$B/cuda
fi
export MXSHARD_LIBDIR=$lib PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
python3 -c 'import mxshard; print(mxshard.library_info(cuda=True))' 2>&1 | tee -a "$out/fsdp.log"

if want cuda && [ -x "${MXS_PREBUILT:-/nonexistent}/test_cuda_nvfp4" ]; then
  say "NVFP4 CUDA suite (fragments) + memcheck"
  (cd "$MXS_PREBUILT" && LD_LIBRARY_PATH=$PWD ./test_cuda_nvfp4) > "$out/cuda-nvfp4.log" 2>&1 || { status=1; say "FAIL: test_cuda_nvfp4"; }
  tail -3 "$out/cuda-nvfp4.log" | tee -a "$out/fsdp.log"
  (cd "$MXS_PREBUILT" && LD_LIBRARY_PATH=$PWD compute-sanitizer --tool memcheck --error-exitcode 9 ./test_cuda_nvfp4) \
    > "$out/memcheck-nvfp4.log" 2>&1 || { status=1; say "FAIL: memcheck test_cuda_nvfp4"; }
  grep -E "ERROR SUMMARY" "$out/memcheck-nvfp4.log" | tee -a "$out/fsdp.log"
fi

if want tests; then
  say "FSDP2 cases on CUDA (gloo groups sharing the GPU)"
  MXS_FSDP_DEVICE=cuda timeout 420 python3 -m pytest python/tests/torch/fsdp/test_torch_fsdp.py python/tests/torch/fsdp/test_torch_fsdp_local.py \
    -q -rs -p no:cacheprovider > "$out/fsdp-tests.log" 2>&1 || { status=1; say "FAIL: FSDP2 tests on CUDA"; }
  tail -4 "$out/fsdp-tests.log" | tee -a "$out/fsdp.log"
fi

if want example; then
  n=$(( ngpu > 0 ? ngpu : 1 ))
  say "examples/torch_fsdp.py over NCCL, $n process(es)"
  for fmt in mxfp8 nvfp4; do
    timeout 240 torchrun --standalone --nproc_per_node="$n" examples/torch_fsdp.py --device cuda --steps 40 \
      --format "$fmt" --hidden 1024 > "$out/example-$fmt.log" 2>&1 || { status=1; say "FAIL: example $fmt"; }
    grep "torch_fsdp: loss" "$out/example-$fmt.log" | tee -a "$out/fsdp.log"
  done
fi

if want bench; then
  n=$(( ngpu > 0 ? ngpu : 1 ))
  say "bench/fsdp_bench.py step: ~1B model, $n GPU(s), NCCL"
  timeout 300 torchrun --standalone --nproc_per_node="$n" bench/fsdp_bench.py step --vocab 32000 --hidden 2048 \
    --ffn 8192 --blocks 24 --batch 4 --seq 2048 --steps 10 --warmup 3 \
    --variants "${MXS_FSDP_VARIANTS:-fsdp-bf16,fsdp-mx-row,fsdp-mx-both,fsdp-nv-row}" > "$out/fsdp-step.md" 2>&1 \
    || { status=1; say "FAIL: bench step"; }
  cat "$out/fsdp-step.md" | tee -a "$out/fsdp.log"
fi
if want train1b; then
  say "~1B scale run, ShardedOptimizer, fp32 and bf16 gradient buffers"
  for gd in float32 bfloat16; do
    timeout 240 python3 examples/train/train.py --config 1b --device cuda --steps 20 --warmup 5 --log-every 10 \
      --verify 0 --warm-steps 5 --lr 3e-4 --variant mxfp8 --bidir "" --grad-dtype "$gd" \
      --out-json "$out/scale-$gd.json" > "$out/train-$gd.log" 2>&1 || { status=1; say "FAIL: 1b $gd"; tail -5 "$out/train-$gd.log"; }
    python3 - "$out/scale-$gd.json" "$gd" <<'PY' 2>&1 | tee -a "$out/fsdp.log"
import json, sys
r = json.load(open(sys.argv[1]))
g = 2 ** 30
print(f"| scale_mx_rowonly grad_dtype={sys.argv[2]} | {r['mem_after_setup'] / g:.2f} | {r['mem_after_first_step'] / g:.2f} | "
      f"{r['peak_mem_train'] / g:.2f} | {r['timing_ms_median'].get('step', float('nan')):.1f} | buffers {r['buffer_bytes']} |")
PY
  done
fi
say "gpu-fsdp: $([ $status -eq 0 ] && echo PASS || echo FAIL)"
exit $status

#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# One device call for issue 35 (2026-12-06): bench/fsdp_bench.py step, a world of one over NCCL,
# every row measured in the same process as its BF16 baseline; all outputs under $OUT:
#   build  the libraries in build-gpu (configured unless build-gpu/build.ninja exists; ~105 s)
#   tests  the FSDP2 cases on CUDA tensors, test_gpu.py and the GEMM tests (pytest; ~140 s)
#   llama  the Llama-like ~1B model (16 blocks, d 2048, SwiGLU 5632, fused qkv): BF16, MXFP8 row,
#          NVFP4 row, MXFP8 both; plus cProfile of MXS35_CPROFILE (3) steps of each   -> step-llama.{md,json},
#          cprofile-llama-<variant>.{md,prof}
#   mlp    the ~1B MLP model of run 15 (24 blocks, d 2048, ffn 8192), the same variants -> step-mlp.{md,json}
#   compile  llama, each block torch.compile'd: BF16 against MXFP8 row              -> step-llama-compiled.{md,json}
#   base   llama BF16 and MXFP8 row with cProfile, the python/ of the tree in MXS_STEP_BASE (optional;
#          this tree's bench, the base's mxshard package, the same libraries)     -> step-llama-base.{md,json}
#   project  bench/fsdp_project.py over step-llama.json (and step-mlp.json) with the bytes measured on
#          the CPU (bench/results/*-bytes-*.json; skipped when missing)          -> project-*.md
# Everything under $OUT is then packed into $OUT/session-35.tgz (the step tables and the log stay beside it).
# MXS35_STAGES (default build,tests,llama,mlp,compile,base,project), MXS35_STEPS (8), MXS35_DEADLINE (540 s:
# every stage's timeout is cut to what is left of it). A failed stage does not stop the others.
# Dry run on a CPU machine: MXS35_STAGES=llama,mlp,compile MXS35_LIBDIR=<host lib dir> MXS35_ARGS="--hidden 64
# --ffn 128 --blocks 2 --heads 4 --vocab 128 --seq 32 --batch 2 --compile-backend aot_eager" with torchrun on PATH.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${OUT:-/tmp}
mkdir -p "$out"
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
export MXSHARD_LIBDIR=${MXS35_LIBDIR:-$PWD/build-gpu/src/host:$PWD/build-gpu/cuda} NCCL_NVLS_ENABLE=0 \
  TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=2
stages=${MXS35_STAGES:-build,tests,llama,mlp,compile,base,project}
steps=${MXS35_STEPS:-8}
deadline=${MXS35_DEADLINE:-540}
t0=$SECONDS
declare -A result
order=()
want() { case ",$stages," in *",$1,"*) return 0 ;; esac; return 1; }
say() { echo "=== [$((SECONDS - t0)) s] $*" | tee -a "$out/session-35.log"; }
# stage NAME TIMEOUT LOGFILE CMD...: runs CMD under timeout min(TIMEOUT, what is left of the deadline)
stage() {
  local name=$1 limit=$2 log=$3; shift 3
  local left=$((deadline - (SECONDS - t0)))
  order+=("$name")
  if [ "$left" -lt 20 ]; then result[$name]="skipped (deadline)"; say "$name: skipped, ${left} s left"; return; fi
  [ "$limit" -gt "$left" ] && limit=$left
  say "$name: start (timeout $limit s) -> $log"
  local s=$SECONDS
  timeout -k 10 "$limit" "$@" > "$log" 2>&1
  local rc=$?
  result[$name]="rc $rc, $((SECONDS - s)) s"
  [ $rc -eq 124 ] && result[$name]="TIMEOUT after $((SECONDS - s)) s"
  say "$name: ${result[$name]}"
  grep -E '^\| (variant|fsdp)|^fsdp_bench' "$log" | tail -n 12
}
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1; python3 --version; } \
  | tee -a "$out/session-35.log"

if want build; then
  build() {
    [ -f build-gpu/build.ninja ] || meson setup build-gpu -Dcuda=enabled -Dsm_archs=90 -Dtests=disabled \
      -Dbench=false -Ddemo=false --buildtype=release || return 1
    meson compile -C build-gpu mxshard_host mxshard_cuda
  }
  stage build 240 "$out/build.log" bash -c "$(declare -f build); build"
fi
# the Python package's GPU paths, before any timing: the FSDP2 cases on CUDA tensors (2-4 gloo ranks
# sharing the GPU: masters bit-identical, every gathered plane the whole-tensor quantize), GPU against
# host bytes, and the GEMM paths on the GPU
want tests && stage tests 300 "$out/tests.log" env MXS_FSDP_DEVICE=cuda PYTHONPATH="$PWD/python" python3 -m pytest \
  python/tests/torch/fsdp/test_torch_fsdp.py python/tests/test_gpu.py python/tests/torch/gemm/test_torch_gemm.py \
  -q -rs -p no:cacheprovider
tr=(torchrun --standalone --nproc_per_node=1 bench/fsdp_bench.py)
read -r -a extra <<< "${MXS35_ARGS:-}"   # appended to every step command (a later flag wins): dry runs
llama=(step --model llama --batch 4 --seq 2048 --steps "$steps" --warmup 3)
variants=fsdp-bf16,fsdp-mx-row,fsdp-nv-row,fsdp-mx-both
want llama && stage llama 130 "$out/step-llama.md" "${tr[@]}" "${llama[@]}" --variants $variants \
  --cprofile "${MXS35_CPROFILE:-3}" --cprofile-out "$out/cprofile-llama" --json "$out/step-llama.json" "${extra[@]}"
want mlp && stage mlp 100 "$out/step-mlp.md" "${tr[@]}" step --model mlp --vocab 32000 --hidden 2048 --ffn 8192 \
  --blocks 24 --batch 4 --seq 2048 --steps "$steps" --warmup 3 --variants $variants --json "$out/step-mlp.json" \
  "${extra[@]}"
want compile && stage compile 200 "$out/step-llama-compiled.md" "${tr[@]}" "${llama[@]}" --steps 6 --compile \
  --variants fsdp-bf16,fsdp-mx-row --json "$out/step-llama-compiled.json" "${extra[@]}"
if want base && [ -n "${MXS_STEP_BASE:-}" ]; then
  base=$(cd "$MXS_STEP_BASE" && pwd)
  stage base 90 "$out/step-llama-base.md" env MXS_BENCH_PYTHON="$base/python" "${tr[@]}" "${llama[@]}" \
    --variants fsdp-bf16,fsdp-mx-row --cprofile 3 --cprofile-out "$out/cprofile-llama-base" \
    --json "$out/step-llama-base.json" "${extra[@]}"
fi
if want project; then
  for m in llama mlp; do
    bytes=$(ls bench/results/*-bytes-$m-*.json 2>/dev/null | tail -n 1)
    [ -n "$bytes" ] && [ -f "$out/step-$m.json" ] || continue
    dims=(); [ $m = mlp ] && dims=(--vocab 32000 --hidden 2048 --ffn 8192 --blocks 24)
    stage "project-$m" 30 "$out/project-$m.md" python3 bench/fsdp_project.py --model $m "${dims[@]}" \
      --bytes-json "$bytes" --step-json "$out/step-$m.json" --json "$out/project-$m.json"
  done
fi
say "summary"
for s in "${order[@]}"; do printf '  %-12s %s\n' "$s" "${result[$s]}" | tee -a "$out/session-35.log"; done
for f in step-llama step-mlp step-llama-compiled step-llama-base; do
  [ -f "$out/$f.md" ] && { echo "--- $f"; grep -E '^\| (variant|fsdp)' "$out/$f.md"; }
done
# one archive of everything (the device tool brings back a few files per call)
# (packed outside $out: tar of a folder that the archive itself grows in fails "file changed as we read it")
tgz=$(mktemp -d)/session-35.tgz
(cd "$out" && tar czf "$tgz" . && mv "$tgz" . && find . -type f ! -name session-35.tgz ! -name session-35.log \
  ! -name 'step-*.md' -delete)
bad=0
for s in "${order[@]}"; do case "${result[$s]}" in "rc 0"*) ;; *) bad=1 ;; esac; done
exit $bad

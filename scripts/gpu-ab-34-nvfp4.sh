#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# One device call for issue 34's kernel change (the NVFP4 kernels place
# their block entries with the C region rule, mxs__nvfp4_wb_region +
# mxs_wb_region_entry / mxs_wb_region_block, instead of inline kr / kc
# formulas), about 7-8 minutes on a 16-core H100 / H200:
#   OUT=DIR bash scripts/gpu-ab-34-nvfp4.sh
# Stages (a failing one does not stop the others):
#   build   this tree in build-gpu (`scripts/gpu-session-36.sh --stage build`:
#           the cuda suite's programs, cuda_bench, nvfp4_bench) and the host
#           library; at the same time the baseline, a copy of this tree in
#           $MXS_AB_DIR (default /tmp/mxs-ab34) with bench/ab/nvfp4-region-base.patch
#           applied (the kernels as they were: kr / kc in the item record),
#           only its CUDA library built. ~150-200 s fresh
#   sass    scripts/sass-digest.py of both libraries: registers, stack and
#           local memory of the NVFP4 writeback kernels -> sass-{new,base}.txt
#   suite   meson test --suite cuda on this tree: every NVFP4 writeback byte
#           against the host path (random shapes, shards, blocks, layouts)
#   ab      scripts/gpu-ab.sh nvfp4_bench, new / base / base / new, the
#           default shapes and 4100x4100 (cols % 8 != 0: the thread units,
#           where mxs_wb_region_block runs) -> ab-*.md, ab-table.md
#   pytest  the FSDP2 cases on CUDA tensors, test_gpu.py and the GEMM tests
#           at this tree (MXS_FSDP_DEVICE=cuda)
# Everything lands in $OUT, packed into $OUT/ab34.tgz as well.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
log=${OUT:-/tmp}/ab34.log
. scripts/gpu-env.sh # PATH, out, step, summary, status, lib_in, copy_lib
export MXS_VECTORS_DIR=$PWD/tests/vectors
root=$PWD
b=$root/build-gpu
w=${MXS_AB_DIR:-/tmp/mxs-ab34}
patch=$root/bench/ab/nvfp4-region-base.patch
export MXS_S36_BUILD=$b root w patch
case $w in "$root" | "$root"/*) echo "MXS_AB_DIR must lie outside the tree" | tee -a "$log"; exit 2 ;; esac
{ date -u; nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv 2>&1; nvcc --version | tail -2
  echo "cores: $(nproc)"; git log -1 --format='commit %H %s' 2>/dev/null; git status --short 2>/dev/null | head -20
} | tee -a "$log"

timeout -k 5 420 bash scripts/gpu-patched-build.sh "$root" "$w" "$patch" > "$out/build-base.log" 2>&1 &
bpid=$!
step build-new timeout -k 5 420 bash scripts/gpu-session-36.sh --stage build
step build-host timeout -k 5 200 meson compile -C "$b" mxshard_host
wait "$bpid"
brc=$?
step build-base sh -c "tail -n 5 '$out/build-base.log'; exit $brc"

step suite timeout -k 5 300 meson test -C "$b" --suite cuda --no-rebuild --print-errorlogs --num-processes 1
cp "$b/meson-logs/testlog.txt" "$out/testlog-cuda.txt" 2>/dev/null

rm -rf "$w/ab"
if lib_in "$b/cuda" >/dev/null && lib_in "$w/build/cuda" >/dev/null && [ -x "$b/bench/nvfp4_bench" ]; then
  copy_lib "$b/cuda" "$w/ab/new" && cp "$b/bench/nvfp4_bench" "$w/ab/new/"
  copy_lib "$w/build/cuda" "$w/ab/base"
  for v in new base; do
    step "sass-$v" timeout 120 sh -c "python3 scripts/sass-digest.py '$(lib_in "$w/ab/$v")' > '$out/sass-$v.txt' &&
      grep -i 'nv_wb' '$out/sass-$v.txt' | head -n 30"
  done
  step ab timeout -k 5 240 env OUT="$out" bash scripts/gpu-ab.sh nvfp4_bench \
    '--shapes 8192x8192,4096x14336,4100x4100 --budget 40' new="$w/ab/new" base="$w/ab/base"
  python3 bench/ab_compare.py "$out/ab-nvfp4_bench.log" > "$out/ab-table.md" 2>&1
else
  echo "a library or bench/nvfp4_bench is missing: no A/B" | tee -a "$log"
  status=1
fi

step pytest timeout -k 10 200 env MXS_FSDP_DEVICE=cuda PYTHONPATH="$root/python" OMP_NUM_THREADS=2 \
  MXSHARD_LIBDIR="$b/src/host:$b/cuda" python3 -m pytest python/tests/torch/fsdp/test_torch_fsdp.py \
  python/tests/test_gpu.py python/tests/torch/gemm/test_torch_gemm.py -q -rs -p no:cacheprovider

{
  echo "==== gpu-ab-34-nvfp4 summary"
  printf '%s\n' "${summary[@]}"
  [ -s "$out/ab-table.md" ] && { echo "---- b2b µs, in the order run"; cat "$out/ab-table.md"; }
} | tee "$out/ab34-summary.txt" | tee -a "$log"
tar -C "$out" -czf /tmp/ab34.tgz --exclude=ab34.tgz . && mv /tmp/ab34.tgz "$out/"
exit "$status"

#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# GPU A/B for issue 36 item 3, the spills of the MXFP8 interior kernels
# (bench/ab/spills.patch), in one device call, about 5-6 minutes on a
# 16-core H100 / H200:
#   OUT=DIR bash scripts/gpu-ab-36-spills.sh
# Stages, each under its own timeout (a failing stage does not stop the
# others; the A/B and the suite need both libraries):
#   build        the baseline, this tree, in ${MXS_S36_BUILD:-build-gpu} as
#                `scripts/gpu-session-36.sh --stage build` does (the cuda
#                suite's programs, bench/cuda_bench; seconds when that folder
#                is already built), and at the same time the variant: a copy
#                of this tree in $MXS_AB_DIR/src (default /tmp/mxs-ab36-spills;
#                no build folders, no .git) with the patch applied (git apply),
#                where only the CUDA library is built ($MXS_AB_DIR/build).
#                ~150-200 s fresh
#   sass         scripts/sass-digest.py of both libraries -> sass-base.txt,
#                sass-spills.txt (registers, stack, local memory per kernel,
#                as built there). ~20 s
#   ab           scripts/gpu-ab.sh cuda_bench '--cases dp8,megatron', base then
#                spills, then in reverse: the DP=8 rank rows - aligned (kernels
#                the patch leaves alone: the control), start+13 (the masked
#                kernels with aligned loads), start+13 from an element-aligned
#                master (the element-aligned masked kernels; row-only and both
#                planes) - and the Megatron-like bucket (element-aligned,
#                masked, wide units) -> ab-*.md, ab-cuda_bench.log, and
#                ab-table.md (b2b µs side by side, bench/ab_compare.py). ~80 s
#   suite        meson test --suite cuda: the baseline's test programs on the
#                variant's library (a wrapper sets LD_LIBRARY_PATH after meson
#                has set its own; ldd checks every program first) -> every
#                byte of the variant against the host path. ~45 s
# Output in $OUT: ab36-spills.log (everything), the files above, testlog-spills.txt,
# ab36-spills-summary.txt. Exit status nonzero if any stage failed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
log=${OUT:-/tmp}/ab36-spills.log
. scripts/gpu-env.sh # PATH, out, step, summary, status, lib_in, copy_lib
export MXS_VECTORS_DIR=$PWD/tests/vectors
root=$PWD
b=${MXS_S36_BUILD:-build-gpu}
case $b in /*) ;; *) b=$root/$b ;; esac
w=${MXS_AB_DIR:-/tmp/mxs-ab36-spills}
patch=$root/bench/ab/spills.patch
export MXS_S36_BUILD=$b root w patch
case $w in "$root" | "$root"/*) echo "MXS_AB_DIR must lie outside the tree" | tee -a "$log"; exit 2 ;; esac

{ date -u; nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv 2>&1; nvcc --version | tail -2
  echo "cores: $(nproc)"; git log -1 --format='commit %H %s' 2>/dev/null; git status --short 2>/dev/null | head -20
} | tee -a "$log"

# the cuda suite on the variant's library: every program must load it
# shellcheck disable=SC2317
suite_variant() {
  local p got bad=0
  for p in $(bash scripts/cuda-suite-programs.sh "$MXS_S36_BUILD"); do
    got=$(LD_LIBRARY_PATH="$w/ab/spills" ldd "$MXS_S36_BUILD/$p" | awk '/libmxshard_cuda/ { print $3 }')
    echo "$p -> $got"
    case $got in "$w/ab/spills/"*) ;; *) bad=1 ;; esac
  done
  [ "$bad" = 0 ] || { echo "a program does not load the variant's library"; return 1; }
  meson test -C "$MXS_S36_BUILD" --suite cuda --no-rebuild --print-errorlogs --num-processes 1 \
    --wrapper "env LD_LIBRARY_PATH=$w/ab/spills"
}
export -f suite_variant

echo "=== git apply --check (this tree)" | tee -a "$log"
git apply --check "$patch" 2>&1 | tee -a "$log" # a patch that no longer applies shows here first
timeout -k 5 420 bash scripts/gpu-patched-build.sh "$root" "$w" "$patch" > "$out/build-spills.log" 2>&1 &
vpid=$!
step build-base timeout -k 5 420 bash scripts/gpu-session-36.sh --stage build
wait "$vpid"
vrc=$?
step build-spills sh -c "tail -n 5 '$out/build-spills.log'; exit $vrc"

rm -rf "$w/ab"
base_lib=$(lib_in "$b/cuda") && copy_lib "$b/cuda" "$w/ab/base" && cp "$b/bench/cuda_bench" "$w/ab/base/"
spills_lib=$(lib_in "$w/build/cuda") && copy_lib "$w/build/cuda" "$w/ab/spills"
if [ -n "${base_lib:-}" ] && [ -n "${spills_lib:-}" ] && [ -x "$w/ab/base/cuda_bench" ]; then
  for v in base spills; do
    step "sass-$v" timeout 120 sh -c "python3 scripts/sass-digest.py '$(lib_in "$w/ab/$v")' > '$out/sass-$v.txt' &&
      grep wb_interior '$out/sass-$v.txt'"
  done
  step ab timeout -k 5 300 env OUT="$out" bash scripts/gpu-ab.sh cuda_bench '--cases dp8,megatron' \
    base="$w/ab/base" spills="$w/ab/spills"
  python3 bench/ab_compare.py "$out/ab-cuda_bench.log" > "$out/ab-table.md" 2>&1
  step suite-spills timeout -k 5 300 bash -c suite_variant
  cp "$b/meson-logs/testlog.txt" "$out/testlog-spills.txt" 2>/dev/null
else
  echo "a library or bench/cuda_bench is missing: no A/B, no suite" | tee -a "$log"
  status=1
fi

{
  echo "==== gpu-ab-36-spills summary"
  printf '%s\n' "${summary[@]}"
  for v in base spills; do
    [ -f "$out/sass-$v.txt" ] && { echo "---- $v: interior kernels (sass-digest)"; grep wb_interior "$out/sass-$v.txt"; }
  done
  [ -s "$out/ab-table.md" ] && { echo "---- b2b µs, in the order run"; cat "$out/ab-table.md"; }
} | tee "$out/ab36-spills-summary.txt" | tee -a "$log"
exit "$status"

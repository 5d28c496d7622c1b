#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# End-to-end training checks (issue 12) on the GPU machine, in one command:
#   build libmxshard_cuda + libmxshard_host (sm_90 only) into a build dir, or
#   reuse one; point the Python package at them (MXSHARD_LIBDIR); then
#   examples/train/suite.py: MXFP8-vs-BF16 parity (300 steps), checkpoint /
#   reload / resume under DP=1 and DP=2, the ~1B scale run, the loss plot.
# Results: ${OUT:-/tmp}/train_summary.md, train_loss.png (+ .svg),
# train_results.json, the per-run JSON files and train.log under ${OUT}/train/.
#
#   scripts/gpu-train.sh [BUILD_DIR]          (default: build-train, or $MXS_TRAIN_BUILDDIR)
#   MXS_TRAIN_PARTS=parity,ckpt scripts/gpu-train.sh     (a subset)
#
# DP=2 runs: with fewer GPUs than ranks, the ranks share a GPU over gloo.
# Whole script: about 5 minutes on one H200 (build 1-2 min, runs ~3 min).
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:$PATH
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export PYTHONUNBUFFERED=1
out=${OUT:-/tmp}
mkdir -p "$out/train"
log=$out/train/train.log
: > "$log"
B=${1:-${MXS_TRAIN_BUILDDIR:-build-train}}
t0=$SECONDS
say() { echo "=== $*" | tee -a "$log"; }

{ date -u; nvidia-smi --query-gpu=name,memory.total --format=csv 2>&1; python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'; } 2>&1 | tee -a "$log"

# ---- build (only the two libraries the Python package loads) -------------------
hostlib="" cudalib=""
if [ ! -f "$B/build.ninja" ]; then
  say "configure $B"
  # warnings are not errors here (this build only serves the training run); if an option
  # changed name, fall back to the minimal set
  { meson setup "$B" -Dcuda=enabled -Dnccl=disabled -Dtests=disabled -Dbench=false -Dstrict=false \
      -Dsm_archs=90 --buildtype=release ||
    { rm -rf "$B"; meson setup "$B" -Dcuda=enabled -Dsm_archs=90 --buildtype=release; }; } 2>&1 |
    tail -20 | tee -a "$log"
fi
say "build libraries in $B"
# the two library targets only (tools/tests/bench are not needed); older trees: everything
{ meson compile -C "$B" mxshard_cuda mxshard_host || meson compile -C "$B" mxshard_cuda ||
  meson compile -C "$B"; } 2>&1 | tail -20 | tee -a "$log"
cudalib=$(find "$B" -name 'libmxshard_cuda.so*' -type f 2>/dev/null | head -1)
hostlib=$(find "$B" -name 'libmxshard_host.so*' -type f 2>/dev/null | head -1)
if [ -z "$hostlib" ]; then
  # the root meson.build does not build the host library (yet): compile it directly
  say "no libmxshard_host in $B: compiling src/host/mxs_host.c with cc"
  mkdir -p "$B/host-direct"
  cc -shared -fPIC -O2 -std=c11 -fvisibility=hidden -Iinclude src/host/mxs_host.c -lm \
     -o "$B/host-direct/libmxshard_host.so" 2>&1 | tee -a "$log"
  hostlib=$B/host-direct/libmxshard_host.so
fi
if [ -z "$cudalib" ]; then say "FAIL: libmxshard_cuda was not built"; exit 1; fi
export MXSHARD_LIBDIR="$(cd "$(dirname "$hostlib")" && pwd):$(cd "$(dirname "$cudalib")" && pwd)"
export MXSHARD_HOST_LIB="$(cd "$(dirname "$hostlib")" && pwd)/$(basename "$hostlib")"
export MXSHARD_CUDA_LIB="$(cd "$(dirname "$cudalib")" && pwd)/$(basename "$cudalib")"
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
say "libraries: $MXSHARD_HOST_LIB $MXSHARD_CUDA_LIB (build $((SECONDS - t0)) s)"
python3 -c 'import mxshard; print("mxshard", mxshard.__version__, mxshard.library_info(cuda=True))' 2>&1 | tee -a "$log"

# ---- the suite -----------------------------------------------------------------
ngpu=$(python3 -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
# with 2+ GPUs: the parity pair again under DP=2 over NCCL, and the scale runs at DP=2
if [ "$ngpu" -ge 2 ]; then def_parts=parity,parity2,ckpt,scale; scale_dp=2; else def_parts=parity,ckpt,scale; scale_dp=1; fi
parts=${MXS_TRAIN_PARTS:-$def_parts}
# stay inside a 10-minute command: whatever the build took comes off the suite's budget
budget=$((${MXS_TRAIN_BUDGET_S:-570} - (SECONDS - t0)))
[ "$budget" -lt 120 ] && budget=120
say "suite: $parts (budget ${budget} s)"
timeout -k 10 "$budget" python3 examples/train/suite.py --profile gpu --parts "$parts" --out "$out/train" \
  --plot "$out/train_loss.png" --budget-s $((budget - 20)) --scale-dp "${MXS_TRAIN_SCALE_DP:-$scale_dp}" 2>&1 | tee -a "$log"
rc=${PIPESTATUS[0]}
[ -f "$out/train/train_summary.md" ] && cp "$out/train/train_summary.md" "$out/train_summary.md"
[ -f "$out/train/train_results.json" ] && cp "$out/train/train_results.json" "$out/train_results.json"
# checkpoints are large and reproducible: do not send them back
rm -rf "$out/train/ckpt"
say "gpu-train: rc=$rc, $((SECONDS - t0)) s"
exit "$rc"

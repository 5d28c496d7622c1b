#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# End-to-end training checks (examples/train on mxshard.torch) on the GPU machine, in one command:
#   build libmxshard_cuda + libmxshard_host (sm_90 only) into a build dir, or reuse one; point
#   the Python package at them (MXSHARD_LIBDIR); then examples/train/suite.py: MXFP8-vs-BF16
#   parity (300 steps), checkpoint / resume under DP=1 and DP=2 (DCP, resharding), the ~1B
#   scale run, the two-panel loss plot.
# Results under ${OUT:-/tmp}: train_summary.md, train_results.json, train_loss.png (+ .svg);
# under ${OUT}/train/: the per-run JSON files, train.log, trace/<run>/collectives-rank<r>.log.
#
#   scripts/gpu-train.sh [--quick] [BUILD_DIR]      (default build dir: build-train, or $MXS_TRAIN_BUILDDIR)
#   MXS_TRAIN_PARTS=parity,ckpt scripts/gpu-train.sh     (a subset)
#   MXS_PREBUILT=dir scripts/gpu-train.sh --quick      (libmxshard_host.so + libmxshard_cuda.so built elsewhere: no build)
#
# --quick: the one-GPU reproduction in under 8 minutes including the build (suite profile
# `quick`: 300-step parity, checkpoint/resume with 40-step DP=2 runs, the ~1B runs 20 steps;
# whole script budget 450 s). Without it: profile `gpu`, budget 570 s.
# One GPU: the DP=2 runs share it over gloo. Two or more: NCCL, one GPU per rank, the parity
# pair again at DP=2, the ~1B runs at DP=2, every DP=2 resume under mp.spawn AND torchrun,
# MXS_TRAIN_PG_TIMEOUT_S=60 (a hang ends with torch's watchdog report) and per-rank
# collective traces (the stalled DP=2 resume of issue 16).
set -uo pipefail
cd "$(dirname "$0")/.."
quick=0
if [ "${1:-}" = "--quick" ]; then quick=1; shift; fi
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
if [ -n "${MXS_PREBUILT:-}" ] && [ -f "$MXS_PREBUILT/libmxshard_cuda.so" ]; then
  # libraries built elsewhere for sm_90 (carried in with the call): no build here
  say "prebuilt libraries in $MXS_PREBUILT"
  B=$MXS_PREBUILT
elif [ ! -f "$B/build.ninja" ]; then
  say "configure $B"
  # warnings are not errors here (this build only serves the training run); if an option
  # changed name, fall back to the minimal set
  { meson setup "$B" -Dcuda=enabled -Dnccl=disabled -Dtests=disabled -Dbench=false -Dstrict=false \
      -Dsm_archs=90 --buildtype=release ||
    { rm -rf "$B"; meson setup "$B" -Dcuda=enabled -Dsm_archs=90 --buildtype=release; }; } 2>&1 |
    tail -20 | tee -a "$log"
fi
if [ -z "${MXS_PREBUILT:-}" ]; then
  say "build libraries in $B"
  { meson compile -C "$B" mxshard_cuda mxshard_host || meson compile -C "$B" mxshard_cuda ||
    meson compile -C "$B"; } 2>&1 | tail -20 | tee -a "$log"
fi
cudalib=$(find "$B" -name 'libmxshard_cuda.so*' -type f 2>/dev/null | head -1)
hostlib=$(find "$B" -name 'libmxshard_host.so*' -type f 2>/dev/null | head -1)
if [ -z "$hostlib" ]; then
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
python3 -c 'import mxshard, mxshard.torch as t; print("mxshard", mxshard.__version__, mxshard.library_info(cuda=True)); print("checkpoint API:", all(hasattr(t, n) for n in ("save_checkpoint", "load_checkpoint", "export_safetensors"))); import importlib.util as u; print("safetensors (export):", u.find_spec("safetensors") is not None, "matplotlib (plot):", u.find_spec("matplotlib") is not None)' 2>&1 | tee -a "$log"

# ---- the suite -----------------------------------------------------------------
ngpu=$(python3 -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
if [ "$ngpu" -ge 2 ]; then
  def_parts=parity,ckpt,parity2,scale; scale_dp=2; launchers=mp.spawn,torchrun
  export MXS_TRAIN_PG_TIMEOUT_S=${MXS_TRAIN_PG_TIMEOUT_S:-60}
else
  def_parts=parity,ckpt,scale; scale_dp=1; launchers=mp.spawn
fi
parts=${MXS_TRAIN_PARTS:-$def_parts}
if [ "$quick" = 1 ]; then profile=quick; total=${MXS_TRAIN_BUDGET_S:-450}; else profile=gpu; total=${MXS_TRAIN_BUDGET_S:-570}; fi
# stay inside one device call: whatever the build took comes off the suite's budget
budget=$((total - (SECONDS - t0)))
[ "$budget" -lt 120 ] && budget=120
ckdir=${MXS_TRAIN_CKPT_DIR:-/tmp/mxs-train-ckpt}    # checkpoints: large and reproducible, kept out of $OUT
rm -rf "$ckdir"
say "suite: profile $profile, parts $parts, launchers ${MXS_TRAIN_LAUNCHERS:-$launchers} (budget ${budget} s)"
timeout -k 10 "$budget" python3 examples/train/suite.py --profile "$profile" --parts "$parts" --out "$out/train" \
  --plot "$out/train_loss.png" --budget-s $((budget - 15)) --scale-dp "${MXS_TRAIN_SCALE_DP:-$scale_dp}" \
  --launchers "${MXS_TRAIN_LAUNCHERS:-$launchers}" --ckpt-dir "$ckdir" 2>&1 | tee -a "$log"
rc=${PIPESTATUS[0]}
[ -f "$out/train/train_summary.md" ] && cp "$out/train/train_summary.md" "$out/train_summary.md"
[ -f "$out/train/train_results.json" ] && cp "$out/train/train_results.json" "$out/train_results.json"
rm -rf "$ckdir"
say "gpu-train: rc=$rc, $((SECONDS - t0)) s"
exit "$rc"

#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The other side of a kernel A/B on the GPU machine: a copy of tree ROOT in DIR/src (no build
# folders, no .git, no .gpu-prebuilt) with PATCH applied (GIT_CEILING_DIRECTORIES: git apply must
# not find a repository above the copy), configured in DIR/build for sm_90 (release, no tests,
# benchmarks, demo or NCCL glue; MXS_PATCHED_MESON_ARGS appends options), and its CUDA library
# alone built. Used by scripts/gpu-ab-34-nvfp4.sh and gpu-ab-36-spills.sh.
#   scripts/gpu-patched-build.sh ROOT DIR PATCH
set -uo pipefail
root=${1:?root} w=${2:?dir} patch=${3:?patch}
rm -rf "$w" && mkdir -p "$w/src" || exit 1
tar -C "$root" --exclude='./build*' --exclude=./.git --exclude=./.gpu-prebuilt -cf - . | tar -C "$w/src" -xf - ||
  exit 1
(cd "$w/src" && GIT_CEILING_DIRECTORIES=$w git apply --verbose "$patch") || exit 1
# shellcheck disable=SC2086
(cd "$w/src" && meson setup "$w/build" -Dcuda=enabled -Dsm_archs=90 -Dtests=disabled -Dbench=false \
  -Ddemo=false -Dnccl=disabled --buildtype=release ${MXS_PATCHED_MESON_ARGS:-} > "$w/setup.log") ||
  { tail -n 20 "$w/setup.log"; exit 1; }
meson compile -C "$w/build" -j "$(nproc)" mxshard_cuda

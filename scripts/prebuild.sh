#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Builds the CUDA library, the cuda test binaries, bench/cuda_bench,
# bench/wb_profile and bench/nvfp4_bench for sm_90, plus the host library
# (the Python package's GPU tests: MXSHARD_LIBDIR=OUTDIR) here and copies them into one folder for
# scripts/gpu-prebuilt.sh on the GPU machine (carry it with the device tool).
#   scripts/prebuild.sh BUILDDIR OUTDIR
set -euo pipefail
cd "$(dirname "$0")/.."
b=${1:?build dir} o=${2:?output dir}
[ -f "$b/build.ninja" ] || meson setup "$b" -Dcuda=enabled -Dsm_archs=90 -Dtests=enabled -Dbench=true -Ddemo=false --buildtype=release
ninja -C "$b" cuda/libmxshard_cuda.so.0.2.0 src/host/libmxshard_host.so.0.2.0 bench/cuda_bench bench/wb_profile bench/nvfp4_bench $(cd "$b" && ls -d tests/cuda/test_cuda_* 2>/dev/null | grep -v '\.p$' || true)
rm -rf "$o" && mkdir -p "$o"
cp -L "$b/cuda/libmxshard_cuda.so.0.2.0" "$o/"
ln -s libmxshard_cuda.so.0.2.0 "$o/libmxshard_cuda.so.0.2"
ln -s libmxshard_cuda.so.0.2 "$o/libmxshard_cuda.so"
cp -L "$b/src/host/libmxshard_host.so.0.2.0" "$o/"
ln -s libmxshard_host.so.0.2.0 "$o/libmxshard_host.so.0.2"
ln -s libmxshard_host.so.0.2 "$o/libmxshard_host.so"
cp "$b"/tests/cuda/test_cuda_* "$o/" 2>/dev/null || true
rm -rf "$o"/*.p
cp "$b/bench/cuda_bench" "$b/bench/wb_profile" "$b/bench/nvfp4_bench" "$o/"
du -sh "$o"

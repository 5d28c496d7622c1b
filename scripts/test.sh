#!/usr/bin/env bash
# Build mxshard and run its tests: installs what is missing (as root on a
# Debian machine), configures build/, runs every suite that this machine can
# run. CUDA and NCCL suites skip (exit 77) without GPUs.
#   scripts/test.sh                 all suites
#   scripts/test.sh --suite cpu     extra arguments go to `meson test`
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d /usr/local/cuda/bin ] && export PATH="$PATH:/usr/local/cuda/bin"

need=()
command -v meson >/dev/null || need+=(meson)
command -v ninja >/dev/null || need+=(ninja-build)
command -v pkg-config >/dev/null || need+=(pkg-config)
pkg-config --exists criterion 2>/dev/null || need+=(libcriterion-dev)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "test.sh: installing ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "test.sh: missing ${need[*]} (install them, or run as root on Debian)" >&2
    exit 1
  fi
fi

builddir=${MXS_BUILDDIR:-build}
if [ -f "$builddir/build.ninja" ]; then
  meson setup --reconfigure "$builddir" -Dtests=enabled --wrap-mode=nodownload >/dev/null
else
  meson setup "$builddir" -Dtests=enabled --wrap-mode=nodownload
fi
meson compile -C "$builddir"
meson test -C "$builddir" --print-errorlogs "$@"

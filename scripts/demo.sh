#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Build and run the mxshard demo (CPU, simulated data-parallel group):
# installs what is missing (as root on a Debian machine), configures
# build-demo/ without tests, CUDA or benchmarks, builds, and runs
# build-demo/tools/mxshard-demo with the arguments given.
#   scripts/demo.sh                         4 ranks, one Llama-style layer
#   scripts/demo.sh --ranks 8 --layers 2    see `scripts/demo.sh --help`
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v meson >/dev/null || need+=(meson)
command -v ninja >/dev/null || need+=(ninja-build)
command -v pkg-config >/dev/null || need+=(pkg-config)
if ! command -v cc >/dev/null && ! command -v gcc >/dev/null; then
  echo "demo.sh: no C compiler found (install gcc or clang)" >&2
  exit 1
fi
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "demo.sh: installing ${need[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "demo.sh: missing ${need[*]} (install them, or run as root on Debian)" >&2
    exit 1
  fi
fi

builddir=build-demo
opts=(-Dtests=disabled -Dcuda=disabled -Dbench=false --wrap-mode=nodownload)
# quiet when all is well; the whole log when a step fails
quietly() {
  local log
  if ! log=$("$@" 2>&1); then
    printf '%s\n' "$log" >&2
    echo "demo.sh: failed: $*" >&2
    exit 1
  fi
}
if [ -f "$builddir/build.ninja" ]; then
  quietly meson setup --reconfigure "$builddir" "${opts[@]}"
else
  quietly meson setup "$builddir" "${opts[@]}"
fi
quietly meson compile -C "$builddir" mxshard-demo
exec "$builddir/tools/mxshard-demo" "$@"

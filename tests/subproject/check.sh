#!/usr/bin/env bash
# Builds tests/subproject as a downstream meson project with this source
# tree as its subprojects/mxshard (a symlink), then runs it.
#   usage: check.sh <srcroot> <tmpdir>
set -euo pipefail
src=$(cd "${1:?usage: check.sh <srcroot> <tmpdir>}" && pwd)
tmp=${2:?usage: check.sh <srcroot> <tmpdir>}
MESON=${MESON:-meson}

rm -rf "$tmp/proj"
mkdir -p "$tmp/proj/subprojects"
cp "$src/tests/subproject/meson.build" "$src/tests/subproject/main.c" "$tmp/proj/"
ln -s "$src" "$tmp/proj/subprojects/mxshard"

set -x
"$MESON" setup "$tmp/proj/build" "$tmp/proj" --wrap-mode=nodownload --force-fallback-for=mxshard \
  -Dmxshard:cuda=disabled -Dmxshard:tests=disabled -Dmxshard:bench=false
"$MESON" compile -C "$tmp/proj/build" -j 2
"$tmp/proj/build/mxshard_consumer"

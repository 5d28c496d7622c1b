#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Installs this build into a temporary DESTDIR and builds consumers the way
# an installed user would: with pkg-config alone (no path into the source
# or build tree). Needs no GPU: the programs link, and run up to their first
# device call. TAP output.
#   usage: check.sh <srcroot> <builddir> <tmpdir>
set -uo pipefail
src=$(cd "${1:?usage: check.sh <srcroot> <builddir> <tmpdir>}" && pwd)
build=${2:?usage: check.sh <srcroot> <builddir> <tmpdir>}
tmp=${3:?usage: check.sh <srcroot> <builddir> <tmpdir>}
MESON=${MESON:-meson}
CC=${CC:-cc}
CXX=${CXX:-c++}
n=0

step() { # step DESCRIPTION CMD...: one TAP test; the command's output as comments
  local what=$1 out; shift
  n=$((n + 1))
  if out=$("$@" 2>&1); then echo "ok $n - $what"; else echo "not ok $n - $what"; fi
  [ -n "$out" ] && printf '%s\n' "$out" | sed 's/^/# /'
  return 0
}
skip() { n=$((n + 1)); echo "ok $n - $1 # SKIP $2"; }
finish() { echo "1..$n"; exit 0; }

rm -rf "$tmp"
mkdir -p "$tmp"
dest=$tmp/dest
step "meson install --destdir (into $dest)" "$MESON" install -C "$build" --no-rebuild --quiet --destdir "$dest"
pc=$(find "$dest" -name mxshard.pc -print -quit)
if [ -z "$pc" ]; then
  n=$((n + 1)); echo "not ok $n - mxshard.pc installed"; finish
fi
pcdir=$(dirname "$pc")
libdir=$(dirname "$pcdir")

# Nothing but headers, libraries, .pc files (and, from a top-level build,
# the demo program) is installed.
unexpected=$(cd "$dest" && find . -type f -o -type l | grep -v -E '/include/mxshard/[a-z0-9_]+\.h$|/lib[^/]*/(.*/)?libmxshard_[a-z]+\.(a|so[.0-9]*)$|/pkgconfig/mxshard(-[a-z]+)?\.pc$|/bin/mxshard-demo$' || true)
step "installs only headers, libraries, .pc files and bin/mxshard-demo" test -z "$unexpected"
[ -n "$unexpected" ] && printf '%s\n' "$unexpected" | sed 's/^/#   unexpected: /'

# pkg-config reads the installed .pc files, with their prefix moved into the
# DESTDIR (--define-variable=prefix=...: paths outside the prefix, such as
# the CUDA toolkit's, stay as they are). A wrapper first on PATH adds it.
export PKG_CONFIG_PATH=$pcdir PKG_CONFIG_LIBDIR=$pcdir
prefix=$(pkg-config --variable=prefix mxshard)
real_pkg_config=$(command -v pkg-config)
mkdir -p "$tmp/bin"
printf '#!/bin/sh\nexec "%s" --define-variable=prefix="%s" "$@"\n' "$real_pkg_config" "$dest$prefix" > "$tmp/bin/pkg-config"
chmod +x "$tmp/bin/pkg-config"
export PATH=$tmp/bin:$PATH
export LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
warn=(-Wall -Wextra -pedantic -Werror)

# shellcheck disable=SC2046
step "header-only consumer builds with \`pkg-config --cflags mxshard\`" \
  bash -c '"$1" -std=c99 "${@:4}" $(pkg-config --cflags mxshard) "$2/tests/consumer/consumer.c" -o "$3/consumer"' _ "$CC" "$src" "$tmp" "${warn[@]}"
step "header-only consumer runs" "$tmp/consumer"

if ! pkg-config --exists mxshard-cuda; then
  skip "CUDA consumer links with \`pkg-config --cflags --libs mxshard-cuda\`" "libmxshard_cuda is not built here (-Dcuda=disabled, or no nvcc)"
  finish
fi
step "mxshard-cuda.pc: $(pkg-config --cflags --libs mxshard-cuda | tr -s ' ')" pkg-config --exists mxshard-cuda
ex=$src/examples/cuda_quantize.c
if ls "$libdir"/libmxshard_cuda.so* >/dev/null 2>&1; then
  step "examples/cuda_quantize.c links with \`pkg-config --cflags --libs mxshard-cuda\` (shared)" \
    bash -c '"$1" -std=c11 "${@:4}" "$2" $(pkg-config --cflags --libs mxshard-cuda) -o "$3/cuda_quantize"' _ "$CC" "$ex" "$tmp" "${warn[@]}"
  step "... and as C++" \
    bash -c '"$1" -x c++ -std=c++17 "${@:4}" "$2" -x none $(pkg-config --cflags --libs mxshard-cuda) -o "$3/cuda_quantize_cxx"' _ "$CXX" "$ex" "$tmp" "${warn[@]}"
  step "... runs against the installed libmxshard_cuda.so (version check; quantize when a GPU is present)" "$tmp/cuda_quantize"
  step "... which it loads from the install" bash -c 'ldd "$1" | grep -F "$2/libmxshard_cuda.so"' _ "$tmp/cuda_quantize" "$libdir"
else
  skip "shared libmxshard_cuda" "built static only (-Ddefault_library=static)"
fi
if [ -f "$libdir/libmxshard_cuda.a" ]; then
  # static: the archive in place of -lmxshard_cuda, plus Libs.private (libstdc++)
  step "examples/cuda_quantize.c links statically (\`pkg-config --static --libs mxshard-cuda\`)" \
    bash -c 'libs=$(pkg-config --static --libs mxshard-cuda); "$1" -std=c11 "${@:5}" "$2" $(pkg-config --cflags mxshard-cuda) ${libs/-lmxshard_cuda/-Wl,-Bstatic -lmxshard_cuda -Wl,-Bdynamic} -o "$3/cuda_quantize_static" && ! ldd "$3/cuda_quantize_static" | grep -q libmxshard_cuda && "$3/cuda_quantize_static"' \
    _ "$CC" "$ex" "$tmp" "$libdir" "${warn[@]}"
else
  skip "static libmxshard_cuda" "built shared only (-Ddefault_library=shared; test.sh builds both)"
fi

if ! pkg-config --exists mxshard-nccl; then
  skip "NCCL consumer links with \`pkg-config --cflags --libs mxshard-nccl\`" "libmxshard_nccl is not built here (no NCCL found, or -Dnccl=disabled)"
  finish
fi
step "tests/install/nccl_consumer.c links with \`pkg-config --cflags --libs mxshard-nccl\`" \
  bash -c '"$1" -std=c11 "${@:4}" "$2/tests/install/nccl_consumer.c" $(pkg-config --cflags --libs mxshard-nccl) -o "$3/nccl_consumer"' _ "$CC" "$src" "$tmp" "${warn[@]}"
step "... and runs (versions of libmxshard_nccl, libmxshard_cuda and NCCL)" "$tmp/nccl_consumer"
finish

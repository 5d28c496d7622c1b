#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Builds tests/consumer/consumer.{c,cpp} the way a downstream project would:
# nothing but -I<srcroot>/include, strict warnings, C99, C11, C++11 and
# C++17; then runs each binary. When clang is installed, every public header
# (the umbrella header; cuda.h and nccl.h when their dependencies' headers
# are found: MXS_CUDA_CFLAGS) must compile clean under
# -Wreserved-identifier: no mxshard name starts with an underscore.
# TAP output.   usage: check.sh <srcroot> <tmpdir>
set -uo pipefail
src=${1:?usage: check.sh <srcroot> <tmpdir>}
tmp=${2:?usage: check.sh <srcroot> <tmpdir>}
here=$src/tests/consumer
mkdir -p "$tmp"
CC=${CC:-cc}
CXX=${CXX:-c++}
warn=(-Wall -Wextra -pedantic -Werror)
n=0 failed=0

step() { # step DESCRIPTION CMD...: one TAP test; the command's output as comments
  local what=$1 out; shift
  n=$((n + 1))
  if out=$("$@" 2>&1); then
    echo "ok $n - $what"
  else
    echo "not ok $n - $what"
    failed=1
  fi
  [ -n "$out" ] && printf '%s\n' "$out" | sed 's/^/# /'
  return 0
}
skip() { n=$((n + 1)); echo "ok $n - $1 # SKIP $2"; }

step "C99 consumer builds (-std=c99 ${warn[*]})" "$CC" -std=c99 "${warn[@]}" -I"$src/include" "$here/consumer.c" -o "$tmp/consumer_c99"
step "C11 consumer builds (-std=c11 ${warn[*]})" "$CC" -std=c11 "${warn[@]}" -I"$src/include" "$here/consumer.c" -o "$tmp/consumer_c11"
step "C++17 consumer builds" "$CXX" -std=c++17 "${warn[@]}" -I"$src/include" "$here/consumer.cpp" -o "$tmp/consumer_cxx17"
step "C++11 consumer builds" "$CXX" -std=c++11 "${warn[@]}" -I"$src/include" "$here/consumer.cpp" -o "$tmp/consumer_cxx11"
for b in consumer_c99 consumer_c11 consumer_cxx17 consumer_cxx11; do
  if [ -x "$tmp/$b" ]; then step "$b runs" "$tmp/$b"; else skip "$b runs" "did not build"; fi
done

# Reserved identifiers (C11 7.1.3): names beginning with an underscore and a
# capital letter or a second underscore, and file-scope names beginning with
# an underscore. mxshard's private names are mxs__* / MXS__* (stb's form),
# clean in C; C++ ([lex.name]) also reserves any name containing "__", so
# the check is made in C. Only -Wreserved-identifier is an error here: the
# builds above judge every other warning.
if command -v clang >/dev/null && clang -Wreserved-identifier -x c -fsyntax-only /dev/null 2>/dev/null; then
  read -r -a extra <<< "${MXS_CUDA_CFLAGS:-}"
  extra=("${extra[@]/#-I/-isystem}") # CUDA's and NCCL's own headers are not ours to judge
  for h in mxshard.h cuda.h nccl.h; do
    case $h in
      cuda.h) probe='#include <cuda_runtime_api.h>' ;;
      nccl.h) probe='#include <nccl.h>' ;;
      *) probe='' ;;
    esac
    if [ -n "$probe" ] && ! printf '%s\n' "$probe" | clang -x c -fsyntax-only "${extra[@]}" - 2>/dev/null; then
      skip "<mxshard/$h> has no reserved identifiers (clang -Wreserved-identifier)" "${probe#\#include } not found"
      continue
    fi
    step "<mxshard/$h> has no reserved identifiers (clang -std=c11 -Wreserved-identifier -Werror)" \
      bash -c 'printf "#include <mxshard/%s>\nint main(void) { return 0; }\n" "$1" > "$2/reserved.c" &&
               clang -std=c11 -Wreserved-identifier -Werror=reserved-identifier -fsyntax-only -I"$3/include" "${@:4}" "$2/reserved.c"' \
      _ "$h" "$tmp" "$src" "${extra[@]}"
  done
else
  skip "public headers have no reserved identifiers" "clang (with -Wreserved-identifier) is not installed"
fi
echo "1..$n"
exit 0

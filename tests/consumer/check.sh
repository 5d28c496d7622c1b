#!/usr/bin/env bash
# Builds tests/consumer/consumer.{c,cpp} the way a downstream project would:
# nothing but -I<srcroot>/include, strict warnings, C99, C++11 and C++17;
# then runs each binary.   usage: check.sh <srcroot> <tmpdir>
set -euo pipefail
src=${1:?usage: check.sh <srcroot> <tmpdir>}
tmp=${2:?usage: check.sh <srcroot> <tmpdir>}
here=$src/tests/consumer
mkdir -p "$tmp"
CC=${CC:-cc}
CXX=${CXX:-c++}
warn=(-Wall -Wextra -pedantic -Werror)

set -x
"$CC" -std=c99 "${warn[@]}" -I"$src/include" "$here/consumer.c" -o "$tmp/consumer_c99"
"$CXX" -std=c++17 "${warn[@]}" -I"$src/include" "$here/consumer.cpp" -o "$tmp/consumer_cxx17"
"$CXX" -std=c++11 "${warn[@]}" -I"$src/include" "$here/consumer.cpp" -o "$tmp/consumer_cxx11"
"$tmp/consumer_c99"
"$tmp/consumer_cxx17"
"$tmp/consumer_cxx11"

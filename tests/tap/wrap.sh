#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Runs one test program and hands `meson test` (protocol: 'tap') clean TAP,
# so that a skip shows its reason in meson's own output:
#   - TAP lines (ok, not ok, 1..N, # comments, Bail out!) pass through;
#   - "SKIP <reason>" (the tests/nccl launcher) becomes "1..0 # SKIP <reason>";
#   - any other line becomes a "# " comment;
#   - exit status 77 (skipped) becomes 0 after a skip plan (meson's TAP
#     protocol reads any nonzero status as an error); a program that exits
#     0 or fails without a TAP verdict gets one ("ok - ..." / "not ok - ...");
#   - a plan is added at the end when the program printed none.
# stderr is left alone.   usage: wrap.sh PROGRAM [ARGS...]
set -u
name="$(basename "${1:?usage: wrap.sh PROGRAM [ARGS...]}")${2:+ $2}"
rcfile=$(mktemp)
trap 'rm -f "$rcfile"' EXIT

plan=0 tests=0 failed=0
while IFS= read -r line || [ -n "$line" ]; do
  case $line in
    "1.."*) plan=1; printf '%s\n' "$line" ;;
    "ok"|"ok "*) tests=$((tests + 1)); printf '%s\n' "$line" ;;
    "not ok"*) tests=$((tests + 1)); failed=1; printf '%s\n' "$line" ;;
    "#"*|"Bail out!"*|"TAP version"*) printf '%s\n' "$line" ;;
    "SKIP "*) if [ "$plan" = 0 ] && [ "$tests" = 0 ]; then plan=1; printf '1..0 # SKIP %s\n' "${line#SKIP }"; else printf '# %s\n' "$line"; fi ;;
    *) printf '# %s\n' "$line" ;;
  esac
done < <("$@"; echo $? > "$rcfile")
rc=$(cat "$rcfile")

if [ "$rc" = 77 ]; then
  if [ "$plan" = 0 ] && [ "$tests" = 0 ]; then echo "1..0 # SKIP $name: exit status 77 (no reason printed)"; fi
  exit 0
fi
if [ "$rc" != 0 ] && [ "$failed" = 0 ]; then
  if [ "$rc" -gt 128 ]; then why="killed by signal $((rc - 128))"; else why="exit status $rc"; fi
  echo "not ok - $name: $why"
  tests=$((tests + 1))
elif [ "$rc" = 0 ] && [ "$tests" = 0 ] && [ "$plan" = 0 ]; then
  echo "ok - $name"
  tests=1
fi
if [ "$plan" = 0 ]; then echo "1..$tests"; fi
exit 0

#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Build mxshard and run every test this machine can run. It first says what
# it will build and run here, and why (compilers, GPUs, NCCL), installs
# what is missing (as root on a Debian machine), configures, builds, runs
# `meson test`, then scripts/test-python.sh when it exists.
#
#   scripts/test.sh                  everything: the host library and its
#                                    tests, every CUDA kernel compiled and
#                                    linked (their tests skip without a GPU,
#                                    and say so), packaging and examples
#   scripts/test.sh --quick          CPU only, under a minute on 2 cores
#                                    (-Dcuda=disabled, no benchmarks, no demo
#                                    (scripts/demo.sh builds its own); build
#                                    dir build-quick): no nvcc, no torch (the
#                                    torch tests skip even where torch is
#                                    installed), no `slow` suite (the 2^32
#                                    E2M1 sweep, the rank simulation), no
#                                    `packaging` suite, no pip-install checks
#   scripts/test.sh --suite cpu      other arguments go to `meson test`
#
# torch is never installed by this script (a multi-GB download): without it
# every torch test skips and says so (pytest -rs), and the first lines say
# how to run them (`python3 -m pip install torch`; .ci/run installs it).
#
# Environment: MXS_BUILDDIR (build dir; default build, or build-quick with
# --quick), MXS_SM_ARCHS (e.g. 90 or 90,100; default: meson_options.txt's
# sm_archs), MXS_CUDA_CODE=ptx|check (ptx: PTX alone, no ptxas, under half
# the CUDA build time; check: unoptimised PTX, the CI's compile check, a
# tenth of it), MXS_FORMAT_CHECK=auto|strict|warn (clang-format differences:
# auto fails the run with clang-format 14, the version the tree is formatted
# with, and warns with others; strict always fails; warn never does).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d /usr/local/cuda/bin ] && export PATH="$PATH:/usr/local/cuda/bin"
t_start=$SECONDS

quick=0
test_args=()
for a in "$@"; do
  case $a in
    --quick) quick=1 ;;
    -h|--help) awk 'NR > 2 && /^#/ { sub(/^# ?/, ""); print; next } NR > 2 { exit }' "$0"; exit 0 ;;
    *) test_args+=("$a") ;;
  esac
done

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

if [ "$quick" = 1 ]; then builddir=${MXS_BUILDDIR:-build-quick}; else builddir=${MXS_BUILDDIR:-build}; fi
opts=(-Dtests=enabled -Ddefault_library=both --wrap-mode=nodownload)
# --quick: CUDA off, no benchmarks, and the test programs built as in the no-GPU compile check
# (-Dgpu_code=check: -O1 unity builds, except the heavy ones; no kernel is compiled anyway)
if [ "$quick" = 1 ]; then opts+=(-Dcuda=disabled -Dbench=false -Ddemo=false -Dgpu_code=check); else opts+=(-Dcuda=auto); fi
# --quick leaves out the `slow` suite (meson test arguments given: those instead)
quick_test=()
[ "$quick" = 1 ] && [ ${#test_args[@]} -eq 0 ] && quick_test=(--no-suite slow --no-suite packaging)
if [ -n "${MXS_SM_ARCHS:-}" ]; then opts+=("-Dsm_archs=$MXS_SM_ARCHS"); fi
if [ -n "${MXS_CUDA_CODE:-}" ]; then opts+=("-Dgpu_code=$MXS_CUDA_CODE"); fi

# ---- what this machine has, and what that means -----------------------------
say() { printf 'test.sh: %s\n' "$*"; }
archs=${MXS_SM_ARCHS:-}
if [ -z "$archs" ] && [ -f "$builddir/build.ninja" ]; then
  archs=$(meson introspect --buildoptions "$builddir" 2>/dev/null |
    python3 -c 'import json,sys; print(",".join(next(o["value"] for o in json.load(sys.stdin) if o["name"] == "sm_archs")))' 2>/dev/null || true)
fi
if [ -z "$archs" ]; then
  archs=$(sed -n "/option('sm_archs'/s/.*value: *\[\([^]]*\)\].*/\1/p" meson_options.txt | tr -d "' ")
fi
gpus=0
if command -v nvidia-smi >/dev/null; then gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true); fi
gpu_note="no GPU visible ($(command -v nvidia-smi >/dev/null && echo 'nvidia-smi lists none' || echo 'no nvidia-smi'))"
[ "$gpus" -gt 0 ] && gpu_note="$gpus GPU(s): $(nvidia-smi -L 2>/dev/null | head -n 2 | sed 's/ (UUID.*//' | paste -sd ';' -)"
# Without a GPU the CUDA tests skip anyway: compile every kernel to unoptimised PTX alone for sm_90
# (-Dgpu_code=check: the front end checks all of it and it links; no NVVM optimiser, no ptxas, a
# tenth of the machine-code time: the 2-core CI's time goes to tests, not machine code) and leave
# the benchmarks (built and run by scripts/prebuild.sh and scripts/gpu-*.sh), unless MXS_SM_ARCHS /
# MXS_CUDA_CODE say otherwise. With a GPU: machine code (meson_options.txt).
if [ "$quick" = 0 ] && [ "$gpus" -eq 0 ] && [ -z "${MXS_CUDA_CODE:-}${MXS_SM_ARCHS:-}" ] && [ ! -f "$builddir/build.ninja" ]; then
  MXS_CUDA_CODE=check MXS_SM_ARCHS=90
  opts+=("-Dsm_archs=90" "-Dgpu_code=check" "-Dbench=false")  # the benchmarks run where the GPUs are
  archs=90
fi

say "build dir $builddir, meson setup ${opts[*]}"
say "host: $(cc --version 2>/dev/null | head -n 1 || echo 'no cc')"
say "cpu suite: Criterion $(pkg-config --modversion criterion 2>/dev/null || echo 'missing: the Criterion tests will not be built')"
if [ "$quick" = 1 ]; then
  say "--quick: CUDA off (-Dcuda=disabled): no kernel is compiled, no cuda/nccl suite"
elif command -v nvcc >/dev/null; then
  if [ "${MXS_CUDA_CODE:-sass}" != sass ]; then
    say "nvcc $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p') at $(command -v nvcc): every kernel is compiled (front end, PTX alone$([ "$MXS_CUDA_CODE" = check ] && echo ' without device optimisation'): MXS_CUDA_CODE=$MXS_CUDA_CODE, no ptxas) and linked for compute_${archs//,/ compute_}"
  else
    say "nvcc $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p') at $(command -v nvcc): every kernel is compiled and linked for sm_${archs//,/ sm_} (+ PTX of the last); on 2 cores this is most of the run (minutes per architecture); MXS_SM_ARCHS=90 halves it, MXS_CUDA_CODE=ptx (no ptxas) more than halves that"
  fi
  say "$gpu_note"
  if [ "$gpus" -eq 0 ]; then
    say "=> suite cuda: built and linked, its tests SKIP (no CUDA device); suite nccl: SKIP (needs 2 GPUs)"
  elif [ "$gpus" -eq 1 ]; then
    say "=> suite cuda runs on the GPU; suite nccl: SKIP (needs 2 GPUs, one process each)"
  else
    say "=> suites cuda and nccl run on the GPUs"
  fi
else
  say "no nvcc on PATH (nor in /usr/local/cuda/bin): CUDA kernels, suites cuda and nccl are not built (install the CUDA toolkit to compile them)"
fi
say "also: packaging (install to a temp dir, link with pkg-config; the meson-subproject check), examples (C and C++)"
if [ -f scripts/test-python.sh ]; then
  if [ ${#test_args[@]} -eq 0 ]; then say "then: scripts/test-python.sh (the Python package)"
  else say "not running scripts/test-python.sh: meson test arguments given (${test_args[*]})"; fi
  if [ "$quick" = 1 ]; then
    say "torch: off for --quick (its tests skip, each saying why)"
  elif tv=$(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null); then
    say "torch $tv: the torch tests (CPU tensors, 2-process gloo) run"
  else
    say "torch: not installed, so the torch tests SKIP, each saying why; this script never installs it (a multi-GB download): python3 -m pip install 'torch==2.11.*' runs them (.ci/run does)"
  fi
fi
[ "$quick" = 1 ] && say "--quick: no demo, no \`slow\` or \`packaging\` suite (meson test --no-suite slow --no-suite packaging), no pip-install checks; scripts/test.sh runs everything"

# ---- style (warning only unless MXS_FORMAT_CHECK=strict) --------------------
format_rc=0
if command -v clang-format >/dev/null && git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t srcs < <(for f in $(git ls-files '*.c' '*.h' '*.cpp' '*.cu' '*.cuh'); do [ -f "$f" ] && echo "$f"; done)
  # one clang-format process for all of them (a process per file was 5 s on 2 cores); the files
  # that differ are those its diagnostics name ("file:line:col: error: ...")
  cf_rc=0
  cf_out=$(clang-format --dry-run -Werror "${srcs[@]}" 2>&1 >/dev/null) || cf_rc=$?
  mapfile -t bad < <(printf '%s\n' "$cf_out" | sed -n 's/^\([^: ]*\):[0-9]*:[0-9]*: error: .*/\1/p' | sort -u)
  # failed without naming a file (a broken .clang-format, say): every file counts as differing
  if [ "$cf_rc" != 0 ] && [ ${#bad[@]} -eq 0 ]; then
    printf '%s\n' "$cf_out" | head -n 3 | sed 's/^/test.sh: clang-format: /'
    bad=("${srcs[@]}")
  fi
  if [ ${#bad[@]} -gt 0 ]; then
    say "clang-format: ${#bad[@]} of ${#srcs[@]} files differ from .clang-format: ${bad[*]}"
    # the tree is formatted with clang-format 14 (Debian 12's): with that
    # version a difference fails the run; other versions may format some
    # constructs differently, so there it is a warning (MXS_FORMAT_CHECK=strict
    # fails anyway, =warn never fails)
    cf_major=$(clang-format --version | sed -n 's/.*version \([0-9]*\).*/\1/p')
    say "  (clang-format -i <file> to fix; clang-format $cf_major; the tree is formatted with 14)"
    case "${MXS_FORMAT_CHECK:-auto}" in
      strict) format_rc=1 ;;
      auto) [ "$cf_major" = 14 ] && format_rc=1 ;;
    esac
  else
    say "clang-format: all ${#srcs[@]} tracked C/C++/CUDA files match .clang-format"
  fi
else
  say "clang-format: not installed (or not a git checkout), style check skipped"
fi

# ---- configure, build, test ---------------------------------------------------
t0=$SECONDS
reconf=()
[ -f "$builddir/build.ninja" ] && reconf=(--reconfigure)
if ! setup_log=$(meson setup "${reconf[@]}" "$builddir" "${opts[@]}" 2>&1); then
  printf '%s\n' "$setup_log" >&2
  say "meson setup failed"
  exit 1
fi
# meson's summary of what was found and what will be built
printf '%s\n' "$setup_log" | sed -n '/^mxshard [0-9]/,/^  User defined options/p' | sed '$d' | grep -v '^$' |
  sed 's/^/test.sh: configured: /'
say "configure: $((SECONDS - t0)) s"

# Without a GPU the Python suite needs only the host library: build it first and run
# scripts/test-python.sh beside the rest of the build and `meson test` (its output is printed
# after them); with a GPU it runs after them (its GPU tests need libmxshard_cuda).
py_bg=0
if [ -f scripts/test-python.sh ] && [ ${#test_args[@]} -eq 0 ] && [ "$gpus" -eq 0 ]; then
  t0=$SECONDS
  meson compile -C "$builddir" mxshard_host >/dev/null
  py_log=$builddir/test-python.log
  py_t0=$SECONDS
  (MXS_BUILDDIR=$builddir MXS_PY_NO_TORCH=$quick MXS_PY_QUICK=$quick MXS_PY_BUILT=1 bash scripts/test-python.sh >"$py_log" 2>&1
   echo $? >"$py_log.rc") &
  py_pid=$!
  py_bg=1
  say "host library: $((SECONDS - t0)) s; scripts/test-python.sh started beside the build (log: $py_log)"
fi

# Beside the Python suite (the longest part on 2 cores), the build and `meson test` run at a lower
# priority: they fill the cores the suite leaves idle instead of stretching it.
bg=()
[ "$py_bg" = 1 ] && command -v nice >/dev/null && bg=(nice -n 19)

# Beside them too: the `slow` suite (the 2^32 E2M1 sweep, the rank simulation: CPU-bound, a minute
# of the 2 cores) starts as soon as its programs are built, above the build's priority, instead of
# after the whole build; `meson test` after the build runs the rest (--no-suite slow) and prints
# the slow suite's results after its own.
slow_bg=0
rest_test=()
if [ "$py_bg" = 1 ] && [ "$quick" = 0 ]; then
  # the programs of the slow suite, relative to the build dir (none, or one outside it: no split)
  slow_exes=$(meson introspect --tests "$builddir" | python3 -c '
import json, os, sys
b = os.path.realpath(sys.argv[1])
out = []
for t in json.load(sys.stdin):
    if "slow" in [s.split(":")[-1] for s in t["suite"]]:
        exe = os.path.realpath(t["cmd"][0])
        if not exe.startswith(b + os.sep):
            sys.exit(0)
        out.append(os.path.relpath(exe, b))
print(" ".join(out))' "$builddir" 2>/dev/null || true)
  if [ -n "$slow_exes" ]; then
    t0=$SECONDS
    # shellcheck disable=SC2086
    "${bg[@]}" meson compile -C "$builddir" $slow_exes
    slow_log=$builddir/meson-test-slow.log
    slow_t0=$SECONDS
    slow_nice=()
    command -v nice >/dev/null && slow_nice=(nice -n 10)
    ("${slow_nice[@]}" meson test -C "$builddir" --no-rebuild --print-errorlogs --suite slow --logbase testlog-slow \
       >"$slow_log" 2>&1
     echo $? >"$slow_log.rc") &
    slow_pid=$!
    slow_bg=1
    rest_test=(--no-suite slow)
    say "suite slow: built in $((SECONDS - t0)) s; its tests started beside the build (log: $slow_log)"
  fi
fi

t0=$SECONDS
"${bg[@]}" meson compile -C "$builddir"
say "build: $((SECONDS - t0)) s"

t0=$SECONDS
rc=0
"${bg[@]}" meson test -C "$builddir" --print-errorlogs "${quick_test[@]}" "${rest_test[@]}" "${test_args[@]}" || rc=$?
say "meson test$([ "$slow_bg" = 1 ] && echo ' --no-suite slow'): $((SECONDS - t0)) s (exit $rc)"
if [ "$slow_bg" = 1 ]; then
  wait "$slow_pid" || true
  cat "$slow_log"
  slow_rc=$(cat "$slow_log.rc" 2>/dev/null || echo 1)
  [ "$slow_rc" = 0 ] || rc=1
  say "meson test --suite slow (beside the build): $((SECONDS - slow_t0)) s (exit $slow_rc)"
fi
# Why each skipped test skipped: the reason its TAP plan gave ("1..0 # SKIP
# reason"; meson keeps it in the log, its console line says only SKIP).
testlogs=("$builddir/meson-logs/testlog.json")
[ "$slow_bg" = 1 ] && testlogs+=("$builddir/meson-logs/testlog-slow.json")
python3 - "${testlogs[@]}" <<'PY' || true
import json, os, re, sys
why = {}
for line in (l for f in sys.argv[1:] if os.path.exists(f) for l in open(f)):
    t = json.loads(line)
    if t.get("result") != "SKIP":
        continue
    m = re.search(r"^1\.\.0\s*#\s*skip\S*\s*(.*)$", t.get("stdout") or "", re.I | re.M)
    reason = m.group(1).strip() if m and m.group(1).strip() else "exit status 77"
    reason = re.sub(r"^test_\w+ \w+: ", "", reason)  # the launcher names the program; the test name says it
    why.setdefault(reason, []).append(t["name"].split(":", 1)[-1].replace(" / ", "/"))
for reason, names in why.items():
    print("test.sh: skipped %s: %s" % (", ".join(names), reason))
PY

if [ "$py_bg" = 1 ]; then
  wait "$py_pid" || true
  cat "$py_log"
  [ "$(cat "$py_log.rc" 2>/dev/null)" = 0 ] || rc=1
  say "scripts/test-python.sh (beside the build): $((SECONDS - py_t0)) s"
elif [ -f scripts/test-python.sh ] && [ ${#test_args[@]} -eq 0 ]; then
  t0=$SECONDS
  MXS_BUILDDIR=$builddir MXS_PY_NO_TORCH=$quick MXS_PY_QUICK=$quick bash scripts/test-python.sh || rc=1
  say "scripts/test-python.sh: $((SECONDS - t0)) s"
fi
[ "$format_rc" = 0 ] || rc=1
say "total: $((SECONDS - t_start)) s, $([ $rc = 0 ] && echo PASS || echo FAIL)"
exit $rc

#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The programs of the cuda suite (tests/cuda, examples) in meson build folder BUILDDIR: the ninja
# targets among the suite's test commands, one per line (scripts/gpu-build-time.sh and
# scripts/gpu-session-36.sh build exactly these).
#   scripts/cuda-suite-programs.sh BUILDDIR
set -euo pipefail
cd "${1:?build dir}"
meson introspect --tests . | python3 -c '
import json, os, subprocess, sys
targets = {l.split(":")[0] for l in subprocess.run(["ninja", "-t", "targets", "all"], capture_output=True,
                                                   text=True).stdout.splitlines()}
b = os.getcwd()
for t in json.load(sys.stdin):
    if "cuda" in (s.split(":")[-1] for s in t["suite"]):
        for c in t["cmd"]:
            c = os.path.relpath(c, b) if os.path.isabs(c) else c
            if c in targets:
                print(c)'

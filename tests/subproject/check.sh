#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Builds tests/subproject as a downstream meson project with this source
# tree as its subprojects/mxshard (a symlink) and subprojects/mxshard.wrap
# (subprojects/mxshard.wrap.example, whose download is never needed: the
# directory exists), with --wrap-mode=nodownload and no -Dmxshard:... option.
# Then checks that mxshard stays quiet: no mxshard test, benchmark or demo
# target, nothing installed but headers, libraries and .pc files, no -Werror
# in mxshard's compile commands. TAP output.
#   usage: check.sh <srcroot> <tmpdir>
set -uo pipefail
src=$(cd "${1:?usage: check.sh <srcroot> <tmpdir>}" && pwd)
tmp=${2:?usage: check.sh <srcroot> <tmpdir>}
MESON=${MESON:-meson}
PYTHON=${PYTHON:-python3}
n=0

step() { # step DESCRIPTION CMD...: one TAP test; the command's output as comments
  local what=$1 out; shift
  n=$((n + 1))
  if out=$("$@" 2>&1); then echo "ok $n - $what"; else echo "not ok $n - $what"; fi
  [ -n "$out" ] && printf '%s\n' "$out" | sed 's/^/# /'
  return 0
}
finish() { echo "1..$n"; exit 0; }

rm -rf "$tmp/proj"
mkdir -p "$tmp/proj/subprojects"
cp "$src/tests/subproject/meson.build" "$src/tests/subproject/main.c" "$tmp/proj/"
cp "$src/subprojects/mxshard.wrap.example" "$tmp/proj/subprojects/mxshard.wrap"
ln -s "$src" "$tmp/proj/subprojects/mxshard"
b=$tmp/proj/build

step "parent configures with --wrap-mode=nodownload and no mxshard options" \
  "$MESON" setup "$b" "$tmp/proj" --wrap-mode=nodownload
[ -f "$b/build.ninja" ] || finish

"$MESON" introspect --targets "$b" > "$tmp/targets.json" 2>/dev/null
"$MESON" introspect --installed "$b" > "$tmp/installed.json" 2>/dev/null
"$MESON" introspect --tests "$b" > "$tmp/tests.json" 2>/dev/null

step "mxshard configures libraries only (no test, benchmark or demo target)" "$PYTHON" - "$tmp/targets.json" <<'PY'
import json, sys
targets = [t for t in json.load(open(sys.argv[1])) if t.get("subproject") == "mxshard"]
bad = [t["name"] for t in targets if t["type"] not in ("shared library", "static library", "both libraries")
       or not t["name"].startswith("mxshard_")]
print("mxshard targets:", ", ".join(sorted(t["name"] + " (" + t["type"] + ")" for t in targets)) or "none")
sys.exit(1 if bad else 0)
PY
step "the parent's test list holds only its own test" "$PYTHON" - "$tmp/tests.json" <<'PY'
import json, sys
names = [t["name"] for t in json.load(open(sys.argv[1]))]
print("tests:", ", ".join(names))
sys.exit(0 if names == ["mxshard_consumer"] else 1)
PY
step "mxshard installs only headers, libraries and .pc files" "$PYTHON" - "$tmp/installed.json" <<'PY'
import json, re, sys
ok = re.compile(r"/include/mxshard(/[a-z_]+\.h)?$|/lib[^/]*/(.*/)?libmxshard_[a-z]+\.(a|so[.0-9]*)$|/pkgconfig/mxshard(-[a-z]+)?\.pc$")
dests = sorted(json.load(open(sys.argv[1])).values())
bad = [d for d in dests if not ok.search(d)]
print("installs %d files%s" % (len(dests), ("; unexpected: " + ", ".join(bad)) if bad else ""))
sys.exit(1 if bad else 0)
PY
step "no -Werror forced on mxshard's sources" "$PYTHON" - "$tmp/targets.json" <<'PY'
import json, sys
bad = []
for t in json.load(open(sys.argv[1])):
    if t.get("subproject") != "mxshard":
        continue
    for s in t.get("target_sources", []):
        if any(p in ("-Werror", "-Xcompiler=-Werror") for p in s.get("parameters", [])):
            bad.append(t["name"] + " (" + s.get("language", "?") + ")")
print("with -Werror: " + ", ".join(bad) if bad else "mxshard's compile commands carry no -Werror")
sys.exit(1 if bad else 0)
PY
step "the parent's program builds (nothing of mxshard's compiled for it)" "$MESON" compile -C "$b" mxshard_consumer
step "and runs" "$b/mxshard_consumer"
finish

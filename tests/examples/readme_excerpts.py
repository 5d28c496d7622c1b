#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Every C / C++ / Python code block in README.md (and docs/*.md blocks that name an
example) must be an excerpt of a program under examples/, which the test
suite compiles and runs as C and as C++. A block opens with a comment naming
its source,

    /* excerpt of examples/copyback.c */

and its other lines must appear in that file in the same order, each run of
lines between two `...` lines contiguous (blank lines skipped, runs of
spaces compared as one: clang-format may align comments differently). TAP output.   usage: readme_excerpts.py <srcroot>"""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1])
fence = re.compile(r"^```(c|cpp|c\+\+|python)\s*$")
marker = re.compile(r"^\s*(?:/\*|//|#)\s*excerpt of (examples/[\w./-]+)\s*(?:\*/)?\s*$")
n = 0
failed = False


def report(ok, what, detail=None):
    global n, failed
    n += 1
    failed |= not ok
    print(("ok" if ok else "not ok") + " %d - %s" % (n, what))
    if detail:
        for line in detail.splitlines():
            print("# " + line)


def blocks(path):
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        if fence.match(lines[i]):
            start = i + 1
            j = start
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            yield start + 1, lines[start:j]
            i = j
        i += 1


def norm(line):
    return " ".join(line.split())


def find_chunks(source, chunks):
    """Each chunk (a list of stripped lines) contiguous in source, in order."""
    pos = 0
    for chunk in chunks:
        if not chunk:
            continue
        for k in range(pos, len(source) - len(chunk) + 1):
            if source[k:k + len(chunk)] == chunk:
                pos = k + len(chunk)
                break
        else:
            return chunk
    return None


for doc in [root / "README.md"]:
    for lineno, block in blocks(doc):
        where = "%s:%d" % (doc.relative_to(root), lineno)
        m = marker.match(block[0]) if block else None
        if not m:
            report(False, where + ": a C block names the example it is an excerpt of",
                   "first line should be: /* excerpt of examples/<file> */")
            continue
        src = root / m.group(1)
        if not src.is_file():
            report(False, where + ": " + m.group(1) + " exists")
            continue
        source = [norm(l) for l in src.read_text().splitlines()]
        chunks, cur = [], []
        for l in block[1:]:
            if l.strip() in ("...", "/* ... */", "// ...", "# ..."):
                chunks.append(cur)
                cur = []
            elif l.strip():
                cur.append(norm(l))
        chunks.append(cur)
        missing = find_chunks([l for l in source if l], chunks)
        report(missing is None, "%s is an excerpt of %s" % (where, m.group(1)),
               None if missing is None else "not found in order:\n" + "\n".join(missing))
print("1..%d" % n)
sys.exit(0)

#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""One line per kernel of the sm_XX machine code in object files or shared
libraries: its name, the md5 and size of its code (the bytes of the cubin's
.text.<kernel> section) and cuobjdump's resource usage (registers, stack,
shared and local memory). Two builds whose lines are equal run the same
machine code, whatever the translation unit a kernel was compiled in
(issue 36: the writeback kernels split over several units).

    scripts/sass-digest.py FILE... > digest.txt      # .o, .so, .cubin
    scripts/sass-digest.py --diff A.txt B.txt         # exit 1 when they differ

The cubins are extracted with `cuobjdump -xelf all` ($CUOBJDUMP, else the one
on PATH): the digest does not depend on the disassembler's version. A kernel
present in several inputs (the same template in two units) is listed once per
copy, so a duplicate shows too.
"""
import hashlib
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile


def cuobjdump():
    exe = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if not exe:
        sys.exit("sass-digest: no cuobjdump (set CUOBJDUMP)")
    return exe


def elf_sections(data):
    """(name, sh_type, bytes) of each section of an ELF64 file."""
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    heads = []
    for i in range(shnum):
        name, typ, _flags, _addr, off, size = struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize)
        heads.append((name, typ, off, size))
    stroff = heads[shstrndx][2]
    out = []
    for name, typ, off, size in heads:
        end = data.index(b"\0", stroff + name)
        body = b"" if typ == 8 else data[off:off + size]  # SHT_NOBITS: no bytes
        out.append((data[stroff + name:end].decode(), typ, body))
    return out


def text_digests(path):
    """{kernel: [(md5, bytes)]} of every cubin in `path`."""
    found = {}
    with tempfile.TemporaryDirectory() as tmp:
        if path.endswith(".cubin"):
            cubins = [os.path.abspath(path)]
        else:
            subprocess.run([cuobjdump(), "-xelf", "all", os.path.abspath(path)], cwd=tmp, check=True,
                           stdout=subprocess.DEVNULL)
            cubins = sorted(os.path.join(tmp, f) for f in os.listdir(tmp) if f.endswith(".cubin"))
        for c in cubins:
            with open(c, "rb") as f:
                data = f.read()
            for name, _typ, body in elf_sections(data):
                if name.startswith(".text."):
                    found.setdefault(name[6:], []).append((hashlib.md5(body).hexdigest(), len(body)))
    return found


def resource_usage(path):
    """{kernel: 'REG:.. STACK:.. SHARED:.. LOCAL:..'} from cuobjdump."""
    if path.endswith(".cubin"):
        return {}
    txt = subprocess.run([cuobjdump(), "--dump-resource-usage", path], check=True, capture_output=True,
                         text=True).stdout
    usage, fn = {}, None
    for line in txt.splitlines():
        m = re.match(r"\s*Function (\S+):", line)
        if m:
            fn = m.group(1)
            continue
        m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", line)
        if m and fn:
            usage[fn] = "REG:%s STACK:%s SHARED:%s LOCAL:%s" % m.groups()
            fn = None
    return usage


def digest(paths):
    lines = []
    for p in paths:
        usage = resource_usage(p)
        for fn, copies in text_digests(p).items():
            for md5, size in copies:
                lines.append("%s %s %d %s" % (fn, md5, size, usage.get(fn, "")))
    return sorted(lines)


def main(argv):
    if len(argv) == 4 and argv[1] == "--diff":
        a = open(argv[2]).read().splitlines()
        b = open(argv[3]).read().splitlines()
        sa, sb = set(a), set(b)
        for line in sorted(sa - sb):
            print("- " + line)
        for line in sorted(sb - sa):
            print("+ " + line)
        same = sa == sb and len(a) == len(b)
        print("sass-digest: %d kernels, %s" % (len(a), "identical" if same else "DIFFERENT"))
        return 0 if same else 1
    if len(argv) < 2 or argv[1].startswith("-"):
        print(__doc__)
        return 2
    for line in digest(argv[1:]):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

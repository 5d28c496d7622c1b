# SPDX-License-Identifier: MIT
"""The b2b column of a scripts/gpu-ab.sh log, one row per bench row and one
column per run (the folders in the order they ran: A B ... B-2 A-2).

    python3 bench/ab_compare.py OUT/ab-cuda_bench.log [--grep TEXT]

Reads the tables that bench/cuda_bench and bench/nvfp4_bench print (the
same rows as their --out files) and prints a markdown table.
"""
import argparse
import collections
import re


def _cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _number(text):
    try:
        float(text)
        return True
    except ValueError:
        return False


def row_key(c):
    """(key, b2b) of an operation row, or None for other table rows."""
    if len(c) < 12 or not _number(c[7]):
        return None
    if c[1].startswith("writeback f32") or c[1].startswith("quantize"):
        # cuda_bench: shape | op | planes | layout | shard | api | single | b2b
        return " ".join([c[0], c[2], c[3], c[4], c[5]]), c[7]
    if c[4] in ("quantize", "writeback", "finish"):
        # nvfp4_bench: shape | block | layout | planes | op | shard | single | b2b
        return " ".join(c[0:6]), c[7]
    return None


def parse(path):
    runs = collections.OrderedDict()
    cur = None
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"=== (\S+): env", line)
            if m:
                cur = m.group(1)
                runs[cur] = collections.OrderedDict()
                continue
            if cur is None or not line.startswith("| "):
                continue
            kv = row_key(_cells(line))
            if kv:
                runs[cur][kv[0]] = kv[1]
    return runs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log")
    ap.add_argument("--grep", default="", help="only rows whose key contains this text")
    a = ap.parse_args()
    runs = parse(a.log)
    keys = list(dict.fromkeys(k for r in runs.values() for k in r))
    print("| row (b2b µs) | " + " | ".join(runs) + " |")
    print("|---|" + "---:|" * len(runs))
    for k in keys:
        if a.grep in k:
            print("| " + k + " | " + " | ".join(r.get(k, "-") for r in runs.values()) + " |")


if __name__ == "__main__":
    main()

# SPDX-License-Identifier: MIT
"""Loss curves of training runs (train.py --out-json files) and the entropy
floor, as a PNG: matplotlib when installed; otherwise a small built-in
rasteriser (axes, grid, curves, legend swatches; no text) so a PNG is always
written. An SVG with labels is written beside it in both cases.

    python plot.py --out docs/train_loss.png A.json:label B.json:label
"""
from __future__ import annotations

import argparse
import json
import math
import struct
import zlib

COLORS = [(31, 119, 180), (214, 39, 40), (44, 160, 44), (148, 103, 189), (255, 127, 14)]


def load(spec):
    path, _, label = spec.partition(":")
    r = json.load(open(path))
    label = label or f"{r['variant']} dp={r['dp']}"
    return label, [(s, v) for s, v, _ in r["losses"]], r.get("entropy_floor")


def plot(runs, floor, out, title="training loss"):
    """runs: [(label, [(step, loss), ...])]. Returns the PNG writer used."""
    _svg(runs, floor, out.rsplit(".", 1)[0] + ".svg", title)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        _png_builtin(runs, floor, out)
        return "builtin"
    fig, ax = plt.subplots(figsize=(8, 4.8), dpi=120)
    for i, (label, pts) in enumerate(runs):
        c = tuple(x / 255 for x in COLORS[i % len(COLORS)])
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label, color=c, lw=1.2)
    if floor is not None:
        ax.axhline(floor, color="k", ls="--", lw=1, label=f"entropy floor {floor:.3f}")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    lo = floor - 0.2 if floor is not None else None
    ys = [p[1] for _, pts in runs for p in pts]
    if ys and lo is not None:
        ax.set_ylim(lo, min(max(ys), floor + 4.0))
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return "matplotlib"


def _bounds(runs, floor):
    xs = [p[0] for _, pts in runs for p in pts] or [0, 1]
    ys = [p[1] for _, pts in runs for p in pts] or [0, 1]
    y0 = min(ys + ([floor] if floor is not None else [])) - 0.1
    y1 = max(ys)
    if floor is not None:
        y1 = min(y1, floor + 4.0)
    return min(xs), max(max(xs), min(xs) + 1), y0, max(y1, y0 + 1e-3)


def _svg(runs, floor, path, title):
    W, H, m = 800, 480, 60
    x0, x1, y0, y1 = _bounds(runs, floor)

    def X(x):
        return m + (x - x0) / (x1 - x0) * (W - 2 * m)

    def Y(y):
        return H - m - (min(max(y, y0), y1) - y0) / (y1 - y0) * (H - 2 * m)
    el = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" '
          f'font-size="12"><rect width="{W}" height="{H}" fill="white"/>',
          f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>']
    for k in range(6):
        yv = y0 + (y1 - y0) * k / 5
        el.append(f'<line x1="{m}" x2="{W - m}" y1="{Y(yv):.1f}" y2="{Y(yv):.1f}" stroke="#ddd"/>'
                  f'<text x="{m - 5}" y="{Y(yv) + 4:.1f}" text-anchor="end">{yv:.2f}</text>')
        xv = x0 + (x1 - x0) * k / 5
        el.append(f'<text x="{X(xv):.1f}" y="{H - m + 16}" text-anchor="middle">{xv:.0f}</text>')
    el.append(f'<rect x="{m}" y="{m}" width="{W - 2 * m}" height="{H - 2 * m}" fill="none" stroke="black"/>')
    for i, (label, pts) in enumerate(runs):
        c = "rgb(%d,%d,%d)" % COLORS[i % len(COLORS)]
        d = " ".join(f"{X(s):.1f},{Y(v):.1f}" for s, v in pts)
        el.append(f'<polyline fill="none" stroke="{c}" stroke-width="1.3" points="{d}"/>')
        el.append(f'<rect x="{W - m - 210}" y="{m + 10 + 18 * i}" width="14" height="4" fill="{c}"/>'
                  f'<text x="{W - m - 190}" y="{m + 16 + 18 * i}">{label}</text>')
    if floor is not None:
        el.append(f'<line x1="{m}" x2="{W - m}" y1="{Y(floor):.1f}" y2="{Y(floor):.1f}" stroke="black" '
                  f'stroke-dasharray="6,4"/><text x="{W - m - 190}" y="{m + 16 + 18 * len(runs)}">'
                  f'entropy floor {floor:.3f}</text>')
    el.append(f'<text x="{W / 2}" y="{H - 15}" text-anchor="middle">step</text>')
    el.append(f'<text x="15" y="{H / 2}" transform="rotate(-90 15 {H / 2})" text-anchor="middle">'
              f'cross-entropy (nats/token)</text></svg>')
    with open(path, "w") as f:
        f.write("\n".join(el))


def _png_builtin(runs, floor, path):
    W, H, m = 800, 480, 40
    px = bytearray(b"\xff" * (W * H * 3))
    x0, x1, y0, y1 = _bounds(runs, floor)

    def put(x, y, c):
        if 0 <= x < W and 0 <= y < H:
            i = (y * W + x) * 3
            px[i:i + 3] = bytes(c)

    def line(xa, ya, xb, yb, c, dash=0):
        n = int(max(abs(xb - xa), abs(yb - ya))) + 1
        for k in range(n + 1):
            if dash and (k // dash) % 2:
                continue
            t = k / max(n, 1)
            put(int(round(xa + (xb - xa) * t)), int(round(ya + (yb - ya) * t)), c)

    def X(x):
        return m + (x - x0) / (x1 - x0) * (W - 2 * m)

    def Y(y):
        return H - m - (min(max(y, y0), y1) - y0) / (y1 - y0) * (H - 2 * m)
    for k in range(6):
        line(m, Y(y0 + (y1 - y0) * k / 5), W - m, Y(y0 + (y1 - y0) * k / 5), (220, 220, 220))
    for xa, ya, xb, yb in ((m, m, W - m, m), (m, H - m, W - m, H - m), (m, m, m, H - m), (W - m, m, W - m, H - m)):
        line(xa, ya, xb, yb, (0, 0, 0))
    for i, (_, pts) in enumerate(runs):
        c = COLORS[i % len(COLORS)]
        for (sa, va), (sb, vb) in zip(pts, pts[1:]):
            line(X(sa), Y(va), X(sb), Y(vb), c)
        for dy in range(4):
            line(W - m - 60, m + 12 + 14 * i + dy, W - m - 20, m + 12 + 14 * i + dy, c)
    if floor is not None:
        line(m, Y(floor), W - m, Y(floor), (0, 0, 0), dash=6)
    raw = b"".join(b"\x00" + bytes(px[y * W * 3:(y + 1) * W * 3]) for y in range(H))

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", W, H, 8, 2, 0, 0, 0)) +
                chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="docs/train_loss.png")
    p.add_argument("--title", default="MXFP8 row-only primaries vs BF16 weights")
    p.add_argument("runs", nargs="+", help="file.json[:label]")
    a = p.parse_args()
    loaded = [load(s) for s in a.runs]
    floor = next((f for _, _, f in loaded if f is not None), None)
    print(plot([(lbl, pts) for lbl, pts, _ in loaded], floor, a.out, a.title), "->", a.out)
    _ = math

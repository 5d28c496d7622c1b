# SPDX-License-Identifier: MIT
"""Loss plot of training runs (train.py --out-json files), two panels:

  top     the loss curves and the entropy floor of the source;
  bottom  the per-step difference of the first run minus the second
          (MXFP8 - BF16: on the top panel the two curves overlap), with its
          moving average over `window` steps and the zero line.

A PNG with matplotlib when installed, otherwise a small built-in rasteriser
(axes, grid, curves, legend swatches; no text), so a PNG is always written; an
SVG with labels is written beside it in both cases.

    python plot.py --out docs/train_loss.png MX.json:label BF.json:label [more.json:label ...]
"""
from __future__ import annotations

import argparse
import json
import struct
import zlib

COLORS = [(31, 119, 180), (214, 39, 40), (44, 160, 44), (148, 103, 189), (255, 127, 14)]
DIFF_COLOR, AVG_COLOR = (120, 120, 120), (0, 0, 0)


def load(spec):
    path, _, label = spec.partition(":")
    r = json.load(open(path))
    label = label or f"{r['variant']} dp={r['dp']}"
    return label, [(s, v) for s, v, _ in r["losses"]], r.get("entropy_floor")


def difference(a, b):
    """[(step, a - b)] at the steps both curves have."""
    db = dict(b)
    return [(s, v - db[s]) for s, v in a if s in db]


def moving_average(pts, window):
    out, acc = [], []
    for s, v in pts:
        acc.append(v)
        if len(acc) > window:
            acc.pop(0)
        out.append((s, sum(acc) / len(acc)))
    return out


def plot(runs, floor, out, title="training loss", diff_label=None, window=10):
    """runs: [(label, [(step, loss), ...]), ...] (at least two: the bottom panel
    is runs[0] - runs[1]). Writes `out` (PNG) and the SVG beside it; returns the
    PNG writer used ("matplotlib" or "builtin")."""
    if len(runs) < 2:
        raise ValueError("plot: two runs at least (the difference panel is the first minus the second)")
    diff = difference(runs[0][1], runs[1][1])
    avg = moving_average(diff, window)
    dl = diff_label or f"{runs[0][0].split(',')[0]} - {runs[1][0].split(',')[0]}"
    panels = _panels(runs, floor, diff, avg, dl, window)
    _svg(panels, out.rsplit(".", 1)[0] + ".svg", title)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        _png_builtin(panels, out)
        return "builtin"
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(8, 7), dpi=120, sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    for i, (label, pts) in enumerate(runs):
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label, color=_c(COLORS[i % len(COLORS)]), lw=1.2)
    if floor is not None:
        ax.axhline(floor, color="k", ls="--", lw=1, label=f"entropy floor {floor:.3f}")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    y0, y1 = panels[0]["y"]
    ax.set_ylim(y0, y1)
    bx.plot([p[0] for p in diff], [p[1] for p in diff], color=_c(DIFF_COLOR), lw=0.7, label=f"{dl}, per step")
    bx.plot([p[0] for p in avg], [p[1] for p in avg], color=_c(AVG_COLOR), lw=1.6,
            label=f"moving average ({window} steps)")
    bx.axhline(0.0, color=_c(COLORS[1]), lw=0.8)
    bx.set_xlabel("step")
    bx.set_ylabel("loss difference (nats/token)")
    bx.grid(alpha=0.3)
    bx.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return "matplotlib"


def _c(rgb):
    return tuple(x / 255 for x in rgb)


def _panels(runs, floor, diff, avg, diff_label, window):
    """Both panels as data: series (label, points, color, width, dashed) and y range."""
    ys = [p[1] for _, pts in runs for p in pts] or [0.0, 1.0]
    y0 = min(ys + ([floor] if floor is not None else [])) - 0.1
    y1 = max(ys)
    if floor is not None:
        y1 = min(y1, floor + 4.0)
    top = [(lbl, pts, COLORS[i % len(COLORS)], 1.3, False) for i, (lbl, pts) in enumerate(runs)]
    if floor is not None:
        xs = [p[0] for _, pts in runs for p in pts] or [0, 1]
        top.append((f"entropy floor {floor:.3f}", [(min(xs), floor), (max(xs), floor)], (0, 0, 0), 1.0, True))
    dv = [abs(v) for _, v in diff] or [1e-3]
    lim = max(dv) * 1.1 or 1e-3
    xs = [p[0] for p in diff] or [0, 1]
    bottom = [(f"{diff_label}, per step", diff, DIFF_COLOR, 0.8, False),
              (f"moving average ({window} steps)", avg, AVG_COLOR, 2.0, False),
              ("zero", [(min(xs), 0.0), (max(xs), 0.0)], COLORS[1], 1.0, True)]
    return [{"series": top, "y": (y0, max(y1, y0 + 1e-3)), "ylabel": "cross-entropy (nats/token)"},
            {"series": bottom, "y": (-lim, lim), "ylabel": "loss difference"}]


def _xrange(panels):
    xs = [p[0] for pn in panels for _, pts, _, _, _ in pn["series"] for p in pts] or [0, 1]
    return min(xs), max(max(xs), min(xs) + 1)


def _svg(panels, path, title):
    W, H, m, gap = 800, 700, 70, 40
    heights = [(H - 2 * m - gap) * 3 // 5, (H - 2 * m - gap) * 2 // 5]
    x0, x1 = _xrange(panels)
    el = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" '
          f'font-size="12"><rect width="{W}" height="{H}" fill="white"/>',
          f'<text x="{W / 2}" y="25" text-anchor="middle" font-size="14">{title}</text>']
    top = m

    def X(x):
        return m + (x - x0) / (x1 - x0) * (W - 2 * m)
    for pn, h in zip(panels, heights):
        y0, y1 = pn["y"]

        def Y(y, top=top, h=h, y0=y0, y1=y1):
            return top + h - (min(max(y, y0), y1) - y0) / (y1 - y0) * h
        for k in range(6):
            yv = y0 + (y1 - y0) * k / 5
            el.append(f'<line x1="{m}" x2="{W - m}" y1="{Y(yv):.1f}" y2="{Y(yv):.1f}" stroke="#ddd"/>'
                      f'<text x="{m - 5}" y="{Y(yv) + 4:.1f}" text-anchor="end">{yv:.3g}</text>')
        el.append(f'<rect x="{m}" y="{top}" width="{W - 2 * m}" height="{h}" fill="none" stroke="black"/>')
        for i, (label, pts, c, lw, dashed) in enumerate(pn["series"]):
            col = "rgb(%d,%d,%d)" % c
            d = " ".join(f"{X(s):.1f},{Y(v):.1f}" for s, v in pts)
            dash = ' stroke-dasharray="6,4"' if dashed else ""
            el.append(f'<polyline fill="none" stroke="{col}" stroke-width="{lw}"{dash} points="{d}"/>')
            el.append(f'<rect x="{W - m - 290}" y="{top + 10 + 16 * i}" width="14" height="4" fill="{col}"/>'
                      f'<text x="{W - m - 270}" y="{top + 16 + 16 * i}">{label}</text>')
        el.append(f'<text x="18" y="{top + h / 2}" transform="rotate(-90 18 {top + h / 2})" '
                  f'text-anchor="middle">{pn["ylabel"]}</text>')
        top += h + gap
    for k in range(6):
        xv = x0 + (x1 - x0) * k / 5
        el.append(f'<text x="{X(xv):.1f}" y="{H - m + 16}" text-anchor="middle">{xv:.0f}</text>')
    el.append(f'<text x="{W / 2}" y="{H - 25}" text-anchor="middle">step</text></svg>')
    with open(path, "w") as f:
        f.write("\n".join(el))


def _png_builtin(panels, path):
    W, H, m, gap = 800, 700, 40, 30
    heights = [(H - 2 * m - gap) * 3 // 5, (H - 2 * m - gap) * 2 // 5]
    px = bytearray(b"\xff" * (W * H * 3))
    x0, x1 = _xrange(panels)

    def put(x, y, c):
        if 0 <= x < W and 0 <= y < H:
            i = (y * W + x) * 3
            px[i:i + 3] = bytes(c)

    def line(xa, ya, xb, yb, c, dash=0, width=1):
        n = int(max(abs(xb - xa), abs(yb - ya))) + 1
        for k in range(n + 1):
            if dash and (k // dash) % 2:
                continue
            t = k / max(n, 1)
            for w in range(width):
                put(int(round(xa + (xb - xa) * t)), int(round(ya + (yb - ya) * t)) + w, c)

    def X(x):
        return m + (x - x0) / (x1 - x0) * (W - 2 * m)
    top = m
    for pn, h in zip(panels, heights):
        y0, y1 = pn["y"]

        def Y(y, top=top, h=h, y0=y0, y1=y1):
            return top + h - (min(max(y, y0), y1) - y0) / (y1 - y0) * h
        for k in range(6):
            line(m, Y(y0 + (y1 - y0) * k / 5), W - m, Y(y0 + (y1 - y0) * k / 5), (220, 220, 220))
        for xa, ya, xb, yb in ((m, top, W - m, top), (m, top + h, W - m, top + h), (m, top, m, top + h),
                               (W - m, top, W - m, top + h)):
            line(xa, ya, xb, yb, (0, 0, 0))
        for i, (_, pts, c, lw, dashed) in enumerate(pn["series"]):
            for (sa, va), (sb, vb) in zip(pts, pts[1:]):
                line(X(sa), Y(va), X(sb), Y(vb), c, dash=6 if dashed else 0, width=2 if lw >= 1.5 else 1)
            for dy in range(4):
                line(W - m - 60, top + 12 + 14 * i + dy, W - m - 20, top + 12 + 14 * i + dy, c)
        top += h + gap
    raw = b"".join(b"\x00" + bytes(px[y * W * 3:(y + 1) * W * 3]) for y in range(H))

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", W, H, 8, 2, 0, 0, 0)) +
                chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="docs/train_loss.png")
    p.add_argument("--title", default="MXFP8 primaries vs BF16 weights")
    p.add_argument("--window", type=int, default=10, help="moving average of the difference panel")
    p.add_argument("runs", nargs="+", help="file.json[:label]; the difference panel is the first minus the second")
    a = p.parse_args()
    loaded = [load(s) for s in a.runs]
    floor = next((f for _, _, f in loaded if f is not None), None)
    print(plot([(lbl, pts) for lbl, pts, _ in loaded], floor, a.out, a.title, window=a.window), "->", a.out)

"""The live-memory chart of the trace report: an inline SVG step chart of the
final forward trace followed by the final backward trace (memory.py computes
the numbers). Each step carries ``data-stage``/``data-row`` so a click on the
chart can show the symbol in its trace."""
from __future__ import annotations

import math
from html import escape

from thunderlite.report.memory import MemoryTimeline

WIDTH, HEIGHT = 1000, 170
LEFT, RIGHT, TOP, BOTTOM = 64, 12, 14, 22
COLORS = {"forward": "#3b7dd8", "backward": "#e07b39"}


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" or n == int(n) else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def nice_top(peak: float) -> float:
    """The chart's top: ``peak`` rounded up to a round number of its unit (1.8 MiB -> 2 MiB)."""
    if peak <= 0:
        return 1.0
    unit = 1
    while peak / unit >= 1024 and unit < 1024 ** 3:
        unit *= 1024
    v = peak / unit
    scale = 10 ** math.floor(math.log10(v))
    step = next(m for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10) if m * scale >= v)
    return step * scale * unit


def memory_svg(series: list[tuple[str, str, MemoryTimeline]]) -> str:
    """``series``: (group, stage id, timeline) in the order they run."""
    n = sum(len(tl.points) for _, _, tl in series)
    if n == 0:
        return '<p class="empty">No tensor is computed by the final traces.</p>'
    top = nice_top(max(max((p.live_bytes for p in tl.points), default=0) for _, _, tl in series))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    step = plot_w / n

    def y(v: float) -> float:
        return TOP + plot_h * (1 - v / top)

    parts = [f'<svg class="memchart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
             f'aria-label="live tensor memory" xmlns="http://www.w3.org/2000/svg">']
    for frac in (0, 0.5, 1):
        yy = y(top * frac)
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{yy:.1f}" y2="{yy:.1f}"/>')
        parts.append(f'<text class="axis" x="{LEFT - 6}" y="{yy + 4:.1f}" text-anchor="end">'
                     f'{human_bytes(top * frac)}</text>')
    x0 = LEFT
    for group, stage_id, tl in series:
        if not tl.points:
            continue
        color = COLORS.get(group, "#888")
        pts = [f"{x0:.1f},{y(0):.1f}"]
        for k, p in enumerate(tl.points):
            xa, xb = x0 + k * step, x0 + (k + 1) * step
            pts.append(f"{xa:.1f},{y(p.live_bytes):.1f} {xb:.1f},{y(p.live_bytes):.1f}")
        xe = x0 + len(tl.points) * step
        pts.append(f"{xe:.1f},{y(0):.1f}")
        parts.append(f'<polygon class="area" fill="{color}" points="{" ".join(pts)}"/>')
        for k, p in enumerate(tl.points):
            xa = x0 + k * step
            parts.append(f'<rect class="hit" x="{xa:.1f}" y="{TOP}" width="{max(step, 0.5):.2f}" '
                         f'height="{plot_h}" data-stage="{stage_id}" data-row="{p.index}">'
                         f'<title>{escape(group)} #{p.index}: {escape(p.label)} | '
                         f'{human_bytes(p.live_bytes)} live</title></rect>')
        if tl.peak_index is not None:
            k = next(i for i, p in enumerate(tl.points) if p.index == tl.peak_index)
            px, py = x0 + (k + 0.5) * step, y(tl.peak_bytes)
            anchor = "end" if px > WIDTH - 160 else "start"
            parts.append(f'<circle class="peak" cx="{px:.1f}" cy="{py:.1f}" r="3.5" fill="{color}"/>')
            parts.append(f'<text class="peaklabel" x="{px + (-6 if anchor == "end" else 6):.1f}" '
                         f'y="{max(py - 4, TOP + 9):.1f}" text-anchor="{anchor}">{escape(group)} peak '
                         f'{human_bytes(tl.peak_bytes)}</text>')
        parts.append(f'<text class="axis" x="{(x0 + xe) / 2:.1f}" y="{HEIGHT - 6}" text-anchor="middle">'
                     f'{escape(group)} ({len(tl.points)} symbols)</text>')
        x0 = xe
    parts.append("</svg>")
    return "".join(parts)

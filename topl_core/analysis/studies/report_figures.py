"""A report's figures as standalone SVG: lines (with an optional 95% band) or labelled points, drawn here from the
numbers — no script, no font or asset to fetch — so a report's HTML holds them inline and works offline, as a deck's
export does (deck_html.py), and its Markdown links the same files.

    Series(name, x, y, lo=None, hi=None, dashed=False, points=False)
    chart(series, title, x_label, y_label) -> str      an <svg> element, for inline HTML
    standalone(svg) -> str                              the same as an .svg file (its XML namespace declared)
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Sequence

COLORS = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#854d0e", "#6b7280")
W, H, LEFT, RIGHT, TOP, BOTTOM = 680, 340, 56, 170, 34, 44  # px: the plot area is inside the margins


@dataclass(frozen=True)
class Series:
    name: str
    x: Sequence[float]
    y: Sequence[float]
    lo: Sequence[float] | None = None  # a band from lo to hi (a 95% interval)
    hi: Sequence[float] | None = None
    dashed: bool = False  # a control
    points: bool = False  # labelled points instead of a line


def _finite(*values: float) -> bool:
    return all(v is not None and math.isfinite(v) for v in values)


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About n round values (steps of 1, 2 or 5 × a power of ten) inside [lo, hi]."""
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / (n - 1)
    power = 10 ** math.floor(math.log10(raw))
    step = min((m * power for m in (1, 2, 5, 10)), key=lambda x: abs(x - raw))
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def chart(series: Sequence[Series], title: str, x_label: str, y_label: str) -> str:
    """The series in one SVG chart: axes spanning every finite value (bands included), a legend on the right."""
    xs = [x for s in series for x, y in zip(s.x, s.y) if _finite(x, y)]
    ys = [v for s in series for v in (*s.y, *(s.lo or ()), *(s.hi or ())) if _finite(v)]
    head = f'<svg width="{W}" height="{H}" role="img" aria-label="{html.escape(title)}"'
    parts = [
        head + ' font-family="sans-serif" font-size="12">',
        f'<text x="{LEFT}" y="20" font-size="14">{html.escape(title)}</text>',
    ]
    if not xs or not ys:
        return "".join(parts) + f'<text x="{LEFT}" y="{H / 2}">no data</text></svg>'
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    pad = (y1 - y0) * 0.08 or 0.05
    y0, y1 = y0 - pad, y1 + pad

    def px(x: float) -> float:
        return LEFT + ((x - x0) / (x1 - x0) if x1 > x0 else 0.5) * (W - LEFT - RIGHT)

    def py(y: float) -> float:
        return TOP + (1 - (y - y0) / (y1 - y0)) * (H - TOP - BOTTOM)

    bottom, right = H - BOTTOM, W - RIGHT
    parts.append(
        f'<rect x="{LEFT}" y="{TOP}" width="{right - LEFT}" height="{bottom - TOP}" fill="none" stroke="#999"/>'
    )
    for v in _ticks(y0, y1):
        parts.append(f'<line x1="{LEFT}" x2="{right}" y1="{py(v):.1f}" y2="{py(v):.1f}" stroke="#eee"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{py(v) + 4:.1f}" text-anchor="end">{v:.3g}</text>')
    for v in _ticks(x0, x1):
        parts.append(f'<text x="{px(v):.1f}" y="{bottom + 16}" text-anchor="middle">{v:.3g}</text>')
    parts.append(f'<text x="{(LEFT + right) / 2}" y="{H - 8}" text-anchor="middle">{html.escape(x_label)}</text>')
    parts.append(
        f'<text x="14" y="{(TOP + bottom) / 2}" transform="rotate(-90 14 {(TOP + bottom) / 2})" '
        f'text-anchor="middle">{html.escape(y_label)}</text>'
    )
    for i, s in enumerate(series):
        color = COLORS[i % len(COLORS)]
        parts += _draw(s, color, px, py)
        y = TOP + 14 + 18 * i
        dash = ' stroke-dasharray="5 3"' if s.dashed else ""
        key = f'x1="{right + 10}" x2="{right + 30}" y1="{y - 4}" y2="{y - 4}"'
        parts.append(f'<line {key} stroke="{color}" stroke-width="2.5"{dash}/>')
        parts.append(f'<text x="{right + 36}" y="{y}">{html.escape(s.name)}</text>')
    return "".join(parts) + "</svg>"


def _draw(s: Series, color: str, px, py) -> list[str]:
    pts = [(x, y) for x, y in zip(s.x, s.y) if _finite(x, y)]
    out = []
    if s.lo is not None and s.hi is not None:
        band = [(x, lo, hi) for x, lo, hi in zip(s.x, s.lo, s.hi) if _finite(x, lo, hi)]
        if len(band) > 1:
            poly = [f"{px(x):.1f},{py(hi):.1f}" for x, _, hi in band] + [
                f"{px(x):.1f},{py(lo):.1f}" for x, lo, _ in band[::-1]
            ]
            out.append(f'<polygon points="{" ".join(poly)}" fill="{color}" fill-opacity="0.12" stroke="none"/>')
    if s.points:
        for x, y in pts:
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="5" fill="{color}"/>')
            out.append(f'<text x="{px(x) + 8:.1f}" y="{py(y) - 6:.1f}">{html.escape(s.name)}</text>')
        return out
    dash = ' stroke-dasharray="5 3"' if s.dashed else ""
    line = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
    out.append(f'<polyline points="{line}" fill="none" stroke="{color}" stroke-width="2.5"{dash}/>')
    out += [f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" fill="{color}"/>' for x, y in pts]
    return out


SVG_NAMESPACE = "http://www.w3.org/2000/svg"  # a name, never fetched: what makes an .svg file SVG


def standalone(svg: str) -> str:
    return svg.replace("<svg ", f'<svg xmlns="{SVG_NAMESPACE}" ', 1)

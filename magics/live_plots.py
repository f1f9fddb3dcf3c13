"""The live view's metric plots: one small inline SVG line chart per metric.

Drawn by hand on purpose: an SVG of a few hundred points costs well under a
millisecond, needs no plotting library in the kernel, and renders wherever HTML
does (JupyterLab, VS Code, nbconvert output). Long histories are thinned to
``MAX_POINTS`` per metric, keeping each bucket's lowest and highest value.
"""

from __future__ import annotations

import math
from html import escape

from notebook_accel.launch.text_view import format_value

MAX_POINTS = 400
WIDTH, HEIGHT = 280, 130
_LEFT, _RIGHT, _TOP, _BOTTOM = 48, 8, 18, 18
Point = tuple[float, float]


def finite_points(points: list[tuple[int | None, float]]) -> list[Point]:
    """``(step, value)`` pairs as floats; a missing step is the point's index; NaN/inf dropped."""
    out = []
    for index, (step, value) in enumerate(points):
        try:
            x, y = float(index if step is None else step), float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(x) and math.isfinite(y):
            out.append((x, y))
    return out


def thin(points: list[Point], limit: int = MAX_POINTS) -> list[Point]:
    """At most ``limit`` points: per bucket its lowest and highest, in order; ends kept."""
    if len(points) <= limit:
        return points
    buckets = limit // 2
    size = len(points) / buckets
    out: list[Point] = []
    for b in range(buckets):
        chunk = points[int(b * size):int((b + 1) * size)]
        if not chunk:
            continue
        low, high = min(chunk, key=lambda p: p[1]), max(chunk, key=lambda p: p[1])
        out.extend(sorted({low, high}, key=chunk.index))
    if out[-1] != points[-1]:
        out[-1] = points[-1]
    return out


def _label(value: float) -> str:
    return escape(format_value(float(value)))


def _step(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else format_value(value)


def metric_svg(name: str, points: list[tuple[int | None, float]]) -> str:
    """One metric as an SVG line chart with its name, last value and axis ranges."""
    data = thin(finite_points(points))
    last = f" = {_label(data[-1][1])}" if data else ""
    title = (f'<text x="{_LEFT}" y="12" font-size="11" font-weight="bold">{escape(name)}{last}'
             "</text>")
    box_w, box_h = WIDTH - _LEFT - _RIGHT, HEIGHT - _TOP - _BOTTOM
    frame = (f'<rect x="{_LEFT}" y="{_TOP}" width="{box_w}" height="{box_h}" fill="none" '
             'stroke="#bbb"/>')
    body = ""
    if data:
        xs, ys = [p[0] for p in data], [p[1] for p in data]
        x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
        dx, dy = (x1 - x0) or 1.0, (y1 - y0) or 1.0

        def sx(x: float) -> float:
            return _LEFT + (x - x0) / dx * box_w

        def sy(y: float) -> float:
            return _TOP + box_h - (y - y0) / dy * box_h

        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in data)
        shape = (f'<polyline points="{path}" fill="none" stroke="#1f77b4" stroke-width="1.5"/>'
                 if len(data) > 1 else
                 f'<circle cx="{sx(xs[0]):.1f}" cy="{sy(ys[0]):.1f}" r="2" fill="#1f77b4"/>')
        small = 'font-size="9" fill="#555"'
        body = (shape
                + f'<text x="{_LEFT - 3}" y="{_TOP + 8}" text-anchor="end" {small}>{_label(y1)}</text>'
                + f'<text x="{_LEFT - 3}" y="{_TOP + box_h}" text-anchor="end" {small}>'
                  f"{_label(y0)}</text>"
                + f'<text x="{_LEFT}" y="{HEIGHT - 5}" {small}>{_step(x0)}</text>'
                + f'<text x="{WIDTH - _RIGHT}" y="{HEIGHT - 5}" text-anchor="end" {small}>'
                  f"step {_step(x1)}</text>")
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
            f'viewBox="0 0 {WIDTH} {HEIGHT}" style="margin:2px 8px 2px 0">'
            f"{title}{frame}{body}</svg>")


def plots_html(history: dict[str, list[tuple[int | None, float]]]) -> str:
    """Every metric's chart, side by side (empty without metrics)."""
    charts = [metric_svg(name, points) for name, points in history.items() if points]
    if not charts:
        return ""
    return '<div style="display:flex;flex-wrap:wrap">' + "".join(charts) + "</div>"


def plots_text(history: dict[str, list[tuple[int | None, float]]]) -> str:
    """One line per metric: last value, step, range and count."""
    lines = []
    for name, points in history.items():
        data = finite_points(points)
        if not data:
            continue
        ys = [y for _, y in data]
        lines.append(f"  {name}: {format_value(data[-1][1])} at step {_step(data[-1][0])} "
                     f"(min {format_value(min(ys))}, max {format_value(max(ys))}, "
                     f"{len(points)} points)")
    return "\n".join(lines)

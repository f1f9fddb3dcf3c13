"""The live view's metric plots: one small inline SVG line chart per metric.

Drawn by hand on purpose: an SVG of a few hundred points costs well under a
millisecond, needs no plotting library in the kernel, and renders wherever HTML
does (JupyterLab, VS Code, nbconvert output). Long histories are thinned to
about ``MAX_POINTS`` per metric as they arrive (see :class:`Series`), so a redraw
costs the same after a million steps as after a hundred.
"""

from __future__ import annotations

import math
from html import escape
from typing import Any

from notebook_accel.launch.text_view import format_value

MAX_POINTS = 400
WIDTH, HEIGHT = 280, 130
_LEFT, _RIGHT, _TOP, _BOTTOM = 48, 8, 18, 18
Point = tuple[float, float]


def _finite(index: int, step: int | None, value: float) -> Point | None:
    try:
        x, y = float(index if step is None else step), float(value)
    except (TypeError, ValueError):
        return None
    return (x, y) if math.isfinite(x) and math.isfinite(y) else None


class Series:
    """One metric's points, thinned as they arrive (amortised O(1) per point).

    Points fall into buckets of ``size`` consecutive points, each keeping its
    lowest and highest point; when there are more than ``limit // 2`` buckets,
    neighbours merge and ``size`` doubles. So drawing costs O(``limit``) however
    long the history, and spikes stay visible.
    """

    def __init__(self, limit: int = MAX_POINTS) -> None:
        self.limit = limit
        self._reset()

    def _reset(self) -> None:
        self.consumed = 0  # history entries read so far (finite or not)
        self.size = 1
        self.buckets: list[list[Any]] = []  # [low, high, count]
        self.last: Point | None = None
        self.low: float = math.inf
        self.high: float = -math.inf

    def extend(self, history: list[tuple[int | None, float]]) -> None:
        """Read the entries of ``history`` not seen yet (it only ever grows)."""
        if len(history) < self.consumed:  # a different history: start again
            self._reset()
        for index in range(self.consumed, len(history)):
            point = _finite(index, *history[index])
            if point is not None:
                self._add(point)
        self.consumed = len(history)

    def _add(self, point: Point) -> None:
        self.last = point
        self.low, self.high = min(self.low, point[1]), max(self.high, point[1])
        if self.buckets and self.buckets[-1][2] < self.size:
            bucket = self.buckets[-1]
            if point[1] < bucket[0][1]:
                bucket[0] = point
            if point[1] > bucket[1][1]:
                bucket[1] = point
            bucket[2] += 1
        else:
            self.buckets.append([point, point, 1])
        if len(self.buckets) > self.limit // 2:
            self._merge()

    def _merge(self) -> None:
        merged = []
        for i in range(0, len(self.buckets), 2):
            pair = self.buckets[i:i + 2]
            low = min((b[0] for b in pair), key=lambda p: p[1])
            high = max((b[1] for b in pair), key=lambda p: p[1])
            merged.append([low, high, sum(b[2] for b in pair)])
        self.buckets = merged
        self.size *= 2

    def points(self) -> list[Point]:
        """At most about ``limit`` points in step order, the last one included."""
        out: list[Point] = []
        for low, high, _ in self.buckets:
            out.extend([low] if low == high else sorted((low, high)))
        if self.last is not None and (not out or out[-1] != self.last):
            out.append(self.last)
        return out

    def __len__(self) -> int:
        return self.consumed


def _label(value: float) -> str:
    return escape(format_value(float(value)))


def _step(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else format_value(value)


def metric_svg(name: str, series: Series) -> str:
    """One metric as an SVG line chart with its name, last value and axis ranges."""
    data = series.points()
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


class Plots:
    """The charts of every metric of a launch, kept up to date incrementally."""

    def __init__(self) -> None:
        self.series: dict[str, Series] = {}

    def update(self, history: dict[str, list[tuple[int | None, float]]]) -> None:
        """Read what was logged since the last call."""
        for name, points in history.items():
            self.series.setdefault(name, Series()).extend(points)

    def html(self) -> str:
        """Every metric's chart, side by side (empty without metrics)."""
        charts = [metric_svg(name, s) for name, s in self.series.items() if s.last is not None]
        if not charts:
            return ""
        return '<div style="display:flex;flex-wrap:wrap">' + "".join(charts) + "</div>"

    def text(self) -> str:
        """One line per metric: last value, step, range and count."""
        lines = []
        for name, s in self.series.items():
            if s.last is None:
                continue
            lines.append(f"  {name}: {format_value(s.last[1])} at step {_step(s.last[0])} "
                         f"(min {format_value(s.low)}, max {format_value(s.high)}, "
                         f"{len(s)} points)")
        return "\n".join(lines)

"""The live view's metric plots: one small inline SVG line chart per metric.

Drawn by hand on purpose: an SVG of a few hundred points costs well under a
millisecond, needs no plotting library in the kernel, and renders wherever HTML
does (JupyterLab, VS Code, nbconvert output). Long histories are thinned to
about ``MAX_POINTS`` per metric as they arrive (see :class:`Series`), so a redraw
costs the same after a million steps as after a hundred.

The live charts are inline SVG, the final ones the same SVG as an image; an image
inherits no font from the page, so the SVG names its own (``FONT``) and both look alike.
"""

from __future__ import annotations

import base64
import math
from html import escape
from typing import Any

from notebook_accel.launch import format_value

MAX_POINTS = 400
WIDTH, HEIGHT = 300, 140
_LEFT, _RIGHT, _TOP, _BOTTOM = 58, 8, 18, 20
SMOOTHING = 0.6  # TensorBoard's default weight of its exponential moving average
LOG_DECADES = 2.0  # a positive metric spanning more than this many decades gets a log axis
FLAT_MARGIN = 0.1  # a constant metric's axis: its value +- this fraction of it (+-1 around 0)
# JupyterLab's own UI fonts, then the usual sans-serif ones: the live (inline) and final (image)
# charts both draw with it
FONT = "system-ui, -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif"
Point = tuple[float, float]
_RAW = 'stroke="#1f77b4" stroke-opacity="0.3" stroke-width="1"'  # the raw values, light


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

    def __init__(self, limit: int = MAX_POINTS, smoothing: float | None = SMOOTHING) -> None:
        self.limit = limit
        self.smoothing = smoothing
        self._reset()

    def _reset(self) -> None:
        self.consumed = 0  # history entries read so far (finite or not)
        self.size = 1
        self.buckets: list[list[Any]] = []  # [low, high, count]
        self.first: Point | None = None  # kept whatever the thinning: the axis starts here
        self.last: Point | None = None
        self.low: float = math.inf
        self.high: float = -math.inf
        self._ema, self._added = 0.0, 0
        # The smoothed curve (debiased EMA of every point, as TensorBoard draws it), thinned too.
        self.smooth = Series(self.limit, smoothing=None) if self.smoothing else None

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
        if self.first is None:
            self.first = point
        if self.smooth is not None:
            self._added += 1
            self._ema = self._ema * self.smoothing + (1 - self.smoothing) * point[1]
            self.smooth._add((point[0], self._ema / (1 - self.smoothing ** self._added)))
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
        out: list[Point] = [self.first] if self.first is not None else []
        for low, high, _ in self.buckets:
            out.extend(p for p in ([low] if low == high else sorted((low, high))) if p != out[0])
        if self.last is not None and (not out or out[-1] != self.last):
            out.append(self.last)
        return out

    def __len__(self) -> int:
        return self.consumed


def _labels(low: float, high: float) -> tuple[str, str]:
    """The y axis's two labels, short enough for the margin (``0.00038``, ``1.2e+04``, ``12``)
    and distinct: with more digits where three would print the same (``1.0001``, ``1.0002``)."""
    for digits in range(3, 7):
        pair = f"{float(low):.{digits}g}", f"{float(high):.{digits}g}"
        if pair[0] != pair[1]:
            break
    return escape(pair[0]), escape(pair[1])


def _y_range(low: float, high: float) -> tuple[float, float]:
    """The y axis's ends: the values' range; for a constant metric, a range around its value
    (+-``FLAT_MARGIN`` of it, +-1 around 0), which draws it across the middle."""
    if high > low:
        return low, high
    margin = abs(low) * FLAT_MARGIN or 1.0
    return low - margin, high + margin


def _legend(x: float, y: float, raw_style: str, smooth_style: str, small: str) -> str:
    """``— raw  — smoothed``, the two lines' key, from (``x``, ``y``) on the bottom row."""
    parts = []
    for style, word, width in ((raw_style, "raw", 22), (smooth_style, "smoothed", 42)):
        parts.append(f'<line x1="{x:.0f}" y1="{y - 3:.0f}" x2="{x + 10:.0f}" y2="{y - 3:.0f}" '
                     f'{style}/><text x="{x + 13:.0f}" y="{y:.0f}" {small}>{word}</text>')
        x += 13 + width
    return '<g class="legend">' + "".join(parts) + "</g>"


def _step(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else format_value(value)


def _log_axis(low: float, high: float) -> bool:
    return low > 0 and math.log10(high / low) > LOG_DECADES


def metric_svg(name: str, series: Series) -> str:
    """One metric as an SVG line chart: raw values (light), their smoothed curve and a legend
    of the two, its name, last value and axis ranges (around the value for a constant
    metric); a log y axis when a positive metric spans > 2 decades."""
    data = series.points()
    last = f" = {escape(format_value(data[-1][1]))}" if data else ""
    box_w, box_h = WIDTH - _LEFT - _RIGHT, HEIGHT - _TOP - _BOTTOM
    frame = (f'<rect x="{_LEFT}" y="{_TOP}" width="{box_w}" height="{box_h}" fill="none" '
             'stroke="#bbb"/>')
    body, scale = "", ""
    if data:
        xs, ys = [p[0] for p in data], [p[1] for p in data]
        x0, x1 = min(xs), max(xs)
        y0, y1 = _y_range(min(ys), max(ys))
        log = _log_axis(y0, y1)
        if log:
            scale = " (log scale)"
        fy = math.log10 if log else float
        dx, dy = (x1 - x0) or 1.0, (fy(y1) - fy(y0)) or 1.0

        def sx(x: float) -> float:
            return _LEFT + (x - x0) / dx * box_w

        def sy(y: float) -> float:
            return _TOP + box_h - (fy(y) - fy(y0)) / dy * box_h

        def line(points: list[Point], style: str) -> str:
            path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in points)
            return f'<polyline points="{path}" fill="none" {style}/>'

        small = 'font-size="9" fill="#555"'
        smooth = series.smooth.points() if series.smooth is not None else []
        if len(data) > 1 and len(smooth) > 1:
            raw, smoothed = _RAW, 'stroke="#1f77b4" stroke-width="1.6"'
            shape = (line(data, raw)
                     + line([(x, min(max(y, y0), y1)) for x, y in smooth],
                            smoothed + ' class="smoothed"')
                     + _legend(_LEFT + box_w / 2 - 45, HEIGHT - 6, raw, smoothed, small))
        elif len(data) > 1:
            shape = line(data, 'stroke="#1f77b4" stroke-width="1.5"')
        else:
            shape = f'<circle cx="{sx(xs[0]):.1f}" cy="{sy(ys[0]):.1f}" r="2" fill="#1f77b4"/>'
        bottom, top = _labels(y0, y1)
        body = (shape
                + f'<text x="{_LEFT - 3}" y="{_TOP + 8}" text-anchor="end" {small}>{top}</text>'
                + f'<text x="{_LEFT - 3}" y="{_TOP + box_h}" text-anchor="end" {small}>'
                  f"{bottom}</text>"
                + f'<text x="{_LEFT}" y="{HEIGHT - 6}" {small}>step {_step(x0)}</text>'
                + f'<text x="{WIDTH - _RIGHT}" y="{HEIGHT - 6}" text-anchor="end" {small}>'
                  f"step {_step(x1)}</text>")
    title = (f'<text x="{_LEFT}" y="12" font-size="11" font-weight="bold">{escape(name)}{last}'
             f'<tspan font-weight="normal" fill="#888">{scale}</tspan></text>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
            f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="{FONT}" style="margin:2px 8px 2px 0">'
            f"{title}{frame}{body}</svg>")


def _as_image(name: str, series: Series, svg: str) -> str:
    data = base64.b64encode(svg.encode()).decode()
    alt = escape(f"{name}: last {format_value(series.last[1])} at step "
                 f"{_step(series.last[0])}", quote=True)
    return (f'<img src="data:image/svg+xml;base64,{data}" width="{WIDTH}" height="{HEIGHT}" '
            f'alt="{alt}" style="margin:2px 8px 2px 0">')


class Plots:
    """The charts of every metric of a launch, kept up to date incrementally."""

    def __init__(self) -> None:
        self.series: dict[str, Series] = {}

    def update(self, history: dict[str, list[tuple[int | None, float]]]) -> None:
        """Read what was logged since the last call."""
        for name, points in history.items():
            self.series.setdefault(name, Series()).extend(points)

    def html(self, as_images: bool = False) -> str:
        """Every metric's chart, side by side (empty without metrics).

        Args:
            as_images: each chart as an ``<img>`` holding the SVG as a data URI, not
                inline SVG: a reopened (untrusted) notebook's sanitiser strips inline SVG
                (leaving its labels as stray text) but keeps images.
        """
        shown = [(name, s) for name, s in self.series.items() if s.last is not None]
        charts = [_as_image(name, s, metric_svg(name, s)) if as_images else metric_svg(name, s)
                  for name, s in shown]
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

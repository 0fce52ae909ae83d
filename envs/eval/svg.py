"""Small inline-SVG plots for reports: axes with nice ticks, grouped histograms, CI dot plots, a scatter.

Hand-made instead of a plotting library, so a worker renders a report without matplotlib and the
page stays one self-contained file. Every function returns an ``<svg>`` string; text is escaped.

Axes: `axis_range` gives reward axes that mean something. Values in [0, 1] get the whole [0, 1]
axis (a reward of 1 sits at the right end, not in the middle of 0.96-1.04), a single value gets a
unit-wide window around it, anything else a padded range with round ticks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape

COLORS = ("#2563eb", "#ea580c", "#16a34a", "#9333ea")
"""Policy, baseline, then any further series."""
FONT = 'font-family="system-ui, sans-serif" font-size="12"'


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi] (about `count` of them)."""
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / max(count, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    ticks, value = [], first
    while value <= hi + step * 1e-9:
        ticks.append(round(value, 10))
        value += step
    return ticks


def axis_range(values: Sequence[float], *, unit: tuple[float, float] | None = (0.0, 1.0)) -> tuple[float, float]:
    """An axis for `values`: the `unit` interval when they fit in it, else a padded, never-empty range."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return unit or (0.0, 1.0)
    lo, hi = min(finite), max(finite)
    if unit is not None and unit[0] <= lo and hi <= unit[1]:
        return unit
    if unit is not None:
        lo, hi = min(lo, unit[0]), max(hi, unit[1])
    if hi - lo < 1e-9:
        return lo - 0.5, hi + 0.5
    pad = (hi - lo) * 0.05
    ticks = nice_ticks(lo - pad, hi + pad)
    return min(ticks[0], lo - pad), max(ticks[-1], hi + pad)


def _fmt(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"


@dataclass
class Frame:
    """A plot area inside an SVG: data coordinates to pixels."""

    width: float
    height: float
    left: float = 150.0
    right: float = 20.0
    top: float = 30.0
    bottom: float = 40.0
    x_range: tuple[float, float] = (0.0, 1.0)
    y_range: tuple[float, float] = (0.0, 1.0)

    def x(self, value: float) -> float:
        lo, hi = self.x_range
        return self.left + (value - lo) / (hi - lo) * (self.width - self.left - self.right)

    def y(self, value: float) -> float:
        lo, hi = self.y_range
        return self.height - self.bottom - (value - lo) / (hi - lo) * (self.height - self.top - self.bottom)

    def x_axis(self, label: str) -> list[str]:
        base = self.height - self.bottom
        out = [f'<line x1="{self.left}" y1="{base}" x2="{self.width - self.right}" y2="{base}" stroke="#444"/>']
        for tick in nice_ticks(*self.x_range):
            x = self.x(tick)
            out.append(f'<line x1="{x:.1f}" y1="{self.top}" x2="{x:.1f}" y2="{base}" stroke="#e5e7eb"/>')
            out.append(f'<text x="{x:.1f}" y="{base + 16}" text-anchor="middle" {FONT}>{_fmt(tick)}</text>')
        mid = (self.left + self.width - self.right) / 2
        out.append(f'<text x="{mid:.1f}" y="{self.height - 6}" text-anchor="middle" {FONT}>{escape(label)}</text>')
        return out

    def y_axis(self, label: str) -> list[str]:
        out = [
            f'<line x1="{self.left}" y1="{self.top}" x2="{self.left}" y2="{self.height - self.bottom}" stroke="#444"/>'
        ]
        for tick in nice_ticks(*self.y_range):
            y = self.y(tick)
            out.append(
                f'<line x1="{self.left}" y1="{y:.1f}" x2="{self.width - self.right}" y2="{y:.1f}" stroke="#e5e7eb"/>'
            )
            out.append(f'<text x="{self.left - 6}" y="{y + 4:.1f}" text-anchor="end" {FONT}>{_fmt(tick)}</text>')
        y_mid = (self.top + self.height - self.bottom) / 2
        out.append(
            f'<text x="14" y="{y_mid:.1f}" transform="rotate(-90 14 {y_mid:.1f})" text-anchor="middle" {FONT}>'
            f"{escape(label)}</text>"
        )
        return out


def _svg(width: float, height: float, title: str, body: list[str]) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" role="img" aria-label="{escape(title)}">'
        f'<title>{escape(title)}</title><text x="{width / 2:.0f}" y="18" text-anchor="middle" font-weight="bold" '
        f"{FONT}>{escape(title)}</text>" + "".join(body) + "</svg>"
    )


LEGEND_Y = 38.0
"""Legends run in one row under the title; plots with one start below it."""


def _legend(names: Sequence[str], x: float) -> list[str]:
    out = []
    for i, name in enumerate(names):
        out.append(f'<rect x="{x:.1f}" y="{LEGEND_Y - 9}" width="10" height="10" fill="{COLORS[i % len(COLORS)]}"/>')
        out.append(f'<text x="{x + 14:.1f}" y="{LEGEND_Y}" {FONT}>{escape(name)}</text>')
        x += 24 + 7 * len(name)
    return out


def histogram(series: Mapping[str, Sequence[float]], *, title: str, xlabel: str, bins: int = 10) -> str:
    """Side-by-side bars: each series' share of values per bin, on a shared reward axis."""
    values = [v for vs in series.values() for v in vs]
    lo, hi = axis_range(values)
    edges = [lo + (hi - lo) * i / bins for i in range(bins + 1)]
    shares: dict[str, list[float]] = {}
    for name, vs in series.items():
        counts = [0] * bins
        for v in vs:
            counts[min(bins - 1, max(0, int((v - lo) / (hi - lo) * bins)))] += 1
        shares[name] = [c / len(vs) if vs else 0.0 for c in counts]
    top = max([s for v in shares.values() for s in v] + [0.1])
    y_top = nice_ticks(0, top)[-1] if top < 1 else 1.0
    frame = Frame(640, 320, left=60, top=52, x_range=(lo, hi), y_range=(0.0, y_top))
    body = frame.x_axis(xlabel) + frame.y_axis("share of scored rollouts")
    slot = (frame.x(edges[1]) - frame.x(edges[0])) * 0.8 / max(len(series), 1)
    for s, (name, share) in enumerate(shares.items()):
        for i, value in enumerate(share):
            if value <= 0:
                continue
            x = frame.x(edges[i]) + (frame.x(edges[1]) - frame.x(edges[0])) * 0.1 + s * slot
            y = frame.y(value)
            body.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{slot:.1f}" height="{frame.y(0) - y:.1f}" '
                f'fill="{COLORS[s % len(COLORS)]}"><title>{escape(name)}: {value:.0%} in '
                f"[{_fmt(edges[i])}, {_fmt(edges[i + 1])}]</title></rect>"
            )
    return _svg(frame.width, frame.height, title, body + _legend(list(series), frame.left))


@dataclass
class Point:
    """A labelled estimate with an optional confidence interval."""

    label: str
    value: float
    low: float | None = None
    high: float | None = None
    series: int = 0
    """Index of the series (its colour)."""


def dot_plot(
    points: Sequence[Point],
    *,
    title: str,
    xlabel: str,
    names: Sequence[str] = (),
    unit: tuple[float, float] | None = (0.0, 1.0),
    reference: float | None = None,
) -> str:
    """Rows of labelled dots with CI whiskers; points sharing a label share a row, offset by series."""
    labels = list(dict.fromkeys(p.label for p in points))
    extent = [v for p in points for v in (p.value, p.low, p.high) if v is not None]
    lo, hi = axis_range(extent + ([reference] if reference is not None else []), unit=unit)
    row = 22.0
    top = 52.0 if names else 30.0
    frame = Frame(640, top + 40 + row * len(labels), left=190, top=top, x_range=(lo, hi))
    body = frame.x_axis(xlabel)
    if reference is not None:
        x = frame.x(reference)
        body.append(
            f'<line x1="{x:.1f}" y1="{frame.top}" x2="{x:.1f}" y2="{frame.y(0)}" '
            'stroke="#6b7280" stroke-dasharray="4 3"/>'
        )
    series = max([p.series for p in points] + [0]) + 1
    for i, label in enumerate(labels):
        y0 = frame.top + row * (i + 0.5)
        body.append(f'<text x="{frame.left - 8}" y="{y0 + 4:.1f}" text-anchor="end" {FONT}>{escape(label[:32])}</text>')
        for p in (p for p in points if p.label == label):
            y = y0 + (p.series - (series - 1) / 2) * 6
            color = COLORS[p.series % len(COLORS)]
            if p.low is not None and p.high is not None:
                body.append(
                    f'<line x1="{frame.x(p.low):.1f}" y1="{y:.1f}" x2="{frame.x(p.high):.1f}" y2="{y:.1f}" '
                    f'stroke="{color}" stroke-width="2"/>'
                )
            ci = f" [{_fmt(p.low)}, {_fmt(p.high)}]" if p.low is not None and p.high is not None else ""
            name = names[p.series] if p.series < len(names) else ""
            body.append(
                f'<circle cx="{frame.x(p.value):.1f}" cy="{y:.1f}" r="4" fill="{color}">'
                f"<title>{escape(name)} {escape(label)}: {_fmt(p.value)}{ci}</title></circle>"
            )
    return _svg(frame.width, frame.height, title, body + (_legend(names, frame.left) if names else []))


def scatter(
    points: Sequence[tuple[float, float]], *, title: str, xlabel: str, ylabel: str, diagonal: bool = True
) -> str:
    """One dot per (x, y), sized by how many points share it (counts written beside), with y = x dashed."""
    counts: dict[tuple[float, float], int] = {}
    for x, y in points:
        key = (round(x, 6), round(y, 6))
        counts[key] = counts.get(key, 0) + 1
    lo, hi = axis_range([v for p in points for v in p])
    frame = Frame(440, 440, left=60, right=40, top=56, x_range=(lo, hi), y_range=(lo, hi))
    body = frame.x_axis(xlabel) + frame.y_axis(ylabel)
    if diagonal:
        body.append(
            f'<line x1="{frame.x(lo):.1f}" y1="{frame.y(lo):.1f}" x2="{frame.x(hi):.1f}" y2="{frame.y(hi):.1f}" '
            'stroke="#6b7280" stroke-dasharray="4 3"/>'
        )
    for (x, y), n in sorted(counts.items()):
        r = min(14.0, 3 + 2 * math.sqrt(n))
        body.append(
            f'<circle cx="{frame.x(x):.1f}" cy="{frame.y(y):.1f}" r="{r:.1f}" fill="{COLORS[0]}" fill-opacity="0.6">'
            f"<title>{n} task(s): {xlabel} {_fmt(x)}, {ylabel} {_fmt(y)}</title></circle>"
        )
        if n > 1:
            body.append(f'<text x="{frame.x(x) + r + 2:.1f}" y="{frame.y(y) - r:.1f}" {FONT}>x{n}</text>')
    return _svg(frame.width, frame.height, title, body)

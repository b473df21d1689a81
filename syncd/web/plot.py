"""A line plot's geometry, drawn server-side as SVG by the template (no script, no
library): coordinates here, every label the template escapes."""

from __future__ import annotations

import time
from dataclasses import dataclass

WIDTH, HEIGHT = 760, 240
LEFT, RIGHT, TOP, BOTTOM = 70, 12, 12, 28
MOST_SERIES = 12
MOST_POINTS = 400


@dataclass(frozen=True)
class Series:
    name: str
    points: str  # "x,y x,y …" for a polyline
    last: tuple[float, float]  # where its newest sample is
    value: int  # its newest value


@dataclass(frozen=True)
class Plot:
    width: int
    height: int
    series: list[Series]
    y_top: int  # the value at the top of the axis
    t_from: float
    t_to: float
    left: int = LEFT
    bottom: int = HEIGHT - BOTTOM

    @property
    def empty(self) -> bool:
        return not self.series

    @property
    def from_label(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(self.t_from))

    @property
    def to_label(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(self.t_to))


def lines(data: dict[str, list[tuple[float, int]]], rest: str | None = None) -> Plot:
    """The plot of ``data`` (per name, (time, value) oldest first): the biggest
    ``MOST_SERIES`` names, each thinned to ``MOST_POINTS``, then ``rest`` (the others'
    sum) if ``data`` has it."""
    named = sorted(((n, pts) for n, pts in data.items() if pts and n != rest),
                   key=lambda x: -x[1][-1][1])
    named = named[:MOST_SERIES]
    if rest is not None and data.get(rest):
        named.append((rest, data[rest]))
    if not named:
        return Plot(WIDTH, HEIGHT, [], 0, 0.0, 0.0)
    t0 = min(p[0][0] for _, p in named)
    t1 = max(p[-1][0] for _, p in named)
    if t1 - t0 < 60:  # one sample: a span around it, so it has a place
        t0, t1 = t0 - 1800, t1 + 1800
    top = max(max(v for _, v in p) for _, p in named) or 1
    w, h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    out = []
    for name, pts in named:
        step = max(1, len(pts) // MOST_POINTS)
        kept = pts[::step] if pts[-1] in pts[::step] else [*pts[::step], pts[-1]]
        xy = [(LEFT + (t - t0) / (t1 - t0) * w, TOP + h - v / top * h) for t, v in kept]
        out.append(Series(name, " ".join(f"{x:.1f},{y:.1f}" for x, y in xy), xy[-1],
                          pts[-1][1]))
    return Plot(WIDTH, HEIGHT, out, top, t0, t1)

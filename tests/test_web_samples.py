"""Stored bytes over time: the samples' table and the plot's geometry."""

from __future__ import annotations

import stat
from pathlib import Path

from syncd.web.plot import HEIGHT, LEFT, MOST_POINTS, lines
from syncd.web.samples import KEEP, Samples


def test_samples_keep_each_machine_s_series_and_drop_old_ones(tmp_path: Path) -> None:
    s = Samples(tmp_path / "web.sqlite")
    try:
        assert stat.S_IMODE((tmp_path / "web.sqlite").stat().st_mode) == 0o600
        assert s.last() is None and s.latest() == {}
        s.add(1000.0, {"a": 10, "b": 5})
        s.add(2000.0, {"a": 20})
        assert s.series() == {"a": [(1000.0, 10), (2000.0, 20)], "b": [(1000.0, 5)]}
        assert s.latest() == {"a": 20} and s.last() == 2000.0
        s.add(2000.0 + KEEP + 1, {"a": 30})
        assert s.series() == {"a": [(2000.0 + KEEP + 1, 30)]}
    finally:
        s.close()


def test_the_plot_scales_thins_and_keeps_the_newest_point() -> None:
    data = {"big": [(float(t), t * 10) for t in range(0, 10_000, 5)],
            "small": [(5000.0, 7)]}
    p = lines(data)
    assert [sr.name for sr in p.series] == ["big", "small"]  # the biggest first
    big = p.series[0]
    pts = [tuple(map(float, xy.split(","))) for xy in big.points.split()]
    assert len(pts) <= MOST_POINTS + 1
    assert pts[0][0] == LEFT and pts[-1] == big.last and big.value == 9995 * 10
    assert p.y_top == 9995 * 10 and min(y for _, y in pts) >= 0
    assert all(y <= HEIGHT for _, y in pts)
    assert lines({}).empty and lines({"x": []}).empty
    one = lines({"x": [(100.0, 0)]})  # one sample, zero bytes: a place all the same
    assert one.series and one.t_from < 100.0 < one.t_to

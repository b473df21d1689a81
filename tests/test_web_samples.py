"""Stored bytes over time: the samples' table and the plot's geometry."""

from __future__ import annotations

import sqlite3
import stat
from pathlib import Path

from syncd.web.plot import HEIGHT, LEFT, MOST_POINTS, MOST_SERIES, lines
from syncd.web.samples import EVERY, HOURLY, KEEP, MOST_MACHINES, OTHERS, RECENT, Samples


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


def _times(path: Path) -> list[float]:
    with sqlite3.connect(path) as db:
        return [t for (t,) in db.execute("SELECT DISTINCT time FROM samples ORDER BY time")]


def test_older_samples_are_thinned_to_one_an_hour_then_one_a_day(tmp_path: Path) -> None:
    s = Samples(tmp_path / "web.sqlite")
    start = 1_000_000.0
    try:
        n = int(40 * 86400 / EVERY)  # 40 days, a sample every 10 minutes
        for i in range(n):
            s.add(start + i * EVERY, {"a": i, "b": 2 * i})
        now = start + (n - 1) * EVERY
    finally:
        s.close()
    times = _times(tmp_path / "web.sqlite")
    recent = [t for t in times if t >= now - RECENT]
    hourly = [t for t in times if now - HOURLY <= t < now - RECENT]
    daily = [t for t in times if t < now - HOURLY]
    assert len(recent) == RECENT // EVERY + 1  # every one of the last day
    hours = [int(t // 3600) for t in hourly]
    assert len(hours) == len(set(hours)) and len(hourly) >= (HOURLY - RECENT) / 3600 - 1
    days = [int(t // 86400) for t in daily]
    assert len(days) == len(set(days)) and 9 <= len(daily) <= 11
    assert len(times) < 1000 < n
    # The newest sample of a thinned hour is the one kept, with each machine's figure.
    kept = hourly[len(hourly) // 2]
    assert (kept + EVERY) // 3600 != kept // 3600
    s = Samples(tmp_path / "web.sqlite")
    try:
        i = int((kept - start) / EVERY)
        assert (kept, i) in s.series()["a"] and (kept, 2 * i) in s.series()["b"]
        # Two days later (nothing sampled meanwhile): the day that aged is thinned too.
        s.add(now + 2 * 86400, {"a": 0})
    finally:
        s.close()
    times = _times(tmp_path / "web.sqlite")
    old = [t for t in times if t < now + 2 * 86400 - RECENT]
    assert len(old) == len({int(t // 3600) for t in old}) and len(times) < 900


def test_a_store_of_many_machines_keeps_the_biggest_and_sums_the_rest(
        tmp_path: Path) -> None:
    many = {f"m{i:05d}": i for i in range(10_000)}
    s = Samples(tmp_path / "web.sqlite")
    try:
        s.add(1000.0, many)
        s.add(1600.0, {**many, "m00000": 10**9})
        with sqlite3.connect(tmp_path / "web.sqlite") as db:
            assert db.execute("SELECT count(*) FROM samples").fetchone() == (
                2 * (MOST_MACHINES + 1),)
        latest = s.latest()
        assert sum(latest.values()) == sum(many.values()) + 10**9
        assert len(latest) == MOST_MACHINES + 1 and latest["m00000"] == 10**9
        got = s.series(most=MOST_SERIES)
        top = [f"m{i:05d}" for i in range(9999, 9999 - MOST_SERIES + 1, -1)]
        assert set(got) == {"m00000", *top, OTHERS}
        assert got["m00000"] == [(1600.0, 10**9)]  # not among the biggest before
        rest = sum(many.values()) - sum(many[m] for m in top)  # m00000 held 0 at first
        assert got[OTHERS] == [(1000.0, rest), (1600.0, rest)]
    finally:
        s.close()
    p = lines(got, rest=OTHERS)
    names = [sr.name for sr in p.series]
    assert len(names) == MOST_SERIES + 1 and names[0] == "m00000" and names[-1] == OTHERS
    # A table written before the cap (a row per machine per sample) is bounded at once.
    with sqlite3.connect(tmp_path / "web.sqlite") as db:
        db.executemany("INSERT INTO samples VALUES (500.0, ?, ?)", many.items())
    s = Samples(tmp_path / "web.sqlite")
    try:
        assert _times(tmp_path / "web.sqlite") == [1000.0, 1600.0]
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

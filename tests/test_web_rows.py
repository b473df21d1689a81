"""The sessions view's rows in memory: newest first, filters, pages, search order, and a
reload only when a head changed."""

from __future__ import annotations

from typing import Any

import pytest

from syncd.web import rows as rows_mod
from syncd.web.rows import SessionList
from tests.helpers import wait_for


def raw(i: int, machine: str = "m1") -> dict[str, Any]:
    return {"session_id": f"{i:08d}-0000-4000-8000-000000000000", "machine": machine,
            "project": f"/home/u/p{i % 3}", "title": f"Title {i}", "size": i,
            "last_activity": f"2026-11-{1 + i % 28:02d}T{i % 24:02d}:00:00.000Z",
            "here": "no", "deleted_locally_at": None}


def test_rows_are_newest_first_filtered_and_paged() -> None:
    rows = [raw(i, "m1" if i % 2 else "m2") for i in range(250)]
    sl = SessionList(lambda: (rows, ["one machine unreadable"]), lambda: "v1")
    assert sl.refresh()
    assert sl.problems == ["one machine unreadable"] and sl.machines == ["m1", "m2"]
    first = sl.page(limit=100)
    assert first.total == 250 and len(first.rows) == 100
    times = [r.last_activity for r in sl.page(limit=1000).rows]
    assert times == sorted(times, reverse=True)
    last = sl.page(offset=200, limit=100)
    assert len(last.rows) == 50 and last.rows[-1].last_activity == times[-1]
    only_m2 = sl.page(machine="m2", limit=1000).rows
    assert len(only_m2) == 125 and {r.machine for r in only_m2} == {"m2"}
    assert {r.project for r in sl.page(project="/p1", limit=1000).rows} == {"/home/u/p1"}
    window = sl.page(since="2026-11-10", until="2026-11-12", limit=1000).rows
    assert window and all("2026-11-10" <= r.last_activity[:10] <= "2026-11-12" for r in window)
    # Search: only the hits, in the index's order, whatever their times.
    keys = [(r.machine, r.session) for r in sl.page(limit=1000).rows[::-50]]
    ranked = sl.page(only=set(keys), rank={k: i for i, k in enumerate(keys)}, limit=1000)
    assert [(r.machine, r.session) for r in ranked.rows] == keys
    found = sl.page(text="TITLE 17", limit=1000).rows  # case aside; titles and projects
    assert {r.session for r in found} == {
        r["session_id"] for r in rows if r["title"].startswith("Title 17")}
    assert sl.page(text="/home/u/p2").total == len([r for r in rows
                                                    if r["project"].endswith("2")])


def test_a_reload_only_when_a_head_changed() -> None:
    loads: list[int] = []
    version = ["a"]

    def load() -> tuple[list[dict[str, Any]], list[str]]:
        loads.append(1)
        return [raw(i) for i in range(len(loads))], []

    sl = SessionList(load, lambda: version[0])
    assert sl.refresh() and not sl.refresh() and not sl.refresh()
    assert len(loads) == 1 and sl.page().total == 1
    version[0] = "b"
    assert sl.refresh() and len(loads) == 2 and sl.page().total == 2


def test_a_hostile_row_is_held_as_text() -> None:
    bad = {**raw(1), "title": None, "project": None, "size": None, "last_activity": None}
    sl = SessionList(lambda: ([bad], []), lambda: 0)
    sl.refresh()
    r = sl.page().rows[0]
    assert (r.title, r.project, r.size, r.last_activity) == ("", "", 0, "")


def test_the_heads_are_looked_at_again_when_the_view_is_asked_for(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rows_mod, "REFRESH", 0.05)
    looks: list[str] = []
    version = ["a"]

    def look() -> str:
        looks.append(version[0])
        return version[0]

    sl = SessionList(lambda: ([raw(i) for i in range(len(version[0]))], []), look)
    sl.start()
    try:
        assert sl.wait(30) and sl.page().total == 1
        version[0] = "bb"
        # Asked for (as each view asks): the change is seen.
        wait_for(lambda: sl.wanted() or sl.page().total == 2, what="a reload")
    finally:
        sl.stop()
    assert looks[0] == "a" and looks[-1] == "bb"

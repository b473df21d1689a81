"""The sessions view's rows in memory: newest first, filters, pages, search order, and a
reload only when a head changed, of that machine only."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from syncd.config import load_settings
from syncd.format import head as headfmt
from syncd.format.catalog import Session
from syncd.repository import Repository
from syncd.store import layout, open_store
from syncd.web import rows as rows_mod
from syncd.web import sessions as sessions_mod
from syncd.web.rows import Loaded, Row, SessionList, row_of
from syncd.web.security import Guard
from syncd.web.sessions import session_list
from syncd.web.site import Site
from tests.counting import CountingStore
from tests.helpers import wait_for


def raw(i: int, machine: str = "m1") -> dict[str, Any]:
    return {"session_id": f"{i:08d}-0000-4000-8000-000000000000", "machine": machine,
            "project": f"/home/u/p{i % 3}", "title": f"Title {i}", "size": i,
            "last_activity": f"2026-11-{1 + i % 28:02d}T{i % 24:02d}:00:00.000Z",
            "here": "no", "deleted_locally_at": None}


def session(r: dict[str, Any]) -> Session:
    fields = {k: v for k, v in (("cwd", r["project"]), ("ai_title", r["title"]),
                                ("last_activity", r["last_activity"])) if v is not None}
    return Session(r["session_id"], r["machine"],
                   f"projects/-p/{r['session_id']}.jsonl".encode(), 1, r["size"] or 0,
                   r["deleted_locally_at"], fields=fields)


def loader(make: Callable[[], list[dict[str, Any]]], problems: list[str] | None = None
           ) -> Callable[[list[str]], Loaded]:
    """A ``load`` of the rows ``make()`` gives, by machine (problems: the first's)."""
    def load(names: list[str]) -> Loaded:
        got = make()
        for i, m in enumerate(names):
            yield m, [row_of(session(r), r["here"]) for r in got if r["machine"] == m], \
                (problems or []) if i == 0 else []
    return load


def test_rows_are_newest_first_filtered_and_paged() -> None:
    rows = [raw(i, "m1" if i % 2 else "m2") for i in range(250)]
    sl = SessionList(loader(lambda: rows, ["one machine unreadable"]),
                     lambda: {"m1": "v1", "m2": "v1"})
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

    def make() -> list[dict[str, Any]]:
        loads.append(1)
        return [raw(i) for i in range(len(loads))]

    sl = SessionList(loader(make), lambda: {"m1": version[0]})
    assert sl.refresh() and not sl.refresh() and not sl.refresh()
    assert len(loads) == 1 and sl.page().total == 1
    version[0] = "b"
    assert sl.refresh() and len(loads) == 2 and sl.page().total == 2


def test_a_hostile_row_is_held_as_text() -> None:
    bad = {**raw(1), "title": None, "project": None, "size": None, "last_activity": None}
    sl = SessionList(loader(lambda: [bad]), lambda: {"m1": 0})
    sl.refresh()
    r = sl.page().rows[0]
    assert (r.title, r.project, r.size, r.last_activity) == ("", "", 0, "")


def test_the_heads_are_looked_at_again_when_the_view_is_asked_for(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rows_mod, "REFRESH", 0.05)
    looks: list[str] = []
    version = ["a"]

    def look() -> dict[str, object]:
        looks.append(version[0])
        return {"m1": version[0]}

    sl = SessionList(loader(lambda: [raw(i) for i in range(len(version[0]))]), look)
    sl.start()
    try:
        assert sl.wait(30) and sl.page().total == 1
        version[0] = "bb"
        # Asked for (as each view asks): the change is seen.
        wait_for(lambda: sl.wanted() or sl.page().total == 2, what="a reload")
    finally:
        sl.stop()
    assert looks[0] == "a" and looks[-1] == "bb"


def head(machine: str, n: int, seq: int = 1) -> bytes:
    sessions = [headfmt.HeadSession(
        f"projects/-home-u-p{k % 2}/{k:08d}-0000-4000-8000-{seq:012d}.jsonl".encode(), 1,
        100 + k, None, {"cwd": f"/home/u/p{k % 2}", "ai_title": f"{machine} {k}",
                        "last_activity": f"2026-11-{1 + k:02d}T00:00:00.000Z"})
        for k in range(n)]
    return headfmt.encode(headfmt.Head(machine, 1.79e9, seq, 1.79e9, {"home": "/home/u"},
                                       {}, sessions))


def test_a_changed_head_reads_that_machine_again_not_every_machine(tmp_path: Path) -> None:
    root = tmp_path / "store"
    machines = [f"u.m{i}-0000000{i}" for i in range(3)]
    for m in machines:
        (root / layout.machine_prefix(m)).mkdir(parents=True)
        (root / layout.head_key(m)).write_bytes(head(m, 4))
        (root / layout.machine_key(m)).write_text(json.dumps({"machine": m}))
    s = load_settings(Path(os.devnull), source=tmp_path / "src", state_dir=tmp_path / "st",
                      store=root.as_uri(), machine_id="u.reader-00000000")
    site = Site(s, Guard("t", "127.0.0.1:1"))
    store = CountingStore(open_store(root.as_uri()))
    site._repo = Repository(store, s.machine_id)
    sl = session_list(site)
    sl.stop()
    assert sl.wait(30) and sl.page().total == 12
    gets = store.counts.by_kind()["GET"]
    assert gets >= 3  # every head read once
    (root / layout.head_key(machines[1])).write_bytes(head(machines[1], 6, seq=2))
    assert sl.refresh()
    # One head read again; the others' rows are kept as they were.
    assert store.counts.by_kind()["GET"] - gets == 1
    assert sl.page().total == 4 + 6 + 4
    assert sorted({r.title for r in sl.page(machine=machines[1]).rows}) == \
        sorted(f"{machines[1]} {k}" for k in range(6))
    assert not sl.refresh()  # nothing changed since


def test_rows_hold_what_many_share_once() -> None:
    rows = [raw(i) for i in range(6)]
    sl = SessionList(loader(lambda: [dict(r, project=f"/home/u/{'p'}1") for r in rows]),
                     lambda: {"m1": 1})
    sl.refresh()
    got = sl.page().rows
    assert len(got) == 6 and all(isinstance(r, Row) for r in got)
    # Made per row (from JSON, each its own string), held once: 100,000 rows fit.
    assert len({id(r.project) for r in got}) == 1
    assert len({id(r.machine) for r in got}) == 1


def test_a_big_first_load_shows_what_is_read_before_every_head_is(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rows_mod, "PARTIAL_MIN", 3)
    monkeypatch.setattr(rows_mod, "PARTIAL_AFTER", 0.0)
    go = threading.Event()
    m1 = [raw(i, "m1") for i in range(4)]
    m2 = [raw(i + 10, "m2") for i in range(2)]

    def load(names: list[str]) -> Loaded:
        assert names == ["m1", "m2", "m3"]
        yield "m1", [row_of(session(r), "no") for r in m1], []
        assert go.wait(30)  # the last machines' heads take their time
        yield "m2", [row_of(session(r), "no") for r in m2], []
        yield "m3", [], []

    sl = SessionList(load, lambda: {"m1": 1, "m2": 1, "m3": 1})
    sl.start()
    try:
        assert not sl.wait_first(0.0, 30)  # not whole, but rows to show
        assert sl.reading == (1, 3) and sl.page().total == 4 and sl.machines == ["m1"]
        times = [r.last_activity for r in sl.page().rows]
        assert times == sorted(times, reverse=True)
        assert sl.loaded_at is None
        go.set()
        assert sl.wait(30) and sl.wait_first(0.0, 30)
        assert sl.reading is None and sl.page().total == 6
        assert sl.machines == ["m1", "m2"]
        assert not sl.refresh()  # the partial rows are not what a reload compares
    finally:
        go.set()
        sl.stop()


def test_a_small_first_load_is_never_partial(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rows_mod, "PARTIAL_AFTER", 0.0)
    shown: list[object] = []

    def load(names: list[str]) -> Loaded:
        for m in names:
            shown.append(sl.reading)
            yield m, [row_of(session(raw(i, m)), "no") for i in range(3)], []

    sl = SessionList(load, lambda: {"m1": 1, "m2": 1})
    assert sl.refresh()
    assert shown == [None, None] and sl.reading is None and sl.page().total == 6


class _Together(CountingStore):
    """Each HEAD of a head waits until ``n`` are in flight: HEADs made one after
    another never get there (the barrier breaks at its deadline)."""

    def __init__(self, inner: Any, n: int) -> None:
        super().__init__(inner)
        self.barrier = threading.Barrier(n, timeout=30)

    def head(self, key: str) -> Any:
        if key.endswith("/head"):
            self.barrier.wait()
        return super().head(key)


def test_the_heads_are_looked_at_concurrently(tmp_path: Path) -> None:
    root = tmp_path / "store"
    machines = [f"u.m{i}-0000000{i}" for i in range(4)]
    for m in machines:
        (root / layout.machine_prefix(m)).mkdir(parents=True)
        (root / layout.head_key(m)).write_bytes(head(m, 1))
    s = load_settings(Path(os.devnull), source=tmp_path / "src", state_dir=tmp_path / "st",
                      store=root.as_uri(), machine_id="u.reader-00000000")
    site = Site(s, Guard("t", "127.0.0.1:1"))
    site._repo = Repository(_Together(open_store(root.as_uri()), len(machines)),
                            s.machine_id)
    sl = SessionList(lambda names: iter(()), lambda: sessions_mod._version(site))
    got = sl.version()
    assert list(got) == machines and all(got.values())

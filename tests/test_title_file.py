"""A session's title file (``<sid>/custom-title.json``, Claude Code 2.1.332): its title
reaches the catalog when the shipper ships it, and wins as in Claude's own list."""

from __future__ import annotations

import json
from pathlib import Path

from syncd.backup.engine import sync_once
from syncd.format.catalog import title_file_fields, title_file_owner
from syncd.repository import Repository
from syncd.restore.listing import session_rows
from syncd.store import LocalStore
from tests.helpers import write
from tests.hostile import line
from tests.test_head import head_of, settings

A = "0a0eb7b7-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
C = "2c2eb7b7-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
PA = f"projects/-home-u-app/{A}.jsonl"
TA = f"projects/-home-u-app/{A}/custom-title.json"


def _title_file(title: object, **kw: object) -> bytes:
    return json.dumps({"customTitle": title, "by": "user", "at": "2026-12-01T10:00:00.000Z",
                       **kw}).encode()


def _record(title: str) -> bytes:
    return json.dumps({"type": "custom-title", "customTitle": title, "sessionId": A},
                      separators=(",", ":")).encode() + b"\n"


def _titles(tmp_path: Path) -> dict[str, str]:
    repo = Repository(LocalStore(tmp_path / "store"), "m1")
    return {r["session_id"]: r["title"] for r in session_rows(repo, tmp_path / "none")}


def test_the_title_files_path_and_shape() -> None:
    assert title_file_owner(TA.encode()) == PA.encode()
    for other in (f"projects/-a/{A}.custom-title.json", "projects/-a/x/custom-title.json",
                  f"projects/-a/{A}/subagents/custom-title.json", "custom-title.json"):
        assert title_file_owner(other.encode()) is None, other
    assert title_file_fields(_title_file("  Bug hunt ")) == {"custom_title": "Bug hunt"}
    for bad in (b"", b"{", b"[]", b'"t"', _title_file(7), _title_file("  "),
                b"\xff\xfe", _title_file("x", pad="y" * (16 << 10))):
        assert title_file_fields(bad) == {}, bad[:40]


def test_the_title_file_names_the_session_in_the_catalog(tmp_path: Path) -> None:
    s = settings(tmp_path)
    write(s.source, PA, line(A, "/home/u/app", 0, "hello there") + _record("Old name"))
    write(s.source, TA, _title_file("New name"))
    sync_once(s)
    assert _titles(tmp_path) == {A: "New name"}
    h = head_of(s)  # the head says so too, and the transcript's own fields are kept
    assert h is not None and h.sessions[0].fields["custom_title"] == "New name"
    assert h.sessions[0].fields["first_prompt"] == "hello there"
    # Renamed: the file alone changes (another flush).
    write(s.source, TA, _title_file("Renamed"))
    sync_once(s)
    assert _titles(tmp_path) == {A: "Renamed"}
    # Renamed again with the transcript's record in the same flush: the file, shipped
    # after its transcript, has the last word (the two agree when Claude writes them).
    write(s.source, PA, _record("Third"), mode="ab")
    write(s.source, TA, _title_file("Third, as the file has it"))
    sync_once(s)
    assert _titles(tmp_path) == {A: "Third, as the file has it"}


def test_a_title_file_that_is_not_claudes_or_has_no_session_names_nothing(
        tmp_path: Path) -> None:
    s = settings(tmp_path)
    write(s.source, PA, line(A, "/home/u/app", 0, "hello there"))
    write(s.source, TA, _title_file("x" * 20_000))  # over the cap: not read
    write(s.source, f"projects/-home-u-app/{C}/custom-title.json", _title_file("Orphan"))
    sync_once(s)
    assert _titles(tmp_path) == {A: "hello there"}


def test_the_title_files_title_outlives_a_rewrite_of_the_transcript(tmp_path: Path) -> None:
    """Claude rewrites a transcript whole (a patch: a new generation whose catalog is read
    from the file afresh): the title from custom-title.json stays."""
    s = settings(tmp_path)
    rows = b"".join(line(A, "/home/u/app", i, f"prompt {i} " + "x" * 900) for i in range(120))
    write(s.source, PA, rows)
    write(s.source, TA, _title_file("Named by the user"))
    sync_once(s)
    write(s.source, PA, line(A, "/home/u/app", 120, "more"), mode="ab")
    sync_once(s)
    data = (s.source / PA).read_bytes()
    early = data.splitlines(keepends=True)[5]
    (s.source / PA).write_bytes(data.replace(early, b"", 1))  # a row far back: a patch
    sync_once(s)
    assert _titles(tmp_path) == {A: "Named by the user"}

"""What Claude Code sets aside when it moves a session (docs DESIGN §4a): a transcript
that was already at the destination becomes ``<sid>.jsonl.superseded-<ms>``, an
unreadable one ``<sid>.orphaned-<ms>-<hex>.jsonl``. They are backed up and restored like
any file, but are no session of their own: never listed, cataloged or resumed."""

from __future__ import annotations

from pathlib import Path

import pytest

from syncd.backup.engine import sync_once
from syncd.errors import LookupFailed
from syncd.format.catalog import session_of, session_of_any
from syncd.repository import Repository
from syncd.restore.listing import find_session, load_all, session_rows
from syncd.restore.restorer import RestoreOptions, restore
from syncd.store import LocalStore
from tests.helpers import write
from tests.hostile import line
from tests.test_head import head_of, settings

A = "0a0eb7b7-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
C = "2c2eb7b7-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
DIR = "projects/-home-u-app"
LIVE = f"{DIR}/{A}.jsonl"
SUPERSEDED = f"{DIR}/{A}.jsonl.superseded-1764483300123"
ORPHANED = f"{DIR}/{C}.orphaned-1764483300123-9f3a1c.jsonl"
SET_ASIDE = (SUPERSEDED, ORPHANED)


def test_set_aside_names_are_no_session() -> None:
    for rel in SET_ASIDE:
        assert session_of(rel.encode()) is None and session_of_any(rel.encode()) is None
    assert session_of(LIVE.encode()) == A


def test_set_aside_files_are_kept_but_never_listed_or_resumed(tmp_path: Path) -> None:
    s = settings(tmp_path)
    write(s.source, LIVE, line(A, "/home/u/app", 0, "the live one"))
    write(s.source, SUPERSEDED, line(A, "/home/u/app", 0, "the one it replaced"))
    write(s.source, ORPHANED, line(C, "/home/u/app", 0, "an unreadable one"))
    sync_once(s)
    repo = Repository(LocalStore(tmp_path / "store"), "m1")

    # Kept like any file...
    backups, problems = load_all(repo)
    assert problems == []
    stored = set(backups[0].files)
    assert {p.encode() for p in (LIVE, *SET_ASIDE)} <= stored
    # ... but the catalog (backup and head alike) knows one session, the live one.
    assert [x.session_id for x in backups[0].sessions.values()] == [A]
    h = head_of(s)
    assert h is not None and [x.path for x in h.sessions] == [LIVE.encode()]
    rows = session_rows(repo, tmp_path / "none")
    assert [(r["session_id"], r["title"]) for r in rows] == [(A, "the live one")]
    # The orphan's id names no session to resume.
    with pytest.raises(LookupFailed, match="in no backup"):
        find_session(repo, C)

    # A whole restore brings them back; a session's restore brings its transcript only.
    out = tmp_path / "out"
    restore(repo, RestoreOptions(target=out))
    for rel in (LIVE, *SET_ASIDE):
        assert (out / rel).read_bytes() == (s.source / rel).read_bytes(), rel
    one = tmp_path / "one"
    r = restore(repo, RestoreOptions(target=one, sessions=(A,)))
    assert r.errors == [] and (one / LIVE).exists()
    assert not any((one / rel).exists() for rel in SET_ASIDE)

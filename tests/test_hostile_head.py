"""The machine's head under attack and against the backup it summarizes: what a reader of
heads lists is what a reader of the backups lists, whatever the history; a bucket's heads
never take more of a reader than one head's worth; a head rolled back is reported."""

from __future__ import annotations

from pathlib import Path

from syncd.archive.compact import compact
from syncd.archive.options import compact_options
from syncd.backup.engine import sync_once
from syncd.repository import Repository
from syncd.restore.listing import load_all, session_rows, sessions_table
from syncd.store import LocalStore
from tests.helpers import write
from tests.hostile import line
from tests.test_head import PA, PB, A, B, settings


def same_listing(tmp_path: Path) -> None:
    repo = Repository(LocalStore(tmp_path / "store"), "m1")
    backups, problems = load_all(repo)
    assert problems == []
    expect = sorted(sessions_table(backups, tmp_path / "none"), key=lambda r: r["session_id"])
    got = sorted(session_rows(repo, tmp_path / "none"), key=lambda r: r["session_id"])
    assert got == expect


def test_a_generation_that_names_no_field_keeps_the_last_ones_as_the_backup_does(
        tmp_path: Path) -> None:
    s = settings(tmp_path)
    write(s.source, PA, line(A, "/home/u/app", 0, "hello") + line(A, "/home/u/app", 1))
    sync_once(s)
    same_listing(tmp_path)
    write(s.source, PA, b"")  # truncated: a new generation, no line yet
    sync_once(s)
    same_listing(tmp_path)
    write(s.source, PA, b"not json\n", "ab")
    sync_once(s)
    same_listing(tmp_path)
    write(s.source, PA, line(A, "/home/u/other", 5, "bye"), "ab")
    sync_once(s)
    same_listing(tmp_path)


def test_heads_list_what_the_backup_lists_through_deletion_recreation_and_compaction(
        tmp_path: Path) -> None:
    s = settings(tmp_path)
    repo = Repository(LocalStore(tmp_path / "store"), "m1")
    write(s.source, PA, b"")
    write(s.source, PB, line(B, "/home/u/lib", 0, "b"))
    sync_once(s)
    same_listing(tmp_path)
    write(s.source, PA, line(A, "/home/u/app", 0, "hello") + line(A, "/home/u/app", 1))
    (s.source / PB).unlink()
    sync_once(s)
    same_listing(tmp_path)
    compact(repo, compact_options(s))
    same_listing(tmp_path)
    write(s.source, PB, line(B, "/home/u/other", 3, "again"))
    write(s.source, PA, b"")
    sync_once(s)
    same_listing(tmp_path)
    compact(repo, compact_options(s))
    same_listing(tmp_path)

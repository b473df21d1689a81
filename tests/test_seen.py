from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from syncd.errors import BackupError
from syncd.repository import Repository
from syncd.restore.listing import machines_table
from syncd.seen import MAX_MACHINES, Seen
from syncd.store import MemoryStore
from syncd.store.layout import segment_key
from syncd.view import load_backup
from tests.helpers import shipper, write

T = "projects/-home-a/0a0eb7b7-1c2d-4e5f-8a9b-0c1d2e3f4a5b.jsonl"


def test_a_store_that_holds_less_than_was_seen_is_reported(tmp_path: Path) -> None:
    seen = Seen(tmp_path / "state", "memory://")
    assert seen.check("m1", 5) is None
    seen.saw("m1", 5)
    seen.save()
    again = Seen(tmp_path / "state", "memory://")  # another command, later
    assert again.check("m1", 6) is None
    again.saw("m1", 6)
    problem = again.check("m1", 3)
    assert problem is not None and "0000000000000006" in problem and "rolled back" in problem
    assert again.check("m1", None) is not None
    # Another store (another URL) knows nothing of it.
    assert Seen(tmp_path / "state", "file:///other/").check("m1", 0) is None


def test_the_file_keeps_the_marks_refreshed_last(tmp_path: Path) -> None:
    seen = Seen(tmp_path / "state", "memory://")
    seen.saw("mine", 7)
    for i in range(MAX_MACHINES + 10):
        seen.saw(f"planted{i}", 1)
    seen.saw("mine", 8)
    seen.save()
    again = Seen(tmp_path / "state", "memory://")
    assert again.check("mine", 7) is not None
    assert again.check(f"planted{MAX_MACHINES + 9}", 0) is not None
    assert again.check("planted0", 0) is None  # the oldest marks went first


def test_a_planted_name_does_not_raise_the_mark(tmp_path: Path) -> None:
    """A segment name nobody wrote (unreadable) must not leave every later read
    reporting a rollback once it is removed."""
    src, store = tmp_path / "src", MemoryStore()
    sh = shipper(src, store, tmp_path / "st.db")
    write(src, T, b"line 0\n", "ab")
    sh.ship([T.encode()])
    seen = Seen(tmp_path / "state", store.url)
    planted = segment_key("m1", 0xFFFF)
    store.put(planted, b"not a segment")
    b = load_backup(Repository(store, "m1"), seen=seen)
    assert any(planted in e for e in b.errors)
    rows, problems = machines_table(Repository(store, "m1"), seen)
    assert rows and any(planted in p for p in problems)
    store.delete_many([planted])
    assert load_backup(Repository(store, "m1"), seen=seen).errors == []
    assert machines_table(Repository(store, "m1"), seen)[1] == []


def test_a_rolled_back_backup_is_an_error_of_its_load(tmp_path: Path) -> None:
    src, store = tmp_path / "src", MemoryStore()
    sh = shipper(src, store, tmp_path / "st.db")
    for i in range(3):
        write(src, T, b"line %d\n" % i, "ab")
        sh.ship([T.encode()])
    seen = Seen(tmp_path / "state", store.url)
    assert load_backup(Repository(store, "m1"), seen=seen).errors == []
    store.delete_many([segment_key("m1", 2)])
    b = load_backup(Repository(store, "m1"), seen=seen)
    assert len(b.errors) == 1 and "0000000000000002" in b.errors[0]
    store.delete_many([segment_key("m1", s) for s in (0, 1)])
    try:
        load_backup(Repository(store, "m1"), seen=seen)
    except BackupError as e:
        assert "rolled back" in str(e)
    else:
        raise AssertionError("a backup that vanished was not reported")


def test_a_save_that_fails_leaves_no_temp_file_and_is_tried_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = Seen(tmp_path / "state", "memory://")
    seen.saw("m1", 5)

    def full(src: object, dst: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    seen.save()  # a full state dir: the marks wait, the command goes on
    assert [p.name for p in (tmp_path / "state").iterdir()] == []
    monkeypatch.undo()
    seen.save()
    assert Seen(tmp_path / "state", "memory://").check("m1", 3) is not None

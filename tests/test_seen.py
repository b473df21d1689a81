from __future__ import annotations

from pathlib import Path

from syncd.errors import BackupError
from syncd.repository import Repository
from syncd.seen import Seen
from syncd.store import MemoryStore
from syncd.store.layout import segment_key
from syncd.view import load_backup
from tests.helpers import shipper, write

T = "projects/-home-a/0a0eb7b7-1c2d-4e5f-8a9b-0c1d2e3f4a5b.jsonl"


def test_a_store_that_holds_less_than_was_seen_is_reported(tmp_path: Path) -> None:
    seen = Seen(tmp_path / "state", "memory://")
    assert seen.check("m1", 5) is None
    seen.save()
    again = Seen(tmp_path / "state", "memory://")  # another command, later
    assert again.check("m1", 6) is None
    problem = again.check("m1", 3)
    assert problem is not None and "0000000000000006" in problem and "rolled back" in problem
    assert again.check("m1", None) is not None
    # Another store (another URL) knows nothing of it.
    assert Seen(tmp_path / "state", "file:///other/").check("m1", 0) is None


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

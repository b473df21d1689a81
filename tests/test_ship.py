from __future__ import annotations

from pathlib import Path

import pytest

from syncd.backup.ship import Shipper, ship_with_restart
from syncd.backup.state import State
from syncd.errors import LeaseHeld, StoreError
from syncd.repository import Repository
from syncd.restore.restorer import restore_tree
from syncd.store import MemoryStore, ObjectInfo
from syncd.store.layout import segment_key
from tests.helpers import all_extents, shipper, tree_bytes, write
from tests.readers import read_index

S1 = "projects/-home-a/s1.jsonl"
S2 = "projects/-home-a/s2.jsonl"


def test_append_ships_only_new_bytes(tmp_path: Path) -> None:
    src, store = tmp_path / "src", MemoryStore()
    write(src, S1, b'{"a":1}\n')
    sh = shipper(src, store, tmp_path / "st.db")
    sh.ship([S1.encode()])
    write(src, S1, b'{"b":2}\n', "ab")
    r = sh.ship([S1.encode()])
    assert r.raw_bytes == 8
    ext = read_index(store, segment_key("m1", 1)).extents
    assert [(e.gen, e.start, e.end) for e in ext] == [(1, 8, 16)]


def test_one_put_per_flush_however_many_files(tmp_path: Path) -> None:
    src, store = tmp_path / "src", MemoryStore()
    paths = [f"projects/p/{i}.jsonl" for i in range(50)]
    for p in paths:
        write(src, p, b"x" * 100)
    sh = shipper(src, store, tmp_path / "st.db")
    sh.recover()
    before = store.puts
    r = sh.ship([p.encode() for p in paths])
    assert store.puts - before == 1 and r.segments == [0] and r.files == 50


def test_nothing_new_ships_nothing(tmp_path: Path) -> None:
    src, store = tmp_path / "src", MemoryStore()
    write(src, S1, b"abc")
    sh = shipper(src, store, tmp_path / "st.db")
    sh.ship([S1.encode()])
    puts = store.puts
    assert sh.ship([S1.encode()]).segments == []
    assert store.puts == puts


@pytest.mark.parametrize("change,reason", [
    ("truncate", "truncated"),
    ("rewrite", "rewritten"),
    ("replace", "new inode"),
])
def test_new_generation_is_a_full_copy(tmp_path: Path, change: str, reason: str,
                                       caplog: pytest.LogCaptureFixture) -> None:
    src, store = tmp_path / "src", MemoryStore()
    f = write(src, S1, b"line one\nline two\n")
    sh = shipper(src, store, tmp_path / "st.db")
    sh.ship([S1.encode()])
    if change == "truncate":
        f.write_bytes(b"line\n")
    elif change == "rewrite":
        with open(f, "r+b") as fh:
            fh.write(b"LINE")
    else:
        tmp = write(src, S1 + ".new", b"other content entirely\n")
        tmp.rename(f)
    caplog.set_level("INFO")
    sh.ship([S1.encode()])
    ext = read_index(store, segment_key("m1", 1)).extents
    assert [(e.gen, e.start, e.end) for e in ext] == [(2, 0, f.stat().st_size)]
    assert reason in (ext[0].reason or "")
    assert reason in caplog.text
    out = tmp_path / "out"
    restore_tree(Repository(store, "m1"), out)
    assert (out / S1).read_bytes() == f.read_bytes()


def test_deletion_is_a_tombstone_and_data_stays(tmp_path: Path) -> None:
    src, store = tmp_path / "src", MemoryStore()
    f = write(src, S1, b"precious\n")
    write(src, S2, b"other\n")
    sh = shipper(src, store, tmp_path / "st.db")
    sh.ship([S1.encode(), S2.encode()])
    f.unlink()
    r = sh.ship([S1.encode()])
    assert r.tombstones == 1
    ix = read_index(store, segment_key("m1", 1))
    assert [t.path for t in ix.tombstones] == [S1.encode()] and ix.tombstones[0].time > 0
    assert store.head(segment_key("m1", 0)) is not None  # never deleted
    out = tmp_path / "out"
    restore_tree(Repository(store, "m1"), out)
    assert (out / S1).read_bytes() == b"precious\n"


def test_a_flush_of_deletions_is_logged_as_such(tmp_path: Path,
                                                caplog: pytest.LogCaptureFixture) -> None:
    src, store = tmp_path / "src", MemoryStore()
    for rel in (S1, S2):
        write(src, rel, b"line\n")
    sh = shipper(src, store, tmp_path / "st.db")
    sh.ship([S1.encode(), S2.encode()])
    for rel in (S1, S2):
        (src / rel).unlink()
    caplog.set_level("INFO", logger="syncd.ship")
    sh.ship([S1.encode(), S2.encode()])
    said = [r.getMessage() for r in caplog.records if "flushed segment 1" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("flushed segment 1: 2 deletions -> "), said
    write(src, S1, b"again\n")
    (src / S2).write_bytes(b"x")
    caplog.clear()
    sh.ship([S1.encode(), S2.encode()])
    assert "flushed segment 2: 2 files, 7 bytes -> " in caplog.text, caplog.text


def test_recreated_file_starts_new_generation(tmp_path: Path) -> None:
    src, store = tmp_path / "src", MemoryStore()
    f = write(src, S1, b"old\n")
    sh = shipper(src, store, tmp_path / "st.db")
    sh.ship([S1.encode()])
    f.unlink()
    sh.ship([S1.encode()])
    write(src, S1, b"new\n")
    sh.ship([S1.encode()])
    out = tmp_path / "out"
    restore_tree(Repository(store, "m1"), out)
    assert (out / S1).read_bytes() == b"new\n"


def test_failed_put_leaves_state_untouched(tmp_path: Path) -> None:
    class Broken(MemoryStore):
        def put(self, key: str, data: bytes, *, if_none_match: bool = True) -> None:
            if "/seg/" in key:
                raise StoreError("boom")
            super().put(key, data, if_none_match=if_none_match)

    src, store = tmp_path / "src", Broken()
    write(src, S1, b"abc")
    sh = shipper(src, store, tmp_path / "st.db")
    with pytest.raises(StoreError):
        sh.ship([S1.encode()])
    assert sh.state.get(S1.encode()) is None and sh.state.next_seq == 0


def _killed_after_put(sh: Shipper, *paths: str) -> None:
    """``sh`` ships ``paths`` and dies after the PUT, before the state's commit."""

    def crash(*a: object, **k: object) -> None:
        raise SystemExit("killed after PUT")

    sh.state.commit = crash  # type: ignore[method-assign]
    with pytest.raises(SystemExit):
        sh.ship([p.encode() for p in paths])
    sh.state.close()


def test_crash_between_put_and_commit_is_adopted(tmp_path: Path) -> None:
    """The object landed, the commit did not: the next run adopts it, ships nothing twice."""
    src, store = tmp_path / "src", MemoryStore()
    write(src, S1, b"a" * 1000)
    write(src, S2, b"b" * 1000)
    _killed_after_put(shipper(src, store, tmp_path / "st.db"), S1, S2)
    write(src, S1, b"c" * 10, "ab")
    sh2 = shipper(src, store, tmp_path / "st.db")
    r = ship_with_restart(sh2, [S1.encode(), S2.encode()])
    assert r.raw_bytes == 10
    assert sorted((e.path, e.start, e.end) for e in all_extents(store)) == [
        (S1.encode(), 0, 1000), (S1.encode(), 1000, 1010), (S2.encode(), 0, 1000)]


def test_an_adopted_segment_whose_bytes_changed_locally_starts_a_new_generation(
        tmp_path: Path) -> None:
    """Crash between PUT and commit, then the file is rewritten (same length) before the
    restart: the segment is adopted, but the local bytes are not taken as shipped."""
    src, store = tmp_path / "src", MemoryStore()
    write(src, S1, b"a" * 1000)
    _killed_after_put(shipper(src, store, tmp_path / "st.db"), S1)
    with open(src / S1, "r+b") as f:  # the same inode, other bytes
        f.write(b"z" * 1000)
    sh2 = shipper(src, store, tmp_path / "st.db")
    ship_with_restart(sh2, [S1.encode()])
    restore_tree(Repository(store, "m1"), tmp_path / "out")
    assert (tmp_path / "out" / S1).read_bytes() == b"z" * 1000


def test_lost_state_is_rebuilt_from_the_store(tmp_path: Path) -> None:
    src, store = tmp_path / "src", MemoryStore()
    write(src, S1, b"x" * 500)
    shipper(src, store, tmp_path / "a.db").ship([S1.encode()])
    write(src, S1, b"y" * 5, "ab")
    sh = shipper(src, store, tmp_path / "fresh.db")
    assert sh.recover() == 1
    r = sh.ship([S1.encode()])
    assert r.raw_bytes == 5


def test_a_foreign_segment_at_our_seq_is_passed_over_not_adopted(tmp_path: Path) -> None:
    src, store = tmp_path / "src", MemoryStore()
    write(src, S1, b"x")
    shipper(src, store, tmp_path / "a.db", machine="other").ship([S1.encode()])
    store.put(segment_key("m1", 0), store.get(segment_key("other", 0)))
    sh = shipper(src, store, tmp_path / "b.db")
    assert sh.recover() == 1
    assert sh.state.next_seq == 1 and sh.state.get(S1.encode()) is None
    assert sh.state.passed_over() == {0}
    assert sh.ship([S1.encode()]).segments == [1]


def test_large_flush_is_split_into_bounded_segments(tmp_path: Path) -> None:
    src, store = tmp_path / "src", MemoryStore()
    big = bytes(range(256)) * (12 << 12)  # 12 MiB
    write(src, S1, big)
    sh = shipper(src, store, tmp_path / "st.db", segment_max=5 << 20)
    r = sh.ship([S1.encode()])
    assert len(r.segments) == 3
    assert all(e.end - e.start <= 4 << 20 for e in all_extents(store))
    out = tmp_path / "out"
    restore_tree(Repository(store, "m1"), out)
    assert (out / S1).read_bytes() == big


def test_unselected_and_never_files_are_not_shipped(tmp_path: Path) -> None:
    src, store = tmp_path / "src", MemoryStore()
    write(src, ".credentials.json", b"SECRET-TOKEN")
    write(src, "shell-snapshots/s.sh", b"SECRET-TOKEN")
    write(src, S1, b"ok\n")
    sh = shipper(src, store, tmp_path / "st.db")
    sh.ship([b".credentials.json", b"shell-snapshots/s.sh", S1.encode()])
    assert [e.path for e in all_extents(store)] == [S1.encode()]


def test_roundtrip_of_samples(tmp_path: Path, samples: Path) -> None:
    src, store = tmp_path / "src", MemoryStore()
    for sample in samples.iterdir():
        if (sample / "projects").is_dir():
            for f in (sample / "projects").rglob("*"):
                if f.is_file():
                    write(src, "projects/" + str(f.relative_to(sample / "projects")),
                          f.read_bytes())
    sh = shipper(src, store, tmp_path / "st.db")
    r = sh.ship(list(tree_bytes(src)))
    assert r.raw_bytes / r.stored_bytes >= 5  # real transcripts compress well
    out = tmp_path / "out"
    restore_tree(Repository(store, "m1"), out)
    assert tree_bytes(out) == tree_bytes(src)
    assert State(tmp_path / "st.db").next_seq == 1


def test_failed_upload_mid_flush_commits_only_confirmed_segments(tmp_path: Path) -> None:
    """Segment k uploads while k+1 is built: a failure of k+1 keeps k committed, and
    the next flush ships the rest, nothing twice."""
    class FailSecond(MemoryStore):
        fail = True

        def put(self, key: str, data: bytes, *, if_none_match: bool = True) -> None:
            if self.fail and key == segment_key("m1", 1):
                raise StoreError("boom")
            super().put(key, data, if_none_match=if_none_match)

    src, store = tmp_path / "src", FailSecond()
    big = bytes(range(256)) * (12 << 12)  # 12 MiB: three segments of at most 5 MiB
    write(src, S1, big)
    sh = shipper(src, store, tmp_path / "st.db", segment_max=5 << 20)
    with pytest.raises(StoreError, match="boom"):
        sh.ship([S1.encode()])
    first = read_index(store, segment_key("m1", 0)).extents
    row = sh.state.get(S1.encode())
    assert sh.state.next_seq == 1 and row is not None and row.offset == first[-1].end
    store.fail = False
    r = sh.ship([S1.encode()])
    assert r.segments == [1, 2] and r.raw_bytes == len(big) - first[-1].end
    out = tmp_path / "out"
    restore_tree(Repository(store, "m1"), out)
    assert (out / S1).read_bytes() == big


def test_store_is_first_touched_after_reading(tmp_path: Path) -> None:
    """Reading and compressing start before the store is connected to (a seed overlaps
    the S3 client's set-up); a refused connection writes nothing and commits nothing."""
    class Watched(MemoryStore):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[str] = []

        def put(self, key: str, data: bytes, *, if_none_match: bool = True) -> None:
            self.calls.append("put")
            super().put(key, data, if_none_match=if_none_match)

        def head(self, key: str) -> ObjectInfo | None:
            self.calls.append("head")
            return super().head(key)

    src, store = tmp_path / "src", Watched()
    write(src, S1, b"x" * 1000)
    sh = shipper(src, store, tmp_path / "st.db")
    read: list[int] = []
    sh.progress = read.append

    def refuse() -> None:
        assert read == [1000] and store.calls == []
        raise LeaseHeld("held by someone else")

    sh.prepare = refuse
    with pytest.raises(LeaseHeld):
        sh.ship([S1.encode()])
    assert store.calls == [] and sh.state.next_seq == 0 and sh.state.get(S1.encode()) is None
    sh.prepare = lambda: None
    assert sh.ship([S1.encode()]).segments == [0]


def test_recovery_after_reading_reads_again(tmp_path: Path) -> None:
    """A lost state is noticed only at the first upload: what was read against it is
    dropped and read again after the adoption, so nothing ships twice."""
    src, store = tmp_path / "src", MemoryStore()
    write(src, S1, b"x" * 500)
    shipper(src, store, tmp_path / "a.db").ship([S1.encode()])
    write(src, S1, b"y" * 5, "ab")
    sh = shipper(src, store, tmp_path / "fresh.db")
    r = ship_with_restart(sh, [S1.encode()])
    assert r.segments == [1] and r.raw_bytes == 5
    assert [(e.start, e.end) for e in read_index(store, segment_key("m1", 1)).extents] == [
        (500, 505)]


# -- lost segments ---------------------------------------------------------------------

T = "projects/-home-a/0a0eb7b7-1c2d-4e5f-8a9b-0c1d2e3f4a5b.jsonl"


def _three_flushes(tmp_path: Path, store: MemoryStore) -> Path:
    src = tmp_path / "src"
    sh = shipper(src, store, tmp_path / "st.db")
    for i in range(3):
        write(src, T, b'{"line":%d}\n' % i, "ab")
        write(src, S2, b"s2 %d\n" % i, "ab")
        assert sh.ship([T.encode(), S2.encode()]).segments == [i]
    sh.state.close()
    return src


@pytest.mark.parametrize("lost", [[2], [1], [0, 1, 2]], ids=["newest", "middle", "all"])
def test_a_segment_lost_in_the_store_is_shipped_again(tmp_path: Path, lost: list[int],
                                                      caplog: pytest.LogCaptureFixture) -> None:
    store = MemoryStore()
    src = _three_flushes(tmp_path, store)
    store.delete_many([segment_key("m1", s) for s in lost])
    sh = shipper(src, store, tmp_path / "st.db")  # a restart: nothing changed locally

    r = ship_with_restart(sh, [])

    assert r.files == 2, "both files had bytes in the lost segment"
    assert "missing from" in caplog.text and "shipping 2 files again" in caplog.text
    assert sh.state.meta("store_repair")
    out = restore_tree(Repository(store, "m1"), tmp_path / "out")
    assert out.errors == [] and tree_bytes(tmp_path / "out") == tree_bytes(src)
    # Seqs stay contiguous: a lost one between two others has an empty stand-in, lost
    # ones at the end are written again.
    seqs = [s for s in range(8) if store.head(segment_key("m1", s))]
    assert seqs == list(range(len(seqs)))
    if lost == [1]:
        assert read_index(store, segment_key("m1", 1)).extents == []
        assert read_index(store, segment_key("m1", 1)).extra == {"lost": True}
    # Nothing more to repair: the next look finds the store whole.
    assert sh.audit() == set() and ship_with_restart(sh, []).segments == []


def test_an_intact_store_costs_two_lists_and_nothing_is_shipped(tmp_path: Path) -> None:
    store = MemoryStore()
    src = _three_flushes(tmp_path, store)
    sh = shipper(src, store, tmp_path / "st.db")
    puts = store.puts
    assert sh.audit() == set()
    assert store.puts == puts


def test_a_file_gone_locally_keeps_what_the_store_still_has(tmp_path: Path) -> None:
    store = MemoryStore()
    src = _three_flushes(tmp_path, store)
    store.delete_many([segment_key("m1", 2)])
    (src / T).unlink()
    sh = shipper(src, store, tmp_path / "st.db")
    ship_with_restart(sh, [])
    out = restore_tree(Repository(store, "m1"), tmp_path / "out")
    # The store lost the third line for good; the first two are restored, the deletion
    # is recorded, and the other file is whole again.
    assert (tmp_path / "out" / T).read_bytes() == b'{"line":0}\n{"line":1}\n'
    assert (tmp_path / "out" / S2).read_bytes() == (src / S2).read_bytes()
    assert out.errors == []

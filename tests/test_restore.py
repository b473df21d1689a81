from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from syncd.errors import RestoreError
from syncd.repository import Repository
from syncd.restore.restorer import RestoreOptions, restore, restore_tree
from syncd.store import MemoryStore, layout
from tests.counting import CountingStore
from tests.helpers import shipper, tree_bytes, write

S = "projects/-home-a/s.jsonl"


def _backup(tmp_path: Path, content: bytes) -> MemoryStore:
    store = MemoryStore()
    write(tmp_path / "src", S, content)
    shipper(tmp_path / "src", store, tmp_path / "st.db").ship([S.encode()])
    return store


def test_existing_prefix_is_fast_forwarded(tmp_path: Path) -> None:
    store = _backup(tmp_path, b"a\nb\nc\n")
    write(tmp_path / "out", S, b"a\n")
    r = restore_tree(Repository(store, "m1"), tmp_path / "out")
    assert (tmp_path / "out" / S).read_bytes() == b"a\nb\nc\n" and r.written == [S]


def test_newer_local_is_kept(tmp_path: Path) -> None:
    store = _backup(tmp_path, b"a\n")
    write(tmp_path / "out", S, b"a\nb\n")
    r = restore_tree(Repository(store, "m1"), tmp_path / "out")
    assert (tmp_path / "out" / S).read_bytes() == b"a\nb\n"
    assert r.kept == [f"{S} (local is newer (the backup is a prefix of it))"]


def test_diverged_local_is_kept(tmp_path: Path) -> None:
    store = _backup(tmp_path, b"a\nb\n")
    write(tmp_path / "out", S, b"a\nX\n")
    r = restore_tree(Repository(store, "m1"), tmp_path / "out")
    assert (tmp_path / "out" / S).read_bytes() == b"a\nX\n" and "diverged" in r.kept[0]


def test_identical_is_skipped(tmp_path: Path) -> None:
    store = _backup(tmp_path, b"same\n")
    write(tmp_path / "out", S, b"same\n")
    r = restore_tree(Repository(store, "m1"), tmp_path / "out")
    assert r.skipped == [S] and r.written == []


def test_restored_files_are_private_and_not_stale(tmp_path: Path) -> None:
    store = MemoryStore()
    f = write(tmp_path / "src", S, b"old\n")
    old = time.time() - 60 * 86400
    os.utime(f, (old, old))
    shipper(tmp_path / "src", store, tmp_path / "st.db").ship([S.encode()])
    restore_tree(Repository(store, "m1"), tmp_path / "out")
    st = (tmp_path / "out" / S).stat()
    assert st.st_mode & 0o077 == 0
    assert st.st_mtime > time.time() - 86400  # Claude's 30-day cleanup would delete it


def test_no_staging_left_behind(tmp_path: Path) -> None:
    store = _backup(tmp_path, b"x\n")
    restore_tree(Repository(store, "m1"), tmp_path / "out")
    assert tree_bytes(tmp_path / "out") == {S.encode(): b"x\n"}
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["projects"]


def test_unknown_machine_names_the_known_ones(tmp_path: Path) -> None:
    store = _backup(tmp_path, b"x\n")
    with pytest.raises(RestoreError, match=r"no backup for machine 'nope'.*m1"):
        restore_tree(Repository(store, "nope"), tmp_path / "out")


def test_symlinked_parent_in_target_is_refused(tmp_path: Path) -> None:
    store = _backup(tmp_path, b"x\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "projects").symlink_to(outside)
    r = restore_tree(Repository(store, "m1"), tmp_path / "out")
    assert r.written == [] and "not a directory" in r.errors[0]
    assert list(outside.iterdir()) == []


def test_rewriting_streams_lines_and_leaves_an_overlong_line_as_it_is(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from syncd.format.snapshot import Entry
    from syncd.restore import remap as _remap
    from syncd.restore import rewrite as _rewrite
    from syncd.restore.remap import Remapper, Rule

    monkeypatch.setattr(_remap, "CHUNK", 64)
    monkeypatch.setattr(_remap, "LINE_MAX", 100)
    remap = Remapper([Rule("/home/a", "/home/b")])
    short = [b'{"cwd":"/home/a/p%d"}\n' % i for i in range(20)]
    long = b'{"cwd":"/home/a/x","t":"' + b"y" * 300 + b'"}\n'
    data = b"".join(short[:10]) + long + b"".join(short[10:]) + b'{"cwd":"/home/a/end"}'
    staged = tmp_path / "f"
    staged.write_bytes(data)
    out, size = _rewrite._rewrite(staged, Entry(b"projects/p/x.jsonl", 1, len(data)), remap,
                                  None)
    got = out.read_bytes()
    assert size == len(got) and not staged.exists()
    assert got == data.replace(b"/home/a/p", b"/home/b/p").replace(b"/home/a/end",
                                                                   b"/home/b/end")
    assert long in got  # longer than LINE_MAX: copied untouched, never cut in pieces


@pytest.mark.parametrize(("local", "action", "after"), [
    (b"a\nb\nc\n", "skip", b"a\nb\nc\n"),
    (b"a\n", "fast-forward", b"a\nb\nc\n"),
    (b"a\nb\nc\nd\n", "keep", b"a\nb\nc\nd\n"),
    (b"a\nX\n", "conflict", b"a\nX\n"),
])
def test_files_too_big_to_merge_in_memory_are_compared_as_streams(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, local: bytes, action: str,
        after: bytes) -> None:
    from syncd.restore import conflicts, place
    from syncd.restore.restorer import RestoreOptions, restore

    monkeypatch.setattr(place, "MERGE_MAX", 2)
    monkeypatch.setattr(place, "CHUNK", 3)  # comparisons cross chunk boundaries
    monkeypatch.setattr(conflicts, "CHUNK", 3)
    store = _backup(tmp_path, b"a\nb\nc\n")
    write(tmp_path / "out", S, local)
    r = restore(Repository(store, "m1"), RestoreOptions(
        target=tmp_path / "out", conflicts_dir=tmp_path / "conflicts", local_machine="m1"))
    [a] = [a for a in r.actions if a.source == S]
    assert a.action == action and r.errors == []
    assert (tmp_path / "out" / S).read_bytes() == after
    if action == "conflict":
        assert a.conflict_copy is not None
        assert Path(a.conflict_copy).read_bytes() == b"a\nb\nc\n"


@pytest.mark.parametrize("later_mtime", [False, True])
def test_a_prepared_file_is_installed_with_its_mode_and_mtime(
        tmp_path: Path, later_mtime: bool) -> None:
    """Prepared early (mode, mtime, fsync), installing it is a rename; told another mtime
    when installed, it is installed as an unprepared one is."""
    from syncd.restore.install import Installer

    src, dest = tmp_path / "staged", tmp_path / "out" / "f"
    dest.parent.mkdir()
    src.write_bytes(b"bytes\n")
    src.chmod(0o644)
    mtime = time.time_ns() - 3600 * 10**9
    installer = Installer()
    try:
        installer.prepare(os.fsencode(src), mtime)
        installer.rename(os.fsencode(src), os.fsencode(dest), mtime + later_mtime * 10**9)
        assert installer.finish() == []
    finally:
        installer.close()
    assert dest.read_bytes() == b"bytes\n" and not src.exists()
    st = dest.stat()
    assert st.st_mode & 0o777 == 0o600 and st.st_mtime_ns == mtime + later_mtime * 10**9


def test_parents_made_once_are_not_checked_again(tmp_path: Path) -> None:
    """A folder made for one file serves the next ones of that folder without a check."""
    from syncd.restore.install import make_parents

    known: set[bytes] = set()
    make_parents(tmp_path, b"a/b/f1", known)
    assert (tmp_path / "a" / "b").is_dir()
    assert known == {os.fsencode(tmp_path / "a"), os.fsencode(tmp_path / "a" / "b")}
    (tmp_path / "a" / "b").rmdir()  # gone behind its back: the set still says made
    make_parents(tmp_path, b"a/b/f2", known)
    assert not (tmp_path / "a" / "b").exists()
    make_parents(tmp_path, b"a/c/f3", known)
    assert (tmp_path / "a" / "c").is_dir()


L1, L2, L3 = b'{"n":1}\n', b'{"n":2}\n', b'{"n":3}\n'


@pytest.mark.parametrize(("local", "base", "fetched", "action"), [
    # The copy vouched for ends a line: only the bytes past it are fetched (cut inside
    # the frame that holds the whole file here), then written after the local bytes.
    (L1, (1, 8, 8), True, "fast-forward"),
    # The backup holds no more than the copy: nothing is fetched.
    (L1 + L2 + L3, (1, 24, 24), False, "skip"),
    # Not at a line end, another generation, past the backup's size, a copy that is not
    # that long: fetched whole, decided as any restore decides.
    (L1 + b'{"n"', (1, 12, 12), True, "fast-forward"),
    (L1, (2, 8, 8), True, "fast-forward"),
    (L1, (1, 99, 8), True, "fast-forward"),
    (L1, (1, 8, 0), True, "fast-forward"),
    # Vouched for wrongly (the source's bytes past it do not start a line): not written.
    (L1, (1, 9, 8), True, "error"),
])
def test_a_local_copy_vouched_for_is_fetched_only_past_its_end(
        tmp_path: Path, local: bytes, base: tuple[int, int, int], fetched: bool,
        action: str) -> None:
    store = _backup(tmp_path, L1 + L2 + L3)
    write(tmp_path / "out", S, local)
    ranges: list[tuple[str, int, int | None]] = []

    class Reads(CountingStore):
        def get(self, key: str, start: int = 0, length: int | None = None) -> bytes:
            if start >= 0 and layout.segment_seq(key) is not None:  # a frame, not an index
                ranges.append((key, start, length))
            return super().get(key, start, length)

    r = restore(Repository(Reads(store), "m1"), RestoreOptions(  # type: ignore[arg-type]
        target=tmp_path / "out", local_machine="m1",
        base=lambda path, rel: base if rel == S.encode() else None))
    assert (tmp_path / "out" / S).read_bytes() == (local if action == "error" else L1 + L2 + L3)
    assert [(a.action, a.path) for a in r.actions] == [(action, S)]
    assert len(r.errors) == (action == "error")
    assert bool(ranges) == fetched, ranges


def test_a_local_copy_vouched_for_that_changes_meanwhile_is_never_written_over(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import syncd.restore.place as place_mod

    store = _backup(tmp_path, L1 + L2 + L3)
    mine = write(tmp_path / "out", S, L1)
    copy = place_mod.rewrite_lines

    def typed_meanwhile(*args: object, **kw: object) -> None:
        with open(mine, "ab") as f:
            f.write(b'{"typed":1}\n')
        copy(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(place_mod, "rewrite_lines", typed_meanwhile)
    r = restore(Repository(store, "m1"), RestoreOptions(
        target=tmp_path / "out", base=lambda path, rel: (1, 8, 8)))
    assert mine.read_bytes() == L1 + b'{"typed":1}\n'
    assert [a.action for a in r.actions] == ["error"] and "changed" in r.errors[0]


def test_two_conflict_copies_of_one_file_in_one_second_are_both_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import syncd.restore.conflicts as conflicts_mod

    monkeypatch.setattr(conflicts_mod.time, "strftime", lambda fmt: "20261201T063900")
    opts = RestoreOptions(target=tmp_path / "out", conflicts_dir=tmp_path / "c")
    staged = write(tmp_path, "staged", b'{"n":2}\n')
    first = conflicts_mod._save_conflict(b'{"n":1}\n', S.encode(), "desk", opts)
    second = conflicts_mod._save_conflict(staged, S.encode(), "desk", opts)
    assert first != second and second.endswith(f"20261201T063900-2/{S}")
    assert Path(first).read_bytes() == b'{"n":1}\n' and Path(second).read_bytes() == b'{"n":2}\n'
    assert os.stat(second).st_mode & 0o777 == 0o600


def test_a_conflict_copy_that_extends_an_older_one_supersedes_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two machines writing one session: each import saves the other's branch again,
    longer; the newest copy holds all the older ones held, which go. One that is not its
    prefix stays."""
    import syncd.restore.conflicts as conflicts_mod

    seconds = iter(["20261201T070000", "20261201T070001", "20261201T070002",
                    "20261201T070003"])
    monkeypatch.setattr(conflicts_mod.time, "strftime", lambda fmt: next(seconds))
    opts = RestoreOptions(target=tmp_path / "out", conflicts_dir=tmp_path / "c")
    save = conflicts_mod._save_conflict
    other = save(L2, S.encode(), "desk", opts)  # another branch: never a prefix
    first = save(L1, S.encode(), "desk", opts)
    second = save(L1 + L2, S.encode(), "desk", opts)
    third = save(L1 + L2 + L3, S.encode(), "desk", opts)
    left = sorted(p for p in (tmp_path / "c").rglob("*") if p.is_file())
    assert left == sorted([Path(other), Path(third)])
    assert Path(third).read_bytes() == L1 + L2 + L3
    assert not Path(first).parent.exists() and not Path(second).parent.exists()


def test_a_conflict_copy_being_saved_by_another_restore_is_not_superseded_half_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another restore (the daemon's follow import, ``syncd restore``) saves a copy of the
    same file the moment this one is halfway written: what it holds so far is a prefix of
    the other's, the whole of it is not. Both are kept, whole."""
    import syncd.restore.conflicts as conflicts_mod

    seconds = iter(["20261201T080000", "20261201T080001"])
    monkeypatch.setattr(conflicts_mod.time, "strftime", lambda fmt: next(seconds))
    opts = RestoreOptions(target=tmp_path / "out", conflicts_dir=tmp_path / "c")
    mine = L1 + b'{"branch":"mine"}\n'
    staged = write(tmp_path, "staged", mine)
    copy = conflicts_mod.shutil.copyfileobj
    other: list[str] = []

    def halfway(src: Any, dst: Any, length: int = 0) -> None:
        dst.write(src.read(len(L1)))
        dst.flush()
        other.append(conflicts_mod._save_conflict(L1 + L2, S.encode(), "desk", opts))
        copy(src, dst)

    monkeypatch.setattr(conflicts_mod.shutil, "copyfileobj", halfway)
    first = conflicts_mod._save_conflict(staged, S.encode(), "desk", opts)
    assert Path(first).read_bytes() == mine
    assert Path(other[0]).read_bytes() == L1 + L2


def test_files_skipped_as_the_last_import_left_them_need_no_room(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = _backup(tmp_path, L1 + L2 + L3)
    write(tmp_path / "out", S, L1 + L2 + L3)
    real = os.statvfs
    monkeypatch.setattr(os, "statvfs", lambda p: os.statvfs_result(
        (4096, 4096, 1 << 20, 0, 0, 1000, 1000, 1000, 0, 255))  # a full disk
        if os.fspath(p) == str(tmp_path / "out") else real(p))
    r = restore(Repository(store, "m1"), RestoreOptions(
        target=tmp_path / "out", base=lambda path, rel: (1, 24, 24)))
    assert [(a.action, a.path) for a in r.actions] == [("skip", S)] and r.errors == []
    with pytest.raises(RestoreError, match="the restore needs"):
        restore(Repository(store, "m1"), RestoreOptions(target=tmp_path / "out"))


def test_staging_left_by_a_killed_restore_is_removed_by_the_next(tmp_path: Path) -> None:
    import fcntl

    store = _backup(tmp_path, L1)
    out = tmp_path / "out"
    left = write(out, ".syncd-restore-killed/3/staged", b"a copy of the store's bytes")
    write(out, ".syncd-restore-killed/.held", b"")
    running = write(out, ".syncd-restore-running/.held", b"")
    old = write(out, ".syncd-restore-old/f", b"x").parent  # an older version's, no lock
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    young = write(out, ".syncd-restore-young/f", b"x").parent
    fd = os.open(running, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        restore_tree(Repository(store, "m1"), out)
    finally:
        os.close(fd)
    assert not left.parent.parent.exists() and not old.exists()
    assert running.exists() and young.exists()
    assert (out / S).read_bytes() == L1
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".syncd")) == [
        ".syncd-restore-running", ".syncd-restore-young"]  # its own is gone too


def _seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each conflict copy is saved in a second of its own (the next one)."""
    import syncd.restore.conflicts as conflicts_mod

    seconds = iter(f"20261201T09{i // 60:02d}{i % 60:02d}" for i in range(3600))
    monkeypatch.setattr(conflicts_mod.time, "strftime", lambda fmt: next(seconds))


def _copies(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def test_a_conflict_copy_that_says_nothing_new_is_not_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same diverged copy again (each import of a session that goes on diverging the
    same way), or a part of one kept: the copy kept already says it all."""
    import syncd.restore.conflicts as conflicts_mod

    _seconds(monkeypatch)
    opts = RestoreOptions(target=tmp_path / "out", conflicts_dir=tmp_path / "c")
    kept = conflicts_mod._save_conflict(L1 + L2, S.encode(), "desk", opts)
    again = conflicts_mod._save_conflict(write(tmp_path, "staged", L1 + L2), S.encode(),
                                        "desk", opts)
    part = conflicts_mod._save_conflict(L1, S.encode(), "desk", opts)
    assert again == part == kept and _copies(tmp_path / "c") == [Path(kept)]
    assert Path(kept).read_bytes() == L1 + L2


def test_conflict_copies_of_a_file_are_at_most_conflict_copies_the_oldest_going_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import syncd.restore.conflicts as conflicts_mod

    _seconds(monkeypatch)
    opts = RestoreOptions(target=tmp_path / "out", conflicts_dir=tmp_path / "c",
                          conflict_copies=3)
    other = conflicts_mod._save_conflict(b'{"other file":1}\n', b"projects/-home-a/t.jsonl",
                                        "desk", opts)
    saved = [conflicts_mod._save_conflict(f'{{"branch":{i}}}\n'.encode(), S.encode(), "desk",
                                         opts) for i in range(6)]
    assert _copies(tmp_path / "c") == sorted(Path(p) for p in [other, *saved[-3:]])
    assert [Path(p).read_bytes() for p in saved[-3:]] == [
        f'{{"branch":{i}}}\n'.encode() for i in (3, 4, 5)]


def test_conflict_copies_stay_within_conflict_bytes_the_oldest_going_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every machine's copies of every file count (the daemon's imports and the CLI's
    restores share the folder); a file there that syncd did not write is not touched."""
    import syncd.restore.conflicts as conflicts_mod

    _seconds(monkeypatch)
    opts = RestoreOptions(target=tmp_path / "out", conflicts_dir=tmp_path / "c",
                          conflict_bytes=1 << 20)
    mine = write(tmp_path / "c", "notes.txt", b"the user's own\n" * 30000)  # 450 kB
    copy = 300_000
    saved = []
    for i, (machine, rel) in enumerate([("desk", S), ("zulu", S), ("desk", "todos/t.json"),
                                        ("zulu", "plans/p.md"), ("desk", S)]):
        data = bytes([0x41 + i]) * copy
        saved.append(conflicts_mod._save_conflict(data, rel.encode(), machine, opts))
        held = sum(p.stat().st_size for p in _copies(tmp_path / "c") if p != mine)
        assert held <= 1 << 20, (i, held)
    assert _copies(tmp_path / "c") == sorted([mine, *(Path(p) for p in saved[-3:])])
    assert mine.read_bytes() == b"the user's own\n" * 30000


def test_a_conflict_copy_bigger_than_conflict_bytes_alone_is_refused_in_one_line(
        tmp_path: Path) -> None:
    big = b"a\n" + b"b" * (2 << 20) + b"\n"
    store = _backup(tmp_path, big)
    write(tmp_path / "out", S, b"a\nX\n")
    told: list[str] = []
    r = restore(Repository(store, "m1"), RestoreOptions(
        target=tmp_path / "out", conflicts_dir=tmp_path / "c", conflict_bytes=1 << 20,
        refused_copy=told.append))
    assert (tmp_path / "out" / S).read_bytes() == b"a\nX\n"  # local kept
    assert not (tmp_path / "c").exists() or _copies(tmp_path / "c") == []
    [line] = r.errors
    assert S in line and "conflict_bytes" in line and str(len(big)) in line, line
    assert told == [line] and [a.action for a in r.actions] == ["error"]


def _dir_flags(path: Path) -> int:
    import fcntl
    import struct

    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return int(struct.unpack("i", fcntl.ioctl(fd, 0x80086601, bytes(8))[:4])[0])
    finally:
        os.close(fd)


def test_staging_asks_the_filesystem_to_spread_its_subdirectories(tmp_path: Path) -> None:
    # (Its files would all share the target's block group: see fetch._spread.)
    import fcntl
    import struct

    from syncd.restore.fetch import Staging

    probe = tmp_path / "probe"
    probe.mkdir()
    try:
        fd = os.open(probe, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.ioctl(fd, 0x40086602, struct.pack("i", _dir_flags(probe) | 0x20000)
                        + bytes(4))
        finally:
            os.close(fd)
    except OSError:
        pytest.skip("this filesystem keeps no top-directory flag")
    staging = Staging(tmp_path)
    try:
        assert _dir_flags(staging.path) & 0x20000
    finally:
        staging.close()

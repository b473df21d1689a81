"""Bad input and faults at the shipper, scan and restore level (invariants 1, 3, 5, 6)."""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import tempfile
import threading
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
import zstandard

import syncd.backup.engine
import syncd.backup.ship
from syncd.backup.engine import Engine, sync_once
from syncd.config import Settings
from syncd.errors import RestoreError, SyncError
from syncd.format.segment import FRAME_MAX, HEADER, TRAILER, SegmentWriter
from syncd.repository import Repository
from syncd.restore.restorer import restore_tree
from syncd.service.status import status
from syncd.store import open_store
from syncd.store.layout import segment_key
from tests.faultkit import (
    MACHINE,
    A,
    B,
    C,
    all_files,
    assert_shipped_once,
    cli,
    indexes,
    line,
    make_settings,
    restore,
    store_of,
    tree,
    write,
)
from tests.helpers import running, shipped, wait_for
from tests.seaweed import Seaweed

SECRET = b"TOP-SECRET-7f3a9c-do-not-upload"


def all_plaintext(settings: Settings) -> Iterator[tuple[str, bytes]]:
    """Every store object raw, and every segment with all its zstd frames decompressed."""
    store = store_of(settings)
    for info in store.list(""):
        blob = store.get(info.key)
        yield info.key, blob
        if "/seg/" in info.key:
            off, length = TRAILER.unpack(blob[-TRAILER.size:])[:2]
            reader = zstandard.ZstdDecompressor().stream_reader(
                io.BytesIO(blob[HEADER.size : off + length]), read_across_frames=True)
            yield info.key + " (decompressed)", reader.read()


# -- 1. torn last line ------------------------------------------------------------------

def test_torn_last_line_ships_as_is_then_only_the_rest(tmp_path: Path) -> None:
    s = make_settings(tmp_path)
    whole = line(1) + line(2) + line(3)
    torn, rest = whole[:-30], whole[-30:]
    write(s.source, A, torn)
    write(s.source, B, line(9))
    first = sync_once(s)
    store = store_of(s)
    ix0 = indexes(store)
    assert [(e.path, e.gen, e.start, e.end) for e in ix0[0][1].extents if e.path == A] == \
        [(A, 1, 0, len(torn))]
    early = tmp_path / "early"
    restore(s, early)
    assert (early / os.fsdecode(A)).read_bytes() == torn

    write(s.source, A, rest, "ab")
    second = sync_once(s)
    assert second.segments == [first.segments[-1] + 1]
    assert second.raw_bytes == len(rest)  # nothing before the tear goes up again
    ix1 = indexes(store)[-1][1]
    assert [(e.path, e.gen, e.start, e.end) for e in ix1.extents] == \
        [(A, 1, len(torn), len(whole))]
    # Fresh restore, and a fast-forward of the earlier (torn) restore.
    for target in (tmp_path / "fresh", early):
        report = restore(s, target)
        assert not report.errors
        assert tree(target) == tree(s.source)
    assert (early / os.fsdecode(A)).read_bytes() == whole
    assert_shipped_once(store, tree(s.source))


# -- 2. a 100 MB line -------------------------------------------------------------------

def test_100mb_single_line_bounded_frames_and_memory(tmp_path: Path) -> None:
    seg_max = 8 << 20
    s = make_settings(tmp_path, segment_max_bytes=seg_max)
    size = 100 << 20
    alphabet = bytes(range(ord("A"), ord("A") + 64)) * 4  # 256 entries, no newline
    data = os.urandom(size).translate(alphabet)
    assert b"\n" not in data
    write(s.source, A, data)
    write(s.source, B, line(1))

    tracemalloc.start()
    try:
        result = sync_once(s)
        _, ship_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        report = restore(s, tmp_path / "out")
        _, restore_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.raw_bytes == size + len(line(1))
    assert not report.errors
    assert (tmp_path / "out" / os.fsdecode(A)).read_bytes() == data
    assert (tmp_path / "out" / os.fsdecode(B)).read_bytes() == line(1)

    ixs = indexes(store_of(s))
    assert len(ixs) >= size // seg_max
    for _key, ix in ixs:
        assert sum(e.end - e.start for e in ix.extents) <= seg_max
        for e in ix.extents:
            assert e.end - e.start <= FRAME_MAX
    assert_shipped_once(store_of(s), tree(s.source))
    # Neither side ever holds the whole 100 MB line: a few segments' worth at most
    # (measured: about 26 MiB shipping, 21 MiB restoring).
    assert ship_peak < 5 * seg_max, ship_peak
    assert restore_peak < 5 * seg_max, restore_peak


# -- 3. deleted or replaced while being shipped ----------------------------------------

def _replace(path: bytes, data: bytes) -> None:
    tmp = path + b".tmp-new"
    with open(tmp, "wb") as f:
        f.write(data)
    os.rename(tmp, path)


NEW_B = b'{"replaced": true}\n' * 5


def _mutate(kind: str, root: Path, outside: Path) -> None:
    a = os.path.join(os.fsencode(root), A)
    b = os.path.join(os.fsencode(root), B)
    if kind == "delete":
        os.unlink(a)
    elif kind == "replace":
        _replace(b, NEW_B)
    elif kind == "symlink":
        os.unlink(a)
        os.symlink(outside / "secret.txt", a)
    elif kind == "truncate":
        os.truncate(b, 1000)
        with open(b, "ab") as f:
            f.write(b"new tail\n")


@pytest.mark.parametrize("when,kind", [
    ("after-scan", "delete"), ("after-scan", "replace"),
    ("before-open", "delete"), ("before-open", "replace"), ("before-open", "symlink"),
    ("during-read", "delete"), ("during-read", "replace"), ("during-read", "truncate"),
])
def test_file_changes_under_the_shipper(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        when: str, kind: str) -> None:
    s = make_settings(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_bytes(SECRET * 100)
    write(s.source, A, line(1))
    write(s.source, B, line(2) * 3)
    write(s.source, C, line(3))
    sync_once(s)
    shipped_a = line(1) + line(4)
    write(s.source, A, line(4), "ab")
    # Bigger than a frame, so a read in the middle can see the file shrink.
    write(s.source, B, line(5, 5 << 20), "ab")
    write(s.source, C, line(6), "ab")
    before_b = tree(s.source)[B]

    fired = threading.Event()
    target = A if kind in ("delete", "symlink") else B
    full = os.path.join(os.fsencode(s.source), target)
    if when == "after-scan":
        real_scan = syncd.backup.engine.scan

        def scan_then_change(*args: object, **kw: object) -> object:
            found = real_scan(*args, **kw)  # type: ignore[arg-type]
            if not fired.is_set():
                fired.set()
                _mutate(kind, s.source, outside)
            return found

        monkeypatch.setattr(syncd.backup.engine, "scan", scan_then_change)
    elif when == "before-open":
        real_open = os.open

        def open_after_change(path: object, flags: int, *args: object, **kw: object) -> int:
            if os.fsencode(path) == full and not fired.is_set():  # type: ignore[arg-type]
                fired.set()
                _mutate(kind, s.source, outside)
            return real_open(path, flags, *args, **kw)  # type: ignore[arg-type]

        monkeypatch.setattr(os, "open", open_after_change)
    else:
        real_pread = os.pread

        def pread_after_change(fd: int, n: int, offset: int) -> bytes:
            if not fired.is_set() and os.readlink(f"/proc/self/fd/{fd}").encode() == full:
                fired.set()
                _mutate(kind, s.source, outside)
            return real_pread(fd, n, offset)

        monkeypatch.setattr(os, "pread", pread_after_change)

    sync_once(s)  # nothing raises
    assert fired.is_set(), "the fault was never injected"
    monkeypatch.undo()
    # A later pass settles whatever the first one could only see half of.
    sync_once(s)
    assert sync_once(s).segments == []

    store = store_of(s)
    ixs = [ix for _k, ix in indexes(store)]
    out = tmp_path / "out"
    report = restore(s, out)
    assert not report.errors
    got, now = tree(out), tree(s.source)
    assert got[C] == now[C]  # the other files still ship
    for rel, data in now.items():
        assert got[rel] == data
    if kind in ("delete", "symlink"):
        tombs = [t for ix in ixs for t in ix.tombstones if t.path == A]
        assert [t.gen for t in tombs] == [1]
        # The backup keeps a file deleted locally, with what could be read of it.
        expect_a = shipped_a if when == "during-read" else line(1)
        assert got[A] == expect_a
        st = status(s)
        assert st["files_deleted"] == 1
    if kind == "replace":
        gens = [(e.gen, e.reason) for ix in ixs for e in ix.extents if e.path == B]
        assert gens[-1][0] == 2 and "new inode" in (gens[-1][1] or "")
        assert got[B] == NEW_B
        if when == "during-read":  # shipped as read first: the old inode's bytes
            assert any(e.gen == 1 and e.end == len(before_b) for ix in ixs
                       for e in ix.extents if e.path == B)
    if kind == "truncate":
        assert got[B] == now[B] and len(now[B]) == 1009
    for key, blob in all_plaintext(s):
        assert SECRET not in blob, key


# -- 4. permission denied ---------------------------------------------------------------

DENIED = b"projects/-home-u-app/denied.jsonl"


def test_permission_denied_in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = make_settings(tmp_path)
    write(s.source, A, line(1))
    write(s.source, DENIED, line(2))
    write(s.source, C, line(3))
    full = os.path.join(os.fsencode(s.source), DENIED)
    real_open = os.open
    denied = []

    def open_denied(path: object, flags: int, *args: object, **kw: object) -> int:
        if os.fsencode(path) == full:  # type: ignore[arg-type]
            denied.append(path)
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)
        return real_open(path, flags, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(syncd.backup.ship.os, "open", open_denied)
    with pytest.raises(SyncError) as err:
        sync_once(s)
    msg = str(err.value)
    assert denied
    assert "\n" not in msg and os.fsdecode(DENIED) in msg and "Permission denied" in msg
    monkeypatch.undo()

    out = tmp_path / "out"
    restore(s, out)
    got = tree(out)
    assert got == {A: line(1), C: line(3)}  # the others shipped

    r = cli(s, "status", "--json")
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert os.fsdecode(DENIED) in st["last_error"] and "Permission denied" in st["last_error"]
    assert st["bytes_pending"] == len(line(2)) and st["files_pending"] == 1

    # Readable again: the next pass ships it.
    sync_once(s)
    restore(s, out)
    assert tree(out) == tree(s.source)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root and setpriv to drop to an unprivileged user")
def test_permission_denied_as_unprivileged_user() -> None:
    # Under a world-traversable temp dir: pytest's own tmp dirs are private to root.
    base = Path(tempfile.mkdtemp(prefix="syncd-eacces-"))
    try:
        base.chmod(0o755)
        s = make_settings(base)
        for rel, data in ((A, line(1)), (DENIED, line(2)), (C, line(3))):
            write(s.source, rel, data)
        for dirpath, _dirs, files in os.walk(s.source):
            os.chmod(dirpath, 0o755)
            for name in files:
                os.chmod(os.path.join(dirpath, name), 0o644)
        os.chmod(os.path.join(os.fsencode(s.source), DENIED), 0o000)
        for d in (base / "state", base / "store", base / "home"):
            d.mkdir()
            os.chown(d, 65534, 65534)
        drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        env = {"HOME": str(base / "home")}
        r = cli(s, "sync", env=env, prefix=drop)
        assert r.returncode == 1, (r.stdout, r.stderr)
        # Log lines aside, the failure is one line that names the file.
        final = [ln for ln in r.stderr.splitlines() if ln.startswith("syncd: ")]
        assert len(final) == 1, r.stderr
        assert os.fsdecode(DENIED) in final[0] and "Permission denied" in final[0]
        r = cli(s, "status", "--json", env=env, prefix=drop)
        assert r.returncode == 0, r.stderr
        st = json.loads(r.stdout)
        assert os.fsdecode(DENIED) in (st["last_error"] or "")
        out = base / "out"
        restore(s, out)
        assert tree(out) == {A: line(1), C: line(3)}
    finally:
        shutil.rmtree(base)


# -- 5. names that are not UTF-8 --------------------------------------------------------

def test_non_utf8_names_round_trip(tmp_path: Path) -> None:
    s = make_settings(tmp_path)
    names = [b"projects/x/caf\xe9.jsonl", b"projects/\xff\xfe-dir/s\x80.jsonl",
             b"projects/x/ok.jsonl"]
    root = os.fsencode(s.source)
    for i, rel in enumerate(names):
        os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
        fd = os.open(os.path.join(root, rel), os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, line(i))
        os.close(fd)
    r = cli(s, "-v", "sync")
    assert r.returncode == 0, r.stderr
    paths = {e.path for _k, ix in indexes(store_of(s)) for e in ix.extents}
    assert paths == set(names)

    out = tmp_path / "out"
    report = restore(s, out)
    assert not report.errors
    assert tree(out) == tree(s.source)
    assert b"caf\xe9.jsonl" in os.listdir(os.path.join(os.fsencode(out), b"projects/x"))
    # And through the command line, into another directory.
    r = cli(s, "restore", "--to", str(tmp_path / "cli-out"))
    assert r.returncode == 0, r.stderr
    assert tree(tmp_path / "cli-out") == tree(s.source)


# -- 6. symlinks out of the tree ---------------------------------------------------------

def _outside(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    (outside / "proj").mkdir(parents=True)
    (outside / "proj" / "leak.jsonl").write_bytes(SECRET + b"\n")
    (outside / "secret.txt").write_bytes(SECRET + b"\n")
    return outside


def _assert_no_secret(s: Settings, out: Path) -> None:
    for rel, data in all_files(out).items():
        assert SECRET not in data, rel
    for dirpath, dirs, files in os.walk(out):
        for name in dirs + files:
            assert not os.path.islink(os.path.join(dirpath, name)), name
    found = False
    for key, blob in all_plaintext(s):
        assert SECRET not in blob, key
        found = found or line(1) in blob
    assert found, "the store scan cannot even see content that was shipped"


def test_symlinks_out_of_the_tree_are_not_followed(tmp_path: Path) -> None:
    s = make_settings(tmp_path)
    outside = _outside(tmp_path)
    write(s.source, A, line(1))
    src = s.source
    os.symlink(outside / "proj", src / "projects" / "-linked-project")   # a dir
    os.symlink(outside / "proj", src / "projects" / "-home-u-app" / "sub")
    os.symlink(outside / "secret.txt", src / "projects" / "-home-u-app" / "s.jsonl")  # a file
    os.symlink(outside / "secret.txt", src / "history.jsonl")
    result = sync_once(s)
    assert result.files == 1
    out = tmp_path / "out"
    assert not restore(s, out).errors
    assert tree(out) == {A: line(1)}
    _assert_no_secret(s, out)


def test_tracked_directory_replaced_by_symlink_is_not_followed(tmp_path: Path) -> None:
    """A directory syncd already tracks becomes a symlink to a directory outside that
    holds a file of the same name: the tracked path now leads out of the tree."""
    s = make_settings(tmp_path)
    outside = _outside(tmp_path)
    sub = b"projects/-home-u-app/sid/subagents/agent-1.jsonl"
    write(s.source, sub, line(1))
    write(s.source, A, line(2))
    sync_once(s)
    (outside / "proj" / "agent-1.jsonl").write_bytes(line(1) + SECRET + b"\n")
    subagents = s.source / "projects/-home-u-app/sid/subagents"
    shutil.rmtree(subagents)
    os.symlink(outside / "proj", subagents)
    write(s.source, A, line(3), "ab")
    sync_once(s)
    out = tmp_path / "out"
    assert not restore(s, out).errors
    assert tree(out)[A] == line(2) + line(3)
    assert tree(out)[sub] == line(1)  # the backup keeps what it had
    _assert_no_secret(s, out)
    # The file left the tree as far as syncd is concerned.
    tombs = [t.path for _k, ix in indexes(store_of(s)) for t in ix.tombstones]
    assert tombs == [sub]


def test_daemon_does_not_follow_symlinks_created_while_running(tmp_path: Path) -> None:
    s = make_settings(tmp_path)
    outside = _outside(tmp_path)
    write(s.source, A, line(1))
    with running(s):
        wait_for(lambda: status(s)["bytes_pending"] == 0, 20, "the first flush")
        os.symlink(outside / "proj", s.source / "projects" / "-linked")
        os.symlink(outside / "secret.txt", s.source / "projects" / "-home-u-app" / "l.jsonl")
        (outside / "proj" / "leak.jsonl").write_bytes(SECRET + b"\nmore\n")
        (outside / "proj" / "new.jsonl").write_bytes(SECRET + b"\n")
        write(s.source, B, line(2))  # a marker written after the links
        wait_for(lambda: status(s)["bytes_pending"] == 0 and shipped(s, B) == len(line(2)),
                 20, "the marker")
    out = tmp_path / "out"
    assert not restore(s, out).errors
    assert tree(out) == {A: line(1), B: line(2)}
    _assert_no_secret(s, out)


# -- corrupted and hostile store objects ---------------------------------------------------

@pytest.fixture(params=["file", "s3"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str | None]:
    if request.param == "file":
        return (tmp_path / "store").as_uri(), None
    sw: Seaweed = request.getfixturevalue("seaweed")
    bucket: str = request.getfixturevalue("bucket")
    return f"s3://{bucket}/pfx", sw.endpoint


def _three_segments(tmp_path: Path, store_url: str, endpoint: str | None) -> Settings:
    s = make_settings(tmp_path, store=store_url, endpoint=endpoint)
    for rel, i in ((A, 1), (B, 2), (C, 3)):
        write(s.source, rel, line(i) * 50)
        sync_once(s)
    assert [k for k, _ in indexes(store_of(s))] == [segment_key(MACHINE, i) for i in range(3)]
    return s


@pytest.mark.parametrize("damage", ["flip-frame", "flip-index", "truncate"])
def test_corrupted_segment_names_the_object_and_others_restore(
        tmp_path: Path, any_store: tuple[str, str | None], damage: str) -> None:
    s = _three_segments(tmp_path, *any_store)
    store = store_of(s)
    key = segment_key(MACHINE, 1)
    blob = bytearray(store.get(key))
    ix = dict(indexes(store))[key]
    if damage == "flip-frame":
        e = ix.extents[0]
        blob[e.off + e.clen // 2] ^= 0x55
    elif damage == "flip-index":
        off = TRAILER.unpack(bytes(blob[-TRAILER.size:]))[0]
        blob[off + 3] ^= 0x01
    else:
        del blob[len(blob) // 2 :]
    store.put(key, bytes(blob), if_none_match=False)

    out = tmp_path / "out"
    report = restore(s, out)
    assert report.errors, "a damaged object went unnoticed"
    assert all("\n" not in e for e in report.errors)
    assert any(key in e for e in report.errors), report.errors
    got = tree(out)
    assert got == {A: line(1) * 50, C: line(3) * 50}
    assert not [n for n in os.listdir(out) if n.startswith(".syncd-restore-")]


def test_corrupted_segment_cli_restore_fails_naming_the_object(tmp_path: Path) -> None:
    s = _three_segments(tmp_path, (tmp_path / "store").as_uri(), None)
    path = tmp_path / "store" / segment_key(MACHINE, 2)
    path.write_bytes(path.read_bytes()[:-10])
    r = cli(s, "restore", "--to", str(tmp_path / "out"))
    assert r.returncode == 1
    assert segment_key(MACHINE, 2) in r.stderr
    assert tree(tmp_path / "out") == {A: line(1) * 50, B: line(2) * 50}


def test_store_paths_escaping_the_target_are_refused(
        tmp_path: Path, any_store: tuple[str, str | None]) -> None:
    s = make_settings(tmp_path, store=any_store[0], endpoint=any_store[1])
    write(s.source, A, line(1))
    sync_once(s)
    victim = tmp_path / "victim"
    victim.mkdir()
    bad = [b"../evil", b"../../evil", os.fsencode(victim / "abs"), b"/abs-evil",
           b"projects/../../evil2", b"projects/x/../../../evil3", b"./projects/dot",
           b"projects//double", b"projects/nul\0byte", b""]
    w = SegmentWriter(MACHINE, 1, 0.0)
    for p in bad:
        w.add_data(p, 1, 0, SECRET, mode=0o644, mtime_ns=0)
    w.add_data(B, 1, 0, line(7), mode=0o644, mtime_ns=0)
    store = store_of(s)
    store.put(segment_key(MACHINE, 1), w.finish())

    (tmp_path / "restore").mkdir()
    before = set(tmp_path.rglob("*"))
    target = tmp_path / "restore" / "target"
    report = restore(s, target)
    refused = [e for e in report.errors if "unsafe path" in e]
    assert len(refused) == len(bad), report.errors
    assert tree(target) == {A: line(1), B: line(7)}  # the sound entries still restore
    after = {p for p in tmp_path.rglob("*") if not p.is_relative_to(target)}
    assert after == before, sorted(after ^ before)
    assert not Path("/abs-evil").exists() and not (victim / "abs").exists()
    for p, data in all_files(tmp_path).items():
        if not p.startswith((b"store/", b"restore/target/")):
            assert SECRET not in data, p


def test_restore_does_not_write_through_a_symlink_in_the_target(tmp_path: Path) -> None:
    s = make_settings(tmp_path)
    write(s.source, A, line(1))
    sync_once(s)
    outside = tmp_path / "outside"
    outside.mkdir()
    target = tmp_path / "target"
    target.mkdir()
    os.symlink(outside, target / "projects")
    try:
        errors = restore(s, target).errors
    except RestoreError as e:
        errors = [str(e)]
    assert any("symlink" in e for e in errors), errors
    assert list(outside.iterdir()) == []


def test_engine_survives_a_dirty_path_through_a_symlinked_dir(tmp_path: Path) -> None:
    """The dirty set is only a hint: a path through a symlinked directory (as a watcher
    could report it) is never opened."""
    s = make_settings(tmp_path)
    outside = _outside(tmp_path)
    write(s.source, A, line(1))
    os.symlink(outside / "proj", s.source / "projects" / "-home-u-app" / "sub")
    engine = Engine(s)
    try:
        result = engine.flush({A, b"projects/-home-u-app/sub/leak.jsonl"})
    finally:
        engine.close()
    assert result.files == 1 and not result.problems
    out = tmp_path / "out"
    restore_tree(Repository(open_store(s.store), MACHINE), out)
    assert tree(out) == {A: line(1)}
    _assert_no_secret(s, out)

"""Copies against a hostile store and a changing tree: a copy names bytes of another
generation, so every reader bound (time, memory, names, which bytes win) and every
shipper proof (a cut, a move, an adopted segment) is attacked here."""

from __future__ import annotations

import os
import random
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from syncd.archive.compact import CompactOptions, compact
from syncd.archive.prune import prune
from syncd.archive.retention import Policy
from syncd.backup import state as state_mod
from syncd.backup.ship import ship_with_restart
from syncd.backup.state import State
from syncd.claude import project_folder
from syncd.format import points as pointfmt
from syncd.format import segment, snapshot
from syncd.format.delta import KIND
from syncd.format.points import Change, Locator, Point
from syncd.format.segment import Copy, Extent, SegmentWriter
from syncd.format.snapshot import Entry
from syncd.repository import Repository
from syncd.restore.restorer import RestoreOptions, restore
from syncd.store import MemoryStore
from syncd.store.layout import segment_key
from syncd.view import load_backup
from tests.helpers import kept_after, tree_bytes, write
from tests.hostile import T0, Craft, Piece, sid, transcript
from tests.hostile import line as hline
from tests.readers import read_index
from tests.test_compact import Clock, M, make_shipper, ship_all
from tests.test_copies import APP, LIB, SID, cut_tail, rows
from tests.test_follow import Machine
from tests.test_hostile_deltas import delta_key, work_budget
from tests.test_hostile_deltas import world as delta_world
from tests.test_hostile_follow import CWD, DESK, craft, evil_line, own_session
from tests.test_hostile_store import (
    NEVER,
    OUTSIDE_INCLUDE,
    TRAVERSAL,
    World,
    listed,
    sane,
)
from tests.test_hostile_store import restored as restored_from
from tests.test_points import restored


def short_rows(lo: int, hi: int) -> bytes:
    """Transcript lines of ~100 bytes: 64 marked lines are far less than the 64 KiB tail
    the append check compares."""
    return b"".join(b'{"type":"user","sessionId":"%s","uuid":"%08x","n":"%s"}\n'
                    % (SID.encode(), i, b"x" * 20) for i in range(lo, hi))


# -- the shipper's proofs --------------------------------------------------------------


def test_a_rewrite_the_marks_do_not_see_is_no_cut(tmp_path: Path) -> None:
    """A byte changed 30 KB before the end of a transcript of short lines, in place: the
    append check sees it (its tail is 64 KiB), the marks (the last 64 lines, ~6 KB) do
    not. Before the fix the whole shipped prefix passed as a "cut" and was copied from
    the old generation: the store kept the old byte, silently."""
    store, clock = MemoryStore(), Clock()
    src = tmp_path / "src"
    sh = make_shipper(src, store, tmp_path / "st.db", clock)
    f = write(src, APP, short_rows(0, 3000))
    ship_all(sh, src)
    data = bytearray(f.read_bytes())
    at = len(data) - 30_000
    data[at] = ord("y") if data[at] != ord("y") else ord("z")
    with open(f, "r+b") as fh:  # same inode, same size
        fh.write(bytes(data))
    clock.t += 5
    ship_all(sh, src)
    ix = read_index(store, segment_key(M, 1))
    # No cut: a patch, whose copies leave out the line with the changed byte.
    assert all(not c.at <= at < c.stop for c in ix.copies)
    assert "cut" not in " ".join(c.reason or "" for c in ix.copies)
    assert restored(store, clock.t, tmp_path / "out") == tree_bytes(src)


OTHER = f"projects/-home-u-app/{'0' * 8}-1111-4222-8333-444444444444.jsonl"


def test_an_adopted_segment_s_copy_is_trusted_only_when_the_state_proves_it(
        tmp_path: Path) -> None:
    """A segment planted at this machine's next seq (its name, that seq: what a run that
    stopped between upload and commit leaves) with a copy: the first bytes of generation 2
    of APP are those of another transcript. Adopting an extent checks the local bytes
    against its sha256; before the fix a copy was taken on its word: the state said APP's
    bytes were shipped, they never were, and a restore gave the other file's bytes."""
    store, clock = MemoryStore(), Clock()
    src = tmp_path / "src"
    sh = make_shipper(src, store, tmp_path / "st.db", clock)
    write(src, APP, short_rows(0, 200))
    write(src, OTHER, short_rows(500, 600))
    ship_all(sh, src)
    seq = sh.state.next_seq
    w = SegmentWriter(M, seq, clock.t + 1)
    n = len(short_rows(500, 600))
    w.add_copy(Copy(APP.encode(), 2, 0, OTHER.encode(), 1, 0, n, 0o644, 0, "planted"))
    store.put(segment_key(M, seq), w.finish())
    clock.t += 5
    write(src, APP, short_rows(200, 201), "ab")
    ship_with_restart(sh, [APP.encode()])
    clock.t += 5
    write(src, APP, short_rows(201, 202), "ab")
    ship_with_restart(sh, [APP.encode()])
    assert restored(store, clock.t, tmp_path / "out") == tree_bytes(src)


@pytest.mark.parametrize("how", ["cut", "move", "rename over"])
def test_a_segment_with_a_copy_that_a_run_left_uncommitted_is_adopted_whole(
        tmp_path: Path, how: str) -> None:
    """The other side of the proof: the shipper's own copy (a cut, a move, a file renamed
    over its original), put in the store by a run that stopped before its commit, is
    adopted as shipped (the marks, or the check hash of its source, prove it), so the next
    flush continues that generation."""
    store, clock = MemoryStore(), Clock()
    src = tmp_path / "src"
    sh = make_shipper(src, store, tmp_path / "st.db", clock)
    f = write(src, APP, rows(0, 59))
    ship_all(sh, src)
    clock.t += 5
    write(src, APP, rows(59, 60), "ab")  # a second flush: the marks a cut is proven by
    ship_all(sh, src)
    sh.state.close()
    shutil.copy(tmp_path / "st.db", tmp_path / "old.db")
    sh = make_shipper(src, store, tmp_path / "st.db", clock)
    clock.t += 5
    gone: list[str] = []
    if how == "cut":
        cut_tail(f, 55, rows(100, 101))
    elif how == "move":
        os.makedirs(src / "projects/-home-u-lib")
        os.rename(f, src / LIB)
        f, gone = src / LIB, [APP]
    else:
        tmp = write(src, APP + ".compact.tmp.1a2b", f.read_bytes() + rows(60, 61))
        tmp.rename(f)
    ship_all(sh, src, *gone)
    [c] = read_index(store, segment_key(M, 2)).copies
    sh.state.close()
    # The state as that run left it: segment 1 uploaded, never committed.
    late = make_shipper(src, store, tmp_path / "old.db", clock)
    clock.t += 5
    write(src, os.fsdecode(c.path), rows(101, 102), "ab")
    ship_with_restart(late, [c.path, *(g.encode() for g in gone)])
    assert [x.gen for x in read_index(store, segment_key(M, 3)).extents] == [c.gen]
    assert restored(store, clock.t, tmp_path / "out") == tree_bytes(src)


# -- the reader's bounds: work ---------------------------------------------------------


def _x(path: bytes, gen: int, start: int, end: int, off: int = 16) -> Extent:
    return Extent(path, gen, start, end, off, 10, "0" * 64, 0o600, 0)


def test_many_copies_of_one_many_framed_generation_cost_work_in_proportion(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """3000 copies, each of the last byte of a generation of 3000 frames: each copy found
    its bytes by walking the source's frames from byte 0 again (9 million steps here; a
    store of 60 000-frame sources and a million copies made it hours), and went on doing
    so once PARTS_MAX was reached. The walk is made once per source."""
    n = 3000
    src, walked = b"projects/-a/x.jsonl", [0]
    real = Locator._chain

    def counted(self: Locator, path: bytes, gen: int, size: int) -> list[tuple[str, Extent]]:
        got = real(self, path, gen, size)
        walked[0] += len(got)
        return got

    monkeypatch.setattr(Locator, "_chain", counted)
    loc = Locator()
    loc.add_all(("k", _x(src, 1, i, i + 1, 16 + i)) for i in range(n))
    targets = [f"projects/-c{i}/x.jsonl".encode() for i in range(n)]
    loc.add_copies(Copy(t, 1, 0, src, 1, n - 1, n, 0, 0) for t in targets)
    got = [loc.extents(t, 1, 1) for t in targets]
    assert all(len(g) == 1 and g[0][1].skip == 0 and g[0][1].start == 0 for g in got)
    assert walked[0] <= 4 * n, f"{walked[0]} extents walked for {n} copies"


def test_a_delta_of_many_copies_of_one_generation_loads_in_linear_time(
        tmp_path: Path) -> None:
    """The copies' side of test_hostile_deltas' linear-time check: 20 000 copies of one
    generation (it has no frames of its own) and one point naming it 20 000 times. Each
    change asked the generation's mode (and, once, whether anything holds its start) by
    looking at all its copies: 400 million steps."""
    w = delta_world(tmp_path, 3)
    compact(w.repo, CompactOptions(acknowledged=w.acked, now=w.clock.t))
    b = load_backup(w.repo)
    src = next(p for p, f in b.files.items() if f.size > 100)
    path, n, t = b"projects/-home-u-app/x.jsonl", 20_000, w.clock.t + 1
    wr = SegmentWriter(M, 3, t)
    rnd = random.Random(7)  # (as varied as a writer's: identical ones compress too well)
    for i in range(n):
        wr.add_copy(Copy(path, 7, n - 1 - i, src, b.files[src].gen, 0, 1, 0o600,
                         rnd.getrandbits(60)))
    wr.index.extra = {"kind": KIND, "lo": 3, "hi": 3,
                      **pointfmt.encode([Point(3, t, [Change(path, 7, n)] * n)])}
    w.store.objects[delta_key(3, 3)] = wr.finish()
    with work_budget(100 * n):  # (a copy entry alone costs ~50 calls to parse)
        b = load_backup(w.repo)
    assert b.errors == [] and b.files[path].size == n
    assert len(b.files[path].extents) == n


PARTS_OF = b"projects/-a/big.jsonl"
PARTS = b"projects/-a/parts.jsonl"


def _parts_of_one_frame(big: bytes, offsets: list[int]) -> tuple[MemoryStore, str]:
    """A store whose segment 0 holds ``big`` as one frame of PARTS_OF, and PARTS: byte i of
    it is byte ``offsets[i]`` of that frame, each a copy of its own."""
    store = MemoryStore()
    w = SegmentWriter(M, 0, 1_750_000_000.0)
    w.add_data(PARTS_OF, 1, 0, big, mode=0o600, mtime_ns=0)
    for i, at in enumerate(offsets):
        w.add_copy(Copy(PARTS, 1, i, PARTS_OF, 1, at, at + 1, 0o600, 0))
    key = segment_key(M, 0)
    store.put(key, w.finish())
    return store, key


def _decompressions(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A counter (its one item) of the zstd frames decompressed from now on."""
    decoded = [0]
    real = segment.decompress_exact

    def counted(frame: bytes, size: int, where: str, dctx: Any = None) -> bytes:
        decoded[0] += 1
        return real(frame, size, where, dctx)

    monkeypatch.setattr(segment, "decompress_exact", counted)
    return decoded


def test_a_file_of_many_parts_of_one_frame_decodes_that_frame_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """300 copies of one byte each of a 4 MiB frame: a file of 300 bytes that a restore (and
    a compaction) made by decompressing and hashing the whole frame once per byte. Ten
    doubling copies (a copy of a file twice, of that twice...) make 1024 such parts, and
    PARTS_MAX of them asked 4 TiB of decompression of a store of kilobytes. A
    frame's parts that follow one another are cut from it, decoded once."""
    big = random.Random(3).randbytes(4 << 20)
    n = 300
    store, _ = _parts_of_one_frame(big, [i * 7919 for i in range(n)])
    decoded = _decompressions(monkeypatch)
    got = restored(store, 1_750_000_001.0, tmp_path / "out")
    assert got[PARTS] == bytes(big[i * 7919] for i in range(n))
    assert decoded[0] <= 4, f"the frame was decompressed {decoded[0]} times"
    decoded[0] = 0
    rep = compact(Repository(store, M), CompactOptions(now=1_750_000_002.0))
    assert rep.errors == [] and decoded[0] <= 10, decoded[0]  # (and its manifest's)
    assert restored(store, 1_750_000_001.0, tmp_path / "after") == got


def test_many_parts_of_one_damaged_frame_fail_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same parts, their frame damaged (its sha256 is not what the index says): each
    part fails (no byte of it is written), the frame is decompressed once, and the file is
    reported lost, not restored."""
    store, key = _parts_of_one_frame(random.Random(4).randbytes(1 << 20), list(range(300)))
    [x] = read_index(store, key).extents
    # One bit of the frame (a raw block: random bytes) flipped: its sha256 is not the
    # index's.
    bad = bytearray(store.objects[key])
    bad[x.off + x.clen - 5] ^= 1
    store.objects[key] = bytes(bad)
    decoded = _decompressions(monkeypatch)
    r = restore(Repository(store, M), RestoreOptions(target=tmp_path / "out", local_machine=M))
    assert decoded[0] <= 4, decoded[0]
    assert any(os.fsdecode(PARTS) in e and "not restored" in e for e in r.errors), r.errors
    assert not (tmp_path / "out" / os.fsdecode(PARTS)).exists()


# -- names: a copy's target and source are names from a store --------------------------


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path, sealed=False)


def test_copies_to_unsafe_or_excluded_names_write_nothing_there(world: World) -> None:
    """One segment of copies of a good transcript's bytes to every name the data tests
    refuse (traversal, NUL, absolute, the never list, outside the include set), and one
    copy from an unsafe source name: nothing is written outside the target or to a refused
    name, each is named, and the machine's good files are restored."""
    m = world.good("desk")["desk"]
    src = next(p for p in m.files if p.endswith(".jsonl") and p.startswith("projects/"))
    names = [p.format(tmp=world.tmp) for p, _ in TRAVERSAL.values()] + NEVER + \
        sorted(OUTSIDE_INCLUDE)
    key = segment_key("desk", 2)
    w = world.craft.writer("desk", 2, key)
    for name in names:
        w.add_copy(Copy(name.encode(), 1, 0, src.encode(), 1, 0, 40, 0o600, 0))
    fresh = f"projects/-srv-desk-app/{sid('desk', 9)}.jsonl"
    w.add_copy(Copy(fresh.encode(), 1, 0, b"../../etc/passwd", 1, 0, 40, 0o600, 0))
    world.craft.finish(key, w)
    before = world.others()
    r = world.syncd("restore", "--machine", "desk")
    sane(r)
    assert not world.outside(before, world.source), r.describe()
    for name in NEVER + sorted(OUTSIDE_INCLUDE):
        assert not (world.source / name).exists(), f"{name} was written\n{r.describe()}"
        listed(r, name)
    for _, named in TRAVERSAL.values():
        assert named in r.out + r.err, f"{named} is not named\n{r.describe()}"
    # The copy from a name no object holds: its bytes are a gap, said, not written.
    assert not (world.source / fresh).exists() and fresh in r.out + r.err, r.describe()
    restored_from(world.source, m)


# -- manifests: parts ------------------------------------------------------------------

BAD_PARTS: dict[str, Any] = {
    "skip beyond its frame": [[90, 100]],
    "a frame larger than FRAME_MAX": [[0, 1 << 40]],
    "a frame smaller than the part": [[0, 3]],
    "a skip with no frame": [[5, 0]],
    "one part too many": [None, [0, 100]],
    "none for an extent": [],
    "not a pair": [[7]],
    "a number": [5],
    "negative": [[-1, 100]],
    "a string": ["ab"],
}


@pytest.mark.parametrize("case", sorted(BAD_PARTS))
def test_a_manifest_s_bad_parts_lose_that_file_or_group_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    """A manifest whose entry for one file has a ``parts`` list no writer makes: that file
    (or, when the group does not parse, that group) is lost and said; the other group's
    files restore with their bytes, nothing is allocated by the claim."""
    c = Craft(tmp_path / "store")
    good, bad = "projects/-srv-a/good.jsonl", "projects/-srv-b/bad.jsonl"
    data = random.Random(5).randbytes(100)
    c.machine_json(M)
    _, entries = c.pack(M, 0, 1, [Piece(good, data), Piece(bad, data)])

    real = snapshot._entry_doc

    def tampered(e: Entry, objects: dict[str, int]) -> dict[str, Any]:
        d = real(e, objects)
        if e.path == bad.encode():
            d["parts"] = BAD_PARTS[case]
        return d

    monkeypatch.setattr(snapshot, "_entry_doc", tampered)
    c.manifest(M, 1, entries)
    monkeypatch.undo()
    out = tmp_path / "out"
    r = restore(Repository(c.store, M), RestoreOptions(target=out, local_machine=M))
    assert (out / good).read_bytes() == data
    assert not (out / bad).exists()
    assert any("bad.jsonl" in e or "-srv-b" in e for e in r.errors), r.errors


# -- follow: a followed machine's segments hold copies ---------------------------------


@pytest.fixture
def laptop(tmp_path: Path) -> Machine:
    return Machine(tmp_path, "laptop", "/users/bob", follow=[DESK])


def test_a_followed_machine_s_copies_add_nothing_to_a_session_of_this_machine(
        laptop: Machine, monkeypatch: pytest.MonkeyPatch) -> None:
    """desk's segment: an evil line, then copies of it into the laptop's own session (its
    transcript and files beside it, under desk's folder), copies in a cycle, a copy whose
    claimed size is a petabyte, and a copy of the laptop's own file (bytes of another
    machine's prefix: desk's view has none). The laptop's session stays as it is, no file
    is added to it; desk's new session imports with desk's bytes only."""
    c = craft(laptop)
    s, mine = own_session(laptop, monkeypatch)
    before = tree_bytes(laptop.settings.source)
    own_rel = os.fsencode(mine.relative_to(laptop.settings.source))
    main = transcript(CWD, s).encode()
    side = main[: -len(b".jsonl")]
    evil = evil_line(s, CWD)
    stash = f"projects/{project_folder(CWD)}/evil.txt".encode()
    d = sid(DESK, 7)
    theirs = transcript(CWD, d).encode()
    theirs_data = hline(d, CWD, 0) + hline(d, CWD, 1)
    key = segment_key(DESK, 0)
    w = c.writer(DESK, 0, key)
    w.add_data(stash, 1, 0, evil, mode=0o600, mtime_ns=0)
    w.add_data(theirs, 1, 0, theirs_data, mode=0o600, mtime_ns=0)
    n = len(evil)
    for target in (main, side + b"/subagents/agent-a1b2c3d.jsonl",
                   side + b"/tool-results/toolu_01evil.txt", f"todos/{s}-agent-{s}.json".encode()):
        w.add_copy(Copy(target, 1, 0, stash, 1, 0, n, 0o600, 0))
    cyc = [f"projects/{project_folder(CWD)}/{sid(DESK, i)}.jsonl".encode() for i in (8, 9)]
    w.add_copy(Copy(cyc[0], 1, 0, cyc[1], 1, 0, 100, 0o600, 0))
    w.add_copy(Copy(cyc[1], 1, 0, cyc[0], 1, 0, 100, 0o600, 0))
    w.add_copy(Copy(f"projects/{project_folder(CWD)}/{sid(DESK, 10)}.jsonl".encode(), 1,
                    1 << 49, stash, 1, 0, n, 0o600, 0))
    w.add_copy(Copy(f"projects/{project_folder(CWD)}/{sid(DESK, 11)}.jsonl".encode(), 1, 0,
                    own_rel, 1, 0, len(before[own_rel]), 0o600, 0))
    w.add_session(theirs, 1, {"cwd": CWD})
    c.finish(key, w)
    laptop.poll(monkeypatch)
    after = tree_bytes(laptop.settings.source)
    assert after[own_rel] == before[own_rel]
    added = sorted(p for p in set(after) - set(before) if s.encode() in p)
    assert added == [], f"desk's copies were added to the laptop's session {s}: {added}"
    got = [data for p, data in after.items() if d.encode() in p]  # (its cwd remapped)
    assert len(got) == 1 and got[0].count(b"\n") == 2, sorted(after)
    assert not any(evil in data or before[own_rel] in data
                   for p, data in after.items() if p not in before), sorted(after)


# -- moved_away: a planted transcript elsewhere ----------------------------------------


def test_a_planted_live_transcript_elsewhere_hides_a_deleted_session_from_later_points_only(
        tmp_path: Path) -> None:
    """A session deleted here (its transcript in folder A, a tombstone), then a planted
    segment with a live transcript of the same session id in folder B: a restore as of now
    takes the session for moved to B (A's copy is not brought back); one as of any point
    before the plant still brings A's back. Accepted: whoever can write a segment of this
    prefix can as well write a generation of A's file with other bytes; the plant changes
    no earlier point, and the planted transcript is restored and listed, not hidden."""
    c = Craft(tmp_path / "store")
    c.machine_json(M)
    s = sid(M, 1)
    a, b = f"projects/-srv-a/{s}.jsonl", f"projects/-srv-b/{s}.jsonl"
    data = hline(s, "/srv/a", 0)
    c.segment(M, 0, [Piece(a, data)])
    c.segment(M, 1, tombstones=[(a, 1)])
    c.segment(M, 2, [Piece(b, b"planted\n")])
    repo = Repository(c.store, M)
    for at, want in ((T0 + 1.5, {a: data}), (None, {b: b"planted\n"})):
        out = tmp_path / f"out-{at}"
        restore(repo, RestoreOptions(target=out, at=at, local_machine=M))
        assert {os.fsdecode(p): v for p, v in tree_bytes(out).items()} == want, at


# -- the state's marks table ---------------------------------------------------------


def _old_state(path: Path) -> None:
    """A state as a version before marks left it: the files table, one row."""
    old = state_mod.SCHEMA.split("-- A transcript's last shipped line ends")[0]
    assert "marks" not in old
    db = sqlite3.connect(path)
    db.executescript(old)
    db.execute("INSERT INTO files VALUES (?, 1, 10, 1, 2, 3, 420, ?, NULL)",
               (APP.encode(), b"h" * 32))
    db.commit()
    db.close()


def test_an_old_state_reads_before_and_after_its_writer_adds_marks(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    _old_state(path)
    reader = State(path, readonly=True)  # (a status command, the daemon not yet started)
    try:
        row = reader.get(APP.encode())
        assert row is not None and (row.offset, row.marks) == (10, None)
        writer = State(path)
        writer.commit(1, [row.but(offset=20, marks=b"m")])
        got = reader.get(APP.encode())
        assert got is not None and got.offset == 20  # (its marks: unread, it opened before)
        again = State(path, readonly=True)
        assert (again.get(APP.encode()) or row).marks == b"m"
        again.close()
        writer.close()
    finally:
        reader.close()


def test_a_version_before_marks_still_writes_a_state_this_one_opened(tmp_path: Path) -> None:
    """An older daemon still running while this version opened its state (an upgrade
    before the restart), or run again after it (a downgrade): its rows go in as before,
    and marks written for another offset of a file are not taken for its new one."""
    path = tmp_path / "state.db"
    _old_state(path)
    new = State(path)
    row = new.get(APP.encode())
    assert row is not None
    new.commit(1, [row.but(offset=20, marks=b"m")])
    new.close()
    db = sqlite3.connect(path)  # what the older version's commit does
    db.execute("INSERT OR REPLACE INTO files VALUES (?, 1, 30, 1, 2, 3, 420, ?, NULL)",
               (APP.encode(), b"h" * 32))
    db.commit()
    db.close()
    again = State(path)
    got = again.get(APP.encode())
    assert got is not None and (got.offset, got.marks) == (30, None)
    again.close()


def test_a_move_is_not_matched_to_a_file_deleted_longer_ago_than_a_revival(
        tmp_path: Path) -> None:
    """A transcript deleted 200 days ago (its tombstone expired, compaction and prune then
    dropped its generation), and now a file of the same session in another folder that
    begins with its bytes (a copy the user put back): before the fix it shipped as a move,
    a copy of a generation the store no longer holds, and its first bytes were in no
    backup. As ``_restored_as_shipped``, a deletion older than ``revive_within`` is no
    source."""
    store, clock = MemoryStore(), Clock()
    src = tmp_path / "src"
    sh = make_shipper(src, store, tmp_path / "st.db", clock)
    data = rows(0, 40)
    f = write(src, APP, data)
    ship_all(sh, src)
    f.unlink()
    clock.t += 5
    ship_all(sh, src, APP)
    clock.t += 200 * 86400
    repo = Repository(store, M)
    assert compact(repo, CompactOptions(now=clock.t, max_chain=0)).expired == [APP]
    write(src, OTHER, short_rows(0, 3))  # a later snapshot, whose points do not name APP
    clock.t += 5
    ship_all(sh, src)
    compact(repo, CompactOptions(now=clock.t, max_chain=0))
    pr = prune(repo, Policy(keep_last=1), opts=CompactOptions(now=clock.t))
    assert pr.errors == [], pr
    assert APP.encode() not in load_backup(repo, at=clock.t).files
    write(src, LIB, data + rows(40, 41))
    clock.t += 5
    ship_all(sh, src)
    assert read_index(store, segment_key(M, sh.state.next_seq - 1)).copies == []
    assert restored(store, clock.t, tmp_path / "out") == tree_bytes(src)


# -- which bytes win -------------------------------------------------------------------


def test_copies_and_data_at_the_same_offsets_restore_the_same_checked_bytes_every_time(
        tmp_path: Path) -> None:
    """A generation given three times over: its own frame, a copy of another file over the
    same bytes, and a copy of a third one over its second half. Each byte restored is one
    of those frames' (each checked), and the same before and after compaction."""
    store = MemoryStore()
    x, y, z = (random.Random(i).randbytes(100) for i in range(3))
    a, b, c = (f"projects/-a/{n}.jsonl".encode() for n in "abc")
    w = SegmentWriter(M, 0, 1_750_000_000.0)
    w.add_data(a, 1, 0, x, mode=0o600, mtime_ns=0)
    w.add_data(b, 1, 0, y, mode=0o600, mtime_ns=0)
    store.put(segment_key(M, 0), w.finish())
    w = SegmentWriter(M, 1, 1_750_000_001.0)
    copies = [Copy(c, 1, 0, a, 1, 0, 100, 0o600, 0), Copy(c, 1, 50, b, 1, 0, 50, 0o600, 0)]
    for cp in copies:
        w.add_copy(cp)
    w.add_data(c, 1, 0, z, mode=0o600, mtime_ns=0)
    store.put(segment_key(M, 1), w.finish())
    got = restored(store, 1_750_000_002.0, tmp_path / "one")[c]
    assert len(got) == 100
    assert all(got[i] in (x[i], z[i]) + ((y[i - 50],) if i >= 50 else ()) for i in range(100))
    assert restored(store, 1_750_000_002.0, tmp_path / "two")[c] == got
    rep = compact(Repository(store, M), CompactOptions(now=1_750_000_003.0, max_chain=0))
    assert rep.errors == [], rep
    assert restored(store, 1_750_000_002.0, tmp_path / "after")[c] == got


# -- the reader's bounds: memory -------------------------------------------------------


def test_doubling_copies_make_at_most_parts_max_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    """44 copies: each file is the one before it twice over, from one 4 MiB frame on. 22
    doublings would be 4 million parts (a 16 TiB file claimed by a store of kilobytes):
    they stop at PARTS_MAX, and what the locator keeps is in proportion to that bound
    (measured: ~540 bytes a part, so ~140 MB at the 2**18 of PARTS_MAX; here 2**14)."""
    monkeypatch.setattr(pointfmt, "PARTS_MAX", 1 << 14)
    kept: list[Locator] = []

    def build() -> None:
        loc = Locator()
        a = b"projects/-a/a.jsonl"
        loc.add("k", _x(a, 1, 0, 4 << 20))
        prev, size = a, 4 << 20
        for k in range(22):
            p = f"projects/-a/b{k}.jsonl".encode()
            loc.add_copies([Copy(p, 1, 0, prev, 1, 0, size, 0, 0),
                            Copy(p, 1, size, prev, 1, 0, size, 0, 0)])
            prev, size = p, 2 * size
        loc.extents(prev, 1, size)
        kept.append(loc)

    held = kept_after(build)
    assert held < (1 << 14) * 1000, held


def test_a_chain_of_fifty_thousand_copies_resolves_without_recursion_in_linear_work() -> None:
    """Each generation a copy of the one before (a cut of a cut of a cut...), 50 000 deep,
    with a cycle back to the middle of the chain at its end: no recursion limit, work in
    proportion to the chain, and the top holds the bottom's frame."""
    n = 50_000
    loc = Locator()
    a = b"projects/-a/x.jsonl"
    loc.add("k", _x(a, 1, 0, 100))
    loc.add_copies(Copy(a, g + 1, 0, a, g, 0, 100, 0, 0) for g in range(1, n))
    loc.add_copies([Copy(a, n // 2, 0, a, n - 1, 0, 100, 0, 0)])  # the cycle
    with work_budget(60 * n):
        got = loc.extents(a, n - 1, 100)
    assert [(k, x.start, x.end, x.frame) for k, x in got] == [("k", 0, 100, 100)]


def test_a_file_made_of_copies_of_copies_is_refused_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store whose files double by copies of copies claims terabytes from one frame: a
    restore refuses those files with one line each (never the whole restore for want of
    disk), writes the others, and writes what a doubling names within the bound."""
    from syncd.restore import plan
    monkeypatch.setattr(plan, "OVERCLAIM_SLACK", 1 << 20)  # (the test writes little)
    w = SegmentWriter(M, 0, T0)
    frame = random.Random(9).randbytes(64 << 10)
    a, ok = b"projects/-a/a.jsonl", b"projects/-a/ok.jsonl"
    w.add_data(a, 1, 0, frame, mode=0o600, mtime_ns=0)
    w.add_data(ok, 1, 0, b'{"ok":1}\n', mode=0o600, mtime_ns=0)
    prev, size = a, len(frame)
    for k in range(22):
        p = f"projects/-a/b{k}.jsonl".encode()
        w.add_copy(Copy(p, 1, 0, prev, 1, 0, size, 0o600, 0))
        w.add_copy(Copy(p, 1, size, prev, 1, 0, size, 0o600, 0))
        prev, size = p, 2 * size
    store = MemoryStore()
    store.put(segment_key(M, 0), w.finish())
    out = tmp_path / "out"
    r = restore(Repository(store, M), RestoreOptions(target=out, local_machine=M))
    got = tree_bytes(out)
    assert got[ok] == b'{"ok":1}\n' and got[a] == frame
    assert got[b"projects/-a/b0.jsonl"] == frame * 2
    assert got[b"projects/-a/b3.jsonl"] == frame * 16  # 1 MiB: within 16 x 64 KiB + 1 MiB
    refused = [e for e in r.errors if "named over and over" in e]
    assert b"projects/-a/b21.jsonl" not in got and len(refused) >= 10, r.errors

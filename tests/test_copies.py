"""Copies: a cut tail, a moved session and a file renamed over its original ship as a
copy of the bytes the store holds plus what is new; every flush before and after stays a
point in time, through deltas and manifests, and the copies cost no more than their new
bytes."""

from __future__ import annotations

import dataclasses
import json
import os
import random
from pathlib import Path

import pytest

from syncd.archive.compact import CompactOptions, compact
from syncd.archive.verify import verify
from syncd.backup.headwriter import HeadWriter
from syncd.backup.marks import MAX_LINES, Marks, cut_point, marks_of
from syncd.errors import FormatError
from syncd.format.points import Locator
from syncd.format.segment import Copy, Extent, SegmentWriter, parse_segment
from syncd.repository import Repository
from syncd.restore.listing import session_rows
from syncd.store import MemoryStore, Store
from syncd.store.layout import segment_key
from syncd.view import load_backup, moved_away
from tests.helpers import tree_bytes, write
from tests.readers import read_index
from tests.test_compact import Clock, M, make_shipper, ship_all
from tests.test_points import Tree, restored

SID = "5f0c3a1e-9b7d-4c2a-8e6f-1a2b3c4d5e6f"
APP = f"projects/-home-u-app/{SID}.jsonl"
LIB = f"projects/-home-u-lib/{SID}.jsonl"
AGENT_APP = f"projects/-home-u-app/{SID}/subagents/agent-a1.jsonl"
AGENT_LIB = f"projects/-home-u-lib/{SID}/subagents/agent-a1.jsonl"


def row(i: int, size: int = 1200, cwd: str = "/home/u/app", kind: str | None = None) -> bytes:
    """One transcript line as Claude writes it (compact JSON); random text, so frames
    keep their size."""
    text = random.Random(f"{i}:{size}").randbytes(size // 2).hex()
    kind = kind or ("user" if i % 2 == 0 else "assistant")
    msg: dict[str, object] = {"role": kind, "content": text}
    return json.dumps({"type": kind, "sessionId": SID, "cwd": cwd, "uuid": f"{i:08x}",
                       "timestamp": f"2026-11-01T10:{i // 60 % 60:02d}:{i % 60:02d}.000Z",
                       "message": msg}, separators=(",", ":")).encode() + b"\n"


def rows(lo: int, hi: int, **kw: object) -> bytes:
    return b"".join(row(i, **kw) for i in range(lo, hi))  # type: ignore[arg-type]


def cut_tail(path: Path, keep_lines: int, new: bytes) -> int:
    """Claude withdrawing streamed rows: the file cut after ``keep_lines`` lines and what
    follows written in place (same inode). Returns the cut's offset."""
    data = path.read_bytes()
    at = 0
    for _ in range(keep_lines):
        at = data.index(b"\n", at) + 1
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(new)
        f.truncate(at + len(new))
    return at


class Story:
    """A tree changed flush by flush; ``trees[i]`` is what a restore as of flush i gives."""

    def __init__(self, tmp: Path, store: Store) -> None:
        self.src, self.clock, self.store = tmp / "src", Clock(), store
        self.sh = make_shipper(self.src, store, tmp / "st.db", self.clock)
        self.times: list[float] = []
        self.trees: list[Tree] = []
        self.gone: Tree = {}

    def flush(self, *gone: str) -> int:
        """Ship, and return the stored size of the flush's segment."""
        self.clock.t += 5
        seq = self.sh.state.next_seq
        for g in gone:  # as the flush before left them
            self.gone[g.encode()] = self.trees[-1][g.encode()]
        ship_all(self.sh, self.src, *gone)
        self.times.append(self.clock.t)
        tree = tree_bytes(self.src)
        # A restore brings deleted files back, but not those of a session moved away.
        away = moved_away([*((p, True) for p in self.gone if p not in tree),
                           *((p, False) for p in tree)])
        self.trees.append({**{p: b for p, b in self.gone.items() if p not in away}, **tree})
        info = self.store.head(segment_key(M, seq))
        assert info is not None
        return info.size

    def check_every_point(self, out: Path) -> None:
        for i, (t, want) in enumerate(zip(self.times, self.trees, strict=True)):
            assert restored(self.store, t, out / f"r{i}") == want, f"flush {i}"


def copies_of(store: Store, seq: int) -> list[Copy]:
    return read_index(store, segment_key(M, seq)).copies


@pytest.mark.parametrize("max_chain", [24, 0], ids=["deltas", "manifests"])
def test_a_cut_tail_ships_as_a_copy_and_every_point_restores(tmp_path: Path,
                                                             max_chain: int) -> None:
    store = MemoryStore()
    s = Story(tmp_path, store)
    f = write(s.src, APP, rows(0, 400))                       # ~480 KB
    s.flush()
    write(s.src, APP, rows(400, 410), "ab")
    s.flush()
    # The last rows withdrawn and written again, in place: a cut, then new bytes.
    new = rows(1000, 1004)
    at = cut_tail(f, 405, new)
    stored = s.flush()
    [c] = copies_of(store, 2)
    assert (c.path, c.gen, c.at, c.src, c.src_gen, c.start, c.end) == (
        APP.encode(), 2, 0, APP.encode(), 1, 0, at)
    assert "cut at" in (c.reason or "")
    ix = read_index(store, segment_key(M, 2))
    assert [(x.gen, x.start, x.end) for x in ix.extents] == [(2, at, at + len(new))]
    assert stored < len(new) + 4096  # the new bytes (random hex: about half) and an index
    compact(Repository(store, M), CompactOptions(max_chain=max_chain, now=s.clock.t + 1))
    # A cut with nothing after it: a copy alone.
    at = cut_tail(f, 380, b"")
    s.flush()
    [c] = copies_of(store, 3)
    assert (c.gen, c.src_gen, c.end) == (3, 2, at)
    assert read_index(store, segment_key(M, 3)).extents == []
    write(s.src, APP, rows(2000, 2003), "ab")
    s.flush()
    # A cut of a cut still in segments: the copy of a copy.
    cut_tail(f, 379, rows(3000, 3001))
    s.flush()
    s.check_every_point(tmp_path / "before")
    rep = compact(Repository(store, M), CompactOptions(max_chain=max_chain, now=s.clock.t + 1))
    assert rep.errors == [], rep
    s.check_every_point(tmp_path / "after")
    v = verify(Repository(store, M), read_data=1.0, now=s.clock.t + 2)
    assert v.problems == [], v.problems
    # The catalog of the new generations keeps what the first lines named.
    b = load_backup(Repository(store, M))
    assert b.sessions[APP.encode()].fields.get("cwd") == "/home/u/app"


def test_a_big_transcript_whose_tail_is_rewritten_stores_only_the_tail(
        tmp_path: Path) -> None:
    """The issue's figure, scaled to a test: a 4 MB transcript whose last 30 KB is
    rewritten stores at most 35 KB more, not the file again."""
    store = MemoryStore()
    s = Story(tmp_path, store)
    f = write(s.src, APP, rows(0, 3400))
    assert f.stat().st_size > 4_000_000
    s.flush()
    size = f.stat().st_size
    data = f.read_bytes()
    keep = data[: size - 30_000].count(b"\n")
    cut_tail(f, keep, rows(5000, 5025))
    assert size - 35_000 < f.stat().st_size
    assert s.flush() <= 35_000
    s.check_every_point(tmp_path / "out")


def test_a_changed_first_line_is_no_cut_but_a_patch(tmp_path: Path) -> None:
    """The head changed: no prefix to copy (not a cut); the rest of the lines are the
    old ones, so only the new first line ships."""
    store = MemoryStore()
    s = Story(tmp_path, store)
    f = write(s.src, APP, rows(0, 50))
    s.flush()
    f.write_bytes(row(999) + rows(1, 50))
    s.flush()
    [c] = copies_of(store, 1)
    assert (c.gen, c.at, c.start, c.end) == (2, len(row(999)), len(row(0)), len(rows(0, 50)))
    first = read_index(store, segment_key(M, 1)).extents[0]
    assert (first.gen, first.start, first.end) == (2, 0, len(row(999)))
    s.check_every_point(tmp_path / "out")


def test_a_file_renamed_over_the_original_that_continues_it_is_a_copy(tmp_path: Path) -> None:
    store = MemoryStore()
    s = Story(tmp_path, store)
    f = write(s.src, APP, rows(0, 80))
    s.flush()
    tmp = write(s.src, APP + ".compact.tmp.1a2b", f.read_bytes() + rows(80, 82))
    tmp.rename(f)
    stored = s.flush()
    [c] = copies_of(store, 1)
    assert (c.gen, c.src_gen, c.end) == (2, 1, len(rows(0, 80)))
    assert stored < len(rows(80, 82)) + 4096
    s.check_every_point(tmp_path / "out")


def test_a_moved_session_is_a_move(tmp_path: Path) -> None:
    """``/cd``: the transcript and its folder go to another project folder and a
    relocated record is appended. The store gets copies of what it holds and the new
    bytes; a restore now has the session once, in its new folder; one before the move has
    it where it was; listings show one live session, never a deleted one."""
    store = MemoryStore()
    s = Story(tmp_path, store)
    write(s.src, APP, rows(0, 200))
    write(s.src, AGENT_APP, rows(500, 520))
    s.flush()
    os.makedirs(s.src / f"projects/-home-u-lib/{SID}/subagents")
    os.rename(s.src / APP, s.src / LIB)
    os.rename(s.src / AGENT_APP, s.src / AGENT_LIB)
    os.rmdir(s.src / f"projects/-home-u-app/{SID}/subagents")
    os.rmdir(s.src / f"projects/-home-u-app/{SID}")
    relocated = json.dumps({"type": "relocated", "sessionId": SID,
                            "relocatedCwd": "/home/u/lib"}, separators=(",", ":")).encode()
    write(s.src, LIB, relocated + b"\n", "ab")
    stored = s.flush(APP, AGENT_APP)
    got = {(c.path, c.src, c.end) for c in copies_of(store, 1)}
    assert got == {(LIB.encode(), APP.encode(), len(rows(0, 200))),
                   (AGENT_LIB.encode(), AGENT_APP.encode(), len(rows(500, 520)))}
    assert stored < 4096  # an index and one line: none of the moved bytes again
    ix = read_index(store, segment_key(M, 1))
    assert {t.path for t in ix.tombstones} == {APP.encode(), AGENT_APP.encode()}
    s.check_every_point(tmp_path / "out")
    b = load_backup(Repository(store, M))
    assert set(b.files) == {LIB.encode(), AGENT_LIB.encode()}
    assert [str(s.path) for s in b.sessions.values()] == [str(LIB.encode())]
    assert b.sessions[LIB.encode()].fields.get("cwd") == "/home/u/app"
    # Listed once: from the machine's backup, then from its head.
    for head in (False, True):
        if head:
            HeadWriter(Repository(store, M), s.sh.state, os.fsencode(s.src),
                       interval=300, tombstone_keep=0).write()
        listed = list(session_rows(Repository(store, M), tmp_path / "here"))
        assert [(r["session_id"], r["deleted_locally_at"]) for r in listed] == [(SID, None)], head
        assert listed[0]["project"] == "/home/u/lib"  # where it is now, as Claude's list
    compact(Repository(store, M), CompactOptions(max_chain=0, now=s.clock.t + 1))
    s.check_every_point(tmp_path / "compacted")


def test_a_move_back_and_forth_is_a_move_each_time(tmp_path: Path) -> None:
    store = MemoryStore()
    s = Story(tmp_path, store)
    write(s.src, APP, rows(0, 60))
    s.flush()
    os.makedirs(s.src / "projects/-home-u-lib")
    os.rename(s.src / APP, s.src / LIB)
    write(s.src, LIB, rows(60, 61), "ab")
    s.flush(APP)
    os.rename(s.src / LIB, s.src / APP)
    write(s.src, APP, rows(61, 62), "ab")
    s.flush(LIB)
    assert [(c.path, c.src) for c in copies_of(store, 2)] == [(APP.encode(), LIB.encode())]
    b = load_backup(Repository(store, M))
    assert set(b.files) == {APP.encode()}
    assert b.files[APP.encode()].size == len(rows(0, 62))
    s.check_every_point(tmp_path / "out")


# -- the format and the reader's bounds ------------------------------------------------


def _segment(copies: list[Copy], frames: list[tuple[bytes, int, int, bytes]]) -> bytes:
    w = SegmentWriter(M, 0, 1.0)
    for c in copies:
        w.add_copy(c)
    for path, gen, start, data in frames:
        w.add_data(path, gen, start, data, mode=0o600, mtime_ns=0)
    return w.finish()


def test_copy_entries_read_back_as_written() -> None:
    c1 = Copy(b"projects/-a/x.jsonl", 2, 0, b"projects/-a/x.jsonl", 1, 0, 10, 0o600, 7, "cut")
    c2 = Copy(b"projects/-b/x.jsonl", 1, 0, b"projects/-a/\xffx.jsonl", 3, 5, 20, 0o644, 8)
    ix = parse_segment(_segment([c1, c2], []), "test")
    assert ix.copies == [c1, c2]


@pytest.mark.parametrize("field,value", [
    ("gen", -1), ("at", True), ("start", 5.5), ("end", 1 << 51), ("from_gen", "1"),
    ("mode", None), ("end", 0),
])
def test_a_copy_no_writer_makes_refuses_the_index(field: str, value: object) -> None:
    blob = _segment([Copy(b"projects/-a/x.jsonl", 2, 0, b"projects/-a/y.jsonl", 1, 3, 10,
                          0o600, 0)], [])
    ix = parse_segment(blob, "t")
    doc = {"op": "copy", "path": "projects/-a/x.jsonl", "gen": 2, "at": 0, "start": 3,
           "end": 10, "from_gen": 1, "mode": 384, "mtime_ns": 0, "from": "projects/-a/y.jsonl"}
    doc[field] = value
    from syncd.format import segment as seg
    if field == "end" and value == 0:  # end before start
        doc["start"] = 3
    with pytest.raises(ValueError):
        seg._copy(doc)
    assert ix.copies


def test_a_copy_of_itself_is_refused() -> None:
    from syncd.format import segment as seg
    with pytest.raises(ValueError):
        seg._copy({"op": "copy", "path": "p/x", "gen": 1, "at": 0, "start": 0, "end": 3,
                   "from_gen": 1, "mode": 0, "mtime_ns": 0})


def _x(path: bytes, gen: int, start: int, end: int, off: int) -> Extent:
    return Extent(path, gen, start, end, off, 10, "0" * 64, 0o600, 0)


def test_the_locator_makes_parts_of_frames_for_copies() -> None:
    loc = Locator()
    a, b = b"projects/-a/x.jsonl", b"projects/-b/x.jsonl"
    loc.add_all([("k1", _x(a, 1, 0, 100, 16)), ("k2", _x(a, 1, 100, 250, 16))])
    loc.add_copies([Copy(a, 2, 0, a, 1, 0, 180, 0o600, 0)])
    loc.add_all([("k3", _x(a, 2, 180, 200, 16))])
    loc.add_copies([Copy(b, 1, 0, a, 2, 0, 190, 0o600, 0)])
    got = [(k, x.start, x.end, x.skip, x.frame) for k, x in loc.extents(b, 1, 190)]
    assert got == [("k1", 0, 100, 0, 100), ("k2", 100, 180, 0, 150), ("k3", 180, 190, 0, 20)]
    assert loc.holds(b, 1) and loc.mode_of(b, 1) is not None


def test_copies_in_a_cycle_find_no_bytes_and_end() -> None:
    loc = Locator()
    a, b = b"projects/-a/x.jsonl", b"projects/-b/x.jsonl"
    loc.add_copies([Copy(a, 1, 0, b, 1, 0, 50, 0, 0), Copy(b, 1, 0, a, 1, 0, 50, 0, 0)])
    assert loc.extents(a, 1, 50) == [] and loc.extents(b, 1, 50) == []


def test_copies_make_a_bounded_number_of_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    """A store naming many copies of a many-framed file: the parts stop at the bound, the
    rest is a gap (a restore reports it), memory stays bounded."""
    from syncd.format import points
    monkeypatch.setattr(points, "PARTS_MAX", 500)
    loc = Locator()
    a = b"projects/-a/x.jsonl"
    loc.add_all(("k", _x(a, 1, i * 10, i * 10 + 10, 16 + i)) for i in range(400))
    targets = [f"projects/-c{i}/x.jsonl".encode() for i in range(50)]
    loc.add_copies(Copy(t, 1, 0, a, 1, 0, 4000, 0, 0) for t in targets)
    reached = [sum(x.end - x.start for _, x in loc.extents(t, 1, 4000)) for t in targets]
    assert reached[0] == 4000 and sum(reached) <= 500 * 10


def test_a_part_decodes_to_its_share_of_the_frame_only() -> None:
    blob = _segment([], [(b"p/x", 1, 0, b"0123456789")])
    ix = parse_segment(blob, "t")
    [x] = ix.extents
    from syncd.format.segment import extent_bytes
    part = x.part(b"p/y", 1, 3, 7, 0)
    assert extent_bytes(blob, 0, part, "t") == b"3456"
    with pytest.raises(FormatError):  # a part beyond its frame
        extent_bytes(blob, 0, dataclasses.replace(part, skip=8), "t")


def test_marks_find_the_cut_and_refuse_a_changed_head(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_bytes(rows(0, 400, size=200))  # ~130 KB: more lines than are marked
    fd = os.open(p, os.O_RDONLY)
    try:
        blob = marks_of(fd, p.stat().st_size)
    finally:
        os.close(fd)
    assert blob is not None
    m = Marks.decode(blob)
    assert m is not None and len(m.ends) == MAX_LINES
    at = cut_tail(p, 390, b"other\n")
    fd = os.open(p, os.O_RDONLY)
    try:
        assert cut_point(fd, p.stat().st_size, blob) == at
    finally:
        os.close(fd)
    p.write_bytes(b"X" + p.read_bytes()[1:])
    fd = os.open(p, os.O_RDONLY)
    try:
        assert cut_point(fd, p.stat().st_size, blob) is None
        assert cut_point(fd, p.stat().st_size, b"garbage") is None
    finally:
        os.close(fd)


def test_a_row_removed_in_the_middle_ships_as_a_patch(tmp_path: Path) -> None:
    """The issue's figure, scaled: a 4 MB transcript with one row removed in the middle
    (Claude rewrites the file whole) stores well under 2 % of its size."""
    store = MemoryStore()
    s = Story(tmp_path, store)
    f = write(s.src, APP, rows(0, 3400))
    s.flush()
    data = f.read_bytes()
    gone = row(1700)
    assert data.count(gone) == 1
    f.write_bytes(data.replace(gone, b""))
    stored = s.flush()
    assert stored <= 0.02 * len(data)
    cs = copies_of(store, 1)
    assert [(c.at, c.start, c.end) for c in cs] == [
        (0, 0, data.index(gone)), (data.index(gone), data.index(gone) + len(gone), len(data))]
    assert "patched" in (cs[0].reason or "")
    s.check_every_point(tmp_path / "out")
    compact(Repository(store, M), CompactOptions(max_chain=0, now=s.clock.t + 1))
    s.check_every_point(tmp_path / "compacted")


def test_a_headless_compaction_renamed_over_the_original_ships_as_a_patch(
        tmp_path: Path) -> None:
    """CLAUDE_CODE_TRANSCRIPT_LOCAL_GC: a smaller file (rows dropped all along, one new)
    renamed over the original (a new inode): a patch; the catalog is read afresh."""
    store = MemoryStore()
    s = Story(tmp_path, store)
    f = write(s.src, APP, rows(0, 600))
    s.flush()
    kept = b"".join(row(i) for i in range(600) if i % 10 != 3) + row(9000)
    tmp = write(s.src, APP + ".compact.tmp.9f3e", kept)
    tmp.rename(f)
    stored = s.flush()
    assert copies_of(store, 1) and stored < 0.05 * len(kept)
    s.check_every_point(tmp_path / "out")
    b = load_backup(Repository(store, M))
    assert b.sessions[APP.encode()].fields.get("cwd") == "/home/u/app"


def test_a_rewrite_with_little_in_common_ships_whole(tmp_path: Path) -> None:
    store = MemoryStore()
    s = Story(tmp_path, store)
    f = write(s.src, APP, rows(0, 200))
    s.flush()
    f.write_bytes(row(0) + rows(5000, 5200))  # the first line kept, little else
    s.flush()
    assert copies_of(store, 1) == []
    s.check_every_point(tmp_path / "out")


def test_marks_that_cover_less_than_an_append_check_prove_no_cut(tmp_path: Path) -> None:
    """Short lines: the marked lines span less than the 64 KiB an append check hashes, so
    a change just before them would go unseen: no cut is taken (a patch proves it)."""
    p = tmp_path / "t.jsonl"
    p.write_bytes(b"".join(b'{"n":%d}\n' % i for i in range(20000)))
    fd = os.open(p, os.O_RDONLY)
    try:
        blob = marks_of(fd, p.stat().st_size)
        assert blob is not None
        assert cut_point(fd, p.stat().st_size, blob) is None
    finally:
        os.close(fd)


def test_a_compaction_stores_the_bytes_generations_share_once(tmp_path: Path) -> None:
    """A cut's generation and the one it was cut from share frames: the manifest's packs
    hold those bytes once (parts of the same frames), not once per generation."""
    store = MemoryStore()
    s = Story(tmp_path, store)
    f = write(s.src, APP, rows(0, 1500))
    seg0 = s.flush()
    cut_tail(f, 1490, rows(7000, 7003))
    s.flush()
    cut_tail(f, 1480, rows(8000, 8002))
    s.flush()
    rep = compact(Repository(store, M), CompactOptions(max_chain=0, now=s.clock.t + 1))
    assert rep.errors == [], rep
    packs = sum(len(store.objects[k]) for k in store.objects if "/pack/" in k)
    assert packs < 1.2 * seg0, (packs, seg0)
    s.check_every_point(tmp_path / "out")
    v = verify(Repository(store, M), read_data=1.0, now=s.clock.t + 2)
    assert v.problems == [], v.problems
    # And again: a compaction that rewrites those packs keeps the sharing.
    write(s.src, APP, rows(9000, 9001), "ab")
    s.flush()
    rep = compact(Repository(store, M), CompactOptions(max_chain=0, now=s.clock.t + 1,
                                                       repack_share=1.0))
    assert rep.errors == [], rep
    packs = sum(len(store.objects[k]) for k in store.objects if "/pack/" in k)
    assert packs < 1.2 * seg0, (packs, seg0)
    s.check_every_point(tmp_path / "again")


def test_real_transcripts_cut_patched_and_moved(tmp_path: Path, samples: Path) -> None:
    """Each real transcript of ../shared/claude-samples: its last rows withdrawn (two
    written in their place), a row in the middle removed, then the session moved to
    another folder with a relocated line. Each change stores a small part of the file,
    and every flush restores exactly, before and after a compaction."""
    store = MemoryStore()
    s = Story(tmp_path, store)
    found = sorted(samples.glob("*/projects/*/*.jsonl"))
    assert len(found) >= 3
    for i, t in enumerate(found):
        raw = t.read_bytes()
        rel = f"projects/-p{i}/{t.name}"
        f = write(s.src, rel, raw)
        s.flush()
        lines = raw.splitlines(keepends=True)
        at = cut_tail(f, len(lines) - 3, lines[-2] + lines[-1])
        assert at > 0.9 * len(raw)
        assert s.flush() < 0.02 * len(raw) + 4096, t
        data = f.read_bytes()
        middle = data.splitlines(keepends=True)[len(lines) // 2]
        f.write_bytes(data.replace(middle, b"", 1))
        assert s.flush() <= 0.02 * len(data) + 4096, t
        os.makedirs(s.src / f"projects/-moved{i}")
        moved = f"projects/-moved{i}/{t.name}"
        os.rename(f, s.src / moved)
        relocated = {"type": "relocated", "sessionId": t.stem, "relocatedCwd": f"/moved{i}"}
        write(s.src, moved, json.dumps(relocated).encode() + b"\n", "ab")
        assert s.flush(rel) < 4096, t
    s.check_every_point(tmp_path / "out")
    compact(Repository(store, M), CompactOptions(max_chain=0, now=s.clock.t + 1))
    s.check_every_point(tmp_path / "compacted")


def test_a_row_removed_further_back_than_claude_cuts_is_a_patch_not_a_cut(
        tmp_path: Path) -> None:
    """The marks reach a row 90 KB back: as a cut, everything after it would ship again;
    further back than Claude cuts (64 KiB), the patch is taken and copies that too."""
    store = MemoryStore()
    s = Story(tmp_path, store)
    f = write(s.src, APP, rows(0, 79))  # ~110 KB: the marks span all of it
    s.flush()
    write(s.src, APP, rows(79, 80), "ab")  # a second flush: the marks
    s.flush()
    data = f.read_bytes()
    f.write_bytes(data.replace(row(5), b"", 1))
    stored = s.flush()
    cs = copies_of(store, 2)
    assert len(cs) == 2 and "patched" in (cs[0].reason or "")
    assert stored < 4096
    s.check_every_point(tmp_path / "out")

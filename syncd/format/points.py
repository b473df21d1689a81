"""Points in time: what each flush changed, kept when compaction folds the flushes.

A flush (one segment) changes a few files: a generation grows to a new size, a new one
starts, one is deleted. Transcripts only grow, so the tree as of any flush is, for each
file, a generation and a length: a *point* lists exactly that for the files the flush
touched. Deltas and manifests carry the points of the segments they fold
(docs/FORMAT.md, "Points"), so compaction no longer merges flushes into one point.

``apply`` replays points onto a set of files; a ``Locator`` finds the bytes of each
generation in whatever objects hold them (a newer manifest's packs, a delta, a segment).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from syncd.format.catalog import FIELD_MAX, Session, session_of
from syncd.format.segment import Copy, Extent, SegmentIndex, decode_path, encode_path, when
from syncd.format.snapshot import Entry

# A reader makes at most this many parts of frames out of copies (each about 540 bytes
# held: ~140 MB at most): a store naming more copies of bigger files (copies of copies
# double what they name) leaves the rest as gaps. A writer's chain of cuts between two
# manifests makes a few thousand.
PARTS_MAX = 1 << 18

# A reader's limit on the points of one object (a writer folds at most 4096 segments
# into one delta, a point per segment).
MAX_POINTS = 1 << 16


@dataclass(frozen=True, slots=True)
class Change:
    """One file at one flush: generation ``gen`` is ``size`` bytes long, or (``size`` is
    None) was gone from the tree at ``time``."""

    path: bytes
    gen: int
    size: int | None
    time: float = 0.0


@dataclass(slots=True)
class Point:
    """One flush: segment ``seq``, built at ``time``, what it changed, and the catalog
    fields its new lines named (path, generation, fields)."""

    seq: int
    time: float
    changes: list[Change]
    catalog: list[tuple[bytes, int, dict[str, str]]] = field(default_factory=list)

    @property
    def grown(self) -> int:
        """Bytes the flush added (sizes only: a new generation counts whole)."""
        return sum(c.size for c in self.changes if c.size is not None)


def point_of(ix: SegmentIndex) -> Point:
    """The point of one segment: the last size of each generation it extends, then its
    deletions, in the order a fold applies them."""
    sizes: dict[tuple[bytes, int], int] = {}
    for c in ix.copies:
        sizes[(c.path, c.gen)] = max(sizes.get((c.path, c.gen), 0), c.stop)
    for x in ix.extents:
        sizes[(x.path, x.gen)] = max(sizes.get((x.path, x.gen), 0), x.end)
    changes = [Change(p, g, n) for (p, g), n in sizes.items()]
    changes += [Change(t.path, t.gen, None, t.time) for t in ix.tombstones]
    catalog = [(path, gen, fields) for path, (gen, fields) in ix.sessions.items()]
    return Point(ix.seq, ix.time, changes, catalog)


def encode(points: list[Point]) -> dict[str, Any]:
    """The index keys ``paths`` and ``points`` (paths named once, by number). A catalog
    field is written only when it differs from what the object said of that generation
    last (folding a repeat changes nothing)."""
    ids: dict[bytes, int] = {}
    docs: list[list[Any]] = []
    said: dict[tuple[bytes, int], dict[str, str]] = {}
    for p in points:
        changes: list[list[Any]] = []
        for c in p.changes:
            pid = ids.setdefault(c.path, len(ids))
            changes.append([pid, c.gen, c.size] if c.size is not None
                           else [pid, c.gen, None, c.time])
        doc: list[Any] = [p.seq, p.time, changes]
        catalog = []
        for path, gen, fields in p.catalog:
            last = said.setdefault((path, gen), {})
            new = {k: v for k, v in fields.items() if last.get(k) != v}
            last.update(new)
            if new:
                catalog.append([ids.setdefault(path, len(ids)), gen, new])
        if catalog:
            doc.append(catalog)
        docs.append(doc)
    return {"paths": [encode_path(p) for p in ids], "points": docs}


def decode(extra: dict[str, Any], where: str) -> list[Point]:
    """The points of an index (none when it has no ``points``), checked: seqs rising,
    sizes and generations whole and not negative. ``ValueError`` names what is wrong."""
    docs = extra.get("points")
    if docs is None:
        return []
    paths = [decode_path(d) for d in extra["paths"]]
    if len(docs) > MAX_POINTS:
        raise ValueError(f"{where}: {len(docs)} points, more than {MAX_POINTS}")
    out: list[Point] = []
    for seq, t, changes, *rest in docs:
        seq, t = _whole(seq), when(t)
        if len(rest) > 1:
            raise ValueError(f"{where}: point {seq}: not a point")
        if out and seq <= out[-1].seq:
            raise ValueError(f"{where}: point {seq} after {out[-1].seq}")
        got = []
        for c in changes:
            path, gen = paths[_whole(c[0])], _whole(c[1])
            if c[2] is None:
                got.append(Change(path, gen, None, when(c[3])))
            else:
                got.append(Change(path, gen, _whole(c[2])))
        catalog = [(paths[_whole(pid)], _whole(gen), {str(k): str(v)[:FIELD_MAX]
                                                     for k, v in fields.items()})
                   for pid, gen, fields in (rest[0] if rest else [])]
        out.append(Point(seq, t, got, catalog))
    return out


def _whole(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"not a whole number: {v!r}")
    return v


def apply(point: Point, files: dict[bytes, Entry], *,
          retire: Callable[[Entry], None] = lambda e: None,
          wanted: Callable[[bytes], bool] = lambda path: True,
          mode_of: Callable[[bytes, int], tuple[int, int] | None] = lambda p, g: None,
          held: Callable[[bytes, int], bool] = lambda p, g: True) -> None:
    """Replay one flush onto ``files`` (extents are found later, by a ``Locator``).

    The rules of a segment's fold (docs/FORMAT.md, "Reading a file back"): a higher
    generation, or another one after a deletion, starts the file anew and the replaced
    entry goes to ``retire``; a size of a deleted generation revives it. ``mode_of``:
    (mode, mtime_ns) of a generation, where known; ``held``: whether any object holds the
    start of a generation (a revival of one no object holds, its tombstone expired,
    has no bytes to start a file with, and starts nothing).
    """
    for c in point.changes:
        if not wanted(c.path):
            continue
        cur = files.get(c.path)
        if c.size is None:
            if cur is not None and cur.gen == c.gen:
                cur.deleted_at = c.time
            continue
        if cur is None or c.gen > cur.gen or (cur.deleted_at is not None and c.gen != cur.gen):
            if c.size > 0 and not held(c.path, c.gen):
                continue  # (an empty file needs no bytes: packs hold none of it)
            if cur is not None:
                retire(cur)
            cur = files[c.path] = Entry(c.path, c.gen, 0)
        if c.gen < cur.gen:
            continue
        cur.deleted_at = None
        cur.size = c.size
        if (got := mode_of(c.path, c.gen)) is not None:
            cur.mode, cur.mtime_ns = got


def apply_catalog(point: Point, sessions: dict[bytes, Session], machine: str,
                  wanted: Callable[[bytes], bool] = lambda path: True) -> None:
    """The catalog fields one flush's new lines named (``Session.fold``'s rules)."""
    for path, gen, found in point.catalog:
        sid = session_of(path)
        if sid is None or not wanted(path):
            continue
        s = sessions.setdefault(path, Session(sid, machine, path))
        s.fold(gen, found)
        s.last_seq = point.seq


class Locator:
    """Where the bytes of each generation are: extents from any number of objects.

    Several objects may hold the same bytes cut differently (a segment and the delta
    that folded it, a pack and its rewrite); ``extents`` finds a chain of extents from
    byte 0, each starting where the one before ended, preferring what was added first.
    A ``Copy`` (bytes another generation holds) becomes parts of that generation's
    frames, once asked for, whatever order objects were added in.
    """

    def __init__(self) -> None:
        # (path, gen) -> start -> end -> (object key, extent)
        self._by: dict[tuple[bytes, int], dict[int, dict[int, tuple[str, Extent]]]] = {}
        self._furthest: dict[tuple[bytes, int], Extent] = {}
        self._copies: dict[tuple[bytes, int], list[Copy]] = {}
        # Of the generations with copies: the furthest one, and those with one at 0
        # (asked once per change of a point: a store may name thousands of copies).
        self._copy_far: dict[tuple[bytes, int], Copy] = {}
        self._copy_at0: set[tuple[bytes, int]] = set()
        # A copy's source, walked once: its chain and where each extent of it starts.
        self._walked: dict[tuple[bytes, int], tuple[list[int], list[tuple[str, Extent]]]] = {}
        self._parts = 0

    def add(self, key: str, x: Extent) -> None:
        k = (x.path, x.gen)
        ends = self._by.setdefault(k, {}).setdefault(x.start, {})
        ends.setdefault(x.end, (key, x))
        far = self._furthest.get(k)
        if far is None or far.end < x.end:
            self._furthest[k] = x
        if self._walked:
            self._walked.pop(k, None)

    def add_all(self, items: Iterable[tuple[str, Extent]]) -> None:
        for key, x in items:
            self.add(key, x)

    def add_copies(self, copies: Iterable[Copy]) -> None:
        for c in copies:
            if c.end > c.start:  # (a writer never copies nothing)
                k = (c.path, c.gen)
                self._copies.setdefault(k, []).append(c)
                far = self._copy_far.get(k)
                if far is None or far.stop < c.stop:
                    self._copy_far[k] = c
                if c.at == 0:
                    self._copy_at0.add(k)

    def holds(self, path: bytes, gen: int) -> bool:
        """Whether an object holds the start (byte 0) of a generation."""
        return 0 in self._by.get((path, gen), {}) or (path, gen) in self._copy_at0

    def mode_of(self, path: bytes, gen: int) -> tuple[int, int] | None:
        """(mode, mtime_ns) of a generation, from its furthest extent (None: unknown)."""
        x = self._furthest.get((path, gen))
        if x is not None:
            return x.mode, x.mtime_ns
        c = self._copy_far.get((path, gen))
        return None if c is None else (c.mode, c.mtime_ns)

    def extents(self, path: bytes, gen: int, size: int) -> list[tuple[str, Extent]]:
        """The extents holding bytes [0, ``size``) of a generation, or as far as they
        reach without a gap (an empty file or a revival: the extent at 0)."""
        if self._copies:
            self._resolve((path, gen))
        return self._chain(path, gen, size)

    def _resolve(self, top: tuple[bytes, int]) -> None:
        """Turn the copies of ``top`` into parts of frames, those of its sources first
        (depth first, without recursion: a chain of cuts may be long). A copy met again
        while its own source is being resolved (a cycle) finds no bytes: a gap."""
        todo: list[tuple[tuple[bytes, int], list[Copy] | None]] = [(top, None)]
        while todo:
            k, ready = todo.pop()
            if ready is not None:
                for c in ready:
                    self._place(c)
                continue
            copies = self._copies.pop(k, None)
            if copies is None:
                continue
            todo.append((k, copies))
            todo.extend(((c.src, c.src_gen), None) for c in copies)

    def _place(self, c: Copy) -> None:
        if self._parts >= PARTS_MAX:
            return
        k = (c.src, c.src_gen)
        walked = self._walked.get(k)
        if walked is None:
            # The source as far as it reaches (any chain holding [start, end) holds the
            # same bytes), once for all its copies.
            far = self._furthest.get(k)
            chain = self._chain(c.src, c.src_gen, 0 if far is None else far.end)
            walked = self._walked[k] = ([x.start for _, x in chain], chain)
        starts, chain = walked
        for key, x in chain[max(0, bisect.bisect_right(starts, c.start) - 1):]:
            if x.start >= c.end:
                break
            lo, hi = max(x.start, c.start), min(x.end, c.end)
            if lo >= hi:
                continue
            if self._parts >= PARTS_MAX:
                return
            self._parts += 1
            self.add(key, x.part(c.path, c.gen, lo, hi, c.at + lo - c.start))

    def _chain(self, path: bytes, gen: int, size: int) -> list[tuple[str, Extent]]:
        starts = self._by.get((path, gen), {})
        if 0 not in starts:
            return []
        if size == 0:
            ends = starts[0]
            return [ends[min(ends)]]
        # Breadth first over offsets: the fewest extents that reach ``size``.
        came: dict[int, tuple[int, tuple[str, Extent]]] = {}
        todo = [0]
        reached = 0
        for pos in todo:
            for end, item in starts.get(pos, {}).items():
                if end > pos and end not in came:
                    came[end] = (pos, item)
                    todo.append(end)
                    reached = max(reached, end)
                    if end >= size:
                        reached = end
                        break
            if reached >= size:
                break
        out: list[tuple[str, Extent]] = []
        pos = reached
        while pos > 0:
            pos, item = came[pos]
            out.append(item)
        out.reverse()
        return out

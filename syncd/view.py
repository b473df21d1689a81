"""One machine's backup as of a point in time: a snapshot manifest plus later segments.

The entry point is the newest snapshot at or before the time asked for; the segments
written after it are folded on top. Nothing here downloads file contents: only the
manifest's index and groups and the segments' indexes, which carry the extents,
tombstones and the session catalog. Without a snapshot every segment is folded.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from syncd.duration import format_time
from syncd.errors import BackupError, CryptoError, FormatError, NoBackup, StoreError
from syncd.format.catalog import Session, session_of
from syncd.format.delta import by_start, manifest_points
from syncd.format.points import Locator, Point, apply, apply_catalog, point_of
from syncd.format.segment import SegmentIndex
from syncd.format.snapshot import Entry, Group, Manifest, current, group_of, session_groups
from syncd.repository import Repository
from syncd.seen import Seen
from syncd.sibling import owner_of
from syncd.store import layout


@dataclass
class Backup:
    machine: str
    info: dict[str, Any]
    files: dict[bytes, Entry] = field(default_factory=dict)
    sessions: dict[bytes, Session] = field(default_factory=dict)
    projects: dict[str, dict[str, Any]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    first_time: float | None = None
    last_time: float | None = None
    last_seq: int | None = None
    # The point in time this view is: (seq, time) of the last flush it holds.
    point: tuple[int, float] | None = None

    def find_session(self, session_id: str) -> Session | None:
        """The session's transcript; of several (a session moved to another project
        folder: the old one deleted there), the one still there, last changed last."""
        found = [s for s in self.sessions.values() if s.session_id == session_id]
        return max(found, key=lambda s: (s.deleted_at is None, s.last_seq, s.path),
                   default=None)


def load_backup(repo: Repository, at: float | None = None,
                sessions: Collection[str] | None = None, seen: Seen | None = None) -> Backup:
    """The repository machine's backup as of ``at`` (None: now): the last flush at or
    before it (``Backup.point``).

    ``sessions``: only these sessions' files are needed (and history.jsonl), so only
    their groups of the snapshot are read. ``seen``: what this host saw of the store
    before; a backup that ends before that is reported (lost segments, a rollback).
    """
    machine = repo.machine
    errors = []
    try:
        info = repo.info()
    except (StoreError, CryptoError) as e:
        if repo.crypto is None and isinstance(e, CryptoError):
            raise  # a sealed store read without its key: nothing in it can be read
        # Its home is unknown (no home rule when remapping); the data may still restore.
        info = {"machine": machine}
        errors.append(str(e))
    b = Backup(machine, info, errors=errors)
    snaps = current(repo.snapshots())
    newest = repo.newest_manifest(b.errors) if snaps else None
    base = newest
    if newest is not None and at is not None and newest.time > at:
        base = _manifest_at(repo, snaps, newest.seq, at, b.errors)
    names: set[str] | None = None
    if sessions is not None:
        # (Without a manifest a session's files are known by its id alone.)
        names = set()
        for sid in sessions:
            for folder in () if newest is None else \
                    (base or newest).folders_of(sid) or newest.folders_of(sid):
                names |= session_groups(sid, folder)
            names |= session_groups(sid, "")
    wanted = _wanted(names, sessions)
    locator = Locator()
    if newest is not None:

        def lost(name: str, err: FormatError) -> None:
            # That group's files are missing from this view; the others are whole.
            b.errors.append(str(err))

        try:
            where = repo.read_groups(newest, names, lost)
            groups = where if base is newest or base is None else \
                repo.read_groups(base, names, lost)
        except (FormatError, StoreError) as e:
            raise BackupError(f"cannot read the snapshot: {e}") from e
        for g in where.values():
            for ent in g.entries:
                locator.add_all(ent.extents)
        if base is not None:
            _from_snapshot(b, base, groups, where, locator)
    deltas = repo.deltas()
    after = newest.seq if newest is not None else -1
    keys = repo.segments(after)
    if seen is not None and at is None:
        # The newest seq the store lists now, readable or not (the mark rises only with
        # what is read below).
        top = max([after] + [d[1] for d in deltas] + [layout.segment_seq(k) or 0
                                                      for k, _ in keys])
        problem = seen.check(machine, top if top >= 0 else None)
        if problem:
            if newest is None and not keys and not deltas:
                raise BackupError(problem)
            b.errors.append(problem)
        if newest is not None:
            seen.saw(machine, newest.seq)
    if newest is None and not keys and not deltas:
        if b.errors:  # there are manifests, and none of them reads
            raise BackupError(f"machine {machine!r} has no readable snapshot: {b.errors[0]}")
        known = repo.machines()
        raise NoBackup(f"{repo.url}: no backup for machine {machine!r} "
                       f"(machines in this store: {', '.join(known) or 'none'})")
    walk = _Walk(repo, b, at, locator, wanted, seen if at is None else None)
    walk.run(base.seq if base is not None else -1, after, deltas,
             [s for s in snaps if newest is not None and s[0] <= newest.seq], keys)
    if b.point is None and at is not None:
        first = walk.later if walk.later is not None else _first_time(repo, snaps)
        since = "" if first is None else f"; its first point in time is {format_time(first)}"
        raise NoBackup(f"machine {machine!r} has no backup at or before the requested time "
                       f"{format_time(at)}{since}")
    _finish(b, locator)
    return b


def _first_time(repo: Repository, snaps: list[tuple[int, int, str]]) -> float | None:
    """The time of the oldest readable manifest (None: none reads)."""
    for _, _, key in snaps:
        try:
            return repo.read_manifest(key).time
        except (FormatError, StoreError):
            continue
    return None


def _wanted(names: set[str] | None,
            sessions: Collection[str] | None) -> Callable[[bytes], bool]:
    # A session newer than the snapshot is in none of its groups: known by its id.
    ids = tuple(s.encode() for s in sessions or ())

    def wanted(path: bytes) -> bool:
        return names is None or group_of(path) in names or any(i in path for i in ids)

    return wanted


class _Walk:
    """From a manifest (or the beginning), forward flush by flush up to ``at``: deltas,
    the points of manifests built on them, and segments, each starting at the seq after
    the last one."""

    def __init__(self, repo: Repository, b: Backup, at: float | None, locator: Locator,
                 wanted: Callable[[bytes], bool], seen: Seen | None) -> None:
        self.repo, self.b, self.at, self.locator = repo, b, at, locator
        self.wanted, self.seen = wanted, seen
        self.cursor = -1
        self.stopped = False  # a point after ``at`` was met
        self.later: float | None = None  # the time of that point

    def _points(self, points: list[Point]) -> None:
        b = self.b
        for p in points:
            if p.seq <= self.cursor:
                continue
            if self.at is not None and p.time > self.at:
                self.stopped, self.later = True, p.time
                return
            apply(p, b.files, wanted=self.wanted, mode_of=self.locator.mode_of,
                  held=self.locator.holds)
            apply_catalog(p, b.sessions, b.machine, self.wanted)
            b.first_time = p.time if b.first_time is None else b.first_time
            b.last_time, b.last_seq, b.point = p.time, p.seq, (p.seq, p.time)
            self.cursor = p.seq

    def run(self, cursor: int, after: int, deltas: list[tuple[int, int, str, int]],
            manifests: list[tuple[int, int, str]], keys: list[tuple[str, int]]) -> None:
        """Walk from seq ``cursor``. Up to ``after`` (the newest manifest's seq) a step
        that is missing ends the walk: the points after it were thinned by retention.
        Past it, a missing seq is a loss: reported, and the walk goes on after it."""
        self.cursor = cursor
        by_lo = by_start(deltas)
        segs = {seq: (key, size) for key, size in keys
                if (seq := layout.segment_seq(key)) is not None}
        b = self.b
        while not self.stopped:
            nxt = self.cursor + 1
            if self._delta(by_lo.get(nxt, [])) or self._manifest(nxt, manifests, after) \
                    or self._segment(nxt, segs):
                continue
            if self.cursor < after:
                return
            starts = [lo for lo in by_lo if lo > nxt] + [s for s in segs if s > nxt]
            if not starts:
                return
            gap = min(starts)
            b.errors.append(f"{self.repo.where(layout.segment_key(b.machine, nxt))}: segments "
                            f"{nxt:016x}..{gap - 1:016x} are missing")
            self.cursor = gap - 1  # passed over: the files they changed show a gap

    def _delta(self, rows: list[tuple[int, int, str, int]]) -> bool:
        """The first delta of ``rows`` that reads, walked; False when none does."""
        for _, hi, key, size in rows:
            try:
                d = self.repo.read_delta(key, size)
            except (FormatError, StoreError) as e:
                self.b.errors.append(str(e))
                continue
            if d.index.machine != self.b.machine:
                self.b.errors.append(f"{self.repo.where(key)}: written by machine "
                                     f"{d.index.machine!r} (foreign or renamed object)")
                continue
            self._locate(key, d.index)
            self.b.projects.update(d.index.projects)
            self._points(d.points)
            if not self.stopped:
                self.cursor = hi
            if self.seen is not None:
                self.seen.saw(self.b.machine, hi)
            return True
        return False

    def _manifest(self, nxt: int, manifests: list[tuple[int, int, str]], after: int) -> bool:
        """The next manifest's own points, when they start at ``nxt``."""
        later = [s for s in manifests if s[0] > self.cursor]
        if not later or self.cursor >= after:
            return False
        try:
            m = self.repo.read_manifest(later[0][2])
            own = manifest_points(m)
        except (FormatError, StoreError) as e:
            self.b.errors.append(str(e))
            return False
        if own is None or own[0] != nxt:
            return False
        self._points(own[1])
        return True

    def _segment(self, seq: int, segs: dict[int, tuple[str, int]]) -> bool:
        got = segs.get(seq)
        if got is None:
            return False
        key, size = got
        try:
            ix = self.repo.read_index(key, size)
        except (FormatError, StoreError) as e:
            self.b.errors.append(str(e))
            self.cursor = seq  # passed over, as its writer does (docs/FORMAT.md): one line
            return True
        if (ix.machine, ix.seq) != (self.b.machine, seq):
            self.b.errors.append(f"{self.repo.where(key)}: index says machine {ix.machine!r} "
                                 f"seq {ix.seq}, not what its key says (foreign or renamed "
                                 "object)")
            self.cursor = seq
            return True
        if self.at is not None and ix.time > self.at:
            self.stopped, self.later = True, ix.time
            return True
        if self.seen is not None:
            self.seen.saw(self.b.machine, seq)
        self._locate(key, ix)
        self.b.projects.update(ix.projects)
        self._points([point_of(ix)])
        return True

    def _locate(self, key: str, ix: SegmentIndex) -> None:
        # Only the files the view is for: a view of some sessions (an import, a resume)
        # holds their extents, not those of every file the objects it walks name.
        self.locator.add_all((key, x) for x in ix.extents if self.wanted(x.path))
        self.locator.add_copies(c for c in ix.copies if self.wanted(c.path))


def _manifest_at(repo: Repository, snaps: list[tuple[int, int, str]], below: int, at: float,
                 errors: list[str]) -> Manifest | None:
    """The newest manifest below seq ``below`` built at or before ``at``.

    Times grow with seq, so a binary search reads about log2(n) indexes, not all newer
    ones. An unreadable manifest is skipped towards older ones.
    """
    cands = [s for s in snaps if s[0] < below]
    lo, hi = 0, len(cands) - 1
    best: Manifest | None = None
    while lo <= hi:
        mid = (lo + hi) // 2
        try:
            m = repo.read_manifest(cands[mid][2])
        except (FormatError, StoreError) as e:
            errors.append(str(e))
            del cands[mid]
            hi -= 1
            continue
        if m.time <= at:
            best, lo = m, mid + 1
        else:
            hi = mid - 1
    return best


def _from_snapshot(b: Backup, base: Manifest, groups: dict[str, Group],
                   where: dict[str, Group], locator: Locator) -> None:
    """The files of snapshot ``base``; their bytes are found through the newest one
    (``where``, already in ``locator``), or where ``base`` says when it does not hold them."""
    located = {(e.path, e.gen): e for g in where.values() for e in g.entries}
    for g in groups.values():
        for e in g.entries:
            if e.retained:
                continue
            src = located.get((e.path, e.gen))
            if src is None or src.end < e.size:
                src = e
                locator.add_all(e.extents)
            # ``size`` may be less than the extents hold: an older point in time.
            b.files[e.path] = Entry(e.path, e.gen, e.size, e.mode, e.mtime_ns, e.deleted_at,
                                    sids=src.sids)
        for s in g.sessions:
            b.sessions[s.path] = s
    b.projects.update(base.projects)
    b.first_time, b.last_time, b.last_seq = base.first_time, base.time, base.seq
    b.point = (base.seq, base.time)


def moved_away(files: Iterable[tuple[bytes, bool]]) -> set[bytes]:
    """Of (path, deleted) pairs, the deleted files of sessions whose transcript lives in
    another project folder: moved there (Claude's ``/cd`` and worktree moves), not lost.
    A session is in one folder: a restore never brings the old copy back beside it."""
    files = list(files)
    live = {sid: path.split(b"/")[1] for path, deleted in files
            if not deleted and (sid := session_of(path)) is not None}
    return {path for path, deleted in files
            if deleted and (sid := owner_of(path)) in live and
            path.split(b"/")[1] != live[sid]}


def _finish(b: Backup, locator: Locator) -> None:
    for path in moved_away((p, f.deleted_at is not None) for p, f in b.files.items()):
        del b.files[path]
    for f in b.files.values():
        f.extents = locator.extents(f.path, f.gen, f.size)
    # Every transcript is a session, whether or not its lines named a field yet.
    for path, f in b.files.items():
        sid = session_of(path)
        if sid is None:
            continue
        s = b.sessions.setdefault(path, Session(sid, b.machine, path))
        s.size, s.deleted_at = f.size, f.deleted_at
    for path in [p for p in b.sessions if p not in b.files]:
        del b.sessions[path]

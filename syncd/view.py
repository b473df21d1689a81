"""One machine's backup as of a point in time: a snapshot manifest plus later segments.

The entry point is the newest snapshot at or before the time asked for; the segments
written after it are folded on top. Nothing here downloads file contents: only the
manifest's index and groups and the segments' indexes, which carry the extents,
tombstones and the session catalog. Without a snapshot every segment is folded.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from syncd.errors import BackupError, CryptoError, FormatError, NoBackup, StoreError
from syncd.format.catalog import Session, session_of
from syncd.format.fold import fold_index
from syncd.format.segment import SegmentIndex
from syncd.format.snapshot import Entry, Group, Manifest, current, group_of, session_groups
from syncd.repository import Repository
from syncd.seen import Seen
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

    def find_session(self, session_id: str) -> Session | None:
        for s in self.sessions.values():
            if s.session_id == session_id:
                return s
        return None


def load_backup(repo: Repository, at: float | None = None,
                sessions: Collection[str] | None = None, seen: Seen | None = None) -> Backup:
    """The repository machine's backup as of ``at`` (None: now).

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
    if base is not None and newest is not None:
        if sessions is not None:
            names = set()
            for sid in sessions:
                for folder in base.folders_of(sid) or newest.folders_of(sid):
                    names |= session_groups(sid, folder)
                names |= session_groups(sid, "")
        def lost(name: str, err: FormatError) -> None:
            # That group's files are missing from this view; the others are whole.
            b.errors.append(str(err))

        try:
            groups = repo.read_groups(base, names, lost)
            where = groups if base is newest else repo.read_groups(newest, names, lost)
        except (FormatError, StoreError) as e:
            raise BackupError(f"cannot read the snapshot: {e}") from e
        _from_snapshot(b, base, groups, where)
    # Segments already folded into the newest snapshot are only leftovers of an
    # interrupted clean-up; an older snapshot takes none (what they held is gone).
    after = newest.seq if newest is not None else -1
    keys = repo.segments(after)
    if seen is not None and at is None:
        # The newest seq the store lists now, readable or not (the mark rises only with
        # what is read below).
        top = max([after] + [layout.segment_seq(k) or 0 for k, _ in keys])
        problem = seen.check(machine, top if top >= 0 else None)
        if problem:
            if newest is None and not keys:
                raise BackupError(problem)
            b.errors.append(problem)
        if newest is not None:
            seen.saw(machine, newest.seq)
    if newest is None and not keys:
        if b.errors:  # there are manifests, and none of them reads
            raise BackupError(f"machine {machine!r} has no readable snapshot: {b.errors[0]}")
        known = repo.machines()
        raise NoBackup(f"{repo.url}: no backup for machine {machine!r} "
                       f"(machines in this store: {', '.join(known) or 'none'})")
    expected = after + 1
    for key, size in keys if base is newest else []:
        seq = layout.segment_seq(key) or 0
        if seq != expected:
            b.errors.append(f"{repo.where(key)}: segments {expected:016x}..{seq - 1:016x} "
                            "are missing")
        expected = seq + 1
        try:
            ix = repo.read_index(key, size)
        except (FormatError, StoreError) as e:
            b.errors.append(str(e))
            continue
        if at is not None and ix.time > at:
            break
        b.first_time = ix.time if b.first_time is None else b.first_time
        b.last_time, b.last_seq = ix.time, seq
        if seen is not None and at is None and ix.seq == seq:
            seen.saw(machine, seq)
        _fold(b, key, ix, names, sessions)
    if b.first_time is None and at is not None:
        raise NoBackup(f"machine {machine!r} has no backup at or before the requested time")
    _finish(b)
    return b


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
                   where: dict[str, Group]) -> None:
    """The files of snapshot ``base``; their bytes are found through the newest one."""
    located = {(e.path, e.gen): e for g in where.values() for e in g.entries}
    for g in groups.values():
        for e in g.entries:
            if e.retained:
                continue
            src = located.get((e.path, e.gen))
            if src is None or src.end < e.size:
                src = e
            # ``size`` may be less than the extents hold: an older point in time.
            b.files[e.path] = Entry(e.path, e.gen, e.size, e.mode, e.mtime_ns, e.deleted_at,
                                    extents=list(src.extents), sids=src.sids)
        for s in g.sessions:
            b.sessions[s.path] = s
    b.projects.update(base.projects)
    b.first_time, b.last_time, b.last_seq = base.first_time, base.time, base.seq


def _fold(b: Backup, key: str, ix: SegmentIndex, names: set[str] | None = None,
          sessions: Collection[str] | None = None) -> None:
    # A session newer than the snapshot is in none of its groups: known by its id.
    ids = tuple(s.encode() for s in sessions or ())

    def wanted(path: bytes) -> bool:
        return names is None or group_of(path) in names or any(i in path for i in ids)

    fold_index(key, ix, b.files, b.sessions, b.projects, wanted=wanted)


def _finish(b: Backup) -> None:
    # Every transcript is a session, whether or not its lines named a field yet.
    for path, f in b.files.items():
        sid = session_of(path)
        if sid is None:
            continue
        s = b.sessions.setdefault(path, Session(sid, b.machine, path))
        s.size, s.deleted_at = f.size, f.deleted_at
    for path in [p for p in b.sessions if p not in b.files]:
        del b.sessions[path]

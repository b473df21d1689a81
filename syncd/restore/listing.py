"""What `syncd machines`, `syncd sessions` and `syncd resume` need: tables from the catalog."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from syncd.errors import (
    BackupError,
    CryptoError,
    FormatError,
    LookupFailed,
    NoBackup,
    NotFound,
    StoreError,
)
from syncd.format.catalog import Session, is_session_id, session_of
from syncd.format.head import HEAD_RAW_MAX, Head, HeadSession, HeadTooLarge
from syncd.format.points import apply, apply_catalog, point_of
from syncd.format.segment import SegmentIndex
from syncd.format.snapshot import Entry
from syncd.repository import Repository
from syncd.restore.sessionref import matching, one
from syncd.seen import Seen
from syncd.store import layout
from syncd.view import Backup, load_backup, moved_away
from syncd.worker import each

R = TypeVar("R")
# A head whose JSON is larger than this is read again by the calling thread, alone: the
# reading threads (and the results waiting their turn) each hold a few MiB at most, not
# a catalog of hundreds of thousands of sessions each.
SHARED_RAW_MAX = 1 << 20
# Segments after a machine's head a reader folds onto it: a busy machine's head lags up
# to head_interval (300 s: 75 flushes at one every 4 s). A head further behind is read
# past: its machine's backup is read instead.
AFTER_HEAD_MAX = 256


class _ReadAlone(Exception):
    """What a reading thread leaves to the calling one: a large head, a whole backup."""


def _each_machine(names: Iterable[str], fn: Callable[[str, int], R]
                  ) -> Iterator[tuple[str, R]]:
    """``(name, fn(name, raw_max))`` for each machine in order, read concurrently with
    small heads; a machine whose head is larger, or whose backup is read instead, is
    read here, one at a time."""
    def shared(name: str) -> R | None:
        try:
            return fn(name, SHARED_RAW_MAX)
        except _ReadAlone:
            return None

    for name, got in each(names, shared):
        yield name, fn(name, HEAD_RAW_MAX) if got is None else got


def machines_table(repo: Repository, seen: Seen | None = None
                   ) -> tuple[list[dict[str, Any]], list[str]]:
    """``machine_rows``, all of them, and one line per object that could not be read."""
    problems: list[str] = []
    return list(machine_rows(repo, seen, problems)), problems


def machine_rows(repo: Repository, seen: Seen | None = None,
                 problems: list[str] | None = None) -> Iterator[dict[str, Any]]:
    """One row per machine of ``repo``'s store, in name order; ``problems`` hears of each
    object that could not be read (that machine's row then lacks what it would have told).

    A machine's row is what its head says (one GET, the machines read concurrently); a
    machine without one (written by an older syncd), or whose head does not read, is
    listed from its objects as before.
    """
    said = problems if problems is not None else []
    for _, (row, lines) in _each_machine(repo.machines(),
                                         lambda m, most: _machine_row(repo, m, seen, most)):
        said += lines
        if row is not None:
            yield row


def _head_of(repo: Repository, raw_max: int, seen: Seen | None
             ) -> tuple[Head | None, list[str]]:
    """The machine's head with the segments written after it folded on, or None and why
    (its backup is then read: an older writer's machine has no head); ``_ReadAlone``
    beyond ``raw_max``; ``_RolledBack`` for a head older than one read here before
    (``seen``): its backup is read instead."""
    try:
        h = repo.head(raw_max)
    except HeadTooLarge:  # never at HEAD_RAW_MAX
        raise _ReadAlone() from None
    except (FormatError, StoreError) as e:
        return None, [f"{e} (its backup is read instead)"]
    if h is None:
        return None, []
    problem = None if seen is None or h.seq < 0 else seen.check_head(repo.machine, h.seq)
    if problem:
        # Older than one read here before (put back, or the store rolled back): it may
        # hide what came since, so the backup says what there is.
        raise _RolledBack(h, problem)
    after: list[str] = []  # what the segments after it had to say
    try:
        return _brought_up(repo, h, after, alone=raw_max >= HEAD_RAW_MAX), after
    except _Behind:  # the backup's reader says it all
        return None, []
    except StoreError as e:
        return None, [f"{e} (its backup is read instead)"]


class _RolledBack(Exception):
    """A head older than one read here before: the backup is read instead (the head
    only when there is no backup to read)."""

    def __init__(self, head: Head, problem: str) -> None:
        super().__init__(problem)
        self.head, self.problem = head, problem


class _Behind(Exception):
    """A head further behind its backup than a reader folds on: the backup is read."""


def _brought_up(m: Repository, h: Head, problems: list[str], alone: bool) -> Head:
    """``h`` with the segments its machine flushed after it folded on, as a reader of the
    backup folds them: a HEAD of the next segment's key, which an idle machine's head
    answers (a busy machine's head lags up to ``head_interval``: then an index read and
    a HEAD per segment since). A head ``AFTER_HEAD_MAX`` segments behind, or one whose
    next segments were compacted meanwhile, is ``_Behind``; a segment that does not
    read is a line and passed over, as a reader of the backup does."""
    segs: list[tuple[SegmentIndex, int]] = []
    seq = h.seq
    while (size := m.size_of(key := layout.segment_key(m.machine, seq + 1))) is not None:
        seq += 1
        if seq - h.seq > AFTER_HEAD_MAX:  # readable or not: planted ones cost requests too
            raise _Behind()
        try:
            ix = m.read_index(key, size) if alone else m.read_small_index(key, size)
        except NotFound:  # compacted since the HEAD: the backup has it
            raise _Behind() from None
        except FormatError as e:
            problems.append(str(e))
            continue
        if ix is None:  # a large index: read by the calling thread
            raise _ReadAlone()
        if (ix.machine, ix.seq) != (m.machine, seq):
            problems.append(f"{m.where(key)}: index says machine {ix.machine!r} seq "
                            f"{ix.seq}, not what its key says (foreign or renamed object)")
            continue
        segs.append((ix, size))
    return _folded(h, segs) if segs else h


def _folded(h: Head, segs: list[tuple[SegmentIndex, int]]) -> Head:
    """A head as if written after the segments ``segs`` (the rules of "Reading a file
    back" and of the catalog, as ``view`` applies them)."""
    files = {s.path: Entry(s.path, s.gen, s.size, deleted_at=s.deleted_at)
             for s in h.sessions}
    named = {s.path: Session(s.session_id, h.machine, s.path, s.named_by,
                             fields=dict(s.fields)) for s in h.sessions}
    # Where a generation starts: the head's (its bytes are in the backup) or a segment's.
    held = {(s.path, s.gen) for s in h.sessions} | {
        (x.path, x.gen) for ix, _ in segs for x in ix.extents if x.start == 0} | {
        (c.path, c.gen) for ix, _ in segs for c in ix.copies if c.at == 0}

    def transcript(path: bytes) -> bool:
        return session_of(path) is not None

    for ix, _ in segs:
        p = point_of(ix)
        apply(p, files, wanted=transcript, held=lambda path, gen: (path, gen) in held)
        apply_catalog(p, named, h.machine, transcript)
    sessions = []
    for path, e in files.items():
        s = named.get(path)
        sessions.append(HeadSession(path, e.gen, e.size, e.deleted_at,
                                    {} if s is None else s.fields,
                                    None if s is None or s.gen == e.gen else s.gen))
    n, stored = h.objects.get("seg", (0, 0))
    objects = {**h.objects, "seg": (n + len(segs), stored + sum(size for _, size in segs))}
    last = segs[-1][0]
    return Head(h.machine, h.written, last.seq, last.time, h.info, objects, sessions)


def _machine_row(repo: Repository, machine: str, seen: Seen | None, raw_max: int
                 ) -> tuple[dict[str, Any] | None, list[str]]:
    m = repo.for_machine(machine)
    try:
        h, problems = _head_of(m, raw_max, seen)
    except _RolledBack as e:
        h, problems = None, [f"{e.problem} (its backup is read instead)"]
    if h is None:
        try:
            row, more = _objects_row(m, seen)
        except StoreError as e:  # this machine's row stays, empty, with the reason
            row, more = {"machine": machine}, [str(e)]
        return row, problems + more

    def count(kind: str) -> int:
        return h.objects.get(kind, (0, 0))[0]

    return {"machine": machine, "hostname": h.info.get("hostname"), "home": h.info.get("home"),
            "os": h.info.get("os"), "segments": count("seg"), "packs": count("pack"),
            "snapshots": count("snap"), "deltas": count("delta"),
            "stored_bytes": sum(size for _, size in h.objects.values()),
            "last_backup": h.time, "sessions": sum(s.deleted_at is None for s in h.sessions),
            "as_of": h.written}, problems


def _objects_row(m: Repository, seen: Seen | None
                 ) -> tuple[dict[str, Any] | None, list[str]]:
    """A machine's row from its objects: one LIST of its prefix and an index read (None:
    it has no objects, a name some stores keep listing once emptied)."""
    machine = m.machine
    objects = m.objects()
    if not objects:
        return None, []
    problems = []
    try:
        info = m.info()
    except (StoreError, CryptoError) as e:
        info = {}
        problems.append(str(e))
    kinds = [layout.kind_of(o.key) for o in objects]
    keys = [(o.key, o.size) for o, kind in zip(objects, kinds, strict=True)
            if kind == "seg" and layout.segment_seq(o.key) is not None]
    snaps = [sid[0] for o in objects if (sid := layout.snapshot_id(o.key)) is not None
             and layout.kind_of(o.key) == "snap"]
    deltas = sorted((rng[1], o.key, o.size) for o in objects
                    if layout.kind_of(o.key) == "delta"
                    and (rng := layout.delta_range(o.key)) is not None)
    if seen is not None:
        seqs = [layout.segment_seq(k) or 0 for k, _ in keys] + snaps + \
            [d[0] for d in deltas]
        problem = seen.check(machine, max(seqs) if seqs else None)
        if problem:
            problems.append(problem)
    last: float | None = None
    try:
        if keys:
            ix = m.read_index(keys[-1][0], keys[-1][1])
            last = ix.time
            if seen is not None and ix.seq == layout.segment_seq(keys[-1][0]):
                seen.saw(machine, ix.seq)
        elif deltas and deltas[-1][0] > max(snaps, default=-1):
            d = m.read_delta(deltas[-1][1], deltas[-1][2])
            last = d.time
            if seen is not None:
                seen.saw(machine, d.hi)
        else:
            snap = m.newest_manifest(problems)
            last = None if snap is None else snap.time
            if seen is not None and snap is not None:
                seen.saw(machine, snap.seq)
    except (FormatError, StoreError) as e:
        problems.append(str(e))
    return {"machine": machine, "hostname": info.get("hostname"), "home": info.get("home"),
            "os": info.get("os"), "segments": len(keys), "packs": kinds.count("pack"),
            "snapshots": kinds.count("snap"), "deltas": len(deltas),
            "stored_bytes": sum(o.size for o in objects), "last_backup": last,
            "sessions": None, "as_of": None}, problems


def last_backups(repo: Repository, names: Iterable[str]
                 ) -> Iterator[tuple[str, float | None, bool]]:
    """``(machine, its last backup, whether its objects open with this store's key)`` for
    each machine in order, from its head (read concurrently as for the listings; no
    check of the segments after it: a lagging head's time is a little early). None: no
    head that reads, or nothing flushed yet. In an encrypted store a machine whose head
    does not read is asked for its ``machine.json`` (one more GET): one that is missing
    or does not open is no machine of this store's key; a plain store's are all True. A
    store that does not answer says nothing against a machine (None, True)."""
    def one(name: str, raw_max: int) -> tuple[float | None, bool]:
        m = repo.for_machine(name)
        try:
            h = m.head(raw_max)
        except HeadTooLarge:
            raise _ReadAlone() from None
        except StoreError:
            return None, True
        except FormatError:
            h = None
        if h is not None or repo.crypto is None:
            return (None if h is None else h.time), True
        try:
            # Its writer seals the key's fingerprint in: missing, the file is missing.
            return None, "key" in m.info()
        except CryptoError:
            return None, False
        except StoreError:  # not JSON once opened (so sealed with our key), or no answer
            return None, True

    for name, (t, opens) in _each_machine(names, one):
        yield name, t, opens


@dataclass(frozen=True)
class Here:
    """What this machine has of the store's sessions: the ids in its tree, and what
    follow imported (machine, path there) → (generation, size) of that copy."""

    ids: set[str] = field(default_factory=set)
    imported: Mapping[tuple[str, bytes], tuple[int, int]] = field(default_factory=dict)

    def mark(self, s: Session) -> str:
        """yes (here), no, imported (up to date with that machine's backup) or behind."""
        got = self.imported.get((s.machine, s.path))
        if got is not None and s.session_id in self.ids:
            return "imported" if got == (s.gen, s.size) else "behind"
        return "yes" if s.session_id in self.ids else "no"


def here(root: Path, imported: Mapping[tuple[str, bytes], tuple[int, int]] | None = None
         ) -> Here:
    try:
        # Only transcripts: what Claude set aside (<sid>.orphaned-….jsonl) is none.
        ids = {p.stem for p in (root / "projects").glob("*/*.jsonl") if is_session_id(p.stem)}
    except OSError:
        ids = set()
    return Here(ids, imported or {})


def _row(s: Session, local: Here) -> dict[str, Any]:
    return {"session_id": s.session_id, "machine": s.machine, "project": s.place,
            "title": s.title, "size": s.size, "last_activity": s.fields.get("last_activity"),
            "git_branch": s.fields.get("git_branch"), "deleted_locally_at": s.deleted_at,
            "local": s.session_id in local.ids, "here": local.mark(s)}


def load_all(repo: Repository, machine: str | None = None, at: float | None = None,
             seen: Seen | None = None) -> tuple[list[Backup], list[str]]:
    """Every machine's backup (or ``machine``'s), and one line per machine that could not
    be read: one damaged machine never hides the others."""
    names = [machine] if machine else repo.machines()
    out, problems = [], []
    for name in names:
        try:
            b = load_backup(repo.for_machine(name), at, seen=seen)
        except (BackupError, FormatError, StoreError, CryptoError) as e:
            if machine:
                raise
            if not isinstance(e, NoBackup):
                problems.append(str(e))
            continue
        out.append(b)
        problems += b.errors
    return out, problems


def sessions_table(backups: list[Backup], local: Here | Path,
                   project: str | None = None) -> list[dict[str, Any]]:
    """The rows of ``backups``' sessions (loaded whole, e.g. as of a point in time);
    ``local``: what is here, or the tree to look at."""
    local = local if isinstance(local, Here) else here(local)
    rows = [_row(s, local) for b in backups for s in b.sessions.values()
            if not project or _matches(s, b.info.get("home"), project)]
    rows.sort(key=lambda r: r["last_activity"] or "", reverse=True)
    return rows


def session_rows(repo: Repository, local: Here | Path, machine: str | None = None,
                 project: str | None = None, problems: list[str] | None = None,
                 seen: Seen | None = None) -> Iterator[dict[str, Any]]:
    """Every session of the store (or of ``machine``), machine by machine in name order,
    each machine's newest first: from each machine's head (read concurrently), or its
    backup when it has none. Memory holds a few machines' catalogs, whatever the store
    holds; ``problems`` hears of what could not be read."""
    said = problems if problems is not None else []
    local = local if isinstance(local, Here) else here(local)
    names = [machine] if machine else repo.machines()
    for _, (sessions, home, lines) in _each_machine(names, lambda m, most: _sessions_of(
            repo.for_machine(m), machine is not None, seen, most)):
        said += lines
        rows = [_row(s, local) for s in sessions if not project or _matches(s, home, project)]
        rows.sort(key=lambda r: r["last_activity"] or "", reverse=True)
        yield from rows


def machine_sessions(repo: Repository, names: Iterable[str], project: str | None = None,
                     problems: list[str] | None = None, seen: Seen | None = None
                     ) -> Iterator[tuple[str, list[Session]]]:
    """Each machine's sessions (of ``project`` only, as ``sessions --project`` finds
    them), in name order, as ``session_rows`` reads them: from the heads, read
    concurrently; ``problems`` hears of what could not be read."""
    said = problems if problems is not None else []
    for name, (sessions, home, lines) in _each_machine(names, lambda m, most: _sessions_of(
            repo.for_machine(m), False, seen, most)):
        said += lines
        yield name, [s for s in sessions if not project or _matches(s, home, project)]


def machine_catalogs(repo: Repository, names: Iterable[str],
                     convert: Callable[[str, list[Session]], R], seen: Seen | None = None
                     ) -> Iterator[tuple[str, R, list[str]]]:
    """``(machine, convert(machine, its sessions), what could not be read)`` for each of
    ``names`` in order, read as ``session_rows`` reads them (heads, concurrently);
    ``convert`` runs in the reading thread, so the results waiting their turn are what it
    makes (compact rows), not the machines' catalogs."""
    def one(name: str, raw_max: int) -> tuple[R, list[str]]:
        sessions, _, lines = _sessions_of(repo.for_machine(name), False, seen, raw_max)
        return convert(name, sessions), lines

    for name, (got, lines) in _each_machine(names, one):
        yield name, got, lines


def _sessions_of(m: Repository, strict: bool, seen: Seen | None, raw_max: int
                 ) -> tuple[list[Session], str | None, list[str]]:
    """A machine's sessions and home: its head's, or its backup's (``strict``: a backup
    that does not read raises; otherwise it is a line, and no sessions)."""
    rolled: Head | None = None
    try:
        h, problems = _head_of(m, raw_max, seen)
    except _RolledBack as e:
        h, rolled, problems = None, e.head, [f"{e.problem} (its backup is read instead)"]
    if h is not None:
        gone = moved_away((s.path, s.deleted_at is not None) for s in h.sessions)
        return [s.session(m.machine) for s in h.sessions if s.path not in gone], \
            h.info.get("home"), problems
    if raw_max < HEAD_RAW_MAX:  # a whole backup: as before heads, one at a time
        raise _ReadAlone()
    try:
        b = load_backup(m, seen=seen)
    except (BackupError, FormatError, StoreError, CryptoError) as e:
        if rolled is not None:  # no backup to read: what the head lists, said as such
            return [s.session(m.machine) for s in rolled.sessions], \
                rolled.info.get("home"), problems
        if strict:
            raise
        return [], None, problems + ([] if isinstance(e, NoBackup) else [str(e)])
    return list(b.sessions.values()), b.info.get("home"), problems + b.errors


def _matches(s: Session, home: str | None, project: str) -> bool:
    here = str(Path.home())
    candidates = list(s.places)
    for cwd in s.places:
        if home and (cwd == home or cwd.startswith(home + "/")):
            candidates.append(here + cwd[len(home):])
    want = os.path.normpath(os.path.expanduser(project))
    return any(c == want or c.startswith(want.rstrip("/") + "/") for c in candidates)


def find_session(repo: Repository, session_id: str, machine: str | None = None,
                 problems: list[str] | None = None, seen: Seen | None = None
                 ) -> tuple[str, str]:
    """``(machine, session id)`` of the one session ``session_id`` names (its id, or a
    prefix of 8 characters or more: ``sessionref``), from the machines' heads read
    concurrently (a machine without one: from its backup). ``LookupFailed`` when none
    has it or several machines do; ``AmbiguousSession`` when it names several
    sessions."""
    where, copies = locate_session(repo, session_id, machine, problems, seen)
    return where, copies[0].session_id


def locate_session(repo: Repository, session_id: str, machine: str | None = None,
                   problems: list[str] | None = None, seen: Seen | None = None
                   ) -> tuple[str, list[Session]]:
    """``find_session``, with the session as the machine lists it (twice when that
    machine holds it in two project folders)."""
    [(where, copies)] = _located(repo, [session_id], machine, problems, seen)
    return where, copies


def resolve_sessions(repo: Repository, refs: Iterable[str], problems: list[str] | None = None,
                     seen: Seen | None = None, at: float | None = None) -> tuple[str, ...]:
    """The ids of the sessions of ``repo``'s machine that ``refs`` name (``restore
    --session``): whole ids as they are (the restore says when its backup lacks one),
    prefixes resolved against its head (its backup when that lacks them), all at once;
    with ``at``, against its backup as of then (what that restore reads)."""
    refs = list(refs)
    short = [r for r in refs if not is_session_id(r)]
    if short and at is not None:
        try:
            then = list(load_backup(repo, at=at, seen=seen).sessions.values())
        except NoBackup:
            then = []
        named = {r: one(r, _known(r, matching(r, ((repo.machine, s) for s in then)),
                                  repo.machine), True) for r in short}
        return tuple(dict.fromkeys(named.get(r, r.lower()) for r in refs))
    found = dict(zip(short, _located(repo, short, repo.machine, problems, seen),
                     strict=True)) if short else {}
    return tuple(dict.fromkeys(
        found[r][1][0].session_id if r in found else r.lower() for r in refs))


def _known(ref: str, found: list[tuple[str, Session]], machine: str) -> list[tuple[str, Session]]:
    """``found``, or the line that says ``ref`` names no session of ``machine``."""
    if not found:
        raise LookupFailed(f"session {ref} is not in machine {machine!r}'s backup at that time")
    return found


def _located(repo: Repository, refs: list[str], machine: str | None,
             problems: list[str] | None, seen: Seen | None
             ) -> list[tuple[str, list[Session]]]:
    """For each of ``refs``, the machine of the one session it names and that session as
    the machine lists it (see ``find_session``), the machines read once for all."""
    said = problems if problems is not None else []
    names = [machine] if machine else repo.machines()
    found: dict[str, list[tuple[str, Session]]] = {r: [] for r in refs}
    for name, (sessions, _, lines) in _each_machine(names, lambda m, most: _sessions_of(
            repo.for_machine(m), machine is not None, seen, most)):
        said += lines
        for r in refs:
            found[r] += matching(r, ((name, s) for s in sessions))
    if machine is not None and not all(found.values()):
        # Its head may lag (a session made minutes ago whose head write failed): one
        # machine's backup is cheap to ask.
        try:
            b = load_backup(repo.for_machine(machine), seen=seen)
        except NoBackup:
            pass
        else:
            for r in refs:
                if not found[r]:
                    found[r] = matching(r, ((machine, s) for s in b.sessions.values()))
    out = []
    for r in refs:
        if not found[r]:
            where = ", ".join(names[:10]) + (f" and {len(names) - 10} more"
                                             if len(names) > 10 else "") \
                if names else "no machines"
            late = "" if machine or not names else "; a session begun in the last few " \
                "minutes may not be listed yet: name its machine with --machine"
            raise LookupFailed(f"session {r} is in no backup ({where}){late}")
        sid = one(r, found[r], machine is not None)
        copies = [(m, s) for m, s in found[r] if s.session_id == sid]
        out.append((copies[0][0], [s for _, s in copies]))
    return out

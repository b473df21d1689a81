"""What `syncd machines`, `syncd sessions` and `syncd resume` need: tables from the catalog."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from syncd.errors import BackupError, CryptoError, FormatError, LookupFailed, NoBackup, StoreError
from syncd.format.catalog import Session
from syncd.repository import Repository
from syncd.seen import Seen
from syncd.store import layout
from syncd.view import Backup, load_backup


def machines_table(repo: Repository, seen: Seen | None = None
                   ) -> tuple[list[dict[str, Any]], list[str]]:
    """One row per machine of ``repo``'s store, and one line per object that could not be
    read (that machine's row then lacks what it would have told)."""
    rows, problems = [], []
    for machine in repo.machines():
        m = repo.for_machine(machine)
        try:
            info = m.info()
        except (StoreError, CryptoError) as e:
            info = {}
            problems.append(str(e))
        objects = m.objects()
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
        rows.append({"machine": machine, "hostname": info.get("hostname"),
                     "home": info.get("home"), "os": info.get("os"),
                     "segments": len(keys), "packs": kinds.count("pack"),
                     "snapshots": kinds.count("snap"), "deltas": len(deltas),
                     "stored_bytes": sum(o.size for o in objects),
                     "last_backup": last})
    return rows, problems


def _local_sessions(root: Path) -> set[str]:
    try:
        return {p.stem for p in (root / "projects").glob("*/*.jsonl")}
    except OSError:
        return set()


def _row(s: Session, local: set[str]) -> dict[str, Any]:
    return {"session_id": s.session_id, "machine": s.machine, "project": s.project,
            "title": s.title, "size": s.size, "last_activity": s.fields.get("last_activity"),
            "git_branch": s.fields.get("git_branch"), "deleted_locally_at": s.deleted_at,
            "local": s.session_id in local}


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


def sessions_table(backups: list[Backup], local_root: Path,
                   project: str | None = None) -> list[dict[str, Any]]:
    local = _local_sessions(local_root)
    rows = []
    for b in backups:
        for s in b.sessions.values():
            if project and not _matches(s, b, project):
                continue
            rows.append(_row(s, local))
    rows.sort(key=lambda r: r["last_activity"] or "", reverse=True)
    return rows


def _matches(s: Session, b: Backup, project: str) -> bool:
    cwd = s.project or ""
    home = str(b.info.get("home") or "")
    here = str(Path.home())
    candidates = [cwd]
    if home and (cwd == home or cwd.startswith(home + "/")):
        candidates.append(here + cwd[len(home):])
    want = os.path.normpath(os.path.expanduser(project))
    return any(c == want or c.startswith(want.rstrip("/") + "/") for c in candidates)


def find_session(backups: list[Backup], session_id: str) -> tuple[Backup, Session]:
    found = [(b, s) for b in backups for s in b.sessions.values()
             if s.session_id == session_id or (s.session_id.startswith(session_id)
             and len(session_id) >= 8)]
    if not found:
        where = ", ".join(b.machine for b in backups) or "no machines"
        raise LookupFailed(f"session {session_id} is in no backup ({where})")
    ids = {s.session_id for _, s in found}
    if len(ids) > 1:
        raise LookupFailed(f"{session_id} matches several sessions: {', '.join(sorted(ids))}")
    if len(found) > 1:
        listing = ", ".join(f"{b.machine} (last activity {s.fields.get('last_activity', '?')})"
                            for b, s in found)
        raise LookupFailed(f"session {session_id} is in several machines' backups: {listing}; "
                           "pick one with --machine")
    return found[0]

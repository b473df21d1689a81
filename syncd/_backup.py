"""One machine's backup as of a point in time, folded from its segment indexes.

Nothing here downloads file contents: only the indexes (one suffix GET each),
which carry the extents, tombstones and the session catalog.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from . import _layout as layout
from ._catalog import Session, session_of
from ._crypto import Crypto, CryptoError, is_box
from ._segment import Extent, FormatError, SegmentIndex
from ._segreader import read_index
from .store import NotFound, Store, StoreError


class BackupError(Exception):
    """The backup asked for does not exist (or not at that time)."""


@dataclass
class FileView:
    """The newest generation of one file: its extents in byte order."""

    path: bytes
    gen: int
    extents: list[tuple[str, Extent]] = field(default_factory=list)
    deleted_at: float | None = None
    mode: int = 0o600
    mtime_ns: int = 0

    @property
    def size(self) -> int:
        return self.extents[-1][1].end if self.extents else 0

    @property
    def stored(self) -> int:
        return sum(e.clen for _, e in self.extents)


@dataclass
class Backup:
    machine: str
    info: dict[str, Any]
    files: dict[bytes, FileView] = field(default_factory=dict)
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


def list_machines(store: Store) -> list[str]:
    return sorted({o.key.split("/")[1] for o in store.list("machines/")
                   if o.key.count("/") >= 2})


def machine_info(store: Store, machine: str, crypto: Crypto | None = None) -> dict[str, Any]:
    """What ``machine.json`` says (opened first in an encrypted store)."""
    key = layout.machine_key(machine)
    where = f"{store.url}{key}"
    try:
        raw = store.get(key)
    except NotFound:
        return {"machine": machine}
    if crypto is not None:
        raw = crypto.open_box(key, "machine.json", raw, where)
    elif is_box(raw):
        raise CryptoError(f"{where}: encrypted, but no key is loaded (the store has no keys/, "
                          "or it was removed)")
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise StoreError(f"{where}: not JSON: {e}") from e
    return doc if isinstance(doc, dict) else {"machine": machine}


def segment_keys(store: Store, machine: str) -> list[tuple[str, int]]:
    out = []
    for info in store.list(layout.machine_prefix(machine) + "seg/"):
        if layout.segment_seq(info.key) is not None:
            out.append((info.key, info.size))
    return out


def load_backup(store: Store, machine: str, at: float | None = None,
                crypto: Crypto | None = None) -> Backup:
    """Fold ``machine``'s segments (those built at or before ``at``) into a Backup.

    ``crypto``: the unlocked key of an encrypted store (None: a plain store).
    """
    keys = segment_keys(store, machine)
    if not keys:
        known = list_machines(store)
        raise BackupError(f"{store.url}: no backup for machine {machine!r} "
                          f"(machines in this store: {', '.join(known) or 'none'})")
    b = Backup(machine, machine_info(store, machine, crypto))
    expected = 0
    for key, size in keys:
        seq = layout.segment_seq(key) or 0
        if seq != expected:
            b.errors.append(f"{store.url}{key}: segments {expected:016x}..{seq - 1:016x} "
                            "are missing")
        expected = seq + 1
        try:
            ix = read_index(store, key, size, crypto)
        except (FormatError, StoreError) as e:
            b.errors.append(str(e))
            continue
        if at is not None and ix.time > at:
            break
        b.first_time = ix.time if b.first_time is None else b.first_time
        b.last_time, b.last_seq = ix.time, seq
        _fold(b, key, ix)
    if b.first_time is None and at is not None:
        raise BackupError(f"machine {machine!r} has no backup at or before the requested time")
    _finish(b)
    return b


def _fold(b: Backup, key: str, ix: SegmentIndex) -> None:
    files = b.files
    for e in ix.extents:
        f = files.get(e.path)
        if f is None or e.gen > f.gen or (f.deleted_at is not None and e.gen != f.gen):
            f = files[e.path] = FileView(e.path, e.gen)
        if e.gen < f.gen:
            continue
        f.extents.append((key, e))
        f.mode, f.mtime_ns = e.mode, e.mtime_ns
    for t in ix.tombstones:
        f = files.get(t.path)
        if f is not None and f.gen == t.gen:
            f.deleted_at = t.time
    for path, (gen, found) in ix.sessions.items():
        sid = session_of(path)
        if sid is None:
            continue
        s = b.sessions.get(path)
        if s is None:
            s = b.sessions[path] = Session(sid, b.machine, path)
        s.fold(gen, found)
        s.last_seq = ix.seq
    b.projects.update(ix.projects)


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

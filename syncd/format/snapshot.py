"""Snapshot manifests: every file of a machine's backup as of one seq, and where its bytes lie.

A manifest is a segment container (docs/FORMAT.md) whose frames hold JSON *groups*: one
per project folder, one per ``file-history/<sid>`` and ``tasks/<sid>``, one per other
top-level directory, and ``.`` for top-level files. Restoring one session reads the
index and the few groups that session lives in, not the whole manifest.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from syncd import untrusted
from syncd.errors import FormatError
from syncd.format.catalog import FIELD_MAX, Session, session_of
from syncd.format.segment import (
    FRAME_MAX,
    Extent,
    SegmentIndex,
    SegmentWriter,
    decode_path,
    encode_path,
    expansion_limit,
    when,
)
from syncd.security.crypto import ObjectCipher
from syncd.store import layout

KIND = "snapshot"
HISTORY = b"history.jsonl"
ROOT_GROUP = "."
_PER_SESSION = (b"projects", b"file-history", b"tasks")
_GROUP_PREFIX = b"g/"
# Session ids are listed in the index by this many leading hex digits: enough to find a
# session's group, small enough that the index stays a few kB with thousands of sessions.
SID_PREFIX = 8
# A reader's limit on one group's JSON (docs/FORMAT.md): ~800 000 files in one folder. A
# writer refuses to write a bigger one (readers could not read it).
GROUP_MAX = 256 << 20
_HEX64 = re.compile(r"[0-9a-f]{64}")
_HISTORY_SID = re.compile(rb'"sessionId"\s*:\s*"([^"]{1,100})"')


def sid_prefix(session_id: str) -> str:
    return session_id[:SID_PREFIX].ljust(SID_PREFIX, "-")


def history_sids(raw: bytes) -> str | None:
    """The session-id prefixes of history.jsonl lines in ``raw`` (None: not whole lines,
    so a reader must always fetch it)."""
    if not raw.endswith(b"\n"):
        return None
    ids = {sid_prefix(m.group(1).decode(errors="replace")) for m in _HISTORY_SID.finditer(raw)}
    return "".join(sorted(ids))


def has_sid(ids: str, session_id: str) -> bool:
    want = sid_prefix(session_id)
    return any(ids[i : i + SID_PREFIX] == want for i in range(0, len(ids), SID_PREFIX))


def group_of(path: bytes) -> str:
    parts = path.split(b"/", 2)
    if len(parts) == 3 and parts[0] in _PER_SESSION:
        return os.fsdecode(parts[0] + b"/" + parts[1])
    return os.fsdecode(parts[0]) if len(parts) > 1 else ROOT_GROUP


def session_groups(session_id: str, folder: str) -> set[str]:
    """Every group a session's files can be in (its folder found through the index)."""
    return {folder, "todos", f"file-history/{session_id}", f"tasks/{session_id}", ROOT_GROUP}


@dataclass
class Entry:
    """One generation of one file: its size in this snapshot and where its bytes are."""

    path: bytes
    gen: int
    size: int
    mode: int = 0o600
    mtime_ns: int = 0
    deleted_at: float | None = None
    # A generation no longer in the tree that an older kept snapshot still needs.
    retained: bool = False
    extents: list[tuple[str, Extent]] = field(default_factory=list)
    # history.jsonl: the session-id prefixes of the lines in each packed extent, by
    # (object key, offset), so one session's restore fetches only the frames it needs.
    sids: dict[tuple[str, int], str] = field(default_factory=dict)
    # Restore: only some extents are wanted (one session's history lines), the rest
    # are holes; not a whole file.
    sparse: bool = False

    @property
    def end(self) -> int:
        return self.extents[-1][1].end if self.extents else 0

    @property
    def stored(self) -> int:
        """Stored bytes of the extents that hold its first ``size`` bytes."""
        return sum(x.clen for _, x in self.extents if x.start < self.size or x.start == 0)


@dataclass
class Group:
    entries: list[Entry] = field(default_factory=list)
    sessions: list[Session] = field(default_factory=list)


@dataclass
class Manifest:
    key: str
    machine: str
    seq: int
    rev: int
    time: float
    first_time: float
    objects: list[str] = field(default_factory=list)
    # Group name → the manifest's own extents holding its JSON.
    groups: dict[str, list[Extent]] = field(default_factory=dict)
    sids: dict[str, str] = field(default_factory=dict)
    projects: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The points of the segments it folded itself ("lo", "paths", "points"), undecoded:
    # format/delta.py reads them.
    chain: dict[str, Any] = field(default_factory=dict)

    def folders_of(self, session_id: str) -> list[str]:
        """Groups whose sessions include one starting like ``session_id``."""
        return [g for g, ids in self.sids.items() if has_sid(ids, session_id)]


def build(machine: str, seq: int, rev: int, time: float, first_time: float,
          entries: Iterable[Entry], sessions: Iterable[Session],
          projects: dict[str, dict[str, Any]], *, level: int = 3,
          cipher: ObjectCipher | None = None, chain: dict[str, Any] | None = None) -> bytes:
    groups: dict[str, Group] = {}
    objects: dict[str, int] = {}
    for e in entries:
        groups.setdefault(group_of(e.path), Group()).entries.append(e)
        for key, _ in e.extents:
            objects.setdefault(key, len(objects))
    for s in sessions:
        groups.setdefault(group_of(s.path), Group()).sessions.append(s)
    w = SegmentWriter(machine, seq, time, level=level, cipher=cipher, index_level=level)
    sids: dict[str, str] = {}
    for name in sorted(groups):
        g = groups[name]
        doc = {"files": [_entry_doc(e, objects) for e in g.entries],
               "sessions": [{**encode_path(s.path), "gen": s.gen, "last_seq": s.last_seq,
                             "fields": s.fields} for s in g.sessions]}
        ids = "".join(sid_prefix(s.session_id) for s in g.sessions)
        if ids:
            sids[name] = ids
        raw = json.dumps(doc, separators=(",", ":")).encode()
        if len(raw) > GROUP_MAX:
            # Readers would refuse it: better no snapshot than one that cannot be read.
            raise FormatError(f"group {name!r} would hold {len(raw)} bytes, more than the "
                              f"{GROUP_MAX} a reader accepts")
        path = _GROUP_PREFIX + os.fsencode(name)
        for start in range(0, max(len(raw), 1), FRAME_MAX):
            w.add_data(path, 0, start, raw[start : start + FRAME_MAX], mode=0, mtime_ns=0)
    w.index.projects = projects
    w.index.extra = {"kind": KIND, "rev": rev, "first_time": first_time,
                     "objects": list(objects), "sids": sids, **(chain or {})}
    return w.finish()


def _entry_doc(e: Entry, objects: dict[str, int]) -> dict[str, Any]:
    d: dict[str, Any] = {**encode_path(e.path), "gen": e.gen, "size": e.size, "mode": e.mode,
                         "mtime_ns": e.mtime_ns,
                         "x": [[objects[k], x.off, x.clen, x.start, x.end, x.sha256,
                                *([x.dict_id] if x.dict_id else [])]
                               for k, x in e.extents]}
    if e.deleted_at is not None:
        d["deleted_at"] = e.deleted_at
    if e.retained:
        d["retained"] = True
    if e.sids:
        d["sids"] = [e.sids.get((k, x.off)) for k, x in e.extents]
    if any(x.frame for _, x in e.extents):
        # Parts of frames (bytes shared with another generation): parallel to ``x``.
        d["parts"] = [[x.skip, x.frame] if x.frame else None for _, x in e.extents]
    return d


def manifest_of(key: str, ix: SegmentIndex, where: str) -> Manifest:
    """The manifest whose index is ``ix``: which groups, objects and sessions it holds."""
    x = ix.extra
    if x.get("kind") != KIND:
        raise FormatError(f"{where}: not a snapshot manifest")
    try:
        m = Manifest(key, ix.machine, ix.seq, int(x["rev"]), ix.time, when(x["first_time"]),
                     [str(k) for k in x["objects"]], sids={str(k): str(v) for k, v in
                                                           x.get("sids", {}).items()},
                     projects=ix.projects,
                     chain={k: x[k] for k in ("lo", "paths", "points") if k in x})
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise FormatError(f"{where}: unreadable manifest index: {e}") from e
    if layout.snapshot_id(key) != (m.seq, m.rev):
        raise FormatError(f"{where}: manifest says seq {m.seq} rev {m.rev}, "
                          "which is not its key (renamed object)")
    for ext in ix.extents:
        if not ext.path.startswith(_GROUP_PREFIX):
            raise FormatError(f"{where}: unexpected entry {ext.path!r} in a manifest")
        m.groups.setdefault(os.fsdecode(ext.path[len(_GROUP_PREFIX):]), []).append(ext)
    return m


def group_path(name: str) -> bytes:
    """The path under which a group's frames are stored in its manifest."""
    return _GROUP_PREFIX + os.fsencode(name)


def oversize(m: Manifest, name: str, where: str) -> FormatError | None:
    """Why group ``name`` of ``m`` is refused unread (None: it is within the limits: at
    most GROUP_MAX, and no more than its stored bytes can expand to)."""
    size = sum(e.end - e.start for e in m.groups[name])
    limit = expansion_limit(sum(e.clen for e in m.groups[name]), GROUP_MAX)
    if size <= limit:
        return None
    return FormatError(f"{where}: group {name!r} claims {size} bytes, more than the "
                       f"{limit} a reader accepts for it (refusing it)")


def parse_group(text: bytes, m: Manifest, name: str, where: str) -> Group:
    """Group ``name`` of ``m`` from its JSON."""
    try:
        return _group(untrusted.loads(text), m, where)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as e:
        raise FormatError(f"{where}: unreadable group {name!r}: {e}") from e


def _group(doc: dict[str, Any], m: Manifest, where: str) -> Group:
    g = Group()
    for d in doc["files"]:
        path = decode_path(d)
        e = Entry(path, int(d["gen"]), int(d["size"]), int(d["mode"]), int(d["mtime_ns"]),
                  None if d.get("deleted_at") is None else float(d["deleted_at"]),
                  bool(d.get("retained", False)))
        for obj, off, clen, start, end, sha, *rest in d["x"]:
            if not 0 <= int(obj) < len(m.objects):  # -1 would name another object
                raise IndexError(f"object {obj} of {len(m.objects)}")
            dict_id = _dict_id(rest)
            e.extents.append((m.objects[int(obj)], Extent(
                path, e.gen, int(start), int(end), int(off), int(clen), str(sha), e.mode,
                e.mtime_ns, dict_id=dict_id)))
        parts = d.get("parts")
        if parts is not None:
            if len(parts) != len(e.extents):
                raise ValueError(f"{len(parts)} parts for {len(e.extents)} extents")
            e.extents = [(k, x if p is None else replace(x, skip=_whole(p[0]),
                                                           frame=_whole(p[1])))
                         for (k, x), p in zip(e.extents, parts, strict=True)]
        for (key, x), ids in zip(e.extents, d.get("sids") or [], strict=False):
            if ids is not None:
                e.sids[(key, x.off)] = str(ids)
        g.entries.append(e)
    for d in doc["sessions"]:
        path = decode_path(d)
        sid = session_of(path)
        if sid is None:
            continue  # not a session (its name is no session id): nothing to list
        g.sessions.append(Session(sid, m.machine, path, int(d["gen"]), last_seq=int(d["last_seq"]),
                                  fields={str(k): str(v)[:FIELD_MAX]
                                          for k, v in d["fields"].items()}))
    return g


def _whole(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"not a whole number: {v!r}")
    return v


def _dict_id(rest: list[Any]) -> str | None:
    """The 7th element of an extent: the trained dictionary its frame needs (a frame of a
    delta; packs use none), as its sha256 hex."""
    if not rest:
        return None
    if len(rest) > 1 or not isinstance(rest[0], str) or not _HEX64.fullmatch(rest[0]):
        raise ValueError(f"not a dictionary id: {rest!r}")
    return rest[0]


def current(snaps: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """The newest rev of each seq (older revs are superseded and wait for deletion)."""
    best: dict[int, tuple[int, int, str]] = {}
    for s in snaps:
        best[s[0]] = max(best.get(s[0], s), s)
    return [best[k] for k in sorted(best)]

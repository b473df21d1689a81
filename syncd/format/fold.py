"""Folding segment indexes, in seq order, into files and the session catalog: what a
restore reads and what compaction writes into the next snapshot."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from syncd.format.catalog import Session, session_of
from syncd.format.segment import SegmentIndex
from syncd.format.snapshot import Entry


def fold_index(key: str, ix: SegmentIndex, files: dict[bytes, Entry],
               sessions: dict[bytes, Session], projects: dict[str, dict[str, Any]], *,
               retire: Callable[[Entry], None] = lambda e: None,
               wanted: Callable[[bytes], bool] = lambda path: True) -> None:
    """Apply segment ``key`` (its index ``ix``) on top of ``files``.

    A higher generation (or any other one after a deletion) starts a file anew; the
    replaced entry goes to ``retire``; an extent of the deleted generation itself
    revives it. Only paths ``wanted`` are folded.
    """
    for x in ix.extents:
        if not wanted(x.path):
            continue
        cur = files.get(x.path)
        if cur is None or x.gen > cur.gen or (cur.deleted_at is not None and x.gen != cur.gen):
            if x.start == x.end > 0:
                # A revival of a generation this view no longer holds (its tombstone
                # expired): it has no bytes to start a file with.
                continue
            if cur is not None:
                retire(cur)
            cur = files[x.path] = Entry(x.path, x.gen, 0)
        if x.gen < cur.gen:
            continue
        # An extent of a deleted generation brings it back: a restore put its bytes back
        # and the writer shipped nothing again (FORMAT.md, "revived").
        cur.deleted_at = None
        cur.extents.append((key, x))
        cur.size, cur.mode, cur.mtime_ns = x.end, x.mode, x.mtime_ns
    for t in ix.tombstones:
        cur = files.get(t.path)
        if cur is not None and cur.gen == t.gen:
            cur.deleted_at = t.time
    for path, (gen, found) in ix.sessions.items():
        sid = session_of(path)
        if sid is None:
            continue
        s = sessions.setdefault(path, Session(sid, ix.machine, path))
        s.fold(gen, found)
        s.last_seq = ix.seq
    projects.update(ix.projects)

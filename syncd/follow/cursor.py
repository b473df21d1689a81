"""How far this machine has followed each other machine: the cursors the follower keeps
in the state, read back by ``syncd status`` too (which needs nothing else of follow)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from syncd.backup.state import State

# The state's meta key holding every followed machine's cursor.
META = "follow"


@dataclass
class Cursor:
    """How far this machine has followed another one."""

    seq: int | None = None  # its last segment read (None: never imported)
    last_import: float | None = None  # when a file was last written from it
    last_check: float | None = None
    imported: int = 0  # sessions written from it so far
    waiting: list[str] = field(default_factory=list)  # sessions left until quiet
    conflicts: list[str] = field(default_factory=list)  # conflict copies' paths
    # The last poll's failure, if any; else an object of that machine refused while it
    # stands (a segment it still lists, a conflict copy its last import could not save).
    problem: str | None = None
    # A first look that failed: polls since (it is looked at again every HEAD_EVERY).
    misses: int = 0
    # Sessions an import could not bring (their bytes not fetched), the newest last: tried
    # again at the next poll, then after 2, 4 … more.
    retry: list[str] = field(default_factory=list)
    # Sessions its head lists that are missing here or behind (None: not reconciled yet).
    missing: int | None = None
    # The etag of its head when this machine was last reconciled with it.
    head_etag: str = ""
    # Sessions imported into a folder whose project path does not exist on this machine
    # (there was no local copy to go with): listed, never moved.
    elsewhere: list[str] = field(default_factory=list)
    # The flush time of its segment ``seq`` (None: not known).
    seq_time: float | None = None
    # Per session read from it but not here yet (``waiting``, ``retry``): the flush time
    # of its oldest change not imported (what the lag is measured from).
    since: dict[str, float] = field(default_factory=dict)
    # Sessions its tombstones forgot here whose local files (as its imports left them)
    # wait to be removed until they are quiet.
    forgetting: list[str] = field(default_factory=list)
    # Sessions forgotten here on its tombstones (the newest): a tombstone its head still
    # lists does not forget again one the user lifted here since.
    honoured: list[str] = field(default_factory=list)


def cursors(state: State) -> dict[str, Cursor]:
    """Every followed machine's cursor as the state holds it."""
    try:
        doc = json.loads(state.meta(META) or "{}")
    except ValueError:
        return {}
    out = {}
    for machine, c in doc.items() if isinstance(doc, dict) else ():
        try:
            cur = Cursor(**c)
        except TypeError:
            continue  # written by another version: started over
        if sound(cur):  # else damaged: started over too
            out[str(machine)] = cur
    return out


def lag(c: Cursor, now: float) -> float | None:
    """How long the oldest change read from that machine and not here yet has waited, as
    of ``now``: 0 when every change it read is here (up to date as of ``last_check``),
    None when it was never read."""
    if c.seq is None and not c.since:
        return None
    oldest = min(c.since.values(), default=None)
    return 0.0 if oldest is None else max(0.0, now - oldest)


def waited(c: Cursor, seen: dict[str, float], fallback: float) -> None:
    """Keep ``since`` to the sessions that wait now: those new to it since ``seen`` (the
    flush time of the first segment this poll read naming each), else ``fallback``."""
    pending = set(c.waiting) | set(c.retry)
    c.since = {s: t for s, t in c.since.items() if s in pending}
    for sid in pending - c.since.keys():
        c.since[sid] = seen.get(sid, fallback)


def sound(c: Cursor) -> bool:
    """Whether every field of a cursor read back from the state has its type."""
    names = (c.waiting, c.conflicts, c.retry, c.elsewhere, c.forgetting, c.honoured)
    return (c.seq is None or type(c.seq) is int) and type(c.imported) is int and \
        (c.missing is None or type(c.missing) is int) and isinstance(c.head_etag, str) and \
        type(c.misses) is int and (c.problem is None or isinstance(c.problem, str)) and \
        all(t is None or type(t) in (int, float)
            for t in (c.last_import, c.last_check, c.seq_time)) and \
        isinstance(c.since, dict) and all(isinstance(k, str) and type(t) in (int, float)
                                          for k, t in c.since.items()) \
        and all(isinstance(v, list) and all(isinstance(x, str) for x in v) for v in names)

"""The writer of this machine's head (docs/FORMAT.md, "Head"), built from the state.

When: right after a flush that adds, deletes or brings back a session (readers find a
session by its machine's head), after an archive job changed what the machine stores,
and otherwise at most every ``head_interval`` while flushes come: one PUT in many
flushes' worth, none while idle. A head that fails to write is retried at the next
flush or interval; it is a summary, so nothing is lost meanwhile.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from syncd.archive import redactions
from syncd.backup.ship import FlushResult, machine_facts
from syncd.backup.state import State
from syncd.errors import BackupError, FormatError, StoreError, SyncdError
from syncd.format.catalog import session_of
from syncd.format.head import FORGOTTEN_MAX, KINDS, Head, HeadSession
from syncd.repository import Repository
from syncd.security.lease import Lease
from syncd.store import layout
from syncd.view import load_backup

log = logging.getLogger("syncd.head")


class HeadWriter:
    """Keeps ``repo``'s head up to date with ``state``. ``tombstone_keep``: a session
    deleted longer ago than this is no longer listed (seconds; 0: kept)."""

    def __init__(self, repo: Repository, state: State, root: bytes, *, interval: float,
                 tombstone_keep: float, clock: Callable[[], float] = time.time) -> None:
        self.repo, self.state, self.root = repo, state, root
        self.interval, self.tombstone_keep, self.clock = interval, tombstone_keep, clock
        # What the machine stores, listed once per run and after each archive job, plus
        # the segments shipped since (in memory: a restart lists again).
        self._objects: dict[str, tuple[int, int]] | None = None
        self.lease: Lease | None = None  # checked before each write, as for a segment
        if state.meta("catalog") is None and not state.next_seq:
            state.set_meta(catalog="1")  # a new state: its catalog is whole from the start

    def shipped(self, result: FlushResult) -> None:
        """A flush committed ``result``'s segments."""
        if self._objects is not None and result.segments:
            n, size = self._objects.get("seg", (0, 0))
            self._objects["seg"] = (n + len(result.segments), size + result.stored_bytes)

    def stored_changed(self) -> None:
        """An archive job changed the machine's objects: list them again, write soon."""
        self._objects = None
        self.state.set_meta(head_due="now")

    def due(self) -> float | None:
        """When the head should be written next (wall time; None: it is up to date)."""
        due = self.state.meta("head_due")
        if due == "now":
            return 0.0
        if due == "retry":  # a write failed: again after the interval, flushes or not
            return float(self.state.meta("head_written", "0") or 0) + self.interval
        last = self.state.meta("last_flush_seq")
        if last is None or int(last) <= int(self.state.meta("head_seq", "-1") or -1):
            return None
        return float(self.state.meta("head_written", "0") or 0) + self.interval

    def write_if_due(self, *, now: bool = False) -> bool:
        """Write the head when it is due (``now``: whenever it is behind); False when it
        was not written (not due, or the store refused it: logged, retried later)."""
        due = self.due()
        if due is None or (not now and due > self.clock()):
            return False
        try:
            self.write()
        except SyncdError as e:
            log.warning("could not write the machine's head (retried later): %s", e)
            # Not again at once: at the next interval.
            self.state.set_meta(head_due="retry", head_written=repr(self.clock()))
            return False
        return True

    def write(self) -> Head:
        """Build the head from the state and replace the store's."""
        seq = int(self.state.meta("last_flush_seq", "-1") or -1)
        flushed = self.state.meta("last_flush_time")
        written = self.clock()
        if self.state.meta("catalog") != "1":
            self._bootstrap()
        if self._objects is None:
            self._objects = self._list()
        catalog = self.state.catalog()
        keep = self.tombstone_keep
        forgotten = self.state.forgotten()
        sessions = []
        for f in self.state.files():
            sid = session_of(f.path)
            if sid is None or sid in forgotten or (f.deleted_at is not None and keep
                                                   and f.deleted_at < written - keep):
                continue
            # The fields of the newest generation that named any, as a reader of the
            # backup folds them (a generation that names none yet keeps the last ones).
            named, fields = catalog.get(f.path, (0, {}))
            sessions.append(HeadSession(f.path, f.gen, f.offset, f.deleted_at, fields,
                                        named if fields and named != f.gen else None))
        # The newest tombstones: a follower that missed their segment finds them here.
        tombs = sorted((f.at, f.sid) for f in forgotten.values())[-FORGOTTEN_MAX:]
        h = Head(self.repo.machine, written, seq, float(flushed) if flushed else None,
                 machine_facts(self.root), dict(self._objects), sessions,
                 [(sid, at) for at, sid in tombs], redactions.shipped(self.state))
        if self.lease is not None:
            self.lease.ensure()
        self.repo.write_head(h)
        self.state.set_meta(head_due="", head_seq=str(seq), head_written=repr(written))
        return h

    def _list(self) -> dict[str, tuple[int, int]]:
        counts = dict.fromkeys(KINDS, (0, 0))
        for o in self.repo.objects():
            kind = layout.kind_of(o.key)
            if kind is not None:
                n, size = counts[kind]
                counts[kind] = (n + 1, size + o.size)
        return counts

    def _bootstrap(self) -> None:
        """A state from before the catalog table: fill it once from the store's view of
        this machine, which holds every flush committed so far (the sessions shipped
        before have their titles in the head too)."""
        if len(self.state):
            try:
                view = load_backup(self.repo)
            except (BackupError, FormatError, StoreError) as e:
                log.warning("the head lists sessions without titles until they change: %s", e)
            else:
                self.state.fill_catalog({s.path: (s.gen, s.fields)
                                         for s in view.sessions.values()})
        self.state.set_meta(catalog="1")

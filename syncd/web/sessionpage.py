"""What one session's page shows and does: which machine and session a request may name,
the session's points in time, its size now (for the live view), the restore (a dry run's
plan, then the confirmed run, one at a time) and the resume line.

A request's machine and session id come from the address bar, and a store's machines and
sessions from an untrusted bucket: a machine is one the store lists (or this machine),
a session id a UUID, both checked before anything reads a store or the tree, and no
path is built from them but ``projects/*/<uuid>.jsonl`` found by a listing.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

from syncd.claude import resume_line
from syncd.config import Settings
from syncd.errors import LookupFailed, RestoreBusy, RestoreError
from syncd.format.catalog import MetaScanner, is_session_id

if TYPE_CHECKING:
    from syncd.render.transcript import Transcript
    from syncd.repository import Repository
    from syncd.restore.report import RestoreReport
    from syncd.timeline import PointRow

# How long a listing of the store's machines, and a machine's timeline, are reused: a
# page switching between points reads the timeline once, and a new flush shows within it.
MACHINES_TTL = 30.0
TIMELINE_TTL = 10.0
# Characters of rendered transcripts kept (a big session takes seconds to render: going
# back to a point, or a reload that finds it unchanged, costs nothing).
RENDERED_MAX = 64 << 20
# Characters of parsed transcripts kept (a long session's page loads its parts one
# request each, from one read of the session): the last one always.
TRANSCRIPTS_MAX = 32 << 20
# Bytes of a local transcript read for its first ``cwd`` (the first lines carry it).
READ_FOR_CWD = 256 << 10


V = TypeVar("V")


class _Ttl(Generic[V]):
    """Values by key, each reused for ``ttl`` seconds."""

    def __init__(self, ttl: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl, self.clock = ttl, clock
        self._lock = threading.Lock()
        self._items: dict[str, tuple[float, V]] = {}

    def get(self, key: str, make: Callable[[], V]) -> V:
        now = self.clock()
        with self._lock:
            hit = self._items.get(key)
            if hit is not None and now - hit[0] < self.ttl:
                return hit[1]
        value = make()  # outside the lock: a store's answer may take a while
        with self._lock:
            self._items[key] = (now, value)
        return value


class SessionDesk:
    """The session pages' shared part of one running page: the caches and the one lock
    every restore it starts takes."""

    def __init__(self, settings: Settings, repository: Callable[[str | None], Repository]
                 ) -> None:
        self.settings = settings
        self.repository = repository  # machine (None: this one) → its repository
        self.restoring = threading.Lock()
        self._machines: _Ttl[frozenset[str]] = _Ttl(MACHINES_TTL)
        self._timelines: _Ttl[tuple[list[PointRow], list[str]]] = _Ttl(TIMELINE_TTL)
        self._rendered: OrderedDict[tuple[object, ...], str] = OrderedDict()
        self._rendered_chars = 0
        self._rendered_lock = threading.Lock()
        self._transcripts: OrderedDict[tuple[object, ...], tuple[Transcript, int]] = \
            OrderedDict()
        self._transcripts_chars = 0

    # -- what a request may name ----------------------------------------------------------

    def local_machines(self) -> set[str]:
        return {t.machine_id for t in self.settings.trees()}

    def known(self, machine: str, sid: str) -> bool:
        """Whether ``machine`` is this machine or one the store lists, and ``sid`` a
        session id: checked before either reaches a store or the tree."""
        if not is_session_id(sid) or len(machine) > 256:
            return False
        if machine in self.local_machines():
            return True
        return machine in self._machines.get(
            "", lambda: frozenset(self.repository(None).machines()))

    def is_local(self, machine: str) -> bool:
        return machine == self.settings.machine_id

    # -- the session's points -------------------------------------------------------------

    def points(self, machine: str, sid: str) -> tuple[list[PointRow], list[str]]:
        """The points in time of ``machine`` at which ``sid`` changed (a flush that wrote
        any file of it), newest first; and what could not be read."""
        from syncd.timeline import timeline

        got = self._timelines.get(machine, lambda: timeline(self.repository(machine)))
        rows, problems = got
        mine = [p for p in rows if sid in p.sessions]
        return list(reversed(mine)), list(problems)

    def point(self, machine: str, sid: str, seq: int) -> PointRow | None:
        """The point ``seq`` of the session's points (None: not one of them)."""
        return next((p for p in self.points(machine, sid)[0] if p.seq == seq), None)

    # -- rendered transcripts -------------------------------------------------------------

    def rendered(self, machine: str, sid: str, seq: int | None, render: Callable[[], str],
                 part: tuple[object, ...] = ()) -> str:
        """``render()``, or what it gave for the same version of the session (and the same
        ``part`` of it): a point (a flush never changes), else the transcript's size now
        (and, here, its mtime)."""
        version = self._version(machine, sid, seq)
        key = None if version is None else (*version, *part)
        if key is not None:
            with self._rendered_lock:
                hit = self._rendered.get(key)
                if hit is not None:
                    self._rendered.move_to_end(key)
                    return hit
        html = render()
        if key is not None and len(html) <= RENDERED_MAX // 4:
            with self._rendered_lock:
                if key not in self._rendered:
                    self._rendered[key] = html
                    self._rendered_chars += len(html)
                while self._rendered_chars > RENDERED_MAX:
                    _, old = self._rendered.popitem(last=False)
                    self._rendered_chars -= len(old)
        return html

    def transcript(self, machine: str, sid: str, seq: int | None,
                   load: Callable[[], Transcript]) -> Transcript:
        """``load()``, or what it gave for the same version of the session: the parts of
        one page read the session once."""
        key = self._version(machine, sid, seq)
        if key is not None:
            with self._rendered_lock:
                hit = self._transcripts.get(key)
                if hit is not None:
                    self._transcripts.move_to_end(key)
                    return hit[0]
        t = load()
        if key is not None:
            chars = sum(len(i.text) for x in (t, *t.subagents) for i in x.items)
            with self._rendered_lock:
                if key not in self._transcripts:
                    self._transcripts[key] = (t, chars)
                    self._transcripts_chars += chars
                while self._transcripts_chars > TRANSCRIPTS_MAX and len(self._transcripts) > 1:
                    _, (_, gone) = self._transcripts.popitem(last=False)
                    self._transcripts_chars -= gone
        return t

    def _version(self, machine: str, sid: str, seq: int | None) -> tuple[object, ...] | None:
        if seq is not None:
            return (machine, sid, seq)
        if self.is_local(machine):
            path = self.local_transcript(sid)
            if path is not None:
                try:
                    st = path.stat()
                except OSError:
                    return None
                return (machine, sid, "here", str(path), st.st_size, st.st_mtime_ns)
        size = self.size(machine, sid)
        return None if size is None else (machine, sid, "now", size)

    # -- the local copy -------------------------------------------------------------------

    def local_transcript(self, sid: str) -> Path | None:
        """The session's transcript in this machine's tree (a regular file, not a link),
        found by listing the project folders; None: not here."""
        projects = self.settings.source / "projects"
        try:
            folders = sorted(os.scandir(projects), key=lambda e: e.name)
        except OSError:
            return None
        for folder in folders:
            if not folder.is_dir(follow_symlinks=False):
                continue
            path = Path(folder.path) / f"{sid}.jsonl"
            try:
                if path.is_file() and not path.is_symlink():
                    return path
            except OSError:
                continue
        return None

    def size(self, machine: str, sid: str) -> int | None:
        """The transcript's size now: the local file's, or what the machine's backup
        lists (None: not there)."""
        if self.is_local(machine):
            path = self.local_transcript(sid)
            try:
                return None if path is None else path.stat().st_size
            except OSError:
                return None
        from syncd.restore.listing import locate_session

        # Its head with the segments flushed after it folded on: as `sessions` lists it.
        try:
            _, copies = locate_session(self.repository(None), sid, machine)
        except LookupFailed:
            return None
        return max(s.size for s in copies)

    # -- restore and resume ---------------------------------------------------------------

    def restore(self, machine: str, sid: str, at: float | None, *, dry_run: bool
                ) -> RestoreReport:
        """``syncd restore --machine M --session SID [--at T] [--dry-run]`` into this
        machine's tree, through its state as the command's (a transcript being written
        here is left alone: a "wait" action). One at a time: ``RestoreBusy`` otherwise."""
        from syncd.restore.restorer import restore
        from syncd.seen import Seen
        from syncd.service.localrestore import provenance, restore_options

        if not self.restoring.acquire(blocking=False):
            raise RestoreBusy("another restore is running: try again when it is done")
        try:
            opts = restore_options(self.settings, target=None, sessions=(sid,), projects=(),
                                   at=at, maps=(), worktrees="map", dry_run=dry_run)
            repo = self.repository(machine)
            opts.seen = Seen(self.settings.state_dir, repo.url)
            notes: list[str] = []
            with provenance(self.settings, opts, notes):
                report = restore(repo, opts)
            report.notes += notes
            opts.seen.save()
            return report
        finally:
            self.restoring.release()

    def resume_line(self, sid: str, report: RestoreReport | None = None) -> str:
        """``cd <dir> && claude --resume <sid>`` for the session here: its directory from
        the restore's report, else from the local transcript's first ``cwd``."""
        cwd = report.sessions.get(sid) if report is not None else None
        if cwd is None:
            path = self.local_transcript(sid)
            if path is None:
                raise RestoreError(f"session {sid} is not in this machine's tree")
            cwd = _first_cwd(path)
        if cwd is None:
            raise RestoreError(f"session {sid} has no recorded project path")
        from syncd.config import DEFAULT_SOURCE

        config_dir = None if self.settings.tree == DEFAULT_SOURCE else self.settings.source
        return resume_line(cwd, sid, self.settings.source, config_dir)


def _first_cwd(path: Path) -> str | None:
    try:
        with open(path, "rb") as fh:
            data = fh.read(READ_FOR_CWD)
    except OSError:
        return None
    scanner = MetaScanner(at_line_start=True)
    scanner.feed(data)
    return scanner.finish().get("cwd")

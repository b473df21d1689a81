"""Every session of every machine, kept in memory for the sessions view: loaded once from
the heads, filtered, sorted and paged here, reloaded in the background when a head
changes (one HEAD per machine a look), and then only the machines whose head changed."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from syncd.errors import SyncdError
from syncd.format.catalog import Session

log = logging.getLogger("syncd.web")

# How often the heads are looked at for a change.
REFRESH = 30.0
# A first load of a big store publishes what it has read so far (newest first among
# those machines) this many seconds in, then at twice, four times that..., once it has
# this many rows: the view shows a first page before every head is read. A small
# store's page is never partial.
PARTIAL_AFTER = 0.5
PARTIAL_MIN = 10_000


@dataclass(frozen=True, slots=True)
class Row:
    session: str
    machine: str
    project: str
    title: str
    last_activity: str  # the catalog's ISO time ("" when unknown)
    size: int
    here: str
    deleted: bool
    # Title and project in lower case: what the search box matches without an index.
    text: str = ""

    def __post_init__(self) -> None:
        if not self.text:
            object.__setattr__(self, "text", f"{self.title}\n{self.project}".lower())


def row_of(s: Session, here: str) -> Row:
    """A session's row, held compactly (100,000 of them stay in memory): no catalog
    fields beyond what the view shows, and the strings many rows share (machine,
    project, mark) held once."""
    project = s.place or ""
    return Row(s.session_id, sys.intern(s.machine), sys.intern(project), s.title,
               s.fields.get("last_activity") or "", s.size, sys.intern(here),
               s.deleted_at is not None)


# What ``load`` yields for each machine asked for: (machine, its rows, what could not be
# read of it).
Loaded = Iterable[tuple[str, list[Row], list[str]]]


@dataclass
class Page:
    rows: list[Row]
    total: int  # rows that pass the filters
    offset: int
    limit: int


@dataclass
class SessionList:
    """The rows, newest first. ``version()`` names each machine's head version (its
    etag); ``load(machines)`` reads those machines' rows: on the first load every
    machine, then only those whose version changed (a busy store's other 99 heads are
    not read again)."""

    load: Callable[[list[str]], Loaded]
    version: Callable[[], dict[str, object]]
    rows: list[Row] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    loaded_at: float | None = None
    machines: list[str] = field(default_factory=list)
    # While a first load is under way and rows are shown: (machines read, to read).
    reading: tuple[int, int] | None = None
    # machine: (the version its rows were read at, its rows, its problems)
    _by: dict[str, tuple[object, list[Row], list[str]]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _ready: threading.Event = field(default_factory=threading.Event)
    _some: threading.Event = field(default_factory=threading.Event)  # rows to show
    _stop: threading.Event = field(default_factory=threading.Event)
    _wanted: threading.Event = field(default_factory=threading.Event)
    _looked: float = 0.0  # monotonic time of the last look at the heads
    _thread: threading.Thread | None = None

    def start(self) -> None:
        """Load in the background now; then look at the heads again when the view is
        asked for and the last look is older than REFRESH (a page nobody views costs
        no request)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="syncd-web-rows",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def wait(self, timeout: float) -> bool:
        """Whether the first load is done (waiting up to ``timeout``)."""
        return self._ready.wait(timeout)

    def wait_first(self, whole: float, timeout: float) -> bool:
        """Whether the first load is done: waiting up to ``whole`` for it, then (up to
        ``timeout`` in all) only until some rows are there to show."""
        if self._ready.wait(whole):
            return True
        self._some.wait(max(0.0, timeout - whole))
        return self._ready.is_set()

    def wanted(self) -> None:
        """The view was asked for: a look at the heads when the last is old enough."""
        if time.monotonic() - self._looked >= REFRESH:
            self._wanted.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._looked = time.monotonic()
            try:
                self.refresh()
            except (SyncdError, OSError) as e:
                log.warning("web: sessions not loaded: %s", e)
                with self._lock:
                    self.problems = [str(e)]
            finally:
                self._ready.set()
                self._some.set()
            # Not before REFRESH, and then only once the view is asked for again.
            self._stop.wait(REFRESH)
            while not self._stop.is_set() and not self._wanted.wait(REFRESH):
                pass
            self._wanted.clear()

    def refresh(self, force: bool = False) -> bool:
        """Reload the machines whose head changed since the last load (``force``: all);
        whether anything changed."""
        seen = self.version()
        by = self._by
        if not force and self.loaded_at is not None and \
                {m: v[0] for m, v in by.items()} == seen:
            return False
        changed = [m for m, v in seen.items()
                   if force or m not in by or by[m][0] != v]
        kept = {m: got for m, got in by.items() if m in seen and m not in changed}
        first = self.loaded_at is None
        start = time.monotonic()
        after, count = PARTIAL_AFTER, 0
        for done, (m, rows, lines) in enumerate(self.load(changed), 1):
            kept[m] = (seen.get(m), rows, lines)
            count += len(rows)
            if first and count >= PARTIAL_MIN and done < len(changed) and \
                    time.monotonic() - start >= after:
                self._publish(kept, (done, len(changed)))
                after *= 2  # each a sort of every row so far: a few, however slow
        self._publish(kept, None)
        log.debug("web: %d rows of %d machines read in %.2f s", len(self.rows),
                  len(changed), time.monotonic() - start)
        return True

    def _publish(self, kept: dict[str, tuple[object, list[Row], list[str]]],
                 reading: tuple[int, int] | None) -> None:
        order = sorted(kept)
        # Each machine's rows are in no order the merge relies on: one sort of them all
        # (runs of presorted rows make it cheap).
        every = [r for m in order for r in kept[m][1]]
        every.sort(key=lambda r: r.last_activity, reverse=True)
        problems = [line for m in order for line in kept[m][2]]
        with self._lock:
            self.rows, self.problems, self.reading = every, problems, reading
            self.machines = sorted({r.machine for r in every})
            if reading is None:  # whole: what the next refresh compares against
                self._by = dict(kept)
                self.loaded_at = time.time()
        self._some.set()

    def page(self, *, machine: str | None = None, project: str | None = None,
             since: str | None = None, until: str | None = None,
             only: set[tuple[str, str]] | None = None,
             rank: dict[tuple[str, str], int] | None = None, text: str | None = None,
             offset: int = 0, limit: int = 100) -> Page:
        """The rows that pass the filters (``only``: these (machine, session)), newest
        first (or in ``rank``'s order: a search's), ``limit`` of them from ``offset``;
        ``text``: only those whose title or project holds it."""
        with self._lock:
            rows = self.rows
        if machine:
            rows = [r for r in rows if r.machine == machine]
        if project:
            rows = [r for r in rows if project in r.project]
        if since:
            rows = [r for r in rows if r.last_activity >= since]
        if until:
            rows = [r for r in rows if r.last_activity[:len(until)] <= until]
        if text:  # the catalogs' own search: titles and projects, case aside
            low = text.lower()
            rows = [r for r in rows if low in r.text]
        if only is not None:
            rows = [r for r in rows if (r.machine, r.session) in only]
        if rank is not None:
            rows = sorted(rows, key=lambda r: rank.get((r.machine, r.session), len(rank)))
        return Page(rows[offset:offset + limit], len(rows), offset, limit)

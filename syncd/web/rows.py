"""Every session of every machine, kept in memory for the sessions view: loaded once from
the heads, filtered, sorted and paged here, reloaded in the background when a head
changes (one HEAD per machine a look)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from syncd.errors import SyncdError

log = logging.getLogger("syncd.web")

# How often the heads are looked at for a change.
REFRESH = 30.0


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


def _row(r: dict[str, Any]) -> Row:
    return Row(str(r["session_id"]), str(r["machine"]), str(r.get("project") or ""),
               str(r.get("title") or ""), str(r.get("last_activity") or ""),
               int(r.get("size") or 0), str(r.get("here") or ""),
               r.get("deleted_locally_at") is not None)


@dataclass
class Page:
    rows: list[Row]
    total: int  # rows that pass the filters
    offset: int
    limit: int


@dataclass
class SessionList:
    """The rows, newest first. ``load`` gives (rows, problems, version): every head's
    sessions, and what names the heads' versions (a change of it means reload)."""

    load: Callable[[], tuple[list[dict[str, Any]], list[str]]]
    version: Callable[[], object]
    rows: list[Row] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    loaded_at: float | None = None
    machines: list[str] = field(default_factory=list)
    _seen: object = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _ready: threading.Event = field(default_factory=threading.Event)
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
            # Not before REFRESH, and then only once the view is asked for again.
            self._stop.wait(REFRESH)
            while not self._stop.is_set() and not self._wanted.wait(REFRESH):
                pass
            self._wanted.clear()

    def refresh(self, force: bool = False) -> bool:
        """Reload when the heads changed since the last load; whether it did."""
        seen = self.version()
        if not force and self.loaded_at is not None and seen == self._seen:
            return False
        raw, problems = self.load()
        rows = [_row(r) for r in raw]
        rows.sort(key=lambda r: r.last_activity, reverse=True)
        with self._lock:
            self.rows, self.problems, self._seen = rows, problems, seen
            self.machines = sorted({r.machine for r in rows})
            self.loaded_at = time.time()
        return True

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

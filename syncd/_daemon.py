"""The daemon: watch → dirty set → flush (quiet or max delay) → shipper; reconcile scans."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from types import FrameType

from ._claude import Selection
from ._config import Settings
from ._lock import ProcessLock
from ._scan import scan
from ._ship import FlushResult, Shipper, ship_with_restart
from ._state import State
from ._watch import Watcher
from .store import RetryStore, StoreError, open_store

log = logging.getLogger("syncd.daemon")


class SyncError(Exception):
    """Not everything could be made durable; the message says what and why."""


@dataclass
class _Dirty:
    """Paths awaiting a flush, with the times that decide when it happens."""

    paths: set[bytes] = field(default_factory=set)
    dirs: set[bytes] = field(default_factory=set)
    first: float | None = None
    last: float | None = None


class Engine:
    """Everything one flush needs: store, state, shipper. Shared by ``run`` and ``sync``."""

    def __init__(self, settings: Settings, stop: threading.Event | None = None) -> None:
        self.settings = settings
        self.stop = stop or threading.Event()
        if not settings.source.is_dir():
            raise SyncError(f"source {settings.source} is not a directory")
        self.lock = ProcessLock(settings.state_file.with_suffix(".lock"))
        self.lock.acquire()
        try:
            self.store: RetryStore = open_store(
                settings.store, endpoint_url=settings.s3_endpoint_url, region=settings.s3_region,
                retry_deadline=settings.store_retry_deadline, stop=self.stop)
            self.state = State(settings.state_file)
        except Exception:
            self.lock.release()
            raise
        self.selection = Selection(settings.include, settings.exclude)
        self.root = os.fsencode(settings.source)
        self.shipper = Shipper(root=settings.source, store=self.store, state=self.state,
                               machine=settings.machine_id, selection=self.selection,
                               level=settings.zstd_level, segment_max=settings.segment_max_bytes,
                               should_stop=self.stop.is_set)

    def close(self) -> None:
        self.state.close()
        self.lock.release()

    def flush(self, paths: set[bytes]) -> FlushResult:
        try:
            result = ship_with_restart(self.shipper, paths)
        except (StoreError, OSError, RuntimeError) as e:
            self.state.set_meta(last_error=f"{time.time()!r} {e}")
            raise
        if result.problems:
            first = next(iter(result.problems.values()))
            self.state.set_meta(last_error=f"{time.time()!r} {first}")
        return result


class Daemon:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.stop = threading.Event()
        self.wake = threading.Event()
        self._lock = threading.Lock()
        self._dirty = _Dirty()
        self._scan_due = True
        self._retry_at = 0.0
        self._backoff = 1.0

    # -- called from the watcher thread -------------------------------------
    def mark(self, rel: bytes) -> None:
        now = time.monotonic()
        with self._lock:
            self._dirty.paths.add(rel)
            self._dirty.first = self._dirty.first or now
            self._dirty.last = now
        self.wake.set()

    def mark_dir(self, rel: bytes) -> None:
        with self._lock:
            self._dirty.dirs.add(rel)
        self.mark_time()

    def mark_time(self) -> None:
        now = time.monotonic()
        with self._lock:
            self._dirty.first = self._dirty.first or now
            self._dirty.last = now
        self.wake.set()

    def request_scan(self) -> None:
        self._scan_due = True
        self.wake.set()

    def request_stop(self, signum: int = 0, frame: FrameType | None = None) -> None:
        log.info("stopping (signal %d)", signum)
        self.stop.set()
        self.wake.set()

    # -- the loop ------------------------------------------------------------
    def run(self) -> None:
        if not self.settings.source.exists():
            # A fresh machine: Claude Code has not run yet. Watch the empty tree it will use.
            self.settings.source.mkdir(parents=True, mode=0o700)
            log.warning("created empty %s to watch", self.settings.source)
        engine = Engine(self.settings, self.stop)
        # Signal handlers can only be set from the main thread; embedders running the
        # daemon in a thread stop it with request_stop() instead.
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self.request_stop)
        watcher = Watcher(self.settings.source, engine.selection, on_file=self.mark,
                          on_dir=self.mark_dir, on_overflow=self.request_scan)
        log.info("syncd running: machine %s, source %s, store %s", self.settings.machine_id,
                 self.settings.source, engine.store.url)
        try:
            # Watch first, then scan: a change between the two is seen at least once.
            watcher.start()
            next_scan = 0.0
            while not self.stop.is_set():
                now = time.monotonic()
                if self._scan_due or now >= next_scan:
                    self._scan_due = False
                    self._reconcile(engine)
                    next_scan = now + self.settings.reconcile_interval
                    self._flush(engine, force=True)
                self._flush(engine)
                self.wake.wait(self._timeout(next_scan))
                self.wake.clear()
        finally:
            watcher.stop()
            engine.close()
        log.info("syncd stopped")

    def _timeout(self, next_scan: float) -> float:
        now = time.monotonic()
        deadline = next_scan
        with self._lock:
            d = self._dirty
            if d.first is not None and d.last is not None:
                deadline = min(deadline, max(self._due(d), self._retry_at))
        return max(0.0, deadline - now)

    def _due(self, d: _Dirty) -> float:
        """When the pending changes must be flushed (monotonic time)."""
        assert d.first is not None and d.last is not None
        s = self.settings
        due = min(d.last + s.flush_quiet, d.first + s.flush_max_delay)
        if s.flush_busy_interval:
            due = min(due, d.first + max(s.flush_busy_interval, s.flush_quiet))
        return due

    def _reconcile(self, engine: Engine) -> None:
        t0 = time.monotonic()
        found = scan(engine.root, engine.selection, engine.state)
        log.info("reconcile scan: %d files, %d changed (%d bytes pending) in %.2fs",
                 found.files, len(found.dirty), found.pending_bytes, time.monotonic() - t0)
        with self._lock:
            self._dirty.paths |= found.dirty

    def _flush(self, engine: Engine, force: bool = False) -> None:
        now = time.monotonic()
        with self._lock:
            d = self._dirty
            if not d.paths and not d.dirs:
                d.first = d.last = None
                return
            if now < self._retry_at:
                return
            if not force and d.first is not None and d.last is not None and now < self._due(d):
                return
            paths, dirs = d.paths, d.dirs
            self._dirty = _Dirty()
        for rel in dirs:
            paths |= scan(engine.root, engine.selection, engine.state, under=rel).dirty
        try:
            result = engine.flush(paths)
        except InterruptedError:
            self._requeue(paths)
            return
        except Exception as e:
            self._requeue(paths)
            self._retry_at = time.monotonic() + self._backoff
            log.error("flush failed, retrying in %.0fs: %s", self._backoff, e)
            self._backoff = min(self._backoff * 2, 300.0)
            return
        self._backoff = 1.0
        self._retry_at = 0.0
        if result.requeue:
            self._requeue(result.requeue)
        # Unreadable files wait for the next reconcile scan instead of spinning here.

    def _requeue(self, paths: set[bytes]) -> None:
        now = time.monotonic()
        with self._lock:
            self._dirty.paths |= paths
            self._dirty.first = self._dirty.first or now
            self._dirty.last = self._dirty.last or now


def sync_once(settings: Settings) -> FlushResult:
    """Scan, ship everything pending, return when it is durable; raise SyncError otherwise."""
    engine = Engine(settings)
    try:
        found = scan(engine.root, engine.selection, engine.state)
        total = FlushResult()
        pending = found.dirty
        for _ in range(5):
            result = engine.flush(pending)
            total.segments += result.segments
            total.raw_bytes += result.raw_bytes
            total.stored_bytes += result.stored_bytes
            total.files += result.files
            total.tombstones += result.tombstones
            total.problems = result.problems
            # Files that changed while being read get another pass.
            pending = result.requeue
            if not pending:
                break
        problems = {**found.problems, **total.problems}
        if problems:
            first = next(iter(problems.values()))
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise SyncError(f"not backed up: {first}{more}")
        return total
    finally:
        engine.close()

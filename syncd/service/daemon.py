"""The daemon: watch → dirty set → flush (quiet or max delay) → the engine; reconcile
scans; the archive jobs on their schedules."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import math
import os
import signal
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import TYPE_CHECKING

from syncd.backup.engine import Engine
from syncd.backup.scan import scan
from syncd.backup.watch import Watcher
from syncd.claude import remove_left_behind, tree_writable
from syncd.config import Settings
from syncd.errors import (
    CryptoError,
    LeaseHeld,
    LeaseLost,
    StateError,
    StoreError,
    SyncdError,
)
from syncd.follow.follower import Follower
from syncd.search.indexer import Background
from syncd.secrets.scanner import Background as SecretsScan
from syncd.service.billing import RECORD_EVERY
from syncd.service.billing import record as record_requests
from syncd.service.catchup import Wakeup, catch_up
from syncd.service.log import set_level
from syncd.service.metrics import MetricsServer
from syncd.service.notify import Notifier

if TYPE_CHECKING:
    from syncd.web.server import WebServer

log = logging.getLogger("syncd.daemon")


@dataclass
class _Dirty:
    """Paths awaiting a flush, with the times that decide when it happens."""

    paths: set[bytes] = field(default_factory=set)
    dirs: set[bytes] = field(default_factory=set)
    first: float | None = None
    last: float | None = None


# Settings a SIGHUP applies to the running daemon; any other change needs a restart.
RELOADABLE = ("flush_quiet", "flush_max_delay", "flush_busy_interval", "reconcile_interval",
              "log_level")


class Daemon:
    """The loop. ``reload`` re-reads the configuration on SIGHUP (None: reload is refused)."""

    def __init__(self, settings: Settings, reload: Callable[[], Settings] | None = None, *,
                 takeover: bool = False, prompt: bool = False,
                 notify: Notifier | None = None, metrics: bool = True) -> None:
        self.settings = settings
        self.reload = reload
        self.takeover = takeover
        self.prompt = prompt
        # Set when this daemon must stop writing for good (lease taken over, key refused).
        self.fatal: Exception | None = None
        self._unconnected = False  # the store was down at start: no lease (nor key) yet
        # One tree of several (service/trees.py): systemd hears of them together, and
        # only one serves the metrics port.
        self.notify = Notifier() if notify is None else notify
        self._metrics = metrics
        self._reload_due = False
        self._ready = False
        self._extended_at = 0.0
        self._last_flush: tuple[float, int] | None = None  # wall time, seq
        self._failing: str | None = None
        self.stop = threading.Event()
        self.wake = threading.Event()
        self._stop_hook: Callable[[], None] | None = None  # the catch-up's wake-up
        self._lock = threading.Lock()
        self._dirty = _Dirty()
        self._scan_due = True
        self._retry_at = 0.0
        self._backoff = 1.0
        self._stored_changed = False  # an archive job ran: the head lists objects again
        self._head_at: float | None = None  # when the head is due (monotonic)
        self._follower: Follower | None = None
        self._search: Background | None = None  # the search index's thread (search = true)
        self._secrets: SecretsScan | None = None  # the secrets scan's (secrets_scan = true)
        self._follow_at = 0.0  # when the followed machines are looked at next (monotonic)
        # The pending_since status was told (monotonic); NaN: nothing told yet, so that
        # the first word replaces a dead daemon's (none is equal to NaN).
        self._published: float | None = math.nan

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
        self.notify.stopping()
        self.stop.set()
        self.wake.set()
        hook = self._stop_hook
        if hook is not None:
            hook()

    def _on_lease_lost(self, message: str) -> None:
        """From the lease thread: another writer took over. Stop; ``run`` raises."""
        self._stop_fatally(LeaseLost(message))

    def _stop_fatally(self, error: Exception) -> None:
        if self.fatal is None:
            self.fatal = error
        self.notify.stopping()
        self.stop.set()
        self.wake.set()

    def request_reload(self, signum: int = 0, frame: FrameType | None = None) -> None:
        self._reload_due = True
        self.wake.set()

    def _on_progress(self, nbytes: int) -> None:
        """Called by the shipper for every frame read: a long flush still feeds the watchdog."""
        self.notify.watchdog()
        now = time.monotonic()
        if not self._ready and not self.stop.is_set() and now - self._extended_at > 30:
            # A first seed that keeps making progress may take longer than TimeoutStartSec.
            self._extended_at = now
            self.notify.extend_timeout(300)

    # -- the loop ------------------------------------------------------------
    def run(self) -> None:
        _one_arena()
        if not self.settings.source.exists():
            # A fresh machine: Claude Code has not run yet. Watch the empty tree it will use.
            self.settings.source.mkdir(parents=True, mode=0o700)
            log.warning("created empty %s to watch", self.settings.source)
        if self.settings.follow:
            why = tree_writable(self.settings.source)
            if why is not None:
                # Every import would fail; say once how to fix it (a sandbox, mostly).
                log.error("follow cannot write imported sessions into the Claude tree (%s): "
                          "make %s writable to syncd (the service's ReadWritePaths=, e.g. "
                          "in a drop-in: systemctl --user edit syncd; deploy/install.sh "
                          "writes it)", why, self.settings.source)
        # Signal handlers can only be set from the main thread; embedders running the
        # daemon in a thread stop it with request_stop() instead.
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self.request_stop)
            signal.signal(signal.SIGHUP, self.request_reload)

        # Before the Engine: the child takes the state's lock and the lease itself. A stop
        # wakes its wait at once, so the child is told without waiting for a poll.
        wakeup = Wakeup()
        self._stop_hook = wakeup.set
        try:
            catch_up(self.settings, self.stop, takeover=self.takeover,
                     on_wait=lambda: self._on_progress(0), wakeup=wakeup)
        finally:
            self._stop_hook = None
            wakeup.close()
        if self.stop.is_set():
            self.notify.close()
            log.info("syncd stopped")
            return
        engine = Engine(self.settings, self.stop, progress=self._on_progress,
                        takeover=self.takeover, on_lease_lost=self._on_lease_lost,
                        prompt=self.prompt, connect=False)
        last_time, last_seq = (engine.state.meta("last_flush_time"),
                               engine.state.meta("last_flush_seq"))
        if last_time and last_seq:
            self._last_flush = (float(last_time), int(last_seq))
        from syncd.service.schedule import Archiver  # APScheduler: only the daemon needs it

        archiver = Archiver(self.settings, lambda: engine.repo if engine.connected else None,
                            self.stop, on_stored=self._on_stored)
        metrics = MetricsServer.start_for(self.settings) if self._metrics else None
        # The page, as `syncd web` serves it (the tree that serves metrics serves it).
        web = self._start_web() if self._metrics and self.settings.web else None
        watcher = Watcher(self.settings.source, engine.selection, on_file=self.mark,
                          on_dir=self.mark_dir, on_overflow=self.request_scan)
        try:
            try:
                engine.connect()  # a wrong key or a live lease ends the start here
            except StoreError as e:
                # A store that is down at boot does not fail the start: the first flush
                # (right after the reconcile scan) connects, or fails and retries.
                log.warning("cannot use the store at start (the first flush tries "
                            "again): %s", e)
            # Only once the lease is ours (or the store is down): a refused start says
            # why it stopped and nothing else.
            log.info("syncd running: machine %s, source %s, store %s",
                     self.settings.machine_id, self.settings.source, engine.store.url)
            self._unconnected = not engine.connected
            archiver.start()
            if self.settings.search:
                self._search = Background(self.settings.state_dir, self.settings.source,
                                          self.settings.machine_id)
                self._search.start()
                self._search.submit((), engine.state.origin_machines())  # the first pass
            if self.settings.secrets_scan:
                self._secrets = SecretsScan(self.settings.state_dir, self.settings.source,
                                            self.settings.machine_id)
                self._secrets.start()
                self._secrets.submit(())  # the first pass
            # Watch first, then scan: a change between the two is seen at least once.
            watcher.start()
            next_scan = 0.0
            next_count = time.monotonic() + RECORD_EVERY
            while not self.stop.is_set():
                self.notify.watchdog()
                if self._reload_due:
                    self._reload_due = False
                    next_scan = self._apply_reload(next_scan)
                    # A look asked for from outside (a forget or redact waits on it): the
                    # head made current, so that a rewrite can fold every flush.
                    engine.head.write_if_due(now=True)
                now = time.monotonic()
                if self._scan_due or now >= next_scan:
                    self._scan_due = False
                    self._reconcile(engine)
                    next_scan = now + self.settings.reconcile_interval
                    engine.state.set_meta(
                        last_reconcile_time=repr(time.time()),
                        next_reconcile_time=repr(time.time() + self.settings.reconcile_interval))
                    self._flush(engine, force=True)
                    _release_memory()  # the scan's garbage, and start-up's
                self._flush(engine)
                self._write_head(engine)
                self._follow(engine)
                if not self._ready and not self.stop.is_set():
                    # The first reconcile scan and its flush are done: we are up.
                    self._ready = True
                    self.notify.ready(self._status_text())
                self.notify.status(self._status_text())
                self._publish_pending(engine)
                if time.monotonic() >= next_count:
                    record_requests(engine.state)  # what the dashboard's cost is made of
                    next_count = time.monotonic() + RECORD_EVERY
                self.wake.wait(min(self._timeout(next_scan),
                                   max(0.0, next_count - time.monotonic())))
                self.wake.clear()
        finally:
            archiver.shutdown()
            watcher.stop()
            if self._search is not None:
                self._search.stop()
                self._search = None
            if self._secrets is not None:
                self._secrets.stop()
                self._secrets = None
            if engine.connected and self.fatal is None:
                engine.head.write_if_due(now=True)  # a clean stop leaves the head current
            if metrics is not None:
                metrics.stop()
            if web is not None:
                from syncd.web.server import forget_url

                web.stop()
                forget_url(self.settings.state_dir)
            with contextlib.suppress(StateError, sqlite3.Error):
                record_requests(engine.state)
            engine.close()
            self.notify.close()
        if self.fatal is not None:
            raise self.fatal
        log.info("syncd stopped")

    def _start_web(self) -> WebServer | None:
        """The page on 127.0.0.1:web_port, its URL (with this start's token) logged and
        written 0600 to the state dir for `syncd web --url`. A port taken is a warning:
        the backup goes on without the page."""
        from syncd.web.server import WebServer, bind, write_url

        try:
            bound = bind(self.settings.web_port)
            server = WebServer(self.settings, bound)
        except (SyncdError, OSError) as e:
            log.warning("web page not served: %s", e)
            return None
        server.start()
        write_url(self.settings.state_dir, bound.url)
        log.warning("web page: %s", bound.url)
        return server

    def _apply_reload(self, next_scan: float) -> float:
        """SIGHUP: re-read the configuration and apply what can change without a restart."""
        self.notify.reloading()
        try:
            if self.reload is None:
                raise ValueError("this daemon was started without a configuration to re-read")
            new = self.reload()
        except Exception as e:  # a bad config file keeps the running configuration
            log.error("reload failed, configuration unchanged: %s", str(e).replace("\n", " "))
            if self._ready:
                self.notify.ready(self._status_text())
            return next_scan
        old = self.settings
        hot = {k: getattr(new, k) for k in RELOADABLE if getattr(new, k) != getattr(old, k)}
        cold = [k for k in type(new).model_fields
                if k not in RELOADABLE and getattr(new, k) != getattr(old, k)]
        self.settings = old.model_copy(update=hot)
        if "log_level" in hot:
            set_level(self.settings.log_level)
        if "reconcile_interval" in hot:
            next_scan = min(next_scan, time.monotonic() + self.settings.reconcile_interval)
        log.info("reloaded configuration: %s%s",
                 ", ".join(f"{k}={v}" for k, v in hot.items()) or "no change applied",
                 f"; {', '.join(cold)} changed but need a restart" if cold else "")
        if self._ready:  # before the first flush, READY=1 comes when that is done
            self.notify.ready(self._status_text())
        return next_scan

    def _status_text(self) -> str:
        """One line for ``systemctl status``: lag and what is pending, or the last flush."""
        with self._lock:
            pending = len(self._dirty.paths) + len(self._dirty.dirs)
            first = self._dirty.first
        parts = []
        if self._failing:
            parts.append(f"flush failing: {self._failing}")
        if pending and first is not None:
            # A time, not an age: the line changes when the pending set does, not every second.
            since = time.time() - (time.monotonic() - first)
            parts.append(f"changes pending since "
                         f"{time.strftime('%H:%M:%S', time.localtime(since))} ({pending} paths)")
        else:
            parts.append("idle, nothing pending")
        if self._last_flush:
            when, seq = self._last_flush
            parts.append(f"last flush {time.strftime('%H:%M:%S', time.localtime(when))} "
                         f"(seq {seq})")
        return "; ".join(parts)

    def _on_stored(self) -> None:
        """An archive job changed what the machine stores (the scheduler's thread)."""
        self._stored_changed = True
        self.wake.set()

    def _write_head(self, engine: Engine) -> None:
        self._head_at = None
        if not engine.connected:
            return
        if self._stored_changed:
            self._stored_changed = False
            engine.head.stored_changed()
        engine.head.write_if_due()
        due = engine.head.due()
        if due is not None:
            self._head_at = time.monotonic() + max(0.0, due - time.time())

    def _follow(self, engine: Engine) -> None:
        """Import what the followed machines wrote since the last look (follow)."""
        if not self.settings.follow or not engine.connected or self.stop.is_set() or \
                time.monotonic() < self._follow_at:
            return
        if self._follower is None:
            # A first import before READY=1 may take long: it feeds the watchdog and
            # extends the start timeout as the first seed does.
            self._follower = Follower(self.settings, engine.repo, engine.state,
                                      progress=self._on_progress)
        started = time.monotonic()
        self._follow_at = started + self.settings.follow_interval
        before = [c.last_import for c in self._follower.cursors.values()]
        self._follower.poll()
        # Every interval from the start of the last poll (a busy machine's import takes
        # seconds), but never at once again after an import longer than the interval.
        self._follow_at = max(self._follow_at, time.monotonic() + 1.0)
        if before != [c.last_import for c in self._follower.cursors.values()]:
            _release_memory()  # an import's buffers, as after a flush

    def _timeout(self, next_scan: float) -> float:
        now = time.monotonic()
        deadline = next_scan
        if self.settings.follow and not self._unconnected:
            deadline = min(deadline, self._follow_at)
        if self._head_at is not None:
            deadline = min(deadline, self._head_at)
        with self._lock:
            d = self._dirty
            if d.first is not None and d.last is not None:
                deadline = min(deadline, max(self._due(d), self._retry_at))
        if self._unconnected:
            deadline = min(deadline, self._retry_at)
        if self.notify.watchdog_interval is not None:
            # Under a systemd watchdog, wake often enough to ping it; otherwise stay idle.
            deadline = min(deadline, now + self.notify.watchdog_interval / 2)
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
        gone = remove_left_behind(os.path.join(engine.root, rel) for rel in found.temps)
        if gone:
            log.info("removed %d temp file%s a killed restore left: %s%s", len(gone),
                     "" if len(gone) == 1 else "s", os.fsdecode(gone[0]),
                     f" (and {len(gone) - 1} more)" if len(gone) > 1 else "")
        if engine.connected:
            try:  # what the store lost since the last look is shipped again
                found.dirty |= engine.shipper.audit()
            except SyncdError as e:
                log.warning("cannot check the store for lost segments: %s", e)
        # Quiet when nothing happens: an hourly scan that finds nothing is not news.
        log.log(logging.INFO if found.dirty else logging.DEBUG,
                "reconcile scan: %d files, %d changed (%d bytes pending) in %.2fs",
                found.files, len(found.dirty), found.pending_bytes, time.monotonic() - t0)
        with self._lock:
            self._dirty.paths |= found.dirty

    def _flush(self, engine: Engine, force: bool = False) -> None:
        now = time.monotonic()
        with self._lock:
            d = self._dirty
            idle = not d.paths and not d.dirs
            if idle:
                d.first = d.last = None
                # A forgotten session's tombstone is shipped even when nothing changed.
                if not self._unconnected and not engine.shipper.tombstones_due():
                    return
                # Not connected yet (store down at start): an empty flush connects, so
                # the lease is held even while nothing changes.
            if now < self._retry_at:
                return
            if not idle and not force and d.first is not None and d.last is not None and \
                    now < self._due(d):
                return
            paths, dirs = d.paths, d.dirs
            self._dirty = _Dirty()
        for rel in dirs:
            paths |= scan(engine.root, engine.selection, engine.state, under=rel).dirty
        try:
            try:
                result = engine.flush(paths)
            finally:
                self._unconnected = not engine.connected
        except InterruptedError:
            self._requeue(paths, d.first)
            return
        except (LeaseLost, LeaseHeld, CryptoError) as e:
            # Not passing: another writer has this machine id, or the key is refused.
            self._requeue(paths, d.first)
            log.error("%s", e)
            self._stop_fatally(e)
            return
        except Exception as e:
            self._requeue(paths, d.first)  # pending since then, not since the failure
            self._retry_at = time.monotonic() + self._backoff
            log.error("flush failed, retrying in %.0fs: %s", self._backoff, e)
            self._failing = str(e)[:200]
            self._backoff = min(self._backoff * 2, 300.0)
            return
        self._backoff = 1.0
        self._retry_at = 0.0
        self._failing = None
        if result.segments:
            self._last_flush = (time.time(), result.segments[-1])
            _release_memory()
        if self._search is not None and paths:
            # What was flushed is what changed: indexed on the search thread, after.
            self._search.submit(paths, engine.state.origin_machines())
        if self._secrets is not None and paths:
            self._secrets.submit(paths)  # what was shipped: scanned past each cursor
        if result.requeue:
            self._requeue(result.requeue)
        # Unreadable files wait for the next reconcile scan instead of spinning here.

    def _requeue(self, paths: set[bytes], first: float | None = None) -> None:
        now = time.monotonic()
        with self._lock:
            self._dirty.paths |= paths
            self._dirty.first = min(t for t in (self._dirty.first, first or now)
                                    if t is not None)
            self._dirty.last = self._dirty.last or now

    def _publish_pending(self, engine: Engine) -> None:
        """Tell ``status`` since when changes are pending (a wall time in the state; ""
        when none are): a file's mtime is its newest change, which a transcript that
        keeps growing keeps at now. Written only when it changes, about twice a flush."""
        with self._lock:
            d = self._dirty
            first = d.first if d.paths or d.dirs else None
        if first == self._published:
            return
        since = "" if first is None else repr(time.time() - (time.monotonic() - first))
        engine.state.set_meta(pending_since=since)
        self._published = first


# glibc's mallopt parameter for the number of malloc arenas.
_M_ARENA_MAX = -8


def _one_arena() -> None:
    """One malloc arena for the whole daemon. glibc gives each thread that allocates
    under contention an arena of its own (the S3 client's builder, the upload worker,
    the lease thread, the watcher), and each keeps its own fragments: ~3 MB of an idle
    daemon's RSS. Its threads seldom allocate at once, so sharing costs no speed. Only
    effective before the second thread allocates; a no-op where glibc is absent."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).mallopt(_M_ARENA_MAX, 1)


def _release_memory() -> None:
    """Hand freed heap back to the OS after a flush: a big flush's buffers would otherwise
    stay in an idle daemon's RSS (glibc keeps freed arenas)."""
    gc.collect()  # cycles left by the flush first, so their memory is free to return
    with contextlib.suppress(OSError, AttributeError):  # not glibc
        ctypes.CDLL(None).malloc_trim(0)

"""The daemon: watch → dirty set → flush (quiet or max delay) → shipper; reconcile scans."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType

from syncd.backup.errorlog import record_error
from syncd.backup.scan import scan
from syncd.backup.ship import FlushResult, Shipper, ship_with_restart
from syncd.backup.state import State
from syncd.backup.watch import Watcher
from syncd.claude import Selection
from syncd.config import Settings
from syncd.errors import (
    CryptoError,
    LeaseHeld,
    LeaseLost,
    StoreError,
    SyncdError,
    SyncError,
    SyncStopped,
)
from syncd.progress import Meter
from syncd.security.crypto import Crypto
from syncd.security.keys import hint_of, open_crypto, passphrase_configured
from syncd.security.lease import Lease
from syncd.security.lock import ProcessLock
from syncd.service.log import set_level
from syncd.service.metrics import MetricsServer
from syncd.service.notify import Notifier
from syncd.store import RetryStore, open_store

log = logging.getLogger("syncd.daemon")


@dataclass
class _Dirty:
    """Paths awaiting a flush, with the times that decide when it happens."""

    paths: set[bytes] = field(default_factory=set)
    dirs: set[bytes] = field(default_factory=set)
    first: float | None = None
    last: float | None = None


class Engine:
    """Everything one flush needs: store, state, key, lease, shipper. Shared by ``run``
    and ``sync``.

    Start-up, in order: the state's process lock; then ``connect``: one LIST of
    ``keys/`` (an encrypted store is unlocked, or refused without a working passphrase)
    and the machine's lease (refused when another writer holds it). Nothing is written
    before ``connect`` succeeded; a flush connects before its first upload if needed, so
    a daemon whose store is down at boot starts anyway and connects when the store is
    back, and ``sync`` reads and compresses while the S3 client is being built.
    """

    def __init__(self, settings: Settings, stop: threading.Event | None = None,
                 progress: Callable[[int], None] | None = None, *, takeover: bool = False,
                 on_lease_lost: Callable[[str], None] | None = None,
                 prompt: bool = False, connect: bool = True) -> None:
        self.settings = settings
        self.stop = stop or threading.Event()
        self.takeover = takeover
        self.prompt = prompt
        self.on_lease_lost = on_lease_lost or (lambda msg: None)
        if not settings.source.is_dir():
            raise SyncError(f"source {settings.source} is not a directory")
        self.lock = ProcessLock(settings.state_file.with_suffix(".lock"))
        self.lock.acquire()
        self.lease: Lease | None = None
        self.crypto: Crypto | None = None
        self.connected = False
        try:
            # One connection attempt takes at most half the retry budget (sync's is short).
            self.store: RetryStore = open_store(
                settings.store, endpoint_url=settings.s3_endpoint_url, region=settings.s3_region,
                retry_deadline=settings.store_retry_deadline, stop=self.stop,
                connect_timeout=min(10.0, settings.store_retry_deadline / 2))
            self.state = State(settings.state_file)
        except Exception:
            self.lock.release()
            raise
        self.selection = Selection(settings.include, settings.exclude)
        self.root = os.fsencode(settings.source)
        self.shipper = Shipper(root=settings.source, store=self.store, state=self.state,
                               machine=settings.machine_id, selection=self.selection,
                               level=settings.zstd_level, segment_max=settings.segment_max_bytes,
                               should_stop=self.stop.is_set, prepare=self.connect)
        if progress is not None:
            self.shipper.progress = progress
        if connect:
            try:
                self.connect()
            except Exception:
                self.close()
                raise

    def connect(self) -> None:
        """Unlock the store (if encrypted) and take the lease; a no-op once done.

        ``StoreError``: the store is unreachable, try again later. ``CryptoError`` and
        ``LeaseHeld``: this process must not write to this store; do not retry.
        """
        if self.connected:
            return
        crypto = self._unlock(self.state, self.prompt)
        lease = self._take_lease(self.state, self.takeover)
        lease.start(self.on_lease_lost)
        self.crypto, self.lease = crypto, lease
        self.shipper.crypto, self.shipper.lease = crypto, lease
        self.connected = True

    def _unlock(self, state: State, prompt: bool) -> Crypto | None:
        """The store's key (None: plain), checked against what this state wrote before.

        The key file that opened it last is tried first, then those naming the master key
        remembered: planted key files cost nothing then, and whatever opens, a master key
        other than the remembered one is refused.
        """
        hint = hint_of(state)
        crypto = open_crypto(self.store, self.settings.passphrase_file, prompt=prompt,
                             hint=hint)
        known = hint.master
        found = None if crypto is None else crypto.fingerprint
        if known and found != known:
            raise CryptoError(
                f"{self.store.url}: this machine's backup there is encrypted with key "
                f"{known}, but the store now " + ("has no keys/ (removed?)" if found is None
                                                  else f"holds key {found}")
                + ": refusing to write")
        if found and not known:
            if state.next_seq:
                raise CryptoError(f"{self.store.url}: encrypted, but this machine already "
                                  "wrote unencrypted segments there: refusing to mix them "
                                  f"(remove {state.path} to start an encrypted backup)")
            state.set_meta(key_fingerprint=found)
        if crypto is not None and crypto.key_id != hint.key_id:
            state.set_meta(key_id=crypto.key_id)
        return crypto

    def _take_lease(self, state: State, takeover: bool) -> Lease:
        owner = state.meta("lease_owner")
        if not owner:
            owner = os.urandom(16).hex()
            state.set_meta(lease_owner=owner)
        ttl = self.settings.lease_ttl
        # Its own retries: a renewal gives up before the next one is due.
        store = RetryStore(self.store.inner, deadline=ttl / 3, stop=self.stop)
        lease = Lease(store, self.settings.machine_id, owner=owner, ttl=ttl, takeover=takeover)
        lease.acquire()
        return lease

    def close(self) -> None:
        if self.lease is not None:
            self.lease.release()
        self.state.close()
        self.lock.release()

    def flush(self, paths: set[bytes]) -> FlushResult:
        try:
            result = ship_with_restart(self.shipper, paths)  # connects before its first PUT
        except InterruptedError:
            raise  # a stop (an OSError too), not an error
        except (SyncdError, OSError) as e:
            record_error(self.state, str(e))
            raise
        if result.problems:
            first = next(iter(result.problems.values()))
            record_error(self.state, first)
        return result


# Settings a SIGHUP applies to the running daemon; any other change needs a restart.
RELOADABLE = ("flush_quiet", "flush_max_delay", "flush_busy_interval", "reconcile_interval",
              "log_level")


class Daemon:
    """The loop. ``reload`` re-reads the configuration on SIGHUP (None: reload is refused)."""

    def __init__(self, settings: Settings, reload: Callable[[], Settings] | None = None, *,
                 takeover: bool = False, prompt: bool = False) -> None:
        self.settings = settings
        self.reload = reload
        self.takeover = takeover
        self.prompt = prompt
        # Set when this daemon must stop writing for good (lease taken over, key refused).
        self.fatal: Exception | None = None
        self._unconnected = False  # the store was down at start: no lease (nor key) yet
        self.notify = Notifier()
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
        # Signal handlers can only be set from the main thread; embedders running the
        # daemon in a thread stop it with request_stop() instead.
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self.request_stop)
            signal.signal(signal.SIGHUP, self.request_reload)
        from syncd.service.catchup import Wakeup, catch_up

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

        archiver = Archiver(self.settings, lambda: (engine.store, engine.crypto)
                            if engine.connected else None, self.stop)
        metrics = MetricsServer.start_for(self.settings)
        watcher = Watcher(self.settings.source, engine.selection, on_file=self.mark,
                          on_dir=self.mark_dir, on_overflow=self.request_scan)
        log.info("syncd running: machine %s, source %s, store %s", self.settings.machine_id,
                 self.settings.source, engine.store.url)
        try:
            try:
                engine.connect()  # a wrong key or a live lease ends the start here
            except StoreError as e:
                # A store that is down at boot does not fail the start: the first flush
                # (right after the reconcile scan) connects, or fails and retries.
                log.warning("store unreachable at start, connecting with the first flush: %s",
                            e)
            self._unconnected = not engine.connected
            archiver.start()
            # Watch first, then scan: a change between the two is seen at least once.
            watcher.start()
            next_scan = 0.0
            while not self.stop.is_set():
                self.notify.watchdog()
                if self._reload_due:
                    self._reload_due = False
                    next_scan = self._apply_reload(next_scan)
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
                if not self._ready and not self.stop.is_set():
                    # The first reconcile scan and its flush are done: we are up.
                    self._ready = True
                    self.notify.ready(self._status_text())
                self.notify.status(self._status_text())
                self.wake.wait(self._timeout(next_scan))
                self.wake.clear()
        finally:
            archiver.shutdown()
            watcher.stop()
            if metrics is not None:
                metrics.stop()
            engine.close()
            self.notify.close()
        if self.fatal is not None:
            raise self.fatal
        log.info("syncd stopped")

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

    def _timeout(self, next_scan: float) -> float:
        now = time.monotonic()
        deadline = next_scan
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
                if not self._unconnected:
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
            self._requeue(paths)
            return
        except (LeaseLost, LeaseHeld, CryptoError) as e:
            # Not passing: another writer has this machine id, or the key is refused.
            self._requeue(paths)
            log.error("%s", e)
            self._stop_fatally(e)
            return
        except Exception as e:
            self._requeue(paths)
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
        if result.requeue:
            self._requeue(result.requeue)
        # Unreadable files wait for the next reconcile scan instead of spinning here.

    def _requeue(self, paths: set[bytes]) -> None:
        now = time.monotonic()
        with self._lock:
            self._dirty.paths |= paths
            self._dirty.first = self._dirty.first or now
            self._dirty.last = self._dirty.last or now


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


def sync_once(settings: Settings, progress: Meter | None = None, *, takeover: bool = False,
              prompt: bool = False, stop: threading.Event | None = None) -> FlushResult:
    """Scan, ship everything pending, return when it is durable; raise SyncError otherwise.

    ``progress`` is told the bytes to read, then every frame read (a first seed's bar).
    The machine's lease is held for the duration (``takeover``: from a dead holder).
    ``stop``, once set, ends the pass at the next segment boundary (the segment in flight
    is committed) with ``SyncStopped``.
    """
    # The store is connected to before the first upload, so the seed reads and compresses
    # while the S3 client is built; but a passphrase prompt comes first, not mid-progress.
    may_prompt = prompt and sys.stdin.isatty() and not passphrase_configured(
        settings.passphrase_file)
    engine = Engine(settings, stop, progress=progress.advance if progress is not None else None,
                    takeover=takeover, prompt=prompt, connect=may_prompt)
    try:
        found = scan(engine.root, engine.selection, engine.state)
        if progress is not None:
            progress.start(found.pending_bytes)
        total = FlushResult()
        pending = found.dirty
        for _ in range(5):
            try:
                result = engine.flush(pending)
            except InterruptedError:
                if not engine.stop.is_set():
                    raise
                raise SyncStopped("stopped: what was not shipped waits for the next run") \
                    from None
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

"""The start-up catch-up: a big backlog is shipped by a child process.

Shipping a backlog (a first seed, a machine back after days off) leaves the heap
fragmented: the flush's buffers are freed, but pymalloc pools and glibc arenas that
``malloc_trim`` cannot return stay in the idle daemon's RSS for good (~11 MB after
seeding 10 000 files). A child process ships it instead (``sync_once``, with the state's
lock and the store's lease of its own), and all its memory goes back to the OS when it
exits. The daemon then starts as usual: its watch and reconcile scan catch whatever
changed meanwhile. A child that fails costs only the memory benefit: the daemon ships
everything itself.

A first import from a followed machine (every session it holds) is such a backlog too:
the child makes it and ships what it brought, and the daemon follows on from there.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import os
import resource
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Literal

from syncd.backup.engine import Engine, sync_once
from syncd.backup.scan import ScanResult, scan
from syncd.backup.ship import FlushResult
from syncd.backup.state import State
from syncd.claude import Selection
from syncd.config import Settings
from syncd.errors import Locked, StateError, SyncStopped
from syncd.follow.follower import Follower, first_look_due
from syncd.redact import redact
from syncd.security.lock import ProcessLock
from syncd.service.log import TREE
from syncd.service.log import setup as setup_logging
from syncd.service.signals import stop_on_signals

log = logging.getLogger("syncd.catchup")

# A backlog this big goes to a child. Below it the heap a flush leaves behind is small
# (~3 MB after 1000 files), not worth a child's start (an interpreter, boto3); a first
# seed of a real ~/.claude (thousands of files) is well above it.
MIN_FILES = 1000
MIN_BYTES = 32 << 20
# SIGTERM to a child makes it finish the segment in flight, close its state and release
# its lease; one still running this long after is killed (safe: state advances only after
# a segment PUT is confirmed).
TERM_GRACE = 10.0
# How often the parent calls ``on_wait`` while the child works (and looks at ``stop``,
# when no ``Wakeup`` tells it at once).
POLL = 1.0

Outcome = Literal["skipped", "done", "failed", "stopped"]


@dataclass
class _Report:
    """What the child sends back: what it shipped, or why it could not."""

    pid: int
    peak_rss: int  # bytes
    result: FlushResult | None = None
    error: str = ""
    stopped: bool = False  # by a signal, at a segment boundary


class Wakeup:
    """Ends the catch-up's wait for its child at once. ``set`` may be called from a signal
    handler or any thread: one send on a socket pair, no lock to deadlock on."""

    def __init__(self) -> None:
        self._r, self._w = socket.socketpair()
        self._w.setblocking(False)

    def set(self) -> None:
        with contextlib.suppress(OSError):  # already full of wake-ups, or closed
            self._w.send(b"\0")

    def fileno(self) -> int:
        return self._r.fileno()

    def close(self) -> None:
        self._w.close()
        self._r.close()


def catch_up(settings: Settings, stop: threading.Event, *, takeover: bool,
             on_wait: Callable[[], None], wakeup: Wakeup | None = None) -> Outcome:
    """Ship a big start-up backlog in a child process; never raises for the child's sake.

    Call it before the daemon takes the state's lock and the store's lease: the child
    needs both. ``on_wait`` is called about every second while the child works (the
    watchdog); when ``stop`` is set the child is stopped at its next segment boundary and
    "stopped" returned. Whoever sets ``stop`` should also set ``wakeup``: the stop then
    reaches the child at once, not at the next ``POLL``.
    """
    if not settings.catchup_child or stop.is_set():
        return "skipped"
    try:
        found, first = _pending(settings)
    except Locked:
        return "skipped"  # another syncd runs on this state: the daemon's start says so
    except (StateError, OSError) as e:
        log.warning("start-up catch-up skipped: %s", e)
        return "skipped"
    if len(found.dirty) < MIN_FILES and found.pending_bytes < MIN_BYTES and not first:
        return "skipped"
    log.info("start-up catch-up: %d files, %s pending%s: shipping them in a child process",
             len(found.dirty), _mb(found.pending_bytes),
             ", and a first import from the followed machines" if first else "")
    del found
    if wakeup is not None:
        return _run_child(settings, stop, takeover, on_wait, wakeup, first)
    own = Wakeup()  # nobody sets it: the stop is seen at the next POLL
    try:
        return _run_child(settings, stop, takeover, on_wait, own, first)
    finally:
        own.close()


def backlog(settings: Settings) -> ScanResult:
    """The start-up reconcile scan (stat only)."""
    return _pending(settings)[0]


def _pending(settings: Settings) -> tuple[ScanResult, bool]:
    """The start-up reconcile scan, and whether a first import from a followed machine is
    due. It takes the state's lock for the moment: a first start has no state database to
    open read-only, and creating one wants it."""
    lock = ProcessLock(settings.state_file.with_suffix(".lock"))
    lock.acquire()
    try:
        state = State(settings.state_file)
        try:
            return scan(os.fsencode(settings.source),
                        Selection(settings.include, settings.exclude), state), \
                first_look_due(settings, state)
        finally:
            state.close()
    finally:
        lock.release()


def _run_child(settings: Settings, stop: threading.Event, takeover: bool,
               on_wait: Callable[[], None], wakeup: Wakeup, first: bool = False) -> Outcome:
    # spawn, not fork: a fresh interpreter owes nothing to our heap, and cannot inherit a
    # lock that another thread (an embedder's) held at the fork.
    ctx = multiprocessing.get_context("spawn")
    receiver, sender = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, name="syncd-catchup",
                       args=(settings, takeover, logging.getLogger().getEffectiveLevel(),
                             os.getpid(), sender, first, TREE.get()))
    t0 = time.monotonic()
    try:
        try:
            proc.start()
        except Exception as e:
            log.warning("start-up catch-up: cannot start a child process (%s); "
                        "shipping in this process instead", e)
            return "failed"
        finally:
            sender.close()  # the child's end: a child that dies leaves EOF, not a hang
        stopped = _wait(proc, stop, on_wait, wakeup)
        report = _receive(receiver)
    finally:
        receiver.close()
        _stop_resource_tracker()
    code = proc.exitcode
    proc.close()
    if stopped:
        log.info("start-up catch-up stopped; what it did not ship waits for the next start")
        return "stopped"
    if code == 0 and report is not None and report.result is not None:
        r = report.result
        log.info("start-up catch-up: %d files, %s in %d segment%s shipped by child process "
                 "%d in %.1fs (peak RSS %s)", r.files, _mb(r.raw_bytes), len(r.segments),
                 "" if len(r.segments) == 1 else "s", report.pid, time.monotonic() - t0,
                 _mb(report.peak_rss))
        return "done"
    if report is not None and report.error:
        reason = report.error
    elif report is not None and report.stopped:
        reason = "it was stopped by a signal"  # not ours: we are not stopping
    elif code is not None and code < 0:
        reason = f"killed by signal {-code}"
    else:
        reason = f"exit code {code}"
    log.warning("start-up catch-up in a child process failed (%s); shipping in this process "
                "instead", reason)
    return "failed"


def _wait(proc: multiprocessing.process.BaseProcess, stop: threading.Event,
          on_wait: Callable[[], None], wakeup: Wakeup) -> bool:
    """Wait for the child to exit, feeding ``on_wait``; pass ``stop`` on to it as soon as
    ``wakeup`` says so (SIGTERM: it finishes the segment in flight and exits), and kill it
    if it is still running ``TERM_GRACE`` later. True when it was stopped."""
    sentinel = proc.sentinel
    kill_at: float | None = None  # set once the stop is passed on
    try:
        while True:
            if kill_at is None:
                wait([sentinel, wakeup.fileno()], POLL)
            else:
                # The wake-up stays readable: from here on only the child's exit counts.
                wait([sentinel], min(POLL, max(0.0, kill_at - time.monotonic())))
            if proc.exitcode is not None:
                return kill_at is not None
            if kill_at is None and stop.is_set():
                proc.terminate()
                kill_at = time.monotonic() + TERM_GRACE
            elif kill_at is not None and time.monotonic() >= kill_at:
                proc.kill()
                proc.join()
                return True
            on_wait()
    finally:
        if proc.exitcode is None:  # on_wait raised
            _terminate(proc)


def _terminate(proc: multiprocessing.process.BaseProcess) -> None:
    proc.terminate()
    proc.join(TERM_GRACE)
    if proc.exitcode is None:
        proc.kill()
        proc.join()


def _receive(conn: Connection) -> _Report | None:
    try:
        if conn.poll():
            report = conn.recv()
            return report if isinstance(report, _Report) else None
    except (EOFError, OSError):
        pass
    return None


def _stop_resource_tracker() -> None:
    """spawn starts multiprocessing's resource tracker (another interpreter, ~13 MB) and
    would keep it for the daemon's lifetime; nothing of ours registers with it."""
    from multiprocessing import resource_tracker

    stopper = getattr(getattr(resource_tracker, "_resource_tracker", None), "_stop", None)
    if callable(stopper):
        with contextlib.suppress(Exception):
            stopper()


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


# -- in the child ---------------------------------------------------------------------

def _child(settings: Settings, takeover: bool, level: int, parent: int,
           conn: Connection, first: bool = False, tree: str = "") -> None:
    """The child's body: ship everything pending (after the followed machines' first
    import, when ``first``), send a ``_Report``, exit 0 (or 1).

    SIGTERM and SIGINT stop it the way they stop the daemon: the shipper sees the stop
    between files and after each committed segment, its upload in flight is committed,
    the state closed and the lease released; what was not shipped waits for the next
    start."""
    setup_logging(level)
    TREE.set(tree)  # its lines name the tree its parent's did (service/trees.py)
    stopping = stop_on_signals()
    _die_with(parent)
    try:
        result = sync_once(settings, takeover=takeover, stop=stopping,
                           before=_first_import if first else None)
    except SyncStopped:
        conn.send(_Report(os.getpid(), _peak_rss(), stopped=True))
        return
    except Exception as e:
        conn.send(_Report(os.getpid(), _peak_rss(), error=redact(str(e))[:500]))
        sys.exit(1)
    conn.send(_Report(os.getpid(), _peak_rss(), result))


def _first_import(engine: Engine) -> None:
    """The followed machines' sessions, imported into the tree the pass then ships."""
    Follower(engine.settings, engine.repo, engine.state).poll()


def _die_with(parent: int) -> None:
    """SIGTERM this process when its parent dies (Linux): an orphan would hold the state's
    lock and keep a restarted daemon out."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        raise SystemExit(128 + signal.SIGTERM)


def _peak_rss() -> int:
    """This process's peak RSS in bytes: VmHWM (ru_maxrss starts at the spawning
    process's peak: the kernel carries it over the exec)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

"""One writer per machine prefix: ``machines/<id>/lease.json``, held while writing.

The lease is created with ``If-None-Match: *`` and renewed every ``ttl / 3`` with
``If-Match: <etag of our last write>`` by a thread, so two daemons with the same machine
id (on one host with two state directories, or on two hosts) never write at once: the
second refuses to start and names the holder. A lease whose holder stopped renewing it
for ``ttl`` seconds is taken over (with a warning); ``--takeover`` takes it at once. A
holder whose renewal is refused (someone took over) stops writing and exits non-zero.

Before every write (each attempt of a PUT or DELETE, ``ensure``) the writer asks its own
clocks whether its last confirmed renewal is younger than ``SAFE_SHARE`` of the TTL;
when it is not (a suspended laptop that woke, a store that was unreachable) it renews
first, and learns that way whether someone took over, before anything else is written.
The ages are measured on a clock that counts suspend and on the wall clock, whichever
says older (docs/FORMAT.md, "lease.json", has the argument).
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from syncd import untrusted
from syncd.errors import (
    LeaseError,
    LeaseHeld,
    LeaseLost,
    LeaseStale,
    NotFound,
    PreconditionFailed,
    StoreError,
)
from syncd.store import Store, layout

log = logging.getLogger("syncd.lease")

# 900 s: a renewal every 5 minutes, 12 PUTs an hour; a dead holder elsewhere is taken
# over 15 minutes after its last renewal (one of this state database at once).
DEFAULT_TTL = 900.0
# The longest lease a writer takes (the config's lease_ttl is at most this).
TTL_MAX = 3600.0
# A holder writes only while its last confirmed renewal is younger than this share of
# the TTL; a newcomer takes over only after the whole TTL.
SAFE_SHARE = 0.8
# lease.json is ~250 bytes; a bigger object is not one syncd wrote.
LEASE_MAX = 4 << 10
# A flush HEADs the lease unless it was seen ours this recently: a --takeover of a live
# holder stops it within this long (the old renewal period), at <= 360 HEADs an hour.
VERIFY_EVERY = 10.0
# The renewal thread looks at its clocks this often: after a suspend (which its waits do
# not count) it renews within this long of waking.
LOOK_EVERY = 30.0


def _suspend_counting_clock() -> Callable[[], float]:
    """A monotonic clock that keeps counting while the machine sleeps: Linux's
    CLOCK_BOOTTIME, macOS's CLOCK_MONOTONIC (time.monotonic stops during a suspend on
    both)."""
    for name in ("CLOCK_BOOTTIME", "CLOCK_MONOTONIC"):
        clk = getattr(time, name, None)
        if clk is not None:
            try:
                time.clock_gettime(clk)
            except OSError:
                continue
            return lambda: time.clock_gettime(clk)
    return time.monotonic


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


@dataclass(frozen=True)
class Holder:
    hostname: str
    pid: int
    owner: str      # the state database that wrote it (same host + same owner = our past)
    instance: str   # one process's one acquisition
    since: float
    renewed: float
    ttl: float

    @classmethod
    def parse(cls, raw: bytes) -> Holder | None:
        try:
            d: Any = untrusted.loads(raw)
            times = [float(d[k]) for k in ("since", "renewed", "ttl")]
            if not all(math.isfinite(t) for t in times):
                return None  # "inf", "nan": no writer's; unreadable
            return cls(str(d["hostname"]), int(d["pid"]), str(d["owner"]), str(d["instance"]),
                       *times)
        except (ValueError, KeyError, TypeError):
            return None

    def describe(self) -> str:
        return f"host {self.hostname} pid {self.pid} (holding it since {_when(self.since)})"


class Lease:
    """The lease of one machine prefix. ``acquire``, then ``start`` the renewals;
    ``check`` before every write; ``release`` at the end."""

    def __init__(self, store: Store, machine: str, *, owner: str, ttl: float = DEFAULT_TTL,
                 takeover: bool = False, clock: Callable[[], float] = time.time,
                 elapsed: Callable[[], float] | None = None,
                 probe: Store | None = None) -> None:
        self.store = store
        self.probe = probe or store  # for verify(strict=False): one try, no retries
        self.machine = machine
        self.key = layout.lease_key(machine)
        self.where = f"{store.url}{self.key}"
        self.owner = owner
        self.ttl = ttl
        self.takeover = takeover
        self.clock = clock  # wall time: what the lease says, and a second age
        self.elapsed = elapsed or _suspend_counting_clock()
        self.hostname = socket.gethostname()
        self.instance = os.urandom(8).hex()
        self.etag: str | None = None
        self.since = 0.0
        self.lost: str | None = None
        # When our last confirmed write was sent: on ``elapsed`` and on the wall clock.
        self._confirmed = float("-inf")
        self._confirmed_wall = float("-inf")
        self._seen = float("-inf")  # on ``elapsed``: when the store last showed it ours
        self._renewing = threading.Lock()  # the thread's renewal and a writer's, one at a time
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _body(self) -> bytes:
        now = self.clock()
        return json.dumps({"machine": self.machine, "hostname": self.hostname,
                           "pid": os.getpid(), "owner": self.owner, "instance": self.instance,
                           "since": self.since or now, "renewed": now, "ttl": self.ttl},
                          indent=1).encode()

    def _current(self) -> tuple[Holder | None, str | None, bool]:
        """(holder, etag, exists) of the lease as it is in the store now."""
        info = self.store.head(self.key)
        if info is None:
            return None, None, False
        if info.size > LEASE_MAX:
            return None, info.etag, True  # not a lease syncd wrote: an unreadable holder
        try:
            raw = self.store.get(self.key, 0, LEASE_MAX)
        except NotFound:
            return None, None, False
        return Holder.parse(raw), info.etag, True

    # -- taking it ---------------------------------------------------------------------
    def acquire(self) -> None:
        for _ in range(5):
            holder, etag, exists = self._current()
            self.since = self.clock()
            sent = self._now()
            try:
                if not exists:
                    self.etag = self.store.put(self.key, self._body(), if_none_match=True)
                else:
                    self._may_take(holder)
                    assert etag is not None
                    self.etag = self.store.put(self.key, self._body(), if_match=etag)
            except PreconditionFailed:
                continue  # it changed hands while we looked: look again
            self._confirmed, self._confirmed_wall = sent
            self._seen = sent[0]
            log.debug("lease %s acquired", self.where)
            return
        raise LeaseHeld(f"{self.where}: the lease keeps changing hands; is another syncd "
                        f"with machine id {self.machine!r} starting?")

    def _may_take(self, holder: Holder | None) -> None:
        """Return when an existing lease may be taken over; raise LeaseHeld otherwise."""
        now = self.clock()
        if holder is None:
            if self.takeover:
                log.warning("%s: unreadable lease taken over (--takeover)", self.where)
                return
            raise LeaseHeld(f"{self.where}: the lease is unreadable; if no other syncd backs "
                            f"up machine {self.machine!r}, pass --takeover")
        if holder.owner == self.owner and holder.hostname == self.hostname:
            # Written through this state database, whose process lock we hold: its writer
            # is gone (killed, or the machine crashed).
            log.info("lease of machine %s left by an earlier run here (pid %d) taken over",
                     self.machine, holder.pid)
            return
        # The holder's word for how long its lease lasts goes no further than a writer's
        # (lease_ttl is at most an hour): a lease planted with a ttl of years expires too,
        # and so does one renewed "later" than a clock's skew allows.
        age = now - holder.renewed if holder.renewed <= now + TTL_MAX else TTL_MAX + 1.0
        ttl = min(holder.ttl, TTL_MAX)
        if age > ttl:
            log.warning("lease of machine %s held by %s expired %.0fs ago: taking it over",
                        self.machine, holder.describe(), age - ttl)
            return
        if self.takeover:
            log.warning("lease of machine %s taken over from %s (--takeover)", self.machine,
                        holder.describe())
            return
        raise LeaseHeld(
            f"machine {self.machine!r} is already being backed up by {holder.describe()}, "
            f"lease renewed {max(0.0, age):.0f}s ago ({self.where}); stop that syncd, or if "
            f"it is dead wait {max(0.0, ttl - age):.0f}s for the lease to expire or "
            "pass --takeover")

    # -- keeping it --------------------------------------------------------------------
    def _now(self) -> tuple[float, float]:
        return self.elapsed(), self.clock()

    def age(self) -> float:
        """Seconds since our last confirmed write was sent, by whichever of our clocks
        says longer: the suspend-counting one, or the wall clock (a VM paused by its
        host, a platform whose monotonic clock stops in a suspend)."""
        now, wall = self._now()
        return max(now - self._confirmed, wall - self._confirmed_wall)

    def renew(self) -> None:
        """One renewal; ``LeaseLost`` when someone else holds the lease now."""
        with self._renewing:
            if self.lost:
                raise LeaseLost(self.lost)
            sent = self._now()
            try:
                self.etag = self.store.put(self.key, self._body(), if_match=self.etag)
            except PreconditionFailed:
                holder, etag, _ = self._current()
                if holder is not None and holder.instance == self.instance:
                    self.etag = etag  # our own write, whose answer was lost
                else:
                    self._lose(holder)
            self._confirmed, self._confirmed_wall = sent
            self._seen = sent[0]

    def _lose(self, holder: Holder | None) -> None:
        who = holder.describe() if holder else "someone (the lease was removed)"
        self.lost = (f"lease of machine {self.machine!r} was taken over by {who}; "
                     "stopped writing")
        raise LeaseLost(self.lost)

    def check(self) -> None:
        """Before a write, without a store call: raise when we may not write now."""
        if self.lost:
            raise LeaseLost(self.lost)
        age = self.age()
        if age > self.ttl * SAFE_SHARE:
            raise LeaseStale(f"{self.where}: lease not renewed for {age:.0f}s (store "
                             "unreachable?); not writing until it is")

    def ensure(self) -> None:
        """Before each write attempt: ``check``, and when the lease is stale renew it
        first (one PUT), so a writer that slept past its TTL learns that it lost the
        lease (``LeaseLost``) before it writes anything. ``StoreError``: the renewal
        failed (store unreachable), nothing may be written yet."""
        try:
            self.check()
        except LeaseStale:
            self.renew()
            self.check()

    def verify(self, *, strict: bool = True) -> None:
        """One HEAD: is the lease in the store still the one we wrote? Not ``strict``
        (before a flush's first PUT): none when the store showed it ours in the last
        ``VERIFY_EVERY`` seconds; a store that does not answer it is left to the write
        itself, which fails the same way or finds the store back (the renewals still see
        a takeover); and the HEAD is made once, through ``probe``."""
        self.ensure()
        asked = self.elapsed()
        if not strict and asked - self._seen < VERIFY_EVERY:
            return
        try:
            info = (self.store if strict else self.probe).head(self.key)
        except StoreError as e:
            if strict:
                raise
            log.debug("lease %s not checked before the flush: %s", self.where, e)
            return
        if info is None or info.etag != self.etag:
            holder, _, _ = self._current()
            if holder is None or holder.instance != self.instance:
                self._lose(holder)
        self._seen = max(self._seen, asked)

    def start(self, on_lost: Callable[[str], None] = lambda msg: None) -> None:
        """Renew every ``ttl / 3`` (by ``age``) from a daemon thread until ``release``."""
        self._thread = threading.Thread(target=self._run, args=(on_lost,),
                                        name="syncd-lease", daemon=True)
        self._thread.start()

    def _run(self, on_lost: Callable[[str], None]) -> None:
        period = self.ttl / 3
        # Waits count no suspend: look at the clocks every LOOK_EVERY seconds and renew
        # once the last renewal is a third of the TTL old (a failed one: at the next look).
        while not self._stop.wait(max(0.0, min(period - self.age(), LOOK_EVERY))):
            if self.age() < period:
                continue
            try:
                self.renew()
            except LeaseLost as e:
                log.error("%s", e)
                on_lost(str(e))
                return
            except Exception as e:  # the thread must outlive any one failure
                log.warning("lease renewal failed, retrying in %.0fs: %s",
                            min(period, LOOK_EVERY), e)
                self._stop.wait(min(period, LOOK_EVERY))

    # -- giving it back ----------------------------------------------------------------
    def release(self) -> None:
        """Stop renewing; delete the lease if it is still ours (a clean stop)."""
        self._stop.set()
        if self._thread is not None:
            # A renewal in flight gives up within its store's deadline; one left running
            # may rewrite the lease after we delete it: it expires, or our state's next
            # run takes it at once.
            self._thread.join(timeout=min(self.ttl, LOOK_EVERY))
        if self.lost or self.etag is None:
            return
        try:
            info = self.store.head(self.key)
            if info is not None and info.etag == self.etag:
                self.store.delete_many([self.key])
        except StoreError as e:
            log.warning("could not release the lease (it expires by itself in %.0fs): %s",
                        self.ttl, e)
        self.etag = None


__all__ = ["Holder", "Lease", "LeaseError", "LeaseHeld", "LeaseLost",
           "LeaseStale"]

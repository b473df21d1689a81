"""One writer per machine id between real ``syncd run`` processes and a real SeaweedFS:
a second daemon refused, a killed one taken over within the TTL, a stopped one that
wakes after a takeover writing nothing, an idle one renewing at most once a third of the
TTL. The TTL is made short through the configuration (SYNCD_LEASE_TTL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from syncd.config import Settings
from syncd.security.lease import Holder
from syncd.store import Store
from syncd.store.layout import lease_key, segment_key
from tests.faultkit import (
    MACHINE,
    A,
    B,
    C,
    FaultProxy,
    cli,
    cli_env,
    indexes,
    line,
    make_settings,
    store_of,
    write,
)
from tests.helpers import shipped, wait_for
from tests.seaweed import Seaweed

TTL = 6.0  # renewed every 2 s
KEY = lease_key(MACHINE)


class Daemons:
    """``syncd -v run`` processes, each with its own state directory; all killed at the end."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.procs: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(self, s: Settings, *args: str) -> subprocess.Popen[bytes]:
        log = self.tmp / f"daemon-{len(self.procs)}.log"
        env = {**os.environ, **cli_env(s), "SYNCD_LEASE_TTL": str(TTL)}
        with open(log, "wb") as f:
            p = subprocess.Popen([sys.executable, "-m", "syncd", "-v", "run", *args], env=env,
                                 stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.procs.append((p, log))
        return p

    def log(self, p: subprocess.Popen[bytes]) -> str:
        return next(log for q, log in self.procs if q is p).read_text(errors="replace")

    def close(self) -> None:
        for p, _ in self.procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
                p.kill()
                p.wait()


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[Daemons]:
    d = Daemons(tmp_path)
    try:
        yield d
    finally:
        d.close()


def holder(store: Store) -> Holder | None:
    raw = store.get(KEY) if store.head(KEY) is not None else None
    return Holder.parse(raw) if raw is not None else None


def other(s: Settings, tmp_path: Path, name: str, endpoint: str) -> Settings:
    """The same machine id with another state directory and tree: another host, in effect."""
    src = tmp_path / f"src-{name}"
    src.mkdir(exist_ok=True)
    return s.model_copy(update={"state_dir": tmp_path / f"state-{name}", "source": src,
                                "s3_endpoint_url": endpoint})


def sync(s: Settings) -> subprocess.CompletedProcess[str]:
    return cli(s, "-v", "sync", env={"SYNCD_LEASE_TTL": str(TTL)})


def test_a_second_daemon_is_refused_and_a_killed_one_taken_over_within_the_ttl(
        tmp_path: Path, seaweed: Seaweed, bucket: str, daemons: Daemons) -> None:
    s = make_settings(tmp_path, store=f"s3://{bucket}/backup", endpoint=seaweed.endpoint)
    write(s.source, A, line(1))
    direct = store_of(s)
    first = daemons.start(s)
    wait_for(lambda: shipped(s, A) == len(line(1)), 60, "the first daemon's backup",
             explain=lambda: daemons.log(first))
    h = holder(direct)
    assert h is not None and h.pid == first.pid and h.ttl == TTL

    b = other(s, tmp_path, "b", seaweed.endpoint)
    write(b.source, B, line(2))
    second = daemons.start(b)
    assert second.wait(60) == 1
    assert f"already being backed up by host {h.hostname} pid {first.pid}" in \
        daemons.log(second)

    os.kill(first.pid, signal.SIGKILL)
    killed = time.time()
    assert first.wait(10) == -signal.SIGKILL
    last = holder(direct)
    assert last is not None and last.instance == h.instance
    # Until renewed + ttl the dead holder's lease still refuses another writer...
    if time.time() < last.renewed + TTL - 2.0:  # (sync starts in well under 2 s)
        r = sync(b)
        assert r.returncode == 1 and "already being backed up" in r.stderr, r.stderr
    # ...and once it is past, the next one takes it over: within TTL of the kill.
    r = wait_for(lambda: (lambda r: r if r.returncode == 0 else None)(sync(b)), TTL + 30,
                 "a takeover once the lease expired", interval=0.2)
    took = time.time()
    assert "expired" in r.stderr and "taking it over" in r.stderr, r.stderr
    assert took - killed <= TTL + 10  # the TTL, plus one sync's start-up on a busy machine
    now = holder(direct)
    assert now is None or now.instance != h.instance  # released by sync, or held by it
    assert shipped(b, B) == len(line(2))


def test_a_stopped_daemon_that_wakes_after_a_takeover_writes_nothing(
        tmp_path: Path, seaweed: Seaweed, bucket: str, proxy: FaultProxy,
        daemons: Daemons) -> None:
    """SIGSTOP while a segment's PUT is on its way (held by the proxy, never forwarded),
    past the TTL; another writer takes the lease over and writes; SIGCONT. The woken
    daemon's upload fails and would be retried: before the retry its lease is found
    stale, renewing it finds it lost, and it exits 1 with no write sent after the wake."""
    s = make_settings(tmp_path, store=f"s3://{bucket}/backup", endpoint=proxy.url)
    write(s.source, A, line(1))
    direct = store_of(s, seaweed.endpoint)
    first = daemons.start(s)
    wait_for(lambda: shipped(s, A) == len(line(1)), 60, "the first daemon's backup",
             explain=lambda: daemons.log(first))
    segments = "/" + segment_key(MACHINE, 0).rsplit("/", 1)[0] + "/"
    proxy.hold = lambda method, path: method == "PUT" and segments in path
    proxy.hold_forwards = False
    write(s.source, C, line(3))  # a flush: its segment's PUT is held
    assert proxy.held.wait(30), daemons.log(first)
    os.kill(first.pid, signal.SIGSTOP)
    try:
        h = holder(direct)
        assert h is not None and h.pid == first.pid
        wait_for(lambda: time.time() > h.renewed + TTL + 0.5, TTL + 10, "the lease to expire")
        b = other(s, tmp_path, "b", seaweed.endpoint)
        write(b.source, B, line(2))
        second = daemons.start(b)  # holds the lease while the first daemon wakes
        wait_for(lambda: shipped(b, B) == len(line(2)), 60, "the second daemon's backup",
                 explain=lambda: daemons.log(second))
        assert "taking it over" in daemons.log(second)
        mark = len(proxy.log)
    finally:
        os.kill(first.pid, signal.SIGCONT)
    proxy.release.set()  # the held PUT is dropped unanswered: the daemon would retry
    proxy.hold = None
    assert first.wait(60) == 1, daemons.log(first)
    out = daemons.log(first)
    assert "was taken over by host" in out, out
    after = [(m, p, st) for m, p, st in proxy.log[mark:] if m in ("PUT", "POST", "DELETE")]
    assert all(p.split("?")[0].endswith("/" + KEY) and st == 412 for _m, p, st in after), after
    written = {e.path for _key, ix in indexes(direct) for e in ix.extents}
    assert A in written and B in written and C not in written
    assert second.poll() is None, daemons.log(second)  # the new holder keeps on
    took = holder(direct)
    assert took is not None and took.pid == second.pid


def test_an_idle_daemon_renews_its_lease_once_a_third_of_the_ttl(
        tmp_path: Path, seaweed: Seaweed, bucket: str, proxy: FaultProxy,
        daemons: Daemons) -> None:
    """Idle, the lease is all a daemon writes: one PUT every TTL / 3 (at the default TTL,
    12 an hour), no HEAD or GET of it, nothing else written."""
    s = make_settings(tmp_path, store=f"s3://{bucket}/backup", endpoint=proxy.url)
    write(s.source, A, line(1))
    first = daemons.start(s)
    wait_for(lambda: shipped(s, A) == len(line(1)), 60, "the first daemon's backup",
             explain=lambda: daemons.log(first))

    def lease_puts() -> int:
        return sum(1 for m, p, st in list(proxy.log)
                   if m == "PUT" and p.split("?")[0].endswith("/" + KEY))

    # From a renewal on, for three TTLs: nine periods.
    start = lease_puts()
    wait_for(lambda: lease_puts() > start, TTL, "a renewal")
    mark, t0 = len(proxy.log), time.monotonic()
    window = 3 * TTL
    wait_for(lambda: time.monotonic() - t0 >= window, window + 5, "the idle window")
    seen = list(proxy.log)[mark:]
    elapsed = time.monotonic() - t0
    assert first.poll() is None, daemons.log(first)
    lease = [(m, st) for m, p, st in seen if p.split("?")[0].endswith("/" + KEY)]
    writes = [(m, p) for m, p, _st in seen if m in ("PUT", "POST", "DELETE")]
    periods = elapsed / (TTL / 3)
    assert lease and all(m == "PUT" and st == 200 for m, st in lease), lease
    assert len(writes) == len(lease), writes
    # A renewal each period (a second daemon is still refused), and no more.
    assert periods - 2 <= len(lease) <= periods + 1, (len(lease), periods)

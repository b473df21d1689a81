"""One writer per machine prefix: the lease object, its renewals and takeovers."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from syncd.backup.engine import Engine, sync_once
from syncd.config import Settings, load_settings
from syncd.errors import LeaseHeld, LeaseLost, LeaseStale, TransientError
from syncd.security.lease import Holder, Lease
from syncd.store import LocalStore, MemoryStore, ObjectInfo, Store
from tests.helpers import LosesAnswers, all_extents, start_daemon, wait_for, write

KEY = "machines/m1/lease.json"


class Clock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def lease(store: Store, owner: str = "owner-a", clock: Clock | None = None, ttl: float = 30.0,
          takeover: bool = False) -> Lease:
    return Lease(store, "m1", owner=owner, ttl=ttl, takeover=takeover, clock=clock or Clock())


@pytest.fixture(params=["memory", "local"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    return MemoryStore() if request.param == "memory" else LocalStore(tmp_path / "store")


def test_second_holder_is_refused_and_told_who_holds_it(store: Store) -> None:
    clock = Clock()
    a = lease(store, "owner-a", clock)
    a.acquire()
    holder = Holder.parse(store.get(KEY))
    assert holder is not None and holder.owner == "owner-a" and holder.ttl == 30.0
    b = lease(store, "owner-b", clock)
    with pytest.raises(LeaseHeld) as info:
        b.acquire()
    msg = str(info.value)
    assert f"host {a.hostname} pid " in msg and "holding it since" in msg
    assert "--takeover" in msg and KEY in msg
    a.check()  # still ours


def test_expired_lease_is_taken_over_and_the_old_holder_loses(
        store: Store, caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    a = lease(store, "owner-a", clock)
    a.acquire()
    clock.t += 31  # a stopped renewing (killed)
    b = lease(store, "owner-b", clock)
    b.acquire()
    assert "expired" in caplog.text and "taking it over" in caplog.text
    with pytest.raises(LeaseLost, match="taken over by host"):
        a.renew()
    with pytest.raises(LeaseLost):
        a.check()  # no more writes from a
    b.renew()
    b.check()


def test_takeover_flag_takes_a_live_lease(store: Store) -> None:
    clock = Clock()
    a = lease(store, "owner-a", clock)
    a.acquire()
    b = lease(store, "owner-b", clock, takeover=True)
    b.acquire()
    with pytest.raises(LeaseLost):
        a.verify()


def test_same_state_takes_over_its_own_leftover_at_once(store: Store) -> None:
    """A lease left by a killed run of the same state database (whose process lock we
    now hold) is ours to take: no waiting for the TTL."""
    clock = Clock()
    lease(store, "owner-a", clock).acquire()  # killed: never released
    again = lease(store, "owner-a", clock)
    again.acquire()
    again.check()


def test_release_deletes_only_our_own_lease(store: Store) -> None:
    clock = Clock()
    a = lease(store, "owner-a", clock)
    a.acquire()
    a.release()
    assert store.head(KEY) is None
    a2 = lease(store, "owner-a", clock)
    a2.acquire()
    b = lease(store, "owner-b", clock, takeover=True)
    b.acquire()
    a2.release()  # not ours any more: left alone
    holder = Holder.parse(store.get(KEY))
    assert holder is not None and holder.owner == "owner-b"


def test_renewal_whose_answer_was_lost_is_still_ours() -> None:
    store = LosesAnswers()
    a = lease(store)
    a.acquire()
    store.lose = 1
    with pytest.raises(TransientError):
        a.renew()  # landed, but we were told it failed: our etag is stale now
    a.renew()      # 412 on the stale etag, but the lease holds our instance: still ours
    a.check()


def test_unrenewed_lease_stops_writes_until_renewed() -> None:
    store = MemoryStore()
    a = lease(store, ttl=1.0)
    a.acquire()
    a._confirmed -= 0.9  # as if the last renewal was confirmed 0.9 s ago
    with pytest.raises(LeaseStale, match="not renewed"):
        a.check()
    a.renew()
    a.check()


def test_unreadable_lease_needs_takeover(store: Store) -> None:
    store.put(KEY, b"not json")
    with pytest.raises(LeaseHeld, match="unreadable"):
        lease(store).acquire()
    lease(store, takeover=True).acquire()


@pytest.mark.parametrize(("renewed", "ttl", "taken"), [
    (1_000_000.0 - 7200, 10 * 365 * 86400.0, True),  # a ttl no writer has: an hour at most
    (1e300, 30.0, True),  # "renewed" long after any clock's now: long past
    ("inf", 30.0, False), (1_000_000.0, "nan", False),  # not a time: unreadable
    (1_000_000.0 - 10, 30.0, False),  # a live lease of a writer
])
def test_a_lease_holders_times_count_no_further_than_a_writers(
        store: Store, renewed: object, ttl: object, taken: bool) -> None:
    doc = {"machine": "m1", "hostname": "elsewhere", "pid": 1, "owner": "0" * 32,
           "instance": "0" * 16, "since": 1.0, "renewed": renewed, "ttl": ttl}
    store.put(KEY, json.dumps(doc).encode())
    if taken:
        lease(store).acquire()
    else:
        with pytest.raises(LeaseHeld):
            lease(store).acquire()


def test_renewal_thread_reports_a_takeover() -> None:
    store = MemoryStore()
    a = Lease(store, "m1", owner="a", ttl=1.5)
    a.acquire()
    lost = threading.Event()
    a.start(lambda msg: lost.set())
    Lease(store, "m1", owner="b", ttl=1.5, takeover=True).acquire()
    assert lost.wait(5)
    a.release()
    holder = Holder.parse(store.get(KEY))
    assert holder is not None and holder.owner == "b"


# -- through the engine -----------------------------------------------------------------

def settings(tmp_path: Path, state: str, **kw: object) -> Settings:
    (tmp_path / "src").mkdir(exist_ok=True)
    base: dict[str, object] = dict(source=tmp_path / "src", store=(tmp_path / "store").as_uri(),
                                   state_dir=tmp_path / state, machine_id="m1",
                                   flush_quiet=0.1, flush_max_delay=0.5, lease_ttl=3.0)
    base.update(kw)
    return load_settings(config_file=tmp_path / "none.toml", **base)


def test_two_state_dirs_same_machine_id_one_writer(tmp_path: Path) -> None:
    first = settings(tmp_path, "state-a")
    second = settings(tmp_path, "state-b")
    write(first.source, "history.jsonl", b"line\n")
    engine = Engine(first)
    try:
        with pytest.raises(LeaseHeld, match="already being backed up by host"):
            sync_once(second)
        assert json.loads(LocalStore(tmp_path / "store").get(KEY))["pid"] > 0
    finally:
        engine.close()
    assert LocalStore(tmp_path / "store").head(KEY) is None  # released on a clean stop
    assert sync_once(second).files == 1


def test_a_daemon_refused_by_a_held_lease_never_says_it_is_running(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    s = settings(tmp_path, "state-a")
    Lease(LocalStore(tmp_path / "store"), "m1", owner="other", ttl=60.0).acquire()
    caplog.set_level(logging.INFO, logger="syncd")
    dt = start_daemon(s)
    dt.thread.join(15)
    assert not dt.thread.is_alive()
    assert len(dt.errors) == 1 and isinstance(dt.errors[0], LeaseHeld), dt.errors
    said = [r.getMessage() for r in caplog.records]
    assert not [m for m in said if "syncd running" in m], said


def test_daemon_whose_lease_is_taken_exits_with_the_reason(tmp_path: Path) -> None:
    s = settings(tmp_path, "state-a")
    dt = start_daemon(s)
    t, errors = dt.thread, dt.errors
    store = LocalStore(tmp_path / "store")
    wait_for(lambda: store.head(KEY) is not None, what="the daemon's lease")
    Lease(store, "m1", owner="intruder", ttl=3.0, takeover=True).acquire()
    t.join(15)
    assert not t.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], LeaseLost)
    assert "taken over by host" in str(errors[0])
    holder = Holder.parse(store.get(KEY))
    assert holder is not None and holder.owner == "intruder"  # not deleted on the way out


def test_store_down_at_start_then_the_lease_is_taken_while_idle(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store that is down at boot does not fail the start; once it is back the daemon
    takes its lease even though nothing changed (so a second writer is still refused)."""
    import syncd.backup.engine
    from syncd.store import RetryStore

    down = threading.Event()
    down.set()

    class Flaky(LocalStore):
        def list(self, prefix: str, start_after: str = "") -> Iterator[ObjectInfo]:
            if down.is_set():
                raise TransientError("connection refused")
            return super().list(prefix, start_after)

    def fake_open(url: str, **kw: object) -> RetryStore:
        return RetryStore(Flaky(tmp_path / "store"), deadline=0.2)

    monkeypatch.setattr(syncd.backup.engine, "open_store", fake_open)
    s = settings(tmp_path, "state-a")
    dt = start_daemon(s)
    try:
        store = LocalStore(tmp_path / "store")
        time.sleep(1.0)
        assert dt.thread.is_alive() and store.head(KEY) is None
        down.clear()
        wait_for(lambda: store.head(KEY) is not None, what="the lease once the store is back")
    finally:
        dt.stop(15)
    assert not dt.thread.is_alive() and dt.daemon.fatal is None


# -- a long TTL: what a writer checks before it writes -----------------------------------

def test_a_holder_that_slept_past_its_ttl_writes_nothing_once_taken_over() -> None:
    """A laptop suspended for 20 minutes: the wall clock counts the sleep (time.monotonic
    does not). Someone took the expired lease over meanwhile; before its next write the
    sleeper sees its lease is stale, and renewing it tells it that it lost it."""
    store = MemoryStore()
    wall = Clock()
    a = lease(store, "owner-a", wall, ttl=900.0)
    a.acquire()
    a.check()
    wall.t += 1200
    lease(store, "owner-b", wall, ttl=900.0).acquire()  # expired: taken over
    with pytest.raises(LeaseStale):
        a.check()
    with pytest.raises(LeaseLost, match="taken over by host"):
        a.ensure()
    with pytest.raises(LeaseLost):
        a.check()


def test_a_stale_lease_still_ours_is_renewed_before_the_write() -> None:
    store = MemoryStore()
    wall = Clock()
    a = lease(store, "owner-a", wall, ttl=900.0)
    a.acquire()
    wall.t += 800  # past SAFE_SHARE of the TTL, nobody took it
    with pytest.raises(LeaseStale):
        a.check()
    a.ensure()  # one renewal, then the write may go
    a.check()
    holder = Holder.parse(store.get(KEY))
    assert holder is not None and holder.renewed == wall.t


@pytest.mark.skipif(not hasattr(time, "CLOCK_BOOTTIME"), reason="Linux's suspend-counting clock")
def test_lease_ages_are_measured_on_a_clock_that_counts_a_suspend() -> None:
    a = Lease(MemoryStore(), "m1", owner="a")
    assert abs(a.elapsed() - time.clock_gettime(time.CLOCK_BOOTTIME)) < 1.0


def test_a_retried_write_is_not_sent_once_the_lease_is_lost() -> None:
    """The fence runs before every attempt: a PUT that failed once and would be retried
    after the lease was taken over is never sent again."""
    from syncd.store import RetryStore

    sent: list[str] = []

    class FailsOnce(MemoryStore):
        def put(self, key: str, data: bytes, *, if_none_match: bool = True,
                if_match: str | None = None) -> str:
            sent.append(key)
            if len(sent) == 1:
                raise TransientError("connection reset")
            return super().put(key, data, if_none_match=if_none_match, if_match=if_match)

    lost = threading.Event()

    def fence() -> None:
        if lost.is_set():
            raise LeaseLost("taken over")
        lost.set()  # taken over while the first attempt was on its way

    store = RetryStore(FailsOnce(), deadline=5.0, base=0.01)
    store.fence = fence
    with pytest.raises(LeaseLost):
        store.put("machines/m1/segments/0000000000000000", b"x")
    assert sent == ["machines/m1/segments/0000000000000000"]
    with pytest.raises(LeaseLost):
        store.delete_many(["machines/m1/segments/0000000000000000"])
    assert store.inner.head("machines/m1/segments/0000000000000000") is None


def test_default_lease_costs_at_most_12_puts_an_hour() -> None:
    ttl = Settings.model_fields["lease_ttl"].default
    assert ttl <= 900.0  # a dead holder elsewhere is taken over within 15 minutes
    assert 3600 / (ttl / 3) <= 12


def test_a_takeover_stops_the_old_holder_before_its_next_segment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the default TTL the old holder's next renewal is minutes away; the HEAD
    before a flush's first PUT (once the lease was last seen ours VERIFY_EVERY ago) is
    what stops it writing once someone used --takeover."""
    import syncd.security.lease

    monkeypatch.setattr(syncd.security.lease, "VERIFY_EVERY", 1.0, raising=False)
    s = settings(tmp_path, "state-a", lease_ttl=900.0)
    store = LocalStore(tmp_path / "store")
    write(s.source, "history.jsonl", b"one\n")
    dt = start_daemon(s)
    try:
        wait_for(lambda: any(e.path == b"history.jsonl" for e in all_extents(store)),
                 what="the first flush")
        seen = time.monotonic()  # the lease was last seen ours before this
        Lease(store, "m1", owner="intruder", ttl=900.0, takeover=True).acquire()
        wait_for(lambda: time.monotonic() - seen > 1.0, what="VERIFY_EVERY to pass")
        write(s.source, "history.jsonl", b"two\n", "ab")
        dt.thread.join(15)
        assert not dt.thread.is_alive()
    finally:
        dt.stop()
    assert len(dt.errors) == 1 and isinstance(dt.errors[0], LeaseLost), dt.errors
    assert max(e.end for e in all_extents(store)) == len(b"one\n")  # "two" never shipped

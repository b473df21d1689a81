"""`syncd status` as a reader sees it: a time that is not today's shows its date; lag is the
age of the oldest pending change."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from syncd.backup.state import State
from syncd.config import Settings, load_settings
from syncd.security.lock import ProcessLock
from syncd.service.status import clock, format_status, status
from tests.helpers import start_daemon, wait_for, write

HOUR, DAY = 3600.0, 86400.0


def local(y: int, mo: int, d: int, h: int, mi: int = 0) -> float:
    """Epoch seconds of a local wall-clock time (mid-June: no DST change on any side)."""
    return time.mktime((y, mo, d, h, mi, 0, 0, 0, -1))


NOON = local(2026, 6, 15, 12)
LATE = local(2026, 6, 15, 23, 30)


def test_a_time_of_another_day_shows_its_date() -> None:
    assert clock(NOON + HOUR, NOON) == "13:00:00"
    assert clock(NOON - 11 * HOUR, NOON) == "01:00:00"
    assert clock(NOON + DAY, NOON) == "2026-06-16 12:00:00"
    assert clock(NOON - DAY, NOON) == "2026-06-14 12:00:00"
    # An hour from 23:30 is tomorrow; a year from now is another 15 June.
    assert clock(LATE + HOUR, LATE) == "2026-06-16 00:30:00"
    assert clock(NOON + 365 * DAY, NOON) == "2027-06-15 12:00:00"


def figures(now: float, **changes: Any) -> dict[str, Any]:
    s: dict[str, Any] = {
        "machine_id": "m1", "source": "/home/a/.claude", "store": "s3://b/p",
        "daemon_pid": 42, "running": True, "lag_seconds": 0.0,
        "last_flush_time": now - 30, "last_flush_seq": 7, "files_tracked": 3,
        "files_deleted": 0, "bytes_shipped": 10, "bytes_pending": 0, "files_pending": 0,
        "last_error": None, "last_error_time": None, "errors_last_hour": 0,
        "store_repair": None, "store_repair_time": None, "store_reachable": True,
        "encrypted": False, "last_compaction_time": now - 3 * DAY,
        "last_prune_time": now - HOUR, "last_verify_time": None,
        "next_jobs": {"reconcile": now + HOUR / 2, "compaction": now + 600,
                      "prune": now + DAY, "verify": now + 7 * DAY}}
    s.update(changes)
    return s


def line(text: str, label: str) -> str:
    [found] = [ln for ln in text.splitlines() if ln.startswith(f"{label}:")]
    return found


def test_status_shows_dates_of_other_days_and_only_times_of_today() -> None:
    text = format_status(figures(NOON), now=NOON)
    assert line(text, "last flush") == "last flush:   11:59:30 (30s ago), seq 7"
    assert line(text, "compaction") == "compaction:   2026-06-12 12:00:00 (3d ago)"
    assert line(text, "prune") == "prune:        11:00:00 (1h ago)"
    assert line(text, "verify") == "verify:       never"
    assert line(text, "next jobs") == (
        "next jobs:    reconcile scan 12:30:00 (in 30m); compaction 12:10:00 (in 10m); "
        "prune 2026-06-16 12:00:00 (in 1d); verify 2026-06-22 12:00:00 (in 7d)")


def test_status_late_in_the_day_dates_what_comes_after_midnight() -> None:
    s = figures(LATE, last_error="store unreachable", last_error_time=LATE - DAY,
                next_jobs={"reconcile": LATE + HOUR, "compaction": LATE + 600,
                           "prune": None, "verify": None})
    text = format_status(s, now=LATE)
    assert line(text, "last error") == \
        "last error:   store unreachable (2026-06-14 23:30:00 (1d ago))"
    assert line(text, "next jobs") == (
        "next jobs:    reconcile scan 2026-06-16 00:30:00 (in 1h); compaction 23:40:00 "
        "(in 10m); prune not scheduled; verify not scheduled")


def test_health_is_judged_as_of_now() -> None:
    repaired = figures(NOON, store_repair="3 segments shipped again",
                       store_repair_time=NOON - HOUR)
    assert "the store lost segments" in line(format_status(repaired, now=NOON), "health")
    assert line(format_status(repaired, now=NOON + 2 * DAY), "health") == "health:       ok"


# -- lag -------------------------------------------------------------------------------------

REL = "projects/-home-a/0f8e4c2a-1b3d-4e5f-8a9b-0c1d2e3f4a5b.jsonl"


def test_lag_is_the_age_of_the_oldest_pending_change_a_growing_file_too(
        tmp_path: Path) -> None:
    """A transcript Claude keeps writing has an mtime of now: the daemon's word of when
    it first saw the change (pending_since) says how long it has waited."""
    s = load_settings(Path(os.devnull), source=tmp_path / "src", state_dir=tmp_path / "state",
                      store=(tmp_path / "store").as_uri(), machine_id="m1")
    write(s.source, REL, b'{"a":1}\n')  # its mtime: now
    lock = ProcessLock(s.state_file.with_suffix(".lock"))
    lock.acquire()  # as a running daemon holds it
    try:
        st = State(s.state_file)
        st.set_meta(pending_since=repr(time.time() - 300))
        st.close()
        figs = status(s)
    finally:
        lock.release()
    assert figs["files_pending"] == 1 and figs["lag_seconds"] >= 300, figs
    assert line(format_status(figs), "lag") == "lag:          5m since the oldest pending change"
    # No daemon: its word is old news; the mtime's lower bound is all there is.
    assert status(s)["lag_seconds"] < 300


def test_lag_of_a_pending_deletion_is_not_nothing_pending() -> None:
    text = format_status(figures(NOON, files_pending=1, bytes_pending=0, lag_seconds=0.0),
                         now=NOON)
    assert line(text, "lag") == "lag:          0s since the oldest pending change"
    assert line(format_status(figures(NOON), now=NOON), "lag") == \
        "lag:          0s (nothing pending)"


def pending_since(s: Settings) -> str | None:
    """What the daemon's state says of its oldest pending change (None: no state yet)."""
    if not s.state_file.exists():
        return None
    st = State(s.state_file, readonly=True)
    try:
        return st.meta("pending_since")
    finally:
        st.close()


def test_the_daemon_says_since_when_changes_are_pending(tmp_path: Path) -> None:
    s = load_settings(Path(os.devnull), source=tmp_path / "src", state_dir=tmp_path / "state",
                      store=(tmp_path / "store").as_uri(), machine_id="m1",
                      flush_quiet=3600.0, flush_max_delay=3600.0)
    (tmp_path / "src").mkdir()

    dt = start_daemon(s)
    try:
        wait_for(lambda: dt.daemon._ready, what="daemon start")
        assert not pending_since(s)
        before = time.time()
        write(s.source, REL, b'{"a":1}\n')
        published = float(wait_for(lambda: pending_since(s), what="pending_since"))
        assert before - 1 <= published <= time.time()
        assert status(s)["lag_seconds"] >= time.time() - published - 1
        dt.daemon.request_scan()  # its flush ships everything: nothing pending then
        wait_for(lambda: pending_since(s) == "", what="pending_since cleared by the flush")
    finally:
        dt.stop()
    assert not dt.thread.is_alive() and not dt.errors, dt.errors


def test_a_dead_daemons_pending_since_is_not_the_next_ones(tmp_path: Path) -> None:
    """A daemon that died with changes pending left its pending_since: the next one,
    with nothing pending, says so (else status, seeing a change before that daemon
    does, would call it days old)."""
    s = load_settings(Path(os.devnull), source=tmp_path / "src", state_dir=tmp_path / "state",
                      store=(tmp_path / "store").as_uri(), machine_id="m1")
    (tmp_path / "src").mkdir()
    st = State(s.state_file)
    st.set_meta(pending_since=repr(time.time() - 3 * DAY))
    st.close()

    dt = start_daemon(s)
    try:
        wait_for(lambda: dt.daemon._ready, what="daemon start")
        wait_for(lambda: pending_since(s) == "", timeout=10, what="the dead daemon's word cleared",
                 explain=lambda: f"pending_since {pending_since(s)!r}")
    finally:
        dt.stop()
    assert not dt.thread.is_alive() and not dt.errors, dt.errors

"""`syncd status` as a reader sees it: a time that is not today's shows its date."""

from __future__ import annotations

import time
from typing import Any

from syncd.service.status import clock, format_status

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

"""Retention policy: which snapshots each rule keeps, and the refusals."""

from __future__ import annotations

import random
import re
from datetime import datetime

import pytest

from syncd.archive.retention import (
    EMPTY_REASON,
    FORGOTTEN_REASON,
    Policy,
    SnapRef,
    Verdict,
    plan,
)
from syncd.duration import parse_duration
from syncd.errors import ConfigError, PolicyError

HOUR = 3600.0
DAY = 86400.0


def at(when: str) -> float:
    """Epoch seconds of a UTC time written as ISO 8601 without a zone."""
    return datetime.fromisoformat(when + "+00:00").timestamp()


def snap(seq: int, when: str | float) -> SnapRef:
    t = at(when) if isinstance(when, str) else when
    return SnapRef(key=f"machines/m/snap/{seq:016x}-0000", seq=seq, time=t)


def kept(verdicts: list[Verdict]) -> list[int]:
    return [v.snap.seq for v in verdicts if v.keep]


def why(verdicts: list[Verdict]) -> dict[int, tuple[str, ...]]:
    return {v.snap.seq: v.reasons for v in verdicts}


def test_verdicts_come_newest_first_by_time_then_seq() -> None:
    snaps = [snap(1, "2026-03-01T10:00:00"), snap(2, "2026-03-01T12:00:00"),
             snap(3, "2026-03-01T12:00:00"), snap(4, "2026-03-01T11:00:00"),
             snap(5, "2026-02-01T00:00:00")]
    random.Random(7).shuffle(snaps)
    verdicts = plan(snaps, Policy(keep_last=2))
    assert [v.snap.seq for v in verdicts] == [3, 2, 4, 1, 5]
    assert kept(verdicts) == [3, 2]


def test_no_snapshots_gives_no_verdicts() -> None:
    assert plan([], Policy(keep_last=3)) == []
    assert plan(iter(()), Policy()) == []


def test_empty_policy_keeps_everything() -> None:
    snaps = [snap(i, 1_000_000.0 + i * DAY) for i in range(5)]
    verdicts = plan(snaps, Policy())
    assert kept(verdicts) == [4, 3, 2, 1, 0]
    assert why(verdicts)[4] == ("newest", EMPTY_REASON)
    assert all(v.reasons == (EMPTY_REASON,) for v in verdicts[1:])


def test_newest_is_kept_and_named_whatever_the_policy() -> None:
    snaps = [snap(1, "2026-01-01T00:00:00"), snap(2, "2026-01-01T00:30:00")]
    verdicts = plan(snaps, Policy(keep_monthly=1))
    assert why(verdicts) == {2: ("newest", "monthly 1/1"), 1: (FORGOTTEN_REASON,)}
    assert [v.keep for v in verdicts] == [True, False]
    # A lone snapshot is kept even by a policy whose rules match nothing.
    (only,) = plan([snap(9, 1.7e9)], Policy(keep_within=1e-9))
    assert only.keep and only.reasons == ("newest",)


def test_keep_last_keeps_the_n_newest() -> None:
    snaps = [snap(i, 1_000_000.0 + i) for i in range(6)]
    verdicts = plan(snaps, Policy(keep_last=3))
    assert kept(verdicts) == [5, 4, 3]
    assert why(verdicts)[3] == ("last 3/3",)
    assert why(verdicts)[2] == (FORGOTTEN_REASON,)
    # More than there are: all kept, the count still says what the policy asked for.
    assert why(plan(snaps[:2], Policy(keep_last=3)))[0] == ("last 2/3",)


def test_keep_within_is_measured_from_the_newest_snapshot_not_the_clock() -> None:
    # Years in the past: by the wall clock nothing is within 2 days.
    newest = at("2001-06-10T12:00:00")
    snaps = [snap(5, newest), snap(4, newest - HOUR), snap(3, newest - 2 * DAY + 1),
             snap(2, newest - 2 * DAY), snap(1, newest - 3 * DAY)]
    verdicts = plan(snaps, Policy(keep_within=2 * DAY))
    # "Newer than" the cutoff: one exactly 2 days older is out.
    assert kept(verdicts) == [5, 4, 3]
    assert why(verdicts)[5] == ("newest", "within 2d")
    assert why(verdicts)[3] == ("within 2d",)
    assert why(verdicts)[2] == (FORGOTTEN_REASON,)


def test_hourly_buckets_split_at_the_hour() -> None:
    snaps = [snap(1, "2026-03-01T09:59:59"), snap(2, "2026-03-01T10:00:00"),
             snap(3, "2026-03-01T10:59:59"), snap(4, "2026-03-01T11:00:00")]
    verdicts = plan(snaps, Policy(keep_hourly=3))
    # 10:00 and 10:59:59 share an hour: only the later one is kept for it.
    assert kept(verdicts) == [4, 3, 1]
    assert why(verdicts) == {4: ("newest", "hourly 1/3"), 3: ("hourly 2/3",),
                             2: (FORGOTTEN_REASON,), 1: ("hourly 3/3",)}


def test_daily_buckets_split_at_utc_midnight_and_stop_after_n_days() -> None:
    snaps = [snap(1, "2026-03-01T08:00:00"), snap(2, "2026-03-01T23:59:59"),
             snap(3, "2026-03-02T00:00:00"), snap(4, "2026-03-02T13:00:00"),
             snap(5, "2026-03-03T01:00:00"), snap(6, "2026-03-03T02:00:00")]
    verdicts = plan(snaps, Policy(keep_daily=2))
    assert kept(verdicts) == [6, 4]
    assert why(verdicts)[4] == ("daily 2/2",)
    assert not why(verdicts)[2][0].startswith("daily")  # a third day is beyond N
    assert kept(plan(snaps, Policy(keep_daily=3))) == [6, 4, 2]


def test_weekly_buckets_follow_iso_weeks_across_the_new_year() -> None:
    # 2026-12-28 (Mon) to 2027-01-03 (Sun) is ISO week 53 of 2026; 2027-01-04 starts week 1.
    snaps = [snap(1, "2026-12-28T12:00:00"), snap(2, "2026-12-31T12:00:00"),
             snap(3, "2027-01-01T12:00:00"), snap(4, "2027-01-04T00:00:00")]
    weekly = plan(snaps, Policy(keep_weekly=2))
    assert kept(weekly) == [4, 3]
    assert why(weekly)[3] == ("weekly 2/2",)
    assert why(weekly)[2] == (FORGOTTEN_REASON,)
    # The same two days are different days, months and calendar years.
    assert kept(plan(snaps[1:3], Policy(keep_daily=2))) == [3, 2]
    assert kept(plan(snaps[1:3], Policy(keep_monthly=2))) == [3, 2]


def test_weekly_bucket_of_late_december_can_belong_to_next_iso_year() -> None:
    # 2024-12-30 (Mon) is in ISO week 1 of 2025, with 2025-01-01.
    snaps = [snap(1, "2024-12-29T12:00:00"), snap(2, "2024-12-30T12:00:00"),
             snap(3, "2025-01-01T12:00:00")]
    assert kept(plan(snaps, Policy(keep_weekly=3))) == [3, 1]


def test_monthly_buckets_split_at_the_month() -> None:
    snaps = [snap(1, "2026-01-15T00:00:00"), snap(2, "2026-01-31T23:59:59"),
             snap(3, "2026-02-01T00:00:00"), snap(4, "2026-02-28T10:00:00"),
             snap(5, "2026-03-01T00:00:00")]
    verdicts = plan(snaps, Policy(keep_monthly=2))
    assert kept(verdicts) == [5, 4]
    assert why(verdicts)[4] == ("monthly 2/2",)
    assert kept(plan(snaps, Policy(keep_monthly=12))) == [5, 4, 2]


def test_a_snapshot_kept_by_several_rules_lists_every_reason_in_order() -> None:
    newest = at("2026-03-02T10:30:00")
    snaps = [snap(6, newest), snap(5, newest - 10 * 60), snap(4, newest - HOUR),
             snap(3, newest - 3 * HOUR), snap(2, newest - DAY), snap(1, newest - 5 * DAY)]
    policy = Policy(keep_within=2 * HOUR, keep_last=2, keep_hourly=3, keep_daily=2,
                    keep_weekly=1, keep_monthly=2)
    verdicts = plan(snaps, policy)
    assert why(verdicts) == {
        6: ("newest", "within 2h", "last 1/2", "hourly 1/3", "daily 1/2", "weekly 1/1",
            "monthly 1/2"),
        5: ("within 2h", "last 2/2"),
        4: ("within 2h", "hourly 2/3"),
        3: ("hourly 3/3",),
        2: ("daily 2/2",),
        1: ("monthly 2/2",),  # 2026-02-25: February
    }
    assert all(v.keep for v in verdicts)


def test_a_policy_that_keeps_nothing_by_its_own_rules_is_refused() -> None:
    # A keep_within too small to move the cutoff off the newest time matches no snapshot:
    # only the "newest" safety rule would keep one.
    snaps = [snap(1, 1.7e9 - DAY), snap(2, 1.7e9)]
    with pytest.raises(PolicyError, match=r"^refusing: the policy \(within 1e-09s\) keeps "
                       r"none of the 2 snapshots; only the newest would survive$"):
        plan(snaps, Policy(keep_within=1e-9))


def test_a_policy_that_keeps_only_the_newest_by_its_own_rule_is_not_refused() -> None:
    snaps = [snap(1, 1.7e9 - DAY), snap(2, 1.7e9)]
    verdicts = plan(snaps, Policy(keep_last=1))
    assert why(verdicts) == {2: ("newest", "last 1/1"), 1: (FORGOTTEN_REASON,)}


def test_duplicate_keys_and_unusable_times_are_refused_with_the_key() -> None:
    a = snap(1, 1.7e9)
    with pytest.raises(PolicyError, match="0000000000000001-0000 is listed twice"):
        plan([a, a], Policy(keep_last=1))
    with pytest.raises(PolicyError, match="0000000000000002-0000 has no usable time"):
        plan([a, snap(2, float("nan"))], Policy(keep_last=1))
    with pytest.raises(PolicyError, match="0000000000000003-0000 has an out-of-range time"):
        plan([a, snap(3, 1e20)], Policy(keep_daily=1))


@pytest.mark.parametrize("kwargs, field", [
    ({"keep_within": -1.0}, "keep_within"),
    ({"keep_within": float("nan")}, "keep_within"),
    ({"keep_within": float("inf")}, "keep_within"),
    ({"keep_last": -1}, "keep_last"),
    ({"keep_hourly": -2}, "keep_hourly"),
    ({"keep_daily": 1.5}, "keep_daily"),
    ({"keep_weekly": True}, "keep_weekly"),
    ({"keep_monthly": -12}, "keep_monthly"),
])
def test_bad_policy_values_are_refused_naming_the_field(kwargs: dict[str, object],
                                                        field: str) -> None:
    with pytest.raises(PolicyError, match=f"^{field} must be"):
        Policy(**kwargs)  # type: ignore[arg-type]


def test_empty_and_describe() -> None:
    assert Policy().empty
    assert Policy().describe() == "keep everything"
    assert not Policy(keep_monthly=1).empty
    assert not Policy(keep_within=0.5).empty
    assert (Policy(keep_within=2 * DAY, keep_hourly=24, keep_daily=7).describe()
            == "within 2d, 24 hourly, 7 daily")
    assert (Policy(keep_within=parse_duration("36h"), keep_last=3, keep_weekly=4,
                   keep_monthly=12).describe()
            == "within 1d12h, last 3, 4 weekly, 12 monthly")
    assert Policy(keep_within=90.5).describe() == "within 1m30.5s"


@pytest.mark.parametrize("text", ["2d", "1d12h", "3h30m", "1m30.5s", "45s", "400d"])
def test_described_durations_read_back_the_same(text: str) -> None:
    assert Policy(keep_within=parse_duration(text)).describe() == f"within {text}"


@pytest.mark.parametrize("text, seconds", [
    ("90s", 90.0),
    ("30m", 30 * 60.0),
    ("36h", 36 * HOUR),
    ("7d", 7 * DAY),
    ("2w", 14 * DAY),
    ("1y2m3d", (365 + 60 + 3) * DAY),  # restic style: "m" between y and d is months
    ("2m3d", 63 * DAY),
    ("1y30m", (365 + 900) * DAY),
    ("3h30m", 3.5 * HOUR),
    ("1d30m", DAY + 1800),
    ("2mo", 60 * DAY),
    ("5min", 300.0),
    ("1d 12h", 1.5 * DAY),
    (" 7D ", 7 * DAY),
    ("1.5h", 1.5 * HOUR),
    ("0s", 0.0),
])
def test_parse_duration_accepts(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text, fragment", [
    ("", "empty"),
    ("   ", "empty"),
    ("7", "expected a number and a unit"),
    ("h", "expected a number and a unit"),
    ("-5m", "expected a number and a unit"),
    ("1.5.2h", "expected a number and a unit"),
    ("1e3s", "unknown unit 'e'"),
    ("5x", "unknown unit 'x'"),
    ("1h1d", "largest first"),
    ("1d1d", "once each"),
    ("1min1m", "once each"),
    ("9" * 400 + "y", "too large"),
])
def test_parse_duration_refuses_with_a_one_line_message(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_duration(text)
    message = str(err.value)
    assert fragment in message
    assert repr(text) in message
    assert "\n" not in message
    # Every unit list and example reads "m" as minutes, as "30m" does: months are "mo".
    if "unit" in message or "largest first" in message:
        assert "y, mo (months), w, d, h, m (minutes), s" in message, message
    assert not re.search(r"'[0-9a-z]*y[0-9]+m[0-9]", message), message

"""Which snapshots a retention policy keeps, like restic's ``forget`` policy.

Pure logic: the caller lists a machine's snapshots, asks ``plan`` for a verdict on each
and deletes the forgotten ones. Rules, each adding a reason to the snapshots it keeps:

- ``keep_within``: every snapshot newer than the newest one's time minus the duration.
  Measured from the newest snapshot, not the wall clock, so an idle machine keeps its
  history however long it stays off.
- ``keep_last N``: the N newest.
- ``keep_hourly/daily/weekly/monthly N``: walking newest first, the newest snapshot of
  each of the first N distinct UTC hours / UTC days / ISO weeks / UTC months.

The newest snapshot is always kept, and an all-zero policy keeps everything.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from syncd.errors import PolicyError

EMPTY_REASON = "empty policy: keep everything"
FORGOTTEN_REASON = "not matched by the policy"

_COUNTS = ("keep_last", "keep_hourly", "keep_daily", "keep_weekly", "keep_monthly")


def _hour(t: datetime) -> tuple[int, ...]:
    return (t.year, t.month, t.day, t.hour)


def _day(t: datetime) -> tuple[int, ...]:
    return (t.year, t.month, t.day)


def _iso_week(t: datetime) -> tuple[int, ...]:
    # The ISO year, not the calendar year: 2027-01-01 is in week 53 of 2026.
    iso = t.isocalendar()
    return (iso.year, iso.week)


def _month(t: datetime) -> tuple[int, ...]:
    return (t.year, t.month)


# (policy field, reason label, bucket of a UTC time), in the order reasons are listed.
_BUCKETS: tuple[tuple[str, str, Callable[[datetime], tuple[int, ...]]], ...] = (
    ("keep_hourly", "hourly", _hour),
    ("keep_daily", "daily", _day),
    ("keep_weekly", "weekly", _iso_week),
    ("keep_monthly", "monthly", _month),
)


@dataclass(frozen=True)
class Policy:
    keep_within: float = 0.0  # seconds before the newest snapshot's time (0: off)
    keep_last: int = 0
    keep_hourly: int = 0
    keep_daily: int = 0
    keep_weekly: int = 0
    keep_monthly: int = 0

    def __post_init__(self) -> None:
        within = self.keep_within
        if (isinstance(within, bool) or not isinstance(within, int | float)
                or not math.isfinite(within) or within < 0):
            raise PolicyError(f"keep_within must be a finite number of seconds >= 0, "
                              f"not {within!r}")
        for name in _COUNTS:
            n: object = getattr(self, name)
            # bool is an int; a float count from a config file is a mistake, not a count.
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise PolicyError(f"{name} must be a whole number >= 0, not {n!r}")

    def _count(self, name: str) -> int:
        """The value of one of the ``keep_*`` count fields, by name."""
        if name not in _COUNTS:
            raise PolicyError(f"no retention count named {name!r}")
        n: int = getattr(self, name)
        return n

    @property
    def window(self) -> float:
        """Seconds before the newest point in which every flush stays a point:
        ``keep_within``, or else the hourly window (``keep_hourly`` hours)."""
        return self.keep_within or self.keep_hourly * 3600.0

    @property
    def empty(self) -> bool:
        return not self.keep_within and not any(self._count(name) for name in _COUNTS)

    def describe(self) -> str:
        parts: list[str] = []
        if self.keep_within:
            parts.append(f"within {format_duration(self.keep_within)}")
        if self.keep_last:
            parts.append(f"last {self.keep_last}")
        for name, label, _ in _BUCKETS:
            if n := self._count(name):
                parts.append(f"{n} {label}")
        return ", ".join(parts) or "keep everything"


class PointLike(Protocol):
    """A point in time as ``retention_groups`` needs it (timeline.PointRow)."""

    seq: int
    time: float
    kind: str
    key: str


@dataclass(frozen=True)
class SnapRef:
    key: str  # object key, e.g. "machines/m/snap/000000000000002a-0000"
    seq: int
    time: float  # seconds since the epoch (when the snapshot's newest segment was built)


@dataclass(frozen=True)
class Verdict:
    snap: SnapRef
    keep: bool
    reasons: tuple[str, ...]  # why it is kept, or why not


def plan(snaps: Iterable[SnapRef], policy: Policy) -> list[Verdict]:
    """A verdict on every snapshot, newest first (by time, then seq)."""
    given = list(snaps)
    _check(given)
    ordered = sorted(given, key=lambda s: (s.time, s.seq, s.key), reverse=True)
    if not ordered:
        return []
    reasons: list[list[str]] = [[] for _ in ordered]
    if policy.empty:
        for r in reasons:
            r.append(EMPTY_REASON)
    else:
        _apply(policy, ordered, reasons)
        # Every rule matches the newest snapshot, so this only trips on a degenerate
        # policy (a keep_within too small to register); it guards against any rule that
        # would let the "newest" safety net be all that stands between us and deletion.
        if len(ordered) >= 2 and not any(reasons):
            raise PolicyError(f"refusing: the policy ({policy.describe()}) keeps none of the "
                              f"{len(ordered)} snapshots; only the newest would survive")
    reasons[0].insert(0, "newest")
    return [Verdict(s, bool(r), tuple(r) if r else (FORGOTTEN_REASON,))
            for s, r in zip(ordered, reasons, strict=True)]


def _check(snaps: list[SnapRef]) -> None:
    seen: set[str] = set()
    for s in snaps:
        # The same key kept under one verdict and forgotten under another would be deleted.
        if s.key in seen:
            raise PolicyError(f"snapshot {s.key} is listed twice")
        seen.add(s.key)
        if not math.isfinite(s.time):
            raise PolicyError(f"snapshot {s.key} has no usable time ({s.time!r})")


def _apply(policy: Policy, ordered: list[SnapRef], reasons: list[list[str]]) -> None:
    if policy.keep_within:
        cutoff = ordered[0].time - policy.keep_within
        label = f"within {format_duration(policy.keep_within)}"
        for s, r in zip(ordered, reasons, strict=True):
            if s.time > cutoff:
                r.append(label)
    for i, r in enumerate(reasons[:policy.keep_last], start=1):
        r.append(f"last {i}/{policy.keep_last}")
    for name, label, bucket in _BUCKETS:
        n = policy._count(name)
        seen: set[tuple[int, ...]] = set()
        for s, r in zip(ordered, reasons, strict=True):
            if len(seen) >= n:
                break
            b = bucket(_utc(s))
            if b not in seen:  # newest first, so the first one seen is the bucket's newest
                seen.add(b)
                r.append(f"{label} {len(seen)}/{n}")


def _utc(s: SnapRef) -> datetime:
    try:
        return datetime.fromtimestamp(s.time, UTC)
    except (OverflowError, OSError, ValueError) as e:
        raise PolicyError(f"snapshot {s.key} has an out-of-range time {s.time!r}: {e}") from e


def format_duration(seconds: float) -> str:
    # Days and smaller only, so a bare "m" always reads back as minutes.
    whole = int(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{n}{unit}" for n, unit in ((days, "d"), (hours, "h"), (minutes, "m")) if n]
    frac = seconds - whole
    if secs or frac or not parts:
        parts.append(f"{secs + frac:g}s")
    return "".join(parts)


def retention_groups(points: Iterable[PointLike], policy: Policy) -> dict[int, str]:
    """How ``policy`` groups each point (by seq): every flush within its window, then
    the compacted snapshots its rules keep (or "until the next prune")."""
    given = list(points)
    if not given:
        return {}
    newest = max(p.time for p in given)
    window = math.inf if policy.empty else policy.window
    out: dict[int, str] = {}
    snaps = [SnapRef(p.key, p.seq, p.time) for p in given if p.kind == "snapshot"]
    try:
        verdicts = {v.snap.seq: v for v in plan(snaps, policy)}
    except PolicyError:
        verdicts = {}
    label = "every flush, " + ("ever" if window == math.inf else
                               f"the last {format_duration(window)}")
    for p in given:
        v = verdicts.get(p.seq)
        if p.time > newest - window:
            out[p.seq] = label
        elif v is not None and v.keep:
            out[p.seq] = ", ".join(r for r in v.reasons if r != "newest") or "newest"
        else:
            out[p.seq] = "until the next prune"
    return out

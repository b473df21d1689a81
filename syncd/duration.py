"""Durations and points in time: one parser for the config, retention and ``--at``, and
the one way a point is printed (which that parser reads back)."""

from __future__ import annotations

import math
import re
import time
from datetime import UTC, datetime

from syncd.errors import ConfigError

_DAY = 86400.0
_UNITS = {"y": 365 * _DAY, "mo": 30 * _DAY, "w": 7 * _DAY, "d": _DAY, "h": 3600.0,
          "min": 60.0, "s": 1.0}
_ORDER = list(_UNITS)  # largest first; a duration lists its units in this order
_PART = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-z]+)\s*")
# What an error says of the units: "m" is minutes in every example (months are "mo").
_UNIT_HELP = "y, mo (months), w, d, h, m (minutes), s"


def parse_duration(text: str) -> float:
    """Seconds in "90s", "30m", "36h", "7d", "2w", "1y2m3d", "1d 12h", "1.5h".

    Units: y (365 days), mo (30 days), w, d, h, m, min, s, largest first. A bare "m" is
    minutes ("30m", "3h30m") unless it follows "y" or precedes "w", "d" or "h", where it
    can only be months, as in restic's "1y2m3d"; "mo" and "min" are never ambiguous.
    """
    lowered = text.lower().strip()
    if not lowered:
        raise ConfigError(f"bad duration {text!r}: empty")
    parts: list[tuple[str, str]] = []
    pos = 0
    while pos < len(lowered):
        m = _PART.match(lowered, pos)
        if m is None:
            raise ConfigError(f"bad duration {text!r}: expected a number and a unit "
                              f"({_UNIT_HELP}), e.g. '90m', '36h' or '1y2mo3d'")
        parts.append((m.group(1), m.group(2)))
        pos = m.end()
    total, prev = 0.0, -1
    for i, (number, unit) in enumerate(parts):
        if unit == "m":
            after = parts[i + 1][1] if i + 1 < len(parts) else ""
            months = (prev == _ORDER.index("y")) or after in ("w", "d", "h")
            unit = "mo" if months else "min"
        if unit not in _UNITS:
            raise ConfigError(f"bad duration {text!r}: unknown unit {unit!r} "
                              f"(use {_UNIT_HELP})")
        rank = _ORDER.index(unit)
        if rank <= prev:
            raise ConfigError(f"bad duration {text!r}: units must appear once each, "
                              f"largest first ({_UNIT_HELP})")
        prev = rank
        total += float(number) * _UNITS[unit]
    if not math.isfinite(total):
        raise ConfigError(f"bad duration {text!r}: too large")
    return total


def parse_time(text: str, now: float | None = None) -> float:
    """A point in time: ISO 8601 (local time when no zone is given) or a duration ago
    in ``parse_duration``'s words ("90m", "2h", "1d12h")."""
    now = time.time() if now is None else now
    try:
        return now - parse_duration(text)
    except ConfigError:
        pass
    try:
        return datetime.fromisoformat(text.strip().replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise ConfigError(f"cannot read time {text!r}: use ISO 8601 (2026-11-30T14:00) or "
                          "a duration ago (90m, 2h, 1d12h)") from None


def format_time(t: float) -> str:
    """A point in time as ISO 8601 UTC to the millisecond, rounded up: ``parse_time`` of
    it is at or after ``t`` (so ``restore --at`` of a printed point takes that point)."""
    ms = math.ceil(round(t * 1000, 3))
    text = datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")
    return text[:-3] + "Z"

"""Redaction tombstones in the state: those this machine is to announce (``syncd redact``
masked values in a session's files: its next flush carries their digests), those it
announced (its head lists the newest), and those a followed machine announced for a
session that came here from it (the archive job masks them here, then takes them off).

Each is a ``Redaction``: a session, a time, and (sha256, length) per value; never the
value. Every list is a JSON list in one meta key, changed in one write transaction (the
CLI, the shipper, the follower and the archive job are several threads and processes).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from syncd.format.head import REDACTED_MAX
from syncd.format.segment import REDACT_VALUE_MAX, REDACT_VALUES_MAX, Redaction, redaction

if TYPE_CHECKING:
    from syncd.backup.state import State

# Meta keys: to ship, shipped (the newest REDACTED_MAX), to do here.
ANNOUNCE = "redact_announce"
ANNOUNCED = "redact_announced"
PENDING = "redact_pending"
# Of followed machines' tombstones, those queued here once (a head lists them at every
# look): the newest HONOURED_KEPT.
HONOURED = "redact_honoured"
HONOURED_KEPT = 4096
# At most so many wait in a list: a queue is never the state's memory problem.
QUEUED_MAX = 4096


def _parse(text: str | None) -> list[Redaction]:
    """A list's redactions; damaged entries dropped (they name nothing one can do)."""
    try:
        doc = json.loads(text or "[]")
    except ValueError:
        return []
    out = []
    for d in doc if isinstance(doc, list) else []:
        try:
            out.append(redaction(d))
        except (ValueError, TypeError, KeyError):
            continue
    return out


def _dump(rs: Iterable[Redaction]) -> str:
    return json.dumps([r.encode() for r in rs])


def _change(state: State, key: str, fn: Callable[[list[Redaction]], list[Redaction]]) -> None:
    state.update_meta(key, lambda text: _dump(fn(_parse(text))))


def entries(sid: str, time: float, values: Iterable[tuple[str, int]]) -> list[Redaction]:
    """``values`` as redact entries of at most REDACT_VALUES_MAX values each (one longer
    than a reader accepts is not told: a value that long is no key or token)."""
    vs = sorted({(d, n) for d, n in values if 0 < n <= REDACT_VALUE_MAX})
    return [Redaction(sid, time, tuple(vs[i:i + REDACT_VALUES_MAX]))
            for i in range(0, len(vs), REDACT_VALUES_MAX)]


# -- the origin ----------------------------------------------------------------------

def announce(state: State, digests: Mapping[str, Iterable[tuple[str, int]]],
             time: float) -> None:
    """Queue the tombstones of what was masked in each session's files (the shipper's
    next flush carries them)."""
    new = [r for sid in sorted(digests) for r in entries(sid, time, digests[sid])]
    if new:
        _change(state, ANNOUNCE, lambda now: [*now, *(r for r in new if r not in now)])


def unannounced(state: State) -> list[Redaction]:
    return _parse(state.meta(ANNOUNCE))


def announced(state: State, rs: Iterable[Redaction]) -> None:
    """``rs`` are in the store: off the queue (what was queued meanwhile stays), and among
    the shipped ones the head lists."""
    gone = set(rs)
    _change(state, ANNOUNCE, lambda now: [r for r in now if r not in gone])
    _change(state, ANNOUNCED, lambda now: [*(r for r in now if r not in gone),
                                           *sorted(gone, key=lambda r: (r.time, r.session,
                                                                        r.values))
                                           ][-REDACTED_MAX:])


def shipped(state: State) -> list[Redaction]:
    """The newest redactions this machine announced (its head's list), oldest first."""
    return _parse(state.meta(ANNOUNCED))[-REDACTED_MAX:]


# -- a follower ----------------------------------------------------------------------

def _key(machine: str, r: Redaction) -> str:
    return json.dumps([machine, r.session, r.time, r.values])


def _honoured(text: str | None) -> list[str]:
    try:
        doc = json.loads(text or "[]")
    except ValueError:
        return []
    return [k for k in doc if isinstance(k, str)] if isinstance(doc, list) else []


def queue(state: State, machine: str, rs: Iterable[Redaction]) -> list[Redaction]:
    """Queue ``machine``'s redactions not queued here before; returns those queued."""
    seen = set(_honoured(state.meta(HONOURED)))
    fresh = [r for r in dict.fromkeys(rs) if _key(machine, r) not in seen]
    if fresh:
        # The queue before the note: a crash between the two queues it again (the same
        # values masked twice find nothing the second time), never loses it.
        _change(state, PENDING, lambda now: [*now, *(r for r in fresh if r not in now)
                                             ][-QUEUED_MAX:])
        keys = [_key(machine, r) for r in fresh]
        state.update_meta(HONOURED, lambda text: json.dumps(
            [*(k for k in _honoured(text) if k not in keys), *keys][-HONOURED_KEPT:]))
    return fresh


def pending(state: State) -> list[Redaction]:
    return _parse(state.meta(PENDING))


def done(state: State, rs: Iterable[Redaction]) -> None:
    """``rs`` are masked here and in this machine's backup: off the queue."""
    gone = set(rs)
    _change(state, PENDING, lambda now: [r for r in now if r not in gone])


__all__ = ["ANNOUNCE", "ANNOUNCED", "HONOURED", "PENDING", "Redaction", "announce",
           "announced", "done", "entries", "pending", "queue", "shipped", "unannounced"]

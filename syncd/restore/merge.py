"""How a backed-up file meets an existing local one: never losing local bytes.

identical → skip; local is a prefix → fast-forward; backup is a prefix → keep local;
diverged transcript → union by uuid when the backup's copy continues this one (``Lineage``)
and its branch is the newer one (Claude resumes the branch whose last entry is last in
the file), else keep local and save the backup as a conflict copy; history.jsonl → union
of lines; anything else diverged → keep local and save a conflict copy.

A store's timestamps decide nothing beyond now plus ``SKEW``: a later stamp is no
clock's, and the line's branch is as old as its last line with a plausible one.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from syncd import untrusted

_UUID = re.compile(rb'"uuid":"([^"]+)"')
_TS = re.compile(rb'"timestamp":"([^"]+)"')


@dataclass(frozen=True, slots=True)
class Decision:
    action: str            # create | skip | fast-forward | keep | merge | conflict
    reason: str
    content: bytes | None  # what to write (None: nothing to write)
    conflict: bool = False  # save the backup's copy beside syncd's state


# A store's clock may run this far ahead of ours; a stamp later than that is a claim.
SKEW = 300.0


@dataclass(frozen=True)
class Lineage:
    """What says another machine's diverged copy of a local transcript continues it, so its
    lines may enter the local file: ``trusted``, its machine is where the session came from
    (first imported from there) or the copy is this machine's own backup; else its first
    lines must be lines of the local copy this machine shipped (``shipped`` bytes of it:
    the other machine can only have them from this machine's backup)."""

    trusted: bool = False
    shipped: int = 0
    now: float = field(default_factory=time.time)


def _lines(data: bytes) -> list[bytes]:
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return lines


def _uuid(line: bytes) -> bytes | None:
    # The entry's own uuid is a top-level key; parse only when the cheap search is ambiguous.
    found = _UUID.findall(line)
    if not found:
        return None
    if len(found) == 1:
        return bytes(found[0])
    try:
        entry = untrusted.loads(line)
    except ValueError:
        return None
    u = entry.get("uuid") if isinstance(entry, dict) else None
    return u.encode() if isinstance(u, str) else None


def _last_time(lines: list[bytes], cap: bytes) -> bytes:
    """The stamp of the last line that has a plausible one: a stamp past ``cap`` (now
    plus the skew) is no clock's, and decides nothing (the line before it does)."""
    for line in reversed(lines):
        m = _TS.search(line)
        if m and bytes(m.group(1)) <= cap:
            return bytes(m.group(1))
    return b""


def _stamp(t: float) -> bytes:
    """``t`` as Claude writes a timestamp (ISO 8601, UTC, milliseconds)."""
    return (time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) +
            f".{int(t * 1000) % 1000:03d}Z").encode()


def common_lines(a: bytes, b: bytes) -> int:
    """How many bytes of whole lines ``a`` and ``b`` begin with alike."""
    n = min(len(a), len(b))
    lo = 0
    step = 1 << 16
    while lo < n and a[lo : lo + step] == b[lo : lo + step]:
        lo += step
    while lo < n and a[lo] == b[lo]:
        lo += 1
    return a.rfind(b"\n", 0, lo) + 1


def _join(lines: list[bytes]) -> bytes:
    return b"".join(line + b"\n" for line in lines)


def _continues(local: bytes, lineage: Lineage, common: int | None = None) -> bool:
    """Whether another machine's copy that begins with ``common`` bytes of ``local``
    (all of them: None) continues it: the session came from there, or those bytes hold a
    whole line this machine shipped."""
    if lineage.trusted or not local:  # nothing of this machine's to add to (as new)
        return True
    shared = min(len(local) if common is None else common, lineage.shipped)
    return local.rfind(b"\n", 0, shared) >= 0


def decide(kind: str, local: bytes | None, backup: bytes,
           lineage: Lineage | None = None) -> Decision:
    """``kind`` is "transcript", "history" or "file"; ``lineage``: what vouches that a
    diverged backup continues the local transcript (None: nothing does)."""
    if local is None:
        return Decision("create", "not present locally", backup)
    if local == backup:
        return Decision("skip", "identical", None)
    if backup.startswith(local):
        if kind == "transcript" and lineage is not None and not _continues(local, lineage):
            return Decision("conflict", "the backup's copy adds to a local one this machine "
                            "has not shipped a line of: saved as a conflict copy", None,
                            conflict=True)
        return Decision("fast-forward", f"local is a prefix ({len(local)} of {len(backup)} "
                        "bytes)", backup)
    if local.startswith(backup):
        return Decision("keep", "local is newer (the backup is a prefix of it)", None)
    if kind == "history":
        return _merge_history(local, backup)
    if kind == "transcript":
        return _merge_transcript(local, backup, lineage or Lineage())
    return Decision("conflict", "diverged; local kept", None, conflict=True)


def _merge_history(local: bytes, backup: bytes) -> Decision:
    have = set(_lines(local))
    missing = [line for line in _lines(backup) if line not in have]
    if not missing:
        return Decision("keep", "local already holds every backed-up line", None)
    base = local if local.endswith(b"\n") or not local else local + b"\n"
    return Decision("merge", f"{len(missing)} history lines added", base + _join(missing))


def _merge_transcript(local: bytes, backup: bytes, lineage: Lineage) -> Decision:
    loc, bak = _lines(local), _lines(backup)
    have_ids = {u for u in map(_uuid, loc) if u is not None}
    have_raw = set(loc)
    missing = [line for line in bak
               if ((u := _uuid(line)) is None and line not in have_raw)
               or (u is not None and u not in have_ids)]
    if not missing:
        return Decision("keep", "diverged, but local holds every backed-up entry", None)
    if not _continues(local, lineage, common_lines(local, backup)):
        # Nothing says the other copy grew from this one: its lines never enter it.
        return Decision("conflict", f"diverged, and the backup's copy does not continue "
                        f"what this machine shipped of it; {len(missing)} backed-up entries "
                        "saved as a conflict copy", None, conflict=True)
    cap = _stamp(lineage.now + SKEW)
    if _last_time(bak, cap) <= _last_time(loc, cap):
        # Appending the older branch would make Claude resume it instead of local's.
        return Decision("conflict", f"diverged and local is newer; {len(missing)} backed-up "
                        "entries saved as a conflict copy", None, conflict=True)
    base = local if local.endswith(b"\n") or not local else local + b"\n"
    return Decision("merge", f"diverged; {len(missing)} newer backed-up entries appended "
                    "after local's", base + _join(missing))

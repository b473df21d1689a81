"""How a backed-up file meets an existing local one: never losing local bytes.

identical → skip; local is a prefix → fast-forward; backup is a prefix → keep local;
diverged transcript → union by uuid when the backup's branch is the newer one (Claude
resumes the branch whose last entry is last in the file), else keep local and save the
backup as a conflict copy; history.jsonl → union of lines; anything else diverged →
keep local and save a conflict copy.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from syncd import untrusted

_UUID = re.compile(rb'"uuid":"([^"]+)"')
_TS = re.compile(rb'"timestamp":"([^"]+)"')


@dataclass(frozen=True, slots=True)
class Decision:
    action: str            # create | skip | fast-forward | keep | merge | conflict
    reason: str
    content: bytes | None  # what to write (None: nothing to write)
    conflict: bool = False  # save the backup's copy beside syncd's state


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


def _last_time(lines: list[bytes]) -> bytes:
    for line in reversed(lines):
        m = _TS.search(line)
        if m:
            return bytes(m.group(1))
    return b""


def _join(lines: list[bytes]) -> bytes:
    return b"".join(line + b"\n" for line in lines)


def decide(kind: str, local: bytes | None, backup: bytes) -> Decision:
    """``kind`` is "transcript", "history" or "file"."""
    if local is None:
        return Decision("create", "not present locally", backup)
    if local == backup:
        return Decision("skip", "identical", None)
    if backup.startswith(local):
        return Decision("fast-forward", f"local is a prefix ({len(local)} of {len(backup)} "
                        "bytes)", backup)
    if local.startswith(backup):
        return Decision("keep", "local is newer (the backup is a prefix of it)", None)
    if kind == "history":
        return _merge_history(local, backup)
    if kind == "transcript":
        return _merge_transcript(local, backup)
    return Decision("conflict", "diverged; local kept", None, conflict=True)


def _merge_history(local: bytes, backup: bytes) -> Decision:
    have = set(_lines(local))
    missing = [line for line in _lines(backup) if line not in have]
    if not missing:
        return Decision("keep", "local already holds every backed-up line", None)
    base = local if local.endswith(b"\n") or not local else local + b"\n"
    return Decision("merge", f"{len(missing)} history lines added", base + _join(missing))


def _merge_transcript(local: bytes, backup: bytes) -> Decision:
    loc, bak = _lines(local), _lines(backup)
    have_ids = {u for u in map(_uuid, loc) if u is not None}
    have_raw = set(loc)
    missing = [line for line in bak
               if ((u := _uuid(line)) is None and line not in have_raw)
               or (u is not None and u not in have_ids)]
    if not missing:
        return Decision("keep", "diverged, but local holds every backed-up entry", None)
    if _last_time(bak) <= _last_time(loc):
        # Appending the older branch would make Claude resume it instead of local's.
        return Decision("conflict", f"diverged and local is newer; {len(missing)} backed-up "
                        "entries saved as a conflict copy", None, conflict=True)
    base = local if local.endswith(b"\n") or not local else local + b"\n"
    return Decision("merge", f"diverged; {len(missing)} newer backed-up entries appended "
                    "after local's", base + _join(missing))

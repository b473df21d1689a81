"""A machine's head: the small object a reader of many machines reads instead of a
backup (docs/FORMAT.md, "Head").

The writer rewrites it in place: who the machine is, the last flush it covers, what it
stores, and its session catalog. Listing the machines of a team bucket, their sessions,
or finding which machine has a session then costs one GET per machine. It is a summary
for reading, never a source of bytes: a restore still reads the backup itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import zstandard

from syncd import untrusted
from syncd.errors import FormatError
from syncd.format.catalog import FIELD_MAX, FIRST, LATEST, Session, is_session_id, session_of
from syncd.format.segment import (
    Redaction,
    decode_path,
    decompress_capped,
    encode_path,
    expansion_limit,
    redaction,
    when,
)

FORMAT = 1
# What a reader accepts: a head of 100 000 sessions with long titles is a few MiB.
HEAD_MAX = 16 << 20
HEAD_RAW_MAX = 64 << 20
# A writer keeps each catalog field of a head this short (a listing shows 60 characters).
HEAD_FIELD_MAX = 512
KINDS = ("seg", "delta", "snap", "pack", "dict")
# Tombstones of forgotten sessions a head carries at most (the newest): for followers that
# missed the segment that carried one (compacted before they read it).
FORGOTTEN_MAX = 4096
# Redactions' tombstones a head carries at most (the newest; each of at most 256 values).
REDACTED_MAX = 256
# A listing's fields: where a session came from is a restore's business, not a listing's.
_FIELDS = frozenset(FIRST + LATEST) - {"origin"}
_INFO = ("hostname", "os", "home", "claude_root")


@dataclass
class HeadSession:
    """One session as the head lists it."""

    path: bytes
    gen: int
    size: int
    deleted_at: float | None = None
    fields: dict[str, str] = field(default_factory=dict)
    # The generation whose lines named ``fields`` when it is not ``gen`` (a newer
    # generation that names none yet keeps them): a reader folding later segments onto
    # the head folds them as a backup's reader would.
    fields_gen: int | None = None

    @property
    def session_id(self) -> str:
        sid = session_of(self.path)
        assert sid is not None  # checked when made
        return sid

    def session(self, machine: str) -> Session:
        return Session(self.session_id, machine, self.path, self.gen, self.size,
                       self.deleted_at, fields=dict(self.fields))

    @property
    def named_by(self) -> int:
        """The generation whose lines named ``fields``."""
        return self.gen if self.fields_gen is None else self.fields_gen


@dataclass
class Head:
    machine: str
    written: float
    seq: int  # the last flush it covers (-1: none yet)
    time: float | None  # that flush's time
    info: dict[str, str] = field(default_factory=dict)
    objects: dict[str, tuple[int, int]] = field(default_factory=dict)  # kind: (count, bytes)
    sessions: list[HeadSession] = field(default_factory=list)
    # Sessions this machine forgot: (session id, when), the newest FORGOTTEN_MAX.
    forgotten: list[tuple[str, float]] = field(default_factory=list)
    # What this machine redacted, per session (digests and lengths), the newest REDACTED_MAX.
    redacted: list[Redaction] = field(default_factory=list)


def encode(h: Head) -> bytes:
    doc: dict[str, Any] = {
        "format": FORMAT, "machine": h.machine, "written": h.written, "seq": h.seq,
        "time": h.time, **{k: v for k, v in h.info.items() if k in _INFO},
        "objects": {k: list(v) for k, v in h.objects.items()},
        "sessions": [{**encode_path(s.path), "gen": s.gen, "size": s.size,
                      **({"deleted_at": s.deleted_at} if s.deleted_at is not None else {}),
                      "fields": {k: v[:HEAD_FIELD_MAX] for k, v in s.fields.items()
                                 if k in _FIELDS},
                      **({"fields_gen": s.fields_gen} if s.fields_gen not in (None, s.gen)
                         and s.fields else {})}
                     for s in h.sessions]}
    if h.forgotten:
        doc["forgotten"] = [[sid, t] for sid, t in h.forgotten[-FORGOTTEN_MAX:]]
    if h.redacted:
        doc["redacted"] = [{k: v for k, v in r.encode().items() if k != "op"}
                           for r in h.redacted[-REDACTED_MAX:]]
    # With its content checksum: a flipped byte of a plain store's head fails to read
    # (a sealed one fails its tag anyway).
    return zstandard.ZstdCompressor(level=3, write_checksum=True).compress(
        json.dumps(doc, separators=(",", ":")).encode())


class HeadTooLarge(FormatError):
    """A head whose JSON is more than its reader asked for: read it again on its own."""


def decode(blob: bytes, machine: str, where: str, raw_max: int = HEAD_RAW_MAX) -> Head:
    """The head in ``blob`` (as stored, opened when sealed), checked field by field:
    ``FormatError`` naming ``where`` when anything is not what a writer makes;
    ``HeadTooLarge`` when its JSON may be more than ``raw_max`` bytes (or its frame does
    not read within that)."""
    limit = expansion_limit(len(blob), HEAD_RAW_MAX)
    if raw_max < limit:
        try:
            text = decompress_capped(blob, raw_max, f"{where}: head")
        except FormatError as e:
            raise HeadTooLarge(str(e)) from None
    else:
        text = decompress_capped(blob, limit, f"{where}: head")
    try:
        doc = untrusted.loads(text)
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        if doc.get("format") != FORMAT:
            raise ValueError(f"format {str(doc.get('format'))[:20]!r}, not {FORMAT} (written "
                             "by a newer syncd?)")
        if doc.get("machine") != machine:
            raise ValueError(f"written for machine {str(doc.get('machine'))[:80]!r}")
        seq = doc.get("seq")
        if type(seq) is not int or not -1 <= seq < 1 << 63:
            raise ValueError(f"bad seq {str(seq)[:30]}")
        flush = doc.get("time")
        h = Head(machine, when(doc.get("written")), seq,
                 None if flush is None else when(flush))
        for name in _INFO:
            if isinstance(doc.get(name), str):
                h.info[name] = doc[name][:4096]
        objects = doc.get("objects", {})
        if not isinstance(objects, dict):
            raise ValueError("objects is not a JSON object")
        for kind, v in objects.items():
            if kind in KINDS:
                if not (isinstance(v, list) and len(v) == 2
                        and all(type(n) is int and 0 <= n < 1 << 63 for n in v)):
                    raise ValueError(f"bad count of {kind}")
                h.objects[kind] = (v[0], v[1])
        sessions = doc.get("sessions", [])
        if not isinstance(sessions, list):
            raise ValueError("sessions is not a list")
        h.sessions = [_session(s) for s in sessions]
        h.forgotten = _forgotten(doc.get("forgotten", []))
        redacted = doc.get("redacted", [])
        if not isinstance(redacted, list) or len(redacted) > REDACTED_MAX:
            raise ValueError(f"redacted is not a list of at most {REDACTED_MAX}")
        h.redacted = [redaction(r) for r in redacted]
    except (ValueError, TypeError, KeyError, UnicodeError) as e:
        raise FormatError(f"{where}: unreadable head: {e}") from None
    return h


def _forgotten(v: Any) -> list[tuple[str, float]]:
    if not isinstance(v, list) or len(v) > FORGOTTEN_MAX:
        raise ValueError(f"forgotten is not a list of at most {FORGOTTEN_MAX}")
    out = []
    for x in v:
        if not (isinstance(x, list) and len(x) == 2 and isinstance(x[0], str)
                and is_session_id(x[0])):
            raise ValueError(f"forgotten names {str(x)[:80]!r}, not [session id, time]")
        out.append((x[0], when(x[1])))
    return out


def _session(s: Any) -> HeadSession:
    if not isinstance(s, dict):
        raise ValueError("a session is not a JSON object")
    path = decode_path(s)
    if session_of(path) is None:
        raise ValueError(f"{path[:200]!r} is not a session transcript")
    gen, size = s.get("gen"), s.get("size")
    if type(gen) is not int or type(size) is not int or not 0 <= gen < 1 << 63 \
            or not 0 <= size < 1 << 63:
        raise ValueError(f"{path[:200]!r}: bad generation or size")
    deleted = s.get("deleted_at")
    fields = s.get("fields", {})
    if not isinstance(fields, dict):
        raise ValueError(f"{path[:200]!r}: fields is not a JSON object")
    named = s.get("fields_gen")
    if named is not None and (type(named) is not int or not 0 <= named < 1 << 63):
        raise ValueError(f"{path[:200]!r}: bad fields_gen")
    return HeadSession(path, gen, size, None if deleted is None else when(deleted),
                       {k: v[:FIELD_MAX] for k, v in fields.items()
                        if k in _FIELDS and isinstance(v, str)}, named)

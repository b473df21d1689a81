"""Marks: where a transcript's last shipped lines end, and what each of them hashes to.

Claude Code withdraws a streamed row by cutting the file at that row and writing what
followed again, in place, when the row is within its last 64 KiB (docs/ARCHITECTURE.md,
"Cuts, moves and rewrites"). The state keeps, per transcript, the ends of the lines
shipped in the last ``WINDOW`` bytes, a hash of each line and one of the file's head, so
the shipper tells such a cut (every byte before it is what was shipped) from a rewrite
without reading the store, and ships the cut as a copy of the bytes before it.

The proof has the strength of the append check (``ship.check_hash``): the head and the
lines of the 64 KiB before the cut are compared, the bytes between them are taken to be
unchanged, as Claude only ever cuts near the end or rewrites the file whole.
"""

from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass

# Cuts further back than this are rewrites to the CLI too (a new file, written whole).
WINDOW = 128 << 10
MAX_LINES = 256
HEAD = 4 << 10
# A cut is proven as an append is (ship.check_hash): the head and the COVER bytes
# before it are compared, never less; with shorter lines than MAX_LINES fit there, no
# cut is taken for one (the file is a patch, proven line by line).
COVER = 64 << 10
_DIGEST = 8
_HEAD_DIGEST = 16
_FIXED = struct.Struct("<QH")
_MARK = struct.Struct(f"<Q{_DIGEST}s")


@dataclass(frozen=True, slots=True)
class Marks:
    head: bytes               # hash of bytes [0, min(HEAD, base))
    base: int                 # where the first marked line starts
    ends: tuple[int, ...]     # where each marked line ends (after its newline)
    digests: tuple[bytes, ...]

    def encode(self) -> bytes:
        return b"".join([_FIXED.pack(self.base, len(self.ends)), self.head,
                         *(_MARK.pack(e, d) for e, d in zip(self.ends, self.digests,
                                                            strict=True))])

    @classmethod
    def decode(cls, blob: bytes) -> Marks | None:
        """The marks a state row holds (None: none, or not what ``encode`` makes)."""
        if len(blob) < _FIXED.size + _HEAD_DIGEST:
            return None
        base, n = _FIXED.unpack_from(blob)
        if n > MAX_LINES or len(blob) != _FIXED.size + _HEAD_DIGEST + n * _MARK.size:
            return None
        head = blob[_FIXED.size:_FIXED.size + _HEAD_DIGEST]
        rows = [_MARK.unpack_from(blob, _FIXED.size + _HEAD_DIGEST + i * _MARK.size)
                for i in range(n)]
        ends = tuple(e for e, _ in rows)
        if any(b <= a for a, b in zip((base, *ends), ends, strict=False)):
            return None
        return cls(head, base, ends, tuple(d for _, d in rows))


def _hash(data: bytes, size: int = _DIGEST) -> bytes:
    # (sha256 is the fastest strong hash here: CPUs compute it in hardware.)
    return hashlib.sha256(data).digest()[:size]


def marks_of(fd: int, size: int) -> bytes | None:
    """The marks of the first ``size`` bytes of the open file ``fd`` (None: no line
    ends there)."""
    lo = max(0, size - WINDOW)
    tail = os.pread(fd, size - lo, lo)
    ends: list[int] = []
    at = tail.find(b"\n")
    while at >= 0:
        ends.append(lo + at + 1)
        at = tail.find(b"\n", at + 1)
    # A line that starts before the window is not marked: its start bounds the first.
    base = ends.pop(0) if lo > 0 and ends else lo
    if len(ends) > MAX_LINES:
        base, ends = ends[-MAX_LINES - 1], ends[-MAX_LINES:]
    if not ends or len(tail) != size - lo:
        return None
    starts = [base, *ends[:-1]]
    digests = tuple(_hash(tail[s - lo:e - lo]) for s, e in zip(starts, ends, strict=True))
    head = _hash(os.pread(fd, min(HEAD, base), 0), _HEAD_DIGEST)
    return Marks(head, base, tuple(ends), digests).encode()


def cut_point(fd: int, size: int, blob: bytes | None) -> int | None:
    """The furthest marked line end within the file's ``size`` bytes up to which its
    bytes are those the marks describe (None: the head or the first line differs)."""
    m = None if blob is None else Marks.decode(blob)
    if m is None or size < m.ends[0]:
        return None
    if _hash(os.pread(fd, min(HEAD, m.base), 0), _HEAD_DIGEST) != m.head:
        return None
    upto = max((e for e in m.ends if e <= size), default=m.base)
    local = os.pread(fd, upto - m.base, m.base)
    best = None
    start = m.base
    for end, digest in zip(m.ends, m.digests, strict=True):
        if end > upto or _hash(local[start - m.base:end - m.base]) != digest:
            break
        best = start = end
    if best is None or m.base > max(HEAD, best - COVER):
        return None
    return best

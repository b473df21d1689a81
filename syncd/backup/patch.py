"""A patch: a transcript rewritten whole, as copies of the generation before it plus the
bytes that are new.

Claude Code rewrites a transcript when it removes a row further back than its last
64 KiB, and its headless transcript compaction writes a smaller file over the original
(docs/ARCHITECTURE.md, "Cuts, moves and rewrites"). Such a file is mostly the old one's
lines, some removed: matched line by line (a hash and a length each), the runs of old
lines it keeps ship as copies (``format.segment.Copy``, no bytes), the rest as data.
"""

from __future__ import annotations

import bisect
import hashlib
import os
from collections.abc import Iterable, Iterator

# Runs of matching lines shorter than this ship as data: a copy's index entry costs
# about as much.
MIN_COPY = 1 << 10
# A patch names at most this many copies (index entries); one that would need more, or
# that copies less than MIN_SHARE of the file, is no patch: the file ships whole.
MAX_COPIES = 4096
MIN_SHARE = 0.5
# The old generation is read from the store only up to this size (Claude rewrites files
# of up to 50 MiB).
OLD_MAX = 64 << 20
_CHUNK = 4 << 20


def _key(line: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(line, digest_size=8).digest(), "little") ^ len(line)


def lines(chunks: Iterable[bytes]) -> Iterator[tuple[int, bytes]]:
    """(offset, line) of each complete line of the bytes ``chunks`` give, in order."""
    pos, carry = 0, b""
    for chunk in chunks:
        data = carry + chunk
        start = 0
        at = data.find(b"\n")
        while at >= 0:
            yield pos + start, data[start:at + 1]
            start = at + 1
            at = data.find(b"\n", start)
        pos += start
        carry = data[start:]


class OldLines:
    """The lines of the old generation: where each starts, and by key where they are."""

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.keys: list[int] = []
        self.where: dict[int, list[int]] = {}

    def add(self, chunks: Iterable[bytes]) -> None:
        for off, line in lines(chunks):
            k = _key(line)
            self.where.setdefault(k, []).append(len(self.starts))
            self.starts.append(off)
            self.keys.append(k)


def file_chunks(fd: int, size: int) -> Iterator[bytes]:
    pos = 0
    while pos < size:
        data = os.pread(fd, min(_CHUNK, size - pos), pos)
        if not data:
            return
        yield data
        pos += len(data)


def patch(old: OldLines, fd: int, size: int) -> list[tuple[int, int, int]] | None:
    """The runs of the file's first ``size`` bytes that are old lines, as (at, old
    start, length), or None when that is no patch worth shipping."""
    runs: list[tuple[int, int, int]] = []
    # The run being matched: where it is in the file, its first and last old line, and
    # its length. Old lines are contiguous, so a run is one range of the old file.
    cur: list[int] | None = None
    last = -1  # the old line the runs reached: a later one is preferred (order kept)
    for off, line in lines(file_chunks(fd, size)):
        k = _key(line)
        if cur is not None and cur[2] + 1 < len(old.keys) and old.keys[cur[2] + 1] == k:
            cur[2] += 1
            cur[3] += len(line)
            continue
        if cur is not None:
            runs.append((cur[0], old.starts[cur[1]], cur[3]))
            last = cur[2]
        cands = old.where.get(k)
        i = None
        if cands:  # (in rising order: a bisection, however often a line repeats)
            j = bisect.bisect_right(cands, last)
            i = cands[j] if j < len(cands) else cands[0]
        cur = None if i is None else [off, i, i, len(line)]
    if cur is not None:
        runs.append((cur[0], old.starts[cur[1]], cur[3]))
    out = [r for r in runs if r[2] >= MIN_COPY]
    if len(out) > MAX_COPIES or sum(n for _, _, n in out) < MIN_SHARE * size:
        return None
    return out

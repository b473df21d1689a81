"""Masks: byte ranges of a file replaced by bytes of the same length.

What ``forget`` and ``redact`` change inside files that stay: a forgotten session's lines
of ``history.jsonl`` become spaces (their newline kept), a redacted value becomes
``[REDACTED]`` padded with ``*`` to its length (``*`` alone under 10 bytes). The same
length keeps every size, point and offset of the backup as it was, so only the objects
that hold those bytes are rewritten, and a file's older points stay prefixes of its
newer ones.

A value is masked only where the result is still the same JSON: inside one string's
text, never beginning or ending within an escape, and never inside a ``thinking``,
``signature`` or redacted ``data`` string (the API rejects a resumed session whose
signed blocks changed). Those places are reported instead (``Found.signed``). A line
of plain text (not JSON: a persisted tool output) is masked wherever the value is.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass

from syncd.sessionfiles import history_session

MASK = b"[REDACTED]"
# Keys whose string values the API signs (or holds encrypted): never changed.
SIGNED_KEYS = frozenset({b"thinking", b"signature", b"data"})
# A JSON string literal, and whether a colon follows it (then it is a key).
_STRING = re.compile(rb'"((?:[^"\\\n]|\\.)*)"(\s*:)?')
# A line longer than this is not parsed to place a value: it is reported, not masked.
LINE_MAX = 64 << 20


def mask_of(n: int) -> bytes:
    """``n`` bytes that say a value was redacted (printable ASCII, no quote or backslash)."""
    if n < len(MASK):
        return b"*" * n
    return MASK[:-1] + b"*" * (n - len(MASK)) + b"]"


@dataclass(frozen=True, slots=True)
class Range:
    start: int
    end: int
    line: bool = False  # a whole line: spaces (forget), else a value's mask
    # A value's sha256 (hex), what a follower's copy is searched for: never the value.
    digest: str = ""

    def fill(self) -> bytes:
        n = self.end - self.start
        return b" " * n if self.line else mask_of(n)


@dataclass(frozen=True, slots=True)
class Found:
    """A value found at file offset ``start``; ``why`` says why it is not masked (None:
    it is)."""

    start: int
    end: int
    line_no: int
    why: str | None = None

    @property
    def signed(self) -> bool:
        return self.why is not None and self.why.startswith("inside a ")


def apply(raw: bytes, at: int, ranges: Iterable[Range]) -> bytes:
    """``raw`` (a file's bytes from offset ``at``) with the ranges that touch it masked."""
    out: bytearray | None = None
    stop = at + len(raw)
    for r in ranges:
        lo, hi = max(r.start, at), min(r.end, stop)
        if lo >= hi:
            continue
        if out is None:
            out = bytearray(raw)
        fill = r.fill()
        out[lo - at : hi - at] = fill[lo - r.start : hi - r.start]
    return raw if out is None else bytes(out)


def lines(chunks: Iterable[bytes]) -> Iterator[tuple[int, bytes]]:
    """(offset, line with its newline) of a file read as ``chunks``; a line longer than
    LINE_MAX comes as pieces of at most that (the caller cannot parse those)."""
    buf = bytearray()
    pos = 0
    for chunk in chunks:
        buf += chunk
        start = 0
        while True:
            nl = buf.find(b"\n", start)
            if nl < 0:
                break
            yield pos + start, bytes(buf[start : nl + 1])
            start = nl + 1
        del buf[:start]
        pos += start
        while len(buf) > LINE_MAX:
            yield pos, bytes(buf[:LINE_MAX])
            del buf[:LINE_MAX]
            pos += LINE_MAX
    if buf:
        yield pos, bytes(buf)


def history_ranges(chunks: Iterable[bytes], sids: Collection[str]) -> list[Range]:
    """The lines of ``history.jsonl`` that name one of ``sids`` (newline kept)."""
    out = []
    for off, line in lines(chunks):
        if b"sessionId" in line and history_session(line) in sids:
            end = off + len(line) - (1 if line.endswith(b"\n") else 0)
            out.append(Range(off, end, line=True,
                             digest=hashlib.sha256(line[: end - off]).hexdigest()))
    return out


def value_places(chunks: Iterable[bytes], values: Collection[bytes],
                 patterns: Collection[re.Pattern[bytes]] = (), plain: bool = False
                 ) -> tuple[list[Range], list[Found]]:
    """Where ``values`` occur and ``patterns`` match (each line's raw bytes): the ranges
    to mask, and every occurrence found (with why one is left alone). ``plain``: the
    file is no JSON (a tool's output, a file's copy in file-history): every occurrence
    is masked."""
    ranges: list[Range] = []
    found: list[Found] = []
    vals = sorted({v for v in values if v}, key=len, reverse=True)
    if not vals and not patterns:
        return ranges, found
    for no, (off, line) in enumerate(lines(chunks), 1):
        spans = _occurrences(line, vals, patterns)
        if not spans:
            continue
        if plain:
            found += [Found(off + a, off + b, no) for a, b in spans]
            ranges += [Range(off + a, off + b, digest=hashlib.sha256(line[a:b]).hexdigest())
                       for a, b in spans]
            continue
        if len(line) >= LINE_MAX:
            found += [Found(off + a, off + b, no, "a line too long to parse") for a, b in spans]
            continue
        keep = []
        text = _plain(line)
        for a, b in spans:
            why = None if text else _why_not(line, a, b)
            found.append(Found(off + a, off + b, no, why))
            if why is None:
                keep.append((a, b))
        if keep and not _same_json(line, keep):
            found[-len(spans):] = [Found(f.start, f.end, f.line_no, f.why or
                                         "masking it would change the line's JSON")
                                   for f in found[-len(spans):]]
            continue
        ranges += [Range(off + a, off + b, digest=hashlib.sha256(line[a:b]).hexdigest())
                   for a, b in keep]
    return ranges, found


def _occurrences(line: bytes, vals: list[bytes],
                 patterns: Collection[re.Pattern[bytes]]) -> list[tuple[int, int]]:
    """Every occurrence of the values (longest first) and match of the patterns, not
    overlapping; an empty match is none."""
    taken: list[tuple[int, int]] = []

    def take(a: int, b: int) -> None:
        if b > a and not any(x < b and a < y for x, y in taken):
            taken.append((a, b))

    for v in vals:
        i = line.find(v)
        while i >= 0:
            take(i, i + len(v))
            i = line.find(v, i + 1)
    for p in patterns:
        for m in p.finditer(line):
            take(m.start(), m.end())
    return sorted(taken)


def _plain(line: bytes) -> bool:
    """Whether a line is plain text, not JSON (a tool's output kept in
    ``tool-results/<id>.txt``, a log): a value may then be masked anywhere in it. A line
    that parses as JSON, or begins like an object or array (one cut short), keeps the
    rules of JSON strings; bytes that are not UTF-8 (an image) are no text to mask."""
    if line.lstrip()[:1] in (b"{", b"["):
        return False
    try:
        line.decode("utf-8")
    except UnicodeDecodeError:
        return False
    try:
        json.loads(line)
    except ValueError:
        return True
    return False


def _why_not(line: bytes, a: int, b: int) -> str | None:
    """Why bytes [a, b) of a JSONL line may not be masked (None: they may)."""
    key: bytes | None = None
    for m in _STRING.finditer(line):
        s, e = m.start(1), m.end(1)
        if m.group(2):
            key = m.group(1)
            if s <= a < e:
                return "inside a key"
            continue
        if e <= a:
            continue
        if s > a:
            break
        if b > e:
            return "not within one string"
        if key in SIGNED_KEYS:
            return f"inside a {key.decode()} string (signed)"
        # Not starting or ending inside an escape: the backslashes before each end.
        if _odd_backslashes(line, s, a) or _odd_backslashes(line, s, b):
            return "it begins or ends inside an escape"
        return None
    return "not inside a string"


def _odd_backslashes(line: bytes, start: int, at: int) -> bool:
    n = 0
    while at - n - 1 >= start and line[at - n - 1] == 0x5C:
        n += 1
    return n % 2 == 1


def _same_json(line: bytes, spans: list[tuple[int, int]]) -> bool:
    """Whether the line with ``spans`` masked parses as the line did (JSON in, JSON out)."""
    new = apply(line, 0, [Range(a, b) for a, b in spans])
    try:
        json.loads(line)
    except ValueError:
        return True  # not JSON before: a same-length mask of string text keeps it so
    try:
        json.loads(new)
    except ValueError:
        return False
    return True


def find_digests(chunks: Iterable[bytes], digests: Collection[tuple[str, int]]
                 ) -> set[bytes]:
    """The values whose (sha256, length) are ``digests``, as they occur in a file (a
    follower's copy of a session its origin redacted): every run of bytes of such a
    length within a token (no quote or white space) of at most TOKEN_MAX bytes."""
    want: dict[int, set[str]] = {}
    for digest, n in digests:
        if 0 < n <= TOKEN_MAX:
            want.setdefault(n, set()).add(digest)
    found: set[bytes] = set()
    if not want:
        return found
    shortest = min(want)
    for _, line in lines(chunks):
        for m in _TOKEN.finditer(line):
            tok = m.group(0)
            if len(tok) < shortest or len(tok) > TOKEN_MAX:
                continue
            for n, ds in want.items():
                for i in range(len(tok) - n + 1):
                    v = tok[i : i + n]
                    if hashlib.sha256(v).hexdigest() in ds:
                        found.add(v)
    return found


# A token a value is looked for in: between quotes and white space.
_TOKEN = re.compile(rb'[^"\s]+')
TOKEN_MAX = 64 << 10


def mask_text(text: str, values: Collection[bytes],
              patterns: Collection[re.Pattern[bytes]] = ()) -> str:
    """A catalog field (decoded text) with the values masked and the patterns' matches."""
    for v in sorted(values, key=len, reverse=True):
        s = v.decode("utf-8", "replace")
        if s and s in text:
            text = text.replace(s, mask_of(len(s.encode())).decode())
    if patterns:
        raw = text.encode("utf-8", "surrogatepass")
        for p in patterns:
            raw = p.sub(lambda m: mask_of(len(m.group(0))), raw)
        text = raw.decode("utf-8", "replace")
    return text


__all__ = ["MASK", "Found", "Range", "apply", "history_ranges", "lines", "mask_of",
           "mask_text", "value_places"]

"""The rewrite of ``syncd.restore.remap.Remapper.lines`` as it was before it ran over the
whole text at once: each stretch between protected strings on its own, and a Python
decision per prefix found. Kept here, not in syncd, as the reference the faster rewrite
must equal byte for byte (tests/test_remap_equivalence.py)."""

from __future__ import annotations

import functools
import json
import re
import unicodedata
from collections.abc import Iterable

from syncd.restore.remap import Rule

_NAME = rb"A-Za-z0-9._~\-\x80-\xff"
_ASCII_NAME = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._~-")
_HEX = frozenset(b"0123456789abcdefABCDEF")
_STOP = frozenset(range(0x80)) - _ASCII_NAME
_PLAIN = _ASCII_NAME - _HEX - frozenset(b"nrtbf")
_CSI = re.compile(rb"\\u001[bB]\[[0-?]*[ -/]*[@-~]\Z")
_CSI_MAX = 24
_LETTERS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_PROTECTED = re.compile(rb'"(?:thinking|signature|data)":"[^"\\]*(?:\\.[^"\\]*)*"')
_WIN_REST = rb'((?:\\\\[^\\"<>|*?:]+)*)'
_PROTECT_HINT = (b'"thinking"', b'"signature"', b'"redacted_thinking"')


def _alternatives(pairs: dict[bytes, bytes]) -> bytes:
    return b"|".join(re.escape(k) for k in sorted(pairs, key=len, reverse=True))


def _json_form(text: str) -> bytes:
    return json.dumps(text, ensure_ascii=False)[1:-1].encode()


def _continues_name(chunk: bytes, at: int) -> bool:
    b = chunk[at - 1]
    if b < 0x80:
        if b not in _ASCII_NAME:
            return False
        if at >= 2 and chunk[at - 2] == 0x5C and b in b"nrtbf":
            return False
        if b in _HEX and at >= 6 and chunk[at - 6] == 0x5C and chunk[at - 5] == 0x75 \
                and all(c in _HEX for c in chunk[at - 4 : at - 1]):
            lead = at - 6
            while lead > 0 and chunk[lead - 1] == 0x5C:
                lead -= 1
            if (at - 6 - lead) % 2 == 0:
                return _name_char(chr(int(chunk[at - 4 : at], 16)))
        return True
    return _ends_in_name(chunk[max(0, at - 4) : at])


def _after_csi(chunk: bytes, at: int) -> bool:
    m = _CSI.search(chunk, max(0, at - _CSI_MAX), at)
    if m is None:
        return False
    lead = m.start()
    while lead > 0 and chunk[lead - 1] == 0x5C:
        lead -= 1
    return (m.start() - lead) % 2 == 0


@functools.lru_cache(maxsize=4096)
def _ends_in_name(window: bytes) -> bool:
    start = len(window) - 1
    while start > 0 and 0x80 <= window[start] < 0xC0:
        start -= 1
    try:
        ch = window[start:].decode()
    except UnicodeDecodeError:
        return True
    return len(ch) != 1 or _name_char(ch)


def _name_char(ch: str) -> bool:
    if ch.isascii():
        return ord(ch) in _ASCII_NAME
    return unicodedata.category(ch)[0] in "LNM"


class ReferenceRemapper:
    """``Remapper.lines`` as it was (rules and folders taken the same way)."""

    def __init__(self, rules: Iterable[Rule], folders: dict[str, str] | None = None) -> None:
        seen: dict[str, Rule] = {}
        for r in rules:
            old = r.old.rstrip("/\\") or r.old
            new = r.new.rstrip("/\\") or r.new
            if old and old != new and old not in seen:
                seen[old] = Rule(old, new, r.why)
        ordered = sorted(seen.values(), key=lambda r: len(r.old), reverse=True)
        pairs: dict[bytes, bytes] = {}
        self._to_posix: set[bytes] = set()
        for r in ordered:
            variants = [(r.old, r.new)]
            if "\\" in r.old:
                variants.append((r.old.replace("\\", "/"), r.new))
            for old, new in variants:
                form = _json_form(old)
                pairs.setdefault(form, _json_form(new))
                if "\\" in r.old and "\\" not in r.new:
                    self._to_posix.add(form)
        self._pairs = pairs
        self._prefix_re = re.compile(
            rb"(" + _alternatives(pairs) + rb")(?![" + _NAME + rb"])" + _WIN_REST
        ) if pairs else None
        fpairs = {f.encode(): t.encode() for f, t in (folders or {}).items() if f != t}
        self._fpairs = fpairs
        self._folder_re = re.compile(
            rb"(projects(?:/|\\\\))(" + _alternatives(fpairs) + rb")(?=/|\\\\|\"|$)"
        ) if fpairs else None

    def _sub(self, chunk: bytes) -> bytes:
        if self._prefix_re is not None:
            out, pos = [], 0
            for m in self._prefix_re.finditer(chunk):
                at, old, rest = m.start(), m[1], m[2]
                before = chunk[at - 1] if at else 0x20
                if before in _STOP or (before not in _PLAIN and not _continues_name(chunk, at)) \
                        or (before in _LETTERS and _after_csi(chunk, at)):
                    out += [chunk[pos:at], self._pairs[old],
                            rest.replace(b"\\\\", b"/") if old in self._to_posix else rest]
                    pos = m.end()
            chunk = b"".join([*out, chunk[pos:]])
        if self._folder_re is not None:
            chunk = self._folder_re.sub(lambda m: m[1] + self._fpairs[m[2]], chunk)
        return chunk

    def lines(self, raw: bytes) -> bytes:
        if not self._pairs and not self._fpairs:
            return raw
        if not any(h in raw for h in _PROTECT_HINT):
            return self._sub(raw)
        out: list[bytes] = []
        pos = 0
        for m in _PROTECTED.finditer(raw):
            out.append(self._sub(raw[pos : m.start()]))
            out.append(m.group(0))
            pos = m.end()
        out.append(self._sub(raw[pos:]))
        return b"".join(out)

"""Path remapping for restore on another machine (README: "Restoring on another machine").

Only path substrings change: a prefix rule matches at a path boundary
(``/Users/bob`` never matches ``/Users/bobby`` nor ``/x/Users/bob``), in the raw JSON
of a line (so Windows paths match in their escaped ``C:\\\\Users\\\\…`` form), and never
inside ``thinking``/``signature``/redacted ``data`` strings, whose bytes the API checks.
Every other byte of a line is kept.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from syncd.claude import project_folder
from syncd.config import Settings

# Bytes that continue a path name: a prefix must not be followed or preceded by one.
_NAME = rb"A-Za-z0-9._~\-\x80-\xff"
_NAME_BYTES = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._~-"
                        + bytes(range(0x80, 0x100)))
_PROTECTED = re.compile(rb'"(?:thinking|signature|data)":"[^"\\]*(?:\\.[^"\\]*)*"')
# What may follow a Windows prefix: more components, separated by an escaped backslash.
_WIN_REST = rb'((?:\\\\[^\\"<>|*?:]+)*)'
_PROTECT_HINT = (b'"thinking"', b'"signature"', b'"redacted_thinking"')


def _alternatives(pairs: dict[bytes, bytes]) -> bytes:
    return b"|".join(re.escape(k) for k in sorted(pairs, key=len, reverse=True))


def _json_form(text: str) -> bytes:
    """How ``text`` appears inside a JSON string written by JSON.stringify."""
    return json.dumps(text, ensure_ascii=False)[1:-1].encode()


@dataclass(frozen=True, slots=True)
class Rule:
    old: str
    new: str
    why: str = "map"


def local_target(new: str) -> str:
    """A rule's new prefix as Claude names it here: ``~`` expanded, and a directory that
    exists here by its real path (Claude records a working directory and names its folder
    by its real path, however it was entered: through a symlinked checkout too)."""
    path = str(Path(new).expanduser())
    if os.path.isabs(path) and os.path.isdir(path):
        return os.path.realpath(path)
    return path


def config_rules(settings: Settings) -> list[Rule]:
    """The ``remap`` table of the configuration, as rules."""
    return [Rule(old, local_target(new), "config remap") for old, new in settings.remap.items()]


class Remapper:
    """Rewrites paths by prefix rules (longest first) and project folder names."""

    def __init__(self, rules: Iterable[Rule], folders: dict[str, str] | None = None) -> None:
        seen: dict[str, Rule] = {}
        for r in rules:
            old = r.old.rstrip("/\\") or r.old
            new = r.new.rstrip("/\\") or r.new
            if old and old != new and old not in seen:
                seen[old] = Rule(old, new, r.why)
        self.rules = sorted(seen.values(), key=lambda r: len(r.old), reverse=True)
        self.folders = {k: v for k, v in (folders or {}).items() if k != v}
        pairs: dict[bytes, bytes] = {}
        # Windows prefixes mapped to POSIX ones: the separators after the prefix change too.
        self._to_posix: set[bytes] = set()
        for r in self.rules:
            variants = [(r.old, r.new)]
            if "\\" in r.old:  # a Windows path also appears with forward slashes
                variants.append((r.old.replace("\\", "/"), r.new))
            for old, new in variants:
                form = _json_form(old)
                pairs.setdefault(form, _json_form(new))
                if "\\" in r.old and "\\" not in r.new:
                    self._to_posix.add(form)
        self._pairs = pairs
        # Literal first, so the regex engine can skip ahead; what precedes a match is
        # checked in _replace (a lookbehind first would make every position a candidate).
        self._prefix_re = re.compile(
            rb"(" + _alternatives(pairs) + rb")(?![" + _NAME + rb"])" + _WIN_REST
        ) if pairs else None
        fpairs = {f.encode(): t.encode() for f, t in self.folders.items()}
        self._fpairs = fpairs
        self._folder_re = re.compile(
            rb"(projects(?:/|\\\\))(" + _alternatives(fpairs) + rb")(?=/|\\\\|\"|$)"
        ) if fpairs else None

    @property
    def identity(self) -> bool:
        return not self._pairs and not self._fpairs

    def path(self, p: str) -> str:
        """Map one plain path (no JSON escaping)."""
        for r in self.rules:
            for old in (r.old, r.old.replace("\\", "/")) if "\\" in r.old else (r.old,):
                if p == old or (p.startswith(old) and p[len(old)] in "/\\"):
                    rest = p[len(old):]
                    if "\\" in old and "/" in r.new:
                        rest = rest.replace("\\", "/")
                    return r.new + rest
        return p

    def folder(self, name: str) -> str:
        return self.folders.get(name, name)

    def _sub(self, chunk: bytes) -> bytes:
        # The matches come from ``split`` (in C: text, then each group, per match), not
        # from ``sub`` with a callback: a transcript names its prefix on every line, and
        # a Python call per match was most of the rewrite. The same matches either way.
        if self._prefix_re is not None and any(k in chunk for k in self._pairs):
            parts = self._prefix_re.split(chunk)
            at = 0
            for i in range(0, len(parts) - 1, 3):
                at += len(parts[i])
                old, rest = parts[i + 1], parts[i + 2]
                # A prefix starts a path: after a non-name byte, or right after a JSON
                # escape such as \n or \t (tool output); never inside a longer name
                # (/x/home/a, bob/by).
                if not at or chunk[at - 1] not in _NAME_BYTES or (
                        at >= 2 and chunk[at - 2] == 0x5C and chunk[at - 1] in b"nrtbf"):
                    parts[i + 1] = self._pairs[old]
                    if old in self._to_posix:
                        parts[i + 2] = rest.replace(b"\\\\", b"/")
                at += len(old) + len(rest)
            chunk = b"".join(parts)
        if self._folder_re is not None and b"projects" in chunk:
            parts = self._folder_re.split(chunk)
            parts[2::3] = [self._fpairs[f] for f in parts[2::3]]
            chunk = b"".join(parts)
        return chunk

    def line(self, raw: bytes) -> bytes:
        """Rewrite JSON(L) text, any number of lines at once, keeping protected strings.

        A JSON string never holds a raw newline, so protected spans never cross lines.
        """
        if self.identity:
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

    lines = line


def folder_for(cwd: str, remap: Remapper) -> str:
    """The project folder a session recorded at ``cwd`` belongs in after remapping."""
    return project_folder(remap.path(cwd))


# Lines are rewritten about CHUNK bytes at a time; a line longer than LINE_MAX is copied
# as it is (remapping it in pieces could cut a protected thinking block), so memory holds
# at most one batch of lines whatever the file holds.
CHUNK = 8 << 20
LINE_MAX = 16 << 20


def rewrite_lines(src: BinaryIO, emit: Callable[[bytes], object],
                  rewrite: Callable[[bytes], bytes], *, holes: bool = False) -> None:
    """``src``'s lines, ``rewrite``-n a batch at a time (cut at the last line end of each
    CHUNK read, so no Python code runs per line), to ``emit``; a line with no end within
    LINE_MAX bytes is emitted as it is, and the lines after it rewritten again. ``holes``:
    zero bytes (a sparse file's holes) are dropped first."""
    carry, untouched = b"", False
    while chunk := src.read(CHUNK):
        if holes:
            chunk = chunk.replace(b"\0", b"")
        buf = carry + chunk
        if untouched:  # the rest of an overlong line, up to its end
            end = buf.find(b"\n") + 1
            emit(buf if end == 0 else buf[:end])
            carry, untouched = (b"", True) if end == 0 else (buf[end:], False)
            continue
        cut = buf.rfind(b"\n") + 1
        if cut == 0 and len(buf) > LINE_MAX:
            emit(buf)
            carry, untouched = b"", True
        elif cut:
            emit(rewrite(buf[:cut]))
            carry = buf[cut:]
        else:
            carry = buf
    if carry:  # a last line without its line end
        emit(carry if untouched else rewrite(carry))

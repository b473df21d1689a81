"""Path remapping for restore on another machine (README: "Restoring on another machine").

Only path substrings change: a prefix rule matches at a path boundary
(``/Users/bob`` never matches ``/Users/bobby``, ``/x/Users/bob`` nor ``café/Users/bob``;
it does after ``→``, an emoji or any other character that is not a name's), in the raw JSON
of a line (so Windows paths match in their escaped ``C:\\\\Users\\\\…`` form), and never
inside ``thinking``/``signature``/redacted ``data`` strings, whose bytes the API checks.
Every other byte of a line is kept.

A batch of lines is rewritten at once (``Remapper._whole``): one pass of each pattern
over the whole text, and what each match's neighbours say decided for all matches
together in C; protected strings are not looked for when the ``":"`` before each match
shows it outside them, or the one string it opens settles it. The stretch-by-stretch
rewrite (``_gapwise``) stays for rules whose prefixes or folders could reach across a
quote.
"""

from __future__ import annotations

import functools
import json
import os
import re
import unicodedata
from bisect import bisect_right
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import accumulate, chain, compress, repeat
from operator import add, is_, not_, sub
from pathlib import Path
from typing import BinaryIO, overload

from syncd.claude import project_folder
from syncd.config import Settings

# Bytes that may continue a path name: a prefix must not be followed by one (any non-ASCII
# byte too: the regex alone decides, so a shorter rule can match there). Before a
# prefix, a non-ASCII character is looked at whole: see _continues_name.
_NAME = rb"A-Za-z0-9._~\-\x80-\xff"
_ASCII_NAME = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._~-")
_HEX = frozenset(b"0123456789abcdefABCDEF")
# The bytes before a prefix that decide at once (the common cases, without a call): an
# ASCII non-name byte starts a path; a name byte that cannot end an escape does not.
_STOP = frozenset(range(0x80)) - _ASCII_NAME
_PLAIN = _ASCII_NAME - _HEX - frozenset(b"nrtbf")
# A terminal escape sequence (CSI: ESC [ parameters intermediates final, the ESC as JSON
# writes it) ends in a letter, yet is not a name: Claude's /cd prints its directory in
# bold (``Moved to \u001b[1m/path\u001b[22m``) and a colored listing does the same.
_CSI = re.compile(rb"\\u001[bB]\[[0-?]*[ -/]*[@-~]\Z")
_CSI_MAX = 24  # the longest CSI looked at, in JSON form: ``\u001b[38;2;255;255;255m``
_LETTERS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_PROTECTED = re.compile(rb'"(?:thinking|signature|data)":"[^"\\]*(?:\\.[^"\\]*)*"')
# What may follow a Windows prefix: more components, separated by an escaped backslash.
_WIN_REST = rb'((?:\\\\[^\\"<>|*?:]+)*)'
_PROTECT_HINT = (b'"thinking"', b'"signature"', b'"redacted_thinking"')
_HINT_OPEN = _PROTECT_HINT[:2]
_OPENINGS = (b'"thinking":"', b'"signature":"', b'"data":"')
# What the byte before a prefix decides at once, looked up for all matches in C: after an
# ASCII non-name byte a path starts, after ``._~-`` it does not; None: ask _starts_path
# (or, for a JSON escape letter, the byte before it).
_AT_ONCE: list[bool | None] = [
    True if b in _STOP else False if b in b"._~-" else None for b in range(256)]
_ESCAPE = frozenset(b"nrtbf")


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


def _continues_name(chunk: bytes, at: int, lo: int = 0) -> bool:
    """Whether the character before ``chunk[at]`` (``at`` > ``lo``, where the text looked
    at starts) is part of a path name: an ASCII letter, digit or ``._~-``, or a letter,
    digit or mark of any script (``café``, ``中文``); not a JSON escape of a control
    character (``\\n``, ``\\t``: tool output) nor a symbol or punctuation (``→`` of the Read
    tool's line numbers, ``│``, an emoji). Bytes that are not UTF-8 count as a name, as
    they did."""
    b = chunk[at - 1]
    if b < 0x80:
        if b not in _ASCII_NAME:
            return False
        if at - lo >= 2 and chunk[at - 2] == 0x5C and b in b"nrtbf":
            return False
        if b in _HEX and at - lo >= 6 and chunk[at - 6] == 0x5C and chunk[at - 5] == 0x75 \
                and all(c in _HEX for c in chunk[at - 4 : at - 1]):
            # A \\uXXXX escape (unless its backslash is itself escaped) is its character.
            lead = at - 6
            while lead > lo and chunk[lead - 1] == 0x5C:
                lead -= 1
            if (at - 6 - lead) % 2 == 0:
                return _name_char(chr(int(chunk[at - 4 : at], 16)))
        return True
    return _ends_in_name(chunk[max(lo, at - 4) : at])


def _after_csi(chunk: bytes, at: int, lo: int = 0) -> bool:
    """Whether a terminal escape sequence (CSI) ends at ``chunk[at]`` (``at`` > ``lo``),
    its backslash not itself escaped."""
    m = _CSI.search(chunk, max(lo, at - _CSI_MAX), at)
    if m is None:
        return False
    lead = m.start()
    while lead > lo and chunk[lead - 1] == 0x5C:
        lead -= 1
    return (m.start() - lead) % 2 == 0


def _starts_path(chunk: bytes, at: int, lo: int = 0) -> bool:
    """Whether a prefix at ``chunk[at]`` starts a path, looking no further back than
    ``lo``: after a character that is not a name's (see _continues_name) or a terminal
    escape; never inside a longer name (/x/home/a, bob/by)."""
    before = chunk[at - 1] if at > lo else 0x20
    return before in _STOP or (before not in _PLAIN and not _continues_name(chunk, at, lo)) \
        or (before in _LETTERS and _after_csi(chunk, at, lo))


def _outside_protected(text: bytes, at: list[int]) -> bool:
    """Whether no position of ``at`` (sorted) is in a protected string, as the ``":"``
    last before each tells: a position is in one only if that ends the string's opening
    (``"thinking":"``), as one in the string itself would have closed it. False: maybe.
    Each position starts an edit (a prefix's slash, or a folder after its separator):
    not a quote, after no byte of an opening, in a match that holds no quote."""
    # The last ``":"`` before each position is in the stretch since the one before, or it
    # is the one before's, looked at already.
    found = filter((-1).__ne__, map(text.rfind, repeat(b'":"'), chain((0,), at), at))
    return not any(map(text.endswith, repeat(_OPENINGS), repeat(0), map(add, found, repeat(3))))


def _inside(text: bytes, at: list[int], scan: _Scan | None) -> set[int] | None:
    """Of the positions ``at`` (sorted, as for _outside_protected), those in a protected
    string, found from the opening the ``":"`` last before each ends: the string that
    opening starts holds the position when it reaches past it and is itself in no other
    (no opening ends at its quote nor at the ``":"`` last before it, within 64 KiB).
    None: not known so (a prefix there looks further back than its stretch)."""
    last = list(accumulate(map(text.rfind, repeat(b'":"'), chain((0,), at), at), max))
    inside: set[int] = set()
    strings: dict[int, tuple[int, bool]] = {}  # opening → its string's end, and alone
    for x, p in compress(zip(at, last, strict=True), map(
            text.endswith, repeat(_OPENINGS), repeat(0), map(add, last, repeat(3)))):
        if scan is not None:  # a prefix decided by more than the byte before it
            i = bisect_right(scan[2], x) - 1
            if i >= 0 and scan[2][i] == x and scan[3][i] is None:
                return None
        if p not in strings:
            c = next(p + 3 - len(o) for o in _OPENINGS if text.endswith(o, 0, p + 3))
            m = _PROTECTED.match(text, c)
            before = text.rfind(b'":"', max(0, c - 65536), c)
            strings[p] = (0 if m is None else m.end(), not (
                text.endswith(_OPENINGS, 0, c + 1) or (before < 0 and c > 65536)
                or text.endswith(_OPENINGS, 0, before + 3)))
        end, alone = strings[p]
        if end > x:  # else no string there, or one that closes before x
            if not alone:
                return None
            inside.add(x)
    return inside


@functools.lru_cache(maxsize=4096)
def _ends_in_name(window: bytes) -> bool:
    """Whether the character that ends ``window`` (its last 1-4 bytes) is a name's. Cached:
    a transcript repeats the same few (``→`` before every line of a listing)."""
    start = len(window) - 1  # back to the first byte of the UTF-8 sequence ending here
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
        # checked after (a lookbehind first would make every position a candidate).
        self._prefix_re = re.compile(
            rb"(" + _alternatives(pairs) + rb")(?![" + _NAME + rb"])" + _WIN_REST
        ) if pairs else None
        fpairs = {f.encode(): t.encode() for f, t in self.folders.items()}
        self._fpairs = fpairs
        self._folder_re = re.compile(
            rb"(projects(?:/|\\\\))(" + _alternatives(fpairs) + rb")(?=/|\\\\|\"|$)"
        ) if fpairs else None
        # The whole text at once (``_whole``) finds what each stretch between protected
        # strings would, when no match can reach across a quote: no prefix holds one, no
        # folder name a quote, separator or line end (then ``$``, the end of a stretch,
        # is a quote after it, a line end before one, or the end of the text).
        self._whole_ok = all(0x22 not in k for k in pairs) and not any(
            c in f for f in fpairs for c in b'"/\\\n')
        # Folders found in the text before its prefixes are replaced are the same as after
        # when the two cannot meet: every prefix, old and new, starts with a slash (which no
        # folder name holds and no replaced prefix follows "projects" directly), and none
        # holds "projects" or ends in a start of it.
        heads = tuple(b"projects"[:i] for i in range(1, 8))
        self._apart = all(
            v.startswith(b"/") and b"projects" not in v and not v.endswith(heads)
            for kv in pairs.items() for v in kv)
        # What every folder name starts with: where it is missing no folder is.
        first, last = min(fpairs, default=b""), max(fpairs, default=b"")
        same = next((i for i, (a, b) in enumerate(zip(first, last, strict=False)) if a != b),
                    min(len(first), len(last)))
        self._folder_head = first[:same] or b"projects"
        self._folder_any = re.compile(
            rb"(projects(?:/|\\\\))(" + _alternatives(fpairs) + rb")(?=/|\\\\|\"|\n|\Z)"
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
                if _starts_path(chunk, at):
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

    def _whole(self, raw: bytes) -> bytes:
        """``_gapwise``'s output, from one pass of each pattern over the whole text and
        the decisions for all matches at once, in C (see ``_prefixes``): no Python runs
        per stretch between protected strings nor, mostly, per match. Protected strings
        are looked for only when the bytes before an edit do not tell that it is outside
        them (``_outside_protected``), or when the rules need them to be known."""
        scan = self._scan(raw) if self._prefix_re is not None else None
        found = list(self._folder_any.finditer(raw)) \
            if self._folder_any is not None and self._folder_head in raw else None
        if self._apart:
            # Every match, taken or not, outside protected strings, or in one known from
            # the bytes around it (_inside): decided without looking for them all.
            folders = self._folders(raw, None, found) if found is not None else _Edits([], [], [])
            at = scan[2] if scan is not None else []
            if folders is not None and folders.starts:
                at = sorted(chain(at, folders.starts))
            inside: set[int] | None = set()
            if folders is not None and at and not _outside_protected(raw, at) \
                    and any(h in raw for h in _PROTECT_HINT):
                inside = _inside(raw, at, scan)
            if folders is not None and inside is not None:
                done = [self._prefixes(raw, None, scan, inside)] if scan is not None else []
                if inside and folders.news:
                    folders = folders.without(inside)
                if not (done and done[0].posix):
                    return _Edits.merged([*done, folders]).apply(raw, [])[0]
        # Protected spans as sorted bounds: a position is inside one iff the number of
        # bounds at or before it is odd. Protected at all only when the text names a
        # thinking block (one found says so without looking again).
        bounds: list[int] = []
        spans = list(_PROTECTED.finditer(raw))
        if spans and (any(map(raw.startswith, repeat(_HINT_OPEN), map(re.Match.start, spans)))
                      or any(h in raw for h in _PROTECT_HINT)):
            bounds = list(chain.from_iterable(map(re.Match.span, spans)))
        done = [self._prefixes(raw, bounds, scan)] if scan is not None else []
        if self._folder_any is not None:
            if done and done[0].news and (done[0].posix or not self._apart):  # as rewritten
                raw, bounds = done.pop().apply(raw, bounds)
                found = list(self._folder_any.finditer(raw)) \
                    if self._folder_head in raw else None
            if found is not None:
                done.append(self._folders(raw, bounds, found))
        return _Edits.merged(done).apply(raw, [])[0]

    def _scan(self, raw: bytes) -> _Scan:
        """``raw``'s prefixes, and what the byte before each decides at once (None: ask).
        ``split`` (text, then prefix and rest, per match) makes no match objects: a
        transcript may name a prefix every few bytes."""
        assert self._prefix_re is not None
        parts = self._prefix_re.split(raw)
        ends = list(accumulate(map(len, parts)))  # of text, prefix, rest, text, ...
        starts = ends[0 : len(parts) - 1 : 3]
        ok = list(map(_AT_ONCE.__getitem__, map(raw.__getitem__, map(sub, starts, repeat(1)))))
        if starts and starts[0] == 0:
            ok[0] = True
        return parts, ends, starts, ok

    def _prefixes(self, raw: bytes, bounds: list[int] | None, scan: _Scan,
                  inside: set[int] | None = None) -> _Edits:
        """Where ``raw``'s prefixes (``scan``) are replaced, outside protected strings
        (``bounds``; None: not known, see _whole, but for the matches at ``inside``)."""
        parts, ends, starts, ok = scan
        n = len(starts)
        if not n:
            return _Edits([], [], [])
        ok = ok.copy()
        # After a JSON escape (``\\n``) a path starts (a byte before it, where a stretch
        # begins, is a quote). Looking back further stops at a protected string's closing
        # quote as at the start of its stretch, but for a terminal escape that holds that
        # quote: then no ``":"`` is between the string's opening and the match, which
        # sends it to the full path (_outside_protected); so without ``bounds``, 0 will do.
        ks = list(map(bisect_right, repeat(bounds), starts)) if bounds else [0] * n
        for i in compress(range(n), map(is_, ok, repeat(None))):
            at, k = starts[i], ks[i]
            lo = bounds[k - 1] if bounds and k else 0
            if (b := raw[at - 1]) >= 0x80:  # what _starts_path comes to, one call less
                ok[i] = not _ends_in_name(raw[max(lo, at - 4) : at])
            elif b in _ESCAPE and at >= 2 and raw[at - 2] == 0x5C:
                ok[i] = True
            else:
                ok[i] = _starts_path(raw, at, lo)
        if bounds:
            for i in compress(range(n), map(int.__and__, ks, repeat(1))):
                ok[i] = False  # inside a protected string
        elif inside:
            for i in compress(range(n), map(inside.__contains__, starts)):
                ok[i] = False
        if True not in ok:
            return _Edits([], [], [])
        starts = list(compress(starts, ok))
        olds = list(compress(parts[1::3], ok))
        news = list(map(self._pairs.__getitem__, olds))
        tp = self._to_posix
        if tp and not tp.isdisjoint(olds):  # the separators after the prefix change too
            rests = compress(parts[2::3], ok)
            news = [new + rest.replace(b"\\\\", b"/") if old in tp else new
                    for new, old, rest in zip(news, olds, rests, strict=True)]
            return _Edits(starts, [e if old in tp else e - len(rest) for old, rest, e in zip(
                olds, compress(parts[2::3], ok), compress(ends[2::3], ok), strict=True)],
                news, posix=True)
        return _Edits(starts, list(compress(ends[1::3], ok)), news)

    @overload
    def _folders(self, text: bytes, bounds: list[int], found: list[re.Match[bytes]]
                 ) -> _Edits: ...
    @overload
    def _folders(self, text: bytes, bounds: None, found: list[re.Match[bytes]]
                 ) -> _Edits | None: ...

    def _folders(self, text: bytes, bounds: list[int] | None,
                 found: list[re.Match[bytes]]) -> _Edits | None:
        """Where ``text``'s project folders (``found``) are replaced, outside protected
        strings (``bounds``; None: not known, and None if it could matter)."""
        # A folder before a line end is one at the end of its stretch only: the text's, or
        # before a protected string.
        after = list(map(re.Match.end, found))
        lf = list(map(text.startswith, repeat(b"\n"), after))
        if bounds is None:
            if True in lf:
                return None
        elif bounds or True in lf:
            opens = set(bounds[0::2])
            ok = list(map(not_, map(int.__and__, map(
                bisect_right, repeat(bounds), map(re.Match.start, found)), repeat(1))))
            for i in compress(range(len(found)), lf):
                ok[i] = ok[i] and (after[i] + 1 == len(text) or after[i] + 1 in opens)
            found = list(compress(found, ok))
        return _Edits(list(map(re.Match.start, found, repeat(2))),
                      list(map(re.Match.end, found, repeat(2))),
                      list(map(self._fpairs.__getitem__, map(re.Match.group, found, repeat(2)))))

    def line(self, raw: bytes) -> bytes:
        """Rewrite JSON(L) text, any number of lines at once, keeping protected strings.

        A JSON string never holds a raw newline, so protected spans never cross lines.
        """
        if self.identity:
            return raw
        if self._whole_ok:
            return self._whole(raw)
        return self._gapwise(raw)

    def _gapwise(self, raw: bytes) -> bytes:
        """Each stretch between protected strings on its own (``_sub``): what ``_whole``
        reproduces when it may."""
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


# A text's prefix matches: ``split``'s parts, their ends, each match's start, and what
# the byte before each decides at once.
_Scan = tuple[list[bytes], list[int], list[int], list[bool | None]]


@dataclass(slots=True)
class _Edits:
    """Stretches of a text to replace: ``text[starts[i]:ends[i]]`` by ``news[i]``, in
    order and apart. ``posix``: a Windows rest became a POSIX one."""

    starts: list[int]
    ends: list[int]
    news: list[bytes]
    posix: bool = False

    def apply(self, text: bytes, bounds: list[int]) -> tuple[bytes, list[int]]:
        """``text`` edited (copied once), and ``bounds`` (positions none of which is inside
        a replaced stretch) moved to match."""
        if not self.news:
            return text, bounds
        # Short stretches are copied cheaper than viewed, long ones the other way.
        view = memoryview(text) if len(text) > 256 * len(self.news) else text
        pieces: list[bytes | memoryview] = [b""] * (2 * len(self.news) + 1)
        pieces[0::2] = map(view.__getitem__, map(
            slice, chain((0,), self.ends), chain(self.starts, (len(text),))))
        pieces[1::2] = self.news
        if bounds:  # each moved by what the edits before it added
            grown = list(accumulate(map(sub, map(len, self.news),
                                        map(sub, self.ends, self.starts)), initial=0))
            bounds = list(map(int.__add__, bounds, map(
                grown.__getitem__, map(bisect_right, repeat(self.ends), bounds))))
        return b"".join(pieces), bounds

    def without(self, starts: set[int]) -> _Edits:
        """These edits but those that start at ``starts``."""
        kept = [e for e in zip(self.starts, self.ends, self.news, strict=True)
                if e[0] not in starts]
        return _Edits([e[0] for e in kept], [e[1] for e in kept], [e[2] for e in kept],
                      self.posix)

    @staticmethod
    def merged(edits: list[_Edits]) -> _Edits:
        """Sets of edits, which do not overlap, as one."""
        edits = [e for e in edits if e.news]
        if len(edits) < 2:
            return edits[0] if edits else _Edits([], [], [])
        merged = sorted(chain.from_iterable(
            zip(e.starts, e.ends, e.news, strict=True) for e in edits))
        starts, ends, news = map(list, zip(*merged, strict=True))
        return _Edits(starts, ends, news, any(e.posix for e in edits))


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

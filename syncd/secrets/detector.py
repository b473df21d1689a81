"""What looks like a secret in transcript bytes, by detect-secrets' maintained plugins.

Transcripts are JSONL whose text lives in JSON-escaped strings: the plugins run on the
decoded string values (a PEM key's ``\\n`` escapes are newlines to them), line by line
of each value as detect-secrets runs them on a file, and each finding is reported where
its raw bytes are in the file (offset and length of the escaped text), so that it can be
replaced in place by text of the same JSON-string validity.

Speed: the plugins are slow per line, and nearly every transcript line holds nothing.
A line is first decoded whole in C (its string values run together, one ``json.loads``;
object keys are the transcript's schema, not scanned) and the plugins' own patterns are
searched in that text: those Python's ``re`` cannot skip through only in the lines that
hold a word every match holds (``_ANCHORS``); the high-entropy plugins' quoted strings
only if they could pass the entropy limit (``n`` distinct characters carry at most
``log2(n)`` bits). Only a line with a candidate is taken apart value by value and
confirmed by the plugins and detect-secrets' heuristic filters, then ours.

Plugins are called on strings alone (``analyze_string``): never their ``verify``, which
would send a found key to its service. Left out: the public IPv4 plugin (an address is
not a secret). The keyword plugin takes the quoted forms it uses for source files, and
its unquoted ``KEY=value`` (a ``.env`` file) when the value looks made, not named.

Strings of a ``thinking`` block (``thinking``, ``signature``), a ``redacted_thinking``
block's ``data`` and any ``signature`` are signed: the API checks them on a resume, so
a finding there is marked ``signed`` (it cannot be redacted, only forgotten).
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

# A line longer than this is not decoded (that would take several times its size): it
# is skipped with a note.
LINE_MAX = 8 << 20
# Plain text is scanned in pieces of whole lines of about this size.
TEXT_PIECE = 1 << 20
# Characters shown of a value at each end, at most.
SHOWN = 4
_LEFT_OUT = frozenset({"IPPublicDetector"})
_PEM_END = re.compile(r"-----END [A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----")

# A string value (not an object's key: those are the transcript's schema); one a cut
# line leaves open ends with the line.
_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"[ \t\r]*+:|"((?:[^"\\]++|\\.)*+)(?:"|\\?\Z)',
                     re.DOTALL)
_TOKEN = re.compile(rb'"(?:[^"\\]++|\\.)*+(?:"|\\?\Z)|[{}\[\],:]', re.DOTALL)
_ESCAPES = {ord('"'): '"', ord("\\"): "\\", ord("/"): "/", ord("b"): "\b",
            ord("f"): "\f", ord("n"): "\n", ord("r"): "\r", ord("t"): "\t"}


@dataclass(frozen=True, slots=True)
class RawFinding:
    """One finding in the scanned bytes: never the value, only where it is."""

    line: int     # 1-based line of the scanned bytes (first_line for the first)
    offset: int   # raw bytes [offset, offset + length) (base_offset counted in)
    length: int
    kind: str     # the plugin's secret type, e.g. "AWS Access Key"
    masked: str   # e.g. "AKIA…MPLE"
    signed: bool  # inside a thinking/signature/redacted data string
    sha256: str   # hex, of the raw bytes


# -- the plugins --------------------------------------------------------------------------

# Plugins whose patterns Python's ``re`` cannot skip through fast (they begin with a
# lookbehind, an alternation or a class): each is searched only in the decoded lines
# that hold one of the words every match of it holds (lowercase: in the lowered text).
# A plugin not named here has its patterns searched in the whole text.
_ANCHORS: dict[str, tuple[tuple[str, ...], bool]] = {
    "KeywordDetector": (("key", "pw", "pass", "secret", "contrase"), True),
    "IbmCloudIamDetector": (("key", "pw", "pass", "token"), True),
    "IbmCosHmacDetector": (("key",), True),
    "CloudantDetector": (("key", "pw", "pass", "token", "cloudant"), True),
    "SoftlayerDetector": (("key", "pw", "pass", "token", "softlayer"), True),
    "AWSKeyDetector": (("aws", "akia", "asia", "abia", "acca", "a3t"), True),
    "ArtifactoryDetector": (("AKC", "AP"), False),
    "MailchimpDetector": (("-us",), False),
    "SlackDetector": (("xox", "hooks.slack.com"), True),
    "StripeDetector": (("k_live_",), False),
}
# And what else such a line must hold (searched in it lowered): the keyword plugin's
# quoted forms a quote and an assignment, comparison or ``;``; the IBM, Cloudant and
# SoftLayer keys a run of 24 characters at least.
_LONG_RUN = re.compile(r"[A-Za-z0-9_-]{24}")
_NEEDS: dict[str, tuple[re.Pattern[str], ...]] = {
    "KeywordDetector": (re.compile("['\"`]"), re.compile("[:=;]")),
    "IbmCloudIamDetector": (_LONG_RUN,),
    "IbmCosHmacDetector": (_LONG_RUN,),
    "CloudantDetector": (_LONG_RUN,),
    "SoftlayerDetector": (_LONG_RUN,),
}
# Transcript values that are no secrets though a plugin takes them: Anthropic's ids of
# requests, messages and tool calls, paths and URLs, digests (git ids, sha256 of tool
# outputs), and the placeholders of documentation (``user:password@host``).
_IDS = re.compile(r"(?:req|msg|msgbatch|toolu|srvtoolu|file)_[A-Za-z0-9]{8,}")
_PATH = re.compile(r"(?:\.{0,2}|~)/|[A-Za-z][\w+.-]*://")
_DIGEST_LENGTHS = (40, 64)
_NAME = re.compile(r"[A-Za-z_][A-Za-z_.]*\d*")
_PLACEHOLDERS = frozenset({
    "password", "passwd", "pass", "pwd", "secret", "changeit", "changeme", "example",
    "username", "token", "apikey", "api_key", "none", "null", "true", "false", "redacted"})
_PLACEHOLDER = re.compile(r"(.)\1*|<[^<>]*>|\[[^\[\]]*\]|\*+|x+|your[_-].*",
                          re.IGNORECASE)


@dataclass
class _Rules:
    fast: list[re.Pattern[str]]     # searched in the whole text
    # (words, whether they are lowercase, what else the line needs, [(pattern, whether it
    # runs on the lowered line)])
    anchored: list[tuple[tuple[str, ...], bool, tuple[re.Pattern[str], ...],
                         list[tuple[re.Pattern[str], bool]]]]
    regex: list[Any]                # RegexBasedDetector plugins
    entropy: list[Any]              # the high-entropy string plugins
    keyword: Any                    # KeywordDetector
    keyword_groups: dict[re.Pattern[str], int]
    env_groups: dict[re.Pattern[str], int]  # the keyword plugin's unquoted ``KEY=value``
    candidates: list[tuple[Any, re.Pattern[str]]]  # high-entropy: quoted, long enough
    lower_words: tuple[str, ...] = ()  # every anchor word looked for in the lowered text
    words: tuple[str, ...] = ()        # and in the text as it is


@lru_cache(maxsize=1)
def _rules() -> _Rules:
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
    from detect_secrets.plugins import keyword as kw
    from detect_secrets.plugins.base import RegexBasedDetector
    from detect_secrets.plugins.high_entropy_strings import HighEntropyStringsPlugin

    r = _Rules([], [], [], [], None, kw.QUOTES_REQUIRED_DENYLIST_REGEX_TO_GROUP,
               {kw.FOLLOWED_BY_EQUAL_SIGNS_REGEX: 5}, [])
    cls: Any
    for cls in get_mapping_from_secret_type_to_class().values():
        if cls.__name__ in _LEFT_OUT:
            continue
        plugin = cls()
        patterns: list[re.Pattern[str]] = []
        if isinstance(plugin, RegexBasedDetector):
            r.regex.append(plugin)
            patterns = list(plugin.denylist)
        elif isinstance(plugin, HighEntropyStringsPlugin):
            r.entropy.append(plugin)
            # The plugin's own quoted-string pattern, but only as long as a string must
            # be to hold more than its limit of entropy.
            need = math.floor(2 ** plugin.entropy_limit) + 1
            chars = re.escape(plugin.charset)
            r.candidates.append((plugin, re.compile(rf"(['\"])([{chars}]{{{need},}})(\1)")))
        elif isinstance(plugin, kw.KeywordDetector):
            r.keyword = plugin
            patterns = list(r.keyword_groups)
        anchor = _ANCHORS.get(cls.__name__)
        if anchor is None:
            r.fast.extend(patterns)
        elif patterns:
            r.anchored.append((*anchor, _NEEDS.get(cls.__name__, ()),
                               [_lowered(rx) for rx in patterns]))
        if isinstance(plugin, kw.KeywordDetector) and anchor is not None:
            # Its words (each holds one of the anchors), the rest of a name, an equal sign.
            words = "|".join(map(re.escape, anchor[0]))
            assign = re.compile(rf"(?:{words})\w*[\]'\"]{{0,2}}\s*[=!]")  # on the lowered
            r.anchored.append((anchor[0], anchor[1], (assign,),
                               [_lowered(rx) for rx in r.env_groups]))
    r.lower_words = tuple(dict.fromkeys(w for a, low, _, _ in r.anchored if low for w in a))
    r.words = tuple(dict.fromkeys(w for a, low, _, _ in r.anchored if not low for w in a))
    return r


def _lowered(rx: re.Pattern[str]) -> tuple[re.Pattern[str], bool]:
    """A case-blind pattern with no capital in it (but escapes: ``\\W``) as a case-bound one
    to search the lowered text with: Python's ``re`` is ten times slower blind."""
    if not rx.flags & re.IGNORECASE or re.search(r"(?<!\\)[A-Z]", rx.pattern):
        return rx, False
    return re.compile(rx.pattern, rx.flags & ~re.IGNORECASE), True


def _lines_with(text: str, hay: str, words: Iterable[str]
                ) -> Iterator[tuple[int, str, str]]:
    """Each decoded line of ``text`` where ``hay`` (it, or it lowered) holds one of
    ``words``, once: where it starts, the line, and the same of ``hay``."""
    done: set[int] = set()
    for w in words:
        i = hay.find(w)
        while i >= 0:
            s = hay.rfind("\n", 0, i) + 1
            e = hay.find("\n", i)
            e = len(hay) if e < 0 else e
            if s not in done:
                done.add(s)
                yield s, text[s:e], hay[s:e]
            i = hay.find(w, e)


def _entropic(p: Any, rx: re.Pattern[str], text: str) -> bool:
    """Whether ``text`` holds a quoted string that may pass ``p``'s entropy limit."""
    for m in rx.finditer(text):
        s = m.group(2)
        if len(set(s)) > 2 ** p.entropy_limit and not _not_secret(p, s):
            return True
    return False


def _anchored(text: str, every: bool) -> list[int]:
    """Where the decoded lines of ``text`` begin that an anchored pattern matches (the
    first only, unless ``every``)."""
    r = _rules()
    found: list[int] = []
    low = text.lower()
    for lower, words in ((True, r.lower_words), (False, r.words)):
        for start, piece, hay in _lines_with(text, low if lower else text, words):
            piece_low = hay if lower else piece.lower()
            present = {w for w in words if w in hay}
            if any(not present.isdisjoint(anchors) and on_lower == lower
                   and all(rx.search(piece_low) for rx in needs)
                   and any(rx.search(piece_low if lowered else piece)
                           for rx, lowered in patterns)
                   for anchors, on_lower, needs, patterns in r.anchored):
                found.append(start)
                if not every:
                    return found
    return found


def _candidate(text: str) -> bool:
    """Whether any plugin could find something in ``text`` (a superset of the lines
    the plugins confirm, but for the values ``_not_secret`` takes out)."""
    r = _rules()
    return any(rx.search(text) for rx in r.fast) or \
        any(_entropic(p, rx, text) for p, rx in r.candidates) or bool(_anchored(text, False))


def _candidate_lines(text: str) -> Iterator[tuple[int, str]]:
    """(start, line) of each decoded line of ``text`` that holds a candidate: the whole
    looked at once, then only the patterns that matched in it tried line by line."""
    r = _rules()
    fast = [rx for rx in r.fast if rx.search(text)]
    entropy = [(p, rx) for p, rx in r.candidates if _entropic(p, rx, text)]
    anchored = set(_anchored(text, True))
    pos = 0
    for piece in text.split("\n"):
        if pos in anchored or any(rx.search(piece) for rx in fast) or \
                any(_entropic(p, rx, piece) for p, rx in entropy):
            yield pos, piece
        pos += len(piece) + 1


def _not_secret(plugin: Any, secret: str) -> bool:
    """A transcript's values that are no secrets (see ``_IDS`` and below)."""
    kind = plugin.secret_type
    if kind == "Hex High Entropy String":
        return len(secret) in _DIGEST_LENGTHS
    if kind == "Base64 High Entropy String":
        return bool(_IDS.fullmatch(secret) or _PATH.match(secret) or "://" in secret)
    if kind in ("Secret Keyword", "Basic Auth Credentials"):
        return secret.lower() in _PLACEHOLDERS or bool(_PLACEHOLDER.fullmatch(secret))
    return False


def _made(value: str) -> bool:
    """An unquoted value that is no name: 8 characters or more, letters and digits, and
    not an identifier (``STORE_PASSWORD``, ``mock_secret_v2``, ``None``)."""
    return len(value) >= 8 and not any(c.isspace() for c in value) and \
        any(c.isdigit() for c in value) and any(c.isalpha() for c in value) and \
        not _NAME.fullmatch(value)


def _filtered(secret: str, line: str, plugin: Any) -> bool:
    """detect-secrets' default heuristic filters (those that look at a secret), then
    ours for transcripts."""
    from detect_secrets.filters import heuristic as h

    return (h.is_sequential_string(secret) or h.is_potential_uuid(secret)
            or h.is_likely_id_string(secret, line, plugin) or h.is_templated_secret(secret)
            or h.is_prefixed_with_dollar_sign(secret) or h.is_indirect_reference(line)
            or h.is_not_alphanumeric_string(secret) or _not_secret(plugin, secret))


def _confirmed(line: str) -> Iterator[tuple[str, int, int, Any]]:
    """(kind, start, end, plugin) of each secret the plugins find in one decoded line."""
    r = _rules()
    for p in r.regex:
        # The plugin's patterns, each match where it is: the plugin's own group when it
        # holds the value (``aws...key = "<it>"``), the whole match when its group is
        # only the prefix (``(ghp|gho)_...``).
        for rx in p.denylist:
            for m in rx.finditer(line):
                spans = [m.span(i) for i in range(1, (rx.groups or 0) + 1) if m.group(i)]
                s, e = max(spans, key=lambda x: x[1] - x[0]) if spans else m.span()
                if s == m.start() or e - s <= 3:
                    s, e = m.span()
                yield p.secret_type, s, e, p
    found: list[tuple[str, str, Any]] = []
    for p in r.entropy:
        for v in p.analyze_string(line):
            # The url-safe charset holds a backslash: a JSON-in-a-string's \\" is not
            # part of the value.
            v = v.rstrip("\\")
            if p.calculate_shannon_entropy(v) > p.entropy_limit:
                found.append((p.secret_type, v, p))
    if r.keyword is not None:
        quoted = set(r.keyword.analyze_string(line, denylist_regex_to_group=r.keyword_groups))
        found += [(r.keyword.secret_type, v, r.keyword) for v in quoted]
        # A .env file, a shell line: KEY=value unquoted, which code is full of too
        # (``secret = get_secret()``): only a value that looks made, not named.
        for v in r.keyword.analyze_string(line, denylist_regex_to_group=r.env_groups):
            v = v.split(None, 1)[0] if v.strip() else v  # the word after "=", in prose
            if v not in quoted and _made(v):
                found.append((r.keyword.secret_type, v, r.keyword))
    for kind, v, p in found:  # these plugins give values: each place it is
        at = line.find(v) if v else -1
        while at >= 0:
            yield kind, at, at + len(v), p
            at = line.find(v, at + len(v))


# -- decoding with positions --------------------------------------------------------------

class Offsets:
    """For each character of a decoded string, the offset of its first raw byte (one
    more index: the end), worked out when asked: runs without escapes are kept whole."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.chars: list[int] = []  # where each piece begins, in characters
        self.raw: list[int] = []    # and in raw bytes
        self.runs: list[str | None] = []  # its text when a run of plain UTF-8

    def add(self, char: int, raw: int, run: str | None) -> None:
        self.chars.append(char)
        self.raw.append(raw)
        self.runs.append(run)

    def __getitem__(self, i: int) -> int:
        k = bisect.bisect_right(self.chars, i) - 1
        if k < 0:
            return 0
        run = self.runs[k]
        if run is None:  # an escape: one character
            return self.raw[k] if i == self.chars[k] else \
                (self.raw[k + 1] if k + 1 < len(self.raw) else self.size)
        into = i - self.chars[k]
        if into >= len(run):
            return self.raw[k + 1] if k + 1 < len(self.raw) else self.size
        return self.raw[k] + len(run[:into].encode("utf-8", "surrogateescape"))


def decode(raw: bytes) -> tuple[str, Offsets]:
    """A JSON string literal's content decoded as ``json.loads`` does (surrogate pairs
    joined), and where each character's raw bytes begin. Invalid UTF-8 is one lone
    surrogate per byte; a bad escape is itself."""
    out: list[str] = []
    at = Offsets(len(raw))
    chars = 0
    i, n = 0, len(raw)
    while i < n:
        j = raw.find(b"\\", i)
        if j < 0:
            j = n
        if j > i:
            text = raw[i:j].decode("utf-8", "surrogateescape")
            at.add(chars, i, text)
            out.append(text)
            chars += len(text)
            i = j
            continue
        e = raw[i + 1] if i + 1 < n else -1
        at.add(chars, i, None)
        chars += 1
        if e in _ESCAPES:
            out.append(_ESCAPES[e])
            i += 2
        elif e == ord("u") and _hex4(raw, i + 2):
            cp = int(raw[i + 2:i + 6], 16)
            step = 6
            if 0xD800 <= cp < 0xDC00 and raw[i + 6:i + 8] == b"\\u" and _hex4(raw, i + 8):
                lo = int(raw[i + 8:i + 12], 16)
                if 0xDC00 <= lo < 0xE000:
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00)
                    step = 12
            out.append(chr(cp))
            i += step
        else:
            out.append("\\")
            i += 1
    return "".join(out), at


def _hex4(raw: bytes, i: int) -> bool:
    return len(raw) >= i + 4 and all(c in b"0123456789abcdefABCDEF" for c in raw[i:i + 4])


def _line_text(line: bytes) -> str:
    """Every string value of a JSONL line decoded, one after another, each ending in a
    newline (the first pass: C all the way for well-formed lines)."""
    # The literals' contents run together, each followed by an escaped newline.
    joined = b"\\n".join(_STRING.findall(line))
    try:
        return str(json.loads(b'"' + joined + b'"', strict=False))
    except ValueError:  # invalid UTF-8 or a bad escape: the slow way, never a failure
        return "\n".join(decode(m.group(1))[0] for m in _STRING.finditer(line)
                         if m.group(1) is not None)


def _signed_strings(line: bytes) -> set[int]:
    """Start offsets (in ``line``) of the string literals that are signed."""
    signed: set[int] = set()
    # Per open object or array: [is_object, expecting_key, key, type, [(start, key)]].
    stack: list[list[Any]] = []

    def close(frame: list[Any]) -> None:
        if frame[0]:
            for start, key in frame[4]:
                if key == "signature" or (key == "thinking" and frame[3] == "thinking") \
                        or (key == "data" and frame[3] == "redacted_thinking"):
                    signed.add(start)

    for m in _TOKEN.finditer(line):
        tok = m.group()
        top = stack[-1] if stack else None
        if tok == b"{" or tok == b"[":
            stack.append([tok == b"{", tok == b"{", None, None, []])
        elif tok == b"}" or tok == b"]":
            if top is not None:
                close(stack.pop())
        elif tok == b",":
            if top is not None and top[0]:
                top[1] = True
        elif tok == b":" or top is None or not top[0]:
            continue
        elif top[1]:
            top[1], top[2] = False, decode(tok[1:-1])[0]
        else:
            top[4].append((m.start(), top[2]))
            if top[2] == "type":
                top[3] = decode(tok[1:-1])[0]
    for frame in stack:  # a cut line: what was open is judged as it stands
        close(frame)
    return signed


# -- findings -----------------------------------------------------------------------------

def mask(value: str, kind: str = "") -> str:
    """At most ``SHOWN`` characters of each end, fewer of a short value; a private key
    by its body (its armour lines are no secret and would fill the room)."""
    if kind == "Private Key":
        body = [ln for ln in value.splitlines() if ln and not ln.startswith("-----")]
        value = "".join("".join(body).split()) or value
    k = min(SHOWN, len(value) // 4)
    shown = (value[:k] + "…" + value[len(value) - k:]) if k else "…"
    return "".join(c if c.isprintable() else "?" for c in shown)


def _pem_end(text: str, start: int, end: int) -> tuple[int, int]:
    """A private key's header found at [start, end): the whole block, armour included
    (to its END line, else to the end of the string's lines of base64)."""
    if text[max(0, start - 5):start] == "-----":
        start -= 5
    m = _PEM_END.search(text, end)
    if m is not None:
        return start, m.end()
    stop = text.find("\n", end)
    while stop >= 0:
        nxt = text.find("\n", stop + 1)
        piece = text[stop + 1:nxt if nxt >= 0 else len(text)].strip()
        if not piece or not re.fullmatch(r"[A-Za-z0-9+/=]+", piece):
            break
        stop = nxt
    return start, (len(text) if stop < 0 else stop)


def _in_string(text: str) -> Iterator[tuple[int, int, str]]:
    """(start, end, kind) in ``text`` (one decoded string) of each secret found."""
    seen: set[tuple[int, int]] = set()
    for pos, piece in _candidate_lines(text):  # the slow plugins on few lines
        for kind, s, e, plugin in _confirmed(piece):
            if e <= s or _filtered(piece[s:e], piece, plugin):
                continue
            span = (pos + s, pos + e)
            if kind == "Private Key":
                span = _pem_end(text, *span)
            if span not in seen:
                seen.add(span)
                yield span[0], span[1], kind


def _in_line(line: bytes, line_no: int, base: int) -> list[RawFinding]:
    """The findings of one line that had a candidate (``base``: its first byte's offset)."""
    found: list[RawFinding] = []
    signed: set[int] | None = None
    for m in _STRING.finditer(line):
        if m.group(1) is None:  # a key
            continue
        text, at = decode(m.group(1))
        spans = list(_in_string(text))
        if not spans:
            continue
        if signed is None:
            signed = _signed_strings(line)
        for s, e, kind in spans:
            lo, hi = m.start(1) + at[s], m.start(1) + at[e]
            found.append(RawFinding(
                line=line_no, offset=base + lo, length=hi - lo, kind=kind,
                masked=mask(text[s:e], kind), signed=m.start() in signed,
                sha256=hashlib.sha256(line[lo:hi]).hexdigest()))
    return found


def _in_text(piece: bytes, line_no: int, base: int) -> list[RawFinding]:
    """The findings of plain text (a tool result file), its lines one string."""
    text = piece.decode("utf-8", "surrogateescape")
    if not _candidate(text):
        return []
    found = []
    for s, e, kind in _in_string(text):
        lo = len(text[:s].encode("utf-8", "surrogateescape"))
        hi = lo + len(text[s:e].encode("utf-8", "surrogateescape"))
        found.append(RawFinding(
            line=line_no + text.count("\n", 0, s), offset=base + lo, length=hi - lo,
            kind=kind, masked=mask(text[s:e], kind), signed=False,
            sha256=hashlib.sha256(piece[lo:hi]).hexdigest()))
    return found


def scan_bytes(data: bytes, base_offset: int = 0, *, first_line: int = 1,
               notes: list[str] | None = None, text: bool = False) -> list[RawFinding]:
    """The findings in ``data``, transcript bytes whose first byte is at ``base_offset``
    of its file and begins line ``first_line`` (``text``: plain text, a tool result's,
    scanned in pieces of whole lines). A line over ``LINE_MAX`` bytes is skipped (a
    note in ``notes`` says where); nothing here raises on bad input."""
    found: list[RawFinding] = []
    pos, line_no, n = 0, first_line, len(data)
    while pos < n:
        end = data.rfind(b"\n", pos, pos + TEXT_PIECE) + 1 if text else 0
        if end <= pos:  # one line: to its end
            end = data.find(b"\n", pos)
            end = n if end < 0 else end + 1
        piece = data[pos:end].removesuffix(b"\n")
        if len(piece) > LINE_MAX:
            if notes is not None:
                notes.append(f"line {line_no} at byte {base_offset + pos}: "
                             f"{len(piece)} bytes, over {LINE_MAX}: not scanned")
        elif text:
            found.extend(_in_text(piece, line_no, base_offset + pos))
        elif piece and _candidate(_line_text(piece)):
            found.extend(_in_line(piece, line_no, base_offset + pos))
        line_no += data.count(b"\n", pos, end)
        pos = end
    found.sort(key=lambda f: (f.offset, f.length))
    return found

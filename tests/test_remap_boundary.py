"""Where a path prefix starts: after any character that is not part of a name, or after
a terminal escape sequence (``ESC [ … m``, which ends in a letter).

The equivalence check runs 344,000 generated lines through ``Remapper.lines`` and a
reference written out position by position: the output is the reference's under the
boundary rule, and differs from the rule before (every byte 0x80-0xff a name byte) only
where the character before a prefix is a non-ASCII non-name character, a ``\\u``
escape or a terminal escape.
"""

from __future__ import annotations

import glob
import itertools
import json
import re
import unicodedata
from collections import Counter
from pathlib import Path

import pytest

from syncd.restore.remap import Remapper, Rule

_ASCII_NAME = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._~-")
_WIN_REST = re.compile(rb'(?:\\\\[^\\"<>|*?:]+)*')
RULES = [Rule("/Users/bob", "/home/bob"), Rule("/Users/bob/code/app", "/srv/app"),
         Rule("/home/a", "/w/a"), Rule("C:\\Users\\bob", "D:\\u\\bob")]


def _form(text: str) -> bytes:
    return json.dumps(text, ensure_ascii=False)[1:-1].encode()


def _pairs() -> list[tuple[bytes, bytes]]:
    pairs = {}
    for r in RULES:
        pairs[_form(r.old)] = _form(r.new)
        if "\\" in r.old:
            pairs.setdefault(_form(r.old.replace("\\", "/")), _form(r.new))
    return sorted(pairs.items(), key=lambda kv: len(kv[0]), reverse=True)


PAIRS = _pairs()


def _char_before(line: bytes, i: int) -> str | None:
    """The character that ends at ``line[i - 1]`` (None: the bytes are not UTF-8)."""
    for n in range(1, 5):
        if i - n < 0:
            break
        try:
            ch = line[i - n : i].decode()
        except UnicodeDecodeError:
            continue
        return ch if len(ch) == 1 else None
    return None


def _old_named(line: bytes, i: int) -> bool:
    if i >= 2 and line[i - 2] == 0x5C and line[i - 1] in b"nrtbf":
        return False
    return line[i - 1] in _ASCII_NAME or line[i - 1] >= 0x80


def _is_name_char(ch: str) -> bool:
    if ch.isascii():
        return ord(ch) in _ASCII_NAME
    return unicodedata.category(ch)[0] in "LNM"


def _new_named(line: bytes, i: int) -> bool:
    if i >= 2 and line[i - 2] == 0x5C and line[i - 1] in b"nrtbf":
        return False
    csi = re.search(rb"\\u001[bB]\[[0-?]*[ -/]*[@-~]$", line[:i])
    if csi is not None:
        slashes = len(line[: csi.start()]) - len(line[: csi.start()].rstrip(b"\\"))
        if slashes % 2 == 0:  # a terminal escape (ESC [ … m), not text after a backslash
            return False
    if i >= 6 and line[i - 6 : i - 4] == b"\\u" and \
            re.fullmatch(rb"[0-9a-fA-F]{4}", line[i - 4 : i]):
        slashes = len(line[: i - 6]) - len(line[: i - 6].rstrip(b"\\"))
        if slashes % 2 == 0:  # the backslash is an escape's, not an escaped one
            return _is_name_char(chr(int(line[i - 4 : i], 16)))
    if line[i - 1] < 0x80:
        return line[i - 1] in _ASCII_NAME
    ch = _char_before(line, i)
    return ch is None or _is_name_char(ch)


def reference(line: bytes) -> tuple[bytes, bytes]:
    """The rewrite spelled out, under the boundary rule and under the one before: at each
    position the longest prefix not followed by a name byte (ASCII name or 0x80-0xff,
    unchanged), with its Windows rest; replaced when the character before it does not
    continue a name. Where the rules disagree, the one before kept the prefix."""
    pairs = PAIRS
    new_out, old_out, i = bytearray(), bytearray(), 0
    while True:
        hits = [(at, -len(old), old, new) for old, new in pairs
                if (at := line.find(old, i)) >= 0]
        found = None
        while hits:
            at, _, old, new = min(hits)
            after = line[at + len(old) : at + len(old) + 1]
            if not after or (after[0] not in _ASCII_NAME and after[0] < 0x80):
                found = at, old, new
                break
            hits.remove(min(hits))
            if (nxt := line.find(old, at + 1)) >= 0:
                hits.append((nxt, -len(old), old, new))
        if found is None:
            return bytes(new_out + line[i:]), bytes(old_out + line[i:])
        at, old, new = found
        rest = _WIN_REST.match(line, at + len(old))
        assert rest is not None
        was, now = at > 0 and _old_named(line, at), at > 0 and _new_named(line, at)
        assert was or not now, line  # the new rule only ever maps more
        new_out += line[i:at] + (old if now else new) + rest[0]
        old_out += line[i:at] + (old if was else new) + rest[0]
        i = rest.end()


BEFORE = ["", " ", '"', "'", "(", "=", ":", "/", "x", "Z", "7", "_", "-", ".", "~",
          "\\n", "\\t", "\\\\n", '\\"', "\\u2192", "\\u00e9", "\\\\u2192", "\\u001b",
          "\\u001b[1m", "\\u001b[01;34m", "\\\\u001b[1m",
          "\\u0663", "→", "│", "…", "\u2018", "\u00a0", "😀", "✓", "é", "ß", "ж", "中", "あ",
          "한", "٣", "e\u0301", "ि"]
BODY = ["/Users/bob", "/Users/bob/src/x.py", "/Users/bobby", "/Users/bob/code/app",
        "/Users/bob/code/app/m.py", "/Users/bob/code/apple", "/home/a", "/home/a/b c.txt",
        "/home/ab", "/x/home/a", "C:\\\\Users\\\\bob", "C:\\\\Users\\\\bob\\\\doc\\\\a.txt",
        "C:\\\\Users\\\\bobby", "C:/Users/bob/x", "/home", "home/a", "/Users/bob.git",
        "/Users/bob-2", "/home/a/", "/Users/bob/code/app/é"]
AFTER = ["", "/", '"', "'", " ", "\\n", "x", "é", "→", ".", "-", ":", ")", "…", "😀",
         "\\\\", "\\u00e9", "/y", "!", ","]
SECOND = ["", " /home/a", "→/home/a", "é/home/a", "│/Users/bob/x", "\\n/Users/bob",
          "x/home/a", "中/home/a", "😀/home/a", "\\u2192/home/a", '"/home/a"',
          "\u2018/home/a\u2019", "café/Users/bob", "ж/Users/bob", "…/home/a", "٣/home/a",
          "\x80/home/a", "\xff/home/a", "1→C:\\\\Users\\\\bob\\\\x", "→→/Users/bob/code/app"]


# Lines whose output differs from the rule before's: all of them a prefix after a
# character that is not a name's (the assertion in ``reference``).
CHANGED = 147_316


def _inputs() -> list[bytes]:
    parts = [[s.encode("utf-8", "surrogateescape") if "\x80" not in s and "\xff" not in s
              else s.encode("latin-1") for s in group]
             for group in (BEFORE, BODY, AFTER, SECOND)]
    # Each a JSON string's content, closed as in a real line (a Windows rest, which may
    # hold any byte but a quote or a backslash, ends there).
    return [b"".join(p) + b'"' for p in itertools.product(*parts)]


def test_the_rewrite_is_the_reference_and_changes_only_at_non_name_characters() -> None:
    inputs = _inputs()
    assert len(inputs) == 344_000
    out = Remapper(RULES).lines(b"\n".join(inputs)).split(b"\n")
    assert len(out) == len(inputs)
    changed = 0
    for line, got in zip(inputs, out, strict=True):
        want, before = reference(line)
        assert got == want, line
        changed += want != before
    assert changed == CHANGED


def test_after_an_arrow_a_box_line_or_an_emoji_a_path_is_remapped() -> None:
    r = Remapper([Rule("/home/a", "/w")])
    for before in ("→", "│", "├──", "😀", "…", "\u2018", "\u00a0", "✓", "「"):
        line = f'{{"t":"     1{before}/home/a/x.py"}}'.encode()
        assert r.lines(line) == line.replace(b"/home/a", b"/w"), before


@pytest.mark.parametrize("word", ["café", "straße", "ж", "中文", "日本語", "あ", "한국",
                                  "٣", "e\u0301", "नि", "Ω"])
def test_after_a_letter_digit_or_mark_of_any_script_it_is_not(word: str) -> None:
    r = Remapper([Rule("/Users/bob", "/home/bob")])
    line = f'{{"t":"{word}/Users/bob/x","cwd":"/Users/bob"}}'.encode()
    assert r.lines(line) == line.replace(b'"/Users/bob"', b'"/home/bob"')


def test_json_escaped_characters_before_a_path() -> None:
    r = Remapper([Rule("/home/a", "/w")])
    assert r.lines(b'"\\u2192/home/a \\u001b/home/a"') == b'"\\u2192/w \\u001b/w"'
    # An escaped letter continues a name; an escaped backslash then "u2192" is text.
    assert r.lines(b'"\\u00e9/home/a \\\\u2192/home/a"') == b'"\\u00e9/home/a \\\\u2192/home/a"'
    assert r.lines(b'"\\\\\\u2192/home/a"') == b'"\\\\\\u2192/w"'


def test_bytes_that_are_not_utf8_still_count_as_a_name() -> None:
    r = Remapper([Rule("/home/a", "/w")])
    for raw in (b"\x80/home/a", b"\xff/home/a", b"\xe2\x86/home/a", b"x\xa9/home/a"):
        assert r.lines(raw) == raw


def test_real_sample_leaves_no_path_after_a_non_name_character_unmapped(
        samples: Path) -> None:
    """The Read tool's ``     1→/path`` lines (233 of them in one sample were left as
    they were): every occurrence of the home after a character that is not a name's is
    mapped; those left are after a name character."""
    unmapped: Counter[str] = Counter()
    mapped = 0
    for f in sorted(glob.glob(str(samples / "*/projects/*/*.jsonl"))):
        data = Path(f).read_bytes()
        cwd = re.search(rb'"cwd":"(/home/[^/"]+)', data)
        if cwd is None:
            continue
        home = cwd[1]
        out = Remapper([Rule(home.decode(), "/srv/mapped")]).lines(data)
        mapped += out.count(b"/srv/mapped")
        for m in re.finditer(re.escape(home) + rb"(?=[/\"\\])", out):
            unmapped[out[: m.start()].decode(errors="replace")[-1:]] += 1
    assert mapped > 1000
    assert {c: n for c, n in unmapped.items() if not (c.isalnum() or c in "._~-")} == {}


def test_after_a_terminal_escape_a_path_is_remapped() -> None:
    """Claude's ``/cd`` records its output with the directory in bold, a colored listing
    its names in color: the escape sequence (``ESC [ … m``) ends in a letter but is no
    name. Text that only looks like one (an escaped backslash, no ESC) is not."""
    r = Remapper([Rule("/home/a", "/w")])
    moved = (b'{"type":"system","subtype":"local_command","content":"<local-command-stdout>'
             b'Moved to \\u001b[1m/home/a/code/roof\\u001b[22m</local-command-stdout>"}')
    assert r.lines(moved) == moved.replace(b"/home/a", b"/w")
    for before in (b"\\u001b[01;34m", b"\\u001B[K", b"\\u001b[38;2;255;255;255m", b"\\u001b[m"):
        assert r.lines(b'"' + before + b'/home/a/x"') == b'"' + before + b'/w/x"', before
    for kept in (b"\\\\u001b[1m", b"[1m", b"\\u001b[1", b"\\u001bm", b"\\u0041[1m"):
        assert r.lines(b'"' + kept + b'/home/a/x"') == b'"' + kept + b'/home/a/x"', kept

"""``Remapper.lines`` rewrites the whole text at once (one pass per pattern, the decisions
for all matches together) and must give what it gave stretch by stretch, byte for byte:
here against that rewrite, kept as tests/remap_reference.py, on generated hostile text
(prefixes after every kind of byte, JSON escapes, terminal escapes, non-ASCII and bytes
that are not UTF-8, protected strings open and closed, folders, Windows rests, raw line
ends anywhere), under rule sets that take each of its paths, a line at a time and many
lines at once."""

from __future__ import annotations

import glob
import random
import re
from pathlib import Path

import pytest

from syncd.restore.remap import Remapper, Rule
from tests.remap_reference import ReferenceRemapper

FOLDERS = {"-Users-bob-app": "-home-bob-app", "-home-a": "-w-a", "C--Users-bob": "-home-bob",
           "-home-a-x": "-w-a-x", "é-dir": "-w-é"}
RULE_SETS = {
    # POSIX to POSIX: folders are found before the prefixes are replaced.
    "posix": [Rule("/Users/bob", "/home/bob"), Rule("/Users/bob/code/app", "/srv/app"),
              Rule("/home/a", "/w/a")],
    # A Windows prefix kept Windows, and a new prefix not a slash's: folders after.
    "windows": [Rule("/Users/bob", "/home/bob"), Rule("/home/a", "/w/a"),
                Rule("C:\\Users\\bob", "D:\\u\\bob")],
    # Windows to POSIX: the rest's separators change too.
    "to-posix": [Rule("C:\\Users\\bob", "/home/bob"), Rule("/home/a", "/w/a")],
    # A new prefix that could make "projects" where there was none.
    "projects": [Rule("/home/a", "/w/projects"), Rule("/Users/bob", "/p/proj")],
    # A Windows prefix that starts with a slash, to POSIX.
    "slash-windows": [Rule("/home/a\\b", "/w/b"), Rule("/Users/bob", "/home/bob")],
    # POSIX again, with folders that all start alike (looked for first).
    "posix-one-home": [Rule("/Users/bob", "/home/bob"), Rule("/home/a", "/w/a")],
    # A quote in a prefix: stretch by stretch still.
    "quote": [Rule('/home/a"b', "/w"), Rule("/home/a", "/w/a")],
}
TOKENS = [
    # prefixes, whole, longer, shorter and cut
    "/Users/bob", "/Users/bob/", "/Users/bob/code/app", "/Users/bobby", "/home/a", "/home/a/",
    "/home/ab", "/home", "/home/a\\\"b", "/home/a\\\\b", "/home/a/b", "C:\\\\Users\\\\bob",
    "C:/Users/bob", "C:\\\\Users",
    "\\\\doc", "\\\\a b.txt", "\\\\", "\\\\\\\\", "/x", "/.claude", "/y.py",
    # what comes before and after one
    " ", "\"", "'", "(", "=", ":", ",", "x", "Z", "7", "a", "f", "_", "-", ".", "~", "s", "m",
    "\\n", "\\t", "\\r", "\\b", "\\f", "\\\\n", "\\\"", "\\u2192", "\\u00e9", "\\\\u2192",
    "\\u001b", "\\u001b[1m", "\\u001b[01;34m", "\\u001B[K", "\\\\u001b[1m", "\\u0041[1m",
    "\\u0663", "→", "│", "…", "😀", "é", "ß", "中", "e\u0301", "\x80", "\xff", "\xe2\x86",
    "\n", "\n", "{", "}", "[1m",
    # protected strings, their hints and their ends
    "\"thinking\":\"", "\"signature\":\"", "\"data\":\"", "\"redacted_thinking\"",
    "\"type\":\"thinking\",", "\"text\":\"", "\"", "\"", "\\\\\"",
    # project folders
    "projects/", "projects\\\\", "projects", "/.claude/projects/", "-Users-bob-app",
    "-home-a", "-home-a-x", "C--Users-bob", "é-dir", "-home-ab", "proj", "ects/",
]


def _encode(tok: str) -> bytes:
    return tok.encode("latin-1") if tok in ("\x80", "\xff", "\xe2\x86") else tok.encode()


BYTES = [_encode(t) for t in TOKENS]


def _lines(rng: random.Random, n: int) -> list[bytes]:
    out = []
    for _ in range(n):
        k = rng.choice((3, 6, 12, 25, 60))
        out.append(b"".join(rng.choices(BYTES, k=k)))
    return out


def _check(name: str, texts: list[bytes]) -> int:
    rules = RULE_SETS[name]
    folders = {k: v for k, v in FOLDERS.items()
               if k.startswith("-home-a") or name != "posix-one-home"}
    new, ref = Remapper(rules, folders), ReferenceRemapper(rules, folders)
    changed = 0
    for text in texts:
        got, want = new.lines(text), ref.lines(text)
        if got != want:  # the shortest piece that differs, to read
            for line in text.split(b"\n"):
                assert new.lines(line) == ref.lines(line), (name, line)
            assert got == want, (name, text)
        changed += got != text
    return changed


@pytest.mark.parametrize("name", sorted(RULE_SETS))
def test_the_whole_text_at_once_is_the_stretch_by_stretch_rewrite(name: str) -> None:
    rng = random.Random(name)
    lines = _lines(rng, 42_000)
    # Alone, and joined in batches of every size (what is protected depends on the batch:
    # a hint anywhere in it protects every thinking, signature and data string).
    batches, i = [], 0
    while i < len(lines):
        k = rng.choice((1, 2, 5, 40, 400))
        batches.append(b"\n".join(lines[i : i + k]))
        i += k
    changed = _check(name, lines) + _check(name, batches)
    assert changed > len(lines) // 10  # the rules do apply


# Every kind of end of a protected string or start of a line, then every kind of byte
# before a prefix, a prefix, and what follows it: what is decided at the edge of a
# stretch between protected strings.
EDGE = ['"thinking":"abc"', '"thinking":"x\\u001b["', '"data":"\\u001b[1;"',
        '"signature":"\\\\"', '"thinking":"\\u00e"', '"thinking":"\\"', '"data":"\\\\\\u2192"',
        '"thinking":"\\u001b[0', '"text":"x"', "\n", "\\", "", '"thinking":"\\\\u001b["',
        # openings that share a quote: the first one's string closes at once
        '"data":"thinking":"x', '"thinking":"data":"', '"data":"data":"y']
BEFORE = ["", "m", "K", "n", "\\n", "u2192", "e9", "x", "\"", ":", "é", "\x80", "\\", "0",
          "[1m", "\\u001b[1m", "→", " ", "projects/", "projects\\\\", "\\u", "\\u00a0", "\\u2190",
          "\\\\u00a0", "\\t", "\\b", "\\f", "7"]
AFTER = ["", "/x", "\"", "\n", "\\\\doc", "é", "x", '"thinking":"/home/a"', "\n\"data\":\"q\""]


def test_every_edge_of_a_stretch() -> None:
    heads = ["/home/a", "/Users/bob", "C:\\\\Users\\\\bob", "-home-a", "/home/a\\\\b"]
    texts = [_encode(e) + _encode(b) + _encode(h) + _encode(a)
             for e in EDGE for b in BEFORE for h in heads for a in AFTER]
    for name in RULE_SETS:
        assert _check(name, texts) > 0


def test_long_lines_and_long_protected_strings() -> None:
    rng = random.Random(7)
    body = b"".join(rng.choices(BYTES, k=20_000))
    texts = [body, b'{"type":"thinking","thinking":"' + body.replace(b'"', b"'") + b'"}\n' + body,
             b"\\\\" * 5000 + b"/home/a" + body, b"/home/a" * 50_000]
    for name in RULE_SETS:
        _check(name, texts)


def test_real_transcripts(samples: Path) -> None:
    for f in sorted(glob.glob(str(samples / "*/projects/**/*.jsonl"), recursive=True)):
        data = Path(f).read_bytes()
        home = re.search(rb'"cwd":"(/home/[^/"]+)', data)
        if home is None:
            continue
        folder = Path(f).relative_to(samples).parts[2]
        rules = [Rule(home[1].decode(), "/home/elsewhere")]
        folders = {folder: folder.replace("-home-", "-srv-", 1)}
        for chunk in (data, *data.splitlines(keepends=True)[::7]):
            assert Remapper(rules, folders).lines(chunk) == \
                ReferenceRemapper(rules, folders).lines(chunk), f

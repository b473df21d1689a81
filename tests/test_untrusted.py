from __future__ import annotations

import json

import pytest

from syncd.format.catalog import MetaScanner
from syncd.format.segment import SegmentWriter
from syncd.untrusted import loads
from tests.readers import parse_segment


def test_brackets_inside_strings_are_not_containers() -> None:
    doc = {"summary": "{}[]" * 5000, "n": [1, 2]}
    assert loads(json.dumps(doc)) == doc


@pytest.mark.parametrize("text", ["[" + "{}," * 20000 + "{}]", "[" * 100000 + "]" * 100000])
def test_a_flood_of_containers_is_refused_before_parsing(text: str) -> None:
    with pytest.raises(ValueError, match="objects and arrays"):
        loads(text)


def test_containers_hidden_behind_an_escaped_quote_still_count() -> None:
    text = '["\\"", ' + "[]," * 20000 + "[]]"
    with pytest.raises(ValueError, match="objects and arrays"):
        loads(text)


@pytest.mark.parametrize("text", ["[NaN]", "[Infinity]", "[1e999]", "[" + "9" * 301 + "]"])
def test_numbers_no_writer_makes_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        loads(text)


def test_deep_nesting_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        loads('{"a":' * 2000 + "1" + "}" * 2000 + " " * 100000)


def test_a_segment_cataloguing_a_summary_of_brackets_reads_back() -> None:
    """A transcript's own text (copied into the catalog) never makes our index unreadable."""
    sep = (",", ":")  # as Claude writes its lines
    lines = (json.dumps({"type": "user", "cwd": "/h/a", "message": {"content": "hi"}},
                        separators=sep) + "\n"
             + json.dumps({"type": "summary", "summary": "{}" * 3000}, separators=sep)
             + "\n").encode()
    scanner = MetaScanner(at_line_start=True)
    scanner.feed(lines)
    path = b"projects/-h-a/0a0e1f2c-3d4e-5f60-8a9b-0c1d2e3f4a5b.jsonl"
    w = SegmentWriter("m", 0, 1.0)
    w.add_data(path, 1, 0, lines, mode=0o600, mtime_ns=1)
    w.add_session(path, 1, scanner.finish())
    assert list(parse_segment(w.finish(), "seg").sessions) == [path]

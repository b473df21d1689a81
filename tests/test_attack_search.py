"""Attacks on search by someone who writes transcripts (a followed machine, a shared
bucket, a tool's output in a session) or types a query: each hostile input ends as
nothing indexed or one ``BadQuery`` line, never a traceback or a dead indexer."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from syncd.format.catalog import MetaScanner, parse_origin, title_file_fields
from syncd.search.index import FILE_NAME, SearchIndex
from syncd.search.query import BadQuery, search
from tests.helpers import one_line, syncd, write

S1 = "11111111-1111-4111-8111-111111111111"
S2 = "22222222-2222-4222-8222-222222222222"
REL = f"projects/-home-u-proj/{S1}.jsonl".encode()


def user(text: str, sid: str = S1) -> bytes:
    return json.dumps({"type": "user", "cwd": "/home/u/proj", "sessionId": sid,
                       "timestamp": "2026-11-30T10:00:00.000Z",
                       "message": {"role": "user", "content": text}},
                      separators=(",", ":")).encode() + b"\n"


# Under MAX_LINE, a message whose content nests deeper than Python's JSON parser recurses.
DEEP = (b'{"type":"user","message":{"role":"user","content":' + b"[" * 200_000
        + b"]" * 200_000 + b"}}\n")


@pytest.fixture
def index(tmp_path: Path) -> Any:
    ix = SearchIndex.open(tmp_path / "state" / FILE_NAME)
    yield ix
    ix.close()


def test_a_deeply_nested_line_is_passed_over(index: SearchIndex) -> None:
    data = user("before the bomb") + DEEP + user("after the bomb")
    assert index.feed("m1", REL, 1, 0, data) == len(data)
    index.commit()
    assert [h.session for h in search(index, "bomb")] == [S1]
    assert {t for h in search(index, "after") for t, m in h.snippet if m} == {"after"}


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
                "SYNCD_SOURCE": str(tmp_path / "src"),
                "SYNCD_STATE_DIR": str(tmp_path / "state"), "SYNCD_MACHINE_ID": "m1",
                "SYNCD_STORE": (tmp_path / "store").as_uri(), "SYNCD_CONFIG": os.devnull})
    return env


def test_syncd_search_over_a_tree_holding_a_nested_line(tmp_path: Path) -> None:
    # The command indexes the tree first: one hostile session must not stop it.
    write(tmp_path / "src", REL, DEEP + user("kept findable"))
    write(tmp_path / "src", f"projects/-home-u-proj/{S2}.jsonl", user("also findable", S2))
    r = syncd(_env(tmp_path), "search", "--json", "findable")
    assert r.returncode == 0, r.stderr
    assert sorted(h["session"] for h in json.loads(r.stdout)) == [S1, S2]


# What FTS5 refuses with an error of its own words (not "syntax error"), and what would
# reach past the column filter.
BAD = ['"unbalanced', 'unbalanced"', "NEAR(a b, x)", "NEAR(a b, -1)", "*", "title:x",
       "-x", "a NOT", "(" * 500 + "a", "\x00", "x" * 5000]


@pytest.mark.parametrize("query", BAD)
def test_a_hostile_query_is_bad_query(index: SearchIndex, query: str) -> None:
    index.feed("m1", REL, 1, 0, user("x a b"))
    index.commit()
    with pytest.raises(BadQuery):
        search(index, query)


def test_cli_hostile_queries_one_line_exit_2(tmp_path: Path) -> None:
    write(tmp_path / "src", REL, user("hello"))
    for query in ['"unbalanced', "NEAR(a b, x)"]:
        assert one_line(syncd(_env(tmp_path), "search", query), 2).startswith(
            "syncd: search: cannot parse the query")


# The catalog's readers meet the same lines: the daemon's scanner of what it ships (and
# the indexer's), a title file, a head's origin field (a store's string).
def test_catalog_readers_pass_over_deep_nesting() -> None:
    scan = MetaScanner(at_line_start=True)
    scan.feed(DEEP.replace(b'"message"', b'"timestamp":"2026-11-30T10:00:00Z","message"')
              + user("the prompt"))
    fields = scan.finish()
    assert fields["cwd"] == "/home/u/proj" and fields["first_prompt"] == "the prompt"
    assert title_file_fields(b"[" * 5000) == {}
    assert parse_origin("[" * 5000) is None


def test_a_query_cannot_close_the_column_filter_to_reach_tool_output(
        index: SearchIndex) -> None:
    index.feed("m1", REL, 1, 0, user("x a b"))
    index.commit()
    for query in ["x) OR output : (secret", "x ) OR (y", ")"]:
        with pytest.raises(BadQuery, match="closes more than was opened"):
            search(index, query)
    assert search(index, '"a)" OR x')  # a parenthesis in a string is a word's
    assert search(index, "(x) AND (a OR b)")

"""Search: the index (syncd/search/index.py), what is searched of a line (extract), the
query (ranking, snippets, FTS5 syntax, filters), the local indexer (appends, cuts,
rewrites, deletions, imported sessions), the daemon's indexing after a flush, and
``syncd search``."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from syncd.backup.state import ImportedFile, OriginRecord, State
from syncd.config import Settings, load_settings
from syncd.errors import BadQuery
from syncd.search import extract
from syncd.search.index import FILE_NAME, SearchIndex
from syncd.search.indexer import Indexer
from syncd.search.query import Hit, pieces, search
from tests.helpers import one_line, running, syncd, wait_for, write

S1 = "11111111-1111-4111-8111-111111111111"
S2 = "22222222-2222-4222-8222-222222222222"
S3 = "33333333-3333-4333-8333-333333333333"


def line(entry: dict[str, Any]) -> bytes:
    # As Claude Code writes them: compact JSON, one line each.
    return json.dumps(entry, separators=(",", ":")).encode() + b"\n"


def user(text: str, ts: str = "2026-11-30T10:00:00.000Z", cwd: str = "/home/u/proj") -> bytes:
    return line({"type": "user", "cwd": cwd, "sessionId": S1, "timestamp": ts,
                 "message": {"role": "user", "content": text}})


def answer(*blocks: dict[str, Any], ts: str = "2026-11-30T10:00:01.000Z") -> bytes:
    return line({"message": {"role": "assistant", "content": list(blocks)},
                 "type": "assistant", "timestamp": ts})


def text(t: str) -> dict[str, Any]:
    return {"type": "text", "text": t}


def tool_result(out: str) -> bytes:
    return line({"type": "user", "timestamp": "2026-11-30T10:00:02.000Z", "message": {
        "role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                     "content": out}]}})


def rel(sid: str, folder: str = "-home-u-proj") -> str:
    return f"projects/{folder}/{sid}.jsonl"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "claude"
    (root / "projects").mkdir(parents=True)
    return root


@pytest.fixture
def index(tmp_path: Path) -> SearchIndex:
    ix = SearchIndex.open(tmp_path / "state" / FILE_NAME)
    yield ix  # type: ignore[misc]
    ix.close()


def indexer(index: SearchIndex, tree: Path, origins: dict[str, str] | None = None) -> Indexer:
    return Indexer(index, tree, "m1", (lambda: origins or {}))


def sessions(hits: list[Hit]) -> list[str]:
    return [h.session for h in hits]


def matched(hit: Hit) -> list[str]:
    return [t.lower() for t, m in hit.snippet if m]


# -- the index and the query ----------------------------------------------------------------

def test_the_session_that_says_it_more_precisely_ranks_first(index: SearchIndex,
                                                             tree: Path) -> None:
    write(tree, rel(S1), user("we talked about many things today, the weather, lunch, "
                              "and also briefly a flaky websocket reconnect somewhere "
                              "among a great many other words of no interest at all"))
    write(tree, rel(S2), user("websocket reconnect") +
          answer(text("The websocket reconnect loop retries with backoff.")))
    write(tree, rel(S3), user("nothing of that kind here"))
    indexer(index, tree).update_all()
    hits = search(index, "websocket reconnect")
    assert sessions(hits) == [S2, S1]
    assert hits[0].score < hits[1].score  # bm25: lower is better
    assert matched(hits[0]) == ["websocket", "reconnect"]


def test_snippets_are_pieces_and_markup_stays_text(index: SearchIndex, tree: Path) -> None:
    write(tree, rel(S1), user("fix the <script>alert(1)</script> injection in the parser"))
    indexer(index, tree).update_all()
    (hit,) = search(index, "injection")
    assert "".join(t for t, _ in hit.snippet).count("<script>") == 1
    assert [(t, m) for t, m in hit.snippet if m] == [("injection", True)]
    assert hit.title.startswith("fix the <script>")  # first prompt, stored as is
    assert hit.project == "/home/u/proj"
    assert hit.last_activity == pytest.approx(1796032800.0)  # 2026-11-30T10:00:00Z
    assert not hit.deleted


def test_a_transcript_cannot_forge_match_markers(index: SearchIndex, tree: Path) -> None:
    forged = f"alpha {extract.MARK_START}beta{extract.MARK_END} gamma"
    write(tree, rel(S1), user(forged))
    indexer(index, tree).update_all()
    (hit,) = search(index, "gamma")
    assert [t for t, m in hit.snippet if m] == ["gamma"]


def test_pieces_split_markers() -> None:
    m0, m1 = extract.MARK_START, extract.MARK_END
    assert pieces(f"a {m0}b{m1} c {m0}d{m1}") == [("a ", False), ("b", True), (" c ", False),
                                                  ("d", True)]
    assert pieces("") == []


def test_phrase_prefix_and_boolean(index: SearchIndex, tree: Path) -> None:
    write(tree, rel(S1), user("the quick brown fox jumps"))
    write(tree, rel(S2), user("brown quick foxes sleep"))
    write(tree, rel(S3), user("a slow turtle"))
    indexer(index, tree).update_all()
    assert sessions(search(index, '"quick brown"')) == [S1]
    assert set(sessions(search(index, "fox*"))) == {S1, S2}
    assert sessions(search(index, "fox")) == [S1]
    assert set(sessions(search(index, "turtle OR jumps"))) == {S1, S3}
    assert sessions(search(index, "quick NOT jumps")) == [S2]
    assert sessions(search(index, "quick AND sleep")) == [S2]


def test_thinking_is_never_found_and_tool_output_only_with_all_text(index: SearchIndex,
                                                                    tree: Path) -> None:
    write(tree, rel(S1), user("please look") + answer(
        {"type": "thinking", "thinking": "zanzibarthought", "signature": "sigzzz"},
        {"type": "redacted_thinking", "data": "redactedzzz"},
        {"type": "tool_use", "id": "t1", "name": "Grep", "input": {"pattern": "needlepattern"}},
    ) + tool_result("haystackoutput found"))
    indexer(index, tree).update_all()
    for word in ("zanzibarthought", "sigzzz", "redactedzzz"):
        assert search(index, word) == [] and search(index, word, all_text=True) == []
    assert sessions(search(index, "needlepattern")) == [S1]  # a tool's input
    assert sessions(search(index, "grep")) == [S1]           # and its name
    assert search(index, "haystackoutput") == []
    assert search(index, "output : haystackoutput") == []    # no way round the columns
    (hit,) = search(index, "haystackoutput", all_text=True)
    assert matched(hit) == ["haystackoutput"]


def test_a_bad_query_is_bad_query(index: SearchIndex) -> None:
    for q in ['"unbalanced', "AND", "foo AND", "(", "nosuchcol : x", ""]:
        with pytest.raises(BadQuery) as e:
            search(index, q)
        assert "\n" not in str(e.value)


def test_filters_machine_project_time_limit_offset(index: SearchIndex) -> None:
    for machine, sid, cwd, at in [("m1", S1, "/a", 100.0), ("m2", S2, "/a/sub", 200.0),
                                  ("m2", S3, "/b", 300.0)]:
        index.feed(machine, rel(sid).encode(), 1, 0, user("common word"))
        index.set_session(machine, sid, {"project": cwd, "last_activity": at})
    index.commit()
    assert set(sessions(search(index, "common"))) == {S1, S2, S3}
    assert set(sessions(search(index, "common", machine="m2"))) == {S2, S3}
    assert set(sessions(search(index, "common", project="/a"))) == {S1, S2}
    assert sessions(search(index, "common", since=150, until=250)) == [S2]
    all3 = sessions(search(index, "common"))
    assert sessions(search(index, "common", limit=1, offset=1)) == all3[1:2]


def test_catalog_fields_are_searched(index: SearchIndex) -> None:
    # A machine whose catalog only is known (titles from its head) is found by title.
    index.set_session("m9", S1, {"title": "Migrate the billing service", "project": "/x"})
    index.commit()
    (hit,) = search(index, "billing")
    assert (hit.machine, hit.title) == ("m9", "Migrate the billing service")
    index.set_session("m9", S1, {"title": "Renamed"})
    index.commit()
    assert search(index, "billing") == [] and sessions(search(index, "renamed")) == [S1]


def test_feed_keeps_to_complete_lines_and_drops_on_another_generation(
        index: SearchIndex) -> None:
    p = rel(S1).encode()
    data = user("first line words") + b'{"type":"user","mess'
    assert index.feed("m1", p, 7, 0, data) == len(data) - len(b'{"type":"user","mess')
    assert index.cursor("m1", p) == (7, len(user("first line words")))
    with pytest.raises(ValueError):
        index.feed("m1", p, 7, 3, b"x\n")  # neither the cursor nor 0
    index.feed("m1", p, 8, 0, user("second generation"))
    index.commit()
    assert search(index, "first") == [] and sessions(search(index, "second")) == [S1]


def test_an_overlong_line_is_consumed_unread(index: SearchIndex) -> None:
    p = rel(S1).encode()
    big = b'{"type":"user","message":{"content":"' + b"hugeword " * (1 << 17)
    assert len(big) > extract.MAX_LINE
    assert index.feed("m1", p, 1, 0, big) == len(big)
    rest = b'"}}\n' + user("after the long one")
    assert index.feed("m1", p, 1, len(big), rest) == len(rest)
    index.commit()
    assert search(index, "hugeword") == []
    assert sessions(search(index, "after")) == [S1]


def test_a_reader_does_not_wait_for_a_writer(index: SearchIndex) -> None:
    index.feed("m1", rel(S1).encode(), 1, 0, user("committed words"))
    index.commit()
    index.feed("m1", rel(S2).encode(), 1, 0, user("uncommitted words"))  # lock held
    reader = SearchIndex.open(index.path)
    reader.db.execute("PRAGMA busy_timeout=0")  # a wait would fail at once
    try:
        assert sessions(search(reader, "words")) == [S1]
    finally:
        reader.close()
    index.commit()


def test_the_index_file_is_private(index: SearchIndex) -> None:
    assert stat.S_IMODE(os.stat(index.path).st_mode) == 0o600


# -- the local indexer ----------------------------------------------------------------------

def test_a_renamed_session_is_found_by_its_title(index: SearchIndex, tree: Path) -> None:
    ix = indexer(index, tree)
    write(tree, rel(S1), user("some prompt"))
    ix.update_all()
    title = f"projects/-home-u-proj/{S1}/custom-title.json"
    write(tree, title, json.dumps({"customTitle": "Quarterly numbers", "by": "user"}).encode())
    ix.update([title.encode()])
    (hit,) = search(index, "quarterly")
    assert hit.title == "Quarterly numbers"
    write(tree, title, json.dumps({"customTitle": "Yearly figures"}).encode())
    ix.update_all()
    assert search(index, "quarterly") == []
    assert search(index, "yearly")[0].title == "Yearly figures"


def test_appends_only_read_new_bytes(index: SearchIndex, tree: Path) -> None:
    ix = indexer(index, tree)
    write(tree, rel(S1), user("alpha words"))
    first = ix.update_all()
    assert first.bytes == len(user("alpha words"))
    write(tree, rel(S1), answer(text("beta words")), mode="ab")
    second = ix.update([rel(S1).encode()])
    assert second.bytes == len(answer(text("beta words"))) and second.reindexed == 0
    assert ix.update_all().bytes == 0  # unchanged: a stat
    assert sessions(search(index, "alpha beta")) == []  # two lines, not one row
    assert sessions(search(index, "alpha")) == sessions(search(index, "beta")) == [S1]


def test_a_rewritten_session_is_indexed_anew(index: SearchIndex, tree: Path) -> None:
    ix = indexer(index, tree)
    path = write(tree, rel(S1), user("oldtext here") + answer(text("more oldtext")))
    ix.update_all()
    # As the CLI's local GC does: a new file renamed over the old one, same size or not.
    tmp = tree / "projects" / "-home-u-proj" / f"{S1}.jsonl.compact.tmp.1"
    tmp.write_bytes(user("newtext here") + answer(text("more newtext")))
    os.rename(tmp, path)
    done = ix.update([rel(S1).encode()])
    assert done.reindexed == 1
    assert search(index, "oldtext") == []
    assert sessions(search(index, "newtext")) == [S1]


def test_a_cut_session_forgets_the_withdrawn_row(index: SearchIndex, tree: Path) -> None:
    ix = indexer(index, tree)
    keep = user("kept prompt")
    path = write(tree, rel(S1), keep + answer(text("withdrawn streamed row")))
    ix.update_all()
    # In place (same inode): cut at the row, what followed written again, longer.
    with open(path, "r+b") as f:
        f.truncate(len(keep))
        f.seek(len(keep))
        f.write(answer(text("the replacement answer, which is a good deal longer")))
    done = ix.update([rel(S1).encode()])
    assert done.reindexed == 1
    assert search(index, "withdrawn") == []
    assert sessions(search(index, "replacement")) == sessions(search(index, "kept")) == [S1]


def test_a_deleted_session_stays_findable_marked(index: SearchIndex, tree: Path) -> None:
    ix = indexer(index, tree)
    path = write(tree, rel(S1), user("ephemeral idea"))
    write(tree, f"projects/-home-u-proj/{S1}/subagents/agent-a1.jsonl",
          answer(text("subagent finding")))
    ix.update_all()
    (hit,) = search(index, "subagent")  # a subagent's lines are its session's
    assert hit.session == S1 and not hit.deleted
    path.unlink()
    assert ix.update_all().deleted == 1
    (hit,) = search(index, "ephemeral")
    assert hit.session == S1 and hit.deleted
    write(tree, rel(S1), user("ephemeral idea"))  # back (a restore)
    ix.update_all()
    assert not search(index, "ephemeral")[0].deleted


@pytest.mark.parametrize("order", ["old first", "new first"])
def test_a_moved_session_is_not_deleted_nor_twice(index: SearchIndex, tree: Path,
                                                  order: str) -> None:
    ix = indexer(index, tree)
    old = write(tree, rel(S1), user("relocating words"))
    ix.update_all()
    # /cd: the whole file moves to the new cwd's folder and says so.
    new = tree / rel(S1, "-home-u-other")
    new.parent.mkdir(parents=True)
    os.rename(old, new)
    with open(new, "ab") as f:
        f.write(line({"type": "relocated", "sessionId": S1, "relocatedCwd": "/home/u/other"}))
    paths = [rel(S1).encode(), rel(S1, "-home-u-other").encode()]
    ix.update(paths if order == "old first" else paths[::-1])
    (hit,) = search(index, "relocating")
    assert not hit.deleted and hit.project == "/home/u/other"
    assert index.db.execute("SELECT count(*) FROM files").fetchone()[0] == 1
    assert index.db.execute("SELECT count(*) FROM docs WHERE file IS NOT NULL"
                            ).fetchone()[0] == 1
    new.unlink()
    ix.update_all()
    assert search(index, "relocating")[0].deleted


def test_an_imported_session_is_indexed_once_with_its_origin(index: SearchIndex,
                                                             tree: Path) -> None:
    write(tree, rel(S1), user("imported from laptop: kubernetes operator"))
    write(tree, rel(S2), user("our own kubernetes work"))
    ix = indexer(index, tree, {S1: "laptop"})
    assert ix.update_all().files == 2
    hits = {h.session: h for h in search(index, "kubernetes")}
    assert len(hits) == 2 and (hits[S1].machine, hits[S1].origin) == ("m1", "laptop")
    assert hits[S2].origin is None
    assert sessions(search(index, "kubernetes", machine="laptop")) == [S1]
    # A second pass (another flush, a restart) reads nothing again.
    assert ix.update_all().files == 0 and ix.update([rel(S1).encode()]).files == 0
    assert index.db.execute("SELECT count(*) FROM docs").fetchone()[0] == 4  # 2 + 2 titles


def test_origin_machines_of_the_state(tmp_path: Path) -> None:
    st = State(tmp_path / "state.sqlite")
    try:
        st.record_imported([ImportedFile(rel(S1).encode(), "laptop", 10, b"h" * 8, False,
                                         rel(S1).encode(), 1, 10, 1.0)])
        st.record_origins([OriginRecord(S2, "desk", rel(S2).encode(), (), 1.0)])
        assert st.origin_machines() == {S1: "laptop", S2: "desk"}
    finally:
        st.close()


def test_real_samples_index_and_search(samples: Path, index: SearchIndex) -> None:
    roots = [p for p in samples.iterdir() if (p / "projects").is_dir()]
    assert roots
    total = 0
    for root in roots:
        total += indexer(index, root).update_all().bytes
    assert total > 1 << 20
    hits = search(index, "charm*", limit=50)
    assert hits and all(any(m for _, m in h.snippet) for h in hits)
    # Nothing of a thinking block is searched: a run of its words that no searched
    # text holds is looked for, and not found.
    files = sorted(samples.rglob("*.jsonl"))
    searched = " ".join(" ".join(r).lower() for f in files
                        for r in extract.rows(f.read_bytes()))
    phrase = None
    for f in files:
        for raw in f.read_bytes().splitlines():
            if b'"thinking"' not in raw or b'"type":"assistant"' not in raw:
                continue
            for b in json.loads(raw)["message"]["content"]:
                if b.get("type") != "thinking":
                    continue
                words = b.get("thinking", "").split(" ")
                for i in range(len(words) - 4):
                    run = words[i:i + 4]
                    if all(w.isalpha() for w in run) and " ".join(run).lower() not in searched:
                        phrase = " ".join(run)
                        break
                if phrase:
                    break
            if phrase:
                break
        if phrase:
            break
    assert phrase is not None
    assert search(index, json.dumps(phrase), all_text=True) == []


# -- the daemon and the command -------------------------------------------------------------

def _settings(tmp_path: Path, **kw: object) -> Settings:
    base: dict[str, object] = dict(source=tmp_path / "src", store=(tmp_path / "store").as_uri(),
                                   state_dir=tmp_path / "state", machine_id="m1",
                                   flush_quiet=0.2, flush_max_delay=1.0)
    base.update(kw)
    return load_settings(config_file=tmp_path / "none.toml", **base)


def _found(s: Settings, query: str) -> list[Hit]:
    path = s.state_dir / FILE_NAME
    if not path.exists():
        return []
    with SearchIndex.open(path) as ix:
        return search(ix, query)


def test_the_daemon_indexes_after_a_flush(tmp_path: Path) -> None:
    (tmp_path / "src" / "projects").mkdir(parents=True)
    write(tmp_path / "src", rel(S1), user("present at start"))
    s = _settings(tmp_path)
    with running(s):
        wait_for(lambda: _found(s, "present"), what="the first pass")
        write(tmp_path / "src", rel(S1), answer(text("flushed later")), mode="ab")
        wait_for(lambda: _found(s, "flushed"), what="the flushed bytes indexed")
        (tmp_path / "src" / rel(S1)).unlink()
        wait_for(lambda: all(h.deleted for h in _found(s, "flushed")),
                 what="the deleted session marked")


def test_search_off_indexes_nothing(tmp_path: Path) -> None:
    (tmp_path / "src" / "projects").mkdir(parents=True)
    write(tmp_path / "src", rel(S1), user("never indexed"))
    s = _settings(tmp_path, search=False)
    with running(s) as d:
        wait_for(lambda: d._ready, what="the daemon up")
        assert d._search is None
    assert not (s.state_dir / FILE_NAME).exists()


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SYNCD_", "AWS_"))}
    env.update({"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "xdg"),
                "SYNCD_SOURCE": str(tmp_path / "src"), "SYNCD_STATE_DIR": str(tmp_path / "state"),
                "SYNCD_MACHINE_ID": "m1", "SYNCD_STORE": (tmp_path / "store").as_uri(),
                "SYNCD_CONFIG": os.devnull})
    return env


def test_cli_search_indexes_first_and_prints(tmp_path: Path) -> None:
    write(tmp_path / "src", rel(S1), user("the [bold]x[/bold] migration plan"))
    env = _env(tmp_path)
    r = syncd(env, "search", "migration")
    assert r.returncode == 0, r.stderr
    head, snip = r.stdout.splitlines()
    assert head.startswith(f"{S1}  m1  2026-11-30T10:00:00.000Z  /home/u/proj  ")
    assert snip == "    the [bold]x[/bold] [migration] plan"
    r = syncd(env, "search", "--json", "migra*", "--since", "2026-11-01", "--limit", "5")
    (hit,) = json.loads(r.stdout)
    assert hit["session"] == S1 and ["migration", True] in hit["snippet"]
    assert hit["deleted"] is False
    r = syncd(env, "search", "migration", "--until", "2026-01-01")
    assert r.returncode == 0 and r.stdout == ""


def test_cli_bad_query_is_one_line_exit_2(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    line = one_line(syncd(_env(tmp_path), "search", '"unbalanced'), 2)
    assert line.startswith("syncd: search: cannot parse the query '\"unbalanced'")
    line = one_line(syncd(_env(tmp_path), "search", "x", "--since", "yesterday-ish"), 2)
    assert line.startswith("syncd: --since: ")


def test_no_match_says_so(tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path), "SYNCD_STATE_DIR": str(tmp_path / "state"),
           "SYNCD_SOURCE": str(tmp_path / "claude"), "SYNCD_STORE": (tmp_path / "s").as_uri()}
    (tmp_path / "claude").mkdir()
    r = syncd(env, "search", "--local", "wombat")
    assert r.returncode == 0 and r.stdout == "" and r.stderr == "no session matches\n"

"""The page in a real browser: each view loaded through ``syncd web`` and checked through
the DOM, a screenshot of each under the test's tmp dir."""

from __future__ import annotations

import http.client
import json
import os
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from syncd.config import load_settings
from syncd.errors import UsageError
from syncd.web.server import WebServer, bind, token_of
from tests.browser import browser, env_of, page, screenshot, sync, web  # noqa: F401
from tests.helpers import write

SID = "0f8e4c2a-1b3d-4e5f-8a9b-0c1d2e3f4a5b"
SID2 = "1a2b3c4d-5e6f-4a0b-8c1d-2e3f4a5b6c7d"


def transcript(sid: str, cwd: str, prompt: str, when: str) -> bytes:
    lines = [
        {"type": "user", "sessionId": sid, "cwd": cwd, "timestamp": when, "uuid": "u1",
         "message": {"role": "user", "content": prompt}},
        {"type": "assistant", "sessionId": sid, "cwd": cwd, "timestamp": when, "uuid": "a1",
         "parentUuid": "u1", "message": {"role": "assistant",
                                         "content": [{"type": "text", "text": "done"}]}},
    ]
    return b"".join(json.dumps(x, separators=(",", ":")).encode() + b"\n" for x in lines)


def tree(tmp_path: Path) -> dict[str, str]:
    src = tmp_path / "src"
    write(src, f"projects/-home-u-alpha/{SID}.jsonl",
          transcript(SID, "/home/u/alpha", "fix the parser", "2026-11-30T10:00:00.000Z"))
    write(src, f"projects/-home-u-beta/{SID2}.jsonl",
          transcript(SID2, "/home/u/beta", "write the docs", "2026-12-01T09:00:00.000Z"))
    env = env_of(tmp_path)
    sync(env)
    return env


def test_dashboard_and_sessions_views(tmp_path: Path, web: Any, page: Any) -> None:  # noqa: F811
    w = web(tree(tmp_path))
    page.goto(w.url)
    # The token became a cookie and left the address bar.
    assert "token=" not in page.url
    assert page.locator("h1").inner_text() == "Dashboard"
    assert page.locator("#status").inner_text().count("m1") >= 1
    # The figures are refreshed from the JSON endpoint by the static script.
    page.wait_for_selector("body[data-refreshed]", state="attached")
    # Stored bytes per machine: a sample taken at the first view, drawn as SVG.
    line = page.locator('#stored-plot polyline[data-machine="m1"]')
    assert line.count() == 1
    assert len(line.get_attribute("points").split()) >= 1
    assert "m1" in page.locator(".legend").inner_text()
    assert page.locator('#cost [data-field="cost_total"]').inner_text().startswith("$")
    screenshot(page, tmp_path, "dashboard")
    page.click("nav >> text=Sessions")
    rows = page.locator("#sessions tbody tr")
    assert rows.count() == 2
    # Newest first.
    assert rows.nth(0).get_attribute("data-session") == SID2
    assert rows.nth(1).locator(".title a").get_attribute("href") == f"/session/m1/{SID}"
    screenshot(page, tmp_path, "sessions")
    page.fill("input[name=project]", "alpha")
    page.click("button[type=submit]")
    assert page.locator("#sessions tbody tr").count() == 1
    assert page.syncd_errors == []


def test_the_followed_machines_lag_is_shown_and_refreshed(tmp_path: Path, web: Any,  # noqa: F811
                                                         page: Any) -> None:  # noqa: F811
    import time

    from syncd.backup.state import State

    env = tree(tmp_path)
    now = time.time()
    # desk: a change flushed there 10 minutes ago waits here; lab: all it read is here.
    st = State(load_settings(Path(os.devnull), source=tmp_path / "src",
                             state_dir=tmp_path / "state", store=(tmp_path / "store").as_uri(),
                             machine_id="m1").state_file)
    try:
        st.set_meta(follow=json.dumps({
            "desk": {"seq": 4, "last_check": now - 5, "waiting": [SID],
                     "since": {SID: now - 600}},
            "lab": {"seq": 2, "last_check": now - 5}}))
    finally:
        st.close()
    w = web(env)
    page.goto(w.url)
    rows = page.locator("#following tbody tr")
    lag = {rows.nth(i).get_attribute("data-machine"): rows.nth(i).locator(".lag").inner_text()
           for i in range(rows.count())}
    assert lag["desk"] == "10m behind"
    assert lag["lab"].startswith("up to date as of ") and lag["lab"].endswith("s ago)")
    # The script redraws it from /api/dashboard, the same words.
    page.evaluate("document.querySelector('#following .lag').textContent = '';"
                  "delete document.body.dataset.refreshed")
    page.wait_for_selector("body[data-refreshed]", state="attached")
    assert page.locator('#following tr[data-machine="desk"] .lag').inner_text() == "10m behind"
    screenshot(page, tmp_path, "dashboard-following")
    assert page.syncd_errors == []


# -- the search box, through a stand-in of the index ---------------------------------------


@dataclass
class Hit:
    machine: str
    session: str
    project: str
    last_activity: float | None
    title: str
    snippet: list[tuple[str, bool]]
    deleted: bool = False
    score: float = 0.0


class BadQuery(UsageError):
    pass


def fake_search(monkeypatch: pytest.MonkeyPatch, asked: list[str]) -> None:
    """``syncd.search`` as its interface says: the oldest session ranked first, with a
    snippet whose match is markup (shown as text); ``"bad`` is a query FTS5 refuses."""

    class SearchIndex:
        @classmethod
        def open(cls, path: Path) -> SearchIndex:
            return cls()

        def close(self) -> None:
            pass

    def search(index: SearchIndex, query: str, **kw: Any) -> list[Hit]:
        asked.append(query)
        if query.startswith('"'):
            raise BadQuery(f"bad query: {query}")
        return [Hit("m1", SID, "/home/u/alpha", None, "fix the parser",
                    [("the ", False), ("<b>parser</b>", True), (" again", False)]),
                Hit("m1", SID2, "/home/u/beta", None, "write the docs", [("docs", True)])]

    pkg = types.ModuleType("syncd.search")
    index = types.ModuleType("syncd.search.index")
    query = types.ModuleType("syncd.search.query")
    index.SearchIndex = SearchIndex  # type: ignore[attr-defined]
    query.search = search  # type: ignore[attr-defined]
    for name, mod in (("syncd.search", pkg), ("syncd.search.index", index),
                      ("syncd.search.query", query)):
        monkeypatch.setitem(sys.modules, name, mod)


def test_the_search_box_asks_the_index_and_shows_its_rank_and_snippets(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree(tmp_path)
    s = load_settings(Path(os.devnull), source=tmp_path / "src", state_dir=tmp_path / "state",
                      store=(tmp_path / "store").as_uri(), machine_id="m1")
    (s.state_dir / "search.db").write_bytes(b"")
    asked: list[str] = []
    fake_search(monkeypatch, asked)
    srv = WebServer(s, bind(0))
    srv.start()
    try:
        port = srv.bound.host.rpartition(":")[2]
        headers = {"Host": srv.bound.host, "Cookie": f"syncd_token_{port}={token_of(srv.bound)}"}

        def get(path: str) -> str:
            c = http.client.HTTPConnection("127.0.0.1", int(port), timeout=30)
            c.request("GET", path, headers=headers)
            r = c.getresponse()
            body = r.read().decode()
            c.close()
            assert r.status == 200, (r.status, body)
            return body

        body = get("/sessions?q=parser")
        assert asked == ["parser"]
        # The index's order (the older session first), not the time's.
        assert body.index(f'data-session="{SID}"') < body.index(f'data-session="{SID2}"')
        assert "<mark>&lt;b&gt;parser&lt;/b&gt;</mark>" in body and "<b>parser" not in body
        body = get("/sessions?q=%22bad")
        assert 'id="bad-query"' in body and "bad query: &#34;bad" in body
        assert "data-session=" not in body  # nothing found by a query that did not parse
    finally:
        srv.stop()


def test_syncd_web_stops_on_sigterm_with_exit_0(tmp_path: Path, web: Any) -> None:  # noqa: F811
    w = web(tree(tmp_path))
    w.process.terminate()
    assert w.process.wait(30) == 0


def test_a_port_taken_is_one_line_exit_2(tmp_path: Path) -> None:
    import socket
    import subprocess

    (tmp_path / "store").mkdir()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "syncd", "web", "--port", str(port)],
                           env=env_of(tmp_path), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == [f"syncd: --port {port}: Address already in use "
                                     "(--port 0: any free port)"]

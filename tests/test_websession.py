"""The session pages' routes through the app and its guard, without a browser: a bad
machine or session id is 404 before any store is read, a restore is never a GET and
never without the CSRF field, its plan comes before the confirm that writes; resume;
conflict copies kept through the form, by index into the page's own listing."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from syncd.claude import project_folder
from syncd.config import Settings
from syncd.repository import Repository
from syncd.store import LocalStore
from syncd.web.app import make_app
from syncd.web.security import Guard
from tests.test_sessionpage import REL, S1, S2, _app, _copy, _old, _transcript, settings_of
from tests.test_sessionpage import desk as desk
from tests.test_sessionpage import laptop as laptop

HOST = "127.0.0.1:8123"
TOKEN = "t" * 43


class Client:
    """Requests straight into the ASGI app, as a browser that opened the URL sends them."""

    def __init__(self, settings: Settings) -> None:
        store = LocalStore(Path(settings.store.removeprefix("file://")))
        self.app = make_app(settings, token=TOKEN, host=HOST,
                            repo=Repository(store, settings.machine_id))
        self.guard = Guard(TOKEN, HOST)

    def __call__(self, method: str, path: str, form: dict[str, str] | None = None, *,
                 csrf: bool = True) -> tuple[int, str]:
        headers = [(b"host", HOST.encode()),
                   (b"cookie", f"{self.guard.cookie}={TOKEN}".encode())]
        body = b""
        if form is not None:
            if csrf:
                form = {"csrf": self.guard.csrf, **form}
            body = urlencode(form).encode()
            headers.append((b"content-type", b"application/x-www-form-urlencoded"))
        path, _, query = path.partition("?")
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": method, "scheme": "http", "path": path,
                 "raw_path": path.encode(), "query_string": query.encode(),
                 "headers": headers, "client": ("127.0.0.1", 5000),
                 "server": ("127.0.0.1", 8123), "root_path": ""}
        incoming = [{"type": "http.request", "body": body, "more_body": False}]
        status: list[int] = []
        chunks: list[bytes] = []

        async def receive() -> dict[str, Any]:
            return incoming.pop(0) if incoming else {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        asyncio.run(self.app(scope, receive, send))
        return status[0], b"".join(chunks).decode()


@pytest.fixture
def client(desk: Settings) -> Client:
    return Client(desk)


def test_the_session_page_shows_the_transcript_and_its_points(client: Client) -> None:
    code, html = client("GET", f"/session/laptop/{S1}")
    assert code == 200
    assert "the second prompt" in html
    points = re.findall(rf'href="/session/laptop/{S1}\?at=(\d+)"', html)
    assert len(points) == 2  # the two flushes that changed S1, not S2's
    code, then = client("GET", f"/session/laptop/{S1}?at={min(map(int, points))}")
    assert code == 200 and "the first prompt" in then and "the second prompt" not in then


@pytest.mark.parametrize("path", [
    f"/session/nobody/{S1}", "/session/laptop/not-a-session", f"/session/laptop/{S1[:8]}",
    f"/session/laptop/{S1}?at=999", f"/session/laptop/{S1}?at=..%2Fx",
    f"/session/laptop/{S1}?at=1",  # S2's point, not one of S1's
    f"/session/nobody/{S1}/size", "/session/laptop/..%2F..%2Fetc/fragment"])
def test_an_unknown_machine_session_or_point_is_404(client: Client, path: str) -> None:
    assert client("GET", path)[0] == 404


def test_a_restore_is_never_a_get_nor_without_csrf(client: Client, desk: Settings
                                                   ) -> None:
    assert client("GET", f"/session/laptop/{S1}/restore")[0] == 405
    assert client("POST", f"/session/laptop/{S1}/restore", {"step": "confirm"},
                  csrf=False)[0] == 403
    assert client("POST", "/conflicts/keep", {"index": "0", "keep": "copy"},
                  csrf=False)[0] == 403
    assert not _transcript(desk, S1).exists()


def test_the_plan_comes_first_then_the_confirm_restores(client: Client,
                                                        desk: Settings) -> None:
    code, plan = client("POST", f"/session/laptop/{S1}/restore", {"step": "plan", "at": ""})
    assert code == 200
    assert 'id="restore-plan"' in plan and 'id="confirm"' in plan and "create" in plan
    assert not _transcript(desk, S1).exists()
    code, done = client("POST", f"/session/laptop/{S1}/restore", {"step": "confirm", "at": ""})
    assert code == 200 and 'id="restore-report"' in done and 'id="confirm"' not in done
    assert b"the second prompt" in _transcript(desk, S1).read_bytes()


def test_a_restore_as_of_a_point(client: Client, desk: Settings) -> None:
    html = client("GET", f"/session/laptop/{S1}")[1]
    oldest = min(map(int, re.findall(r"\?at=(\d+)", html)))
    client("POST", f"/session/laptop/{S1}/restore", {"step": "confirm", "at": str(oldest)})
    assert b"the second prompt" not in _transcript(desk, S1).read_bytes()
    assert client("POST", f"/session/laptop/{S1}/restore",
                  {"step": "confirm", "at": "1"})[0] == 404  # not one of S1's points


def test_resume_restores_first_then_gives_the_line(client: Client,
                                                   desk: Settings) -> None:
    code, plan = client("POST", f"/session/laptop/{S1}/resume", {"step": "plan"})
    assert code == 200 and 'id="restore-plan"' in plan and 'id="resume-line"' not in plan
    assert not _transcript(desk, S1).exists()
    code, done = client("POST", f"/session/laptop/{S1}/resume", {"step": "confirm"})
    line = f"cd {_app(desk)} &amp;&amp; claude --resume {S1}"
    assert code == 200 and line in done and 'data-copy="resume-line"' in done
    # Here now: the line at once, nothing restored.
    code, again = client("POST", f"/session/laptop/{S1}/resume", {"step": "plan"})
    assert line in again and 'id="restore-plan"' not in again


def test_the_size_is_json(client: Client, desk: Settings) -> None:
    code, body = client("GET", f"/session/laptop/{S1}/size")
    assert code == 200 and re.fullmatch(r'\{"size":\d+\}', body)
    assert client("GET", f"/session/{desk.machine_id}/{S2}/size")[1] == '{"size":null}'


def test_conflicts_kept_through_the_form(client: Client, desk: Settings) -> None:
    local = desk.source / REL
    local.parent.mkdir(parents=True)
    local.write_bytes(b'{"type":"user","message":{"content":"local words"}}\n')
    _old(local)
    _copy(desk, b'{"type":"user","message":{"content":"copy words"}}\n')
    _copy(desk, b"<b>copy</b>\n", second="20261202T000000", rel="notes.txt")
    code, html = client("GET", "/conflicts")
    assert code == 200 and "side-by-side" in html and "&lt;b&gt;copy&lt;/b&gt;" in html
    seen = re.search(r'name="seen" value="(\w+)"', html)
    assert seen is not None
    # A listing that changed since the page was loaded: nothing done.
    assert client("POST", "/conflicts/keep", {"index": "1", "keep": "copy",
                                              "seen": "0" * 16})[0] == 409
    assert b"local words" in local.read_bytes()
    code, html = client("POST", "/conflicts/keep", {"index": "1", "keep": "copy",
                                                    "seen": seen[1]})
    assert code == 200 and 'id="done"' in html
    assert b"copy words" in local.read_bytes()
    code, html = client("POST", "/conflicts/keep", {"index": "5", "keep": "copy",
                                                    "seen": seen[1]})
    assert code == 409


def test_the_folder_of_a_local_session_is_its_own(tmp_path: Path, laptop: Settings
                                                  ) -> None:
    # This machine's own session, from its tree (no store read for the transcript).
    s = settings_of(tmp_path, "desk", "/home/alice")
    t = s.source / "projects" / project_folder("/x") / f"{S2}.jsonl"
    t.parent.mkdir(parents=True)
    t.write_bytes(b'{"type":"user","cwd":"/x","message":{"content":"mine here"}}\n')
    code, html = Client(s)("GET", f"/session/desk/{S2}")
    assert code == 200 and "mine here" in html


def test_a_conflict_copy_says_when_it_was_saved_as_a_time(client: Client, desk: Settings
                                                        ) -> None:
    _copy(desk, b"<b>copy</b>\n", second="20261202T004712-2", rel="notes.txt")
    code, html = client("GET", "/conflicts")
    assert code == 200 and "saved 2026-12-02 00:47:12 (" in html, html
    assert "20261202T004712" not in html.split("<form")[0].split("saved")[-1]
    _copy(desk, b"x\n", second="20261399T999999", rel="other.txt")  # no time: no 500
    code, html = client("GET", "/conflicts")
    assert code == 200 and "saved - (" in html


def test_a_long_session_comes_in_parts(client: Client, desk: Settings) -> None:
    from html import unescape

    # This machine's own long session: prompts of 2 kB, ~600 kB in all.
    path = desk.source / "projects" / project_folder("/home/alice/app") / f"{S2}.jsonl"
    path.parent.mkdir(parents=True)
    lines = [f'{{"type":"user","sessionId":"{S2}","cwd":"/home/alice/app",'
             f'"message":{{"role":"user","content":"marker-{n}- {"**word** " * 220}"}}}}\n'
             for n in range(300)]
    path.write_text("".join(lines))
    assert path.stat().st_size > 512 << 10  # two parts of 256 KiB
    code, page = client("GET", f"/session/desk/{S2}")
    assert code == 200 and "marker-0-" in page and "marker-299-" not in page
    more = re.search(r'<p class="more" data-from="(\d+)">.*?href="([^"]+)" class="more-next"'
                     r'.*?href="([^"]+)" class="more-all"', page)
    assert more is not None
    start = int(more.group(1))
    assert f"marker-{start - 1}-" in page and f"marker-{start}-" not in page
    assert unescape(more.group(2)) == f"/session/desk/{S2}?from={start}"
    # The script fetches the parts through the fragment route.
    code, part = client("GET", f"/session/desk/{S2}/fragment?from={start}")
    assert code == 200 and f"marker-{start}-" in part and "marker-299-" not in part
    assert "<article" not in part and 'class="more"' in part
    code, rest = client("GET", f"/session/desk/{S2}/fragment?from={start}&all=1")
    assert code == 200 and "marker-299-" in rest and 'class="more"' not in rest
    # A live reload asks again for what the page shows.
    code, again = client("GET", f"/session/desk/{S2}/fragment?upto={start}")
    assert code == 200 and f"marker-{start - 1}-" in again and f"marker-{start}-" not in again
    # Without the script, the link is a page of its own.
    code, alone = client("GET", unescape(more.group(2)))
    assert code == 200 and f"marker-{start}-" in alone and "marker-0-" not in alone
    for bad in ("from=x", "upto=-1", "from=1e9"):
        assert client("GET", f"/session/desk/{S2}/fragment?{bad}")[0] == 404

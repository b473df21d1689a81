"""Attacks on ``syncd web`` by someone who writes the store's sessions (titles, projects,
transcripts) or whose page the user opens in the same browser: nothing of theirs runs,
nothing is sent elsewhere, nothing changes without our token."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest

from syncd.config import Settings
from syncd.web.security import Guard, Guarded, Message, Receive, Scope, Send
from tests.browser import browser, env_of, page, screenshot, sync, web  # noqa: F401
from tests.helpers import write
from tests.test_sessionpage import S1, _copy
from tests.test_sessionpage import desk as desk
from tests.test_sessionpage import laptop as laptop
from tests.test_websession import Client
from tests.test_websession import client as client

TOKEN = "t" * 43
HOST = "127.0.0.1:8765"


async def _app(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def call(method: str, raw_path: bytes, query: bytes = b"",
         headers: list[tuple[bytes, bytes]] | None = None) -> list[Message]:
    """One request through the guard (as uvicorn gives it: ``path`` decoded, ``raw_path``
    as sent), and what it answered."""
    from urllib.parse import unquote

    scope: Scope = {"type": "http", "method": method, "raw_path": raw_path,
                    "path": unquote(raw_path.decode("latin-1")), "query_string": query,
                    "headers": [(b"host", HOST.encode()), *(headers or [])]}
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(Guarded(_app, Guard(TOKEN, HOST))(scope, receive, send))
    return sent


def location(sent: list[Message]) -> str:
    assert sent[0]["status"] == 303
    return dict(sent[0]["headers"])[b"location"].decode("latin-1")


@pytest.mark.parametrize("raw", [b"//evil.example/", b"/%2F%2Fevil.example/", b"/\\evil.example",
                                 b"///evil.example", b"/%5Cevil.example"])
def test_the_first_visit_redirect_stays_on_this_site(raw: bytes) -> None:
    # The printed URL with another path: the redirect that drops the token must not become
    # a protocol-relative URL (another host) however the path is spelt.
    where = location(call("GET", raw, b"token=" + TOKEN.encode() + b"&q=x"))
    assert where.startswith("/") and not where.startswith(("//", "/\\"))
    assert where.endswith("?q=x") and TOKEN not in where


def test_the_first_visit_redirect_keeps_the_path_quoted() -> None:
    # Decoded, %0d%0a would split the header (uvicorn refused it: a 500 and a traceback).
    where = location(call("GET", b"/x%0d%0aSet-Cookie:%20a=b", b"token=" + TOKEN.encode()))
    assert where.lower() == "/x%0d%0aset-cookie:%20a=b"
    assert location(call("GET", b"/sessions%3Fq=1", b"token=" + TOKEN.encode())).lower() == \
        "/sessions%3fq=1"


def test_the_printed_url_opened_again_leaves_the_address_bar_too() -> None:
    # The cookie is set already (a second visit of the URL syncd printed, or of
    # `syncd web --url`'s): the token must not stay in the address bar, the history and
    # every link the page builds from its query (the sessions view's pager).
    cookie = [(b"cookie", f"{Guard(TOKEN, HOST).cookie}={TOKEN}".encode())]
    sent = call("GET", b"/sessions", b"token=" + TOKEN.encode() + b"&q=x", cookie)
    assert location(sent) == "/sessions?q=x"
    # A stale token of an earlier start beside a good cookie: dropped too, no cookie set.
    sent = call("GET", b"/sessions", b"token=old&q=x", cookie)
    assert location(sent) == "/sessions?q=x"
    assert b"set-cookie" not in dict(sent[0]["headers"])
    assert call("GET", b"/sessions", b"token=old")[0]["status"] == 403


# -- the session pages -------------------------------------------------------------------

@pytest.mark.parametrize("at", ["%C2%B2", "%E2%91%A0"])  # "²", "①": str.isdigit() says yes
def test_a_point_that_is_a_unicode_digit_is_404(client: Client, at: str) -> None:
    assert client("GET", f"/session/laptop/{S1}?at={at}")[0] == 404
    assert client("GET", f"/session/laptop/{S1}/fragment?at={at}")[0] == 404


def test_a_conflict_index_that_is_a_unicode_digit_changes_nothing(client: Client,
                                                                  desk: Settings) -> None:
    from syncd.web.conflictcopy import fingerprint, list_copies

    seen = fingerprint(list_copies(desk))
    code, html = client("POST", "/conflicts/keep", {"index": "²", "keep": "local",
                                                    "seen": seen})
    assert code == 409 and "nothing done" in html


def test_a_backup_that_does_not_read_is_a_page_that_says_so(client: Client,
                                                           desk: Settings) -> None:
    code, html = client("GET", f"/session/laptop/{S1}")
    at = re.findall(rf'href="/session/laptop/{S1}\?at=(\d+)"', html)[0]
    # What a hostile or damaged store does to an old point: its objects do not read.
    for obj in (Path(desk.store.removeprefix("file://")) / "machines" / "laptop").glob("seg/*"):
        obj.unlink()
    code, html = client("GET", f"/session/laptop/{S1}?at={at}")
    assert code == 502 and "laptop" in html
    assert client("GET", f"/session/laptop/{S1}/fragment?at={at}")[0] == 502


def test_the_conflicts_page_shares_one_budget(client: Client, desk: Settings,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # Copies a store's machines made, each within a transcript's limits, and many: what
    # the page renders of them all is bounded, not what each may hold.
    from syncd.render import transcript as transcript_module

    monkeypatch.setattr(transcript_module, "TOTAL_MAX", 64 << 10)
    words = " ".join(["hostile"] * 6000)  # 47 KiB of one prompt
    for i in range(6):
        sid = f"{i:08x}-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
        _copy(desk, json.dumps({"type": "user", "message": {"role": "user",
                                                            "content": words}}).encode()
              + b"\n", second=f"2026120{i + 1}T101010",
              rel=f"projects/-home-alice-app/{sid}.jsonl")
    code, html = client("GET", "/conflicts")
    assert code == 200 and html.count('class="conflict"') == 6
    # The budget's words, and the titles made of each side's first prompt (without it:
    # every side whole, 6 copies of 47 KiB).
    assert html.count("hostile") < 2 * ((64 << 10) // len("hostile "))


# -- the dashboard -----------------------------------------------------------------------

def test_stored_bytes_cost_a_listing_not_a_request_per_machine(tmp_path: Path) -> None:
    # 3,000 machines of one small object each: anyone who writes the bucket makes them.
    from types import SimpleNamespace

    from syncd.repository import Repository
    from syncd.store.memory import MemoryStore
    from syncd.web.dashboard import _stored
    from tests.counting import CountingStore

    inner = MemoryStore()
    for i in range(3000):
        inner.put(f"machines/m{i:04d}/machine.json", b"{}")
    inner.put("machines/not a machine!/x", b"1234")
    store = CountingStore(inner)
    site = SimpleNamespace(repository=lambda: Repository(store, "m0000"))
    sizes = _stored(site)  # type: ignore[arg-type]
    assert len(sizes) == 3000 and sizes["m0042"] == 2
    assert store.counts.by_kind()["LIST"] <= 4


def test_the_plot_reads_the_samples_of_the_biggest_machines_only(tmp_path: Path) -> None:
    from syncd.web.samples import Samples

    samples = Samples(tmp_path / "web.sqlite")
    for t in range(3):
        samples.add(1000.0 + t, {f"m{i:04d}": i * 10 + t for i in range(500)})
    got = samples.series(most=12)
    assert sorted(got) == ["(others)", *(f"m{i:04d}" for i in range(488, 500))]
    assert got["m0499"] == [(1000.0, 4990), (1001.0, 4991), (1002.0, 4992)]
    # The rest summed at each time: those a sample kept (100) and those it summed already.
    assert got["(others)"] == [(1000.0 + t, 10 * 487 * 488 // 2 + 488 * t) for t in range(3)]
    assert len(samples.series()) == 101  # a sample keeps the 100 biggest and the rest's sum
    samples.close()


# -- a hostile store's strings in a real browser -------------------------------------------
# (Last in the module: while its browser runs, Playwright's sync API holds this thread's
# event loop, and the ASGI calls above need one of their own.)

# Each one sets window.__pwned if it ever runs, whatever context it lands in.
PAYLOADS = [
    "<script>window.__pwned=1</script>",
    "<img src=x onerror=\"window.__pwned=1\">",
    "\"><svg onload=window.__pwned=1>",
    "'><iframe src=javascript:window.__pwned=1>",
    "</textarea></title><script>window.__pwned=1</script>",
    "<a href=\"javascript:window.__pwned=1\">x</a>",
    "<style>body{background:url(https://evil.example/x)}</style>",
    "\u202egnp.exe <math><mi xlink:href=javascript:window.__pwned=1>x",
]
SIDS = [f"{i:08x}-1b3d-4e5f-8a9b-0c1d2e3f4a5b" for i in range(len(PAYLOADS))]


def hostile_tree(tmp_path: Path) -> dict[str, str]:
    src = tmp_path / "src"
    for sid, bad in zip(SIDS, PAYLOADS, strict=True):
        cwd = f"/home/u/{bad}"
        lines = [
            {"type": "user", "sessionId": sid, "cwd": cwd, "timestamp":
             "2026-11-30T10:00:00.000Z", "message": {"role": "user", "content": bad}},
            {"type": "assistant", "sessionId": sid, "cwd": cwd, "timestamp":
             "2026-11-30T10:00:01.000Z", "message": {"role": "assistant", "content": [
                 {"type": "text", "text": f"[link](javascript:window.__pwned=1) {bad}"}]}},
            {"type": "custom-title", "sessionId": sid, "customTitle": bad},
        ]
        write(src, f"projects/-home-u-x/{sid}.jsonl",
              b"".join(json.dumps(x, separators=(",", ":")).encode() + b"\n"
                       for x in lines))
    env = env_of(tmp_path)
    sync(env)
    return env


def test_hostile_titles_projects_and_queries_run_nothing(tmp_path: Path, web: Any,  # noqa: F811
                                                        page: Any) -> None:  # noqa: F811
    w = web(hostile_tree(tmp_path))
    page.goto(w.url)
    page.goto(f"{w.base}/sessions")
    rows = page.locator("#sessions tbody tr")
    assert rows.count() == len(PAYLOADS)
    titles = set(page.locator("#sessions .title a").all_inner_texts())
    assert titles == {p.strip() for p in PAYLOADS}  # shown as typed, not as markup
    # A query parameter reflected in the form (and the search's snippets).
    for bad in PAYLOADS:
        page.goto(f"{w.base}/sessions?q={bad}&project={bad}")
        assert page.locator("input[name=q]").input_value() == bad
    screenshot(page, tmp_path, "hostile-sessions")
    assert page.evaluate("window.__pwned") is None
    assert page.locator("main script, main img, main svg, main iframe, main style, "
                        "main math").count() == 0
    assert not [e for e in page.syncd_errors if "Content Security Policy" in e]

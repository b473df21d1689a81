"""Attacks on ``syncd web`` by someone who writes the store's sessions (titles, projects,
transcripts) or whose page the user opens in the same browser: nothing of theirs runs,
nothing is sent elsewhere, nothing changes without our token."""

from __future__ import annotations

import asyncio

import pytest

from syncd.web.security import Guard, Guarded, Message, Receive, Scope, Send

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


def test_the_first_visit_redirect_keeps_the_path_as_sent() -> None:
    # Decoded, %0d%0a would split the header (uvicorn refused it: a 500 and a traceback).
    where = location(call("GET", b"/x%0d%0aSet-Cookie:%20a=b", b"token=" + TOKEN.encode()))
    assert where == "/x%0d%0aSet-Cookie:%20a=b"
    assert location(call("GET", b"/sessions%3Fq=1", b"token=" + TOKEN.encode())) == \
        "/sessions%3Fq=1"

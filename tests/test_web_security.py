"""The page's guard: token, Host, CSRF, Origin, the headers on every response, loopback
only; and a hostile store's strings shown as text in a real browser."""

from __future__ import annotations

import http.client
import json
import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from syncd.backup.state import State
from syncd.config import Settings, load_settings
from syncd.errors import UsageError
from syncd.web.security import CSP, Guard, loopback_hosts
from syncd.web.server import Bound, WebServer, bind, token_of
from tests.browser import browser, env_of, page, screenshot, sync, web  # noqa: F401
from tests.helpers import write

SID = "0f8e4c2a-1b3d-4e5f-8a9b-0c1d2e3f4a5b"
EVIL_TITLE = '<img src=x onerror="window.__pwned=1">'
EVIL_PROJECT = "<script>window.__pwned=1</script>"


def settings(tmp_path: Path) -> Settings:
    (tmp_path / "store").mkdir(exist_ok=True)
    return load_settings(Path(os.devnull), source=tmp_path / "src",
                         state_dir=tmp_path / "state", store=(tmp_path / "store").as_uri(),
                         machine_id="m1")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[WebServer]:
    s = WebServer(settings(tmp_path), bind(0))
    s.start()
    try:
        yield s
    finally:
        s.stop()


def request(srv: WebServer, path: str, *, method: str = "GET", host: str | None = None,
            headers: dict[str, str] | None = None, body: bytes | None = None
            ) -> http.client.HTTPResponse:
    port = int(srv.bound.host.rpartition(":")[2])
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.putrequest(method, path, skip_host=True)
    c.putheader("Host", srv.bound.host if host is None else host)
    for k, v in (headers or {}).items():
        c.putheader(k, v)
    if body is not None:
        c.putheader("Content-Length", str(len(body)))
    c.endheaders(body)
    r = c.getresponse()
    r.read()
    c.close()
    return r


def cookie(srv: WebServer) -> dict[str, str]:
    port = srv.bound.host.rpartition(":")[2]
    return {"Cookie": f"syncd_token_{port}={token_of(srv.bound)}"}


def secured(r: http.client.HTTPResponse) -> None:
    assert r.getheader("Content-Security-Policy") == CSP
    assert "'unsafe-inline'" not in CSP and "script-src 'self'" in CSP
    assert r.getheader("X-Content-Type-Options") == "nosniff"
    assert r.getheader("Referrer-Policy") == "same-origin"
    assert r.getheader("Cache-Control") == "no-store"


def test_without_the_token_nothing_is_served(server: WebServer) -> None:
    for path in ("/", "/sessions", "/api/dashboard", "/static/style.css", "/nope"):
        r = request(server, path)
        assert r.status == 403, path
        secured(r)
    assert request(server, "/?token=not-the-token").status == 403
    assert request(server, "/", headers={"Cookie": "syncd_token_1=x"}).status == 403


def test_the_printed_url_sets_a_strict_cookie_and_drops_the_token(server: WebServer) -> None:
    token = token_of(server.bound)
    r = request(server, f"/sessions?machine=m2&token={token}")
    assert r.status == 303
    assert r.getheader("Location") == "/sessions?machine=m2"
    set_cookie = r.getheader("Set-Cookie") or ""
    assert set_cookie.startswith(f"syncd_token_{server.bound.host.rpartition(':')[2]}={token};")
    for attr in ("HttpOnly", "SameSite=Strict", "Path=/"):
        assert attr in set_cookie
    secured(r)
    # The redirect stays on this site, whatever the path says.
    for path, where in (("//evil.example/x", "/evil.example/x"),
                        ("/a%0d%0aX:%20y", "/a%0D%0AX:%20y")):
        r = request(server, f"{path}?token={token}")
        assert r.status == 303 and r.getheader("Location") == where, path
    ok = request(server, "/static/style.css", headers=cookie(server))
    assert ok.status == 200
    secured(ok)
    api = request(server, "/api/dashboard", headers=cookie(server))
    assert api.status == 200
    secured(api)


def test_a_foreign_host_is_refused_even_with_the_token(server: WebServer) -> None:
    port = server.bound.host.rpartition(":")[2]
    for host in ("evil.example", f"evil.example:{port}", f"127.0.0.1:{int(port) + 1}",
                 f"127.0.0.2:{port}", f"localhost.evil.example:{port}", ""):
        r = request(server, "/", host=host, headers=cookie(server))
        assert r.status == 403, host
        secured(r)
    assert request(server, "/static/style.css", host=f"localhost:{port}",
                   headers=cookie(server)).status == 200


def test_a_repeated_host_header_is_refused(server: WebServer) -> None:
    r = request(server, "/", headers={**cookie(server), "Host": "evil.example"})
    assert r.status in (400, 403)  # the HTTP parser may refuse it before the guard


def test_a_post_needs_the_csrf_token_and_our_origin(server: WebServer) -> None:
    guard = Guard(token_of(server.bound), server.bound.host)
    form = {"Content-Type": "application/x-www-form-urlencoded", **cookie(server)}
    # No CSRF token, a wrong one, one in a body that is not a form: refused.
    assert request(server, "/sessions", method="POST", headers=form, body=b"a=1").status == 403
    assert request(server, "/sessions", method="POST", headers=form,
                   body=b"csrf=" + b"0" * 64).status == 403
    assert request(server, "/sessions", method="POST", headers={
        **cookie(server), "Content-Type": "application/json"},
        body=json.dumps({"csrf": guard.csrf}).encode()).status == 403
    # The token itself is not the CSRF token (it never sits in a page).
    assert guard.csrf != guard.token
    assert request(server, "/sessions", method="POST", headers=form,
                   body=f"csrf={guard.token}".encode()).status == 403
    # With it, the guard lets the POST through (the route takes no POST: 405).
    good = f"csrf={guard.csrf}".encode()
    assert request(server, "/sessions", method="POST", headers=form, body=good).status == 405
    assert request(server, "/sessions", method="POST", headers={
        **cookie(server), "X-CSRF-Token": guard.csrf}).status == 405
    # A foreign Origin is refused whatever it carries; ours is fine.
    for origin in ("http://evil.example", "null", f"http://{server.bound.host}.evil"):
        r = request(server, "/sessions", method="POST", headers={**form, "Origin": origin},
                    body=good)
        assert r.status == 403, origin
    assert request(server, "/sessions", method="POST", headers={
        **form, "Origin": f"http://{server.bound.host}"}, body=good).status == 405
    # Without the token, CSRF is not even looked at.
    assert request(server, "/sessions", method="POST", headers={
        "Content-Type": "application/x-www-form-urlencoded"}, body=good).status == 403


def test_only_get_head_and_post(server: WebServer) -> None:
    for method in ("PUT", "DELETE", "PATCH", "OPTIONS"):
        r = request(server, "/", method=method, headers=cookie(server))
        assert r.status == 405, method


def test_loopback_only() -> None:
    with pytest.raises(UsageError, match=r"127\.0\.0\.1 only"):
        bind(0, address="0.0.0.0")
    with pytest.raises(ValueError):
        loopback_hosts("10.0.0.1:80")
    b = bind(0)
    try:
        assert b.sock.getsockname()[0] == "127.0.0.1"
        assert b.url.startswith(f"http://127.0.0.1:{b.sock.getsockname()[1]}/?token=")
    finally:
        b.sock.close()


def test_each_start_has_its_own_token() -> None:
    a, b = bind(0), bind(0)
    try:
        assert token_of(a) != token_of(b) and len(token_of(a)) >= 40
    finally:
        a.sock.close()
        b.sock.close()


def test_a_unix_socket_is_its_owner_s_alone(tmp_path: Path) -> None:
    path = tmp_path / "web.sock"
    b: Bound = bind(socket_path=path)
    srv = WebServer(settings(tmp_path), b)
    srv.start()
    try:
        assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600
        assert b.host == "localhost"
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(30)
        s.connect(os.fspath(path))
        s.sendall(b"GET /static/style.css HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
                  b"Cookie: syncd_token_sock=" + token_of(b).encode() + b"\r\n\r\n")
        got = b""
        while chunk := s.recv(65536):
            got += chunk
        s.close()
        assert got.startswith(b"HTTP/1.1 200")
    finally:
        srv.stop()
    assert not path.exists()  # removed when the server stops


# -- a hostile store in a real browser ----------------------------------------------------


def hostile_store(tmp_path: Path) -> dict[str, str]:
    """This machine (m1) with one session, and machine evil whose session's title and
    project are markup."""
    lines = [{"type": "user", "sessionId": SID, "cwd": EVIL_PROJECT, "uuid": "u1",
              "timestamp": "2026-12-01T10:00:00.000Z",
              "message": {"role": "user", "content": "hello"}},
             {"type": "custom-title", "sessionId": SID, "customTitle": EVIL_TITLE}]
    data = b"".join(json.dumps(x, separators=(",", ":")).encode() + b"\n" for x in lines)
    evil = tmp_path / "evil"
    write(evil / "src", f"projects/-evil/{SID}.jsonl", data)
    env = env_of(tmp_path, machine="evil", SYNCD_SOURCE=str(evil / "src"),
                 SYNCD_STATE_DIR=str(evil / "state"))
    sync(env)
    mine = env_of(tmp_path)
    write(tmp_path / "src", "projects/-home-u-a/1a2b3c4d-5e6f-4a0b-8c1d-2e3f4a5b6c7d.jsonl",
          b'{"type":"user","cwd":"/home/u/a","timestamp":"2026-11-01T00:00:00.000Z",'
          b'"message":{"role":"user","content":"mine"}}\n')
    sync(mine)
    # m1 follows evil, whose last poll failed with words of its store's.
    st = State(settings(tmp_path).state_file)
    try:
        st.set_meta(follow=json.dumps({"evil": {"seq": 0, "last_check": 1.0,
                                                "problem": EVIL_TITLE,
                                                "conflicts": [EVIL_PROJECT]}}))
    finally:
        st.close()
    return mine


def test_a_hostile_machine_s_markup_is_shown_as_text(tmp_path: Path, web: Any,  # noqa: F811
                                                     page: Any) -> None:  # noqa: F811
    w = web(hostile_store(tmp_path))
    page.goto(w.url)
    page.click("nav >> text=Sessions")
    row = page.locator('#sessions tr[data-machine="evil"]')
    assert row.count() == 1
    assert row.locator(".title a").inner_text() == EVIL_TITLE
    assert row.locator(".path").inner_text() == EVIL_PROJECT
    assert row.locator("img").count() == 0 and page.locator("main script").count() == 0
    # Searched and filtered by the hostile strings too: still text.
    page.fill("input[name=q]", "onerror")
    page.click("button[type=submit]")
    assert page.locator('#sessions tr[data-machine="evil"] .title a').inner_text() == EVIL_TITLE
    page.goto(f"{w.base}/sessions?project=%3Cscript%3E")
    assert page.locator("input[name=project]").input_value() == "<script>"
    assert page.locator('#sessions tr[data-machine="evil"]').count() == 1
    screenshot(page, tmp_path, "hostile-sessions")
    page.goto(f"{w.base}/")
    # The followed machine's problem, in the table and in the problems list the script
    # redraws: text, both.
    assert EVIL_TITLE in page.locator("#following").inner_text()
    page.wait_for_selector("body[data-refreshed]", state="attached")
    assert any(EVIL_TITLE in t for t in page.locator("#problems li").all_inner_texts())
    assert page.locator("main img").count() == 0
    screenshot(page, tmp_path, "hostile-dashboard")
    assert page.evaluate("typeof window.__pwned") == "undefined"

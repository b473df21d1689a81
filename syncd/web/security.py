"""What guards the page: the start's token, the Host header, CSRF, and the headers every
response carries.

The page is on loopback, but any site the user visits can make the browser send requests
to 127.0.0.1, and a name the attacker controls can resolve there (DNS rebinding). So:
every request needs the token (from the URL printed at start, then a cookie); the Host
header must be the loopback name we printed; a request that changes anything is a POST
with a CSRF token and, when the browser sends one, our Origin; and no response may run
script of the store's (CSP without inline script) or be framed.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
       "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
    (b"x-frame-options", b"DENY"),
)
# A POST form is small: its body is read whole to check the CSRF field, up to this.
FORM_MAX = 64 << 10
CSRF_FIELD = "csrf"
CSRF_HEADER = b"x-csrf-token"  # for a static script's fetch() POST
SAFE = frozenset({"GET", "HEAD"})


def new_token() -> str:
    """A token for one start of the server (as Jupyter's)."""
    return secrets.token_urlsafe(32)


def loopback_hosts(host: str) -> frozenset[str]:
    """The Host values we answer: the printed ``127.0.0.1:PORT`` and ``localhost:PORT``
    (or, on a Unix socket, ``localhost``)."""
    name, _, port = host.rpartition(":") if ":" in host else (host, "", "")
    if name not in ("127.0.0.1", "localhost"):
        raise ValueError(f"not a loopback host: {host}")
    suffix = f":{port}" if port else ""
    return frozenset({f"127.0.0.1{suffix}", f"localhost{suffix}"})


@dataclass(frozen=True)
class Guard:
    """The start's secrets and the names it answers to."""

    token: str
    host: str  # as printed: 127.0.0.1:PORT (or localhost on a Unix socket)
    hosts: frozenset[str] = field(default=frozenset())

    def __post_init__(self) -> None:
        object.__setattr__(self, "hosts", loopback_hosts(self.host))

    @property
    def cookie(self) -> str:
        # Cookies are not kept apart by port: two servers on one host need two names.
        return "syncd_token_" + (self.host.rpartition(":")[2] if ":" in self.host else "sock")

    @property
    def csrf(self) -> str:
        """The CSRF token of this start: derived from the token, so it proves nothing
        to whoever holds neither, and never the token itself (it sits in every form)."""
        return hmac.new(self.token.encode(), b"syncd csrf", hashlib.sha256).hexdigest()

    @property
    def origins(self) -> frozenset[str]:
        return frozenset(f"http://{h}" for h in self.hosts)

    def token_ok(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self.token.encode())

    def csrf_ok(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self.csrf.encode())


def _headers(scope: Scope) -> dict[bytes, bytes]:
    # A repeated header: the first one counts (a second Host is refused below).
    out: dict[bytes, bytes] = {}
    for k, v in scope.get("headers", ()):
        out.setdefault(k.lower(), v)
    return out


def _cookie(raw: bytes, name: str) -> str | None:
    for part in raw.decode("latin-1").split(";"):
        k, _, v = part.strip().partition("=")
        if k == name:
            return v
    return None


async def _plain(send: Send, status: int, text: str,
                 extra: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    body = text.encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", str(len(body)).encode()), *HEADERS, *extra]})
    await send({"type": "http.response.body", "body": body})


class Guarded:
    """ASGI middleware: refuses what the guard does not let through, adds the headers."""

    def __init__(self, app: ASGIApp, guard: Guard) -> None:
        self.app, self.guard = app, guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "websocket":  # none served: closed before accepted
                await send({"type": "websocket.close", "code": 1008})
                return
            await self.app(scope, receive, send)
            return
        g = self.guard
        headers = _headers(scope)
        hosts = [v for k, v in scope.get("headers", ()) if k.lower() == b"host"]
        if len(hosts) != 1 or hosts[0].decode("latin-1") not in g.hosts:
            await _plain(send, 403, "forbidden: unknown Host (use the URL syncd printed)\n")
            return
        method = scope["method"]
        if method not in SAFE and method != "POST":
            await _plain(send, 405, "method not allowed\n", ((b"allow", b"GET, HEAD, POST"),))
            return
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        by_cookie = g.token_ok(_cookie(headers.get(b"cookie", b""), g.cookie))
        by_query = g.token_ok(query.get("token"))
        if "token" in query and method in SAFE and (by_cookie or by_query):
            # A visit from the printed URL (the first, or again with the cookie set): the
            # token becomes a cookie, and leaves the address bar (and the history) at once.
            rest = urlencode([(k, v) for k, v in parse_qsl(
                scope.get("query_string", b"").decode("latin-1")) if k != "token"])
            # Our own path, quoted again, one leading slash: never another site's
            # address (//host) nor a header of its own.
            path = "/" + quote(scope.get("path", "/"), safe="/:@!$&'()*+,;=-._~").lstrip("/")
            where = path + (f"?{rest}" if rest else "")
            cookie = f"{g.cookie}={g.token}; HttpOnly; SameSite=Strict; Path=/"
            await _plain(send, 303, "see other\n", ((b"location", where.encode()),) + (
                ((b"set-cookie", cookie.encode()),) if by_query else ()))
            return
        if not by_cookie and not by_query:
            await _plain(send, 403, "forbidden: open the URL syncd printed (with its "
                                    "token)\n")
            return
        if method == "POST":
            origin = headers.get(b"origin")
            if origin is not None and origin.decode("latin-1") not in g.origins:
                await _plain(send, 403, "forbidden: foreign Origin\n")
                return
            receive, ok = await self._csrf(scope, receive, headers)
            if not ok:
                await _plain(send, 403, "forbidden: missing or wrong CSRF token\n")
                return

        async def secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                have = {k.lower() for k, _ in message.get("headers", ())}
                message["headers"] = [*message.get("headers", ()),
                                      *(h for h in HEADERS if h[0] not in have)]
            await send(message)

        await self.app(scope, receive, secured)

    async def _csrf(self, scope: Scope, receive: Receive, headers: dict[bytes, bytes]
                    ) -> tuple[Receive, bool]:
        """Whether the POST carries our CSRF token (a header, or the form's field), and a
        ``receive`` that hands the app the body read here."""
        given = headers.get(CSRF_HEADER)
        if given is not None:
            return receive, self.guard.csrf_ok(given.decode("latin-1"))
        kind = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        if kind != b"application/x-www-form-urlencoded":
            return receive, False
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return receive, False
            body += message.get("body", b"")
            if len(body) > FORM_MAX:
                return receive, False
            if not message.get("more_body"):
                break
        form = dict(parse_qsl(body.decode("latin-1")))
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        return replay, self.guard.csrf_ok(form.get(CSRF_FIELD))

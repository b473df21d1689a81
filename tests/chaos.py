"""A chaotic S3 proxy for soak tests: while switched on, each request may fail.

It forwards to ``upstream`` as tests/faultkit.py's ``FaultProxy`` does (the Host header
too, so SigV4 still verifies). Switched on (``on()``), each request draws one of:

- "5xx": answered 500 or 503 without being forwarded;
- "reset-before": the connection is reset (RST) before forwarding: the store never
  sees it;
- "reset-after": forwarded, then the connection is reset: the store did it, the client
  does not know;
- "slow": forwarded, the answer held back ``slow`` seconds (well within the client's
  timeout);
- or it goes through unharmed.

``storm(seconds)`` makes every request fail (5xx or reset) for that long: long enough
for a client's retries to give up.

Draws come from a seeded ``random.Random``; every request is logged as
(method, path, outcome) so a test can wait on what a client asked for ("off": it came
while the proxy was switched off).
"""

from __future__ import annotations

import random
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from typing import Any

from tests.faultkit import _error_xml, _Handler

OUTCOMES = ("5xx", "reset-before", "reset-after", "slow")


@dataclass
class ChaosProxy:
    upstream: str
    seed: int = 0
    # Chances of each outcome while switched on (the rest go through).
    rates: dict[str, float] = field(default_factory=lambda: {
        "5xx": 0.12, "reset-before": 0.05, "reset-after": 0.05, "slow": 0.12})
    slow: tuple[float, float] = (0.5, 2.5)
    log: list[tuple[str, str, str]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    _on: bool = False
    _storm_until: float = 0.0
    _rng: random.Random = field(init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def on(self) -> None:
        with self._lock:
            self._on = True

    def off(self) -> None:
        with self._lock:
            self._on = False
            self._storm_until = 0.0

    def storm(self, seconds: float) -> None:
        with self._lock:
            self._storm_until = time.monotonic() + seconds

    def draw(self) -> tuple[str, float]:
        """The outcome for the next request, and how long a slow one waits."""
        with self._lock:
            if not self._on:
                return "off", 0.0
            if time.monotonic() < self._storm_until:
                return self._rng.choice(("5xx", "reset-before")), 0.0
            r, acc = self._rng.random(), 0.0
            delay = self._rng.uniform(*self.slow)
            for outcome in OUTCOMES:
                acc += self.rates.get(outcome, 0.0)
                if r < acc:
                    return outcome, delay
            return "ok", 0.0

    def record(self, method: str, path: str, outcome: str) -> None:
        with self._lock:
            self.log.append((method, path, outcome))
            self.counts[outcome] = self.counts.get(outcome, 0) + 1

    def seen(self, match: Callable[[str, str], bool]) -> bool:
        """Whether a request (method, path) ``match`` accepts went through this proxy."""
        with self._lock:
            return any(match(m, p) for m, p, _ in self.log)

    def start(self) -> ChaosProxy:
        proxy = self

        class Handler(_ChaosHandler):
            pass

        Handler.chaos = proxy
        self._server = _Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="chaos-proxy",
                         daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


class _Server(ThreadingHTTPServer):
    """Closes a connection marked for reset without the FIN a shutdown would send first:
    with SO_LINGER 0 the close is a RST."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.resets: set[int] = set()
        self.resets_lock = threading.Lock()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client gone mid-request (a daemon killed, a reset of its own): nothing to say.
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.resets_lock:
            reset = id(request) in self.resets
            self.resets.discard(id(request))
        if reset:
            request.close()
            return
        super().shutdown_request(request)


class _ChaosHandler(_Handler):
    chaos: ChaosProxy

    def _reset(self) -> None:
        sock = self.connection
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        server = self.server
        assert isinstance(server, _Server)
        with server.resets_lock:
            server.resets.add(id(sock))
        self.close_connection = True

    def _upstream(self) -> str:
        return self.chaos.upstream

    def _handle(self) -> None:
        c = self.chaos
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        outcome, delay = c.draw()
        c.record(self.command, self.path, outcome)
        if outcome == "5xx":
            status = 503 if len(self.path) % 2 else 500
            self._reply(status, {}, _error_xml(status))
            return
        if outcome == "reset-before":
            self._reset()
            return
        try:
            status, headers, data = self._forward(body)
        except OSError:
            self._reply(502, {}, b"")
            return
        if outcome == "reset-after":
            self._reset()
            return
        if outcome == "slow":
            threading.Event().wait(delay)
        self._reply(status, headers, data)

"""Helpers for the fault tests: settings, trees, segment accounting, a fault-injecting S3 proxy."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from syncd.claude import Selection
from syncd.config import Settings, load_settings
from syncd.format.segment import SegmentIndex
from syncd.repository import Repository
from syncd.restore.restorer import RestoreReport, restore_tree
from syncd.store import Store, open_store
from tests.readers import read_index

MACHINE = "m1"


# Transcripts the fault tests write: three in one project, one in another.
A = b"projects/-home-u-app/aaaaaaaa-0000-4000-8000-00000000000a.jsonl"
B = b"projects/-home-u-app/bbbbbbbb-0000-4000-8000-00000000000b.jsonl"
C = b"projects/-home-u-app/cccccccc-0000-4000-8000-00000000000c.jsonl"
D = b"projects/-home-u-other/dddddddd-0000-4000-8000-00000000000d.jsonl"

def make_settings(tmp_path: Path, *, store: str | None = None, endpoint: str | None = None,
                  **kw: Any) -> Settings:
    (tmp_path / "src").mkdir(exist_ok=True)
    args: dict[str, Any] = {
        "source": tmp_path / "src",
        "store": store or (tmp_path / "store").as_uri(),
        "state_dir": tmp_path / "state",
        "machine_id": MACHINE,
        "s3_endpoint_url": endpoint,
        "flush_quiet": 0.2,
        "flush_max_delay": 1.0,
        "store_retry_deadline": 2.0,
        **kw,
    }
    return load_settings(config_file=tmp_path / "none.toml", **args)


def write(root: Path, rel: str | bytes, data: bytes, mode: str = "wb") -> bytes:
    path = os.path.join(os.fsencode(root), os.fsencode(rel))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, mode) as f:
        f.write(data)
    return path


def tree(root: Path, selection: Selection | None = None) -> dict[bytes, bytes]:
    """Regular files under ``root`` that syncd backs up (symlinks never followed)."""
    sel = selection or Selection()
    base = os.fsencode(root)
    out: dict[bytes, bytes] = {}
    for dirpath, _dirs, files in os.walk(base):
        for name in files:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, base)
            if os.path.islink(full) or not sel.wants(os.fsdecode(rel)):
                continue
            with open(full, "rb") as f:
                out[rel] = f.read()
    return out


def all_files(root: Path) -> dict[bytes, bytes]:
    """Every regular file under ``root`` (nothing filtered, staging dirs included)."""
    return tree(root, Selection(include=["**"]))


def store_of(settings: Settings, endpoint: str | None = None) -> Store:
    return open_store(settings.store, endpoint_url=endpoint or settings.s3_endpoint_url,
                      retry_deadline=5.0)


def restore(settings: Settings, target: Path, endpoint: str | None = None) -> RestoreReport:
    return restore_tree(Repository(store_of(settings, endpoint), settings.machine_id), target)


def indexes(store: Store, machine: str = MACHINE) -> list[tuple[str, SegmentIndex]]:
    return [(key, read_index(store, key, size))
            for key, size in Repository(store, machine).segments()]


def assert_shipped_once(store: Store, expected: dict[bytes, bytes],
                        machine: str = MACHINE) -> None:
    """Every byte of every file is in the store exactly once: per (path, generation) the
    extents tile [0, end) without overlap or gap, and the lengths over all generations of
    a path add up to its size (a second generation would be a full re-upload)."""
    ranges: dict[tuple[bytes, int], list[tuple[int, int]]] = {}
    for _key, ix in indexes(store, machine):
        for e in ix.extents:
            ranges.setdefault((e.path, e.gen), []).append((e.start, e.end))
    for (path, gen), rs in ranges.items():
        pos = 0
        for start, end in sorted(rs):
            assert start == pos, f"{path!r} gen {gen}: extent at {start}, expected {pos}"
            pos = end
    for path, data in expected.items():
        shipped = sum(end - start for (p, _g), rs in ranges.items() if p == path
                      for start, end in rs)
        assert shipped == len(data), f"{path!r}: {shipped} bytes shipped for {len(data)}"


def line(i: int, size: int = 80) -> bytes:
    body = json.dumps({"type": "user", "n": i, "text": "x" * size})
    return body.encode() + b"\n"


def cli(settings: Settings, *args: str, env: dict[str, str] | None = None,
        prefix: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    e = {**os.environ, **cli_env(settings), **(env or {})}
    return subprocess.run([*(prefix or []), sys.executable, "-m", "syncd", *args], env=e,
                          capture_output=True, text=True, timeout=60,
                          errors="surrogateescape")


def cli_env(settings: Settings) -> dict[str, str]:
    """The ``SYNCD_*`` variables that make a ``syncd`` subprocess use ``settings``."""
    env = {"SYNCD_CONFIG": os.devnull,
           "SYNCD_SOURCE": str(settings.source), "SYNCD_STORE": settings.store,
           "SYNCD_STATE_DIR": str(settings.state_dir), "SYNCD_MACHINE_ID": settings.machine_id,
           "SYNCD_FLUSH_QUIET": str(settings.flush_quiet),
           "SYNCD_FLUSH_MAX_DELAY": str(settings.flush_max_delay),
           "SYNCD_STORE_RETRY_DEADLINE": str(settings.store_retry_deadline),
           "SYNCD_SEGMENT_MAX_BYTES": str(settings.segment_max_bytes),
           "PYTHONDONTWRITEBYTECODE": "1"}
    if settings.s3_endpoint_url:
        env["SYNCD_S3_ENDPOINT_URL"] = settings.s3_endpoint_url
    return env


# -- a fault-injecting HTTP proxy in front of SeaweedFS --------------------------------

_HOP = {"connection", "keep-alive", "transfer-encoding", "expect", "proxy-connection", "te",
        "upgrade", "content-length"}


@dataclass
class FaultProxy:
    """Forwards S3 requests to ``upstream`` unchanged (the Host header too, so SigV4 still
    verifies), unless told to fail:

    mode "ok" forwards; "500"/"503" answers that status without forwarding; "hang"
    never answers (the client times out); "lost-answer" forwards, then answers 500
    (the object is stored but the client does not know).
    ``hold`` picks requests whose answer is held back after forwarding (``forward=True``)
    or before (``forward=False``, the request never reaches the store) until ``release``.
    """

    upstream: str
    mode: str = "ok"
    hold: Callable[[str, str], bool] | None = None
    hold_forwards: bool = True
    requests: int = 0
    faults: int = 0
    lost_puts: int = 0  # PUTs the store accepted while the client was told 500
    log: list[tuple[str, str, int]] = field(default_factory=list)
    held: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    healed: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def set_mode(self, mode: str) -> None:
        with self._lock:
            self.mode = mode
            if mode == "ok":
                self.healed.set()
            else:
                self.healed.clear()

    def start(self) -> FaultProxy:
        proxy = self

        class Handler(_Handler):
            pass

        Handler.proxy = proxy
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.healed.set()
        self.release.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _count(self, method: str, path: str, status: int, fault: bool) -> None:
        with self._lock:
            self.requests += 1
            self.faults += fault
            self.log.append((method, path, status))


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    proxy: FaultProxy

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._handle()

    do_PUT = do_POST = do_HEAD = do_DELETE = do_GET

    def _handle(self) -> None:
        p = self.proxy
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        mode = p.mode
        if mode in ("500", "503"):
            p._count(self.command, self.path, int(mode), True)
            self._reply(int(mode), {}, _error_xml(int(mode)))
            return
        if mode == "hang":
            p._count(self.command, self.path, 0, True)
            p.healed.wait(60)
            self.close_connection = True
            return
        held = p.hold is not None and p.hold(self.command, self.path)
        if held and not p.hold_forwards:
            p._count(self.command, self.path, 0, True)
            p.held.set()
            p.release.wait(60)
            self.close_connection = True  # dropped: it never reaches the store
            return
        try:
            status, headers, data = self._forward(body)
        except OSError:
            p._count(self.command, self.path, 502, True)
            self._reply(502, {}, b"")
            return
        if held:
            p.held.set()
            p.release.wait(60)
        if mode == "lost-answer":
            if self.command == "PUT" and status == 200:
                with p._lock:
                    p.lost_puts += 1
            p._count(self.command, self.path, 500, True)
            self._reply(500, {}, _error_xml(500))
            return
        p._count(self.command, self.path, status, False)
        self._reply(status, headers, data)

    def _upstream(self) -> str:
        return self.proxy.upstream

    def _forward(self, body: bytes) -> tuple[int, dict[str, str], bytes]:
        up = urlparse(self._upstream())
        conn = http.client.HTTPConnection(up.hostname or "127.0.0.1", up.port, timeout=30)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
            if body or self.command in ("PUT", "POST"):
                headers["Content-Length"] = str(len(body))
            conn.request(self.command, self.path, body=body or None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            out = {k: v for k, v in resp.getheaders() if k.lower() not in _HOP}
            if self.command == "HEAD":
                out["Content-Length"] = resp.getheader("Content-Length", "0")
            return resp.status, out, data
        finally:
            conn.close()

    def _reply(self, status: int, headers: dict[str, str], data: bytes) -> None:
        with contextlib.suppress(OSError):
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            if "Content-Length" not in headers:
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
            self.wfile.flush()


def _error_xml(status: int) -> bytes:
    code = {500: "InternalError", 503: "ServiceUnavailable"}.get(status, "InternalError")
    return (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
            f"<Message>injected by the test proxy</Message></Error>").encode()


def kill9_at_put(proxy: FaultProxy, settings: Settings, command: str, direct: Store,
                 key: str, stored: bool, log: Path) -> None:
    """Run ``syncd -v COMMAND`` and SIGKILL it while the proxy holds its PUT of ``key``:
    after the store took the object (``stored``: its answer is held back) or before
    (never forwarded). The held request is let go once the process is dead."""
    proxy.hold = lambda method, path: method == "PUT" and path.split("?")[0].endswith(
        "/" + key)
    proxy.hold_forwards = stored
    env = {**os.environ, **cli_env(settings)}
    with open(log, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "syncd", "-v", command], env=env,
                                stdout=f, stderr=subprocess.STDOUT)
    try:
        if not proxy.held.wait(60):
            raise AssertionError(f"{key} was never uploaded: {log.read_text()}")
        assert (direct.head(key) is not None) == stored
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proxy.release.set()  # a held request that was not forwarded never is
        proxy.hold = None

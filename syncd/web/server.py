"""The page served in-process by uvicorn: on 127.0.0.1 (a port, 0 = any free one) or a
Unix socket (mode 0600), never another address; from ``syncd web`` or the daemon."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import stat
import threading
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from syncd.config import Settings
from syncd.errors import UsageError
from syncd.web.security import new_token

if TYPE_CHECKING:
    import uvicorn

    from syncd.repository import Repository

log = logging.getLogger("syncd.web")

LOOPBACK = "127.0.0.1"
URL_FILE = "web-url"  # in the state dir: the daemon's page, for `syncd web --url`


@dataclass
class Bound:
    sock: socket.socket
    host: str  # what the Host header must say: 127.0.0.1:PORT, or localhost
    url: str  # with the token
    socket_path: Path | None = None


def bind(port: int = 0, socket_path: Path | None = None, *, address: str = LOOPBACK,
         token: str | None = None) -> Bound:
    """A listening socket on loopback (``port`` 0: any free one) or at ``socket_path``.

    Anything but loopback is refused: the page shows every session of the store.
    """
    token = token or new_token()
    if socket_path is not None:
        path = socket_path.expanduser()
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                path.unlink()  # a socket left behind by a server that died
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)  # never a moment when others could connect
        try:
            sock.bind(os.fspath(path))
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        sock.listen(64)
        return Bound(sock, "localhost", f"http://localhost/?token={token}", path)
    if address != LOOPBACK:
        raise UsageError(f"the page listens on {LOOPBACK} only, not {address} (use an SSH "
                         "tunnel to reach it from elsewhere)")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((LOOPBACK, port))
    except OSError as e:
        sock.close()
        raise UsageError(f"--port {port}: {e.strerror or e}") from None
    sock.listen(64)
    chosen = sock.getsockname()[1]
    return Bound(sock, f"{LOOPBACK}:{chosen}", f"http://{LOOPBACK}:{chosen}/?token={token}")


def token_of(bound: Bound) -> str:
    return bound.url.rpartition("token=")[2]


class WebServer:
    """uvicorn on a bound socket, in this thread (``serve``) or a thread of its own."""

    def __init__(self, settings: Settings, bound: Bound, repo: Repository | None = None
                 ) -> None:
        import uvicorn

        from syncd.web.app import make_app

        self.bound = bound
        app = make_app(settings, token=token_of(bound), host=bound.host, repo=repo)
        config = uvicorn.Config(app, lifespan="off", access_log=False, log_level="warning",
                                server_header=False, date_header=False,
                                timeout_graceful_shutdown=2)
        self.server: uvicorn.Server = _quiet_server(config)
        self._thread: threading.Thread | None = None

    def serve(self) -> None:
        """Serve until ``stop`` (or SIGINT/SIGTERM, in the main thread)."""
        try:
            asyncio.run(self.server.serve(sockets=[self.bound.sock]))
        finally:
            self.close()

    def start(self) -> None:
        self._thread = threading.Thread(target=self.serve, name="syncd-web", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self.server.handle_exit(signal.SIGTERM, None)
        if self._thread is not None:
            self._thread.join(timeout)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.bound.sock.close()
        if self.bound.socket_path is not None:
            with contextlib.suppress(OSError):
                self.bound.socket_path.unlink()


def _quiet_server(config: uvicorn.Config) -> uvicorn.Server:
    """A uvicorn server that sleeps until told to stop: uvicorn's own loop wakes ten
    times a second (for a Date header we do not send), which an idle daemon would pay."""
    import uvicorn

    class Quiet(uvicorn.Server):
        _exit: asyncio.Event | None = None
        _loop: asyncio.AbstractEventLoop | None = None

        async def main_loop(self) -> None:
            await self.on_tick(0)  # the default headers, once
            self._loop, self._exit = asyncio.get_running_loop(), asyncio.Event()
            if not self.should_exit:
                await self._exit.wait()

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            super().handle_exit(sig, frame)
            loop, done = self._loop, self._exit
            if loop is not None and done is not None:
                with contextlib.suppress(RuntimeError):  # its loop already closed
                    loop.call_soon_threadsafe(done.set)

    return Quiet(config)


def write_url(state_dir: Path, url: str) -> Path:
    """The daemon's page URL (with its token) where ``syncd web --url`` finds it, 0600."""
    from syncd.private import write_private

    path = state_dir / URL_FILE
    write_private(path, (url + "\n").encode())
    return path


def read_url(state_dir: Path) -> str | None:
    try:
        return (state_dir / URL_FILE).read_text().strip() or None
    except OSError:
        return None


def forget_url(state_dir: Path) -> None:
    with contextlib.suppress(OSError):
        (state_dir / URL_FILE).unlink()


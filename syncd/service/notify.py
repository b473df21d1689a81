"""The systemd notify protocol (``sd_notify``): READY, STATUS, WATCHDOG, RELOADING, STOPPING.

A datagram of ``KEY=value`` lines to the AF_UNIX socket named by ``$NOTIFY_SOCKET``
(a leading ``@`` names an abstract socket). Without that variable every call is a
no-op, so the daemon behaves the same outside systemd.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Mapping

log = logging.getLogger("syncd.notify")


class Notifier:
    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        addr = env.get("NOTIFY_SOCKET", "")
        self._addr: str | bytes | None = None
        if addr.startswith("@"):
            self._addr = b"\0" + addr[1:].encode()
        elif addr.startswith("/"):
            self._addr = addr
        self._sock: socket.socket | None = None
        # Reentrant: the SIGTERM handler sends STOPPING=1 on the main thread, possibly
        # while that thread is inside send() already.
        self._lock = threading.RLock()
        self._last_ping = 0.0
        self._last_status = ""
        # The watchdog is ours only when WATCHDOG_PID is unset or names this process.
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        self.watchdog_interval: float | None = None
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            self.watchdog_interval = int(usec) / 1e6

    @property
    def enabled(self) -> bool:
        return self._addr is not None

    def send(self, *fields: str) -> bool:
        """Send ``KEY=value`` fields in one datagram; False when not under systemd or it failed."""
        if self._addr is None:
            return False
        with self._lock:
            try:
                if self._sock is None:
                    self._sock = socket.socket(socket.AF_UNIX,
                                               socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.sendto("\n".join(fields).encode(), self._addr)
            except OSError as e:
                # The supervisor went away or the socket is gone: never fatal.
                log.debug("sd_notify %s failed: %s", fields, e)
                return False
        return True

    def ready(self, status: str | None = None) -> None:
        if status:
            self._last_status = status
        self.send("READY=1", *([f"STATUS={status}"] if status else []))

    def reloading(self) -> None:
        # MONOTONIC_USEC lets Type=notify-reload (systemd 253+) match the reload to the signal.
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        self.send("RELOADING=1", f"MONOTONIC_USEC={usec}")

    def stopping(self) -> None:
        self.send("STOPPING=1")

    def extend_timeout(self, seconds: float) -> None:
        """Ask for more start-up or stop time (a first seed that is still making progress)."""
        self.send(f"EXTEND_TIMEOUT_USEC={int(seconds * 1e6)}")

    def status(self, text: str) -> None:
        """Report ``STATUS=`` when it changed."""
        if text != self._last_status:
            self._last_status = text
            self.send(f"STATUS={text}")

    def watchdog(self) -> None:
        """Ping the watchdog; rate-limited to four pings per interval."""
        if self.watchdog_interval is None:
            return
        now = time.monotonic()
        if now - self._last_ping >= self.watchdog_interval / 4:
            self._last_ping = now
            self.send("WATCHDOG=1")

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None

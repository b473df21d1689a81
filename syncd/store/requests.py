"""How many requests of each kind this process made of its stores, as S3 bills them:
PUT, GET, HEAD, LIST (one per 1,000 keys listed), DELETE (one per 1,000 keys). Counted
by ``RetryStore`` per attempt (a retried request is billed again); the daemon adds them
to its state now and then (service/billing.py)."""

from __future__ import annotations

import threading

KINDS = ("PUT", "GET", "HEAD", "LIST", "DELETE")
PAGE = 1000  # keys per LIST page, and per DeleteObjects


class Requests:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(KINDS, 0)

    def add(self, kind: str, n: int = 1) -> None:
        with self._lock:
            self._counts[kind] += n

    def pages(self, kind: str, keys: int) -> None:
        """One request per ``PAGE`` keys, at least one."""
        self.add(kind, max(1, -(-keys // PAGE)))

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def take(self) -> dict[str, int]:
        """The counts since the last take (and zero them)."""
        with self._lock:
            out, self._counts = self._counts, dict.fromkeys(KINDS, 0)
        return out


# Every store this process opens counts here.
REQUESTS = Requests()

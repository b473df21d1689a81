"""Retry transient store failures with exponential backoff and full jitter."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from syncd.errors import AlreadyExists, PreconditionFailed, TransientError
from syncd.store.base import ObjectInfo, Store
from syncd.store.requests import REQUESTS

T = TypeVar("T")
log = logging.getLogger("syncd.store")


class RetryStore:
    """Wraps a store; gives up once a call has been failing for ``deadline`` seconds and
    re-raises the last error.

    ``stop`` (an Event) cuts the wait short so a shutting-down daemon does not hang.
    ``fence``, when set, is called before every attempt of a PUT or DELETE (a writer's
    lease check, ``Lease.ensure``), as part of the attempt: a refusal ends the call.
    """

    # How loud each retry is: WARNING in the daemon. A command run by hand lowers it to
    # INFO (shown with -v): its one-line failure says what outlasted the retries.
    retry_log_level = logging.WARNING

    def __init__(self, inner: Store, *, deadline: float = 60.0, base: float = 0.2,
                 cap: float = 10.0, stop: threading.Event | None = None) -> None:
        self.inner = inner
        self.url = inner.url
        self.deadline = deadline
        self.base = base
        self.cap = cap
        self.stop = stop or threading.Event()
        self.fence: Callable[[], None] | None = None

    def _fenced(self) -> None:
        if self.fence is not None:
            self.fence()

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        # The budget runs from the first failure: a long upload that then fails once is
        # retried, whatever it took.
        give_up: float | None = None
        attempt = 0
        while True:
            try:
                return fn()
            except TransientError as e:
                attempt += 1
                if give_up is None:
                    give_up = time.monotonic() + self.deadline
                delay = random.uniform(0, min(self.cap, self.base * 2**attempt))
                if time.monotonic() + delay > give_up or self.stop.is_set():
                    raise
                log.log(self.retry_log_level, "store %s failed (attempt %d), retrying in "
                        "%.1fs: %s", what, attempt, delay, e)
                if self.stop.wait(delay):
                    raise

    def put(self, key: str, data: bytes, *, if_none_match: bool = True,
            if_match: str | None = None) -> str:
        attempts = 0

        def once() -> str:
            nonlocal attempts
            attempts += 1
            self._fenced()
            REQUESTS.add("PUT")
            try:
                return self.inner.put(key, data, if_none_match=if_none_match,
                                      if_match=if_match)
            except PreconditionFailed as e:
                # A retried PUT whose first try landed but whose answer was lost:
                # the object is ours if it holds exactly these bytes.
                conditional = isinstance(e, AlreadyExists) or if_match is not None
                if conditional and attempts > 1:
                    info = self.inner.head(key)
                    if info is not None and info.size == len(data) and \
                            self.inner.get(key, 0, len(data)) == data:
                        return info.etag
                raise

        return self._call(f"put {key}", once)

    def get(self, key: str, start: int = 0, length: int | None = None) -> bytes:
        def once() -> bytes:
            REQUESTS.add("GET")
            return self.inner.get(key, start, length)

        return self._call(f"get {key}", once)

    def head(self, key: str) -> ObjectInfo | None:
        def once() -> ObjectInfo | None:
            REQUESTS.add("HEAD")
            return self.inner.head(key)

        return self._call(f"head {key}", once)

    def list(self, prefix: str, start_after: str = "") -> Iterator[ObjectInfo]:
        def once() -> list[ObjectInfo]:
            # Materialised so that a retry restarts the listing instead of a half-consumed
            # page; billed by the page (a failed attempt: one).
            found: list[ObjectInfo] = []
            try:
                found.extend(self.inner.list(prefix, start_after))
            finally:
                REQUESTS.pages("LIST", len(found))
            return found

        return iter(self._call(f"list {prefix}", once))

    def prefixes(self, prefix: str) -> Iterator[str]:
        def once() -> list[str]:
            found: list[str] = []
            try:
                found.extend(self.inner.prefixes(prefix))
            finally:
                REQUESTS.pages("LIST", len(found))
            return found

        return iter(self._call(f"list {prefix}", once))

    def delete_many(self, keys: Iterable[str]) -> None:
        batch = list(keys)

        def once() -> None:
            self._fenced()
            REQUESTS.pages("DELETE", len(batch))
            self.inner.delete_many(batch)

        self._call("delete", once)

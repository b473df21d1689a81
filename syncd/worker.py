"""Named single-thread workers, started on first use and shared by the process; and
``each``, a bounded pool for many independent store reads.

A worker runs what lets go of the GIL (zstd, sha256, socket waits) while the caller's
thread goes on with the next piece: one thread per kind of work, so a segment upload
never waits behind a compression batch or the other way round.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

_WORKERS: dict[str, ThreadPoolExecutor] = {}
_LOCK = threading.Lock()


def worker(name: str) -> ThreadPoolExecutor:
    """The worker thread called ``syncd-<name>``."""
    with _LOCK:
        if name not in _WORKERS:
            _WORKERS[name] = ThreadPoolExecutor(1, thread_name_prefix=f"syncd-{name}")
        return _WORKERS[name]


def each(items: Iterable[T], fn: Callable[[T], R], *, width: int = 32) -> Iterator[tuple[T, R]]:
    """``(item, fn(item))`` for each item, in order, with ``width`` calls in flight (a
    store's round trips overlap; results wait no further than ``2 * width`` ahead, so
    memory holds that many at most). An exception of ``fn`` is raised where its item
    comes."""
    with ThreadPoolExecutor(width, thread_name_prefix="syncd-each") as pool:
        window: deque[tuple[T, Future[R]]] = deque()
        try:
            for item in items:
                window.append((item, pool.submit(fn, item)))
                if len(window) >= 2 * width:
                    got, fut = window.popleft()
                    yield got, fut.result()
            while window:
                got, fut = window.popleft()
                yield got, fut.result()
        finally:
            for _, fut in window:
                fut.cancel()

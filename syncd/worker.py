"""Named single-thread workers, started on first use and shared by the process.

A worker runs what lets go of the GIL (zstd, sha256, socket waits) while the caller's
thread goes on with the next piece: one thread per kind of work, so a segment upload
never waits behind a compression batch or the other way round.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

_WORKERS: dict[str, ThreadPoolExecutor] = {}
_LOCK = threading.Lock()


def worker(name: str) -> ThreadPoolExecutor:
    """The worker thread called ``syncd-<name>``."""
    with _LOCK:
        if name not in _WORKERS:
            _WORKERS[name] = ThreadPoolExecutor(1, thread_name_prefix=f"syncd-{name}")
        return _WORKERS[name]

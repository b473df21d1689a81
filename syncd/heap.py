"""The C heap while a restore's bytes stream through it: ``bulk``.

A restore makes and frees buffers of megabytes thousands of times (a window of an
object, a frame decoded, a file or a chunk of lines rewritten, in every thread and every
rewriting process). glibc serves each from a fresh ``mmap`` and gives it back with
``munmap``: every page of it costs a fault and its zeroing, every ``munmap`` a TLB
shootdown on each core the process runs on. Kept in the heap instead, they are reused.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Iterator

# glibc's mallopt parameters, and their defaults.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_DEFAULT = 128 << 10
# While in bulk: buffers up to this size come from the heap (glibc's largest threshold;
# a fetch window is 16 MiB, a rewritten chunk 8 MiB and its line rest)...
BULK_MMAP = 32 << 20
# ... and this much of what was freed stays in it for the next ones.
BULK_TRIM = 256 << 20

_lock = threading.Lock()
_depth = 0


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt  # noqa: B018 (not glibc: no mallopt)
    except (OSError, AttributeError):
        return None
    return libc


@contextlib.contextmanager
def bulk(wanted: bool = True) -> Iterator[None]:
    """While it lasts (``wanted``), big buffers are kept in the heap; then glibc's default
    thresholds again (fixed: its own adjustment of them stays off) and the heap trimmed,
    so a daemon that imported much holds no more than before. Nested and concurrent uses
    (several trees' daemons) share one bulk period; a no-op where glibc is absent. What a
    store holds never decides the amount: the heap keeps at most ``BULK_TRIM`` freed."""
    global _depth
    libc = _libc() if wanted else None
    if libc is None:
        yield
        return
    with _lock:
        _depth += 1
        if _depth == 1:
            libc.mallopt(_M_MMAP_THRESHOLD, BULK_MMAP)
            libc.mallopt(_M_TRIM_THRESHOLD, BULK_TRIM)
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                libc.mallopt(_M_MMAP_THRESHOLD, _DEFAULT)
                libc.mallopt(_M_TRIM_THRESHOLD, _DEFAULT)
                libc.malloc_trim(0)

"""File marks: what tells whether a file's bytes read before are still its first ``size``
bytes, without reading them again: a hash of its head ``[0, head_len)`` and of the last
line read ``[tail_start, size)``. The search index and the secrets findings keep one per
file, and read only what was appended since, from the next pass on.
"""

from __future__ import annotations

import hashlib
import os
from typing import Protocol


class Marks(Protocol):
    @property
    def size(self) -> int: ...
    @property
    def head_len(self) -> int: ...
    @property
    def head(self) -> bytes | None: ...
    @property
    def tail_start(self) -> int: ...
    @property
    def tail(self) -> bytes | None: ...


def digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()[:16]


def still(fd: int, size: int, m: Marks) -> bool:
    """Whether the open file's first ``m.size`` bytes are those read (head and last line)."""
    if size < m.size:
        return False
    if m.head is not None and digest(os.pread(fd, m.head_len, 0)) != m.head:
        return False
    return m.tail is None or digest(os.pread(fd, m.size - m.tail_start, m.tail_start)) == m.tail


__all__ = ["Marks", "digest", "still"]

"""An in-memory store for tests of the logic above the store."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator

from ._base import AlreadyExists, NotFound, ObjectInfo, check_key, slice_range


class MemoryStore:
    def __init__(self) -> None:
        self.url = "memory://"
        self.objects: dict[str, bytes] = {}
        self.puts = 0
        self._lock = threading.Lock()

    def put(self, key: str, data: bytes, *, if_none_match: bool = True) -> None:
        check_key(key)
        with self._lock:
            if if_none_match and key in self.objects:
                raise AlreadyExists(f"{self.url}{key}: already exists")
            self.objects[key] = bytes(data)
            self.puts += 1

    def get(self, key: str, start: int = 0, length: int | None = None) -> bytes:
        check_key(key)
        try:
            data = self.objects[key]
        except KeyError:
            raise NotFound(f"{self.url}{key}: not found") from None
        return slice_range(data, start, length)

    def head(self, key: str) -> ObjectInfo | None:
        check_key(key)
        data = self.objects.get(key)
        return None if data is None else ObjectInfo(key, len(data))

    def list(self, prefix: str, start_after: str = "") -> Iterator[ObjectInfo]:
        with self._lock:
            keys = sorted(k for k in self.objects if k.startswith(prefix) and k > start_after)
        for k in keys:
            yield ObjectInfo(k, len(self.objects[k]))

    def delete_many(self, keys: Iterable[str]) -> None:
        with self._lock:
            for k in keys:
                self.objects.pop(check_key(k), None)

"""An in-memory store for tests of the logic above the store."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable, Iterator

from syncd.errors import AlreadyExists, NotFound, PreconditionFailed
from syncd.store.base import ObjectInfo, check_key, common_prefixes, slice_range


class MemoryStore:
    def __init__(self) -> None:
        self.url = "memory://"
        self.objects: dict[str, bytes] = {}
        self.etags: dict[str, str] = {}
        self.puts = 0
        self._versions = itertools.count(1)
        self._lock = threading.Lock()

    def _etag(self, key: str) -> str:
        # Objects a test placed in ``objects`` directly have version 0.
        return self.etags.get(key, "0")

    def put(self, key: str, data: bytes, *, if_none_match: bool = True,
            if_match: str | None = None) -> str:
        check_key(key)
        with self._lock:
            if if_match is not None:
                if key not in self.objects:
                    raise PreconditionFailed(f"{self.url}{key}: does not exist "
                                             "(conditional replace)")
                if self._etag(key) != if_match:
                    raise PreconditionFailed(f"{self.url}{key}: changed since it was read "
                                             "(etag mismatch)")
            elif if_none_match and key in self.objects:
                raise AlreadyExists(f"{self.url}{key}: already exists")
            self.objects[key] = bytes(data)
            etag = self.etags[key] = str(next(self._versions))
            self.puts += 1
            return etag

    def get(self, key: str, start: int = 0, length: int | None = None) -> bytes:
        check_key(key)
        try:
            data = self.objects[key]
        except KeyError:
            raise NotFound(f"{self.url}{key}: not found") from None
        return slice_range(data, start, length)

    def head(self, key: str) -> ObjectInfo | None:
        check_key(key)
        with self._lock:
            data = self.objects.get(key)
            return None if data is None else ObjectInfo(key, len(data), self._etag(key))

    def list(self, prefix: str, start_after: str = "") -> Iterator[ObjectInfo]:
        with self._lock:
            found = [ObjectInfo(k, len(v), self._etag(k)) for k, v in self.objects.items()
                     if k.startswith(prefix) and k > start_after]
        yield from sorted(found, key=lambda o: o.key.encode())

    def prefixes(self, prefix: str) -> Iterator[str]:
        with self._lock:
            keys = list(self.objects)
        yield from common_prefixes(keys, prefix)

    def delete_many(self, keys: Iterable[str]) -> None:
        with self._lock:
            for k in keys:
                self.objects.pop(check_key(k), None)
                self.etags.pop(k, None)

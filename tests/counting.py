"""A store that counts the requests made through it, as S3 would bill them.

Every method call is counted under its name, the ``Store`` protocol's and any other the
wrapped store has (a listing added to the protocol later is counted without a change
here). A listing counts one request per started page of 1000 keys, as S3 pages them;
``get`` and any other call that returns bytes adds them to ``bytes_read``. ``latency``
sleeps that long per request, outside any lock, so concurrent callers overlap as they
would against a remote store.

``patch_open_store`` makes every ``open_store`` of syncd (the package's and each module's
own imported name) return its store with the backend wrapped.
"""

from __future__ import annotations

import functools
import importlib
import math
import pkgutil
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import syncd
from syncd.store import ObjectInfo, RetryStore, Store

PAGE = 1000  # keys per LIST response (S3's ListObjectsV2 maximum)


def kind_of(method: str) -> str:
    """The request kind a method name stands for: LIST, GET, HEAD, PUT, DELETE, or the
    name itself for a method none of those begin."""
    for prefix in ("list", "get", "head", "put", "delete"):
        if method.startswith(prefix):
            return prefix.upper()
    return method


class Counts:
    """Requests by method name and bytes read; shared by every store it wraps."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.bytes_read = 0
        self._lock = threading.Lock()

    def add(self, method: str, n: int = 1, data: int = 0) -> None:
        with self._lock:
            self.calls[method] += n
            self.bytes_read += data

    def by_kind(self) -> Counter[str]:
        out: Counter[str] = Counter()
        for method, n in self.calls.items():
            out[kind_of(method)] += n
        return out

    def total(self) -> int:
        return sum(self.calls.values())


class CountingStore:
    """``inner`` with every request counted into ``counts`` (and delayed by ``latency``)."""

    def __init__(self, inner: Store, counts: Counts | None = None,
                 latency: float = 0.0) -> None:
        self.inner = inner
        self.url = inner.url
        self.counts = counts if counts is not None else Counts()
        self.latency = latency

    def _request(self, method: str, data: int = 0) -> None:
        self.counts.add(method, 1, data)
        if self.latency:
            time.sleep(self.latency)

    def _pages(self, method: str, items: Iterable[Any]) -> Iterator[Any]:
        """``items`` with one request counted per page, when the caller reaches it."""
        self._request(method)
        for n, item in enumerate(items):
            if n and n % PAGE == 0:
                self._request(method)
            yield item

    def put(self, key: str, data: bytes, *, if_none_match: bool = True,
            if_match: str | None = None) -> str:
        self._request("put")
        return self.inner.put(key, data, if_none_match=if_none_match, if_match=if_match)

    def get(self, key: str, start: int = 0, length: int | None = None) -> bytes:
        self._request("get")  # a GET that fails (NotFound) is a request too
        data = self.inner.get(key, start, length)
        self.counts.add("get", 0, len(data))
        return data

    def head(self, key: str) -> ObjectInfo | None:
        self._request("head")
        return self.inner.head(key)

    def list(self, prefix: str, start_after: str = "") -> Iterator[ObjectInfo]:
        return self._pages("list", self.inner.list(prefix, start_after))

    def delete_many(self, keys: Iterable[str]) -> None:
        batch = list(keys)
        # S3's DeleteObjects takes up to 1000 keys per request.
        n = max(1, math.ceil(len(batch) / PAGE))
        for _ in range(n):
            self._request("delete_many")
        self.inner.delete_many(batch)

    def __getattr__(self, name: str) -> Any:
        # Methods the protocol may grow: counted by name, an iterator by its pages, a
        # list or tuple of results as the pages it would take, bytes as bytes read.
        attr = getattr(self.inner, name)
        if not callable(attr) or name.startswith("_"):
            return attr

        @functools.wraps(attr)
        def counted(*args: Any, **kwargs: Any) -> Any:
            try:
                result = attr(*args, **kwargs)
            except Exception:
                self._request(name)
                raise
            if isinstance(result, Iterator):
                return self._pages(name, result)
            pages = max(1, math.ceil(len(result) / PAGE)) \
                if isinstance(result, list | tuple) else 1
            self.counts.add(name, pages - 1)
            data = len(result) if isinstance(result, bytes | bytearray | memoryview) else 0
            self._request(name, data)
            if self.latency and pages > 1:
                time.sleep(self.latency * (pages - 1))
            return result
        return counted


def _wrap(store: Any, counts: Counts, latency: float) -> Any:
    # Below the retry layer when there is one: what reaches the backend is counted, retries
    # and pages the retry layer reads ahead included.
    if isinstance(store, RetryStore):
        store.inner = CountingStore(store.inner, counts, latency)
        return store
    return CountingStore(store, counts, latency)


def patch_open_store(counts: Counts, latency: float = 0.0,
                     setattr_: Callable[[object, str, Any], None] = setattr) -> None:
    """Every store syncd opens from now on counts into ``counts``.

    Imports every syncd module first, so that a module imported later by a command
    cannot bring back the unwrapped function under its own name. ``setattr_`` lets a
    test pass ``monkeypatch.setattr`` so the patch is undone after it.
    """
    import syncd.store as store_pkg

    original = store_pkg.open_store
    if hasattr(original, "__wrapped__"):
        raise RuntimeError("open_store is already patched")

    @functools.wraps(original)
    def counting_open_store(*args: Any, **kwargs: Any) -> Any:
        return _wrap(original(*args, **kwargs), counts, latency)

    for info in pkgutil.walk_packages(syncd.__path__, "syncd."):
        if info.name != "syncd.__main__":  # running it would start the command line
            importlib.import_module(info.name)
    for name, module in list(sys.modules.items()):
        if (name == "syncd" or name.startswith("syncd.")) and \
                module.__dict__.get("open_store") is original:
            setattr_(module, "open_store", counting_open_store)

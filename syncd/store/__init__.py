"""Stores: where objects live. ``open_store`` turns a URL into one."""

from __future__ import annotations

import threading
from pathlib import Path
from urllib.parse import unquote, urlparse

from syncd.errors import (
    AlreadyExists,
    InvalidKey,
    NoSuchStore,
    NotFound,
    PreconditionFailed,
    StoreError,
    TransientError,
)
from syncd.store.base import ObjectInfo, Store, check_key, get_small
from syncd.store.local import LocalStore
from syncd.store.memory import MemoryStore
from syncd.store.retry import RetryStore
from syncd.store.s3 import S3Store

__all__ = [
    "AlreadyExists",
    "InvalidKey",
    "LocalStore",
    "MemoryStore",
    "NoSuchStore",
    "NotFound",
    "ObjectInfo",
    "PreconditionFailed",
    "RetryStore",
    "S3Store",
    "Store",
    "StoreError",
    "TransientError",
    "check_key",
    "get_small",
    "open_store",
]


def open_store(url: str, *, endpoint_url: str | None = None, region: str | None = None,
               retry_deadline: float = 60.0, stop: threading.Event | None = None,
               timeout: float | None = None, connect_timeout: float | None = None,
               create: bool = True) -> RetryStore:
    """``file:///path`` or ``s3://bucket/prefix``, wrapped in retries.

    ``timeout`` bounds one S3 request (connect and read; default S3Store's 30 s);
    ``syncd status`` uses a short one. ``connect_timeout`` bounds only the connection
    (default the smaller of ``timeout`` and 10 s). ``create=False``: a missing local
    store is ``NoSuchStore`` instead of a new empty directory.
    """
    parsed = urlparse(url)
    inner: Store
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise StoreError(f"{url}: file URLs take an absolute path (file:///path)")
        inner = LocalStore(Path(unquote(parsed.path)), create=create)
    elif parsed.scheme == "s3":
        if not parsed.netloc:
            raise StoreError(f"{url}: missing bucket (s3://bucket/prefix)")
        extra: dict[str, float] = {}
        if timeout is not None:
            extra["timeout"] = timeout
        if connect_timeout is not None:
            extra["connect_timeout"] = connect_timeout
        inner = S3Store(parsed.netloc, unquote(parsed.path), endpoint_url=endpoint_url,
                        region=region, **extra)
    elif parsed.scheme == "memory":
        inner = MemoryStore()
    else:
        raise StoreError(f"{url}: unsupported store URL (use file:///path or s3://bucket/prefix)")
    return RetryStore(inner, deadline=retry_deadline, stop=stop)

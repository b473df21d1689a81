"""The narrow interface every store implements, and the errors it raises."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from syncd.errors import InvalidKey, StoreError


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size: int
    # Opaque token that changes whenever the object is written ("" when unknown).
    etag: str = ""


class Store(Protocol):
    """Objects under sortable keys.

    ``put`` with ``if_none_match`` never overwrites; with ``if_match`` (an etag from
    ``head`` or an earlier ``put``) it replaces only that version of the object and
    raises ``PreconditionFailed`` otherwise, a missing object included. ``put`` returns
    the etag of what it wrote. ``get`` reads ``length`` bytes from ``start`` (a negative
    ``start`` reads that many bytes from the end); ``list`` yields keys under ``prefix``
    in byte order, after ``start_after``; ``prefixes`` yields, in byte order, the
    distinct ``prefix + name + "/"`` under which keys lie one level down (a delimited
    LIST: one request per 1,000 names, whatever the keys below them).
    """

    url: str

    def put(self, key: str, data: bytes, *, if_none_match: bool = True,
            if_match: str | None = None) -> str: ...

    def get(self, key: str, start: int = 0, length: int | None = None) -> bytes: ...

    def head(self, key: str) -> ObjectInfo | None: ...

    def list(self, prefix: str, start_after: str = "") -> Iterator[ObjectInfo]: ...

    def prefixes(self, prefix: str) -> Iterator[str]: ...

    def delete_many(self, keys: Iterable[str]) -> None: ...


def check_key(key: str) -> str:
    """Reject keys that could name something outside the store's root."""
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\\" in key:
        raise InvalidKey(f"invalid object key {key!r}")
    return key


def get_small(store: Store, key: str, limit: int) -> bytes:
    """A whole small object (machine.json, a dictionary), refused without being read
    whole when it holds more than ``limit`` bytes: its size is the store's to claim."""
    data = store.get(key, 0, limit + 1)
    if len(data) > limit:
        raise StoreError(f"{store.url}{key}: larger than the {limit} bytes such an object "
                         "holds (refusing to read it)")
    return data


def slice_range(data: bytes, start: int, length: int | None) -> bytes:
    """The bytes a ranged GET returns, for stores that hold whole objects."""
    if start < 0:
        return data[start:] if length is None else data[start:][:length]
    return data[start:] if length is None else data[start : start + length]


def common_prefixes(keys: Iterable[str], prefix: str) -> list[str]:
    """``Store.prefixes`` for stores that hold their keys in a list."""
    return sorted({prefix + rest.partition("/")[0] + "/" for k in keys
                   if k.startswith(prefix) and "/" in (rest := k[len(prefix):])},
                  key=str.encode)

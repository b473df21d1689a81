"""Reads of one object at a time, for tests that look inside a store: each names the
store and the object, as tests do, and goes through a ``Repository`` as syncd does."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from syncd.errors import FormatError
from syncd.format.segment import Extent, SegmentIndex
from syncd.format.segment import parse_segment as _parse_segment
from syncd.format.snapshot import Group, Manifest
from syncd.repository import Repository
from syncd.security.crypto import Crypto
from syncd.store import Store, layout


def repo_of(store: Store, key: str, crypto: Crypto | None = None) -> Repository:
    """The repository of the machine whose object ``key`` is."""
    return Repository(store, layout.machine_of(key) or "", crypto)


def read_index(store: Store, key: str, size: int | None = None,
               crypto: Crypto | None = None) -> SegmentIndex:
    return repo_of(store, key, crypto).read_index(key, size)


def read_extents(store: Store, key: str, exts: list[Extent], crypto: Crypto | None = None,
                 on_error: Callable[[Extent, FormatError], None] | None = None,
                 ) -> Iterator[tuple[Extent, bytes]]:
    return repo_of(store, key, crypto).read_extents(key, exts, on_error)


def read_manifest(store: Store, key: str, crypto: Crypto | None = None) -> Manifest:
    return repo_of(store, key, crypto).read_manifest(key)


def read_groups(store: Store, m: Manifest, names: Iterable[str] | None = None,
                crypto: Crypto | None = None) -> dict[str, Group]:
    return repo_of(store, m.key, crypto).read_groups(m, names)


def list_snapshots(store: Store, machine: str) -> list[tuple[int, int, str]]:
    return Repository(store, machine).snapshots()


def parse_segment(blob: bytes, where: str, crypto: Crypto | None = None,
                  key: str = "") -> SegmentIndex:
    return _parse_segment(blob, where, None if crypto is None else crypto.cipher(key))

"""One conformance suite that every store runs: memory, local directory, real S3."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from syncd.store import (
    AlreadyExists,
    InvalidKey,
    LocalStore,
    MemoryStore,
    NotFound,
    S3Store,
    Store,
    open_store,
)
from tests.seaweed import Seaweed


@pytest.fixture(params=["memory", "local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "memory":
        yield MemoryStore()
    elif request.param == "local":
        yield LocalStore(tmp_path / "store")
    else:
        seaweed: Seaweed = request.getfixturevalue("seaweed")
        bucket: str = request.getfixturevalue("bucket")
        yield S3Store(bucket, "some/prefix", endpoint_url=seaweed.endpoint)


def test_put_get_roundtrip(store: Store) -> None:
    store.put("a/b/c", b"hello world")
    assert store.get("a/b/c") == b"hello world"


def test_if_none_match_never_overwrites(store: Store) -> None:
    store.put("k", b"first")
    with pytest.raises(AlreadyExists):
        store.put("k", b"second")
    assert store.get("k") == b"first"


def test_put_without_condition_replaces(store: Store) -> None:
    store.put("k", b"first")
    store.put("k", b"second", if_none_match=False)
    assert store.get("k") == b"second"


def test_ranged_get(store: Store) -> None:
    store.put("r", b"0123456789")
    assert store.get("r", 2, 3) == b"234"
    assert store.get("r", 7) == b"789"
    assert store.get("r", -4) == b"6789"
    assert store.get("r", 0, 0) == b""


def test_suffix_longer_than_object(store: Store) -> None:
    store.put("s", b"abc")
    assert store.get("s", -100) == b"abc"


def test_missing_key(store: Store) -> None:
    with pytest.raises(NotFound):
        store.get("nope")
    assert store.head("nope") is None


def test_head_reports_size(store: Store) -> None:
    store.put("h", b"x" * 1234)
    info = store.head("h")
    assert info is not None and info.size == 1234


def test_list_order_prefix_and_start_after(store: Store) -> None:
    for k in ["m/seg/0002", "m/seg/0000", "m/seg/0001", "m/other", "n/seg/0000"]:
        store.put(k, k.encode())
    assert [o.key for o in store.list("m/seg/")] == ["m/seg/0000", "m/seg/0001", "m/seg/0002"]
    assert [o.key for o in store.list("m/seg/", start_after="m/seg/0000")] == [
        "m/seg/0001", "m/seg/0002"]
    assert [o.size for o in store.list("m/o")] == [len(b"m/other")]


def test_delete_many_ignores_missing(store: Store) -> None:
    for k in ["d/1", "d/2", "d/3"]:
        store.put(k, b"x")
    store.delete_many(["d/1", "d/3", "d/never"])
    assert [o.key for o in store.list("d/")] == ["d/2"]


def test_binary_data_survives(store: Store) -> None:
    data = bytes(range(256)) * 1000
    store.put("bin", data)
    assert store.get("bin") == data
    assert store.get("bin", 1000, 256) == data[1000:1256]


@pytest.mark.parametrize("key", ["", "/abs", "a/../b", "../x", "a//b", "a/./b", "a\\b"])
def test_unsafe_keys_rejected(store: Store, key: str) -> None:
    with pytest.raises(InvalidKey):
        store.put(key, b"x")


def test_local_store_keeps_no_temp_files(tmp_path: Path) -> None:
    s = LocalStore(tmp_path / "st")
    s.put("a/b", b"1")
    with pytest.raises(AlreadyExists):
        s.put("a/b", b"2")
    assert sorted(p.name for p in (tmp_path / "st" / "a").iterdir()) == ["b"]


def test_open_store_urls(tmp_path: Path) -> None:
    assert open_store((tmp_path / "x").as_uri()).url.startswith("file://")
    with pytest.raises(Exception, match="unsupported store URL"):
        open_store("ftp://host/x")
    with pytest.raises(Exception, match="missing bucket"):
        open_store("s3:///prefix")

"""One conformance suite that every store runs: memory, local directory, real S3."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from syncd.errors import (
    AlreadyExists,
    InvalidKey,
    NotFound,
    PreconditionFailed,
    StoreError,
    TransientError,
)
from syncd.store import LocalStore, MemoryStore, RetryStore, S3Store, Store, open_store
from tests.helpers import LosesAnswers
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


def test_put_returns_the_etag_head_reports(store: Store) -> None:
    etag = store.put("e", b"one")
    info = store.head("e")
    assert etag and info is not None and info.etag == etag
    assert [o.etag for o in store.list("e")] == [etag]


def test_if_match_replaces_the_version_read(store: Store) -> None:
    first = store.put("lease", b"v1")
    second = store.put("lease", b"v2", if_match=first)
    assert second != first and store.get("lease") == b"v2"
    third = store.put("lease", b"v3", if_match=second)
    assert store.get("lease") == b"v3"
    head = store.head("lease")
    assert head is not None and head.etag == third


def test_if_match_refuses_a_stale_etag(store: Store) -> None:
    first = store.put("lease", b"v1")
    store.put("lease", b"v2", if_match=first)
    with pytest.raises(PreconditionFailed):
        store.put("lease", b"stale writer", if_match=first)
    assert store.get("lease") == b"v2"


def test_if_match_refuses_a_missing_key(store: Store) -> None:
    etag = store.put("gone", b"v1")
    store.delete_many(["gone"])
    with pytest.raises(PreconditionFailed):
        store.put("gone", b"v2", if_match=etag)
    with pytest.raises(PreconditionFailed):
        store.put("never", b"v2", if_match=etag)
    assert store.head("gone") is None and store.head("never") is None


def test_conditional_create_failure_is_a_precondition_failure(store: Store) -> None:
    store.put("c", b"1")
    with pytest.raises(PreconditionFailed) as info:
        store.put("c", b"2")
    assert isinstance(info.value, AlreadyExists)


def test_ranged_get(store: Store) -> None:
    store.put("r", b"0123456789")
    assert store.get("r", 2, 3) == b"234"
    assert store.get("r", 7) == b"789"
    assert store.get("r", -4) == b"6789"
    assert store.get("r", 0, 0) == b""


def test_range_past_the_end_is_no_bytes(store: Store) -> None:
    """A hostile extent pointing past its object reads as a short read (the caller's
    problem with that one object), on every backend alike."""
    store.put("p", b"0123456789")
    assert store.get("p", 10, 5) == b""
    assert store.get("p", 50, 5) == b""
    assert store.get("p", 8, 5) == b"89"


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


def test_prefixes_are_the_names_one_level_down_that_hold_a_key(store: Store) -> None:
    for k in ["machines/b/seg/0001", "machines/a/machine.json", "machines/a/seg/0000",
              "machines/loose", "machines/ab/x", "other/c/d", "machinesx/e/f"]:
        store.put(k, b"x")
    assert list(store.prefixes("machines/")) == ["machines/a/", "machines/ab/", "machines/b/"]
    assert list(store.prefixes("machines/a")) == ["machines/a/", "machines/ab/"]
    assert list(store.prefixes("")) == ["machines/", "machinesx/", "other/"]
    assert list(store.prefixes("nothing/")) == []
    store.delete_many(["machines/b/seg/0001"])
    # A name with nothing left below it is gone (SeaweedFS keeps the emptied folder as a
    # prefix: readers pass over a machine without objects).
    left = list(store.prefixes("machines/"))
    assert left == ["machines/a/", "machines/ab/"] or \
        (isinstance(store, S3Store) and left == ["machines/a/", "machines/ab/", "machines/b/"])


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


def test_local_store_prefixes_see_only_what_list_sees(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    store.put("machines/a/x", b"x")
    (tmp_path / "store" / "machines" / "b").mkdir()
    (tmp_path / "store" / "machines" / "b" / "link").symlink_to(tmp_path / "store" / "machines"
                                                                / "a" / "x")
    (tmp_path / "store" / "machines" / "c").mkdir()  # empty
    assert list(store.list("machines/b/")) == []
    assert list(store.prefixes("machines/")) == ["machines/a/"]


def test_local_store_keeps_no_temp_files(tmp_path: Path) -> None:
    s = LocalStore(tmp_path / "st")
    s.put("a/b", b"1")
    with pytest.raises(AlreadyExists):
        s.put("a/b", b"2")
    assert sorted(p.name for p in (tmp_path / "st" / "a").iterdir()) == ["b"]


def test_local_store_hides_its_lock_files(tmp_path: Path) -> None:
    s = LocalStore(tmp_path / "st")
    etag = s.put("m/lease.json", b"1")
    s.put("m/lease.json", b"2", if_match=etag)
    assert [o.key for o in s.list("")] == ["m/lease.json"]
    assert (tmp_path / "st" / "m" / ".lock-lease.json").exists()
    s.delete_many(["m/lease.json"])
    assert list(s.list("")) == []


def test_retry_store_recognises_its_own_landed_conditional_replace() -> None:
    """A replace whose first try landed but whose answer was lost is not a lost race."""

    inner = LosesAnswers()
    first = inner.put("l", b"v1")
    inner.lose = 1
    store = RetryStore(inner, base=0.001)
    etag = store.put("l", b"v2", if_match=first)
    head = inner.head("l")
    assert head is not None and etag == head.etag and inner.get("l") == b"v2"
    with pytest.raises(PreconditionFailed):
        store.put("l", b"v3", if_match=first)  # a stale etag on the first try stays an error


def test_open_store_urls(tmp_path: Path) -> None:
    assert open_store((tmp_path / "x").as_uri()).url.startswith("file://")
    with pytest.raises(Exception, match="unsupported store URL"):
        open_store("ftp://host/x")
    with pytest.raises(Exception, match="missing bucket"):
        open_store("s3:///prefix")


def test_s3_client_that_cannot_be_built_fails_each_request_once() -> None:
    """The client is built in the background; a bad endpoint surfaces at the first
    request as a one-line StoreError, not a transient one that retries would repeat."""
    s = open_store("s3://bucket/p", endpoint_url="not a url", retry_deadline=600)
    with pytest.raises(StoreError, match=r"cannot set up the S3 client: .*not a url") as e:
        s.head("machines/m1/machine.json")
    assert not isinstance(e.value, TransientError) and "\n" not in str(e.value)
    with pytest.raises(StoreError, match="cannot set up the S3 client"):
        s.put("x", b"y")


class _RangeIgnoringClient:
    """An endpoint that answers every GET with the whole object (HTTP 200)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.read: list[int | None] = []

    def get_object(self, **kw: Any) -> dict[str, Any]:
        client = self

        class Body:
            def read(self, amt: int | None = None) -> bytes:
                client.read.append(amt)
                return client.data if amt is None else client.data[:amt]

            def close(self) -> None:
                pass

        return {"Body": Body(), "ResponseMetadata": {"HTTPStatusCode": 200}}


def test_s3_reads_no_more_than_the_range_asks_whatever_the_endpoint_sends() -> None:
    s = S3Store("bucket")
    s._client.result()  # let the background build finish, then swap in the fake
    fake = _RangeIgnoringClient(b"x" * (1 << 20))
    s._client = Future()
    s._client.set_result(fake)  # type: ignore[arg-type]
    assert s.get("k", 0, 10) == b"x" * 10 and fake.read == [10]
    with pytest.raises(StoreError, match="answered a ranged GET with HTTP 200"):
        s.get("k", 100, 10)
    with pytest.raises(StoreError, match="answered a ranged GET with HTTP 200"):
        s.get("k", -10)
    assert fake.read == [10]


def test_s3_stores_of_one_configuration_share_one_client() -> None:
    """Building a client costs ~0.3 s of CPU: a process builds one per configuration,
    however many stores it opens (the daemon's engine, follower and metrics)."""
    a, b = S3Store("bucket"), S3Store("other", "some/prefix")
    assert a._s3 is b._s3
    shorter = S3Store("bucket", timeout=3.0)  # status's probe: a client of its own
    assert shorter._s3 is not a._s3
    assert S3Store("bucket", timeout=3.0)._s3 is shorter._s3
    assert S3Store("bucket", endpoint_url="http://127.0.0.1:9")._s3 is not a._s3

"""``syncd check-store``: verdicts per feature, on every store and on a real SeaweedFS."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from syncd._checkstore import check_store
from syncd.store import AlreadyExists, LocalStore, MemoryStore, Store
from tests.seaweed import Seaweed

FEATURES = ["PUT, GET and HEAD", "conditional create", "conditional replace (If-Match, current",
            "conditional replace refused", "ranged GET", "LIST order", "DELETE"]


@pytest.mark.parametrize("kind", ["memory", "local"])
def test_good_stores_pass_everything(tmp_path: Path, kind: str) -> None:
    store: Store = MemoryStore() if kind == "memory" else LocalStore(tmp_path / "st")
    verdicts = check_store(store)
    assert [v.ok for v in verdicts] == [True] * len(FEATURES), [v.line() for v in verdicts]
    for feature, v in zip(FEATURES, verdicts, strict=True):
        assert v.feature.startswith(feature)
    assert list(store.list("")) == []  # the scratch prefix is gone


class IgnoresConditions(MemoryStore):
    """A provider that accepts If-None-Match and If-Match but enforces neither."""

    def put(self, key: str, data: bytes, *, if_none_match: bool = True,
            if_match: str | None = None) -> str:
        return super().put(key, data, if_none_match=False)


class BadSuffix(MemoryStore):
    def get(self, key: str, start: int = 0, length: int | None = None) -> bytes:
        data = super().get(key, 0, None)
        return data if start < 0 else super().get(key, start, length)


def test_a_provider_that_ignores_conditions_fails() -> None:
    verdicts = {v.feature: v for v in check_store(IgnoresConditions())}
    create = verdicts["conditional create (If-None-Match: *)"]
    assert not create.ok and "412 expected" in create.detail
    stale = verdicts["conditional replace refused (If-Match, stale etag or missing key)"]
    assert not stale.ok and create.line().startswith("FAIL")
    assert verdicts["ranged GET (range, open-ended, suffix)"].ok


def test_a_provider_with_broken_suffix_ranges_fails() -> None:
    verdicts = {v.feature: v for v in check_store(BadSuffix())}
    assert not verdicts["ranged GET (range, open-ended, suffix)"].ok
    assert verdicts["conditional create (If-None-Match: *)"].ok


def test_a_provider_that_drops_conditional_replace_fails() -> None:
    class NoIfMatch(MemoryStore):
        def put(self, key: str, data: bytes, *, if_none_match: bool = True,
                if_match: str | None = None) -> str:
            if if_match is not None:
                raise AlreadyExists("412")
            return super().put(key, data, if_none_match=if_none_match)

    verdicts = {v.feature: v for v in check_store(NoIfMatch())}
    assert not verdicts["conditional replace (If-Match, current etag)"].ok


def test_cli_on_seaweedfs(tmp_path: Path, seaweed: Seaweed, bucket: str) -> None:
    env = {**os.environ, "SYNCD_STORE": f"s3://{bucket}/some/prefix",
           "SYNCD_S3_ENDPOINT_URL": seaweed.endpoint, "SYNCD_CONFIG": str(tmp_path / "none"),
           "SYNCD_STATE_DIR": str(tmp_path / "state")}
    r = subprocess.run([sys.executable, "-m", "syncd", "check-store"], env=env,
                       capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == len(FEATURES) + 1
    assert all(ln.startswith("ok  ") for ln in lines[:-1]), r.stdout
    assert lines[-1] == f"s3://{bucket}/some/prefix/: usable by syncd"
    assert "Contents" not in seaweed.client().list_objects_v2(Bucket=bucket)


def test_cli_exits_1_when_a_required_feature_fails(tmp_path: Path) -> None:
    env = {**os.environ, "SYNCD_STORE": "s3://bucket/x", "SYNCD_S3_ENDPOINT_URL":
           "http://127.0.0.1:9", "SYNCD_CONFIG": str(tmp_path / "none"),
           "SYNCD_STORE_RETRY_DEADLINE": "0.5", "AWS_ACCESS_KEY_ID": "x",
           "AWS_SECRET_ACCESS_KEY": "y"}
    r = subprocess.run([sys.executable, "-m", "syncd", "check-store"], env=env,
                       capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 1
    assert r.stdout.splitlines()[0].startswith("FAIL  PUT, GET and HEAD")
    assert "NOT usable by syncd" in r.stdout

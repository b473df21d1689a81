"""``syncd check-store``: verdicts per feature, on every store and on a real SeaweedFS."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from syncd.errors import AlreadyExists, TransientError
from syncd.store import LocalStore, MemoryStore, Store
from syncd.store.check import check_store
from tests.seaweed import Seaweed

FEATURES = ["PUT, GET and HEAD", "conditional create", "conditional replace (If-Match, current",
            "conditional replace refused", "ranged GET", "LIST order", "delimited LIST",
            "DELETE"]


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


def test_a_provider_that_ignores_the_delimiter_fails() -> None:
    class NoDelimiter(MemoryStore):
        def prefixes(self, prefix: str) -> Iterator[str]:
            return iter([])  # what a provider that drops CommonPrefixes answers

    verdicts = {v.feature: v for v in check_store(NoDelimiter())}
    assert not verdicts["delimited LIST (common prefixes)"].ok
    assert verdicts["LIST order and start-after"].ok


def test_cli_on_seaweedfs(tmp_path: Path, seaweed: Seaweed, bucket: str) -> None:
    env = {**os.environ, "SYNCD_STORE": f"s3://{bucket}/some/prefix",
           "SYNCD_S3_ENDPOINT_URL": seaweed.endpoint, "SYNCD_CONFIG": os.devnull,
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


class Unreachable(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def head(self, key: str) -> None:
        self.calls += 1
        raise TransientError(f"{key}: ConnectionRefused")


def test_an_unreachable_store_stops_before_any_check() -> None:
    store = Unreachable()
    with pytest.raises(TransientError, match="ConnectionRefused"):
        check_store(store)
    assert store.calls == 1


def _check_store_cli(tmp_path: Path, *pre: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**{k: v for k, v in os.environ.items() if not k.startswith("SYNCD_")},
            "SYNCD_CONFIG": os.devnull, "SYNCD_STATE_DIR": str(tmp_path / "state"), **env}
    return subprocess.run([sys.executable, *pre, "check-store"], env=full,
                          capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def test_cli_exits_1_with_one_line_when_the_store_cannot_be_reached(tmp_path: Path) -> None:
    r = _check_store_cli(tmp_path, "-m", "syncd", SYNCD_STORE="s3://bucket/x",
                         SYNCD_S3_ENDPOINT_URL="http://127.0.0.1:9", AWS_ACCESS_KEY_ID="x",
                         AWS_SECRET_ACCESS_KEY="y")
    assert r.returncode == 1 and r.stdout == ""
    [line] = r.stderr.splitlines()
    assert line.startswith("syncd: s3://bucket/x/check-store/") and "127.0.0.1:9" in line


def test_cli_exits_1_when_a_required_feature_fails(tmp_path: Path) -> None:
    (tmp_path / "st").mkdir()
    # The command as installed, with a provider that ignores If-None-Match and If-Match.
    run = ("import sys, syncd.cli.keys as k, syncd.store.check as c\n"
           "from tests.test_checkstore import IgnoresConditions\n"
           "k.check_store = lambda store: c.check_store(IgnoresConditions())\n"
           "from syncd.cli.main import main\n"
           "sys.argv[0] = 'syncd'\n"
           "main()\n")
    r = _check_store_cli(tmp_path, "-c", run, SYNCD_STORE=(tmp_path / "st").as_uri(),
                         PYTHONPATH=str(Path(__file__).parent.parent))
    assert r.returncode == 1, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("ok  ") and lines[1].startswith("FAIL  conditional create")
    assert lines[-1] == f"{(tmp_path / 'st').as_uri()}/: NOT usable by syncd (2 required " \
                        "feature(s) failed)"

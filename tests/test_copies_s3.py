"""A cut, a patch and a move against a real SeaweedFS, killed (kill -9) at the store write
that ships them: before the segment is stored, and after it is stored but before its
answer came back. The next run adopts or ships again; the tree restores exactly, every
earlier flush is still a point in time, and the change is never shipped whole."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from syncd.repository import Repository
from syncd.restore.restorer import RestoreOptions
from syncd.restore.restorer import restore as restore_backup
from syncd.store.layout import segment_key
from tests.faultkit import MACHINE, FaultProxy, cli, kill9_at_put, make_settings, store_of, tree
from tests.faultkit import restore as restore_now
from tests.helpers import tree_bytes, write
from tests.readers import read_index
from tests.seaweed import Seaweed
from tests.test_copies import SID, rows

APP = f"projects/-home-u-app/{SID}.jsonl"
LIB = f"projects/-home-u-lib/{SID}.jsonl"


def change(src: Path, case: str) -> None:
    f = src / APP
    data = f.read_bytes()
    if case == "cut":  # the last rows withdrawn, others written in their place
        at = len(rows(0, 195))
        with open(f, "r+b") as fh:
            fh.seek(at)
            fh.write(rows(900, 903))
            fh.truncate(at + len(rows(900, 903)))
    elif case == "patch":  # a row removed in the middle, the file rewritten
        f.write_bytes(data.replace(rows(100, 101), b""))
    else:  # /cd: the session to another project folder, a relocated line appended
        os.makedirs(src / "projects/-home-u-lib")
        os.rename(f, src / LIB)
        line = {"type": "relocated", "sessionId": SID, "relocatedCwd": "/home/u/lib"}
        write(src, LIB, json.dumps(line, separators=(",", ":")).encode() + b"\n", "ab")


@pytest.mark.parametrize("stored", [True, False], ids=["after-put", "before-put"])
@pytest.mark.parametrize("case", ["cut", "patch", "move"])
def test_kill9_at_the_write_of_a_copy(tmp_path: Path, seaweed: Seaweed, bucket: str,
                                      proxy: FaultProxy, case: str, stored: bool) -> None:
    s = make_settings(tmp_path, store=f"s3://{bucket}", endpoint=proxy.url)
    write(s.source, APP, rows(0, 200))
    r = cli(s, "sync")
    assert r.returncode == 0, r.stderr
    before = tree_bytes(s.source)
    direct = store_of(s, seaweed.endpoint)
    first = read_index(direct, segment_key(MACHINE, 0)).time

    change(s.source, case)
    kill9_at_put(proxy, s, "sync", direct, segment_key(MACHINE, 1), stored,
                 tmp_path / "sync.log")

    again = s.model_copy(update={"s3_endpoint_url": seaweed.endpoint})
    r = cli(again, "sync")
    assert r.returncode == 0, r.stderr
    assert ("adopted segment" in r.stderr) == stored, r.stderr
    want = tree(s.source)
    report = restore_now(again, tmp_path / "now")
    assert not report.errors, report.errors
    assert tree(tmp_path / "now") == want
    # The flush before the change is still a point in time.
    old = restore_backup(Repository(direct, MACHINE), RestoreOptions(
        target=tmp_path / "then", at=first + 0.001, local_machine=MACHINE))
    assert not old.errors, old.errors
    assert tree_bytes(tmp_path / "then") == before
    # Shipped as copies: no segment after the first holds the old bytes again.
    later = [read_index(direct, k, n) for k, n in Repository(direct, MACHINE).segments()][1:]
    assert later and any(ix.copies for ix in later)
    assert sum(x.end - x.start for ix in later for x in ix.extents) < 8192

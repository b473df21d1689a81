"""Rewrites of every golden store (stores an earlier version wrote): forget a session, and
every point restores as the fixtures say, but for that session, which no object holds
any more; verify still finds nothing wrong. A newer writer rewrites every older store."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from syncd.archive.compact import CompactOptions
from syncd.archive.rewrite import Rewrite, rewrite
from syncd.archive.verify import verify
from syncd.repository import Repository
from syncd.restore.restorer import RestoreOptions, restore
from syncd.security.crypto import Crypto
from syncd.sessionfiles import session_owning
from syncd.store import Store
from tests.readers import read_extents, read_index
from tests.test_golden import (
    GOLDEN,
    HOME,
    MACHINE,
    POINTS,
    STEP,
    STORES,
    T0,
    expected,
    expected_files,
    open_golden,
    restored_files,
)


def _sessions(store: str) -> list[str]:
    newest = expected(store, POINTS[store][0])
    return sorted({s["session_id"] for s in newest["sessions"]})


def _all_bytes(s: Store, crypto: Crypto | None) -> bytes:
    """Every frame of every object, opened and decompressed, and every index."""
    out = bytearray()
    for info in s.list(f"machines/{MACHINE}/"):
        kind = info.key.split("/")[2]
        if kind not in ("seg", "pack", "delta", "snap"):
            continue
        ix = read_index(s, info.key, None, crypto)
        out += repr(ix).encode()
        out += b"".join(data for _, data in read_extents(s, info.key, ix.extents, crypto))
    return bytes(out)


CASES = [pytest.param(store, sid, id=f"{store}-{sid[:8]}") for store in sorted(STORES)
         for sid in _sessions(store)]


@pytest.mark.parametrize(("store", "sid"), CASES)
def test_forget_a_session_of_a_golden_store(store: str, sid: str, tmp_path: Path) -> None:
    copy = tmp_path / "store"
    shutil.copytree(GOLDEN / store, copy)
    s, crypto = open_golden(copy, STORES[store])

    rep = rewrite(Repository(s, MACHINE, crypto), Rewrite(forget=frozenset({sid})),
                  # (the story's clock: no tombstone of it has expired)
                  CompactOptions(spool_dir=tmp_path, now=T0 + 20 * STEP))

    assert rep.errors == [], rep.errors
    assert rep.files_dropped
    for point in POINTS[store]:
        want = {p: v for p, v in expected_files(expected(store, point)).items()
                if session_owning(p) != sid}
        out = tmp_path / f"out-{point.name}"
        r = restore(Repository(s, MACHINE, crypto),
                    RestoreOptions(target=out, at=point.at, local_home=HOME))
        assert r.errors == [], (point.name, r.errors)
        got = restored_files(out)
        assert sorted(set(got) ^ set(want)) == [], point.name
        hist = b"history.jsonl"
        changed = [p for p in want if got[p] != want[p] and p != hist]
        assert changed == [], (point.name, changed)
        if hist in want:
            data = (out / "history.jsonl").read_bytes()
            assert len(data) == want[hist][1] and sid.encode() not in data
            if hashlib.sha256(data).hexdigest() != want[hist][0]:
                assert b" " * 20 in data  # its lines became spaces
    v = verify(Repository(s, MACHINE, crypto), read_data=100.0)
    assert v.problems == []
    assert sid.encode() not in _all_bytes(s, crypto)

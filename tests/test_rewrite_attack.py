"""Rewrite under attack: kill -9 before every store write, encrypted stores, SeaweedFS,
pruned stores with long chains, copies and patches, hostile objects, and what later
compactions, prunes and verify make of a rewritten store."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from syncd.archive.compact import CompactOptions
from syncd.archive.rewrite import Rewrite, rewrite
from syncd.repository import Repository
from syncd.store import LocalStore, Store
from tests.test_compact import SA
from tests.test_rewrite import M, all_raw, build, forgotten, points

ROOT = Path(__file__).resolve().parent.parent
FORGET_SA = Rewrite(forget=frozenset({SA}))


def assert_gone(store: Store) -> None:
    raw = all_raw(store)
    assert SA.encode() not in raw and SA[:8].encode() not in raw


def assert_between(before: dict[int, dict[bytes, bytes]],
                   after: dict[int, dict[bytes, bytes]]) -> None:
    """Every point holds, file by file, what it held or its forgotten version: no file of
    another session is missing or changed otherwise."""
    assert sorted(after) == sorted(before)
    for seq, tree in before.items():
        want = forgotten(tree)
        got = after[seq]
        for p, data in got.items():
            assert data in (tree.get(p), want.get(p)), f"point {seq}: {p!r}"
        assert set(want) <= set(got) <= set(tree), f"point {seq}"


# -- kill -9 -----------------------------------------------------------------------

def kill_rewrite(base: Path, work: Path, kill_at: int, mode: str) -> tuple[
        subprocess.CompletedProcess[str], list[str]]:
    """A rewrite of a copy of ``base`` in a process SIGKILLed before write ``kill_at``."""
    shutil.copytree(base, work / "store")
    log = work / "writes.log"
    r = subprocess.run([sys.executable, "-m", "tests.compactkill", str(work / "store"), M,
                        str(kill_at), str(log), str(8 << 10), str(4 << 10), mode],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    return r, log.read_text().splitlines() if log.exists() else []


def test_kill_9_before_every_store_write_of_a_forget(tmp_path: Path) -> None:
    base = tmp_path / "base"
    build(tmp_path, LocalStore(base))
    before = points(LocalStore(base))
    want = {seq: forgotten(t) for seq, t in before.items()}
    clean, writes = kill_rewrite(base, tmp_path / "clean", 0, f"forget={SA}")
    assert clean.returncode == 0, clean.stderr
    assert json.loads(clean.stdout)["errors"] == []
    kinds = [w.split("/")[2] if w.startswith("put ") else "delete" for w in writes]
    # The fold first, then new packs and manifests, then deletions.
    assert "pack" in kinds and "snap" in kinds and kinds[-1] == "delete", kinds
    assert points(LocalStore(tmp_path / "clean" / "store")) == want

    for k in range(1, len(writes) + 1):
        work = tmp_path / f"kill-{k}"
        r, done = kill_rewrite(base, work, k, f"forget={SA}")
        assert r.returncode == -signal.SIGKILL, (k, r.stdout, r.stderr)
        assert done == writes[:k] or len(done) == k
        store = LocalStore(work / "store")
        assert_between(before, points(store))

        again = rewrite(Repository(store, M), FORGET_SA, CompactOptions())

        assert again.errors == [], (k, again.errors)
        assert points(store) == want, k
        assert_gone(store)
        shutil.rmtree(work)

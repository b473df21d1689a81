"""Prune: forgetting snapshots by policy, reclaiming what only they held, the share cap,
dry runs, refusals, and kill -9 at every store write."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from syncd.archive.compact import CompactOptions, compact
from syncd.archive.prune import prune
from syncd.archive.retention import Policy
from syncd.archive.verify import verify
from syncd.errors import CompactError
from syncd.repository import Repository
from syncd.security.lock import ProcessLock
from syncd.store import LocalStore, MemoryStore, Store
from tests.helpers import tree_bytes, write
from tests.test_compact import (
    SA,
    T0,
    TA,
    TODO,
    Clock,
    M,
    assert_restores,
    entries,
    keys,
    kill_run,
    line,
    make_shipper,
    newest,
    ship_all,
    todo,
    write_kind,
)

HOUR = 3600.0


def day_of_snapshots(tmp_path: Path, store: Store, hours: int = 6) -> tuple[Path, Clock,
                                                                          list[dict[bytes,
                                                                                    bytes]]]:
    """A manifest an hour (never a delta): a transcript that grows, a todo list rewritten
    each time (so older snapshots hold generations the newest does not). Returns each
    hour's tree."""
    src, clock = tmp_path / "src", Clock()
    sh = make_shipper(src, store, tmp_path / "st.db", clock)
    trees = []
    for h in range(hours):
        clock.t = T0 + h * HOUR
        write(src, TA, line(SA, h, 2000), "ab")
        write(src, TODO, todo(h, 2000))
        ship_all(sh, src)
        compact(Repository(store, M), opts=CompactOptions(now=clock.t, max_chain=0))
        trees.append(tree_bytes(src))
    return src, clock, trees


def test_prune_forgets_what_the_policy_does_not_keep_and_reclaims_its_data(
        tmp_path: Path) -> None:
    store = MemoryStore()
    _src, clock, trees = day_of_snapshots(tmp_path, store)
    assert len(keys(store, "snap")) == 6
    retained = [e for e in entries(store, newest(store)) if e.retained]
    assert {e.path.decode() for e in retained} == {TODO}  # five older todo generations
    before = sum(len(v) for v in store.objects.values())

    r = prune(Repository(store, M), Policy(keep_last=2), opts=CompactOptions(now=clock.t))

    assert [v.keep for v in r.verdicts] == [True, True, False, False, False, False]
    assert r.verdicts[0].reasons[0] == "newest" and len(r.forgotten) == 4
    assert len(keys(store, "snap")) == 2
    # Only the todo generation the second-newest snapshot holds is still retained.
    assert [e.gen for e in entries(store, newest(store)) if e.retained] == [5]
    assert sum(len(v) for v in store.objects.values()) < before
    assert_restores(store, trees[-1], tmp_path / "now")
    assert_restores(store, trees[-2], tmp_path / "hour-4", at=T0 + 4 * HOUR + 1)
    assert verify(Repository(store, M), read_data=100).ok


def test_dry_run_changes_nothing_and_says_why(tmp_path: Path) -> None:
    store = MemoryStore()
    _src, clock, _ = day_of_snapshots(tmp_path, store, hours=3)
    before = dict(store.objects)

    r = prune(Repository(store, M), Policy(keep_last=1),
              opts=CompactOptions(now=clock.t, dry_run=True))

    assert store.objects == before
    assert [v.reasons for v in r.verdicts] == [
        ("newest", "last 1/1"), ("not matched by the policy",), ("not matched by the policy",)]
    assert len(r.forgotten) == 2 and r.compaction is not None


def test_empty_policy_keeps_everything(tmp_path: Path) -> None:
    store = MemoryStore()
    _src, clock, _ = day_of_snapshots(tmp_path, store, hours=3)
    before = sorted(store.objects)

    r = prune(Repository(store, M), Policy(), opts=CompactOptions(now=clock.t))

    assert r.forgotten == [] and all(v.keep for v in r.verdicts)
    assert sorted(store.objects) == before


def test_a_policy_that_keeps_nothing_is_refused(tmp_path: Path) -> None:
    store = MemoryStore()
    _src, clock, _ = day_of_snapshots(tmp_path, store, hours=3)
    before = dict(store.objects)

    with pytest.raises(CompactError, match="refusing"):
        prune(Repository(store, M), Policy(keep_within=1e-9), opts=CompactOptions(now=clock.t))

    assert store.objects == before


def test_at_most_a_share_of_the_objects_goes_per_run(tmp_path: Path) -> None:
    store = MemoryStore()
    _src, clock, trees = day_of_snapshots(tmp_path, store, hours=6)
    objects = len(store.objects)  # 6 manifests, packs, machine.json

    r = prune(Repository(store, M), Policy(keep_last=1), max_share=2 / objects,
              opts=CompactOptions(now=clock.t))

    assert len(r.forgotten) == 2 and len(r.deferred) == 3
    assert len(keys(store, "snap")) == 4
    # The oldest go first; the next run takes the rest.
    r2 = prune(Repository(store, M), Policy(keep_last=1), max_share=1.0,
               opts=CompactOptions(now=clock.t))
    assert len(r2.forgotten) == 3 and keys(store, "snap") == [newest(store).key]
    assert_restores(store, trees[-1], tmp_path / "out")


def test_prune_is_refused_while_a_compaction_runs(tmp_path: Path) -> None:
    store = MemoryStore()
    _src, clock, _ = day_of_snapshots(tmp_path, store, hours=2)
    holder = ProcessLock(tmp_path / "compact.lock")
    holder.acquire()
    try:
        with pytest.raises(CompactError, match="another compaction or prune"):
            prune(Repository(store, M), Policy(keep_last=1),
                  opts=CompactOptions(now=clock.t, lock=tmp_path / "compact.lock"))
    finally:
        holder.release()
    assert len(keys(store, "snap")) == 2


def test_kill_9_before_every_store_write_of_a_prune(tmp_path: Path) -> None:
    base = tmp_path / "base"
    store = LocalStore(base)
    src, _clock, trees = day_of_snapshots(tmp_path, store, hours=4)
    clean, writes = kill_run(base, tmp_path / "clean", 0, "prune")
    assert clean.returncode == 0, clean.stderr
    assert len(json.loads(clean.stdout)["forgotten"]) == 3
    kinds = [write_kind(w) for w in writes]
    # Forget (delete manifests), then the reclaiming compaction: packs, manifest, clean-up.
    assert kinds[0] == "delete" and kinds[-2:] == ["put snap", "delete"], kinds

    for k in range(1, len(writes) + 1):
        work = tmp_path / f"kill-{k}"
        r, done = kill_run(base, work, k, "prune")
        assert r.returncode == -signal.SIGKILL, (k, r.stdout, r.stderr)
        assert [write_kind(w) for w in done] == kinds[:k]
        killed = LocalStore(work / "store")
        assert_restores(killed, trees[-1], work / "after-kill")
        assert verify(Repository(killed, M), read_data=100).ok

        again = prune(Repository(killed, M), Policy(keep_last=1))

        assert again.errors == [], (k, again)
        assert keys(killed, "snap") == [newest(killed).key]
        assert [e for e in entries(killed, newest(killed)) if e.retained] == []
        assert_restores(killed, trees[-1], work / "after-rerun")
        assert verify(Repository(killed, M), read_data=100).ok
    assert src.exists()


def test_a_dry_run_ends_saying_what_the_prune_would_do(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not its compaction's "nothing to compact": the prune's own steps, or nothing."""
    from click.testing import CliRunner

    from syncd.cli.main import cli

    store = LocalStore(tmp_path / "store")
    day_of_snapshots(tmp_path, store, hours=3)
    for k, v in {"SYNCD_CONFIG": os.devnull, "SYNCD_STORE": store.url,
                 "SYNCD_STATE_DIR": str(tmp_path / "state"), "SYNCD_MACHINE_ID": M,
                 "SYNCD_SOURCE": str(tmp_path / "src"), "SYNCD_KEEP_HOURLY": "0",
                 "SYNCD_KEEP_DAILY": "0", "SYNCD_KEEP_WEEKLY": "0",
                 "SYNCD_KEEP_MONTHLY": "0"}.items():
        monkeypatch.setenv(k, v)
    before = sorted(p for p in (tmp_path / "store").rglob("*"))
    runs = {}
    for last in ("1", "3"):
        monkeypatch.setenv("SYNCD_KEEP_LAST", last)
        r = CliRunner().invoke(cli, ["prune", "--dry-run"], catch_exceptions=False)
        assert r.exit_code == 0, r.output
        runs[last] = r.output.splitlines()[-1]
    assert runs["1"] == f"{M}: would forget 2 snapshots, rewrite 1 pack (0.0 MB of data)", runs
    assert runs["3"] == f"{M}: would delete nothing (the policy keeps every snapshot)", runs
    assert sorted(p for p in (tmp_path / "store").rglob("*")) == before

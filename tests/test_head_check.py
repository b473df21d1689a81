"""Heads are checked: a reader of a head folds on the segments written after it (a HEAD
of the next segment's key tells), so an older head put back over a machine's, or one
that lags while its machine is busy, lists what the backup holds; ``verify`` holds the
head to the backup (decodes, not ahead of it, not behind beyond head_interval)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from syncd.archive.compact import compact
from syncd.archive.verify import verify
from syncd.backup.engine import sync_once
from syncd.backup.headwriter import HeadWriter
from syncd.backup.ship import Shipper
from syncd.backup.state import State
from syncd.claude import Selection
from syncd.repository import Repository
from syncd.restore import listing
from syncd.restore.listing import (
    find_session,
    load_all,
    machines_table,
    session_rows,
    sessions_table,
)
from syncd.security.crypto import Crypto, new_master
from syncd.security.keys import init_encryption, open_crypto
from syncd.store import LocalStore, MemoryStore, Store, layout
from tests.counting import CountingStore, Counts
from tests.helpers import write
from tests.hostile import line
from tests.test_cli import env_of
from tests.test_head import PA, PB, PC, A, B, C, settings, tmp_store

PASSPHRASE = "pass phrase for heads 42"
T0 = 1_800_000_000.0
HEAD = layout.head_key("m1")


@pytest.fixture(params=["plain", "encrypted"])
def kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "encrypted":
        monkeypatch.setenv("SYNCD_PASSPHRASE", PASSPHRASE)
    return str(request.param)


def store_for(tmp_path: Path, kind: str) -> LocalStore:
    store = LocalStore(tmp_path / "store")
    if kind == "encrypted":
        init_encryption(store, PASSPHRASE, n=1 << 12)
    return store


def reader(store: Store) -> Repository:
    return Repository(store, "reader", open_crypto(store, None, prompt=False))


def rows_by_id(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    return sorted(rows, key=lambda r: str(r["session_id"]))


def backup_rows(repo: Repository, tmp_path: Path) -> list[dict[str, object]]:
    backups, problems = load_all(repo)
    assert problems == []
    return rows_by_id(sessions_table(backups, tmp_path / "none"))


def test_an_older_head_put_back_is_read_past_by_sessions_machines_and_resume(
        tmp_path: Path, kind: str) -> None:
    store = store_for(tmp_path, kind)
    s = settings(tmp_path)
    write(s.source, PA, line(A, "/home/u/app", 0, "hello"))
    sync_once(s)
    older = store.get(HEAD)  # validly sealed in an encrypted store
    write(s.source, PA, line(A, "/home/u/app", 1, "more"), "ab")
    write(s.source, PB, line(B, "/home/u/lib", 0, "newer session"))
    sync_once(s)
    store.put(HEAD, older, if_none_match=False)  # replayed
    repo = reader(store)

    said: list[str] = []
    got = rows_by_id(list(session_rows(repo, tmp_path / "none", problems=said)))
    assert said == [] and [r["session_id"] for r in got] == [A, B]
    assert got == backup_rows(repo, tmp_path)
    rows, said = machines_table(repo)
    assert said == [] and rows[0]["sessions"] == 2 and rows[0]["segments"] == 2
    assert find_session(repo, B) == ("m1", B)
    assert find_session(repo, B[:8]) == ("m1", B)


def test_resume_of_a_session_only_the_segments_after_a_replayed_head_hold(
        tmp_path: Path) -> None:
    s = settings(tmp_path)
    write(s.source, PA, line(A, "/home/u/app", 0))
    sync_once(s)
    store = LocalStore(tmp_store(s))
    older = store.get(HEAD)
    write(s.source, PB, line(B, "/home/u/lib", 0))
    sync_once(s)
    store.put(HEAD, older, if_none_match=False)
    env = env_of(tmp_path, SYNCD_MACHINE_ID="laptop", SYNCD_SOURCE=str(tmp_path / "here"))
    r = subprocess.run([sys.executable, "-m", "syncd", "sessions", "--json"], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert sorted(row["session_id"] for row in json.loads(r.stdout)) == [A, B]
    r = subprocess.run([sys.executable, "-m", "syncd", "resume", B[:8]], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr  # was "is in no backup"
    assert f"claude --resume {B}" in r.stdout


def test_a_lagging_head_with_the_segments_after_it_lists_what_the_backup_lists(
        tmp_path: Path) -> None:
    s = settings(tmp_path, head_interval=3600)  # written only for a new or gone session
    repo = Repository(LocalStore(tmp_store(s)), "m1")

    def same() -> None:
        got = rows_by_id(list(session_rows(repo, tmp_path / "none")))
        assert got == backup_rows(repo, tmp_path)

    write(s.source, PA, line(A, "/home/u/app", 0, "hello"))
    write(s.source, PB, line(B, "/home/u/lib", 0, "b"))
    sync_once(s)
    same()
    write(s.source, PA, line(A, "/home/u/app", 1, "more"), "ab")  # the head lags
    sync_once(s)
    same()
    # A new generation that names no field yet, and a new session: the head is written
    # (PA's fields still those of its first generation), then PA's new lines name some.
    write(s.source, PA, b'{"partial')
    write(s.source, PC, line(C, "/home/u/app", 0, "c"))
    sync_once(s)
    same()
    head = repo.head()
    assert head is not None and [x.fields_gen for x in head.sessions
                                 if x.path == PA.encode()] == [1]
    write(s.source, PA, b'":1}\n' + line(A, "/home/u/other", 5, "anew"), "ab")
    sync_once(s)
    same()
    assert (head := repo.head()) is not None and head.seq == 2  # the last flush is after it
    compact(repo)
    write(s.source, PB, line(B, "/home/u/lib", 1, "b2"), "ab")
    sync_once(s)
    same()
    (s.source / PB).unlink()  # gone: the head is written at once
    sync_once(s)
    same()
    write(s.source, PC, line(C, "/home/u/app", 1, "c2"), "ab")
    write(s.source, PB, line(B, "/home/u/lib", 2, "back"))
    sync_once(s)
    same()
    write(s.source, PC, line(C, "/home/u/app", 2, "c3"), "ab")
    sync_once(s)
    same()


def test_a_busy_machines_head_costs_a_head_and_a_get_per_segment_after_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = settings(tmp_path, head_interval=3600)
    write(s.source, PA, line(A, "/home/u/app", 0))
    sync_once(s)
    for i in range(1, 6):  # five flushes the head does not cover
        write(s.source, PA, line(A, "/home/u/app", i), "ab")
        sync_once(s)
    counts = Counts()
    repo = Repository(CountingStore(LocalStore(tmp_store(s)), counts), "m1")  # type: ignore[arg-type]
    rows = list(session_rows(repo, tmp_path / "none", "m1"))
    assert [r["size"] for r in rows] == [(s.source / PA).stat().st_size]
    assert dict(counts.by_kind()) == {"GET": 1 + 5, "HEAD": 1 + 5}
    # Further behind than a reader folds on (planted objects count): its backup is read.
    monkeypatch.setattr(listing, "AFTER_HEAD_MAX", 4)
    counts.calls.clear()
    assert list(session_rows(repo, tmp_path / "none", "m1")) == rows
    assert counts.by_kind()["LIST"] >= 2  # its listings: snap/, delta/, seg/


# -- verify ----------------------------------------------------------------------------------
class Machine:
    """A machine's writer on a clock of its own: shipper and head writer."""

    def __init__(self, tmp_path: Path, crypto: Crypto | None) -> None:
        self.t = T0
        self.store = MemoryStore()
        self.repo = Repository(self.store, "m1", crypto)
        self.src = tmp_path / "src"
        self.sh = Shipper(root=self.src, repo=self.repo, state=State(tmp_path / "st.db"),
                          selection=Selection(), clock=lambda: self.t)
        self.head = HeadWriter(self.repo, self.sh.state, bytes(self.src), interval=300,
                               tombstone_keep=0, clock=lambda: self.t)

    def flush(self, rel: str, data: bytes, at: float, head: bool = True) -> None:
        self.t = at
        write(self.src, rel, data, "ab")
        self.sh.ship([rel.encode()])
        if head:
            self.head.write()

    def problems(self, now: float) -> list[str]:
        return verify(self.repo, head_interval=300, now=now).problems


@pytest.fixture(params=["plain", "encrypted"])
def machine(request: pytest.FixtureRequest, tmp_path: Path) -> Machine:
    return Machine(tmp_path, None if request.param == "plain" else Crypto(new_master()))


def test_verify_reports_a_replayed_head(machine: Machine) -> None:
    machine.flush(PA, line(A, "/home/u/app", 0), T0)
    older = machine.store.get(HEAD)
    machine.flush(PB, line(B, "/home/u/lib", 0), T0 + 1000)
    assert machine.problems(T0 + 5000) == []
    machine.store.put(HEAD, older, if_none_match=False)
    [problem] = machine.problems(T0 + 5000)
    assert HEAD in problem and "covers flush 0" in problem and "flush 1" in problem
    # Still after the segments are compacted away (a reader's HEAD no longer sees them).
    compact(machine.repo)
    [problem] = machine.problems(T0 + 5000)
    assert HEAD in problem and "covers flush 0" in problem


def test_verify_lets_a_head_lag_by_what_head_interval_allows(machine: Machine) -> None:
    machine.flush(PA, line(A, "/home/u/app", 0), T0)
    machine.flush(PA, line(A, "/home/u/app", 1), T0 + 200, head=False)  # within the interval
    assert machine.problems(T0 + 5000) == []
    machine.flush(PA, line(A, "/home/u/app", 2), T0 + 900, head=False)  # its write failed
    [problem] = machine.problems(T0 + 5000)
    assert HEAD in problem and "flush 2" in problem
    # Not while that flush may still be finishing (its head comes right after).
    assert machine.problems(T0 + 1000) == []


def test_verify_reports_a_head_ahead_of_the_backup_and_a_flipped_byte(
        machine: Machine) -> None:
    machine.flush(PA, line(A, "/home/u/app", 0), T0)
    machine.sh.state.set_meta(last_flush_seq="7")
    machine.head.write()
    [problem] = machine.problems(T0 + 10)
    assert HEAD in problem and "covers flush 7" in problem and "ahead" in problem
    machine.sh.state.set_meta(last_flush_seq="0")
    machine.head.write()
    assert machine.problems(T0 + 10) == []
    blob = bytearray(machine.store.get(HEAD))
    for at in (len(blob) // 2, len(blob) - 1):
        flipped = bytearray(blob)
        flipped[at] ^= 0x04
        machine.store.put(HEAD, bytes(flipped), if_none_match=False)
        [problem] = machine.problems(T0 + 10)
        assert HEAD in problem, problem

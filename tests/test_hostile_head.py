"""The machine's head under attack and against the backup it summarizes: what a reader of
heads lists is what a reader of the backups lists, whatever the history; a bucket's heads
never take more of a reader than one head's worth; a head rolled back is reported."""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import zstandard

from syncd import repository
from syncd.archive.compact import compact
from syncd.archive.options import compact_options
from syncd.backup.engine import sync_once
from syncd.backup.headwriter import HeadWriter
from syncd.backup.state import State
from syncd.errors import LookupFailed, StoreError
from syncd.format.head import HEAD_RAW_MAX, Head
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
from syncd.seen import Seen
from syncd.store import LocalStore, MemoryStore, S3Store, layout
from syncd.view import Backup
from tests.helpers import running, shipper, wait_for, write
from tests.hostile import line
from tests.seaweed import Seaweed
from tests.test_cli import env_of, syncd
from tests.test_head import PA, PB, A, B, head_of, settings


def same_listing(tmp_path: Path) -> None:
    repo = Repository(LocalStore(tmp_path / "store"), "m1")
    backups, problems = load_all(repo)
    assert problems == []
    expect = sorted(sessions_table(backups, tmp_path / "none"), key=lambda r: r["session_id"])
    got = sorted(session_rows(repo, tmp_path / "none"), key=lambda r: r["session_id"])
    assert got == expect


def test_a_generation_that_names_no_field_keeps_the_last_ones_as_the_backup_does(
        tmp_path: Path) -> None:
    s = settings(tmp_path, head_interval=0)  # each sync writes the head
    write(s.source, PA, line(A, "/home/u/app", 0, "hello") + line(A, "/home/u/app", 1))
    sync_once(s)
    same_listing(tmp_path)
    write(s.source, PA, b"")  # truncated: a new generation, no line yet
    sync_once(s)
    same_listing(tmp_path)
    write(s.source, PA, b"not json\n", "ab")
    sync_once(s)
    same_listing(tmp_path)
    write(s.source, PA, line(A, "/home/u/other", 5, "bye"), "ab")
    sync_once(s)
    same_listing(tmp_path)


def test_heads_list_what_the_backup_lists_through_deletion_recreation_and_compaction(
        tmp_path: Path) -> None:
    s = settings(tmp_path, head_interval=0)  # each sync writes the head
    repo = Repository(LocalStore(tmp_path / "store"), "m1")
    write(s.source, PA, b"")
    write(s.source, PB, line(B, "/home/u/lib", 0, "b"))
    sync_once(s)
    same_listing(tmp_path)
    write(s.source, PA, line(A, "/home/u/app", 0, "hello") + line(A, "/home/u/app", 1))
    (s.source / PB).unlink()
    sync_once(s)
    same_listing(tmp_path)
    compact(repo, compact_options(s))
    same_listing(tmp_path)
    write(s.source, PB, line(B, "/home/u/other", 3, "again"))
    write(s.source, PA, b"")
    sync_once(s)
    same_listing(tmp_path)
    compact(repo, compact_options(s))
    same_listing(tmp_path)


def big_head(machine: str, n: int) -> bytes:
    sessions = [{"path": f"projects/-x/{uuid.UUID(int=i)}.jsonl", "gen": 1, "size": i,
                 "fields": {"ai_title": f"title {i}"}} for i in range(n)]
    doc = {"format": 1, "machine": machine, "written": 1.0, "seq": 0, "time": 1.0,
           "sessions": sessions}
    return zstandard.ZstdCompressor().compress(json.dumps(doc).encode())


def test_large_heads_are_decoded_one_at_a_time_never_by_the_reading_threads(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    store = MemoryStore()
    names = [f"m{i:02d}" for i in range(12)]
    for name in names:  # each a catalog of 12,000 sessions (1.4 MiB of JSON)
        store.put(layout.head_key(name), big_head(name, 12_000))
    live, most, threads = [0], [0], set()
    lock = threading.Lock()
    real = repository.head_decode

    def counted(blob: bytes, machine: str, where: str, raw_max: int = HEAD_RAW_MAX) -> Head:
        h = real(blob, machine, where, raw_max)
        with lock:
            threads.add(threading.current_thread().name)
            live[0] += 1
            most[0] = max(most[0], live[0])
        time.sleep(0.01)
        with lock:
            live[0] -= 1
        return h

    monkeypatch.setattr(repository, "head_decode", counted)
    repo = Repository(store, "m00")
    said: list[str] = []
    rows = list(session_rows(repo, tmp_path / "none", problems=said))
    assert said == [] and len(rows) == 12 * 12_000
    assert most[0] == 1 and threads == {threading.current_thread().name}
    rows2, said = machines_table(repo)
    assert said == [] and [r["sessions"] for r in rows2] == [12_000] * 12
    assert find_session(repo, str(uuid.UUID(int=7)), "m03") == ("m03", str(uuid.UUID(int=7)))


def test_an_s3_store_reads_heads_over_kept_connections_and_skips_planted_prefixes(
        seaweed: Seaweed, bucket: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = S3Store(bucket, "team", endpoint_url=seaweed.endpoint)
    names = [f"m{i:02d}" for i in range(40)]
    for name in names:
        store.put(layout.head_key(name), big_head(name, 3))
    for planted in ("machines/-x/head", "machines/a b/head", "machines/x%2f/head",
                    "machines/" + "y" * 70 + "/head"):
        store.put(planted, b"planted")
    repo = Repository(store, "m00")
    assert repo.machines() == names
    caplog.set_level(logging.WARNING)
    for _ in range(2):
        rows, said = machines_table(repo)
        assert said == [] and [r["sessions"] for r in rows] == [3] * 40
    # Each of the 32 reading threads keeps its connection: none is opened and dropped.
    assert not [r for r in caplog.records if "pool is full" in r.getMessage()]


def test_a_head_rolled_back_is_reported_by_every_reader_of_heads(tmp_path: Path) -> None:
    store = MemoryStore()
    repo = Repository(store, "m1")
    seen = Seen(tmp_path / "state", store.url)
    newer, older = big_head("m1", 2), big_head("m1", 2)
    doc = json.loads(zstandard.ZstdDecompressor().decompress(newer))
    doc["seq"] = 9
    newer = zstandard.ZstdCompressor().compress(json.dumps(doc).encode())
    store.put(layout.head_key("m1"), newer)
    said: list[str] = []
    assert len(list(session_rows(repo, tmp_path / "none", problems=said, seen=seen))) == 2
    assert said == []
    seen.save()
    seen = Seen(tmp_path / "state", store.url)  # and from what the last run kept
    store.put(layout.head_key("m1"), older, if_none_match=False)  # seq 0: rolled back
    list(session_rows(repo, tmp_path / "none", problems=said, seen=seen))
    assert len(said) == 1 and "machines/m1/head" in said[0] and "rolled back" in said[0]
    assert any("rolled back" in p for p in machines_table(repo, seen)[1])
    said = []
    assert find_session(repo, str(uuid.UUID(int=1)), problems=said, seen=seen)[0] == "m1"
    assert len(said) == 1 and "rolled back" in said[0]


def test_an_encrypted_stores_ciphers_are_shared_safely_by_the_reading_threads() -> None:
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch as often as they can
    crypto = Crypto(new_master())
    errors: list[BaseException] = []

    def read(i: int) -> None:  # more objects than the ciphers kept, as for many machines
        try:
            for n in range(1500):
                crypto.cipher(f"machines/m{(n * 7 + i) % 300}/head")
        except BaseException as e:
            errors.append(e)

    try:
        threads = [threading.Thread(target=read, args=(i,)) for i in range(32)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert errors == []


def test_a_head_that_failed_to_write_after_an_archive_job_is_written_at_the_interval(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    now = [1_800_000_000.0]
    store = MemoryStore()
    repo = Repository(store, "m1")
    state = State(tmp_path / "state.db")
    head = HeadWriter(repo, state, b"/c", interval=300, tombstone_keep=0, clock=lambda: now[0])
    head.stored_changed()  # a compaction ran; no flush is behind
    real = repo.write_head

    def refused(h: Head) -> None:
        raise StoreError("memory://: 503 slow down")

    monkeypatch.setattr(repo, "write_head", refused)
    assert not head.write_if_due()
    assert head.due() == now[0] + 300  # not forgotten while the daemon idles
    monkeypatch.setattr(repo, "write_head", real)
    now[0] += 301
    assert head.write_if_due() and head.due() is None
    assert repo.head() is not None
    state.close()


def test_a_local_store_with_a_name_that_is_not_utf8_lists_its_machines(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    store.put(layout.head_key("m1"), big_head("m1", 1))
    planted = os.path.join(os.fsencode(tmp_path / "store"), b"machines", b"\xff")
    os.makedirs(planted)
    with open(os.path.join(planted, b"head"), "wb") as f:
        f.write(b"planted")
    repo = Repository(store, "m1")
    assert repo.machines() == ["m1"]
    assert [r["machine"] for r in machines_table(repo)[0]] == ["m1"]
    assert len(list(store.list("machines/"))) == 2


def test_json_listings_escape_a_heads_lone_surrogates(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    doc = {"format": 1, "machine": "m2", "written": 1.0, "seq": 0, "time": 1.0,
           "hostname": "h\ud800", "sessions": [{"path": PA, "gen": 1, "size": 1,
                                                 "fields": {"ai_title": "t\ud83d"}}]}
    store.put(layout.head_key("m2"), zstandard.ZstdCompressor().compress(
        json.dumps(doc).encode()))
    env = env_of(tmp_path)
    r = syncd(env, "machines", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)[0]["hostname"] == "h\ud800"
    r = syncd(env, "sessions", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)[0]["title"] == "t\ud83d"


def test_machines_without_a_head_have_their_backups_read_one_at_a_time(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    store = MemoryStore()
    names = [f"m{i}" for i in range(6)]
    for name in names:  # an older writer's machines: no head
        sh = shipper(tmp_path / name, store, tmp_path / f"{name}.db", name)
        write(tmp_path / name, PA, line(A, "/home/u/app", 0))
        sh.ship([PA.encode()])
        sh.state.close()
    live, most, threads = [0], [0], set()
    lock = threading.Lock()
    real = listing.load_backup

    def counted(*args: Any, **kw: Any) -> Backup:
        with lock:
            threads.add(threading.current_thread().name)
            live[0] += 1
            most[0] = max(most[0], live[0])
        time.sleep(0.02)
        try:
            return real(*args, **kw)
        finally:
            with lock:
                live[0] -= 1

    monkeypatch.setattr(listing, "load_backup", counted)
    repo = Repository(store, "m0")
    said: list[str] = []
    rows = list(session_rows(repo, tmp_path / "none", problems=said))
    assert said == [] and [r["machine"] for r in rows] == names
    assert most[0] == 1 and threads == {threading.current_thread().name}
    with pytest.raises(LookupFailed, match="several machines"):
        find_session(repo, A)
    assert find_session(repo, A, "m3") == ("m3", A)


def test_an_idle_daemon_writes_its_head_once_then_asks_the_store_nothing(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[str] = []
    for name in ("put", "get", "head", "list", "prefixes", "delete_many"):
        real = getattr(LocalStore, name)

        def counted(self: LocalStore, key: str, *a: Any, _real: Any = real, _name: str = name,
                    **kw: Any) -> Any:
            if "lease" not in str(key):
                calls.append(f"{_name} {key}")
            return _real(self, key, *a, **kw)

        monkeypatch.setattr(LocalStore, name, counted)
    s = settings(tmp_path, head_interval=0.5, flush_quiet=0.2, flush_max_delay=1.0)
    write(s.source, PA, line(A, "/home/u/app", 0))
    with running(s):
        wait_for(lambda: head_of(s) is not None, what="the head")
        write(s.source, PA, line(A, "/home/u/app", 1), "ab")  # grown: at the interval
        wait_for(lambda: (h := head_of(s)) is not None and h.seq == 1, what="the head")
        time.sleep(1.0)
        before = len(calls)
        time.sleep(3.0)
        idle = calls[before:]
    assert [c for c in idle if "/head" not in c or not c.startswith("get")] == [], idle


def test_a_session_in_two_folders_of_one_machine_resolves_to_that_machine() -> None:
    store = MemoryStore()
    doc = {"format": 1, "machine": "m1", "written": 1.0, "seq": 0, "time": 1.0,
           "sessions": [{"path": PA, "gen": 1, "size": 1},
                        {"path": f"projects/-home-u-moved/{A}.jsonl", "gen": 1, "size": 1}]}
    store.put(layout.head_key("m1"), zstandard.ZstdCompressor().compress(
        json.dumps(doc).encode()))
    repo = Repository(store, "m1")
    assert find_session(repo, A[:8]) == ("m1", A)
    assert find_session(repo, A, "m1") == ("m1", A)

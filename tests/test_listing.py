"""What `machines`, `sessions` and `resume` cost in a team bucket (syncd/restore/listing.py):
requests counted through a counting store over 200 machines, half of them compacted.
Exact bounds on requests, never timings. Each head read is checked with one HEAD of the
segment key after it (a machine that flushed since has its new segments folded on)."""

from __future__ import annotations

from pathlib import Path

import pytest

from syncd.archive.compact import compact
from syncd.backup.headwriter import HeadWriter
from syncd.backup.state import State
from syncd.errors import LookupFailed
from syncd.repository import Repository
from syncd.restore.listing import find_session, machines_table, session_rows
from syncd.store import MemoryStore, layout
from tests.counting import CountingStore, Counts
from tests.helpers import shipper, write
from tests.hostile import line

N = 200


def sid(i: int, j: int) -> str:
    return f"{i:08x}-0000-4000-8000-{j:012x}"


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory) -> MemoryStore:
    """N machines with 3 sessions each (two of them in one project), every other one
    compacted; each with its head, as its writer leaves it."""
    tmp = tmp_path_factory.mktemp("team")
    store = MemoryStore()
    for i in range(N):
        machine = f"m{i:03d}"
        src, db = tmp / machine, tmp / f"{machine}.db"
        sh = shipper(src, store, db, machine=machine)
        rels = []
        for j in range(3):
            cwd = f"/home/u{i}/app{j % 2}"
            rel = f"projects/-home-u{i}-app{j % 2}/{sid(i, j)}.jsonl"
            write(src, rel, line(sid(i, j), cwd, 0) + line(sid(i, j), cwd, 1))
            rels.append(rel.encode())
        sh.ship(rels)
        repo = Repository(store, machine)
        if i % 2:
            compact(repo)
        state = State(db)
        try:
            HeadWriter(repo, state, bytes(src), interval=0, tombstone_keep=0).write()
        finally:
            state.close()
    return store


def copy_of(team: MemoryStore) -> MemoryStore:
    """The team's store, to change in one test without touching the others'."""
    store = MemoryStore()
    store.objects, store.etags = dict(team.objects), dict(team.etags)
    return store


def counted(store: MemoryStore) -> tuple[Repository, Counts]:
    counts = Counts()
    return Repository(CountingStore(store, counts), "reader"), counts  # type: ignore[arg-type]


def test_machines_is_one_list_and_one_get_and_head_per_machine(team: MemoryStore) -> None:
    repo, counts = counted(team)
    rows, problems = machines_table(repo)
    assert problems == [] and len(rows) == N
    assert dict(counts.by_kind()) == {"LIST": 1, "GET": N, "HEAD": N}
    r = rows[1]  # compacted
    assert r["machine"] == "m001" and r["sessions"] == 3 and r["last_backup"] is not None
    assert r["snapshots"] + r["deltas"] >= 1 and r["stored_bytes"] > 0


def test_sessions_is_one_list_and_one_get_and_head_per_machine(team: MemoryStore,
                                                               tmp_path: Path) -> None:
    repo, counts = counted(team)
    problems: list[str] = []
    rows = list(session_rows(repo, tmp_path, problems=problems))
    assert problems == [] and len(rows) == 3 * N
    assert dict(counts.by_kind()) == {"LIST": 1, "GET": N, "HEAD": N}
    assert {r["session_id"] for r in rows if r["machine"] == "m199"} == \
        {sid(199, j) for j in range(3)}
    # --project: the same requests, the rows of that project only.
    counts.calls.clear()
    rows = list(session_rows(repo, tmp_path, project="/home/u7/app1"))
    assert [r["session_id"] for r in rows] == [sid(7, 1)]
    assert dict(counts.by_kind()) == {"LIST": 1, "GET": N, "HEAD": N}


def test_resume_finds_a_session_on_the_last_machine_reading_heads_only(
        team: MemoryStore) -> None:
    repo, counts = counted(team)
    assert find_session(repo, sid(N - 1, 2)) == (f"m{N - 1:03d}", sid(N - 1, 2))
    assert dict(counts.by_kind()) == {"LIST": 1, "GET": N, "HEAD": N}
    counts.calls.clear()  # --machine: that machine's head alone
    assert find_session(repo, sid(5, 0)[:8] + "-0000-4000-8000-000000000000",
                        "m005") == ("m005", sid(5, 0))
    assert dict(counts.by_kind()) == {"GET": 1, "HEAD": 1}


def test_a_prefix_matching_several_sessions_or_a_session_on_two_machines_is_ambiguous(
        team: MemoryStore, tmp_path: Path) -> None:
    repo, _ = counted(team)
    with pytest.raises(LookupFailed, match=r"^session 00000003 matches 3 sessions: 00000003-0"):
        find_session(repo, sid(3, 0)[:8])
    store = copy_of(team)
    # m201 continued m003's session (an import, a copy of the tree): both heads list it.
    src, db = tmp_path / "m201", tmp_path / "m201.db"
    rel = f"projects/-home-u3-app0/{sid(3, 0)}.jsonl"
    write(src, rel, line(sid(3, 0), "/home/u3/app0", 0))
    shipper(src, store, db, machine="m201").ship([rel.encode()])
    state = State(db)
    try:
        HeadWriter(Repository(store, "m201"), state, bytes(src), interval=0,
                   tombstone_keep=0).write()
    finally:
        state.close()
    with pytest.raises(LookupFailed, match=r"several machines' backups: m003 .*m201"):
        find_session(Repository(store, "reader"), sid(3, 0))
    assert find_session(Repository(store, "reader"), sid(3, 0), "m201") == ("m201", sid(3, 0))


def test_machines_without_a_head_are_read_from_their_backups(team: MemoryStore,
                                                             tmp_path: Path) -> None:
    store = copy_of(team)
    old = [f"m{i:03d}" for i in range(10)]  # written by an older syncd: no head
    store.delete_many([layout.head_key(m) for m in old])
    store.put(layout.head_key("m010"), b"not a head", if_none_match=False)
    repo, counts = counted(store)
    rows, problems = machines_table(repo)
    assert len(rows) == N and len(problems) == 1 and "machines/m010/head" in problems[0]
    assert rows[0]["hostname"] and rows[0]["segments"] + rows[0]["deltas"] >= 1
    kinds = counts.by_kind()
    # The 11 read from their backups cost a few requests each (as every machine did
    # before heads); the others one GET and one HEAD.
    assert kinds["LIST"] <= 1 + 11 * 2 and kinds["GET"] <= N + 11 * 3, kinds
    assert kinds["HEAD"] <= N - 11 + 11, kinds
    counts.calls.clear()
    rows2 = list(session_rows(repo, tmp_path))
    assert len(rows2) == 3 * N
    assert find_session(repo, sid(4, 1)) == ("m004", sid(4, 1))


def test_a_session_its_head_does_not_list_yet_is_found_in_the_segments_after_it(
        team: MemoryStore, tmp_path: Path) -> None:
    store = copy_of(team)
    src, db = tmp_path / "m777", tmp_path / "m777.db"
    sh = shipper(src, store, db, machine="m777")
    first, new = sid(777, 0), sid(777, 1)
    for n, s in enumerate((first, new)):
        rel = f"projects/-home-u7-app0/{s}.jsonl"
        write(src, rel, line(s, "/home/u7/app0", 0))
        sh.ship([rel.encode()])
        if n == 0:  # the head after the first; the second's write failed, say
            HeadWriter(Repository(store, "m777"), sh.state, bytes(src), interval=0,
                       tombstone_keep=0).write()
    repo, counts = counted(store)
    assert find_session(repo, new) == ("m777", new)
    # The head's HEAD of the next segment found one: its index read, a HEAD of the next.
    assert dict(counts.by_kind()) == {"LIST": 1, "GET": N + 1 + 1, "HEAD": N + 1 + 1}
    assert find_session(repo, first) == ("m777", first)
    assert find_session(repo, new, "m777") == ("m777", new)
    with pytest.raises(LookupFailed, match=r"is in no backup \(m777\)$"):
        find_session(repo, sid(8, 0), "m777")

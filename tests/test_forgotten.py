"""Forgotten sessions: the shipper never ships them and ships each one's tombstone once
(a ``forget`` entry, docs/FORMAT.md); followers that imported a session from its origin
honour that machine's tombstone, from a segment or from its head; nobody else's."""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import zstandard

from syncd.archive import purge as purges
from syncd.archive.compact import CompactOptions, compact
from syncd.backup.engine import sync_once
from syncd.backup.state import ImportedFile, State
from syncd.claude import project_folder
from syncd.config import Settings, load_settings
from syncd.errors import CompactError, FormatError
from syncd.follow.follower import Follower, cursors
from syncd.format import head as headfmt
from syncd.format.segment import ENTRIES_MAX, SegmentIndex, SegmentWriter, parse_segment
from syncd.repository import Repository
from syncd.service.schedule import Archiver
from syncd.service.status import format_status, status
from syncd.store import Store, layout, open_store
from syncd.store.layout import segment_key
from tests.faultkit import FaultProxy, cli, kill9_at_put, make_settings
from tests.faultkit import line as fline
from tests.faultkit import write as fwrite
from tests.helpers import running, wait_for
from tests.hostile import line
from tests.seaweed import Seaweed

SID = "aaaaaaaa-0000-4000-8000-00000000000a"
OTHER = "bbbbbbbb-0000-4000-8000-00000000000b"
A = f"projects/-home-u-app/{SID}.jsonl".encode()
A_SUB = f"projects/-home-u-app/{SID}/subagents/agent-1.jsonl".encode()
A_TODO = f"todos/{SID}-agent-{SID}.json".encode()
B = f"projects/-home-u-app/{OTHER}.jsonl".encode()
S1 = "0a0eb7b7-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
S2 = "1b1eb7b7-1c2d-4e5f-8a9b-0c1d2e3f4a5b"


def indexes(store: Store, machine: str) -> list[SegmentIndex]:
    repo = Repository(store, machine)
    return [repo.read_index(k, n) for k, n in repo.segments()]


def forgotten_of(settings: Settings) -> dict[str, tuple[str, int]]:
    state = State(settings.state_file, readonly=True)
    try:
        return {sid: (f.by, f.announced) for sid, f in state.forgotten().items()}
    finally:
        state.close()


def forget(settings: Settings, *sids: str) -> None:
    """What ``syncd forget`` records in the state (the store rewrite aside)."""
    state = State(settings.state_file)
    try:
        state.forget_sessions(sids)
    finally:
        state.close()


def s3(tmp_path: Path, bucket: str, seaweed: Seaweed, endpoint: str | None = None) -> Settings:
    return make_settings(tmp_path, store=f"s3://{bucket}", endpoint=endpoint or seaweed.endpoint)


# -- the shipper -------------------------------------------------------------------------

def test_a_forgotten_sessions_files_are_never_shipped_and_its_tombstone_is_one_put(
        tmp_path: Path, seaweed: Seaweed, bucket: str) -> None:
    s = s3(tmp_path, bucket, seaweed)
    fwrite(s.source, A, fline(1))
    fwrite(s.source, A_SUB, fline(2))
    fwrite(s.source, B, fline(3))
    sync_once(s)
    store = open_store(s.store, endpoint_url=seaweed.endpoint)
    assert len(indexes(store, "m1")) == 1

    forget(s, SID)
    assert forgotten_of(s) == {SID: ("user", 0)}
    sync_once(s)  # nothing changed: the tombstone alone, one segment
    segs = indexes(store, "m1")
    assert len(segs) == 2
    ix = segs[-1]
    assert [sid for sid, _ in ix.forgotten] == [SID]
    assert not ix.extents and not ix.copies and not ix.tombstones
    assert forgotten_of(s) == {SID: ("user", 1)}
    head = Repository(store, "m1").head()
    assert head is not None and [sid for sid, _ in head.forgotten] == [SID]
    assert SID not in {h.session_id for h in head.sessions}

    # Its files change, one goes, one is new: none of it leaves; the others still ship.
    fwrite(s.source, A, fline(4), "ab")
    os.unlink(os.path.join(os.fsencode(s.source), A_SUB))
    fwrite(s.source, A_TODO, b"[]")
    fwrite(s.source, B, fline(5), "ab")
    sync_once(s)
    segs = indexes(store, "m1")
    assert len(segs) == 3
    ix = segs[-1]
    named = {x.path for x in ix.extents} | {t.path for t in ix.tombstones} | \
        {c.path for c in ix.copies}
    assert named == {B} and not ix.forgotten  # shipped once only
    assert status(s)["files_pending"] == 0  # a forgotten file is not pending either
    sync_once(s)
    assert len(indexes(store, "m1")) == 3  # idle: nothing more


def test_lifting_ships_the_sessions_files_again_as_new_generations(
        tmp_path: Path, seaweed: Seaweed, bucket: str) -> None:
    s = s3(tmp_path, bucket, seaweed)
    fwrite(s.source, A, fline(1))
    fwrite(s.source, A_SUB, fline(2))
    sync_once(s)
    forget(s, SID)
    sync_once(s)
    state = State(s.state_file)
    try:
        state.lift_forgotten([SID])
    finally:
        state.close()
    sync_once(s)
    store = open_store(s.store, endpoint_url=seaweed.endpoint)
    ix = indexes(store, "m1")[-1]
    got = {x.path: (x.gen, x.start, x.end) for x in ix.extents}
    assert got == {A: (2, 0, len(fline(1))), A_SUB: (2, 0, len(fline(2)))}
    assert forgotten_of(s) == {}


def test_the_daemon_ships_a_tombstone_when_nothing_else_changed(
        tmp_path: Path, seaweed: Seaweed, bucket: str) -> None:
    s = s3(tmp_path, bucket, seaweed)
    fwrite(s.source, A, fline(1))
    store = open_store(s.store, endpoint_url=seaweed.endpoint)
    with running(s) as daemon:
        wait_for(lambda: status(s)["last_flush_seq"] == 0, 20, "the first flush")
        forget(s, SID)
        daemon.request_scan()  # the tree is as it was: an idle look
        wait_for(lambda: forgotten_of(s) == {SID: ("user", 1)}, 20, "the tombstone")
    assert [sid for ix in indexes(store, "m1") for sid, _ in ix.forgotten] == [SID]


@pytest.mark.parametrize("stored", [True, False], ids=["after-put", "before-put"])
def test_a_kill_between_the_tombstones_put_and_its_commit_never_loses_it(
        tmp_path: Path, seaweed: Seaweed, bucket: str, proxy: FaultProxy,
        stored: bool) -> None:
    s = s3(tmp_path, bucket, seaweed, proxy.url)
    fwrite(s.source, A, fline(1))
    direct = open_store(s.store, endpoint_url=seaweed.endpoint)
    assert cli(s, "sync").returncode == 0
    forget(s, SID)
    kill9_at_put(proxy, s, "sync", direct, segment_key("m1", 1), stored,
                 tmp_path / "sync.log")
    assert forgotten_of(s) == {SID: ("user", 0)}  # killed before the commit
    again = s.model_copy(update={"s3_endpoint_url": seaweed.endpoint})
    r = cli(again, "sync")
    assert r.returncode == 0, r.stderr
    assert ("adopted segment" in r.stderr) == stored, r.stderr
    assert forgotten_of(s) == {SID: ("user", 1)}
    tombs = [sid for ix in indexes(direct, "m1") for sid, _ in ix.forgotten]
    assert tombs == [SID]  # once: adopted, or shipped by the restart
    # Lifted, its file ships again whole, as a new generation.
    state = State(s.state_file)
    try:
        state.lift_forgotten([SID])
    finally:
        state.close()
    assert cli(again, "sync").returncode == 0
    got = [(x.gen, x.start, x.end) for x in indexes(direct, "m1")[-1].extents if x.path == A]
    assert got == [(2, 0, len(fline(1)))]


def test_a_delta_keeps_the_tombstones_of_the_segments_it_folds(
        tmp_path: Path, seaweed: Seaweed, bucket: str) -> None:
    s = s3(tmp_path, bucket, seaweed)
    fwrite(s.source, A, fline(1))
    fwrite(s.source, B, fline(2))
    sync_once(s)
    repo = Repository(open_store(s.store, endpoint_url=seaweed.endpoint), "m1")
    compact(repo, CompactOptions())  # the first: a manifest
    forget(s, SID)
    sync_once(s)  # the tombstone alone (the head is written after it)
    compact(repo, CompactOptions())  # that segment: a delta
    assert not repo.segments()
    (lo, hi, key, _), = repo.deltas()
    d = repo.read_delta(key)
    assert (lo, hi) == (1, 1) and [sid for sid, _ in d.index.forgotten] == [SID]


# -- the format --------------------------------------------------------------------------

def segment(forgets: list[tuple[str, float]], machine: str = "desk", seq: int = 0) -> bytes:
    w = SegmentWriter(machine, seq, 1.7e9)
    for sid, t in forgets:
        w.add_forget(sid, t)
    return w.finish()


def test_forget_entries_read_back_and_hostile_ones_refuse_the_index() -> None:
    ix = parse_segment(segment([(SID, 1.7e9), (OTHER, 1.8e9)]), "seg")
    assert ix.forgotten == [(SID, 1.7e9), (OTHER, 1.8e9)]
    for bad, why in (([("../../etc/passwd", 1.0)], "no session id"),
                     ([(SID, 1e300)], "not a time"),
                     ([(SID, float("nan"))], "unreadable"),
                     ([(SID, 1e9 + i * 7.3) for i in range(ENTRIES_MAX + 1)],
                      "more entries than")):
        with pytest.raises(FormatError, match=why):
            parse_segment(segment(bad), "seg")


def test_a_heads_forgotten_list_is_checked() -> None:
    h = headfmt.Head("desk", 1.7e9, 3, 1.7e9, forgotten=[(SID, 1.7e9)])
    assert headfmt.decode(headfmt.encode(h), "desk", "head").forgotten == [(SID, 1.7e9)]
    for bad in ([["x", 1.0]], [[SID, 1e300]], [[SID]], [[SID, 1.0]] * 4097, {"a": 1}):
        h.forgotten = []
        blob = headfmt.encode(h)
        doc = json.loads(zstandard.decompress(blob))
        doc["forgotten"] = bad
        raw = zstandard.ZstdCompressor().compress(json.dumps(doc).encode())
        with pytest.raises(FormatError):
            headfmt.decode(raw, "desk", "head")


# -- followers ---------------------------------------------------------------------------

class Machine:
    """One machine over the shared SeaweedFS bucket."""

    def __init__(self, tmp: Path, name: str, home: str, bucket: str, endpoint: str,
                 **kw: object) -> None:
        self.name = name
        self.home = tmp / home.strip("/")
        self.home.mkdir(parents=True, exist_ok=True)
        base: dict[str, object] = dict(source=self.home / ".claude", store=f"s3://{bucket}",
                                       s3_endpoint_url=endpoint,
                                       state_dir=tmp / name / "state", machine_id=name,
                                       follow_quiet=0, store_retry_deadline=5.0)
        base.update(kw)
        self.settings: Settings = load_settings(config_file=tmp / "none.toml", **base)
        self.now = 2e9

    def cwd(self, project: str) -> str:
        return f"{self.home}/{project}"

    def rel(self, project: str, sid: str, sub: str = "") -> bytes:
        folder = project_folder(self.cwd(project))
        return (f"projects/{folder}/{sid}" + (f"/{sub}" if sub else ".jsonl")).encode()

    def path(self, rel: bytes) -> Path:
        return Path(os.fsdecode(os.path.join(os.fsencode(self.settings.source), rel)))

    def store(self) -> Store:
        return open_store(self.settings.store, endpoint_url=self.settings.s3_endpoint_url)

    def sync(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("HOME", str(self.home))
        sync_once(self.settings)

    def follower(self, monkeypatch: pytest.MonkeyPatch) -> Iterator[Follower]:
        monkeypatch.setenv("HOME", str(self.home))
        state = State(self.settings.state_file)
        try:
            yield Follower(self.settings, Repository(self.store(), self.name), state,
                           clock=lambda: self.now)
        finally:
            state.close()

    def poll(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for f in self.follower(monkeypatch):
            f.poll()

    def pending_purge(self) -> list[str]:
        state = State(self.settings.state_file, readonly=True)
        try:
            return purges.pending(state)
        finally:
            state.close()


@pytest.fixture
def two(tmp_path: Path, seaweed: Seaweed, bucket: str) -> tuple[Machine, Machine]:
    a = Machine(tmp_path, "desk", "/home/alice", bucket, seaweed.endpoint, follow=["laptop"])
    b = Machine(tmp_path, "laptop", "/users/bob", bucket, seaweed.endpoint, follow=["desk"])
    return a, b


def imported(a: Machine, b: Machine, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """desk's S1 (a transcript and a subagent's) brought to the laptop: the laptop's
    copies."""
    fwrite(a.settings.source, a.rel("app", S1), line(S1, a.cwd("app"), 0))
    fwrite(a.settings.source, a.rel("app", S1, "subagents/agent-1.jsonl"),
           line(S1, a.cwd("app"), 1))
    a.sync(monkeypatch)
    b.poll(monkeypatch)
    got = b.path(b.rel("app", S1)), b.path(b.rel("app", S1, "subagents/agent-1.jsonl"))
    assert all(p.exists() for p in got)
    return got


def test_a_follower_honours_the_tombstone_of_the_machine_a_session_came_from(
        two: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = two
    copies = imported(a, b, monkeypatch)
    b.sync(monkeypatch)  # the laptop backs its copy up (shipped as imported)
    forget(a.settings, S1)
    a.sync(monkeypatch)
    b.poll(monkeypatch)
    assert not any(p.exists() for p in copies)
    assert not copies[1].parent.parent.exists()  # the session's own folder went too
    assert copies[0].parent.is_dir()  # its project folder stays
    assert forgotten_of(b.settings) == {S1: ("desk", 0)}
    assert b.pending_purge() == [S1]
    # The laptop's next flush ships its own tombstone, not the deletions.
    before = len(indexes(b.store(), "laptop"))
    b.sync(monkeypatch)
    segs = indexes(b.store(), "laptop")
    assert len(segs) == before + 1 and [s for s, _ in segs[-1].forgotten] == [S1]
    assert not segs[-1].tombstones
    # Never imported again, even when desk lifts it and ships it anew.
    state = State(a.settings.state_file)
    try:
        state.lift_forgotten([S1])
    finally:
        state.close()
    a.sync(monkeypatch)
    b.poll(monkeypatch)
    assert not copies[0].exists()


def test_a_copy_with_lines_written_here_is_kept_and_said(
        two: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    a, b = two
    transcript, sub = imported(a, b, monkeypatch)
    with open(transcript, "ab") as f:
        f.write(line(S1, b.cwd("app"), 2))
    forget(a.settings, S1)
    a.sync(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="syncd.follow"):
        b.poll(monkeypatch)
    assert transcript.exists() and not sub.exists()
    said = [r.getMessage() for r in caplog.records if "kept" in r.getMessage()]
    assert len(said) == 1 and S1 in said[0], said
    assert forgotten_of(b.settings) == {S1: ("desk", 0)}
    assert b.pending_purge() == [S1]
    with caplog.at_level(logging.WARNING, logger="syncd.follow"):
        b.poll(monkeypatch)
    assert len([r for r in caplog.records if "kept" in r.getMessage()]) == 1  # said once


def test_a_copy_being_written_waits_until_quiet(
        two: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = two
    transcript, _ = imported(a, b, monkeypatch)
    forget(a.settings, S1)
    a.sync(monkeypatch)
    with open(transcript, "rb"):  # a running Claude holds it open
        b.poll(monkeypatch)
        assert transcript.exists()
        state = State(b.settings.state_file, readonly=True)
        try:
            assert cursors(state)["desk"].forgetting == [S1]
        finally:
            state.close()
    b.poll(monkeypatch)  # closed: removed at the next poll
    assert not transcript.exists()


def test_removing_a_forgotten_copy_never_follows_a_symlinked_folder(
        two: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    a, b = two
    _, sub = imported(a, b, monkeypatch)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / sub.name).write_bytes(sub.read_bytes())  # the same bytes, outside the tree
    sub.unlink()
    sub.parent.rmdir()
    sub.parent.symlink_to(outside)
    forget(a.settings, S1)
    a.sync(monkeypatch)
    b.poll(monkeypatch)
    assert (outside / sub.name).exists()
    assert forgotten_of(b.settings) == {S1: ("desk", 0)}


def test_a_tombstone_of_a_machine_the_session_did_not_come_from_is_ignored(
        two: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = two
    copies = imported(a, b, monkeypatch)
    own = b.path(b.rel("lib", S2))
    fwrite(b.settings.source, b.rel("lib", S2), line(S2, b.cwd("lib"), 0))
    b.sync(monkeypatch)
    # desk's copy of it was once a conflict here: the record says nothing of desk's
    # was written (an import's record of a conflict).
    state = State(b.settings.state_file)
    try:
        state.record_imported([ImportedFile(b.rel("lib", S2), "desk", 0, b"", False,
                                            a.rel("lib", S2), 1, 10, 0.0)])
    finally:
        state.close()
    forget(a.settings, S2, S1)  # desk names the laptop's own session, and its own
    a.sync(monkeypatch)
    b.poll(monkeypatch)
    assert own.exists() and own.read_bytes() == line(S2, b.cwd("lib"), 0)
    assert not any(p.exists() for p in copies)
    assert forgotten_of(b.settings) == {S1: ("desk", 0)} and b.pending_purge() == [S1]


def test_the_tombstone_is_honoured_from_the_head_once_the_segment_was_compacted(
        two: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = two
    copies = imported(a, b, monkeypatch)
    forget(a.settings, S1)
    a.sync(monkeypatch)
    repo = Repository(a.store(), "desk")
    compact(repo, CompactOptions(now=a.now))
    assert not repo.segments()  # the tombstone's segment is gone
    head = repo.head()
    assert head is not None and [s for s, _ in head.forgotten] == [S1]
    b.poll(monkeypatch)
    assert not any(p.exists() for p in copies)
    assert forgotten_of(b.settings) == {S1: ("desk", 0)}
    # Lifted here, it stays lifted: the head that still lists the tombstone is read again.
    state = State(b.settings.state_file)
    try:
        state.lift_forgotten([S1])
    finally:
        state.close()
    b.poll(monkeypatch)
    assert forgotten_of(b.settings) == {}


@pytest.mark.parametrize("bad", ["not-a-uuid", "many", "huge-time"])
def test_a_hostile_tombstone_segment_is_one_line_and_the_rest_goes_on(
        two: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture, bad: str) -> None:
    a, b = two
    transcript, _ = imported(a, b, monkeypatch)
    state = State(a.settings.state_file, readonly=True)
    try:
        seq = state.next_seq
    finally:
        state.close()
    forgets = {"not-a-uuid": [("../" * 8 + "etc", 1.0)],
               "many": [(S1, 1e9 + i * 7.3) for i in range(70_000)],
               "huge-time": [(S1, 1e300)]}[bad]
    a.store().put(segment_key("desk", seq), segment(forgets, seq=seq))
    with open(a.path(a.rel("app", S1)), "ab") as f:
        f.write(line(S1, a.cwd("app"), 5))
    a.sync(monkeypatch)  # desk passes the planted seq over
    with caplog.at_level(logging.WARNING, logger="syncd.follow"):
        b.poll(monkeypatch)
    refused = [r for r in caplog.records if r.name == "syncd.follow" and
               layout.segment_key("desk", seq) in r.getMessage()]
    assert len(refused) == 1, [r.getMessage() for r in caplog.records]
    assert transcript.read_bytes().endswith(line(S1, b.cwd("app"), 5))  # the rest came
    assert forgotten_of(b.settings) == {}


# -- the purge queue and status ----------------------------------------------------------

def test_the_archive_job_purges_the_queue_only_once_the_rewrite_returned(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = make_settings(tmp_path)
    state = State(s.state_file)
    try:
        purges.queue(state, [S1, S2])
        purges.queue(state, [S1])
    finally:
        state.close()
    repo = Repository(open_store(s.store), s.machine_id)
    archiver = Archiver(s, lambda: repo, threading.Event())
    calls: list[frozenset[str]] = []

    def failing(repo: Repository, sids: frozenset[str], opts: object) -> None:
        calls.append(sids)
        raise CompactError("store down")

    monkeypatch.setattr(purges, "purge", failing)
    assert archiver.purge() is None
    assert calls == [frozenset({S1, S2})]
    assert status(s)["forgotten_purge_pending"] == 2  # kept for the next look

    def working(repo: Repository, sids: frozenset[str], opts: object) -> None:
        calls.append(sids)

    monkeypatch.setattr(purges, "purge", working)
    assert archiver.purge() == {"sessions": sorted([S1, S2])}
    assert status(s)["forgotten_purge_pending"] == 0
    assert archiver.purge() is None and len(calls) == 2  # nothing queued: no rewrite


def test_status_counts_forgotten_sessions_and_waiting_tombstones(tmp_path: Path) -> None:
    s = make_settings(tmp_path)
    forget(s, S1, S2)
    state = State(s.state_file)
    try:
        state.announce_forgotten([S1])
    finally:
        state.close()
    st = status(s)
    assert (st["forgotten"], st["forgotten_unshipped"]) == (2, 1)
    assert "forgotten:    2 sessions" in format_status(st)
    assert "1 tombstones wait" in format_status(st)

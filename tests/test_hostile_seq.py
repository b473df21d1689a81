"""Objects planted at this machine's next seq (docs/FORMAT.md, "A seq passed over"): the
writer passes the seq over with one warning and goes on shipping; readers, verify,
status and compaction cope; a segment of a writer that took the lease over is still
refused."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from syncd.archive.compact import compact
from syncd.archive.options import compact_options
from syncd.archive.verify import verify
from syncd.backup.engine import sync_once
from syncd.backup.ship import Shipper, ship_with_restart
from syncd.backup.state import State
from syncd.claude import Selection
from syncd.config import Settings
from syncd.errors import LeaseLost
from syncd.repository import Repository
from syncd.restore.restorer import restore_tree
from syncd.security.keys import init_encryption, open_crypto
from syncd.security.lease import Lease
from syncd.service.status import format_status, health, status
from syncd.store import LocalStore, MemoryStore, Store, open_store
from syncd.store.layout import segment_key
from syncd.view import load_backup
from tests.faultkit import MACHINE, A, B, line, make_settings, tree, write
from tests.helpers import running, shipped, wait_for
from tests.seaweed import Seaweed

JUNK = os.urandom(5000)


def store_of(s: Settings) -> Store:
    return open_store(s.store, endpoint_url=s.s3_endpoint_url, retry_deadline=5.0)


def next_seq(s: Settings) -> int:
    state = State(s.state_file, readonly=True)
    try:
        return state.next_seq
    finally:
        state.close()


def warnings_naming(caplog: pytest.LogCaptureFixture, key: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and key in r.getMessage()]


def test_a_planted_object_at_the_next_seq_is_passed_over_and_shipping_goes_on(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    s = make_settings(tmp_path)
    write(s.source, A, line(1))
    sync_once(s)
    store = store_of(s)
    planted = segment_key(MACHINE, next_seq(s))
    store.put(planted, JUNK)
    write(s.source, A, line(2), "ab")
    write(s.source, B, line(3))
    caplog.set_level(logging.WARNING)

    sync_once(s)  # raised "not a syncd segment (bad magic)" before, every time

    assert shipped(s, A) == len(line(1) + line(2)) and shipped(s, B) == len(line(3))
    [said] = warnings_naming(caplog, planted)
    assert "bad magic" in said and "passed over" in said
    assert next_seq(s) == 3 and store.get(planted) == JUNK  # never overwritten
    # A restore of the machine is byte-exact; the planted object is one line.
    out = restore_tree(Repository(store, MACHINE), tmp_path / "out")
    assert tree(tmp_path / "out") == tree(s.source)
    assert len(out.errors) == 1 and planted in out.errors[0], out.errors
    # status: a note, a line and a health problem for a day.
    figures = status(s)
    assert planted in figures["passed_over"] and figures["passed_over_time"] is not None
    text = format_status(figures)
    [row] = [ln for ln in text.splitlines() if ln.startswith("passed over:")]
    assert planted in row
    assert "an object not ours took a seq (passed over)" in health(figures)
    assert health(figures, now=figures["passed_over_time"] + 86401) == \
        health({**figures, "passed_over_time": None})
    # verify: a problem line naming the object.
    rep = verify(Repository(store, MACHINE), acknowledged=next_seq(s) - 1)
    assert [p for p in rep.problems if planted in p] == rep.problems and rep.problems
    # The next pass has nothing to say.
    caplog.clear()
    write(s.source, A, line(4), "ab")
    sync_once(s)
    assert warnings_naming(caplog, "seg/") == [] and next_seq(s) == 4


def test_several_planted_objects_in_a_row_are_each_passed_over_with_one_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    s = make_settings(tmp_path, head_interval=0)  # a head every pass
    write(s.source, A, line(1))
    sync_once(s)
    store = store_of(s)
    first = next_seq(s)
    ours = store.get(segment_key(MACHINE, 0))
    (tmp_path / "other").mkdir()
    other = make_settings(tmp_path / "other", machine_id="other", store=s.store)
    write(other.source, A, line(9))
    sync_once(other)
    planted = {
        segment_key(MACHINE, first): JUNK,                                # not a segment
        segment_key(MACHINE, first + 1): store.get(segment_key("other", 0)),  # foreign
        segment_key(MACHINE, first + 2): ours,                            # ours, seq 0
        segment_key(MACHINE, first + 3): ours[:-7],                       # truncated
    }
    for key, blob in planted.items():
        store.put(key, blob)
    write(s.source, A, line(2), "ab")
    caplog.set_level(logging.WARNING)

    sync_once(s)

    for key in planted:
        assert len(warnings_naming(caplog, key)) == 1, key
    assert next_seq(s) == first + 5 and shipped(s, A) == len(line(1) + line(2))
    out = restore_tree(Repository(store, MACHINE), tmp_path / "out")
    assert tree(tmp_path / "out") == tree(s.source)
    assert sorted(k for k in planted if any(k in e for e in out.errors)) == sorted(planted)
    # Compaction folds them as empty points and deletes them; then all is clean.
    write(s.source, A, line(3), "ab")
    sync_once(s)
    rep = compact(Repository(store, MACHINE), compact_options(s))
    assert rep.errors == [] and rep.snapshot is not None  # the first: a manifest
    assert all(store.head(k) is None for k in planted)
    assert verify(Repository(store, MACHINE), acknowledged=next_seq(s) - 1).problems == []
    out = restore_tree(Repository(store, MACHINE), tmp_path / "out2")
    assert out.errors == [] and tree(tmp_path / "out2") == tree(s.source)
    view = load_backup(Repository(store, MACHINE))
    assert view.last_seq == next_seq(s) - 1


def test_compaction_waits_for_the_segment_after_a_seq_passed_over_at_the_end(
        tmp_path: Path) -> None:
    s = make_settings(tmp_path, head_interval=0)  # a head every pass
    write(s.source, A, line(1))
    sync_once(s)
    store = store_of(s)
    repo = Repository(store, MACHINE)
    compact(repo, compact_options(s))  # a manifest: the next ones write deltas
    planted = segment_key(MACHINE, 1)
    store.put(planted, JUNK)
    write(s.source, A, line(2), "ab")
    sync_once(s)  # seq 1 passed over, seq 2 written
    store.put(segment_key(MACHINE, 3), JUNK)
    write(s.source, B, line(3))
    sync_once(s)  # seq 3 passed over, seq 4 written
    store.put(segment_key(MACHINE, 5), JUNK)
    sync_once(s)  # nothing pending: seq 5 passed over, nothing after it yet
    assert next_seq(s) == 6
    # The compaction before it is no error and leaves it for the next one (an empty
    # point has the time of the segment after it).
    rep = compact(repo, compact_options(s))
    assert rep.errors == [] and rep.delta is not None and rep.delta.endswith(
        f"{1:016x}-{4:016x}")
    assert store.head(planted) is None and store.get(segment_key(MACHINE, 5)) == JUNK
    write(s.source, B, line(4), "ab")
    sync_once(s)
    rep = compact(repo, compact_options(s))
    assert rep.errors == [] and store.head(segment_key(MACHINE, 5)) is None
    out = restore_tree(repo, tmp_path / "out")
    assert out.errors == [] and tree(tmp_path / "out") == tree(s.source)
    points = repo.read_delta(rep.delta or "").points
    assert [p.seq for p in points] == list(range(1, 7))
    # The seqs passed over are points that changed nothing, at the next one's time.
    assert [p.seq for p in points if not p.changes] == [1, 3, 5]
    assert all(points[i].time == points[i + 1].time for i in (0, 2, 4))


def test_a_planted_object_whose_writer_took_the_lease_is_not_adopted(tmp_path: Path) -> None:
    store = MemoryStore()
    root = tmp_path / "src"
    write(root, A, line(1))
    mine = Lease(store, MACHINE, owner="me", ttl=30)
    mine.acquire()
    sh = Shipper(root=root, repo=Repository(store, MACHINE), state=State(tmp_path / "st.db"),
                 selection=Selection(), lease=mine)
    sh.ship([A])
    # Another writer takes the lease over and writes our next seq: a valid segment of
    # ours, not our own crash's leftover.
    theirs = Lease(store, MACHINE, owner="them", ttl=30, takeover=True)
    theirs.acquire()
    other = Shipper(root=root, repo=Repository(store, MACHINE),
                    state=State(tmp_path / "theirs.db"), selection=Selection(), lease=theirs)
    other.state.set_meta(next_seq="1")
    write(root, A, line(2), "ab")
    other.ship([A])
    assert store.head(segment_key(MACHINE, 1)) is not None
    write(root, A, line(3), "ab")
    with pytest.raises(LeaseLost):
        ship_with_restart(sh, [A])
    assert sh.state.next_seq == 1  # neither adopted nor passed over


def test_a_daemon_ships_past_an_object_planted_while_it_runs(
        tmp_path: Path, seaweed: Seaweed, bucket: str,
        caplog: pytest.LogCaptureFixture) -> None:
    s = make_settings(tmp_path, store=f"s3://{bucket}/team", endpoint=seaweed.endpoint)
    write(s.source, A, line(1))
    caplog.set_level(logging.WARNING)
    with running(s) as d:
        wait_for(lambda: shipped(s, A) == len(line(1)), what="the first flush")
        store = store_of(s)
        planted = segment_key(MACHINE, next_seq(s))
        store.put(planted, JUNK)  # the daemon's next PUT finds the key taken
        write(s.source, A, line(2), "ab")
        wait_for(lambda: shipped(s, A) == len(line(1) + line(2)), what="the next flush")
        assert d._failing is None
        write(s.source, B, line(3))  # and the one after
        wait_for(lambda: shipped(s, B) == len(line(3)), what="a later flush")
    assert len(warnings_naming(caplog, planted)) == 1
    assert not [r for r in caplog.records if "flush failed" in r.getMessage()]
    restore_tree(Repository(store, MACHINE), tmp_path / "out")
    assert tree(tmp_path / "out") == tree(s.source)


def test_an_encrypted_store_passes_over_a_planted_plain_segment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    store = LocalStore(tmp_path / "store")
    init_encryption(store, "pass phrase 1234", n=1 << 12)
    monkeypatch.setenv("SYNCD_PASSPHRASE", "pass phrase 1234")
    s = make_settings(tmp_path)
    write(s.source, A, line(1))
    sync_once(s)
    (tmp_path / "plain").mkdir()
    plain = make_settings(tmp_path / "plain", store=(tmp_path / "plain-store").as_uri())
    monkeypatch.delenv("SYNCD_PASSPHRASE")
    write(plain.source, A, line(7))
    sync_once(plain)
    monkeypatch.setenv("SYNCD_PASSPHRASE", "pass phrase 1234")
    # A plain segment of this machine at that seq: what anyone who can write the bucket
    # (but has no key) can make.
    planted = segment_key(MACHINE, next_seq(s))
    store.put(planted, LocalStore(tmp_path / "plain-store").get(segment_key(MACHINE, 0)))
    write(s.source, A, line(2), "ab")
    caplog.set_level(logging.WARNING)
    sync_once(s)
    assert shipped(s, A) == len(line(1) + line(2))
    [said] = warnings_naming(caplog, planted)
    assert "not encrypted, but the store is" in said
    repo = Repository(store, MACHINE, open_crypto(store, None, prompt=False))
    out = restore_tree(repo, tmp_path / "out")
    assert tree(tmp_path / "out") == tree(s.source)
    assert len(out.errors) == 1 and planted in out.errors[0]

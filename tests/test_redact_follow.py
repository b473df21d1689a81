"""Redactions reach followed copies: ``syncd redact`` on the origin ships a ``redact``
entry (each masked value's sha256 and length, never the value: docs/FORMAT.md); a
follower that imported the session masks its copy and its own backup of it, once the
copy is quiet; nobody else's tombstone is honoured, and a hostile one is one line."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import threading
from pathlib import Path

import pytest
import zstandard

from syncd.archive import redactions
from syncd.archive.compact import CompactOptions, compact
from syncd.backup.state import ImportedFile, State
from syncd.errors import FormatError
from syncd.format import head as headfmt
from syncd.format.segment import (
    ENTRIES_MAX,
    REDACT_VALUE_MAX,
    Redaction,
    SegmentWriter,
    parse_segment,
)
from syncd.mask import mask_of
from syncd.repository import Repository
from syncd.restore.restorer import RestoreOptions, restore
from syncd.service.schedule import Archiver
from syncd.service.status import format_status, status
from syncd.store import Store, layout
from syncd.store.layout import segment_key
from syncd.timeline import timeline
from tests.faultkit import cli
from tests.faultkit import write as fwrite
from tests.helpers import tree_bytes
from tests.hostile import line
from tests.seaweed import Seaweed
from tests.test_forgotten import Machine, indexes

S1 = "0a0eb7b7-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
S2 = "1b1eb7b7-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
SECRET = b"ghp_" + b"Q7" * 18  # a GitHub token's shape
PATTERN = "ghp_[A-Za-z0-9]{36}"
DIGEST = (hashlib.sha256(SECRET).hexdigest(), len(SECRET))
OLD = 1_700_000_000  # older than any quiet window


@pytest.fixture
def two(tmp_path: Path, seaweed: Seaweed, bucket: str) -> tuple[Machine, Machine]:
    a = Machine(tmp_path, "desk", "/home/alice", bucket, seaweed.endpoint, follow=["laptop"])
    b = Machine(tmp_path, "laptop", "/users/bob", bucket, seaweed.endpoint, follow=["desk"])
    return a, b


def told(m: Machine, i: int, sid: str = S1, project: str = "app") -> bytes:
    return line(sid, m.cwd(project), i, "my token is " + SECRET.decode())


def old(m: Machine) -> None:
    for dirpath, _, names in os.walk(m.settings.source):
        for n in names:
            os.utime(os.path.join(dirpath, n), (OLD, OLD))


def imported(a: Machine, b: Machine, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """desk's S1, holding SECRET in its transcript and its subagent's, brought to the
    laptop and backed up there: the laptop's copies."""
    fwrite(a.settings.source, a.rel("app", S1), told(a, 0) + told(a, 1))
    fwrite(a.settings.source, a.rel("app", S1, "subagents/agent-1.jsonl"), told(a, 2))
    old(a)
    a.sync(monkeypatch)
    b.poll(monkeypatch)
    got = b.path(b.rel("app", S1)), b.path(b.rel("app", S1, "subagents/agent-1.jsonl"))
    assert all(SECRET in p.read_bytes() for p in got)
    old(b)
    b.sync(monkeypatch)
    assert SECRET in all_raw(b.store(), "laptop")  # the laptop's backup holds it now
    return got


def redact_on(m: Machine, monkeypatch: pytest.MonkeyPatch) -> None:
    """``syncd redact`` as a user runs it on ``m``, then ``m``'s next flush."""
    monkeypatch.setenv("HOME", str(m.home))
    r = cli(m.settings, "redact", PATTERN)
    assert r.returncode == 0, r.stderr
    m.sync(monkeypatch)


def archiver(m: Machine) -> Archiver:
    return Archiver(m.settings, lambda: Repository(m.store(), m.name), threading.Event())


def pending(m: Machine) -> list[Redaction]:
    state = State(m.settings.state_file, readonly=True)
    try:
        return redactions.pending(state)
    finally:
        state.close()


def catalog_text(m: Machine, rel: bytes) -> str:
    state = State(m.settings.state_file, readonly=True)
    try:
        return json.dumps(state.catalog_of(rel))
    finally:
        state.close()


def all_raw(store: Store, machine: str) -> bytes:
    """Every object of ``machine``, decompressed where it holds zstd frames (plain store)."""
    out = bytearray()
    for info in store.list(f"machines/{machine}/"):
        blob = store.get(info.key)
        out += blob
        i = 0
        while (j := blob.find(b"\x28\xb5\x2f\xfd", i)) >= 0:
            with contextlib.suppress(zstandard.ZstdError):
                out += zstandard.ZstdDecompressor().decompressobj().decompress(blob[j:])
            i = j + 4
    return bytes(out)


def points(store: Store, machine: str) -> dict[int, dict[bytes, bytes]]:
    """Every point's tree of ``machine``'s backup, by seq, as a restore as of it writes it."""
    repo = Repository(store, machine)
    rows, errors = timeline(repo)
    assert errors == [] and rows
    out = {}
    for row in rows:
        with tempfile.TemporaryDirectory() as d:
            r = restore(repo, RestoreOptions(target=Path(d), at=row.time,
                                             local_machine=machine))
            assert r.errors == []
            out[row.seq] = tree_bytes(Path(d))
    return out


# -- the format --------------------------------------------------------------------------

def _with_entries(machine: str, seq: int, entries: list[dict[str, object]]) -> bytes:
    # Written by hand: the writer never makes a bad entry.
    from syncd.format.segment import HEADER, MAGIC, TRAILER, VERSION
    doc = {"v": VERSION, "machine": machine, "seq": seq, "time": 1.7e9, "entries": entries}
    blob = zstandard.ZstdCompressor().compress(json.dumps(doc).encode())
    head = HEADER.pack(MAGIC, VERSION, 0, 0)
    return head + blob + TRAILER.pack(len(head), len(blob), hashlib.sha256(blob).digest(),
                                      b"SYNCDEND")


def entry(sid: str = S1, values: object = None, time: object = 1.7e9) -> dict[str, object]:
    return {"op": "redact", "session": sid, "time": time,
            "values": [list(DIGEST)] if values is None else values}


def test_redact_entries_read_back_and_hostile_ones_refuse_the_index() -> None:
    w = SegmentWriter("desk", 0, 1.7e9)
    r = Redaction(S1, 1.7e9, (DIGEST, ("0" * 64, 1)))
    w.add_redact(r)
    assert parse_segment(w.finish(), "seg").redacted == [r]
    assert parse_segment(_with_entries("desk", 0, [entry()]), "seg").redacted == \
        [Redaction(S1, 1.7e9, (DIGEST,))]
    for bad, why in (([entry(values=[["zz" * 32, 4]])], "not \\[sha256"),
                     ([entry(values=[[DIGEST[0].upper(), 4]])], "not \\[sha256"),
                     ([entry(values=[[DIGEST[0], REDACT_VALUE_MAX + 1]])], "not \\[sha256"),
                     ([entry(values=[[DIGEST[0], 0]])], "not \\[sha256"),
                     ([entry(values=[[DIGEST[0], True]])], "not \\[sha256"),
                     ([entry(values=[list(DIGEST)] * 257)], "more than 256"),
                     ([entry(values=[])], "no values"),
                     ([entry(sid="../../etc")], "no session id"),
                     ([entry(time=1e300)], "not a time"),
                     ([entry(time=1e9 + i * 7.3) for i in range(ENTRIES_MAX + 1)],
                      "more entries than|a reader accepts")):
        with pytest.raises(FormatError, match=why):
            parse_segment(_with_entries("desk", 0, bad), "seg")


def test_a_heads_redacted_list_is_checked() -> None:
    r = Redaction(S1, 1.7e9, (DIGEST,))
    h = headfmt.Head("desk", 1.7e9, 3, 1.7e9, redacted=[r])
    assert headfmt.decode(headfmt.encode(h), "desk", "head").redacted == [r]
    good = {k: v for k, v in entry().items() if k != "op"}
    for bad in ([{**good, "values": [["x", 1]]}], [good] * 257, [[S1]], {"a": 1}):
        h.redacted = []
        doc = json.loads(zstandard.decompress(headfmt.encode(h)))
        doc["redacted"] = bad
        with pytest.raises(FormatError):
            headfmt.decode(zstandard.ZstdCompressor().compress(json.dumps(doc).encode()),
                           "desk", "head")


# -- the origin --------------------------------------------------------------------------

def test_the_origins_tombstone_carries_digests_and_no_value(
        two: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    a, _ = two
    fwrite(a.settings.source, a.rel("app", S1), line(S1, a.cwd("app"), 0) + told(a, 1))
    fwrite(a.settings.source, a.rel("lib", S2), line(S2, a.cwd("lib"), 0))
    old(a)
    a.sync(monkeypatch)
    monkeypatch.setenv("HOME", str(a.home))
    r = cli(a.settings, "redact", PATTERN)
    assert r.returncode == 0, r.stderr
    before = len(indexes(a.store(), "desk"))  # (the rewrite folded the segments)
    state = State(a.settings.state_file, readonly=True)
    try:
        assert [(x.session, x.values) for x in redactions.unannounced(state)] == \
            [(S1, (DIGEST,))]
    finally:
        state.close()
    assert status(a.settings)["redactions_unshipped"] == 1
    a.sync(monkeypatch)  # nothing else changed: the tombstone alone, one segment
    segs = indexes(a.store(), "desk")
    assert len(segs) == before + 1
    ix = segs[-1]
    assert [(x.session, x.values) for x in ix.redacted] == [(S1, (DIGEST,))]
    assert not ix.extents and not ix.copies and not ix.tombstones
    head = Repository(a.store(), "desk").head()
    assert head is not None and [(x.session, x.values) for x in head.redacted] == \
        [(S1, (DIGEST,))]
    raw = all_raw(a.store(), "desk")
    assert DIGEST[0].encode() in raw and SECRET not in raw
    a.sync(monkeypatch)
    assert len(indexes(a.store(), "desk")) == before + 1  # shipped once only


def test_a_delta_keeps_the_redactions_of_the_segments_it_folds(
        two: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    a, _ = two
    fwrite(a.settings.source, a.rel("app", S1), told(a, 0))
    a.sync(monkeypatch)
    repo = Repository(a.store(), "desk")
    compact(repo, CompactOptions())  # the first: a manifest
    r1, r2 = Redaction(S1, 1.9e9, (DIGEST,)), Redaction(S2, 1.9e9, (("0" * 64, 3),))
    state = State(a.settings.state_file)
    try:
        redactions.announce(state, {S1: {DIGEST}}, 1.9e9)
        redactions.announce(state, {S2: {("0" * 64, 3)}}, 1.9e9)
    finally:
        state.close()
    a.sync(monkeypatch)  # the tombstones alone
    compact(repo, CompactOptions())  # that segment: a delta
    assert not repo.segments()
    (_, _, key, _), = repo.deltas()
    assert repo.read_delta(key).index.redacted == [r1, r2]


# -- followers ---------------------------------------------------------------------------

def test_a_follower_masks_its_copy_and_its_own_backup_of_it_and_nothing_else(
        two: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = two
    copies = imported(a, b, monkeypatch)
    # The laptop's own session holds the same value: not desk's to redact.
    own = b.path(b.rel("lib", S2))
    fwrite(b.settings.source, b.rel("lib", S2), told(b, 0, S2, "lib"))
    old(b)
    b.sync(monkeypatch)
    texts = [p.read_bytes() for p in copies]
    rels = [os.path.relpath(p, b.settings.source).encode() for p in copies]
    own_rel = b.rel("lib", S2)
    assert SECRET.decode() in catalog_text(b, rels[0]) and \
        SECRET.decode() in catalog_text(b, own_rel)
    redact_on(a, monkeypatch)
    b.poll(monkeypatch)
    assert [(r.session, r.values) for r in pending(b)] == [(S1, (DIGEST,))]
    assert [p.read_bytes() for p in copies] == texts  # the archive job masks them
    b.poll(monkeypatch)  # the head lists it again: queued once
    assert len(pending(b)) == 1

    done = archiver(b).redact()

    assert done is not None and len(done) == 1 and pending(b) == []
    for p, text in zip(copies, texts, strict=True):
        got = p.read_bytes()
        assert got == text.replace(SECRET, mask_of(len(SECRET)))
        assert b"[REDACTED" in got and len(got) == len(text)
    assert own.read_bytes() == told(b, 0, S2, "lib")
    assert SECRET.decode() not in catalog_text(b, rels[0])
    assert SECRET.decode() in catalog_text(b, own_rel)  # another session's: not desk's
    for seq, tree in points(b.store(), "laptop").items():
        for rel in rels:
            if rel in tree:
                assert SECRET not in tree[rel], (seq, rel)
        assert tree.get(own_rel, told(b, 0, S2, "lib")) == told(b, 0, S2, "lib"), seq
    assert archiver(b).redact() is None  # done: nothing more to do
    # Nothing ships again: the backup and the tree agree.
    before = len(indexes(b.store(), "laptop"))
    b.sync(monkeypatch)
    assert len(indexes(b.store(), "laptop")) == before


def test_a_tombstone_of_a_machine_the_session_did_not_come_from_is_ignored(
        two: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = two
    imported(a, b, monkeypatch)
    own = b.path(b.rel("lib", S2))
    fwrite(b.settings.source, b.rel("lib", S2), told(b, 0, S2, "lib"))
    b.sync(monkeypatch)
    # desk's copy of it was once a conflict here: nothing of desk's was written.
    state = State(b.settings.state_file)
    try:
        state.record_imported([ImportedFile(b.rel("lib", S2), "desk", 0, b"", False,
                                            a.rel("lib", S2), 1, 10, 0.0)])
    finally:
        state.close()
    state = State(a.settings.state_file)
    try:  # desk names the laptop's own session
        redactions.announce(state, {S2: {DIGEST}}, 1.9e9)
    finally:
        state.close()
    a.sync(monkeypatch)
    assert [x.session for x in indexes(a.store(), "desk")[-1].redacted] == [S2]
    b.poll(monkeypatch)
    assert pending(b) == []
    assert archiver(b).redact() is None
    assert own.read_bytes() == told(b, 0, S2, "lib")


def test_the_tombstone_is_honoured_from_the_head_once_the_segment_was_compacted(
        two: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = two
    transcript, _ = imported(a, b, monkeypatch)
    redact_on(a, monkeypatch)
    repo = Repository(a.store(), "desk")
    compact(repo, CompactOptions(now=a.now))
    assert not repo.segments()  # the tombstone's segment is gone
    b.poll(monkeypatch)
    assert [(r.session, r.values) for r in pending(b)] == [(S1, (DIGEST,))]
    assert archiver(b).redact() is not None
    assert SECRET not in transcript.read_bytes()


@pytest.mark.parametrize("bad", ["bad-hex", "huge-length", "many"])
def test_a_hostile_redact_segment_is_one_line_and_the_rest_goes_on(
        two: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture, bad: str) -> None:
    a, b = two
    transcript, _ = imported(a, b, monkeypatch)
    state = State(a.settings.state_file, readonly=True)
    try:
        seq = state.next_seq
    finally:
        state.close()
    entries = {"bad-hex": [entry(values=[["g" * 64, 40]])],
               "huge-length": [entry(values=[[DIGEST[0], 1 << 40]])],
               "many": [entry(time=1e9 + i * 7.3) for i in range(70_000)]}[bad]
    a.store().put(segment_key("desk", seq), _with_entries("desk", seq, entries))
    with open(a.path(a.rel("app", S1)), "ab") as f:
        f.write(line(S1, a.cwd("app"), 5))
    a.sync(monkeypatch)  # desk passes the planted seq over
    with caplog.at_level(logging.WARNING, logger="syncd.follow"):
        b.poll(monkeypatch)
    refused = [r for r in caplog.records if r.name == "syncd.follow" and
               layout.segment_key("desk", seq) in r.getMessage()]
    assert len(refused) == 1, [r.getMessage() for r in caplog.records]
    assert transcript.read_bytes().endswith(line(S1, b.cwd("app"), 5))  # the rest came
    assert pending(b) == []


def test_a_busy_copy_waits_and_is_done_at_a_later_look(
        two: tuple[Machine, Machine], monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = two
    transcript, sub = imported(a, b, monkeypatch)
    text = transcript.read_bytes()
    redact_on(a, monkeypatch)
    b.poll(monkeypatch)
    assert len(pending(b)) == 1
    st = status(b.settings)
    assert st["redactions_pending"] == 1
    assert "1 of followed machines wait to be masked here" in format_status(st)
    job = archiver(b)
    with open(transcript, "rb"):  # a running Claude holds it open
        assert job.redact() is None
        assert transcript.read_bytes() == text and len(pending(b)) == 1
        assert SECRET in all_raw(b.store(), "laptop")  # the backup waits with it
    done = job.redact()  # closed: done at the next look
    assert done is not None and pending(b) == []
    assert transcript.read_bytes() == text.replace(SECRET, mask_of(len(SECRET)))
    assert SECRET not in sub.read_bytes()
    assert SECRET not in all_raw(b.store(), "laptop")  # no object of the laptop holds it
    assert status(b.settings)["redactions_pending"] == 0

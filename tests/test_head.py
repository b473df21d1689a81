"""The machine's head: its format and reader (syncd/format/head.py, Repository.head), its
writer (syncd/backup/headwriter.py), and that listing from heads lists what the
backups hold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import zstandard

from syncd.backup.engine import Engine, sync_once
from syncd.backup.headwriter import HeadWriter
from syncd.backup.state import State
from syncd.config import Settings, load_settings
from syncd.errors import FormatError
from syncd.format.head import HEAD_MAX, Head, HeadSession, decode, encode
from syncd.repository import Repository
from syncd.restore.listing import (
    find_session,
    load_all,
    machines_table,
    session_rows,
    sessions_table,
)
from syncd.security.keys import init_encryption
from syncd.store import LocalStore, MemoryStore, layout
from tests.helpers import running, shipped, wait_for, write
from tests.hostile import line

A = "0a0eb7b7-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
B = "1b1eb7b7-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
C = "2c2eb7b7-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
PA = f"projects/-home-u-app/{A}.jsonl"
PB = f"projects/-home-u-lib/{B}.jsonl"
PC = f"projects/-home-u-app/{C}.jsonl"


def settings(tmp_path: Path, machine: str = "m1", **kw: object) -> Settings:
    base: dict[str, object] = dict(source=tmp_path / machine / "src",
                                   store=(tmp_path / "store").as_uri(),
                                   state_dir=tmp_path / machine / "state", machine_id=machine)
    base.update(kw)
    return load_settings(config_file=tmp_path / "none.toml", **base)


def head_of(s: Settings) -> Head | None:
    return Repository(LocalStore(tmp_store(s)), s.machine_id).head()


def tmp_store(s: Settings) -> Path:
    return Path(s.store.removeprefix("file://"))


# -- the format ------------------------------------------------------------------------------
def sample() -> Head:
    return Head("m1", 1_700_000_100.0, 41, 1_700_000_000.5,
                {"hostname": "desk", "os": "Linux 6", "home": "/home/u", "claude_root": "/c"},
                {"seg": (3, 3000), "snap": (1, 900)},
                [HeadSession(PA.encode(), 2, 1234, None, {"cwd": "/home/u/app",
                                                         "ai_title": "Fix the build",
                                                         "relocated_cwd": "/home/u/lib"}),
                 HeadSession(b"projects/-\xff-x/" + B.encode() + b".jsonl", 1, 7,
                             1_700_000_050.0, {})])


def test_a_head_reads_back_as_written() -> None:
    h = sample()
    got = decode(encode(h), "m1", "memory://machines/m1/head")
    assert got == h


def test_the_generation_that_named_a_sessions_fields_reads_back_and_a_flip_is_refused(
        ) -> None:
    h = sample()
    h.sessions[0].gen, h.sessions[0].fields_gen = 3, 2  # gen 3 names no field yet
    blob = encode(h)
    got = decode(blob, "m1", "memory://machines/m1/head")
    assert got == h and got.sessions[0].named_by == 2 and got.sessions[1].named_by == 1
    refused = 0
    for at in range(len(blob)):  # the frame's checksum: no flip reads as another head
        flipped = bytearray(blob)
        flipped[at] ^= 0x01
        try:
            assert decode(bytes(flipped), "m1", "memory://machines/m1/head") == h
        except FormatError:
            refused += 1
    assert refused > len(blob) * 0.9  # (a few bits zstd never reads change nothing)


@pytest.mark.parametrize(("doc", "why"), [
    ({"format": 2}, "format"),
    ({"machine": "m2"}, "written for machine"),
    ({"seq": -2}, "bad seq"),
    ({"seq": 1 << 64}, "bad seq"),
    ({"seq": "7"}, "bad seq"),
    ({"time": "yesterday"}, "not a time"),
    ({"written": 1e300}, "not a time"),
    ({"objects": {"seg": [1]}}, "bad count"),
    ({"objects": {"seg": [-1, 3]}}, "bad count"),
    ({"objects": []}, "not a JSON object"),
    ({"sessions": {}}, "not a list"),
    ({"sessions": [{"path": "settings.json", "gen": 1, "size": 2}]}, "not a session"),
    ({"sessions": [{"path": "../../etc/" + A + ".jsonl", "gen": 1, "size": 2}]},
     "not a session"),
    ({"sessions": [{"path": PA, "gen": -1, "size": 2}]}, "bad generation"),
    ({"sessions": [{"path": PA, "gen": 1, "size": 2.5}]}, "bad generation"),
    ({"sessions": [{"path": PA, "gen": 1, "size": 2, "deleted_at": "nan"}]}, "not a time"),
    ({"sessions": [{"path_b64": "!!", "gen": 1, "size": 2}]}, "unreadable head"),
    ({"sessions": [{"gen": 1, "size": 2}]}, "unreadable head"),
    ({"sessions": [{"path": PA, "gen": 1, "size": 2, "fields": []}]}, "fields"),
])
def test_a_head_that_is_not_what_a_writer_makes_is_refused(doc: dict[str, object],
                                                           why: str) -> None:
    base = json.loads(zstandard.ZstdDecompressor().decompress(encode(sample())))
    base.update(doc)
    blob = zstandard.ZstdCompressor().compress(json.dumps(base).encode())
    with pytest.raises(FormatError) as e:
        decode(blob, "m1", "memory://machines/m1/head")
    assert "machines/m1/head" in str(e.value) and why in str(e.value)


def test_a_heads_fields_are_only_known_strings_of_bounded_length() -> None:
    base = json.loads(zstandard.ZstdDecompressor().decompress(encode(sample())))
    base["sessions"][0]["fields"] = {"cwd": "/x" * 5000, "evil": "y", "ai_title": 7}
    base["hostname"] = "h" * 10_000
    h = decode(zstandard.ZstdCompressor().compress(json.dumps(base).encode()), "m1", "w")
    assert set(h.sessions[0].fields) == {"cwd"} and len(h.sessions[0].fields["cwd"]) == 4096
    assert len(h.info["hostname"]) == 4096


def test_a_head_too_large_or_a_bomb_is_refused_unread() -> None:
    store = MemoryStore()
    repo = Repository(store, "m1")
    key = layout.head_key("m1")
    store.put(key, b"\0" * (HEAD_MAX + 1))
    with pytest.raises(Exception, match="larger than"):
        repo.head()
    store.delete_many([key])
    bomb = zstandard.ZstdCompressor().compress(b"[" + b" " * (200 << 20) + b"]")
    store.put(key, bomb)
    with pytest.raises(FormatError, match="accepts"):
        repo.head()
    store.delete_many([key])
    store.put(key, b"garbage")
    with pytest.raises(FormatError, match="machines/m1/head"):
        repo.head()
    store.delete_many([key])
    assert repo.head() is None


# -- the writer ------------------------------------------------------------------------------
def test_a_sync_leaves_a_head_listing_every_session_with_its_catalog(tmp_path: Path) -> None:
    s = settings(tmp_path)
    write(s.source, PA, line(A, "/home/u/app", 0, "hello there"))
    write(s.source, PB, line(B, "/home/u/lib", 0) + line(B, "/home/u/lib", 1))
    sync_once(s)
    h = head_of(s)
    assert h is not None and h.seq == 0 and h.time is not None
    by_id = {x.session_id: x for x in h.sessions}
    assert set(by_id) == {A, B}
    assert by_id[A].size == (s.source / PA).stat().st_size
    assert by_id[A].fields["cwd"] == "/home/u/app"
    assert by_id[A].fields["first_prompt"].startswith("hello there")
    assert h.objects["seg"][0] == 1 and h.info["claude_root"] == str(s.source)
    # Deleted: listed with its time, as the backup lists it.
    (s.source / PB).unlink()
    sync_once(s)
    h = head_of(s)
    assert h is not None and h.seq == 1
    assert {x.session_id: x.deleted_at is not None for x in h.sessions} == {A: False, B: True}


def test_the_head_follows_new_sessions_at_once_and_growth_at_the_interval(
        tmp_path: Path) -> None:
    s = settings(tmp_path)
    write(s.source, PA, line(A, "/home/u/app", 0))
    now = [1_800_000_000.0]
    engine = Engine(s)
    try:
        engine.head = HeadWriter(engine.repo, engine.state, engine.root, interval=300,
                                 tombstone_keep=0, clock=lambda: now[0])
        engine.flush({PA.encode()})
        assert engine.head.due() == 0.0  # a new session: at once
        assert engine.head.write_if_due()
        assert engine.head.due() is None
        write(s.source, PA, line(A, "/home/u/app", 1), "ab")
        engine.flush({PA.encode()})
        assert engine.head.due() == now[0] + 300  # grown only: at the interval
        assert not engine.head.write_if_due()
        now[0] += 301
        assert engine.head.write_if_due()
        h = head_of(s)
        assert h is not None and h.seq == 1
        assert h.sessions[0].size == (s.source / PA).stat().st_size
        write(s.source, PC, line(C, "/home/u/app", 0))
        engine.flush({PC.encode()})
        assert engine.head.due() == 0.0
        assert engine.head.write_if_due()
        h = head_of(s)
        assert h is not None and h.seq == 2 and {x.session_id for x in h.sessions} == {A, C}
    finally:
        engine.close()


def test_the_daemon_writes_the_head_for_a_new_session_and_leaves_it_current_at_stop(
        tmp_path: Path) -> None:
    s = settings(tmp_path, flush_quiet=0.2, flush_max_delay=1.0)
    write(s.source, PA, line(A, "/home/u/app", 0))
    with running(s):
        wait_for(lambda: (h := head_of(s)) is not None and len(h.sessions) == 1,
                 what="the head listing the session")
        write(s.source, PB, line(B, "/home/u/lib", 0))
        wait_for(lambda: (h := head_of(s)) is not None and len(h.sessions) == 2,
                 what="the head listing the new session")
        written = head_of(s)
        write(s.source, PA, line(A, "/home/u/app", 1), "ab")
        wait_for(lambda: shipped(s, PA) == (s.source / PA).stat().st_size,
                 what="the append shipped")
        assert head_of(s) == written  # grown only: not before head_interval
    h = head_of(s)  # a clean stop wrote it
    assert h is not None and h.seq > written.seq  # type: ignore[union-attr]
    assert {x.session_id: x.size for x in h.sessions}[A] == (s.source / PA).stat().st_size


def test_a_sync_that_only_appends_is_one_put(tmp_path: Path) -> None:
    s = settings(tmp_path)
    write(s.source, PA, line(A, "/home/u/app", 0))
    sync_once(s)
    store = LocalStore(tmp_store(s))
    before = {o.key for o in store.list("")}
    write(s.source, PA, line(A, "/home/u/app", 1), "ab")
    sync_once(s)
    assert {o.key for o in store.list("")} - before == {layout.segment_key("m1", 1)}
    h = head_of(s)
    assert h is not None and h.seq == 0  # the head waits for head_interval
    write(s.source, PC, line(C, "/home/u/app", 0))
    sync_once(s)  # a new session: the head at once
    h = head_of(s)
    assert h is not None and h.seq == 2 and len(h.sessions) == 2


def test_a_state_from_before_the_catalog_gets_its_titles_from_the_store(
        tmp_path: Path) -> None:
    s = settings(tmp_path)
    write(s.source, PA, line(A, "/home/u/app", 0, "first words"))
    sync_once(s)
    st = State(s.state_file)
    st._db.execute("DELETE FROM catalog")
    st._db.execute("DELETE FROM meta WHERE key IN ('catalog', 'head_seq')")
    st._db.commit()
    st.close()
    Repository(LocalStore(tmp_store(s)), "m1").store.delete_many([layout.head_key("m1")])
    write(s.source, PA, line(A, "/home/u/app", 1), "ab")
    sync_once(s)
    h = head_of(s)
    assert h is not None
    assert h.sessions[0].fields["first_prompt"].startswith("first words")


def test_an_encrypted_store_seals_the_head(tmp_path: Path) -> None:
    pw = tmp_path / "pw"
    pw.write_text("correct horse battery staple\n")
    s = settings(tmp_path, passphrase_file=pw)
    store = LocalStore(tmp_store(s))
    crypto = init_encryption(store, "correct horse battery staple", n=1 << 10)
    write(s.source, PA, line(A, "/home/u/app", 0))
    sync_once(s)
    blob = store.get(layout.head_key("m1"))
    assert b"home" not in blob and b"app" not in blob
    with pytest.raises(FormatError, match="encrypted"):
        Repository(store, "m1").head()
    h = Repository(store, "m1", crypto).head()
    assert h is not None and h.sessions[0].session_id == A
    # Another machine's sealed head moved here does not open as this one's.
    store.put(layout.head_key("m2"), blob)
    with pytest.raises(FormatError):
        Repository(store, "m2", crypto).head()


# -- reading from heads lists what the backups hold ------------------------------------------
def test_listing_from_heads_equals_listing_from_backups(tmp_path: Path) -> None:
    for m, paths in (("m1", [(PA, A, "/home/u/app")]),
                     ("m2", [(PB, B, "/home/u/lib"), (PC, C, "/home/u/app")])):
        s = settings(tmp_path, m)
        for rel, sid, cwd in paths:
            write(s.source, rel, line(sid, cwd, 0, f"prompt of {sid}") + line(sid, cwd, 1))
        sync_once(s)
    s = settings(tmp_path, "m2")
    (s.source / PC).unlink()
    sync_once(s)
    repo = Repository(LocalStore(tmp_path / "store"), "m1")
    backups, problems = load_all(repo)
    assert problems == []
    expect = sorted(sessions_table(backups, tmp_path / "none"), key=lambda r: r["session_id"])
    got = sorted(session_rows(repo, tmp_path / "none"), key=lambda r: r["session_id"])
    assert got == expect and len(got) == 3
    for store_key in (layout.head_key("m1"), layout.head_key("m2")):  # and without heads
        repo.store.delete_many([store_key])
    assert sorted(session_rows(repo, tmp_path / "none"),
                  key=lambda r: r["session_id"]) == expect
    assert find_session(repo, B[:8]) == ("m2", B)
    rows, problems = machines_table(repo)
    assert [r["machine"] for r in rows] == ["m1", "m2"] and problems == []

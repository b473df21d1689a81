"""Snapshot manifests on their own: build, read back, groups, session lookup, refusals."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest

from syncd.errors import FormatError
from syncd.format.catalog import Session
from syncd.format.segment import FRAME_MAX, Extent, SegmentWriter
from syncd.format.snapshot import ROOT_GROUP, Entry, build, group_of, parse_group
from syncd.security.crypto import Crypto, new_master
from syncd.store import MemoryStore, layout
from tests.readers import read_extents, read_groups, read_manifest

M = "m1"
SA = "aaaaaaaa-0000-4000-8000-000000000001"
SB = "bbbbbbbb-0000-4000-8000-000000000002"
SC = "cccccccc-0000-4000-8000-000000000003"
PACK1 = layout.pack_key(M, 0, 5, "0123abcd")
PACK2 = layout.pack_key(M, 6, 9, "89abcdef")
LATIN1 = b"projects/-home-u-caf\xe9"  # not UTF-8: travels as path_b64
MODE, MTIME = 0o600, 1_750_000_000_123_456_789


def entry(path: bytes, gen: int, spans: list[tuple[str, int, int]], *,
          deleted_at: float | None = None, retained: bool = False) -> Entry:
    """An entry whose extents [start, end) lie in the given objects (offsets made up)."""
    e = Entry(path, gen, spans[-1][2] if spans else 0, MODE, MTIME, deleted_at, retained)
    for n, (key, start, end) in enumerate(spans):
        sha = hashlib.sha256(path + f":{gen}:{start}".encode()).hexdigest()
        e.extents.append((key, Extent(path, gen, start, end, off=16 + 100 * n, clen=50 + n,
                                      sha256=sha, mode=MODE, mtime_ns=MTIME)))
    return e


def put(store: MemoryStore, blob: bytes, seq: int = 9, rev: int = 2) -> str:
    key = layout.snapshot_key(M, seq, rev)
    store.put(key, blob)
    return key


ENTRIES = [
    entry(f"projects/-home-u-app/{SA}.jsonl".encode(), 2, [(PACK1, 0, 200), (PACK2, 200, 300)]),
    entry(f"projects/-home-u-app/{SA}.jsonl".encode(), 1, [(PACK1, 0, 100)], retained=True),
    entry(f"projects/-home-u-app/{SA}/subagents/agent-1.jsonl".encode(), 1, [(PACK2, 0, 40)]),
    entry(LATIN1 + f"/{SC}.jsonl".encode(), 1, [(PACK2, 0, 10)]),
    entry(LATIN1 + b"/memory/notes-\xff.md", 3, [(PACK1, 0, 10)], deleted_at=1_750_000_100.5),
    entry(b"history.jsonl", 1, [(PACK1, 0, 70), (PACK1, 70, 90)]),
    entry(f"todos/{SA}-agent-{SA}.json".encode(), 1, []),  # an empty file: no extent
    entry(f"file-history/{SA}/0123@v1".encode(), 1, [(PACK2, 0, 5)]),
    entry(f"tasks/{SA}/1.json".encode(), 1, [(PACK2, 0, 5)]),
]
SESSIONS = [
    Session(SA, M, f"projects/-home-u-app/{SA}.jsonl".encode(), 2, last_seq=7,
            fields={"cwd": "/home/u/app", "custom_title": "fix the build"}),
    Session(SC, M, LATIN1 + f"/{SC}.jsonl".encode(), 1, last_seq=3,
            fields={"cwd": "/home/u/caf\udce9"}),
]
PROJECTS = {"/home/u/app": {"remote": "git@example.com:u/app.git", "worktrees": []}}


def test_build_and_read_back() -> None:
    store = MemoryStore()
    key = put(store, build(M, 9, 2, 1_750_000_200.0, 1_750_000_000.0, ENTRIES, SESSIONS,
                           PROJECTS))

    m = read_manifest(store, key)

    assert (m.key, m.machine, m.seq, m.rev) == (key, M, 9, 2)
    assert (m.time, m.first_time) == (1_750_000_200.0, 1_750_000_000.0)
    assert sorted(m.objects) == sorted([PACK1, PACK2])
    assert m.projects == PROJECTS
    caf = "projects/-home-u-caf\udce9"
    assert set(m.groups) == {"projects/-home-u-app", caf, ROOT_GROUP, "todos",
                             f"file-history/{SA}", f"tasks/{SA}"}
    assert m.sids == {"projects/-home-u-app": SA[:8], caf: SC[:8]}

    groups = read_groups(store, m)

    assert set(groups) == set(m.groups)
    got = sorted((e for g in groups.values() for e in g.entries), key=lambda e: (e.path, e.gen))
    assert got == sorted(ENTRIES, key=lambda e: (e.path, e.gen))
    assert sorted((s for g in groups.values() for s in g.sessions), key=lambda s: s.path) == \
        sorted(SESSIONS, key=lambda s: s.path)
    assert [s.session_id for s in groups["projects/-home-u-app"].sessions] == [SA]
    assert [e.size for e in groups["todos"].entries] == [0]

    # Only the groups asked for (unknown names are skipped).
    assert set(read_groups(store, m, ["todos", ROOT_GROUP, "projects/nope"])) == \
        {"todos", ROOT_GROUP}

    # On the wire, a name that is not UTF-8 is base64 of its raw bytes.
    (frame,) = m.groups[caf]
    ((_, raw),) = list(read_extents(store, key, [frame]))
    doc = json.loads(raw)
    assert sorted(base64.b64decode(f["path_b64"]) for f in doc["files"]) == \
        sorted(e.path for e in ENTRIES if e.path.startswith(LATIN1))
    assert [base64.b64decode(s["path_b64"]) for s in doc["sessions"]] == [SESSIONS[1].path]
    assert all("path" not in f for f in doc["files"])



@pytest.mark.parametrize("obj", [-1, 2, 99])
def test_an_extent_naming_an_object_the_manifest_lacks_is_refused(obj: int) -> None:
    store = MemoryStore()
    m = read_manifest(store, put(store, build(M, 9, 2, 1.0, 1.0, ENTRIES, SESSIONS, PROJECTS)))
    (frame,) = m.groups["todos"]
    ((_, raw),) = list(read_extents(store, m.key, [frame]))
    doc = json.loads(raw)
    doc["files"][0]["x"] = [[obj, 16, 50, 0, 5, "0" * 64]]
    with pytest.raises(FormatError, match=f"unreadable group 'todos': object {obj} of 2"):
        parse_group(json.dumps(doc).encode(), m, "todos", "w")

def test_sealed_manifest_round_trip_and_refusals() -> None:
    store, crypto = MemoryStore(), Crypto(new_master())
    key = layout.snapshot_key(M, 9, 2)
    blob = build(M, 9, 2, 1.0, 1.0, ENTRIES, SESSIONS, PROJECTS,
                 cipher=crypto.cipher(key))
    store.put(key, blob)
    assert b"-home-u-app" not in blob and SA.encode() not in blob

    m = read_manifest(store, key, crypto)
    assert sum(len(g.entries) for g in read_groups(store, m, None, crypto).values()) == \
        len(ENTRIES)
    with pytest.raises(FormatError, match="encrypted, but no key"):
        read_manifest(store, key)
    other = layout.snapshot_key(M, 10, 0)
    store.put(other, blob)  # sealed for another key: moving it is caught
    with pytest.raises(FormatError, match="fails authentication"):
        read_manifest(store, other, crypto)


def test_a_group_bigger_than_a_frame_spans_several() -> None:
    folder = b"projects/-home-u-big"
    many = [entry(folder + f"/{SA}/tool-results/{i:06d}-{'x' * 80}.txt".encode(), 1,
                  [(PACK1, 0, i + 1)]) for i in range(22_000)]
    store = MemoryStore()
    key = put(store, build(M, 9, 2, 1.0, 1.0, many, [], {}))

    m = read_manifest(store, key)

    frames = m.groups["projects/-home-u-big"]
    assert len(frames) >= 2
    assert [x.start for x in frames] == [FRAME_MAX * i for i in range(len(frames))]
    assert all(x.end - x.start == FRAME_MAX for x in frames[:-1])
    assert read_groups(store, m)["projects/-home-u-big"].entries == many


def test_folders_of_finds_a_session_by_its_id() -> None:
    sessions = [
        Session(SA, M, f"projects/-home-u-app/{SA}.jsonl".encode()),
        Session(SB, M, f"projects/-home-u-lib/{SB}.jsonl".encode()),
        Session(SC, M, f"projects/-home-u-lib/{SC}.jsonl".encode()),
    ]
    store = MemoryStore()
    m = read_manifest(store, put(store, build(M, 9, 2, 1.0, 1.0, [], sessions, {})))

    assert m.folders_of(SA) == ["projects/-home-u-app"]
    assert m.folders_of(SB) == ["projects/-home-u-lib"]
    assert m.folders_of(SC) == ["projects/-home-u-lib"]
    assert m.folders_of("dddddddd-0000-4000-8000-000000000004") == []
    # Looked up by the id's first 8 characters, wherever they sit in the group's list.
    assert m.folders_of(SC[:8]) == ["projects/-home-u-lib"]


def test_folders_of_finds_a_session_with_a_short_id() -> None:
    store = MemoryStore()
    s = Session("abc", M, b"projects/-home-u-app/abc.jsonl")
    m = read_manifest(store, put(store, build(M, 9, 2, 1.0, 1.0, [], [s], {})))

    assert m.sids == {"projects/-home-u-app": "abc-----"}
    assert m.folders_of("abc") == ["projects/-home-u-app"]


def test_a_manifest_under_another_key_is_refused() -> None:
    store = MemoryStore()
    blob = build(M, 9, 2, 1.0, 1.0, ENTRIES, SESSIONS, PROJECTS)
    put(store, blob)
    for seq, rev in ((10, 2), (9, 3), (9, 0)):
        other = put(store, blob, seq, rev)
        with pytest.raises(FormatError, match=rf"{other}: manifest says seq 9 rev 2.*renamed"):
            read_manifest(store, other)
    seg = layout.segment_key(M, 9)
    store.put(seg, blob)
    with pytest.raises(FormatError, match="renamed"):
        read_manifest(store, seg)


def test_a_segment_is_not_a_manifest() -> None:
    store = MemoryStore()
    w = SegmentWriter(M, 9, 1.0)
    w.add_data(b"history.jsonl", 1, 0, b"x\n", mode=MODE, mtime_ns=MTIME)
    key = put(store, w.finish())
    with pytest.raises(FormatError, match=f"{key}: not a snapshot manifest"):
        read_manifest(store, key)


@pytest.mark.parametrize(("path", "group"), [
    (f"projects/-home-u-app/{SA}.jsonl", "projects/-home-u-app"),
    (f"projects/-home-u-app/{SA}/subagents/agent-1.jsonl", "projects/-home-u-app"),
    ("projects/-home-u-app/memory/MEMORY.md", "projects/-home-u-app"),
    (f"file-history/{SA}/0123abcd@v2", f"file-history/{SA}"),
    (f"tasks/{SA}/1.json", f"tasks/{SA}"),
    ("todos/x", "todos"),
    (f"todos/{SA}-agent-{SA}.json", "todos"),
    ("plans/a/b.md", "plans"),
    ("history.jsonl", ROOT_GROUP),
    ("settings.json", ROOT_GROUP),
])
def test_group_of(path: str, group: str) -> None:
    assert group_of(path.encode()) == group


def test_group_of_a_name_that_is_not_utf8() -> None:
    assert group_of(LATIN1 + b"/x.jsonl") == "projects/-home-u-caf\udce9"

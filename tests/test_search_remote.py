"""Another machine's transcripts indexed on request (syncd/search/remote.py): only what is
past the index's cursor is fetched (a counting store tells), a rewrite re-indexes, a
deletion is marked, encrypted and hostile stores, the dry run fetches no extent; and the
catalogs of machines not indexed searched from their heads (syncd/search/catalogs.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from syncd.backup.ship import Shipper
from syncd.backup.state import State
from syncd.claude import Selection
from syncd.repository import Repository
from syncd.search import remote
from syncd.search.remote import index_machine
from syncd.security.crypto import Crypto
from syncd.security.keys import init_encryption
from syncd.store import LocalStore, MemoryStore, Store, layout, open_store
from tests.counting import CountingStore
from tests.helpers import one_line, syncd, write
from tests.hostile import Craft, good_machine
from tests.seaweed import Seaweed

SID = "0a0eb7b7-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
SID2 = "1b1eb7b7-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
A = f"projects/-home-u-app/{SID}.jsonl"
B = f"projects/-home-u-app/{SID2}.jsonl"
SUB = f"projects/-home-u-app/{SID}/subagents/agent-a1.jsonl"
CHEAP = 1 << 12


def row(i: int, text: str = "", sid: str = SID) -> bytes:
    entry = {"type": "user", "sessionId": sid, "cwd": "/home/u/app", "uuid": f"u{i}",
             "timestamp": f"2026-11-01T10:00:{i % 60:02d}.000Z",
             "message": {"role": "user", "content": text or f"prompt number {i}"}}
    return json.dumps(entry, separators=(",", ":")).encode() + b"\n"


class StandIn:
    """``SearchIndex``'s contract as the brief gives it, in memory: complete lines kept
    per file, a cursor per file, a feed at another generation or not at the cursor
    starting the file over (and having to start at 0)."""

    def __init__(self) -> None:
        self.cursors: dict[tuple[str, bytes], tuple[int, int]] = {}
        self.lines: dict[tuple[str, bytes], list[bytes]] = {}
        self.feeds: list[tuple[str, bytes, int, int, int]] = []
        self.sessions: dict[tuple[str, str], dict[str, Any]] = {}
        self.deleted: set[tuple[str, bytes]] = set()

    def cursor(self, machine: str, path: bytes) -> tuple[int, int] | None:
        return self.cursors.get((machine, path))

    def feed(self, machine: str, path: bytes, gen: int, start: int, data: bytes) -> int:
        k = (machine, path)
        if self.cursors.get(k, (gen, 0)) != (gen, start):
            assert start == 0, "a feed that starts a file over must begin at 0"
            self.lines[k] = []
        end = data.rfind(b"\n") + 1
        self.lines.setdefault(k, []).extend(data[:end].splitlines(keepends=True))
        self.cursors[k] = (gen, start + end)
        self.feeds.append((machine, path, gen, start, len(data)))
        return end

    def set_session(self, machine: str, session: str,
                    fields: dict[str, str | float | None]) -> None:
        self.sessions[(machine, session)] = dict(fields)

    def mark_deleted(self, machine: str, path: bytes) -> None:
        self.deleted.add((machine, path))

    def files(self, machine: str) -> dict[bytes, bool]:
        return {p: (m, p) in self.deleted for m, p in self.cursors if m == machine}

    def commit(self) -> None:
        pass

    def text(self, machine: str, path: str) -> bytes:
        return b"".join(self.lines.get((machine, path.encode()), []))


class Logged(CountingStore):
    """A counting store that also records each GET (key, start, length)."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.gets: list[tuple[str, int, int | None]] = []

    def get(self, key: str, start: int = 0, length: int | None = None) -> bytes:
        self.gets.append((key, start, length))
        return super().get(key, start, length)

    def extent_gets(self) -> list[tuple[str, int, int | None]]:
        # An index is read by a suffix GET (negative start); extents at their offset.
        return [g for g in self.gets if g[1] >= 0 and ("/seg/" in g[0] or "/pack/" in g[0])]

    def reset(self) -> None:
        self.gets.clear()
        self.counts.calls.clear()
        self.counts.bytes_read = 0


class Other:
    """Machine ``m2``: its tree and a shipper into ``store``."""

    def __init__(self, tmp: Path, store: Store, crypto: Crypto | None = None) -> None:
        self.root = tmp / "m2"
        self.root.mkdir(parents=True, exist_ok=True)
        self.repo = Repository(store, "m2", crypto)
        self.state = State(tmp / "m2.db")
        self.shipper = Shipper(root=self.root, repo=self.repo, state=self.state,
                               selection=Selection())

    def ship(self, *paths: str) -> list[str]:
        return [layout.segment_key("m2", seq)
                for seq in self.shipper.ship([p.encode() for p in paths]).segments]


@pytest.fixture
def s3(seaweed: Seaweed, bucket: str) -> Store:
    return open_store(f"s3://{bucket}/backup", endpoint_url=seaweed.endpoint)


def test_indexed_then_only_new_segments_read(tmp_path: Path, s3: Store) -> None:
    logged = Logged(s3)
    other = Other(tmp_path, s3)
    write(other.root, A, b"".join(row(i) for i in range(200)))
    write(other.root, SUB, row(0, "a subagent looked at quokkas"))
    other.ship(A, SUB)
    ix = StandIn()
    reader = Repository(logged, "here")

    first = index_machine(reader, "m2", ix)
    assert ix.text("m2", A) == b"".join(row(i) for i in range(200))
    assert b"quokkas" in ix.text("m2", SUB)
    assert first.problems == [] and first.to_index == 2
    assert first.indexed_bytes == first.raw_bytes == (tmp_path / "m2" / A).stat().st_size + \
        (tmp_path / "m2" / SUB).stat().st_size
    assert ix.sessions[("m2", SID)]["project"] == "/home/u/app"
    assert ix.sessions[("m2", SID)]["title"] == "prompt number 0"

    write(other.root, A, b"".join(row(i, "a new wombat line") for i in range(200, 210)), "ab")
    [seg1] = other.ship(A)
    logged.reset()
    second = index_machine(reader, "m2", ix)
    assert ix.text("m2", A).endswith(row(209, "a new wombat line"))
    assert len(ix.text("m2", A).splitlines()) == 210
    # Only the new segment's frames were fetched; the first segment's index alone.
    got = logged.extent_gets()
    assert got and {k for k, _, _ in got} == {seg1}, logged.gets
    assert sum(length or 0 for _, _, length in got) <= s3.head(seg1).size  # type: ignore[union-attr]
    assert second.to_index == 1 and second.raw_bytes == 10 * len(row(200, "a new wombat line"))
    assert second.fetched_bytes == second.planned_bytes
    assert ix.feeds[-1][3] == first.raw_bytes - (tmp_path / "m2" / SUB).stat().st_size

    logged.reset()
    third = index_machine(reader, "m2", ix)
    assert third.to_index == 0 and logged.extent_gets() == []


def test_a_line_split_between_flushes_is_fed_whole(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    store = MemoryStore()
    other = Other(tmp_path, store)
    whole = row(1, "a line written in two flushes")
    write(other.root, A, row(0) + whole[:20])
    other.ship(A)
    write(other.root, A, whole[20:] + row(2), "ab")
    other.ship(A)
    write(other.root, A, row(3), "ab")
    other.ship(A)
    monkeypatch.setattr(remote, "WINDOW", 1)  # one extent per window
    ix = StandIn()
    r = index_machine(Repository(store, "here"), "m2", ix)
    assert ix.lines[("m2", A.encode())] == [row(0), whole, row(2), row(3)]
    assert len(ix.feeds) == 3 and r.indexed_bytes == r.raw_bytes


def test_a_rewritten_transcript_is_indexed_again_and_a_deleted_one_marked(
        tmp_path: Path) -> None:
    store = MemoryStore()
    other = Other(tmp_path, store)
    write(other.root, A, b"".join(row(i, "before the rewrite") for i in range(5)))
    write(other.root, B, row(0, "soon deleted", SID2))
    other.ship(A, B)
    ix = StandIn()
    reader = Repository(store, "here")
    index_machine(reader, "m2", ix)
    assert b"before the rewrite" in ix.text("m2", A)

    (other.root / A).unlink()  # a new inode, shorter: a new generation
    write(other.root, A, row(0, "after the rewrite"))
    (other.root / B).unlink()
    other.ship(A, B)
    r = index_machine(reader, "m2", ix)
    assert ix.text("m2", A) == row(0, "after the rewrite")
    assert ix.cursor("m2", A.encode())[0] > 0  # type: ignore[index]
    assert ("m2", B.encode()) in ix.deleted and ("m2", A.encode()) not in ix.deleted
    assert b"soon deleted" in ix.text("m2", B)  # still findable: it is in the backup
    assert r.deleted == 1


def test_encrypted_store(tmp_path: Path, s3: Store) -> None:
    crypto = init_encryption(s3, "a passphrase for the index test", n=CHEAP)
    other = Other(tmp_path, s3, crypto)
    write(other.root, A, row(0, "sealed platypus"))
    other.ship(A)
    ix = StandIn()
    r = index_machine(Repository(s3, "here", crypto), "m2", ix)
    assert ix.text("m2", A) == row(0, "sealed platypus") and r.problems == []
    # Without the key nothing is indexed, and it says why.
    with pytest.raises(Exception, match="encrypted"):
        index_machine(Repository(s3, "here"), "m2", StandIn())


def test_dry_run_fetches_no_extent(tmp_path: Path) -> None:
    logged = Logged(MemoryStore())
    other = Other(tmp_path, logged)
    write(other.root, A, b"".join(row(i) for i in range(50)))
    [seg0] = other.ship(A)
    logged.reset()
    seen: list[remote.RemoteIndexReport] = []
    ix = StandIn()
    r = index_machine(Repository(logged, "here"), "m2", ix, dry_run=True, on_plan=seen.append)
    assert seen == [r] and r.to_index == 1 and r.planned_objects == 1
    assert 0 < r.planned_bytes < logged.inner.head(seg0).size  # type: ignore[union-attr]
    assert logged.extent_gets() == [] and ix.feeds == [] and ix.sessions == {}
    done = index_machine(Repository(logged, "here"), "m2", ix)
    assert done.fetched_bytes == r.planned_bytes


def _entries(c: Craft, key: str) -> list[dict[str, Any]]:
    return list(c.index_doc(key)[2]["entries"])


def test_hostile_store_one_line_per_bad_object(tmp_path: Path) -> None:
    c = Craft(tmp_path / "store")
    m = good_machine(c, "evil")
    p1, p2 = m.sessions  # p1 spans seg 0 and seg 1; p2 is in seg 1 alone
    seg0 = f"machines/evil/seg/{0:016x}"
    seg1 = f"machines/evil/seg/{1:016x}"
    first = next(e for e in _entries(c, seg0) if "jsonl" in json.dumps(e))
    # A flipped byte in p1's first frame: p1 is not indexed, the other session is.
    blob = bytearray(c.store.get(seg0))
    blob[first["off"] + first["clen"] // 2] ^= 0x40
    c.put(seg0, bytes(blob))

    def huge(doc: dict[str, Any]) -> None:  # a frame of seg 1 claiming a terabyte
        for e in doc["entries"]:
            if p2 not in json.dumps(e):
                e["clen"] = 1 << 40
                e["end"] = e["start"] + (1 << 40)

    c.rewrite(seg1, huge)
    ix = StandIn()
    r = index_machine(Repository(c.store, "here"), "evil", ix)
    by_sid = {s: next(p for p in m.files if s in p) for s in m.sessions}
    assert ix.text("evil", by_sid[p2]) == m.files[by_sid[p2]]
    assert ix.text("evil", by_sid[p1]) == b""
    assert r.problems and all("machines/evil/seg/" in p for p in r.problems), r.problems


def test_an_index_bomb_is_a_line_and_the_rest_is_indexed(tmp_path: Path) -> None:
    from tests.hostile import index_bomb

    c = Craft(tmp_path / "store")
    m = good_machine(c, "bombed")
    index_bomb(c, "bombed", 2, 2 << 30)
    ix = StandIn()
    r = index_machine(Repository(c.store, "here"), "bombed", ix)
    for path, data in m.files.items():
        if path.endswith(".jsonl") and path.startswith("projects/"):
            assert ix.text("bombed", path) == data
    assert any("seg/0000000000000002" in p for p in r.problems), r.problems


def test_windows_are_bounded() -> None:
    from syncd.format.segment import Extent

    def x(start: int, end: int) -> tuple[str, Extent]:
        return "k", Extent(b"p", 1, start, end, start, end - start, "", 0o600, 0)

    exts = [x(i << 22, (i + 1) << 22) for i in range(10)]  # ten frames of 4 MiB
    runs = list(remote._windows(exts))
    assert all(sum(e.end - e.start for e in run) <= remote.WINDOW for _, run in runs)
    assert [e for _, run in runs for e in run] == [e for _, e in exts]


def _env(tmp: Path, store: Path) -> dict[str, str]:
    return {**os.environ, "HOME": str(tmp / "home"), "SYNCD_STORE": store.as_uri(),
            "SYNCD_MACHINE_ID": "here", "SYNCD_STATE_DIR": str(tmp / "state"),
            "SYNCD_SOURCE": str(tmp / "home" / ".claude"), "SYNCD_STORE_RETRY_DEADLINE": "2"}


def test_the_index_command(tmp_path: Path) -> None:
    pytest.importorskip("syncd.search.index")
    from syncd.search.index import FILE_NAME, SearchIndex

    other = Other(tmp_path, LocalStore(tmp_path / "store"))
    write(other.root, A, row(0, "the wombat burrows") + row(1))
    other.ship(A)
    env = _env(tmp_path, tmp_path / "store")
    r = syncd(env, "index", "--machine", "m2", "--dry-run", "--json")
    assert r.returncode == 0, r.stderr
    [plan] = json.loads(r.stdout)
    assert plan["to_index"] == 1 and plan["planned_bytes"] > 0 and plan["indexed_bytes"] == 0
    assert "m2: 1 of 1 transcripts to index" in r.stderr
    db = tmp_path / "state" / FILE_NAME
    ix = SearchIndex.open(db)
    try:
        assert ix.cursor("m2", A.encode()) is None
    finally:
        ix.close()

    r = syncd(env, "index", "--all")
    assert r.returncode == 0, r.stderr
    assert "m2: 1 of 1 transcripts to index" in r.stdout and "m2: indexed" in r.stdout
    ix = SearchIndex.open(db)
    try:
        assert ix.cursor("m2", A.encode()) == (1, (other.root / A).stat().st_size)
        found = ix.db.execute("SELECT s.machine, s.session FROM text JOIN docs d ON "
                              "d.id = text.rowid JOIN sessions s ON s.id = d.sess "
                              "WHERE text MATCH 'wombat'").fetchall()
        assert set(found) == {("m2", SID)} and len(found) == 2  # its line and its title
    finally:
        ix.close()
    r = syncd(env, "index", "--machine", "m2")
    assert r.returncode == 0 and "all indexed already: nothing to download" in r.stdout

    assert "name the machines" in one_line(syncd(env, "index"), 2)
    assert "is this machine's" in one_line(syncd(env, "index", "--machine", "here"), 2)
    assert "no backup for machine 'nope'" in one_line(
        syncd(env, "index", "--machine", "nope"), 1)


def _head(store: Store, machine: str, sessions: list[tuple[str, str, dict[str, str]]],
          deleted: float | None = None) -> None:
    from syncd.format.head import Head, HeadSession

    listed = [HeadSession(f"projects/-home-u-{proj}/{sid}.jsonl".encode(), 1, 100,
                          deleted, {"cwd": f"/home/u/{proj}", **f})
              for sid, proj, f in sessions]
    Repository(store, machine).write_head(Head(machine, 2e9, 0, 2e9, {}, {}, listed))


def test_catalogs_of_machines_not_indexed_are_searched_from_their_heads() -> None:
    pytest.importorskip("syncd.search.query")
    from syncd.search.catalogs import search_catalogs
    from syncd.search.query import BadQuery

    logged = Logged(MemoryStore())
    _head(logged, "m2", [(SID, "app", {"ai_title": "Refactor the quokka parser",
                                       "last_activity": "2026-11-01T10:00:00.000Z"}),
                         (SID2, "lib", {"first_prompt": "why is the build slow"})])
    _head(logged, "m3", [(SID, "app", {"ai_title": "quokka in m3"})])
    _head(logged, "indexed", [(SID2, "app", {"ai_title": "quokka indexed already"})])
    logged.reset()
    problems: list[str] = []
    hits = search_catalogs(Repository(logged, "here"), "quokka", skip={"indexed"},
                           problems=problems)
    assert sorted((h.machine, h.session) for h in hits) == [("m2", SID), ("m3", SID)]
    assert hits[0].score <= hits[1].score  # best first (BM25: lower is better)
    top = next(h for h in hits if h.machine == "m2")
    assert top.catalog_only and top.title == "Refactor the quokka parser"
    assert top.project == "/home/u/app" and top.last_activity == 1793527200.0
    assert ("quokka", True) in top.snippet and problems == []
    # The heads alone were read: one GET each, no segment, no index.
    assert {k for k, _, _ in logged.gets} == {f"machines/{m}/head" for m in ("m2", "m3")}

    assert [h.session for h in search_catalogs(Repository(logged, "here"), "build AND slo*",
                                               machine="m2")] == [SID2]
    assert search_catalogs(Repository(logged, "here"), "quokka NOT parser",
                           skip={"m3", "indexed"}) == []
    assert [h.machine for h in search_catalogs(Repository(logged, "here"), "quokka",
                                               project="/home/u/app", since=1.7e9)] \
        == ["m2"]  # m3's session has no activity time: not since anything
    with pytest.raises(BadQuery, match="cannot parse the query"):
        search_catalogs(Repository(logged, "here"), '"unclosed AND')


def test_a_cut_tail_shipped_as_a_copy_is_indexed_through_its_parts(tmp_path: Path) -> None:
    from tests.test_copies import cut_tail
    from tests.test_copies import rows as big_rows

    store = MemoryStore()
    other = Other(tmp_path, store)
    f = write(other.root, A, big_rows(0, 300))
    other.ship(A)
    ix = StandIn()
    reader = Repository(store, "here")
    index_machine(reader, "m2", ix)
    cut_tail(f, 290, big_rows(1000, 1003))  # Claude withdrawing streamed rows
    [seg1] = other.ship(A)
    assert reader.for_machine("m2").read_index(seg1).copies, "shipped as a copy"
    r = index_machine(reader, "m2", ix)
    assert ix.text("m2", A) == f.read_bytes() and r.problems == []
    fresh = StandIn()  # and from nothing: the copy's parts are frames of the first segment
    index_machine(reader, "m2", fresh)
    assert fresh.text("m2", A) == f.read_bytes()


def test_a_session_moved_to_another_folder_is_not_marked_deleted(tmp_path: Path) -> None:
    pytest.importorskip("syncd.search.index")
    from syncd.search.index import SearchIndex

    store = MemoryStore()
    other = Other(tmp_path, store)
    write(other.root, A, row(0, "the echidna plan"))
    other.ship(A)
    ix = SearchIndex.open(tmp_path / "search.db")
    reader = Repository(store, "here")
    index_machine(reader, "m2", ix)
    moved = f"projects/-home-u-lib/{SID}.jsonl"  # Claude's /cd: the transcript moves
    write(other.root, moved, (other.root / A).read_bytes() + row(1))
    (other.root / A).unlink()
    other.ship(A, moved)
    index_machine(reader, "m2", ix)
    from syncd.search.catalogs import indexed_machines

    assert indexed_machines(ix) == {"m2"}
    [(deleted,)] = ix.db.execute("SELECT deleted FROM sessions WHERE machine='m2' AND "
                                 "session=?", (SID,)).fetchall()
    assert not deleted
    assert ix.cursor("m2", moved.encode())[1] == (other.root / moved).stat().st_size  # type: ignore[index]
    ix.close()


def test_index_all_of_a_store_of_bombs(tmp_path: Path) -> None:
    """Every kind of hostile object at once (tests/hostile.py): the good machines are
    indexed whole, each bad object is a line naming its machine, and the peak RSS stays
    that of indexing a clean store."""
    pytest.importorskip("syncd.search.index")
    from syncd.search.index import FILE_NAME, SearchIndex
    from tests.hostile import every_bomb, rss_bound, run_syncd, syncd_env

    good_machine(Craft(tmp_path / "clean"), "alpha")
    clean = run_syncd(("index", "--all"), syncd_env(
        tmp_path / "h1", tmp_path / "clean", extra={"SYNCD_STATE_DIR": str(tmp_path / "s1")}))
    assert clean.rc == 0, clean.describe()
    good = every_bomb(Craft(tmp_path / "store"))
    r = run_syncd(("index", "--all"), syncd_env(
        tmp_path / "h2", tmp_path / "store", extra={"SYNCD_STATE_DIR": str(tmp_path / "s2")}))
    assert r.rc == 1, r.describe()
    assert r.maxrss <= rss_bound(clean), r.describe()
    ix = SearchIndex.open(tmp_path / "s2" / FILE_NAME)
    try:
        for name, m in good.items():
            for path, data in m.files.items():
                if path.startswith("projects/") and path.endswith(".jsonl"):
                    assert ix.cursor(name, path.encode()) == (1, len(data)), (name, path)
    finally:
        ix.close()
    said = [ln for ln in r.err_lines if ln.startswith("syncd: b-")]
    for bad in ("b-index", "b-index10", "b-manifest", "b-group", "b-noise", "b-trailer",
                "b-all"):
        assert any(ln.startswith(f"syncd: {bad}: ") for ln in said), (bad, r.describe())


def test_search_shows_a_machine_not_indexed_here_by_its_catalog(tmp_path: Path) -> None:
    other = Other(tmp_path, LocalStore(tmp_path / "store"))
    write(other.root, A, row(0, "the wombat burrows") + row(1))
    other.ship(A)
    env = _env(tmp_path, tmp_path / "store")
    (tmp_path / "home" / ".claude").mkdir(parents=True)

    r = syncd(env, "search", "wombat", "--json")
    assert r.returncode == 0, r.stderr
    [hit] = json.loads(r.stdout)
    assert (hit["machine"], hit["session"], hit["catalog_only"]) == ("m2", SID, True)
    r = syncd(env, "search", "wombat", "--local", "--json")
    assert r.returncode == 0 and json.loads(r.stdout) == []

    syncd(env, "index", "--machine", "m2")  # its full text here now: no catalog hit twice
    r = syncd(env, "search", "wombat", "--json")
    [hit] = json.loads(r.stdout)
    assert (hit["machine"], hit["catalog_only"]) == ("m2", False)

    env["SYNCD_STORE"] = (tmp_path / "gone").as_uri()
    r = syncd(env, "search", "wombat")
    assert r.returncode == 0 and "were not searched" in r.stderr and SID in r.stdout


def test_a_session_another_machine_imported_keeps_its_origin() -> None:
    # The laptop's copy of a desk session (follow) is the desk's session: a hit says so.
    from syncd.format.catalog import Origin, Session

    came = Origin("alice.desk", f"projects/-home-d-app/{SID}.jsonl", (("/home/d", "/home/u"),))
    s = Session(SID, "m2", A.encode(), fields={"cwd": "/home/u/app", "origin": came.encode()})
    assert remote.catalog_fields(s)["origin"] == "alice.desk"
    forged = Session(SID, "m2", A.encode(), fields={"cwd": "/home/u/app", "origin": "{x"})
    assert remote.catalog_fields(forged)["origin"] is None
    assert remote.catalog_fields(Session(SID, "m2", A.encode()))["origin"] is None


def test_index_all_leaves_out_the_machines_followed_here(tmp_path: Path) -> None:
    # A followed machine's sessions are indexed as follow imports them (no download of
    # its own): --all fetching its text again would hold every session twice.
    pytest.importorskip("syncd.search.index")
    other = Other(tmp_path, LocalStore(tmp_path / "store"))
    write(other.root, A, row(0, "the wombat burrows"))
    other.ship(A)
    env = {**_env(tmp_path, tmp_path / "store"), "SYNCD_FOLLOW": '["m2"]'}
    r = syncd(env, "index", "--all")
    assert r.returncode == 0, r.stderr
    assert "m2: indexed" not in r.stdout and "to download" not in r.stdout, r.stdout
    assert "m2: followed here" in r.stderr, r.stderr
    r = syncd(env, "index", "--machine", "m2")  # named: as asked
    assert r.returncode == 0 and "m2: indexed" in r.stdout, r.stderr
    # With follow = "*": those whose sessions follow brought here.
    from syncd.search.index import FILE_NAME, SearchIndex

    env["SYNCD_FOLLOW"] = '["*"]'
    ix = SearchIndex.open(tmp_path / "state" / FILE_NAME)
    ix.set_session("here", SID2, {"title": "imported", "origin": "m2"})
    ix.commit()
    ix.close()
    r = syncd(env, "index", "--all")
    assert r.returncode == 0 and "m2: followed here" in r.stderr, r.stderr

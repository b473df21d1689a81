"""Golden stores: stores written once by an earlier version's code (tests/golden, built by
tests/golden/make.py), which today's reader must still restore byte for byte, list and
verify. docs/FORMAT.md: a newer reader reads every older store.

Each store is copied to a temporary directory first: the fixtures are never written to.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from syncd.archive.verify import verify
from syncd.format.catalog import is_session_id
from syncd.format.delta import manifest_points
from syncd.format.segment import Extent
from syncd.repository import Repository
from syncd.restore.listing import load_all, sessions_table
from syncd.restore.restorer import RestoreOptions, restore
from syncd.security.crypto import Crypto, describe
from syncd.security.keys import key_files, read_key_file, unlock
from syncd.store import LocalStore, Store, layout
from tests.readers import read_extents, read_groups, read_index, read_manifest

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden"
MACHINE = "golden-laptop"
HOME = "/home/golden"  # machine.json's home; mapped to itself, so restores are byte-exact
PASSPHRASE = "golden fixture passphrase, not a secret 4b1d"
CHEAP_SCRYPT_N = 1 << 12  # the encrypted store's key file: unlocking costs ~5 ms
T0 = 1_767_258_000.0  # 2026-01-01T09:00:00Z: flush k of the story is at T0 + k * STEP
STEP = 600.0
STORES = {"v1-plain": False, "v2-encrypted": True, "v1-deltas": False,
          "v1-copies": False}  # name → encrypted


@dataclass(frozen=True)
class Point:
    name: str
    flush: int  # the last flush of the story it holds
    at: float | None
    what: str


# The stores whose every compaction wrote a manifest (v1-plain, v2-encrypted).
MANIFEST_POINTS = (
    Point("newest", 6, None, "the newest manifest (seq 4) and the two segments after it"),
    Point("seg5", 5, T0 + 5.5 * STEP, "the newest manifest and the first segment after it"),
    Point("snap4", 4, T0 + 4.5 * STEP, "the newest manifest alone"),
    Point("snap2", 2, T0 + 2.5 * STEP, "the older manifest (seq 2), its bytes found through "
          "the newest one (retained generations, a tombstone)"),
)
# v1-deltas: manifest seq 2 (own points 0-2), the delta of segments 3-4, manifest seq 6
# (own points 5-6, built on the delta); no segment. Points inside a delta or a manifest's
# own points are trees the older stores cannot give.
DELTA_POINTS = (
    Point("newest", 6, None, "the newest manifest (seq 6) alone"),
    Point("own5", 5, T0 + 5.5 * STEP, "inside the newest manifest's own points (flushes "
          "5-6): the older manifest, the delta, then the first of those points"),
    Point("delta4", 4, T0 + 4.5 * STEP, "the older manifest (seq 2) and the whole delta of "
          "segments 3-4, its bytes found through the newest manifest and the delta"),
    Point("delta3", 3, T0 + 3.5 * STEP, "inside the delta: the older manifest and the "
          "delta's first point (flush 3; the torn line's first half)"),
    Point("snap2", 2, T0 + 2.5 * STEP, "the older manifest (seq 2), its bytes found through "
          "the newest one (retained generations, a tombstone)"),
    Point("own1", 1, T0 + 1.5 * STEP, "inside the older manifest's own points (flushes "
          "0-2): no manifest at or before it, its first two points"),
)
# v1-copies: manifest seq 2, the delta of segments 3-5 (flush 5 cut a transcript: a copy),
# manifest seq 7 (own points 6-7; the cut generation's bytes partly parts of the delta's
# frames), segments 8-10 (a cut, a rename over a file, a cut alone, a moved session).
COPIES_POINTS = (
    Point("newest", 10, None, "the newest manifest (seq 7) and segments 8-10: the session "
          "moved to another project folder (copies of a cut generation and of a copy "
          "alone), its old files not restored"),
    Point("seg9", 9, T0 + 9.5 * STEP, "a subagent transcript cut with nothing after it (a "
          "copy alone, of a generation the manifest locates)"),
    Point("seg8", 8, T0 + 8.5 * STEP, "a transcript cut and written again (a copy, then new "
          "bytes) and one renamed over by a file that continues it"),
    Point("snap7", 7, T0 + 7.5 * STEP, "the newest manifest alone (parts of the delta's "
          "frames)"),
    Point("own6", 6, T0 + 6.5 * STEP, "inside the newest manifest's own points (flushes "
          "6-7): the older manifest, the delta, then the first of those points"),
    Point("delta5", 5, T0 + 5.5 * STEP, "the older manifest and the whole delta, whose "
          "last point is the cut (the delta carries its copy)"),
    Point("delta4", 4, T0 + 4.5 * STEP, "inside the delta, before the cut: the generation "
          "the copy is of"),
    Point("snap2", 2, T0 + 2.5 * STEP, "the older manifest (seq 2)"),
)
POINTS = {"v1-plain": MANIFEST_POINTS, "v2-encrypted": MANIFEST_POINTS,
          "v1-deltas": DELTA_POINTS, "v1-copies": COPIES_POINTS}  # store → points restored
CASES = [pytest.param(s, p, id=f"{s}-{p.name}") for s in STORES for p in POINTS[s]]


def open_golden(path: Path, encrypted: bool) -> tuple[Store, Crypto | None]:
    """A golden store (a copy of it) and its unlocked key when it is encrypted."""
    store = LocalStore(path)
    if not encrypted:
        assert key_files(store) == [], "a plain golden store has key files"
        return store, None
    return store, unlock(store, PASSPHRASE)


def restored_files(root: Path) -> dict[bytes, tuple[str, int]]:
    """Every file under ``root``: relative path → (sha256, size)."""
    out = {}
    base = os.fsencode(root)
    for dirpath, _dirs, names in os.walk(base):
        for name in names:
            full = os.path.join(dirpath, name)
            with open(full, "rb") as f:
                data = f.read()
            out[os.path.relpath(full, base)] = (hashlib.sha256(data).hexdigest(), len(data))
    return out


def session_titles(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """What the expected files say of each session, from `syncd sessions` rows."""
    return {r["session_id"]: {"title": r["title"], "project": r["project"],
                              "deleted": r["deleted_locally_at"] is not None} for r in rows}


def expected(store: str, point: Point) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((GOLDEN / "expected" / store / f"{point.name}.json")
                                     .read_text())
    assert (doc["store"], doc["point"], doc["at"], doc["machine"], doc["home"]) == (
        store, point.name, point.at, MACHINE, HOME)
    return doc


def expected_files(doc: dict[str, Any]) -> dict[bytes, tuple[str, int]]:
    out = {}
    for f in doc["files"]:
        path = base64.b64decode(f["path_b64"]) if "path_b64" in f else f["path"].encode()
        out[path] = (f["sha256"], f["size"])
    return out


@pytest.fixture
def copy(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    """A copy of the golden store named by the test's ``store`` parameter."""
    name: str = request.node.callspec.params["store"]
    out = tmp_path / "store"
    shutil.copytree(GOLDEN / name, out)
    return out


# -- restore, listing, verify ------------------------------------------------------------------

@pytest.mark.parametrize(("store", "point"), CASES)
def test_restores_byte_for_byte(store: str, point: Point, copy: Path, tmp_path: Path) -> None:
    s, crypto = open_golden(copy, STORES[store])
    want = expected_files(expected(store, point))
    out = tmp_path / "out"
    report = restore(Repository(s, MACHINE, crypto),
                     RestoreOptions(target=out, at=point.at, local_home=HOME))
    assert report.errors == []
    assert {a.action for a in report.actions} == {"create"}
    got = restored_files(out)
    assert sorted(set(got) ^ set(want)) == [], "files missing from or extra in the restore"
    assert [p for p in want if got[p] != want[p]] == [], "files restored with other bytes"


@pytest.mark.parametrize(("store", "point"), CASES)
def test_sessions_are_listed_with_their_titles(store: str, point: Point, copy: Path,
                                               tmp_path: Path) -> None:
    s, crypto = open_golden(copy, STORES[store])
    backups, problems = load_all(Repository(s, "", crypto), None, point.at)
    assert problems == []
    assert [b.machine for b in backups] == [MACHINE]
    assert backups[0].info.get("home") == HOME
    rows = sessions_table(backups, tmp_path / "no-local-tree")
    want = {d["session_id"]: {k: v for k, v in d.items() if k != "session_id"}
            for d in expected(store, point)["sessions"]}
    assert session_titles(rows) == want
    assert all(is_session_id(r["session_id"]) and not r["local"] for r in rows)


# What each store holds besides packs, a dictionary and machine.json (and, encrypted, a key
# file): snapshot manifests, deltas, segments.
OBJECTS = {"v1-plain": {"snap": 2, "delta": 0, "seg": 2},
           "v2-encrypted": {"snap": 2, "delta": 0, "seg": 2},
           "v1-deltas": {"snap": 2, "delta": 1, "seg": 0},
           "v1-copies": {"snap": 2, "delta": 1, "seg": 3}}
# The points of each manifest (by seq) and delta (by key) as (lo, seqs); None: a manifest
# written before manifests carried points.
OWN_POINTS: dict[str, dict[int | str, tuple[int, list[int]] | None]] = {
    "v1-plain": {2: None, 4: None},
    "v2-encrypted": {2: None, 4: None},
    "v1-deltas": {2: (0, [0, 1, 2]), 6: (5, [5, 6]),
                  f"machines/{MACHINE}/delta/{3:016x}-{4:016x}": (3, [3, 4])},
    "v1-copies": {2: (0, [0, 1, 2]), 7: (6, [6, 7]),
                  f"machines/{MACHINE}/delta/{3:016x}-{5:016x}": (3, [3, 4, 5])},
}


@pytest.mark.parametrize("store", sorted(STORES))
def test_verify_finds_no_problem(store: str, copy: Path) -> None:
    s, crypto = open_golden(copy, STORES[store])
    rep = verify(Repository(s, MACHINE, crypto), read_data=100.0)
    assert rep.problems == []
    want = OBJECTS[store]
    assert (rep.snapshots, rep.deltas, rep.segments, rep.unreferenced) == (
        want["snap"], want["delta"], want["seg"], [])
    assert rep.packs >= 1 and rep.extents_read > 0 and rep.sampled_share == 1.0


# -- the objects themselves ---------------------------------------------------------------------

def _format_versions() -> tuple[int, int]:
    """The versions docs/FORMAT.md names for plain and sealed stores."""
    text = (ROOT / "docs" / "FORMAT.md").read_text()
    m = re.search(r"Format versions: \*\*(\d+)\*\* \(plain\) and \*\*(\d+)\*\* \(sealed", text)
    assert m, "docs/FORMAT.md no longer names its format versions where it did"
    return int(m.group(1)), int(m.group(2))


# As docs/FORMAT.md draws them: a segment container's header and trailer, a sealed box's header.
HEADER = struct.Struct("<8sHHI")
TRAILER = struct.Struct("<QI4x32s8s")


@pytest.mark.parametrize("store", sorted(STORES))
def test_objects_parse_with_todays_reader(store: str, copy: Path) -> None:
    """Every object is one the format names, parses with today's reader primitives, holds
    frames that decompress to their checksums, and carries the version FORMAT.md gives
    its kind of store (1 plain, 2 sealed)."""
    encrypted = STORES[store]
    s, crypto = open_golden(copy, encrypted)
    plain_v, sealed_v = _format_versions()
    version = sealed_v if encrypted else plain_v
    prefix = f"machines/{MACHINE}/"
    kinds: dict[str, list[str]] = {}
    points: dict[int | str, tuple[int, list[int]] | None] = {}
    for info in s.list(""):
        key = info.key
        m = re.fullmatch(r"keys/[0-9a-f]{16}|machines/[^/]+/(machine\.json|seg|pack|snap|delta"
                         r"|dict)(/.+)?", key)
        assert m and key.startswith((prefix, "keys/")), f"unknown object {key}"
        kind = "keys" if key.startswith("keys/") else key[len(prefix):].split("/")[0]
        kinds.setdefault(kind, []).append(key)
        raw = (copy / key).read_bytes()
        if kind in ("seg", "pack", "snap", "delta"):
            magic, v, flags, reserved = HEADER.unpack_from(raw)
            assert (magic, v, flags, reserved) == (b"SYNCDSEG", version, int(encrypted), 0), key
            end = TRAILER.unpack_from(raw, len(raw) - TRAILER.size)[3]
            assert end == (b"SYNCDEN2" if encrypted else b"SYNCDEND"), key
            ix = read_index(s, key, crypto=crypto)
            assert ix.machine == MACHINE
            assert ix.extra.get("kind") == {"seg": None, "pack": "pack", "snap": "snapshot",
                                            "delta": "delta"}[kind]
            got = list(read_extents(s, key, ix.extents, crypto))
            assert len(got) == len(ix.extents) > 0, key
        if kind == "snap":
            man = read_manifest(s, key, crypto)
            assert read_groups(s, man, None, crypto), key
            own = manifest_points(man)
            points[man.seq] = None if own is None else (own[0], [p.seq for p in own[1]])
        if kind == "delta":
            d = Repository(s, MACHINE, crypto).read_delta(key)
            assert layout.delta_range(key) == (d.lo, d.hi) and d.index.seq == d.hi, key
            points[key] = (d.lo, [p.seq for p in d.points])
            assert all(p.changes for p in d.points), key  # every flush changed something
        if kind == "dict":
            assert is_box(raw) == encrypted
            assert Repository(s, MACHINE, crypto).dictionary(key.rsplit("/", 1)[1]).data
        if kind == "machine.json":
            assert is_box(raw) == encrypted
            if encrypted:
                assert HEADER.unpack_from(raw)[1:] == (sealed_v, 1, 0)
            info_doc = Repository(s, MACHINE, crypto).info()
            assert (info_doc["format"], info_doc["home"], info_doc["hostname"]) == (
                version, HOME, MACHINE)
        if kind == "keys":
            kf = describe(read_key_file(s, info), key)
            assert crypto is not None and (kf.n, kf.master) == (CHEAP_SCRYPT_N,
                                                                crypto.fingerprint)
    counts = {k: len(v) for k, v in kinds.items()}
    assert counts.pop("keys", 0) == (1 if encrypted else 0)
    assert counts.pop("pack") >= 1
    assert counts == {"machine.json": 1, "dict": 1,
                      **{k: n for k, n in OBJECTS[store].items() if n}}
    assert points == OWN_POINTS[store]
    # The newest manifest locates every byte any point needs: each extent it names (in a
    # pack or a delta) decompresses, as named there, to its checksum.
    newest = read_manifest(s, max(kinds["snap"]), crypto)
    named: dict[str, list[Extent]] = {}
    for g in read_groups(s, newest, None, crypto).values():
        for e in g.entries:
            for key, x in e.extents:
                named.setdefault(key, []).append(x)
    assert set(named) <= set(kinds["pack"] + kinds.get("delta", [])), "it names other objects"
    for key, exts in named.items():
        assert len(list(read_extents(s, key, exts, crypto))) == len(exts), key
    # The segments after the last compaction and the deltas use the trained dictionary, by
    # name.
    dict_id = kinds["dict"][0].rsplit("/", 1)[1]
    for key in kinds.get("seg", []) + kinds.get("delta", []):
        assert dict_id in {e.dict_id for e in read_index(s, key, crypto=crypto).extents}, key


def is_box(raw: bytes) -> bool:
    return raw.startswith(b"SYNCDBOX")


# What a store written after copies came holds of them (tests/golden/README.md).
COPY_KINDS = {"v1-copies": {"cut", "cut alone", "move", "delta", "parts"}}


def copy_kinds(store: Store, crypto: Crypto | None = None) -> set[str]:
    """The kinds of copy ``store`` holds: a segment with a cut (a copy of its own path,
    then new bytes of the generation), one with a cut alone (a copy and no bytes of the
    generation), one with a move (copies from two other paths that it tombstones, new
    bytes after one), a delta that carries copies, a manifest with parts of frames."""
    repo = Repository(store, MACHINE, crypto)
    found = set()
    for key, _ in repo.segments():
        ix = read_index(store, key, crypto=crypto)
        after = {(x.path, x.gen, x.start) for x in ix.extents}
        gen_of = {(x.path, x.gen) for x in ix.extents}
        for c in ix.copies:
            if c.src == c.path and c.at == 0 and c.src_gen < c.gen:
                found.add("cut" if (c.path, c.gen, c.stop) in after else
                          "cut alone" if (c.path, c.gen) not in gen_of else "?")
        gone = {(t.path, t.gen) for t in ix.tombstones}
        moved = [c for c in ix.copies if c.src != c.path and (c.src, c.src_gen) in gone]
        if len(moved) >= 2 and any((c.path, c.gen, c.stop) in after for c in moved):
            found.add("move")
    for _, _, key, _ in repo.deltas():
        if repo.read_delta(key).index.copies:
            found.add("delta")
    for _, _, key in repo.snapshots():
        groups = read_groups(store, read_manifest(store, key, crypto), None, crypto)
        if any(x.frame for g in groups.values() for e in g.entries for _, x in e.extents):
            found.add("parts")
    return found


@pytest.mark.parametrize("store", sorted(COPY_KINDS))
def test_the_copies_are_in_the_store(store: str, copy: Path) -> None:
    s, crypto = open_golden(copy, STORES[store])
    assert copy_kinds(s, crypto) == COPY_KINDS[store]


# -- the fixtures --------------------------------------------------------------------------------

def test_every_golden_store_is_tested_and_small() -> None:
    stores = {p.name for p in GOLDEN.iterdir() if p.is_dir()} - {"expected", "__pycache__"}
    assert stores == set(STORES)
    assert {p.name for p in (GOLDEN / "expected").iterdir()} == set(STORES)
    for name in STORES:
        assert sorted(p.name for p in (GOLDEN / "expected" / name).iterdir()) == sorted(
            f"{p.name}.json" for p in POINTS[name])
    docs = [expected(s, p) for s in STORES for p in POINTS[s]]
    # What the fixtures cover: a name that is not UTF-8, an empty file, deleted sessions.
    assert all(any("path_b64" in f for f in d["files"]) for d in docs)
    assert all(any(f["size"] == 0 for f in d["files"]) for d in docs)
    assert any(s["deleted"] for d in docs for s in d["sessions"])
    size = sum(p.stat().st_size for p in GOLDEN.rglob("*") if p.is_file()
               and "__pycache__" not in p.parts)
    assert size < 1 << 20, f"tests/golden holds {size} bytes"

"""Compaction: segments folded into packs and snapshot manifests, and every way back out.

Round trips (plain, encrypted, on SeaweedFS), later segments on top of a snapshot, pack
merging, generations and point-in-time restore, tombstone expiry, dry runs, damaged
packs, kill -9 before every store write, the compaction lock, a shipper that lost its
state, and a one-session load that reads only that session's groups.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from syncd.archive import compact as compact_module
from syncd.archive.compact import CompactOptions, compact
from syncd.archive.options import acknowledged_seq
from syncd.backup.ship import Shipper
from syncd.backup.state import State
from syncd.claude import Selection
from syncd.errors import CompactError, CryptoError, FormatError, RestoreError
from syncd.format.segment import END_MAGIC_SEALED, check_header
from syncd.format.snapshot import Entry, Manifest, current
from syncd.repository import Repository
from syncd.restore.restorer import RestoreOptions, restore, restore_tree
from syncd.security.crypto import Crypto, new_master
from syncd.security.lock import ProcessLock
from syncd.store import LocalStore, MemoryStore, ObjectInfo, Store, open_store
from syncd.store.layout import segment_key
from syncd.view import load_backup
from tests.faultkit import make_settings
from tests.helpers import restore_own, shipper, tree_bytes, write
from tests.readers import list_snapshots, read_groups, read_index, read_manifest
from tests.seaweed import Seaweed

ROOT = Path(__file__).resolve().parent.parent
M = "m1"
SA = "aaaaaaaa-0000-4000-8000-000000000001"
SB = "bbbbbbbb-0000-4000-8000-000000000002"
APP = "projects/-home-u-app"
LIB = "projects/-home-u-lib"
TA = f"{APP}/{SA}.jsonl"
TB = f"{LIB}/{SB}.jsonl"
SUB = f"{APP}/{SA}/subagents/agent-a1.jsonl"
HIST = "history.jsonl"
TODO = f"todos/{SA}-agent-{SA}.json"
FH = f"file-history/{SA}/0123abcdef@v1"
PLAN = "plans/empty.md"
NOTE = f"{APP}/memory/notes.md"
T0 = 1_750_000_000.0


class Clock:
    """The shipper's clock: segment and tombstone times are whatever the test sets."""

    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def line(sid: str, i: int, size: int = 300, cwd: str = "/home/u/app") -> bytes:
    """One transcript line; its text is random hex, so frames do not shrink to nothing."""
    text = random.Random(f"{sid}:{i}:{size}").randbytes(size // 2).hex()
    return json.dumps({"type": "user" if i % 2 == 0 else "assistant", "sessionId": sid,
                       "cwd": cwd, "uuid": f"{i:08x}", "message": {"content": text}}
                      ).encode() + b"\n"


def history(sid: str, i: int) -> bytes:
    return json.dumps({"display": f"prompt {i}", "project": "/home/u/app",
                       "sessionId": sid}).encode() + b"\n"


def make_shipper(src: Path, store: Store, state: Path, clock: Clock | None = None,
                 crypto: Crypto | None = None) -> Shipper:
    return Shipper(root=src, repo=Repository(store, M, crypto), state=State(state),
                   selection=Selection(), clock=clock or Clock())


def ship_all(sh: Shipper, src: Path, *gone: str) -> None:
    """Ship every file of the tree (and the given deleted paths); one segment at least."""
    before = sh.state.next_seq
    sh.ship([*tree_bytes(src), *(g.encode() for g in gone)])
    assert sh.state.next_seq > before, "the flush shipped nothing"


def three_flushes(src: Path, sh: Shipper) -> None:
    """A tree grown over three flushes: new files, appends, more new files."""
    write(src, TA, line(SA, 0) + line(SA, 1))
    write(src, HIST, history(SA, 0))
    write(src, TODO, b'[{"content":"first","status":"pending"}]')
    ship_all(sh, src)
    write(src, TA, line(SA, 2), "ab")
    write(src, TB, line(SB, 0, cwd="/home/u/lib"))
    write(src, PLAN, b"")
    ship_all(sh, src)
    write(src, SUB, line(SA, 100) * 3)
    write(src, FH, b"the file as it was before the edit\n" * 20)
    write(src, HIST, history(SB, 1), "ab")
    ship_all(sh, src)


# A compaction that writes a manifest (not a delta) whatever the chain after the newest.
REBASE = CompactOptions(max_chain=0)


def keys(store: Store, kind: str) -> list[str]:
    return [i.key for i in store.list(f"machines/{M}/{kind}/")]


def newest(store: Store, crypto: Crypto | None = None) -> Manifest:
    return read_manifest(store, current(list_snapshots(store, M))[-1][2], crypto)


def entries(store: Store, m: Manifest, crypto: Crypto | None = None) -> list[Entry]:
    return [e for g in read_groups(store, m, None, crypto).values() for e in g.entries]


def assert_restores(store: Store, src: Path | dict[bytes, bytes], out: Path,
                    crypto: Crypto | None = None, at: float | None = None) -> None:
    """A restore into the empty ``out`` is byte-identical to ``src`` and reports nothing."""
    want = tree_bytes(src) if isinstance(src, Path) else src
    r = restore(Repository(store, M, crypto), RestoreOptions(target=out, at=at, local_machine=M))
    assert r.errors == []
    assert tree_bytes(out) == want


def assert_compacted(store: Store) -> Manifest:
    """No segment left, and exactly the packs the newest manifest references."""
    assert keys(store, "seg") == []
    m = newest(store)
    assert sorted(keys(store, "pack")) == sorted(k for k in m.objects if "/pack/" in k)
    assert all("/pack/" in k for k in m.objects)
    seqs = [s for s, _, _ in list_snapshots(store, M)]
    assert len(seqs) == len(set(seqs)), "a superseded manifest revision was left behind"
    return m


# -- round trips -------------------------------------------------------------------

def test_round_trip_through_compaction(tmp_path: Path) -> None:
    src, store = tmp_path / "src", MemoryStore()
    three_flushes(src, shipper(src, store, tmp_path / "st.db"))
    segs = keys(store, "seg")
    assert len(segs) == 3

    rep = compact(Repository(store, M))

    assert rep.errors == [] and rep.segments == 3
    assert rep.snapshot == f"machines/{M}/snap/{2:016x}-0000"
    assert [k for k, _ in rep.packs_written] == keys(store, "pack")
    assert sorted(rep.deleted) == segs
    assert keys(store, "seg") == []
    assert len(keys(store, "pack")) == 1 and keys(store, "snap") == [rep.snapshot]
    m = assert_compacted(store)
    assert (m.seq, m.rev) == (2, 0)
    assert_restores(store, src, tmp_path / "out")
    assert (tmp_path / "out" / PLAN).read_bytes() == b""  # the empty file too


def test_appends_after_compaction_then_a_second_compaction_merges(tmp_path: Path) -> None:
    src, store = tmp_path / "src", MemoryStore()
    sh = shipper(src, store, tmp_path / "st.db")
    three_flushes(src, sh)
    first = compact(Repository(store, M))
    (old_pack,) = keys(store, "pack")

    write(src, TA, line(SA, 3) + line(SA, 4), "ab")
    write(src, NOTE, b"# notes\n")
    ship_all(sh, src)
    assert len(keys(store, "seg")) == 1
    # The snapshot, then the segment after it.
    assert_restores(store, src, tmp_path / "out1")

    second = compact(Repository(store, M), REBASE)

    assert second.errors == [] and second.segments == 1
    assert second.packs_merged == [old_pack]
    assert old_pack in second.deleted and old_pack not in keys(store, "pack")
    assert len(keys(store, "pack")) == 1
    assert keys(store, "snap") == [first.snapshot, second.snapshot]
    assert_compacted(store)
    assert_restores(store, src, tmp_path / "out2")


def test_big_files_are_cut_into_bounded_frames(tmp_path: Path) -> None:
    src, store, clock = tmp_path / "src", MemoryStore(), Clock()
    sh = make_shipper(src, store, tmp_path / "st.db", clock)
    sh.segment_max = 1 << 20  # the transcript spreads over several segments
    big = b"".join(line(SA, i, 2000) for i in range(3000))
    write(src, TA, big[: len(big) // 2])
    write(src, HIST, b"".join(history(SA, i) for i in range(8000)))
    write(src, NOTE, b"v1\n")
    ship_all(sh, src)
    write(src, TA, big[len(big) // 2 :], "ab")
    ship_all(sh, src)
    assert len(keys(store, "seg")) > 3
    compact(Repository(store, M))
    clock.t += 10
    os.unlink(src / NOTE)
    ship_all(sh, src, NOTE)
    clock.t += 10
    write(src, NOTE, b"v2, recreated after the rm\n")
    ship_all(sh, src)

    compact(Repository(store, M), REBASE)

    got = {(e.path.decode(), e.gen): e for e in entries(store, assert_compacted(store))}
    spans = {p: [(x.start, x.end) for _, x in e.extents] for (p, _), e in got.items()}
    assert len(spans[TA]) == -(-len(big) // (4 << 20)) and spans[TA][-1][1] == len(big)
    assert all(b - a == 4 << 20 for a, b in spans[TA][:-1])
    # history.jsonl in small frames: one session's lines are found in a few of them.
    # ... cut at line ends, so that each frame names the sessions of its lines.
    hist = (src / HIST).read_bytes()
    assert len(spans[HIST]) > 3
    assert all(256 << 9 < b - a <= 256 << 10 and hist[b - 1 : b] == b"\n"
               for a, b in spans[HIST][:-1])
    assert not got[(NOTE, 2)].retained and got[(NOTE, 1)].retained
    assert_restores(store, src, tmp_path / "out")


def test_compacting_again_with_nothing_new_writes_nothing(tmp_path: Path) -> None:
    src, store = tmp_path / "src", MemoryStore()
    write(src, TA, b'{"type":"user","cwd":"/home/u/app"}\n')
    write(src, HIST, history(SA, 0))
    write(src, TODO, b"[]")
    ship_all(shipper(src, store, tmp_path / "st.db"), src)
    compact(Repository(store, M))
    before = dict(store.objects)

    again = compact(Repository(store, M))

    assert (again.note, again.snapshot, again.packs_merged) == ("nothing to compact", None, [])
    assert store.objects == before


# -- generations and time ------------------------------------------------------------

def test_old_generations_stay_restorable_at_their_snapshot_time(tmp_path: Path) -> None:
    src, store, clock = tmp_path / "src", MemoryStore(), Clock()
    sh = make_shipper(src, store, tmp_path / "st.db", clock)
    write(src, TA, line(SA, 0) + line(SA, 1))
    write(src, TODO, b'[{"content":"a long list","status":"pending"}]')
    write(src, TB, line(SB, 0))
    ship_all(sh, src)
    clock.t += 60
    write(src, TA, line(SA, 2), "ab")
    ship_all(sh, src)
    s1 = compact(Repository(store, M), opts=CompactOptions(now=clock.t))
    t1 = read_manifest(store, s1.snapshot or "").time
    assert t1 == clock.t
    state1 = tree_bytes(src)

    clock.t += 60
    write(src, TODO, b"[]")  # truncated: a new generation
    with open(src / TA, "r+b") as f:  # rewritten in place, same size: a new generation
        f.write(b'{"type":"summary"}' + b" " * 10)
    write(src, TB, line(SB, 1), "ab")  # appended: the same generation grows
    ship_all(sh, src)
    s2 = compact(Repository(store, M), opts=CompactOptions(now=clock.t, max_chain=0))
    t2 = clock.t
    state2 = tree_bytes(src)

    gens = {(e.path.decode(), e.gen): e for e in entries(store, newest(store))}
    assert gens[(TODO, 1)].retained and not gens[(TODO, 2)].retained
    assert gens[(TA, 1)].retained and not gens[(TA, 2)].retained
    assert gens[(TODO, 1)].size == len(state1[TODO.encode()])
    assert (TB, 2) not in gens and not gens[(TB, 1)].retained

    assert_restores(store, state1, tmp_path / "at-t1", at=t1)
    assert_restores(store, state1, tmp_path / "between", at=(t1 + t2) / 2)
    assert_restores(store, state2, tmp_path / "now")

    # A third compaction rewrites the packs; the older snapshots still find their bytes.
    clock.t += 60
    write(src, TB, line(SB, 2), "ab")
    write(src, TODO, b'[{"content":"x","status":"done"}]')
    ship_all(sh, src)
    s3 = compact(Repository(store, M), opts=CompactOptions(now=clock.t, max_chain=0))
    assert s3.packs_merged and s1.snapshot and s2.snapshot
    assert all(k not in keys(store, "pack") for k, _ in s1.packs_written)
    assert_restores(store, state1, tmp_path / "again-t1", at=t1)
    assert_restores(store, state2, tmp_path / "again-t2", at=t2)
    assert_restores(store, src, tmp_path / "again-now")


def test_tombstones_are_kept_then_expire(tmp_path: Path) -> None:
    src, store, clock = tmp_path / "src", MemoryStore(), Clock()
    sh = make_shipper(src, store, tmp_path / "st.db", clock)
    write(src, TA, line(SA, 0))
    write(src, NOTE, b"# notes\nkept for a while after rm\n")
    ship_all(sh, src)
    with_note = tree_bytes(src)
    clock.t += 10
    os.unlink(src / NOTE)
    ship_all(sh, src, NOTE)
    deleted_at = clock.t
    keep = 7 * 86400.0

    kept = compact(Repository(store, M),
                   opts=CompactOptions(now=deleted_at + keep - 1, tombstone_keep=keep))

    assert kept.expired == []
    (note,) = [e for e in entries(store, newest(store)) if e.path == NOTE.encode()]
    assert note.deleted_at == deleted_at and not note.retained
    # Restore brings a deleted file back while its tombstone is kept.
    assert_restores(store, with_note, tmp_path / "kept")

    gone = compact(Repository(store, M), opts=CompactOptions(
        now=deleted_at + keep + 1, tombstone_keep=keep, max_chain=0))

    assert gone.expired == [NOTE] and gone.snapshot is not None
    assert [e.retained for e in entries(store, newest(store)) if e.path == NOTE.encode()] \
        in ([], [True])
    assert_restores(store, src, tmp_path / "expired")
    assert not (tmp_path / "expired" / NOTE).exists()


def test_dry_run_writes_nothing(tmp_path: Path) -> None:
    src, store = tmp_path / "src", MemoryStore()
    sh = shipper(src, store, tmp_path / "st.db")
    three_flushes(src, sh)
    before, puts = dict(store.objects), store.puts

    rep = compact(Repository(store, M), opts=CompactOptions(dry_run=True))

    assert rep.segments == 3 and rep.snapshot is None and "dry run" in rep.note
    assert rep.packs_written == [] and rep.deleted == []
    assert store.objects == before and store.puts == puts

    compact(Repository(store, M))
    write(src, TA, line(SA, 9), "ab")
    ship_all(sh, src)
    before, puts = dict(store.objects), store.puts

    rep = compact(Repository(store, M), opts=CompactOptions(dry_run=True, max_chain=0))

    assert rep.segments == 1 and rep.packs_merged == keys(store, "pack")  # what it would do
    assert store.objects == before and store.puts == puts


# -- encryption and a real S3 ----------------------------------------------------------

def test_encrypted_store_compacts_into_sealed_objects(tmp_path: Path) -> None:
    src, store, crypto = tmp_path / "src", MemoryStore(), Crypto(new_master())
    sh = make_shipper(src, store, tmp_path / "st.db", crypto=crypto)
    three_flushes(src, sh)

    rep = compact(Repository(store, M, crypto))

    assert rep.errors == [] and rep.snapshot is not None and len(rep.packs_written) == 1
    pack = rep.packs_written[0][0]
    plain = [b"-home-u-app", SA.encode(), b"history", b"sessionId", b"before the edit"]
    for key in (pack, rep.snapshot):
        blob = store.objects[key]
        check_header(blob, key, sealed=True)
        assert blob.endswith(END_MAGIC_SEALED)
        assert [w for w in plain if w in blob] == []
    with pytest.raises(FormatError, match=f"{rep.snapshot}: segment is encrypted, but no key"):
        read_manifest(store, rep.snapshot)
    with pytest.raises(FormatError, match=f"{pack}: segment is encrypted, but no key"):
        read_index(store, pack)
    with pytest.raises(CryptoError, match="encrypted, but no key is loaded"):
        restore_tree(Repository(store, M), tmp_path / "nokey")
    assert not (tmp_path / "nokey").exists() or tree_bytes(tmp_path / "nokey") == {}
    assert_restores(store, src, tmp_path / "out", crypto=crypto)

    # Without the key, compaction builds on nothing and writes nothing.
    write(src, TA, line(SA, 7), "ab")
    ship_all(sh, src)
    before = dict(store.objects)
    for opts in (REBASE, CompactOptions()):  # a manifest, or a delta built on it
        with pytest.raises(CompactError, match="newest snapshot is unreadable"):
            compact(Repository(store, M), opts)
        assert store.objects == before
    again = compact(Repository(store, M, crypto))
    assert again.errors == [] and again.segments == 1
    assert_restores(store, src, tmp_path / "out2", crypto=crypto)


def test_round_trip_through_compaction_on_seaweedfs(tmp_path: Path, seaweed: Seaweed,
                                                     bucket: str) -> None:
    store = open_store(f"s3://{bucket}/backup", endpoint_url=seaweed.endpoint)
    src = tmp_path / "src"
    sh = shipper(src, store, tmp_path / "st.db")
    three_flushes(src, sh)

    rep = compact(Repository(store, M))

    assert rep.errors == [] and rep.segments == 3
    assert_compacted(store)
    assert keys(store, "snap") == [rep.snapshot]
    assert_restores(store, src, tmp_path / "out1")
    write(src, TB, line(SB, 5), "ab")
    ship_all(sh, src)
    assert_restores(store, src, tmp_path / "out2")
    again = compact(Repository(store, M))
    assert again.errors == [] and again.segments == 1
    assert_compacted(store)
    assert_restores(store, src, tmp_path / "out3")


# -- damage ------------------------------------------------------------------------

def flip_frame(store: MemoryStore, path: str) -> str:
    """Flip one byte in the middle of the pack frame holding ``path``; returns the pack."""
    (e,) = [e for e in entries(store, newest(store)) if e.path == path.encode()]
    key, x = e.extents[0]
    blob = bytearray(store.objects[key])
    blob[x.off + x.clen // 2] ^= 0x40
    store.objects[key] = bytes(blob)
    return key


@pytest.mark.parametrize("packs", ["one frame per pack", "one pack"])
def test_a_damaged_frame_loses_only_its_file(tmp_path: Path, packs: str) -> None:
    src, store = tmp_path / "src", MemoryStore()
    three_flushes(src, shipper(src, store, tmp_path / "st.db"))
    if packs == "one pack":
        assert len(compact(Repository(store, M)).packs_written) == 1
    else:  # the damage confined to one pack
        rep = compact(Repository(store, M), opts=CompactOptions(pack_target=1, small_pack=0))
        assert len(rep.packs_written) > 5
    bad = flip_frame(store, TB)

    r = restore_tree(Repository(store, M), tmp_path / "out")

    assert len(r.errors) == 1 and bad in r.errors[0]
    want = tree_bytes(src)
    del want[TB.encode()]
    assert tree_bytes(tmp_path / "out") == want


def test_an_unreadable_only_manifest_is_named_by_the_restore(tmp_path: Path) -> None:
    src, store = tmp_path / "src", MemoryStore()
    three_flushes(src, shipper(src, store, tmp_path / "st.db"))
    snap = compact(Repository(store, M)).snapshot or ""
    store.objects[snap] = store.objects[snap][:-10]  # truncated

    with pytest.raises(RestoreError, match=snap):
        restore_tree(Repository(store, M), tmp_path / "out")


# -- kill -9 and the lock ------------------------------------------------------------

KILL_OPTS = CompactOptions(pack_target=8 << 10, small_pack=4 << 10)


def write_kind(entry: str) -> str:
    """``put pack``, ``put snap`` or ``delete``: a write of the log, without random tags."""
    if entry.startswith("put "):
        return "put " + entry.split("/")[2]
    return entry.split()[0]


def todo(i: int, size: int) -> bytes:
    text = random.Random(f"todo:{i}").randbytes(size // 2).hex()
    return json.dumps([{"content": text, "status": "pending"}]).encode()


def kill_setup(tmp_path: Path, scenario: str) -> tuple[Path, Path]:
    """A source tree and a local store (segments, or a snapshot and later segments).

    No tiny file: every pack is mostly frames, so a run with nothing new to do has
    nothing to rewrite either.
    """
    src, base = tmp_path / "src", tmp_path / "base"
    store = LocalStore(base)
    sh = shipper(src, store, tmp_path / "st.db")
    for i in range(4):
        write(src, f"{APP}/{SA}/subagents/agent-{i}.jsonl", line(SA, i, 5000))
    write(src, TA, line(SA, 10, 3000))
    write(src, TODO, todo(0, 3000))
    ship_all(sh, src)
    write(src, TA, line(SA, 11, 3000), "ab")
    write(src, TB, line(SB, 0, 6000))
    ship_all(sh, src)
    if scenario in ("on-top", "delta"):
        compact(Repository(store, M), opts=KILL_OPTS)
        write(src, TA, line(SA, 12, 20000), "ab")
        write(src, HIST, line(SA, 13, 3000))
        write(src, TODO, todo(1, 3000))
        ship_all(sh, src)
    return src, base


def kill_run(base: Path, work: Path, kill_at: int, *mode: str) -> tuple[
        subprocess.CompletedProcess[str], list[str]]:
    """Compaction (``mode`` "prune": a prune) of a copy of ``base`` in a process SIGKILLed
    before write ``kill_at``."""
    shutil.copytree(base, work / "store")
    log = work / "writes.log"
    r = subprocess.run([sys.executable, "-m", "tests.compactkill", str(work / "store"), M,
                        str(kill_at), str(log), str(KILL_OPTS.pack_target),
                        str(KILL_OPTS.small_pack), *mode],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    return r, log.read_text().splitlines() if log.exists() else []


@pytest.mark.parametrize("scenario", ["segments", "on-top", "delta"])
def test_kill_9_before_every_store_write(tmp_path: Path, scenario: str) -> None:
    src, base = kill_setup(tmp_path, scenario)
    mode = ("delta",) if scenario == "delta" else ()
    clean, writes = kill_run(base, tmp_path / "clean", 0, *mode)
    assert clean.returncode == 0, clean.stderr
    report = json.loads(clean.stdout)
    kinds = [write_kind(w) for w in writes]
    assert report["errors"] == []
    if scenario == "delta":
        # The delta, then the clean-up of the segments it folds.
        assert kinds == ["put delta", "delete"]
    else:
        # Packs, then the manifest, then the clean-up.
        assert kinds[-2:] == ["put snap", "delete"] and set(kinds[:-2]) == {"put pack"}
        assert len(kinds) >= 4
        assert_compacted(LocalStore(tmp_path / "clean" / "store"))
    if scenario == "on-top":
        assert report["packs_merged"], "the scenario should merge an older pack"

    for k in range(1, len(writes) + 1):
        work = tmp_path / f"kill-{k}"
        r, done = kill_run(base, work, k, *mode)
        assert r.returncode == -signal.SIGKILL, (k, r.stdout, r.stderr)
        assert [write_kind(w) for w in done] == kinds[:k]
        store = LocalStore(work / "store")
        assert_restores(store, src, work / "after-kill")

        # (a delta's rerun: a pack target its chain never outgrows, so it stays a delta)
        opts = dataclasses.replace(KILL_OPTS, pack_target=1 << 30) if scenario == "delta" \
            else dataclasses.replace(KILL_OPTS, max_chain=0)
        again = compact(Repository(store, M), opts=opts)

        assert again.errors == [], (k, again)
        assert_restores(store, src, work / "after-rerun")
        assert keys(store, "seg") == []
        if scenario == "delta":
            assert len(keys(store, "delta")) == 1 and len(keys(store, "snap")) == 1
        elif kinds[k - 1] != "delete":
            # Killed before the manifest: the rerun does the whole job and cleans up.
            assert again.snapshot is not None
            assert_compacted(store)


def test_rerun_after_a_kill_before_the_clean_up_removes_the_leftovers(tmp_path: Path) -> None:
    src, base = kill_setup(tmp_path, "on-top")
    _, writes = kill_run(base, tmp_path / "clean", 0)
    assert write_kind(writes[-1]) == "delete"
    r, _ = kill_run(base, tmp_path / "killed", len(writes))
    assert r.returncode == -signal.SIGKILL
    store = LocalStore(tmp_path / "killed" / "store")

    again = compact(Repository(store, M), opts=dataclasses.replace(KILL_OPTS, max_chain=0))

    assert again.errors == []
    assert_restores(store, src, tmp_path / "out")
    assert_compacted(store)


def test_a_second_compaction_is_refused_while_the_lock_is_held(tmp_path: Path) -> None:
    src, store = tmp_path / "src", MemoryStore()
    three_flushes(src, shipper(src, store, tmp_path / "st.db"))
    path = tmp_path / "locks" / f"compact-{M}.lock"
    held = ProcessLock(path)
    held.acquire()
    try:
        before = dict(store.objects)
        with pytest.raises(CompactError, match=rf"another compaction.*\(pid {os.getpid()}\)"):
            compact(Repository(store, M), opts=CompactOptions(lock=path))
        assert store.objects == before
    finally:
        held.release()
    rep = compact(Repository(store, M), opts=CompactOptions(lock=path))
    assert rep.snapshot is not None and rep.errors == []
    # Released after the run: the next one takes it again.
    assert compact(Repository(store, M), opts=CompactOptions(lock=path, dry_run=True)).errors == []


# -- a shipper that lost its state ---------------------------------------------------

def test_lost_local_state_adopts_the_snapshot(tmp_path: Path) -> None:
    src, store = tmp_path / "src", MemoryStore()
    three_flushes(src, shipper(src, store, tmp_path / "st.db"))
    rep = compact(Repository(store, M))
    m = newest(store)
    assert m.key == rep.snapshot and keys(store, "seg") == []
    size = (src / TA).stat().st_size

    fresh = shipper(src, store, tmp_path / "new-state.db")
    assert fresh.recover() == 1
    assert fresh.state.next_seq == m.seq + 1 > m.seq
    write(src, TA, line(SA, 50), "ab")
    res = fresh.ship(list(tree_bytes(src)))

    assert res.segments == [m.seq + 1]
    ix = read_index(store, segment_key(M, m.seq + 1))
    # Only the appended bytes: nothing the snapshot holds is shipped again.
    assert [(e.path, e.gen, e.start, e.end) for e in ix.extents] == \
        [(TA.encode(), 1, size, (src / TA).stat().st_size)]
    assert ix.tombstones == []
    assert_restores(store, src, tmp_path / "out")


def test_a_state_that_confirmed_nothing_holds_compaction_back(tmp_path: Path) -> None:
    """A writer state with no confirmed segment (a new state, before it adopts what the
    store holds) lets compaction fold nothing and build on no snapshot."""
    src, store = tmp_path / "src", MemoryStore()
    three_flushes(src, shipper(src, store, tmp_path / "st.db"))
    rep = compact(Repository(store, M), opts=CompactOptions(acknowledged=-1))
    assert rep.segments == 0 and rep.snapshot is None and len(keys(store, "seg")) == 3
    compact(Repository(store, M))
    with pytest.raises(CompactError, match=r"beyond what this machine's state knows \(nothing\)"):
        compact(Repository(store, M), opts=CompactOptions(acknowledged=-1))
    (tmp_path / "fresh").mkdir()
    s = make_settings(tmp_path / "fresh")
    assert acknowledged_seq(s) is None  # no state: nothing to hold the store to
    State(s.state_file).close()
    assert acknowledged_seq(s) == -1


# -- one session -----------------------------------------------------------------------

class Recording:
    """A store that records every GET: (key, start, length, bytes returned)."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.url = inner.url
        self.gets: list[tuple[str, int, int | None, int]] = []

    def put(self, key: str, data: bytes, *, if_none_match: bool = True,
            if_match: str | None = None) -> str:
        return self.inner.put(key, data, if_none_match=if_none_match, if_match=if_match)

    def get(self, key: str, start: int = 0, length: int | None = None) -> bytes:
        data = self.inner.get(key, start, length)
        self.gets.append((key, start, length, len(data)))
        return data

    def head(self, key: str) -> ObjectInfo | None:
        return self.inner.head(key)

    def list(self, prefix: str, start_after: str = "") -> Iterator[ObjectInfo]:
        return self.inner.list(prefix, start_after)

    def prefixes(self, prefix: str) -> Iterator[str]:
        return self.inner.prefixes(prefix)

    def delete_many(self, keys: Iterable[str]) -> None:
        self.inner.delete_many(keys)


BIG = ("-home-u-big1", "-home-u-big2", "-home-u-big3")


def several_folders(src: Path, sh: Shipper) -> None:
    write(src, TA, line(SA, 0) + line(SA, 1))
    write(src, SUB, line(SA, 2))
    write(src, TODO, b"[]")
    write(src, FH, b"before\n")
    write(src, HIST, history(SA, 0) + history(SB, 1))
    for n, folder in enumerate(BIG):
        sid = f"{n + 1:08x}-0000-4000-8000-{n:012x}"
        write(src, f"projects/{folder}/{sid}.jsonl", line(sid, 0, cwd=f"/home/u/big{n + 1}"))
        for i in range(500):  # many files: a big group in the manifest
            write(src, f"projects/{folder}/{sid}/tool-results/{i:04d}-{'x' * 60}.txt",
                  f"{folder} {i}\n".encode())
    ship_all(sh, src)


def test_one_session_load_reads_only_its_groups(tmp_path: Path) -> None:
    src, inner = tmp_path / "src", MemoryStore()
    several_folders(src, shipper(src, inner, tmp_path / "st.db"))
    compact(Repository(inner, M))
    m = newest(inner)
    size = len(inner.objects[m.key])
    store = Recording(inner)

    b = load_backup(Repository(store, M), sessions=[SA])

    assert b.find_session(SA) is not None
    mine = {TA, SUB, TODO, FH, HIST}
    assert {p.decode() for p in b.files} == mine
    assert not [p for p in b.files if any(f.encode() in p for f in BIG)]
    assert [g for g in store.gets if "/pack/" in g[0]] == []  # no file contents
    fetched = sum(n for key, _, _, n in store.gets if key == m.key)
    assert fetched < size / 4, (fetched, size)
    mine_groups = {APP, "todos", f"file-history/{SA}", "."}
    assert mine_groups <= set(m.groups) and len(m.groups) == len(mine_groups) + len(BIG)
    wanted = [x for name in mine_groups for x in m.groups[name]]
    ranged = [(start, n) for key, start, _, n in store.gets if key == m.key and start >= 0]
    # The index (a suffix read, two when it is big), then one ranged read per frame.
    assert 1 <= len([g for g in store.gets if g[0] == m.key]) - len(ranged) <= 2
    assert len(ranged) == len(wanted)
    for start, n in ranged:
        assert any(x.off <= start and start + n <= x.off + x.clen for x in wanted), \
            f"bytes {start}..{start + n} of the manifest are outside the session's groups"


def test_one_session_load_finds_a_session_newer_than_the_snapshot(tmp_path: Path) -> None:
    src, store = tmp_path / "src", MemoryStore()
    sh = shipper(src, store, tmp_path / "st.db")
    write(src, TA, line(SA, 0))
    ship_all(sh, src)
    compact(Repository(store, M))
    write(src, TB, line(SB, 0, cwd="/home/u/lib"))
    ship_all(sh, src)

    b = load_backup(Repository(store, M), sessions=[SB])

    assert b.find_session(SB) is not None
    assert TB.encode() in b.files


def test_one_session_restore_reads_only_the_history_frames_that_name_it(
        tmp_path: Path) -> None:
    src, inner = tmp_path / "src", MemoryStore()
    sh = shipper(src, inner, tmp_path / "st.db")
    write(src, TA, line(SA, 0))
    write(src, TB, line(SB, 0, cwd="/home/u/lib"))
    # ~1.5 MB of SB's prompts around a few of SA's: several history frames, SA in two.
    pad = b"".join(history(SB, i) * 1 for i in range(15000))
    write(src, HIST, history(SA, 0) + pad + history(SA, 1) + pad + b'{"torn":')
    ship_all(sh, src)
    compact(Repository(inner, M))
    h = next(e for g in read_groups(inner, newest(inner)).values() for e in g.entries
             if e.path == HIST.encode())
    frames = [(k, x) for k, x in h.extents]
    assert len(frames) >= 5
    # Whole lines in each frame (the last one holds the torn line: it has no sessions).
    assert [h.sids.get((k, x.off)) is None for k, x in frames] == \
        [False] * (len(frames) - 1) + [True]
    store = Recording(inner)

    report = restore(Repository(store, M), RestoreOptions(target=tmp_path / "out", sessions=(SA,)))

    assert not report.errors
    got = (tmp_path / "out" / HIST).read_bytes()
    assert got == history(SA, 0) + history(SA, 1)
    read = [(key, start, n) for key, start, _, n in store.gets if "/pack/" in key]
    hist_read = [x for k, x in frames if any(
        key == k and s <= x.off and x.off + x.clen <= s + n for key, s, n in read)]
    # SA's two frames and the torn tail; never the frames of SB's prompts alone.
    assert 3 <= len(hist_read) < len(frames)


@pytest.mark.parametrize("compacted", [False, True], ids=["segments", "after-compaction"])
def test_a_revived_generation_is_live_and_whole_through_compaction(
        tmp_path: Path, compacted: bool) -> None:
    """Deleted, restored as it was, revived by the writer (an empty extent of the same
    generation): compaction keeps it live, its bytes whole, and ships nothing again."""
    src, store = tmp_path / "src", MemoryStore()
    sh = shipper(src, store, tmp_path / "st.db")
    rel = "projects/-home-a/s.jsonl"
    write(src, rel, b'{"n":1}\n' * 100)
    sh.ship([rel.encode()])
    if compacted:
        compact(Repository(store, M))
    os.unlink(src / rel)
    sh.ship([rel.encode()])
    compact(Repository(store, M))  # the deletion is in a snapshot
    assert load_backup(Repository(store, M)).files[rel.encode()].deleted_at is not None
    _, recorded = restore_own(Repository(store, M), RestoreOptions(
        target=src, local_root=str(src), local_machine=M), tmp_path / "st.db")
    assert recorded == 1
    r = sh.ship([rel.encode()])
    assert r.raw_bytes == 0 and len(r.segments) == 1
    write(src, rel, b'{"n":2}\n', "ab")  # and it grows on from there
    sh.ship([rel.encode()])
    for round_ in range(2):
        b = load_backup(Repository(store, M))
        assert b.files[rel.encode()].deleted_at is None and b.files[rel.encode()].gen == 1
        out = tmp_path / f"out{round_}"
        restore_tree(Repository(store, M), out)
        assert (out / rel).read_bytes() == b'{"n":1}\n' * 100 + b'{"n":2}\n'
        compact(Repository(store, M))


def test_a_revival_is_its_own_empty_extent_when_the_file_grew_first(
        tmp_path: Path) -> None:
    """Claude appended to the restored file before the writer looked: the revival is an
    empty extent, the new bytes ordinary ones after it."""
    src, store = tmp_path / "src", MemoryStore()
    sh = shipper(src, store, tmp_path / "st.db")
    rel = "projects/-home-a/s.jsonl"
    write(src, rel, b'{"n":1}\n' * 100)
    sh.ship([rel.encode()])
    os.unlink(src / rel)
    sh.ship([rel.encode()])
    _, recorded = restore_own(Repository(store, M), RestoreOptions(
        target=src, local_root=str(src), local_machine=M), tmp_path / "st.db")
    assert recorded == 1
    write(src, rel, b'{"n":2}\n', "ab")
    r = sh.ship([rel.encode()])
    assert r.raw_bytes == 8
    [seg] = r.segments
    ix = Repository(store, M).read_index(segment_key(M, seg))
    assert [(x.gen, x.start, x.end, x.reason) for x in ix.extents] == [
        (1, 800, 800, "revived: restored as it was shipped"), (1, 800, 808, None)]
    out = tmp_path / "out"
    restore_tree(Repository(store, M), out)
    assert (out / rel).read_bytes() == b'{"n":1}\n' * 100 + b'{"n":2}\n'


# -- revival at the edges: an expired tombstone, a prune, a lost revival ----------------

DAY = 86400.0


NOTES = "projects/-home-u-app/memory/notes.md"
BODY = b"# notes\n" + b"remember this\n" * 40
KEEP = 7 * DAY


def _restored_after_expiry(tmp_path: Path) -> tuple[MemoryStore, float]:
    """A file deleted longer than tombstone_keep ago (KEEP; the writer revives within a
    day less, as the engine derives it), so the newest snapshot holds it only as
    retained; then restored as of before the deletion, and the writer's next flush.
    The store and the time of that flush."""
    src, store, clock = tmp_path / "src", MemoryStore(), Clock(T0)
    sh = make_shipper(src, store, tmp_path / "st.db", clock)
    sh.revive_within = KEEP - DAY
    write(src, NOTES, BODY)
    sh.ship([NOTES.encode()])
    compact(Repository(store, M), CompactOptions(now=clock.t))  # a snapshot holding it
    clock.t += 3600
    os.unlink(src / NOTES)
    sh.ship([NOTES.encode()])  # tombstone
    later = clock.t + KEEP + DAY
    rep = compact(Repository(store, M), CompactOptions(now=later, tombstone_keep=KEEP,
                                                       max_chain=0))
    assert rep.expired == [NOTES]
    report, _ = restore_own(Repository(store, M), RestoreOptions(
        target=src, local_root=str(src), local_machine=M, at=T0 + 60), tmp_path / "st.db")
    assert report.errors == [] and (src / NOTES).read_bytes() == BODY
    clock.t = later
    sh.ship([NOTES.encode()])
    return store, later


def test_a_generation_deleted_longer_than_revivals_reach_is_shipped_again(
        tmp_path: Path) -> None:
    """Its tombstone expired: an empty extent [N, N] could not bring it back (the live
    view has nothing under it), so the writer ships it as a new generation."""
    store, _ = _restored_after_expiry(tmp_path)
    out = tmp_path / "out"
    r = restore_tree(Repository(store, M), out)
    assert r.errors == []
    assert tree_bytes(out).get(NOTES.encode()) == BODY


def test_a_prune_after_restoring_an_expired_generation_keeps_its_bytes(
        tmp_path: Path) -> None:
    """Then a compaction that keeps every snapshot: the retained generation stays (a
    revived entry with no bytes must never make it look redundant)."""
    store, later = _restored_after_expiry(tmp_path)
    every = [k for _, _, k in current(Repository(store, M).snapshots())]
    rep = compact(Repository(store, M), CompactOptions(now=later, tombstone_keep=KEEP, max_chain=0,
                                                       keep=every))
    assert rep.errors == []
    out = tmp_path / "out"
    r = restore(Repository(store, M), RestoreOptions(target=out, local_machine=M,
                                                    at=T0 + 60))
    assert r.errors == [] and tree_bytes(out).get(NOTES.encode()) == BODY


def test_a_lost_revival_segment_is_noticed_by_the_audit(tmp_path: Path) -> None:
    """The segment that revived a generation (an empty extent) is lost in the store,
    which shows the file deleted again: the audit ships it again, so compaction never
    drops a file the tree still holds."""
    src, store, clock = tmp_path / "src", MemoryStore(), Clock(T0)
    sh = make_shipper(src, store, tmp_path / "st.db", clock)
    rel = "projects/-home-u-app/memory/notes.md"
    body = b"# notes\n" + b"remember this\n" * 40
    write(src, rel, body)
    sh.ship([rel.encode()])
    clock.t += 60
    os.unlink(src / rel)
    sh.ship([rel.encode()])  # tombstone
    _, recorded = restore_own(Repository(store, M), RestoreOptions(
        target=src, local_root=str(src), local_machine=M), tmp_path / "st.db")
    assert recorded == 1
    clock.t += 60
    r = sh.ship([rel.encode()])
    assert r.raw_bytes == 0 and len(r.segments) == 1  # the revival
    # The store loses that segment (a lifecycle rule, a provider's fault, a rollback).
    (revival,) = [k for k in store.objects if k.endswith(f"{r.segments[0]:016x}")]
    store.delete_many([revival])
    sh.audit()
    clock.t += 60
    sh.ship([rel.encode()])  # whatever the audit asked to be shipped again
    keep = 7 * DAY
    compact(Repository(store, M), CompactOptions(now=clock.t + keep + DAY,
                                                 tombstone_keep=keep))
    out = tmp_path / "out"
    restore_tree(Repository(store, M), out)
    assert tree_bytes(out).get(rel.encode()) == (src / rel).read_bytes()


def test_a_revival_of_a_generation_the_view_does_not_hold_starts_nothing() -> None:
    """An empty extent at [N, N] on no live entry (its tombstone expired) is no file
    of N bytes with none of them: a reader ignores it."""
    from syncd.format.points import Locator, apply, point_of
    from syncd.format.segment import Extent, SegmentIndex
    x = Extent(b"projects/-a/x.jsonl", 1, 100, 100, 16, 9, "0" * 64, mode=0o600,
               mtime_ns=0, reason="revived: restored as it was shipped")
    loc = Locator()
    files: dict[bytes, Entry] = {}

    def fold(ix: SegmentIndex) -> None:
        loc.add_all(("k", e) for e in ix.extents)
        apply(point_of(ix), files, mode_of=loc.mode_of, held=loc.holds)

    fold(SegmentIndex(machine=M, seq=3, time=T0, extents=[x]))
    assert files == {}
    empty = Extent(b"projects/-a/empty", 1, 0, 0, 16, 9, "0" * 64, mode=0o600, mtime_ns=0)
    fold(SegmentIndex(machine=M, seq=4, time=T0, extents=[empty]))
    assert files[b"projects/-a/empty"].size == 0  # an empty file still is one


def test_a_small_delta_grows_only_while_its_entries_fit_one_delta(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A delta names at most DELTA_ENTRIES entries of its segments, the small delta it
    grows from included (readers refuse an index naming more than a writer makes)."""
    monkeypatch.setattr(compact_module, "DELTA_ENTRIES", 6)
    store, src = MemoryStore(), tmp_path / "src"
    sh = make_shipper(src, store, tmp_path / "state")
    write(src, TA, line(SA, 0))
    ship_all(sh, src)
    compact(Repository(store, M))  # the first compaction: a manifest
    for batch in range(2):  # four new files a compaction: together more than six
        for i in range(4):
            write(src, f"plans/p{batch}-{i}.md", b"a plan\n")
        ship_all(sh, src)
        assert compact(Repository(store, M)).delta is not None
    deltas = keys(store, "delta")
    assert len(deltas) == 2, deltas
    for key in deltas:
        ix = read_index(store, key)
        assert len(ix.extents) + len(ix.tombstones) <= 6, (key, ix.extents)
    assert_restores(store, src, tmp_path / "out")

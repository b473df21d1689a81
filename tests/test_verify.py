"""``verify``: a whole backup passes, every kind of damage is named, sampling is bounded."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest

from syncd.archive.compact import CompactOptions, compact
from syncd.archive.verify import verify
from syncd.format.segment import Extent
from syncd.format.snapshot import Entry, build, current
from syncd.repository import Repository
from syncd.security.crypto import Crypto, new_master
from syncd.store import MemoryStore
from syncd.store.layout import pack_key, segment_key, snapshot_key
from tests.helpers import shipper, tree_bytes, write
from tests.readers import list_snapshots, read_groups, read_index, read_manifest

A = "projects/-home-a/aaaa.jsonl"
B = "projects/-home-a/bbbb.jsonl"
H = "history.jsonl"


def blob(n: int, seed: int) -> bytes:
    """Lines that compress a little, so a frame is neither raw nor tiny."""
    r = random.Random(seed)
    return b"".join(b'{"n":%d,"x":"%s"}\n' % (i, r.randbytes(24).hex().encode())
                    for i in range(n))


def ship(tmp_path: Path, store: MemoryStore, files: dict[str, bytes], mode: str = "wb",
         crypto: Crypto | None = None) -> None:
    src = tmp_path / "src"
    for rel, data in files.items():
        write(src, rel, data, mode)
    sh = shipper(src, store, tmp_path / "st.db")
    sh.repo.crypto = crypto
    sh.ship([rel.encode() for rel in files])


def backup(tmp_path: Path, crypto: Crypto | None = None) -> MemoryStore:
    """Two segments compacted into a pack and a snapshot, then one live segment."""
    store = MemoryStore()
    ship(tmp_path, store, {A: blob(200, 1), H: blob(50, 2)}, crypto=crypto)
    ship(tmp_path, store, {B: blob(300, 3)}, crypto=crypto)
    compact(Repository(store, "m1", crypto))
    ship(tmp_path, store, {A: blob(20, 4)}, mode="ab", crypto=crypto)
    return store


def raw_size(tmp_path: Path) -> int:
    return sum(len(v) for v in tree_bytes(tmp_path / "src").values())


def keys(store: MemoryStore, kind: str) -> list[str]:
    return sorted(k for k in store.objects if f"/{kind}/" in k)


def flip(store: MemoryStore, key: str, offset: int) -> None:
    data = bytearray(store.objects[key])
    data[offset] ^= 0x20
    store.objects[key] = bytes(data)


def flip_frame(store: MemoryStore, key: str, crypto: Crypto | None = None) -> Extent:
    """Damage the middle of the object's first frame; returns that frame's extent."""
    x = read_index(store, key, crypto=crypto).extents[0]
    flip(store, key, x.off + x.clen // 2)
    return x


def newest(store: MemoryStore) -> str:
    return current(list_snapshots(store, "m1"))[-1][2]


def test_clean_backup_passes_with_every_byte_read(tmp_path: Path) -> None:
    store = backup(tmp_path)
    r = verify(Repository(store, "m1"), read_data=100)
    assert r.ok and r.problems == []
    assert (r.snapshots, r.segments, r.packs) == (1, 1, 1)
    assert r.bytes_read == raw_size(tmp_path)
    assert r.sampled_share == 1.0 and not r.stopped_early and r.unreferenced == []
    assert r.checked_objects == 3
    d = json.loads(json.dumps(r.as_dict()))
    assert d["ok"] is True and d["bytes_read"] == r.bytes_read

    quick = verify(Repository(store, "m1"))
    assert quick.ok and quick.bytes_read == 0 and quick.extents_read == 0
    assert quick.sampled_share == 0.0


def test_without_any_snapshot_every_segment_is_checked(tmp_path: Path) -> None:
    store = MemoryStore()
    ship(tmp_path, store, {A: blob(10, 1)})
    ship(tmp_path, store, {A: blob(10, 2)}, mode="ab")
    r = verify(Repository(store, "m1"), read_data=100)
    assert r.ok, r.problems
    assert (r.snapshots, r.segments, r.packs) == (0, 2, 0)
    assert r.bytes_read == raw_size(tmp_path)


def test_a_share_of_the_data_is_sampled(tmp_path: Path) -> None:
    store = MemoryStore()
    ship(tmp_path, store, {f"projects/-p/{i:04x}.jsonl": blob(40, i) for i in range(20)})
    r = verify(Repository(store, "m1"), read_data=50, rng=random.Random(5))
    assert r.ok
    assert 0.5 <= r.sampled_share < 1.0
    assert 10 <= r.extents_read < 20


def test_flipped_byte_in_a_pack_frame_is_found_only_by_reading_data(tmp_path: Path) -> None:
    store = backup(tmp_path)
    [pack] = keys(store, "pack")
    x = flip_frame(store, pack)
    assert verify(Repository(store, "m1")).ok  # the indexes are intact
    r = verify(Repository(store, "m1"), read_data=100)
    [problem] = r.problems
    assert problem.startswith(f"memory://{pack}: ")
    assert "checksum" in problem or "corrupted frame" in problem
    # Every other frame was still read and checked.
    assert r.bytes_read == raw_size(tmp_path) - (x.end - x.start)


def test_deleted_pack_is_named_once(tmp_path: Path) -> None:
    store = backup(tmp_path)
    [pack] = keys(store, "pack")
    store.delete_many([pack])
    r = verify(Repository(store, "m1"), read_data=100)
    [problem] = r.problems
    assert problem.startswith(f"memory://{pack}: missing") and newest(store) in problem
    assert r.packs == 0


def test_segment_gap_is_named(tmp_path: Path) -> None:
    store = MemoryStore()
    for i in range(4):
        ship(tmp_path, store, {A: blob(5, i)}, mode="ab")
    store.delete_many([segment_key("m1", 1), segment_key("m1", 2)])
    r = verify(Repository(store, "m1"))
    [problem] = r.problems
    assert problem.startswith(f"memory://{segment_key('m1', 1)}: missing")
    assert "0000000000000001..0000000000000002" in problem
    assert r.segments == 2


def test_segment_under_another_key_is_named(tmp_path: Path) -> None:
    store = MemoryStore()
    for i in range(2):
        ship(tmp_path, store, {A: blob(5, i)}, mode="ab")
    store.objects[segment_key("m1", 1)] = store.objects[segment_key("m1", 0)]
    [problem] = verify(Repository(store, "m1")).problems
    assert segment_key("m1", 1) in problem and "seq 0" in problem


@pytest.mark.parametrize("where", ["index", "group"])
def test_corrupted_manifest_is_named(tmp_path: Path, where: str) -> None:
    store = backup(tmp_path)
    snap = newest(store)
    flip(store, snap, len(store.objects[snap]) - 80 if where == "index" else 20)
    r = verify(Repository(store, "m1"))
    assert not r.ok
    assert any(p.startswith(f"memory://{snap}: ") for p in r.problems), r.problems


def test_damaged_newest_manifest_is_named_file_by_file(tmp_path: Path) -> None:
    store = backup(tmp_path)
    m = read_manifest(store, newest(store))
    entries = [e for g in read_groups(store, m).values() for e in g.entries]
    [pack] = keys(store, "pack")
    by_path = {e.path.decode(): e for e in entries}
    a, b = by_path[A], by_path[B]
    a.size += 1  # its extents now fall short of its size
    key, x = b.extents[0]
    b.extents = [(key, x), (key, Extent(x.path, x.gen, x.end + 5, x.end + 9, x.off, x.clen,
                                        x.sha256, x.mode, x.mtime_ns))]
    hist = by_path[H]
    key, x = hist.extents[0]
    far = Extent(x.path, x.gen, x.start, x.end, len(store.objects[pack]) + 16, x.clen,
                 x.sha256, x.mode, x.mtime_ns)
    hist.extents = [(key, far), *hist.extents[1:]]
    # The next revision of the same seq is what readers (and verify) take.
    rev = snapshot_key("m1", m.seq, m.rev + 1)
    store.put(rev, build("m1", m.seq, m.rev + 1, m.time, m.first_time, entries, [], {}))
    r = verify(Repository(store, "m1"))
    assert len(r.problems) == 4, r.problems
    assert any(p.startswith(f"memory://{rev}: {A} generation 1: extents reach byte ")
               and p.endswith(f"short of its size {a.size}") for p in r.problems)
    assert any(p.startswith(f"memory://{rev}: {B} generation 1: extents are not contiguous")
               for p in r.problems)
    assert any(p.startswith(f"memory://{pack}: 1 extents lie outside the object")
               for p in r.problems)
    # The made-up extent of B is in no frame the pack's own index lists.
    assert any(p.startswith(f"memory://{pack}: 1 extents that snapshot")
               and "not in the object's index" in p for p in r.problems)


def test_older_snapshot_must_resolve_through_the_newest(tmp_path: Path) -> None:
    store = MemoryStore()
    ship(tmp_path, store, {A: blob(30, 1)})
    ship(tmp_path, store, {B: blob(30, 2)})
    compact(Repository(store, "m1"))
    snap = newest(store)
    m = read_manifest(store, snap)
    live = {e.path: e for g in read_groups(store, m).values() for e in g.entries}
    gone = Entry(b"projects/-home-a/gone.jsonl", 1, 7)
    longer = Entry(B.encode(), live[B.encode()].gen, live[B.encode()].size + 1)
    # Its own extents point to a pack long gone: by design, never looked at.
    lost = pack_key("m1", 0, 0, "deadbeef")
    fake = Extent(b"x", 1, 0, 7, 16, 9, "0" * 64, 0o600, 0)
    for e in (gone, longer):
        e.extents = [(lost, fake)]
    old = snapshot_key("m1", 0, 0)
    store.put(old, build("m1", 0, 0, m.first_time, m.first_time,
                         [live[A.encode()], gone, longer], [], {}))
    r = verify(Repository(store, "m1"))
    assert r.snapshots == 2
    assert len(r.problems) == 2, r.problems
    assert all(p.startswith(f"memory://{old}: ") and f"memory://{snap}" in p
               for p in r.problems)
    gone_p, longer_p = sorted(r.problems, key=lambda p: B in p)
    assert "gone.jsonl generation 1 (7 bytes) is not in the newest snapshot" in gone_p
    assert f"{B} generation 1 ({longer.size} bytes) has only {longer.size - 1} bytes" \
        in longer_p


def test_retained_generation_keeps_an_older_snapshot_whole(tmp_path: Path) -> None:
    store = MemoryStore()
    ship(tmp_path, store, {A: blob(30, 1), B: blob(30, 2)})
    compact(Repository(store, "m1"))
    ship(tmp_path, store, {A: blob(5, 3)})  # rewritten: a new generation
    compact(Repository(store, "m1"), CompactOptions(max_chain=0))
    r = verify(Repository(store, "m1"), read_data=100)
    assert r.ok, r.problems
    assert r.snapshots == 2
    # The newest manifest's own files plus the older generation it retains.
    assert r.bytes_read == raw_size(tmp_path) + len(blob(30, 1))


def test_unreferenced_pack_is_a_note(tmp_path: Path) -> None:
    store = backup(tmp_path)
    [pack] = keys(store, "pack")
    stray = pack[:-8] + "0badc0de"
    store.objects[stray] = store.objects[pack]
    r = verify(Repository(store, "m1"), read_data=100)
    assert r.ok and r.unreferenced == [stray]
    assert r.as_dict()["unreferenced"] == [stray]


def test_max_duration_stops_the_sample(tmp_path: Path) -> None:
    store = MemoryStore()
    ship(tmp_path, store, {f"projects/-p/{i:04x}.jsonl": blob(10, i) for i in range(30)})
    ticks = itertools.count()
    r = verify(Repository(store, "m1"), read_data=100, max_duration=5,
               clock=lambda: float(next(ticks)))
    assert r.ok and r.stopped_early
    assert 0 < r.extents_read < 30 and r.sampled_share < 1.0
    ticks = itertools.count()
    whole = verify(Repository(store, "m1"), read_data=100, max_duration=1000,
                   clock=lambda: float(next(ticks)))
    assert not whole.stopped_early and whole.extents_read == 30


def test_missing_machine_is_a_problem(tmp_path: Path) -> None:
    store = backup(tmp_path)
    r = verify(Repository(store, "nope"))
    [problem] = r.problems
    assert "no backup for machine 'nope'" in problem and "m1" in problem


def test_read_data_is_a_percentage(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="percentage"):
        verify(Repository(MemoryStore(), "m1"), read_data=101)


def test_encrypted_store(tmp_path: Path) -> None:
    crypto = Crypto(new_master())
    store = backup(tmp_path, crypto)
    r = verify(Repository(store, "m1", crypto), read_data=100)
    assert r.ok, r.problems
    assert r.bytes_read == raw_size(tmp_path)

    snap = newest(store)
    wrong = verify(Repository(store, "m1", Crypto(new_master())))
    assert any(p.startswith(f"memory://{snap}: ") and "fails authentication" in p
               for p in wrong.problems), wrong.problems
    keyless = verify(Repository(store, "m1"))
    assert any("encrypted, but no key is loaded" in p for p in keyless.problems)

    [pack] = keys(store, "pack")
    flip_frame(store, pack, crypto)
    assert verify(Repository(store, "m1", crypto)).ok
    [problem] = verify(Repository(store, "m1", crypto), read_data=100).problems
    assert problem.startswith(f"memory://{pack}: ") and "fails authentication" in problem


class Recorder:
    """A progress meter that remembers what it was told."""

    def __init__(self) -> None:
        self.total: int | None = None
        self.done = 0

    def start(self, total: int) -> None:
        self.total = total

    def advance(self, n: int) -> None:
        self.done += n


def test_progress_is_told_the_sample_and_each_frame(tmp_path: Path) -> None:
    store = backup(tmp_path)
    meter = Recorder()

    rep = verify(Repository(store, "m1"), read_data=100, progress=meter)

    assert rep.ok and rep.extents_read > 1
    assert meter.total is not None and meter.total > 0 and meter.done == meter.total


def test_segments_the_writer_was_confirmed_and_the_store_lost_are_reported(
        tmp_path: Path) -> None:
    src, store = tmp_path / "src", MemoryStore()
    sh = shipper(src, store, tmp_path / "st.db")
    for i in range(3):
        write(src, A, b"line %d\n" % i, "ab")
        sh.ship([A.encode()])
    store.delete_many([segment_key("m1", 2)])
    # Without the writer's state nothing says the store ever held segment 2.
    assert verify(Repository(store, "m1")).ok
    rep = verify(Repository(store, "m1"), acknowledged=sh.state.next_seq - 1)
    assert len(rep.problems) == 1 and segment_key("m1", 2) in rep.problems[0]

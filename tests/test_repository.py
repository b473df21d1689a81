"""The repository: every read bounded by what a reader expects, sealed and plain objects
kept apart, only machine names a machine id can have."""

from __future__ import annotations

import gc
import hashlib
import json
import random
import tracemalloc

import pytest
import zstandard

from syncd.errors import CryptoError, FormatError, StoreError
from syncd.format.segment import ENTRIES_MAX, INDEX_MAX, MAX_ENTRIES, TRAILER, SegmentWriter
from syncd.repository import MACHINE_JSON_MAX, Repository
from syncd.security.crypto import Crypto, new_master
from syncd.store import MemoryStore, layout
from tests.helpers import Recording

M = "m1"


def _segment(entries: int = 1) -> bytes:
    w = SegmentWriter(M, 0, 1.0)
    for i in range(entries):
        w.add_data(f"projects/p/{i}.jsonl".encode(), 1, 0, b"x\n", mode=0o600, mtime_ns=1)
    return w.finish()


def _with_index(blob: bytes, index: bytes) -> bytes:
    """``blob`` (a segment) with its index replaced by ``index`` (a zstd frame)."""
    off = TRAILER.unpack(blob[-TRAILER.size:])[0]
    return blob[:off] + index + TRAILER.pack(off, len(index), hashlib.sha256(index).digest(),
                                             b"SYNCDEND")


def test_an_index_claiming_more_than_a_reader_accepts_is_refused_unfetched() -> None:
    store = Recording()
    key = layout.segment_key(M, 0)
    blob = _segment()
    off = TRAILER.unpack(blob[-TRAILER.size:])[0]
    # The trailer claims an index of INDEX_MAX + 1 bytes (the object is that big, sparse).
    claimed = blob[:off] + b"\0" * (INDEX_MAX + 1) + TRAILER.pack(off, INDEX_MAX + 1,
                                                                   b"\0" * 32, b"SYNCDEND")
    store.put(key, claimed)
    store.gets.clear()
    with pytest.raises(FormatError, match="more than the"):
        Repository(store, M).read_index(key)
    assert store.gets == [(key, -(8 << 10), None)]  # the suffix GET only


def test_an_index_expanding_far_beyond_its_stored_size_is_refused() -> None:
    store = MemoryStore()
    key = layout.segment_key(M, 0)
    text = json.dumps({"v": 1, "machine": M, "seq": 0, "time": 1.0,
                       "entries": [], "pad": " " * (8 << 20)}).encode()
    frame = zstandard.ZstdCompressor(write_content_size=False).compress(text)
    store.put(key, _with_index(_segment(), frame))
    with pytest.raises(FormatError, match="expands beyond"):
        Repository(store, M).read_index(key)


def test_a_real_index_reads() -> None:
    store = MemoryStore()
    store.put(layout.segment_key(M, 0), _segment(100))
    ix = Repository(store, M).read_index(layout.segment_key(M, 0))
    assert len(ix.extents) == 100


@pytest.mark.parametrize(("raw", "error"), [
    (b"[1, 2]", "not a JSON object"),
    (b"{", "not JSON"),
    (b"[" * 5000, "not JSON"),
    (b'{"home": 1e999}', "not JSON"),
])
def test_machine_json_that_no_writer_makes_is_one_error(raw: bytes, error: str) -> None:
    store = MemoryStore()
    store.put(layout.machine_key(M), raw)
    with pytest.raises(StoreError, match=error):
        Repository(store, M).info()


def test_machine_json_keeps_only_the_fields_a_writer_records() -> None:
    store = MemoryStore()
    store.put(layout.machine_key(M), json.dumps({
        "machine": "other", "home": "/home/a", "hostname": {"x": 1}, "format": 1,
        "extra": "z" * 100}).encode())
    assert Repository(store, M).info() == {"machine": M, "home": "/home/a", "format": 1}
    store.put(layout.machine_key("big"), b" " * (MACHINE_JSON_MAX + 1), if_none_match=False)
    with pytest.raises(StoreError, match="larger than"):
        Repository(store, "big").info()


def test_sealed_and_plain_objects_are_kept_apart() -> None:
    store = MemoryStore()
    crypto = Crypto(new_master())
    sealed = Repository(store, "sealed", crypto)
    sealed.write_info({"machine": "sealed", "home": "/home/s"})
    Repository(store, "plain").write_info({"machine": "plain", "home": "/home/p"})
    assert sealed.info()["home"] == "/home/s"
    assert Repository(store, "plain").info()["home"] == "/home/p"
    with pytest.raises(CryptoError, match="encrypted, but no key is loaded"):
        Repository(store, "sealed").info()
    with pytest.raises(CryptoError, match="not encrypted, but the store is"):
        Repository(store, "plain", crypto).info()


def test_only_names_a_machine_id_can_have_are_machines() -> None:
    store = MemoryStore()
    for name in ("laptop-1", "\x1b]52;c;aGk=\x07", "-dash", "a" * 65):
        store.put(f"machines/{name}/machine.json", b"{}")
    assert Repository(store, "laptop-1").machines() == ["laptop-1"]


def test_a_lost_dictionary_is_one_error_for_the_frames_that_need_it() -> None:
    store = MemoryStore()
    repo = Repository(store, M)
    w = SegmentWriter(M, 0, 1.0)
    w.add_data(b"projects/p/a.jsonl", 1, 0, b"x\n", mode=0o600, mtime_ns=1)
    blob = w.finish()
    store.put(layout.segment_key(M, 0), blob)
    ix = repo.read_index(layout.segment_key(M, 0))
    ext = ix.extents[0]
    needs = type(ext)(**{**{f: getattr(ext, f) for f in ext.__slots__}, "dict_id": "0" * 64})
    failed: list[str] = []
    got = list(repo.read_extents(layout.segment_key(M, 0), [needs],
                                 lambda x, e: failed.append(str(e))))
    assert got == [] and len(failed) == 1 and "dictionary" in failed[0]


def _many(what: str, n: int) -> bytes:
    """A segment naming ``n`` tombstones, sessions or projects (paths that do not compress
    to nothing: the index stays within what its stored size may expand to)."""
    w = SegmentWriter(M, 0, 1.0)
    rnd = random.Random(n)
    names = [f"projects/p/{rnd.getrandbits(40):010x}" for _ in range(n)]
    w.add_data(b"projects/p/x.jsonl", 1, 0, b"x\n", mode=0o600, mtime_ns=1)
    for name in names:
        if what == "entries":
            w.add_tombstone(name.encode(), 1, 1.0)
        elif what == "sessions":
            w.add_session(f"{name}.jsonl".encode(), 1, {"cwd": name})
        else:
            w.add_project(name, {"toplevel": name})
    return w.finish()


# What each kind of object a reader holds to ENTRIES_MAX is stored under.
CAPPED = {"seg": layout.segment_key(M, 0), "pack": layout.pack_key(M, 0, 0, "0badc0de"),
          "delta": layout.delta_key(M, 0, 0)}


@pytest.mark.parametrize("what", ["entries", "sessions", "projects"])
@pytest.mark.parametrize("kind", sorted(CAPPED))
def test_an_index_naming_more_than_a_writer_puts_in_one_is_refused(what: str,
                                                                   kind: str) -> None:
    store = MemoryStore()
    key = CAPPED[kind]
    store.put(key, _many(what, ENTRIES_MAX + 1))
    with pytest.raises(FormatError) as e:
        Repository(store, M).read_index(key)
    assert key in str(e.value) and what in str(e.value) and "refusing it" in str(e.value)


def test_an_index_a_writer_fills_reads_and_a_manifests_is_not_held_to_it() -> None:
    store = MemoryStore()
    # A writer starts another object at MAX_ENTRIES, after the frames of the file it reads.
    store.put(layout.segment_key(M, 0), _many("entries", MAX_ENTRIES + 64))
    assert len(Repository(store, M).read_index(layout.segment_key(M, 0)).tombstones) == \
        MAX_ENTRIES + 64
    # A manifest's entries are its groups' frames: as many as the tree has groups.
    key = layout.snapshot_key(M, 0, 0)
    store.put(key, _many("entries", ENTRIES_MAX + 1))
    assert len(Repository(store, M).read_index(key).tombstones) == ENTRIES_MAX + 1


def test_an_index_naming_too_many_entries_is_refused_before_it_is_all_built() -> None:
    store = MemoryStore()
    blob = _many("entries", 6 * ENTRIES_MAX)
    store.put(layout.segment_key(M, 0), blob)
    store.put(layout.snapshot_key(M, 0, 0), blob)  # read whole: what the refusal spares

    def peak(key: str) -> int:
        gc.collect()
        tracemalloc.start()
        try:
            Repository(store, M).read_index(key)
        except FormatError:
            pass
        finally:
            got = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        return got

    refused, read = peak(layout.segment_key(M, 0)), peak(layout.snapshot_key(M, 0, 0))
    assert refused < read / 2, (refused, read)

from __future__ import annotations

import gc
import itertools
import random
import tracemalloc

import pytest

from syncd.errors import FormatError
from syncd.format.segment import (
    BATCH_BYTES,
    BATCH_MIN,
    FRAME_MAX,
    TAIL_READ,
    SegmentWriter,
    extent_bytes,
    index_bytes,
)
from syncd.security.crypto import Crypto, new_master
from syncd.store import MemoryStore
from syncd.store.layout import segment_key
from tests.readers import parse_segment, read_index


def _segment(n_files: int = 3, size: int = 1000) -> tuple[bytes, dict[bytes, bytes]]:
    w = SegmentWriter("m1", 7, 1700000000.5)
    data = {}
    for i in range(n_files):
        path = f"projects/p/{i}.jsonl".encode()
        data[path] = (f'{{"line":{i}}}\n' * size).encode()[:size]
        w.add_data(path, 1, 0, data[path], mode=0o600, mtime_ns=123, reason="new file")
    w.add_tombstone(b"projects/p/gone.jsonl", 2, 1700000001.0)
    return w.finish(), data


def test_roundtrip_index_and_extents() -> None:
    blob, data = _segment()
    ix = parse_segment(blob, "seg")
    assert (ix.machine, ix.seq, ix.time) == ("m1", 7, 1700000000.5)
    assert [e.path for e in ix.extents] == list(data)
    for e in ix.extents:
        assert extent_bytes(blob, 0, e, "seg") == data[e.path]
        assert e.reason == "new file" and e.mode == 0o600
    assert [(t.path, t.gen) for t in ix.tombstones] == [(b"projects/p/gone.jsonl", 2)]


def test_non_utf8_path_roundtrips() -> None:
    w = SegmentWriter("m", 0, 0.0)
    w.add_data(b"projects/caf\xe9.jsonl", 1, 0, b"x", mode=0o600, mtime_ns=0)
    ix = parse_segment(w.finish(), "seg")
    assert ix.extents[0].path == b"projects/caf\xe9.jsonl"


def test_empty_extent_roundtrips() -> None:
    w = SegmentWriter("m", 0, 0.0)
    w.add_data(b"e", 1, 0, b"", mode=0o600, mtime_ns=0)
    blob = w.finish()
    e = parse_segment(blob, "seg").extents[0]
    assert (e.start, e.end) == (0, 0)
    assert extent_bytes(blob, 0, e, "seg") == b""


def test_index_larger_than_tail_read_uses_second_get() -> None:
    w = SegmentWriter("m", 0, 0.0)
    for i in range(3000):
        w.add_data(f"projects/p/{i:06d}.jsonl".encode(), 1, 0, str(i).encode(), mode=0o600,
                   mtime_ns=i)
    blob = w.finish()
    store = MemoryStore()
    store.put("seg", blob)
    ix = read_index(store, "seg")
    assert len(ix.extents) == 3000
    assert len(blob) > TAIL_READ


@pytest.mark.parametrize("where", ["frame", "index", "trailer", "header"])
def test_any_flipped_byte_is_detected(where: str) -> None:
    blob, _ = bytearray(_segment()[0]), None
    if where == "frame":
        blob[20] ^= 0x40
    elif where == "index":
        blob[-100] ^= 0x01
    elif where == "trailer":
        blob[-3] ^= 0x01
    else:
        blob[0] ^= 0x01
    with pytest.raises(FormatError):
        ix = parse_segment(bytes(blob), "seg")
        for e in ix.extents:
            extent_bytes(bytes(blob), 0, e, "seg")


def test_truncated_segment_is_named() -> None:
    blob, _ = _segment()
    with pytest.raises(FormatError, match="the-key"):
        parse_segment(blob[:-10], "the-key")


def test_frames_are_bounded() -> None:
    assert FRAME_MAX == 4 << 20


def _frames(n: int, size: int) -> dict[bytes, bytes]:
    """Distinct, compressible contents; ``size`` ≥ BATCH_MIN goes through the worker."""
    return {f"projects/p/{i}.jsonl".encode(): (f'{{"file":{i},"n":"%08d"}}\n' * (size // 24 + 1)
                                             ).encode()[:size] for i in range(n)}


@pytest.mark.parametrize("size", [1000, BATCH_MIN + 5])
def test_bind_seals_frames_added_before_and_after(size: int) -> None:
    """The shipper learns seq and key only once connected: frames read before are
    sealed then, at offsets that move by the seal's overhead."""
    crypto = Crypto(new_master())
    before, after = _frames(3, size), {b"projects/q/late.jsonl": b"late\n" * 100}
    w = SegmentWriter("m1", 0, 1.0)
    for path, data in before.items():
        w.add_data(path, 1, 0, data, mode=0o600, mtime_ns=1)
    key = segment_key("m1", 42)
    w.bind(42, crypto.cipher(key))
    for path, data in after.items():
        w.add_data(path, 1, 0, data, mode=0o600, mtime_ns=1)
    blob = w.finish()
    ix = parse_segment(blob, "seg", crypto, key)
    assert ix.seq == 42
    assert [e.path for e in ix.extents] == [*before, *after]
    cipher = crypto.cipher(key)
    for e in ix.extents:
        assert extent_bytes(blob, 0, e, "seg", cipher) == {**before, **after}[e.path]
    with pytest.raises(FormatError):
        parse_segment(blob, "seg")  # sealed: not readable as a plain segment
    with pytest.raises(ValueError, match="already sealed"):
        w.bind(43, crypto.cipher(segment_key("m1", 43)))


def test_bind_without_a_key_only_names_the_seq() -> None:
    w = SegmentWriter("m1", 0, 1.0)
    w.add_data(b"projects/p/a.jsonl", 1, 0, b"abc\n", mode=0o600, mtime_ns=1)
    w.bind(9, None)
    ix = parse_segment(w.finish(), "seg")
    assert ix.seq == 9 and [e.off for e in ix.extents] == [16]


def test_batches_in_the_worker_keep_order_and_offsets() -> None:
    """Big frames are compressed a batch at a time in a worker thread while small ones
    arrive: the segment still holds every frame in the order added, contiguous."""
    big = _frames(2 * BATCH_BYTES // BATCH_MIN + 3, BATCH_MIN)
    small = {b"projects/s/%d.jsonl" % i: b"small %d\n" % i for i in range(5)}
    names, cut = list(big), BATCH_BYTES // BATCH_MIN  # small ones while a batch runs
    order = [*names[:cut], *small, *names[cut:]]
    data = {**big, **small}
    w = SegmentWriter("m1", 3, 1.0)
    for path in order:
        w.add_data(path, 1, 0, data[path], mode=0o600, mtime_ns=1)
    blob = w.finish()
    ix = parse_segment(blob, "seg")
    assert [e.path for e in ix.extents] == order
    assert ix.extents[0].off == 16
    assert all(a.off + a.clen == b.off for a, b in itertools.pairwise(ix.extents))
    for e in ix.extents:
        assert extent_bytes(blob, 0, e, "seg") == data[e.path]


def _shaped(shape: str) -> bytes:
    """A segment whose index holds one kind of thing many times, with strings of every
    width (ASCII, Latin-1, the BMP, beyond it) and numbers far from small."""
    rnd = random.Random(shape)
    w = SegmentWriter("m1", 7, 1700000000.5)
    text = ["a", "é", "ꙮ", "\U0001F600"]
    for i in range(3000):
        s = f"{text[i % 4] * rnd.randint(1, 40)}{rnd.getrandbits(48):x}"
        path = f"projects/p/{s}".encode()
        if shape == "data":
            w.add_frame(path, rnd.getrandbits(40), rnd.getrandbits(62), 0, b"x", s * 2,
                        mode=0o600, mtime_ns=rnd.getrandbits(62), reason=s)
        elif shape == "tombstones":
            w.add_tombstone(path, i, 1700000000.0 + i / 7)
        elif shape == "sessions":
            w.add_session(path, i, {"cwd": s, "summary": s * 3, "last_prompt": s[:5]})
        else:
            w.add_project(s, {"toplevel": s, "worktrees": [{"path": s, "branch": "b"}] * 3})
    w.add_data(b"projects/p/x", 1, 0, b"x\n", mode=0o600, mtime_ns=1)
    w.index.extra = {"points": [[i, 1.5, [[i, 1, 2]]] for i in range(500)]}
    return w.finish()


@pytest.mark.parametrize("shape", ["data", "tombstones", "sessions", "projects"])
def test_an_indexs_estimated_memory_is_never_less_than_it_takes(shape: str) -> None:
    blob = _shaped(shape)
    gc.collect()
    tracemalloc.start()
    try:
        ix = parse_segment(blob, "seg")
        gc.collect()
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert held <= index_bytes(ix) <= 2 * held, (held, index_bytes(ix))

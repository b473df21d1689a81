"""Sealing and key files: what is bound to what, and that every altered bit is caught."""

from __future__ import annotations

import hashlib
import json
import struct

import pytest
import zstandard

from syncd._crypto import (
    SCRYPT_P,
    BadPassphrase,
    Crypto,
    CryptoError,
    describe,
    is_box,
    new_master,
    pad,
    unpad,
    unwrap,
    wrap,
)
from syncd._segment import (
    END_MAGIC,
    HEADER,
    MAGIC,
    TRAILER,
    FormatError,
    SegmentWriter,
)
from syncd._segreader import extent_bytes, parse_segment

KEY = "machines/m1/seg/0000000000000000"
CHEAP = 1 << 10  # scrypt N for unit tests: the format is the same, the cost is not


def flips(blob: bytes) -> list[bytes]:
    """``blob`` with one bit flipped, for every bit."""
    out = []
    for i in range(len(blob)):
        for bit in range(8):
            b = bytearray(blob)
            b[i] ^= 1 << bit
            out.append(bytes(b))
    return out


def test_seal_binds_object_key_and_position() -> None:
    c = Crypto(new_master())
    sealed = c.cipher(KEY).seal("frame@16", b"zstd bytes")
    assert c.cipher(KEY).open("frame@16", sealed, "w") == b"zstd bytes"
    assert b"zstd bytes" not in sealed
    with pytest.raises(CryptoError, match="w: frame@99 fails authentication"):
        c.cipher(KEY).open("frame@99", sealed, "w")  # moved within the object
    with pytest.raises(CryptoError, match="fails authentication"):
        c.cipher("machines/m1/seg/0000000000000001").open("frame@16", sealed, "w")  # swapped
    with pytest.raises(CryptoError, match="fails authentication"):
        Crypto(new_master()).cipher(KEY).open("frame@16", sealed, "w")  # another key
    with pytest.raises(CryptoError, match="truncated"):
        c.cipher(KEY).open("frame@16", sealed[:20], "w")
    # A fresh nonce every time: sealing the same bytes twice never gives the same output.
    assert c.cipher(KEY).seal("frame@16", b"zstd bytes") != sealed


def test_pad_hides_small_size_differences() -> None:
    assert len(pad(b"a")) == len(pad(b"a" * 200)) == 256
    assert unpad(pad(b"hello"), "w") == b"hello"
    with pytest.raises(CryptoError):
        unpad(pad(b"hello")[:-1] + b"\1", "w")


def test_box_roundtrip_and_refusals() -> None:
    c = Crypto(new_master())
    box = c.seal_box("machines/m1/machine.json", "machine.json", b'{"home": "/home/alice"}')
    assert is_box(box) and b"alice" not in box
    assert c.open_box("machines/m1/machine.json", "machine.json", box, "w") == \
        b'{"home": "/home/alice"}'
    with pytest.raises(CryptoError, match="not encrypted"):
        c.open_box("machines/m1/machine.json", "machine.json", b'{"home": "/x"}', "w")
    with pytest.raises(CryptoError, match="fails authentication"):
        c.open_box("machines/m2/machine.json", "machine.json", box, "w")
    for bad in flips(box):
        with pytest.raises(CryptoError):
            c.open_box("machines/m1/machine.json", "machine.json", bad, "w")


def test_key_file_wraps_and_unwraps() -> None:
    c = Crypto(new_master(), "k1")
    raw = wrap(c, "correct horse", "k1", "keys/k1", n=CHEAP)
    doc = json.loads(raw)
    assert doc["kdf"] == {"name": "scrypt", "n": CHEAP, "r": 8, "p": SCRYPT_P,
                         "salt": doc["kdf"]["salt"]}
    assert c.master.hex() not in raw.decode() and "correct horse" not in raw.decode()
    got = unwrap(raw, "correct horse", "keys/k1", "w")
    assert got.master == c.master and got.key_id == "k1" and got.fingerprint == c.fingerprint
    assert describe(raw, "w").master == c.fingerprint
    with pytest.raises(BadPassphrase, match="w: does not open with this passphrase"):
        unwrap(raw, "wrong horse", "keys/k1", "w")
    with pytest.raises(BadPassphrase):
        unwrap(raw, "correct horse", "keys/k2", "w")  # renamed key file


def test_nfc_and_nfd_passphrases_are_the_same() -> None:
    c = Crypto(new_master(), "k1")
    raw = wrap(c, "caf\u00e9", "k1", "keys/k1", n=CHEAP)
    assert unwrap(raw, "cafe\u0301", "keys/k1", "w").master == c.master


def test_every_flipped_bit_of_a_key_file_is_refused() -> None:
    c = Crypto(new_master(), "k1")
    raw = wrap(c, "pw", "k1", "keys/k1", n=CHEAP)
    for bad in flips(raw):
        with pytest.raises(CryptoError):
            unwrap(bad, "pw", "keys/k1", "w")


def test_key_file_cannot_demand_absurd_scrypt_cost() -> None:
    c = Crypto(new_master(), "k1")
    doc = json.loads(wrap(c, "pw", "k1", "keys/k1", n=CHEAP))
    doc["kdf"]["n"] = 1 << 30
    raw = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    with pytest.raises(CryptoError, match="out of range"):
        unwrap(raw, "pw", "keys/k1", "w")


def test_crypto_repr_shows_no_key() -> None:
    c = Crypto(new_master(), "k1")
    assert c.master.hex() not in repr(c) and c.fingerprint in repr(c)


# -- segments ------------------------------------------------------------------------------

def _segment(cipher_of: Crypto | None) -> tuple[bytes, dict[bytes, bytes]]:
    data = {b"projects/-home-alice-app/s1.jsonl": b'{"cwd":"/home/alice/app"}\n' * 20,
            b"history.jsonl": b'{"display":"secret prompt"}\n'}
    w = SegmentWriter("m1", 0, 1.0, cipher=None if cipher_of is None
                      else cipher_of.cipher(KEY))
    for path, raw in data.items():
        w.add_data(path, 1, 0, raw, mode=0o600, mtime_ns=1)
    w.add_tombstone(b"projects/-home-alice-app/old.jsonl", 1, 2.0)
    return w.finish(), data


def test_plain_segments_are_version_1_byte_for_byte() -> None:
    """Unencrypted stores keep the documented version-1 layout exactly."""
    blob, data = _segment(None)
    assert blob[: HEADER.size] == HEADER.pack(MAGIC, 1, 0, 0)
    z = zstandard.ZstdCompressor(level=3, write_content_size=True)
    frames = [z.compress(raw) for raw in data.values()]
    off, length, digest, magic = TRAILER.unpack(blob[-TRAILER.size:])
    assert magic == END_MAGIC and blob[-TRAILER.size + 12 : -TRAILER.size + 16] == b"\0" * 4
    assert blob[HEADER.size:off] == b"".join(frames)
    index = blob[off : off + length]
    assert hashlib.sha256(index).digest() == digest
    doc = json.loads(zstandard.ZstdDecompressor().decompress(index))
    assert doc["v"] == 1 and doc["entries"][0]["off"] == HEADER.size


def test_sealed_segment_roundtrip_and_nothing_in_clear() -> None:
    c = Crypto(new_master())
    blob, data = _segment(c)
    magic, version, flags, reserved = HEADER.unpack(blob[: HEADER.size])
    assert (magic, version, flags, reserved) == (MAGIC, 2, 1, 0)
    assert blob[-8:] == b"SYNCDEN2"
    for needle in (b"alice", b"history", b"secret prompt", b"cwd", b"s1.jsonl"):
        assert needle not in blob
    ix = parse_segment(blob, "w", c, KEY)
    assert {e.path for e in ix.extents} == set(data)
    for e in ix.extents:
        assert extent_bytes(blob, 0, e, "w", c.cipher(KEY)) == data[e.path]
    with pytest.raises(FormatError, match="encrypted, but no key"):
        parse_segment(blob, "w")
    plain, _ = _segment(None)
    with pytest.raises(FormatError, match="not encrypted, but the store is"):
        parse_segment(plain, "w", c, KEY)
    with pytest.raises(FormatError, match="fails authentication"):
        parse_segment(blob, "w", c, "machines/m1/seg/0000000000000001")


def test_every_flipped_bit_of_a_sealed_segment_is_detected() -> None:
    c = Crypto(new_master())
    blob, _ = _segment(c)
    good = parse_segment(blob, "w", c, KEY)
    cipher = c.cipher(KEY)
    for bad in flips(blob):
        with pytest.raises(FormatError):
            ix = parse_segment(bad, "w", c, KEY)
            # The index survived: then a frame (or the header) must be what changed.
            assert [e.off for e in ix.extents] == [e.off for e in good.extents]
            for e in ix.extents:
                extent_bytes(bad, 0, e, "w", cipher)


def test_truncated_sealed_segment_is_refused() -> None:
    c = Crypto(new_master())
    blob, _ = _segment(c)
    for cut in (1, 8, 56, len(blob) // 2, len(blob) - 20):
        with pytest.raises(FormatError):
            parse_segment(blob[:-cut], "w", c, KEY)


def test_trailer_padding_must_be_zero() -> None:
    blob, _ = _segment(None)
    i = len(blob) - TRAILER.size + 12
    bad = blob[:i] + struct.pack("<I", 1) + blob[i + 4:]
    with pytest.raises(FormatError, match="bad segment trailer"):
        parse_segment(bad, "w")

"""Sealing and key files: what is bound to what, and that every altered bit is caught."""

from __future__ import annotations

import hashlib
import json
import struct

import pytest
import zstandard

from syncd.errors import BadPassphrase, CryptoError, FormatError
from syncd.format.segment import END_MAGIC, HEADER, MAGIC, TRAILER, SegmentWriter, extent_bytes
from syncd.security.crypto import (
    KEY_FILE_MAX_BYTES,
    MAX_SCRYPT_MEMORY,
    MAX_SCRYPT_WORK,
    SCRYPT_N,
    SCRYPT_P,
    SCRYPT_R,
    Crypto,
    describe,
    is_box,
    new_master,
    pad,
    scrypt_within_bounds,
    unpad,
    unwrap,
    wrap,
)
from tests.readers import parse_segment

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


def with_kdf(raw: bytes, **kdf: int) -> bytes:
    """A key file with other scrypt parameters (its tag no longer verifies)."""
    doc = json.loads(raw)
    doc["kdf"].update(kdf)
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


@pytest.mark.parametrize(("n", "r", "p"), [
    (1 << 22, 8, 3),    # 4 GiB: what made restore take 13.9 s and 4.2 GB
    (1 << 22, 32, 16),  # 16 GiB: MemoryError
    (1 << 30, 8, 3),
    (1 << 18, 8, 1),    # 256 MiB
    (1 << 16, 8, 4),    # 64 MiB, but 2.7x our work
    (1 << 21, 1, 1),    # 256 MiB with r = 1
    (2, 33, 1),         # r alone
    (2, 8, 17),         # p alone
])
def test_key_file_beyond_the_bounds_is_refused_without_deriving(
        n: int, r: int, p: int, derives: list[tuple[int, int, int]]) -> None:
    c = Crypto(new_master(), "k1")
    raw = with_kdf(wrap(c, "pw", "k1", "keys/k1", n=CHEAP), n=n, r=r, p=p)
    assert derives == [(CHEAP, 8, SCRYPT_P)]  # the counter sees wrap's derivation
    derives.clear()
    msg = rf"^refusing key file w: scrypt parameters beyond syncd's bounds \(n={n}, r={r}, p={p};"
    with pytest.raises(CryptoError, match=msg):
        unwrap(raw, "pw", "keys/k1", "w")
    with pytest.raises(CryptoError, match=msg):
        describe(raw, "w")
    assert derives == []
    assert not scrypt_within_bounds(n, r, p)
    with pytest.raises(CryptoError, match="beyond syncd's bounds"):
        wrap(c, "pw", "k1", "keys/k1", n=n, r=r, p=p)  # never written either
    assert derives == []


@pytest.mark.parametrize(("n", "r", "p"), [
    (SCRYPT_N, SCRYPT_R, SCRYPT_P),  # what syncd writes
    (1 << 17, 8, 1),                 # OWASP's first choice: 128 MiB, 1.3x our work
    (1 << 16, 8, 3),                 # 2x our work
    (CHEAP, 8, 3), (2, 1, 1),        # cheaper is always fine
])
def test_key_file_within_the_bounds_is_accepted(n: int, r: int, p: int) -> None:
    assert scrypt_within_bounds(n, r, p)
    assert 128 * r * n <= MAX_SCRYPT_MEMORY and n * r * p <= MAX_SCRYPT_WORK
    raw = with_kdf(wrap(Crypto(new_master(), "k1"), "pw", "k1", "keys/k1", n=CHEAP), n=n, r=r,
                   p=p)
    kf = describe(raw, "w")
    assert (kf.n, kf.r, kf.p) == (n, r, p)


def test_bounds_keep_a_margin_over_what_syncd_writes() -> None:
    assert 128 * SCRYPT_R * SCRYPT_N * 4 == MAX_SCRYPT_MEMORY == 128 << 20
    assert SCRYPT_N * SCRYPT_R * SCRYPT_P * 2 == MAX_SCRYPT_WORK
    assert not scrypt_within_bounds(SCRYPT_N * 4, SCRYPT_R, SCRYPT_P)
    assert not scrypt_within_bounds(3, 1, 1) and not scrypt_within_bounds(1, 1, 1)


def test_oversized_key_file_is_refused_before_parsing(derives: list[tuple[int, int, int]]) -> None:
    raw = wrap(Crypto(new_master(), "k1"), "pw", "k1", "keys/k1", n=CHEAP)
    assert len(raw) < 512 and len(derives) == 1
    derives.clear()
    big = raw + b" " * (KEY_FILE_MAX_BYTES + 1 - len(raw))
    with pytest.raises(CryptoError, match=rf"refusing key file w: more than {KEY_FILE_MAX_BYTES}"):
        unwrap(big, "pw", "keys/k1", "w")
    assert derives == []


@pytest.mark.parametrize("raw", [b"[" * 4000, b'{"a":' * 600 + b"1" + b"}" * 600,
                                 b"\xff\xfe", b"9" * 4000, b"{}"])
def test_malformed_key_file_is_one_error_naming_it(raw: bytes) -> None:
    with pytest.raises(CryptoError, match=r"^w: unreadable key file"):
        describe(raw, "w")


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

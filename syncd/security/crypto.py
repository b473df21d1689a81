"""Client-side encryption: the master key, its passphrase-wrapped copies, and sealing.

- The master key is 32 random bytes, made once per store by ``syncd init --encrypt``.
- A key file (``keys/<key-id>``) holds it wrapped with AES-256-GCM under a key derived
  from a passphrase by scrypt (random salt per file; the parameters are in the file).
- Each object gets its own AES-256-GCM key: HKDF-SHA256(master, info = "syncd/2 object"
  + object key). Every sealed piece is ``nonce (12 random bytes) || ciphertext || tag``
  with associated data ``"syncd/2" NUL <object key> NUL <position>`` (``frame@<offset>``,
  ``index@<offset>``, ``machine.json``, ``key``), so a piece moved to another object or
  another place in it, cut short or altered fails to open.

Nothing here logs or puts a passphrase or a key into a message.
"""

from __future__ import annotations

import base64
import json
import os
import struct
import threading
import time
import unicodedata
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from syncd import untrusted
from syncd.errors import BadPassphrase, CryptoError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

# `cryptography` is imported where it is used: a plain store never loads it (~6 MB RSS).

NONCE = 12
TAG = 16
OVERHEAD = NONCE + TAG
AAD_PREFIX = b"syncd/2\0"
MASTER_BYTES = 32
# scrypt N=2^15, r=8, p=3: one of OWASP's equivalent minimum settings (the same work as
# N=2^17, p=1) with 32 MiB of memory instead of 128, so a daemon's peak RSS stays small;
# ~0.3 s per unlock. Stored with every key file, so they can change later.
SCRYPT_N = 1 << 15
SCRYPT_R = 8
SCRYPT_P = 3
SALT_BYTES = 16
# What a key file may ask for. Anyone who can write the bucket can plant one, and a key
# file's parameters are derived before anything says whether it is ours, so they are
# bounded by what syncd writes plus a small margin: scrypt's memory (128·r·n bytes) at
# 4x ours (N=2^17, r=8 fits) and its work (n·r·p) at 2x ours (~0.5 s). Cheaper is fine.
# r and p alone are capped too: scrypt also holds a 128·r·p-byte buffer.
MAX_SCRYPT_MEMORY = 128 << 20
MAX_SCRYPT_WORK = 2 * SCRYPT_N * SCRYPT_R * SCRYPT_P
_MAX_R, _MAX_P = 32, 16
# A key file is ~400 bytes; a reader fetches at most this much of one.
KEY_FILE_MAX_BYTES = 4096

# Small sealed objects (machine.json): the segment header's layout with its own magic.
BOX_MAGIC = b"SYNCDBOX"
BOX_HEADER = struct.Struct("<8sHHI")
BOX_VERSION = 2
FLAG_SEALED = 1
PAD_BLOCK = 256


def normalize_passphrase(passphrase: str) -> bytes:
    """The same passphrase typed on macOS (NFD) and Linux (NFC) gives the same key."""
    return unicodedata.normalize("NFC", passphrase).encode("utf-8")


def pad(data: bytes, block: int = PAD_BLOCK) -> bytes:
    """Length-prefixed and zero-padded to a multiple of ``block``: sizes say less."""
    body = struct.pack("<I", len(data)) + data
    return body + b"\0" * (-len(body) % block)


def unpad(data: bytes, where: str) -> bytes:
    if len(data) < 4:
        raise CryptoError(f"{where}: sealed content too short")
    (n,) = struct.unpack_from("<I", data)
    if n > len(data) - 4 or any(data[4 + n:]):
        raise CryptoError(f"{where}: sealed content has a bad length or padding")
    return data[4 : 4 + n]


def _hkdf(master: bytes, info: bytes) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(master)


def aad(object_key: str, position: str) -> bytes:
    return AAD_PREFIX + object_key.encode() + b"\0" + position.encode()


class ObjectCipher:
    """Seals and opens the pieces of one object (its key is bound into every piece)."""

    def __init__(self, aes: AESGCM, object_key: str) -> None:
        self._aes = aes
        self.object_key = object_key

    def seal(self, position: str, data: bytes) -> bytes:
        nonce = os.urandom(NONCE)
        return nonce + self._aes.encrypt(nonce, data, aad(self.object_key, position))

    def open(self, position: str, blob: bytes, where: str) -> bytes:
        from cryptography.exceptions import InvalidTag

        if len(blob) < OVERHEAD:
            raise CryptoError(f"{where}: sealed {position} is truncated ({len(blob)} bytes)")
        try:
            return self._aes.decrypt(blob[:NONCE], blob[NONCE:], aad(self.object_key, position))
        except InvalidTag:
            raise CryptoError(
                f"{where}: {position} fails authentication (tampered, truncated, moved from "
                "another object or place, or sealed with another key)") from None


class Crypto:
    """An unlocked store: the master key, and which key file opened it."""

    def __init__(self, master: bytes, key_id: str = "") -> None:
        if len(master) != MASTER_BYTES:
            raise CryptoError("master key has the wrong length")
        self._master = master
        self.key_id = key_id
        self.fingerprint = _hkdf(master, b"syncd/2 fingerprint")[:8].hex()
        self._ciphers: OrderedDict[str, ObjectCipher] = OrderedDict()
        self._lock = threading.Lock()  # machines' heads are read by 32 threads at once

    def __repr__(self) -> str:  # never the key itself
        return f"Crypto(fingerprint={self.fingerprint}, key_id={self.key_id})"

    @property
    def master(self) -> bytes:
        return self._master

    def cipher(self, object_key: str) -> ObjectCipher:
        with self._lock:
            c = self._ciphers.get(object_key)
            if c is not None:
                self._ciphers.move_to_end(object_key)
                return c
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        sub = _hkdf(self._master, b"syncd/2 object\0" + object_key.encode())
        c = ObjectCipher(AESGCM(sub), object_key)
        with self._lock:
            self._ciphers[object_key] = c
            while len(self._ciphers) > 256:
                self._ciphers.popitem(last=False)
        return c

    def seal_box(self, object_key: str, position: str, data: bytes) -> bytes:
        """A small object sealed whole (machine.json): header, then one padded piece."""
        head = BOX_HEADER.pack(BOX_MAGIC, BOX_VERSION, FLAG_SEALED, 0)
        return head + self.cipher(object_key).seal(position, pad(data))

    def open_box(self, object_key: str, position: str, blob: bytes, where: str) -> bytes:
        if not is_box(blob):
            raise CryptoError(f"{where}: not encrypted, but the store is: refusing it "
                              "(tampered or foreign object)")
        _, version, flags, reserved = BOX_HEADER.unpack_from(blob)
        if (version, flags, reserved) != (BOX_VERSION, FLAG_SEALED, 0):
            raise CryptoError(f"{where}: unsupported sealed object (version {version}, "
                              f"flags {flags})")
        plain = self.cipher(object_key).open(position, blob[BOX_HEADER.size:], where)
        return unpad(plain, where)


def is_box(blob: bytes) -> bool:
    return blob[: len(BOX_MAGIC)] == BOX_MAGIC


def new_master() -> bytes:
    return os.urandom(MASTER_BYTES)


# -- key files --------------------------------------------------------------------------

@dataclass(frozen=True)
class KeyFile:
    """A key file's public fields (what ``syncd key list`` shows)."""

    key_id: str
    created: float
    master: str  # fingerprint of the master key it wraps
    n: int
    r: int
    p: int


def _canonical(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def scrypt_within_bounds(n: int, r: int, p: int) -> bool:
    """Parameters a reader derives (n a power of two; memory and work bounded)."""
    return (n >= 2 and not n & (n - 1) and 1 <= r <= _MAX_R and 1 <= p <= _MAX_P
            and 128 * r * n <= MAX_SCRYPT_MEMORY and n * r * p <= MAX_SCRYPT_WORK)


def _beyond_bounds(where: str, n: int, r: int, p: int) -> CryptoError:
    return CryptoError(
        f"refusing key file {where}: scrypt parameters beyond syncd's bounds (n={n}, r={r}, "
        f"p={p}; at most {MAX_SCRYPT_MEMORY >> 20} MiB and n*r*p <= {MAX_SCRYPT_WORK})")


def _kek(passphrase: str, salt: bytes, n: int, r: int, p: int) -> AESGCM:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

    return AESGCM(Scrypt(salt=salt, length=32, n=n, r=r, p=p).derive(
        normalize_passphrase(passphrase)))


def wrap(crypto: Crypto, passphrase: str, key_id: str, object_key: str, *,
         n: int = SCRYPT_N, r: int = SCRYPT_R, p: int = SCRYPT_P,
         now: float | None = None) -> bytes:
    """The bytes of a key file: the master key wrapped under ``passphrase``.

    Every field but the wrapped key itself is associated data, and the file is stored in
    canonical JSON, so a change to any byte is detected.
    """
    if not passphrase:
        raise CryptoError("the passphrase is empty")
    if not scrypt_within_bounds(n, r, p):  # a key file no reader would try
        raise _beyond_bounds(object_key, n, r, p)
    salt = os.urandom(SALT_BYTES)
    nonce = os.urandom(NONCE)
    doc: dict[str, Any] = {
        "syncd_key": 1, "id": key_id, "created": round(time.time() if now is None else now, 3),
        "master": crypto.fingerprint, "cipher": "AES-256-GCM",
        "kdf": {"name": "scrypt", "n": n, "r": r, "p": p, "salt": _b64(salt)},
        "nonce": _b64(nonce)}
    wrapped = _kek(passphrase, salt, n, r, p).encrypt(
        nonce, crypto.master, aad(object_key, "key") + b"\0" + _canonical(doc))
    doc["wrapped"] = _b64(wrapped)
    return _canonical(doc)


@dataclass(frozen=True)
class _Parsed:
    doc: dict[str, Any]
    public: KeyFile
    salt: bytes
    nonce: bytes
    wrapped: bytes


def _parse(raw: bytes, where: str) -> _Parsed:
    """A key file, every field checked: a changed byte is caught here or by the tag.

    Nothing here derives: a key file refused here costs nothing but its parsing.
    """
    if len(raw) > KEY_FILE_MAX_BYTES:
        raise CryptoError(f"refusing key file {where}: more than {KEY_FILE_MAX_BYTES} bytes "
                          "(a key file holds ~400)")
    try:
        doc = untrusted.loads(raw)
        if not isinstance(doc, dict) or _canonical(doc) != raw:
            raise ValueError("not in canonical form")
        if set(doc) != {"syncd_key", "id", "created", "master", "cipher", "kdf", "nonce",
                        "wrapped"}:
            raise ValueError("unexpected fields")
        kdf = doc["kdf"]
        if doc["syncd_key"] != 1 or doc["cipher"] != "AES-256-GCM" or not isinstance(
                kdf, dict) or set(kdf) != {"name", "n", "r", "p", "salt"} or \
                kdf["name"] != "scrypt":
            raise ValueError("unknown key file version, cipher or KDF")
        n, r, p = kdf["n"], kdf["r"], kdf["p"]
        if not all(type(v) is int for v in (n, r, p)):
            raise ValueError("scrypt parameters are not integers")
        if n < 2 or n & (n - 1) or r < 1 or p < 1:
            raise ValueError(f"scrypt parameters invalid (n={n}, r={r}, p={p})")
        if not all(isinstance(doc[f], str) for f in ("id", "master", "nonce", "wrapped")) or \
                not isinstance(kdf["salt"], str) or type(doc["created"]) not in (int, float):
            raise ValueError("a field has the wrong type")
        salt = base64.b64decode(kdf["salt"], validate=True)
        nonce = base64.b64decode(doc["nonce"], validate=True)
        wrapped = base64.b64decode(doc["wrapped"], validate=True)
        if len(nonce) != NONCE or len(salt) < 8 or len(wrapped) != MASTER_BYTES + TAG:
            raise ValueError("bad nonce, salt or wrapped key length")
    except (ValueError, KeyError, TypeError, RecursionError) as e:  # [[[… nests too deep
        raise CryptoError(f"{where}: unreadable key file (tampered or truncated): {e}") from None
    if not scrypt_within_bounds(n, r, p):
        raise _beyond_bounds(where, n, r, p)
    public = KeyFile(doc["id"], float(doc["created"]), doc["master"], n, r, p)
    return _Parsed(doc, public, salt, nonce, wrapped)


def describe(raw: bytes, where: str) -> KeyFile:
    return _parse(raw, where).public


def unwrap(raw: bytes, passphrase: str, object_key: str, where: str) -> Crypto:
    """Open a key file; ``BadPassphrase`` when the tag does not verify."""
    from cryptography.exceptions import InvalidTag

    k = _parse(raw, where)
    public = {f: v for f, v in k.doc.items() if f != "wrapped"}
    try:
        master = _kek(passphrase, k.salt, k.public.n, k.public.r, k.public.p).decrypt(
            k.nonce, k.wrapped, aad(object_key, "key") + b"\0" + _canonical(public))
    except InvalidTag:
        raise BadPassphrase(f"{where}: does not open with this passphrase (wrong passphrase, "
                            "or the key file was altered)") from None
    crypto = Crypto(master, k.public.key_id)
    if crypto.fingerprint != k.public.master:
        raise CryptoError(f"{where}: key file holds another master key than it claims "
                          "(tampered)")
    return crypto

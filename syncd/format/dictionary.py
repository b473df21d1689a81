"""A zstd dictionary trained on this machine's own transcripts, for the small frames of
flushes (a few appended lines each, where a plain zstd frame has no history to draw on).

Stored content-addressed (``machines/<id>/dict/<sha256>``, sealed like machine.json in
an encrypted store); a segment names the dictionary its frames used. Adopted only when
it shrinks held-out samples by at least ``MIN_GAIN``.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections import OrderedDict
from pathlib import Path

import zstandard

from syncd.errors import AlreadyExists, CryptoError, FormatError
from syncd.security.crypto import Crypto, is_box
from syncd.store import Store, get_small, layout

DICT_SIZE = 64 << 10
MIN_GAIN = 0.10
SAMPLE_BYTES = 8 << 20
MIN_SAMPLES = 500
_POSITION = "dict"


class Dictionary:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.id = hashlib.sha256(data).hexdigest()
        self.zdict = zstandard.ZstdCompressionDict(data)


def samples(root: Path) -> list[bytes]:
    """Runs of 1-3 lines, the size of what one flush appends, from the newest transcripts."""
    files = []
    for p in (root / "projects").glob("**/*.jsonl"):
        with contextlib.suppress(OSError):
            files.append((p.stat().st_mtime, p))
    out: list[bytes] = []
    budget = SAMPLE_BYTES
    for _, p in sorted(files, reverse=True):
        if budget <= 0:
            break
        try:
            with open(p, "rb") as f:
                f.seek(max(0, p.stat().st_size - (1 << 20)))
                lines = f.read(min(budget, 1 << 20)).split(b"\n")[1:-1]
        except OSError:
            continue
        for i in range(0, len(lines), 2):
            chunk = b"\n".join(lines[i : i + 1 + i % 3]) + b"\n"
            out.append(chunk)
            budget -= len(chunk)
    return out


def train(root: Path, level: int = 3) -> tuple[Dictionary | None, float | None]:
    """A dictionary from the tree's transcripts and its gain on held-out samples
    (None when it would not pay; a gain of None: too little to learn from)."""
    got = samples(root)
    if len(got) < MIN_SAMPLES:
        return None, None
    held = got[::5]
    learn: list[bytes | bytearray | memoryview] = [s for i, s in enumerate(got) if i % 5]
    try:
        zd = zstandard.train_dictionary(DICT_SIZE, learn, level=level)
    except zstandard.ZstdError:
        return None, None
    plain = zstandard.ZstdCompressor(level=level)
    with_dict = zstandard.ZstdCompressor(level=level, dict_data=zd)
    before = sum(len(plain.compress(s)) for s in held)
    after = sum(len(with_dict.compress(s)) for s in held)
    gain = 1 - after / before
    return (Dictionary(zd.as_bytes()) if gain >= MIN_GAIN else None), gain


def publish(store: Store, machine: str, d: Dictionary, crypto: Crypto | None) -> str:
    key = layout.dict_key(machine, d.id)
    blob = d.data if crypto is None else crypto.seal_box(key, _POSITION, d.data)
    with contextlib.suppress(AlreadyExists):  # content-addressed: the same bytes
        store.put(key, blob)
    return key


# A store's indexes can name any number of dictionaries: the cache keeps the last few.
_cache: OrderedDict[tuple[str, str], Dictionary] = OrderedDict()
_cache_lock = threading.Lock()
_CACHE_MAX = 8


def fetch(store: Store, machine: str, dict_id: str, crypto: Crypto | None) -> Dictionary:
    """The dictionary ``dict_id`` of ``machine`` (cached), checked against its id."""
    key = layout.dict_key(machine, dict_id)
    with _cache_lock:
        hit = _cache.get((store.url, key))
    if hit is not None:
        return hit
    where = f"{store.url}{key}"
    blob = get_small(store, key, DICT_SIZE + 1024)  # a sealed box adds under 1 KiB
    try:
        if crypto is not None:
            blob = crypto.open_box(key, _POSITION, blob, where)
        elif is_box(blob):
            raise FormatError(f"{where}: encrypted, but no key is loaded")
    except CryptoError as e:
        raise FormatError(str(e)) from None
    d = Dictionary(blob)
    if d.id != dict_id:
        raise FormatError(f"{where}: dictionary content does not match its id (corrupted)")
    with _cache_lock:
        _cache[(store.url, key)] = d
        while len(_cache) > _CACHE_MAX:
            _cache.popitem(last=False)
    return d


def machine_of(key: str) -> str:
    parts = key.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "machines" else ""


__all__ = ["Dictionary", "fetch", "machine_of", "publish", "train"]

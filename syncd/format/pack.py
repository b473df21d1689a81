"""Packs: compacted data, a segment container whose index says ``"kind": "pack"``.

``Spool`` copies the source objects of a compaction to local files once each;
``PackWriter`` cuts what compaction hands it into packs of about ``target`` bytes,
compressing frames a batch at a time on every core.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import tempfile
from pathlib import Path

import zstandard

from syncd.errors import FormatError
from syncd.format.reader import dictionary_for
from syncd.format.segment import THREADS, Extent, SegmentWriter, decode_extent
from syncd.format.snapshot import Entry, history_sids
from syncd.private import private_dir
from syncd.security.crypto import Crypto
from syncd.store import Store, layout

PACK_KIND = "pack"
HISTORY = b"history.jsonl"
_SPOOL_CHUNK = 8 << 20
# Raw bytes compressed together, one frame per core at a time: bounded memory.
BATCH = 16 << 20
_PLACEHOLDER = Extent(b"", 0, 0, 0, 0, 0, "", 0, 0)


class Spool:
    """Source objects copied to local files once each, read back by range.

    A file's extents are spread over many segments; this reads every object once, in
    bounded memory, whatever order the files are written in.
    """

    def __init__(self, store: Store, crypto: Crypto | None, where: Path | None) -> None:
        self.store, self.crypto = store, crypto
        if where is not None:
            private_dir(where)
        self._dir = tempfile.TemporaryDirectory(prefix="syncd-compact-", dir=where)
        self._fds: dict[str, int] = {}

    def read(self, key: str, x: Extent) -> bytes:
        fd = self._fds.get(key)
        if fd is None:
            fd = self._fds[key] = self._fetch(key)
        frame = os.pread(fd, x.clen, x.off)
        if len(frame) != x.clen:
            raise FormatError(f"{self.store.url}{key}: extent of {x.path!r} lies outside "
                              "the object")
        return decode_extent(frame, x, f"{self.store.url}{key}",
                             None if self.crypto is None else self.crypto.cipher(key),
                             dictionary_for(self.store, key, x, self.crypto))

    def _fetch(self, key: str) -> int:
        path = os.path.join(self._dir.name, hashlib.sha256(key.encode()).hexdigest())
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        info = self.store.head(key)
        if info is None:
            os.close(fd)
            raise FormatError(f"{self.store.url}{key}: object is missing")
        for start in range(0, info.size, _SPOOL_CHUNK):
            os.write(fd, self.store.get(key, start, min(_SPOOL_CHUNK, info.size - start)))
        return fd

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._dir.cleanup()


class PackWriter:
    """Packs of at most ``pack_target`` bytes, each PUT as soon as it is full.

    Frames are queued and compressed a batch at a time on every core (zstd's own
    threads, outside the GIL); each lands in its entry's extent list at the place it
    was queued for.
    """

    def __init__(self, store: Store, machine: str, lo: int, hi: int, time_: float,
                 crypto: Crypto | None, *, level: int, target: int,
                 written: list[tuple[str, int]]) -> None:
        self.store, self.machine, self.lo, self.hi, self.time = store, machine, lo, hi, time_
        self.crypto, self.level, self.target, self.written = crypto, level, target, written
        self.zstd = zstandard.ZstdCompressor(level=level, write_content_size=True)
        self.key = ""
        self.w: SegmentWriter | None = None
        self._queue: list[tuple[Entry, int, bytes, list[tuple[str, Extent]], int]] = []
        self._queued = 0

    def add(self, e: Entry, start: int, raw: bytes, into: list[tuple[str, Extent]]) -> None:
        """Queue ``raw`` (bytes from ``start`` of ``e``); its extent goes to ``into``."""
        into.append(("", _PLACEHOLDER))
        self._queue.append((e, start, raw, into, len(into) - 1))
        self._queued += len(raw)
        if self._queued >= BATCH:
            self.drain()

    def drain(self) -> None:
        if not self._queue:
            return
        frames = self.zstd.multi_compress_to_buffer([q[2] for q in self._queue],
                                                    threads=THREADS)
        for i, (e, start, raw, into, at) in enumerate(self._queue):
            if self.w is None:
                self.key = layout.pack_key(self.machine, self.lo, self.hi, secrets.token_hex(4))
                self.w = SegmentWriter(self.machine, self.hi, self.time, level=self.level,
                                       cipher=None if self.crypto is None
                                       else self.crypto.cipher(self.key))
            self.w.add_frame(e.path, e.gen, start, len(raw), frames[i].tobytes(),
                             hashlib.sha256(raw).hexdigest(), mode=e.mode, mtime_ns=e.mtime_ns)
            into[at] = (self.key, self.w.index.extents[-1])
            if e.path == HISTORY:
                ids = history_sids(raw)
                if ids is not None:
                    e.sids[(self.key, self.w.index.extents[-1].off)] = ids
            if self.w.size >= self.target or self.w.full:
                self.flush()
        self._queue, self._queued = [], 0

    def flush(self) -> None:
        if self.w is None or self.w.empty:
            return
        self.w.index.extra = {"kind": PACK_KIND, "lo": self.lo, "hi": self.hi}
        blob = self.w.finish()
        self.store.put(self.key, blob)
        self.written.append((self.key, len(blob)))
        self.w = None

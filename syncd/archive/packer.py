"""Writing packs: ``Spool`` copies the source objects of a compaction to local files
once each; ``PackWriter`` cuts what compaction hands it into packs of about ``target``
bytes, compressing frames a batch at a time on every core. (A pack is a segment
container whose index says ``"kind": "pack"``: docs/FORMAT.md.)
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import zstandard

from syncd.errors import CompactError, FormatError, StoreError
from syncd.format.segment import (
    PACK_KIND,
    THREADS,
    Extent,
    LastFrame,
    SegmentWriter,
    check_extent,
    decode_extent,
)
from syncd.format.snapshot import HISTORY, Entry, history_sids
from syncd.private import private_dir
from syncd.repository import Repository
from syncd.store import layout

_SPOOL_CHUNK = 8 << 20
# Raw bytes compressed together, one frame per core at a time: bounded memory.
BATCH = 16 << 20
_PLACEHOLDER = Extent(b"", 0, 0, 0, 0, 0, "", 0, 0)


class Spool:
    """Source objects copied to local files once each, read back by range.

    A file's extents are spread over many segments; this reads every object once, in
    bounded memory, whatever order the files are written in. Only as much of an object
    is copied as the extents read from it reach, never what its size says.
    """

    def __init__(self, repo: Repository, where: Path | None) -> None:
        self.repo = repo
        if where is not None:
            private_dir(where)
        self._dir = tempfile.TemporaryDirectory(prefix="syncd-compact-", dir=where)
        self._files: dict[str, tuple[int, int]] = {}  # key -> (fd, bytes copied)
        self._last = LastFrame()  # (one frame held, whichever object it is of)

    def read(self, key: str, x: Extent) -> bytes:
        where = self.repo.where(key)
        check_extent(x, where)

        def decode(x: Extent) -> bytes:
            fd = self._copy(key, x.off + x.clen)
            frame = os.pread(fd, x.clen, x.off)
            if len(frame) != x.clen:
                raise FormatError(f"{where}: extent of {x.path!r} lies outside the object")
            return decode_extent(frame, x, where, self.repo.cipher(key),
                                 self.repo.frame_dictionary(key, x))

        return self._last.bytes_of(x, decode)

    def _copy(self, key: str, upto: int) -> int:
        """The spool file of ``key``, holding at least its first ``upto`` bytes."""
        fd, have = self._files.get(key, (-1, 0))
        if fd < 0:
            path = os.path.join(self._dir.name, hashlib.sha256(key.encode()).hexdigest())
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            self._files[key] = (fd, 0)
        while have < upto:
            chunk = self.repo.read_range(key, have, _SPOOL_CHUNK)
            if not chunk:
                break  # the object ends here: the caller's read comes up short
            os.pwrite(fd, chunk, have)
            have += len(chunk)
            self._files[key] = (fd, have)
        return fd

    def close(self) -> None:
        for fd, _ in self._files.values():
            os.close(fd)
        self._dir.cleanup()


@contextlib.contextmanager
def spooled(repo: Repository, where: Path | None) -> Iterator[Spool]:
    """A spool for one compaction's reads; what fails while it is used (a damaged or
    missing object, the spool's own files) stops the compaction, nothing deleted."""
    machine = repo.machine
    try:
        spool = Spool(repo, where)
    except OSError as ex:
        raise CompactError(f"compaction of {machine}: cannot create a spool directory in "
                           f"{where or 'the temp dir'}: {ex.strerror}") from ex
    try:
        yield spool
    except (FormatError, StoreError) as ex:
        raise CompactError(f"compaction of {machine} stopped, nothing deleted: {ex}") from ex
    except OSError as ex:
        raise CompactError(f"compaction of {machine} stopped, nothing deleted: spool "
                           f"{ex.filename or ''}: {ex.strerror}") from ex
    finally:
        spool.close()


class PackWriter:
    """Packs of at most ``pack_target`` bytes, each PUT as soon as it is full.

    Frames are queued and compressed a batch at a time on every core (zstd's own
    threads, outside the GIL); each lands in its entry's extent list at the place it
    was queued for.
    """

    def __init__(self, repo: Repository, lo: int, hi: int, time_: float, *, level: int,
                 target: int, written: list[tuple[str, int]],
                 transform: Callable[[Entry, int, bytes], bytes] | None = None) -> None:
        self.repo, self.lo, self.hi, self.time = repo, lo, hi, time_
        # A rewrite's masks (``archive.rewrite``): same-length bytes for those at ``start``.
        self.transform = transform
        self.level, self.target, self.written = level, target, written
        self.zstd = zstandard.ZstdCompressor(level=level, write_content_size=True)
        self.key = ""
        self.w: SegmentWriter | None = None
        self._queue: list[tuple[Entry, int, bytes, list[tuple[str, Extent]], int]] = []
        self._queued = 0

    def add(self, e: Entry, start: int, raw: bytes, into: list[tuple[str, Extent]]) -> None:
        """Queue ``raw`` (bytes from ``start`` of ``e``); its extent goes to ``into``."""
        if self.transform is not None:
            raw = self.transform(e, start, raw)
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
                machine = self.repo.machine
                self.key = layout.pack_key(machine, self.lo, self.hi, secrets.token_hex(4))
                self.w = SegmentWriter(machine, self.hi, self.time, level=self.level,
                                       cipher=self.repo.cipher(self.key))
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
        self.repo.put(self.key, blob)
        self.written.append((self.key, len(blob)))
        self.w = None

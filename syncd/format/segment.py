"""The segment format: one immutable object per flush (see docs/FORMAT.md).

    header  16 B   magic "SYNCDSEG", u16 version, u16 flags, u32 reserved
    frames         one zstd frame per extent (at most FRAME_MAX raw bytes each)
    index          zstd-compressed JSON: who wrote it, when, and every entry
    trailer 56 B   u64 index offset, u32 index length, 4 B zero,
                   sha256 of the compressed index, magic "SYNCDEND"

A reader fetches the trailer and index with one suffix GET, then only the frames
it needs with ranged GETs. Every extent carries the sha256 of its raw bytes.

A sealed segment (encrypted store) is version 2 with flag 1: each frame is
``nonce || AES-GCM(zstd frame) || tag`` bound to its object key and offset, the index
is sealed the same way (padded), and the trailer ends in "SYNCDEN2".
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import struct
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

import zstandard

from syncd import untrusted
from syncd.errors import CryptoError, FormatError
from syncd.format.catalog import is_session_id
from syncd.security.crypto import PAD_BLOCK, ObjectCipher, pad, unpad
from syncd.worker import worker

# An index's "kind" (docs/FORMAT.md): packs and snapshot manifests share the container.
PACK_KIND = "pack"
MAGIC = b"SYNCDSEG"
END_MAGIC = b"SYNCDEND"
END_MAGIC_SEALED = b"SYNCDEN2"
VERSION = 1
SEALED_VERSION = 2
FLAG_SEALED = 1
HEADER = struct.Struct("<8sHHI")
TRAILER = struct.Struct("<QI4x32s8s")
FRAME_MAX = 4 << 20
# A zstd frame of FRAME_MAX raw bytes is at most this long stored (compressBound, plus a
# seal's nonce and tag): a reader refuses longer ones before fetching them.
FRAME_STORED_MAX = FRAME_MAX + (FRAME_MAX >> 8) + (1 << 10)
# Reader limits (docs/FORMAT.md): what an index may expand to, absolutely and per stored
# byte (an index's entries carry sha256 digests: real ones compress 3 to 10 times). A
# store's object can claim any size; memory is bounded by these, never by the claim.
INDEX_MAX = 64 << 20
EXPANSION_MAX = 64
EXPANSION_FLOOR = 1 << 20
# A writer starts another object before its index reaches either of these, far below
# what readers accept.
MAX_ENTRIES = 32768
INDEX_TARGET = 16 << 20
# A reader refuses a segment, pack or delta index naming more entries (data and delete)
# than this, or more sessions, or more projects: a writer puts at most MAX_ENTRIES, plus
# the frames of the one file it was reading, in one index (docs/FORMAT.md). Each entry
# costs a few hundred bytes held (an index of a million tombstones fits in 64 MiB of JSON
# and takes ~130 MB as objects, ~450 MB while parsed).
ENTRIES_MAX = 2 * MAX_ENTRIES
# Index bytes of one entry besides its path (numbers, the sha256, the keys).
_ENTRY_BYTES = 320
# Frames with fewer raw bytes than this use the trained dictionary, when there is one.
DICT_FRAME_MAX = 64 << 10
# Suffix read that usually brings the whole index along with the trailer.
TAIL_READ = 8 << 10


def decompress_exact(frame: bytes, size: int, where: str,
                     dctx: zstandard.ZstdDecompressor | None = None) -> bytes:
    """The ``size`` raw bytes of one zstd frame, or ``FormatError``.

    python-zstandard allocates what a frame header claims, whatever ``max_output_size``
    says: the claim is checked against what we expect before anything is allocated, and
    a frame without one is read as a stream, never past ``size`` + 1 bytes.
    """
    dctx = dctx or zstandard.ZstdDecompressor()
    try:
        declared = zstandard.frame_content_size(frame)
        if declared >= 0:
            if declared != size:
                raise FormatError(f"{where}: frame claims {declared} bytes, {size} expected")
            return dctx.decompress(frame, max_output_size=max(size, 1))
        with dctx.stream_reader(frame, read_across_frames=False) as r:
            data = r.read(size + 1)
    except zstandard.ZstdError as e:
        raise FormatError(f"{where}: corrupted frame: {e}") from e
    if len(data) != size:
        raise FormatError(f"{where}: frame holds {'more' if len(data) > size else len(data)} "
                          f"bytes, {size} expected")
    return data


def expansion_limit(stored: int, cap: int) -> int:
    """What ``stored`` bytes of compressed JSON may expand to: ``cap``, and no more than a
    real index or group could (see EXPANSION_MAX)."""
    return min(cap, EXPANSION_MAX * stored + EXPANSION_FLOOR)


def decompress_capped(blob: bytes, limit: int, where: str) -> bytes:
    """One zstd frame that may expand to at most ``limit`` bytes, or ``FormatError``."""
    try:
        declared = zstandard.frame_content_size(blob)
        if declared > limit:
            raise FormatError(f"{where}: claims {declared} bytes, more than the {limit} "
                              "a reader accepts (refusing it)")
        if declared >= 0:
            return decompress_exact(blob, declared, where)
        parts: list[bytes] = []
        total = 0
        with zstandard.ZstdDecompressor().stream_reader(blob, read_across_frames=False) as r:
            while chunk := r.read(1 << 20):
                total += len(chunk)
                if total > limit:
                    raise FormatError(f"{where}: expands beyond the {limit} bytes a reader "
                                      "accepts (refusing it)")
                parts.append(chunk)
    except zstandard.ZstdError as e:
        raise FormatError(f"{where}: corrupted frame: {e}") from e
    return b"".join(parts)


def encode_path(path: bytes) -> dict[str, str]:
    """JSON holds text; a name that is not UTF-8 travels as base64 of its raw bytes."""
    try:
        return {"path": path.decode("utf-8")}
    except UnicodeDecodeError:
        return {"path_b64": base64.b64encode(path).decode("ascii")}


def decode_path(entry: dict[str, Any]) -> bytes:
    if "path_b64" in entry:
        return base64.b64decode(entry["path_b64"], validate=True)
    return str(entry["path"]).encode("utf-8")


# The latest time a reader accepts (9999-12-31T23:59:59Z): every time can be printed.
TIME_MAX = 253402300799.0


def when(v: Any) -> float:
    """A time from an index: a number of seconds since the epoch that a writer could have
    written (not a string, not NaN or infinite, not before 1970 or after 9999)."""
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= TIME_MAX:
        raise ValueError(f"not a time: {v!r}")
    return float(v)


@dataclass(frozen=True, slots=True)
class Extent:
    """Bytes [start, end) of one generation of a file, stored at [off, off+clen)."""

    path: bytes
    gen: int
    start: int
    end: int
    off: int
    clen: int
    sha256: str
    mode: int
    mtime_ns: int
    reason: str | None = None
    # The id of the trained dictionary this frame was compressed with (None: none).
    dict_id: str | None = None
    # A part of a frame (bytes another generation shares, see ``Copy``): the frame holds
    # ``frame`` raw bytes, of which this extent is those from ``skip`` on. 0: all of it.
    skip: int = 0
    frame: int = 0

    @property
    def raw(self) -> int:
        """Raw bytes of the frame (more than ``end - start`` for a part of one)."""
        return self.frame or self.end - self.start

    def part(self, path: bytes, gen: int, lo: int, hi: int, at: int) -> Extent:
        """Bytes [lo, hi) of this extent as bytes from ``at`` of generation ``gen`` of
        ``path``: the same frame, read in part."""
        return replace(self, path=path, gen=gen, start=at, end=at + hi - lo,
                       skip=self.skip + lo - self.start, frame=self.raw)


@dataclass(frozen=True, slots=True)
class Copy:
    """Bytes [at, at + end - start) of generation ``gen`` of ``path`` are bytes
    [start, end) of generation ``src_gen`` of ``src`` (docs/FORMAT.md, "Copies"): a cut
    tail, a moved session or a rewrite ships only what is new."""

    path: bytes
    gen: int
    at: int
    src: bytes
    src_gen: int
    start: int
    end: int
    mode: int
    mtime_ns: int
    reason: str | None = None

    @property
    def stop(self) -> int:
        return self.at + self.end - self.start


@dataclass(frozen=True, slots=True)
class Tombstone:
    """The file was gone from the tree at ``time`` (seconds since the epoch)."""

    path: bytes
    gen: int
    time: float


@dataclass(slots=True)
class SegmentIndex:
    machine: str
    seq: int
    time: float
    extents: list[Extent] = field(default_factory=list)
    tombstones: list[Tombstone] = field(default_factory=list)
    copies: list[Copy] = field(default_factory=list)
    # Catalog: transcript path → (generation, fields found in this segment's new lines).
    sessions: dict[bytes, tuple[int, dict[str, str]]] = field(default_factory=dict)
    # What git said about project directories first seen in this segment.
    projects: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Keys of packs and snapshot manifests (docs/FORMAT.md), which share this container.
    extra: dict[str, Any] = field(default_factory=dict)
    # Tombstones of forgotten sessions (``forget`` entries): (session id, when forgotten).
    forgotten: list[tuple[str, float]] = field(default_factory=list)
    # Tombstones of redactions (``redact`` entries): what was masked in a session's files.
    redacted: list[Redaction] = field(default_factory=list)


# A redact entry names at most this many values, each 1 to VALUE_MAX bytes long.
REDACT_VALUES_MAX = 256
REDACT_VALUE_MAX = 65536


@dataclass(frozen=True, slots=True)
class Redaction:
    """A redact entry: the values masked in ``session``'s files at ``time``, each as the
    sha256 (hex) of its bytes and its length; never the value."""
    session: str
    time: float
    values: tuple[tuple[str, int], ...]

    def encode(self) -> dict[str, Any]:
        return {"op": "redact", "session": self.session, "time": self.time,
                "values": [[d, n] for d, n in self.values]}


def redaction(d: dict[str, Any]) -> Redaction:
    """A redact entry (or a head's), with only the values a writer makes, else
    ``ValueError``."""
    sid, values = d["session"], d["values"]
    if not isinstance(sid, str) or not is_session_id(sid):
        raise ValueError(f"redact entry of {str(sid)[:80]!r}, which is no session id")
    if not isinstance(values, list) or not 0 < len(values) <= REDACT_VALUES_MAX:
        raise ValueError(f"redact entry of {sid} with no values or more than "
                         f"{REDACT_VALUES_MAX}")
    out = []
    for v in values:
        if not (isinstance(v, list) and len(v) == 2 and isinstance(v[0], str)
                and len(v[0]) == 64 and all(c in "0123456789abcdef" for c in v[0])
                and type(v[1]) is int and 0 < v[1] <= REDACT_VALUE_MAX):
            raise ValueError(f"redact entry of {sid} names {str(v)[:100]!r}, not "
                             f"[sha256 hex, length 1..{REDACT_VALUE_MAX}]")
        out.append((v[0], v[1]))
    return Redaction(sid, when(d["time"]), tuple(out))


# Bytes an object takes beyond what sys.getsizeof says (the allocator rounds up to 16
# bytes, 8 on average), and a list's or dict's slot for it.
_ROUNDING = 8
_SLOT = 8


def index_bytes(ix: SegmentIndex) -> int:
    """The memory ``ix`` holds, estimated from its entries and the sizes of their strings
    and numbers, never less than it takes (what a cache of indexes counts)."""
    size = sys.getsizeof
    n = size(ix) + size(ix.extents) + size(ix.tombstones) + size(ix.sessions) + \
        _json_bytes(ix.machine) + _json_bytes(ix.projects) + _json_bytes(ix.extra)
    for x in ix.extents:
        n += size(x) + size(x.path) + size(x.sha256) + size(x.reason) + size(x.gen) + \
            size(x.start) + size(x.end) + size(x.off) + size(x.clen) + size(x.mode) + \
            size(x.mtime_ns) + 11 * _ROUNDING + _SLOT
    for t in ix.tombstones:
        n += size(t) + size(t.path) + size(t.gen) + size(t.time) + 4 * _ROUNDING + _SLOT
    for c in ix.copies:
        n += size(c) + size(c.path) + size(c.src) + size(c.reason) + 8 * size(c.at) + \
            11 * _ROUNDING + _SLOT
    for sid, at in ix.forgotten:
        n += size((sid, at)) + size(sid) + size(at) + 3 * _ROUNDING + _SLOT
    for r in ix.redacted:
        n += size(r) + size(r.session) + size(r.values) + 4 * _ROUNDING + _SLOT + \
            len(r.values) * (size(("", 0)) + 2 * size(r.values[0][0]) + 3 * _ROUNDING)
    for path, (gen, fields) in ix.sessions.items():
        # The dict's slot (its table has room to spare), the key, the tuple, the fields.
        n += 4 * _SLOT + size(path) + size((gen, fields)) + size(gen) + 3 * _ROUNDING + \
            _json_bytes(fields)
    return n


def _json_bytes(value: Any) -> int:
    """What a parsed JSON value holds (walked without recursion: it may nest deeply)."""
    n = 0
    todo = [value]
    while todo:
        v = todo.pop()
        n += sys.getsizeof(v) + _ROUNDING
        if isinstance(v, dict):
            todo.extend(v.keys())
            todo.extend(v.values())
        elif isinstance(v, list | tuple):
            todo.extend(v)
    return n


# Keys of packs, manifests and lost segments' stand-ins (docs/FORMAT.md).
_EXTRA = frozenset({"kind", "lo", "hi", "rev", "first_time", "objects", "sids", "lost",
                    "paths", "points"})


# Frames are compressed BATCH_BYTES at a time; those of at least BATCH_MIN raw bytes
# together, on every core.
BATCH_MIN = 256 << 10
BATCH_BYTES = 8 << 20
THREADS = os.cpu_count() or 1

# A frame waiting to be compressed: path, gen, start, raw bytes, mode, mtime_ns, reason.
_Pending = tuple[bytes, int, int, bytes, int, int, str | None]


class SegmentWriter:
    """Builds one segment in memory; extents are compressed (and sealed) in the order
    they are added, big ones a batch at a time (``size``, ``empty`` and ``finish`` see
    every extent added).

    With a ``cipher`` (the segment's object key bound in) the segment is sealed.
    """

    def __init__(self, machine: str, seq: int, time: float, level: int = 3,
                 cipher: ObjectCipher | None = None,
                 dictionary: tuple[str, zstandard.ZstdCompressionDict] | None = None,
                 index_level: int = 3) -> None:
        self.index = SegmentIndex(machine, seq, time)
        self.cipher = cipher
        version, flags = (SEALED_VERSION, FLAG_SEALED) if cipher else (VERSION, 0)
        self._parts: list[bytes] = [HEADER.pack(MAGIC, version, flags, 0)]
        self._size = HEADER.size
        self._zstd = zstandard.ZstdCompressor(level=level, write_content_size=True)
        # The index is small and read on every restore: the fast level, but for objects
        # kept for long (a delta's index is most of its bytes).
        self._index_zstd = zstandard.ZstdCompressor(level=index_level, write_content_size=True)
        self._dict_id = dictionary[0] if dictionary else None
        self._dict_zstd = zstandard.ZstdCompressor(
            level=level, write_content_size=True, dict_data=dictionary[1]) if dictionary else None
        self._dict_used = False
        self._batch: list[_Pending] = []
        self._running: tuple[list[_Pending], Future[list[tuple[bytes, str, str | None]]]] \
            | None = None
        self._batched = 0
        self._big = 0  # frames of at least BATCH_MIN bytes in the batch
        self.raw_bytes = 0
        self._index_bytes = 0  # about what the index's JSON will take

    def add_data(self, path: bytes, gen: int, start: int, data: bytes, *, mode: int,
                 mtime_ns: int, reason: str | None = None) -> None:
        # Callers pass at most FRAME_MAX bytes: one frame, bounded memory on restore.
        # Big frames wait for a batch, compressed on every core at once (zstd's own
        # threads; its one-shot compress holds the GIL) by a worker thread while the
        # caller reads the next batch; a small one waits only behind them, to keep the
        # order, else it is compressed at once.
        self._batch.append((path, gen, start, data, mode, mtime_ns, reason))
        self._batched += len(data)
        self.raw_bytes += len(data)
        if len(data) >= BATCH_MIN:
            self._big += 1
        if self._batched >= BATCH_BYTES:
            self._submit()
        elif not self._big and self._running is None:
            self._drain()

    def _submit(self) -> None:
        """Hand the batch to the worker; at most one batch is compressed at a time, so
        memory stays at two batches."""
        self._collect()
        batch, self._batch, self._batched, self._big = self._batch, [], 0, 0
        if batch:
            self._running = (batch, worker("compress").submit(self._compress, batch))

    def _collect(self) -> None:
        """Wait for the batch in the worker, then append its frames."""
        if self._running is not None:
            (batch, job), self._running = self._running, None
            self._append(batch, job.result())

    def _drain(self) -> None:
        """Every frame added so far is in the segment."""
        self._collect()
        batch, self._batch, self._batched, self._big = self._batch, [], 0, 0
        if batch:
            self._append(batch, self._compress(batch))

    def _compress(self, batch: list[_Pending]) -> list[tuple[bytes, str, str | None]]:
        """(frame, sha256 of the raw bytes, dictionary id) of every item of ``batch``.

        Runs in the worker for a submitted batch: both zstd's threads and sha256 let go
        of the GIL on big buffers."""
        big: list[bytes | bytearray | memoryview] = [b[3] for b in batch
                                                      if len(b[3]) >= BATCH_MIN]
        frames = iter(self._zstd.multi_compress_to_buffer(big, threads=THREADS) if big else [])
        out: list[tuple[bytes, str, str | None]] = []
        for item in batch:
            data = item[3]
            dict_id = None
            if len(data) >= BATCH_MIN:
                frame = next(frames).tobytes()
            elif self._dict_zstd is not None and len(data) < DICT_FRAME_MAX:
                dict_id = self._dict_id
                frame = self._dict_zstd.compress(data)
            else:
                frame = self._zstd.compress(data)
            out.append((frame, hashlib.sha256(data).hexdigest(), dict_id))
        return out

    def _append(self, batch: list[_Pending],
                frames: list[tuple[bytes, str, str | None]]) -> None:
        for (path, gen, start, data, mode, mtime_ns, reason), (frame, sha, dict_id) in zip(
                batch, frames, strict=True):
            self.raw_bytes -= len(data)  # add_frame counts it
            self._dict_used = self._dict_used or dict_id is not None
            self.add_frame(path, gen, start, len(data), frame, sha, mode=mode,
                           mtime_ns=mtime_ns, reason=reason, dict_id=dict_id)

    def add_frame(self, path: bytes, gen: int, start: int, length: int, frame: bytes,
                  sha256: str, *, mode: int, mtime_ns: int, reason: str | None = None,
                  dict_id: str | None = None) -> None:
        """Add an already compressed frame of ``length`` raw bytes (its sha256 given)."""
        if self.cipher is None:
            # An exact-size copy: compress() returns a buffer sized for the input, and a
            # segment holds many frames until it is uploaded.
            frame = memoryview(frame).tobytes()
        else:  # a new, exact-size buffer anyway
            frame = self.cipher.seal(f"frame@{self._size}", frame)
        self.index.extents.append(Extent(
            path, gen, start, start + length, self._size, len(frame), sha256, mode, mtime_ns,
            reason, dict_id))
        self._index_bytes += len(path) * 2 + _ENTRY_BYTES
        self._parts.append(frame)
        self._size += len(frame)
        self.raw_bytes += length

    def bind(self, seq: int, cipher: ObjectCipher | None) -> None:
        """Give the segment its seq and, for an encrypted store, seal it to its object key.

        The shipper knows both only once connected to the store, which it does while
        the first segment is being read: frames added before are sealed now, and their
        offsets move by the seal's overhead."""
        self.index.seq = seq
        if cipher is None:
            return
        if self.cipher is not None:
            raise ValueError("segment already sealed to a key")
        self._drain()
        self.cipher = cipher
        self._parts[0] = HEADER.pack(MAGIC, SEALED_VERSION, FLAG_SEALED, 0)
        size = HEADER.size
        for i, e in enumerate(self.index.extents):
            sealed = cipher.seal(f"frame@{size}", self._parts[i + 1])
            self._parts[i + 1] = sealed
            self.index.extents[i] = replace(e, off=size, clen=len(sealed))
            size += len(sealed)
        self._size = size

    @property
    def size(self) -> int:
        """Bytes of header and frames so far."""
        self._drain()
        return self._size

    def add_tombstone(self, path: bytes, gen: int, time: float) -> None:
        self.index.tombstones.append(Tombstone(path, gen, time))
        self._index_bytes += len(path) * 2 + _ENTRY_BYTES

    def add_copy(self, c: Copy) -> None:
        """Bytes of another generation, by reference: no frame (ordered before the
        generation's own frames in the index, as readers fold it)."""
        self.index.copies.append(c)
        self._index_bytes += (len(c.path) + len(c.src)) * 2 + _ENTRY_BYTES

    def add_forget(self, sid: str, time: float) -> None:
        """The tombstone of a session forgotten at ``time`` (docs/FORMAT.md)."""
        self.index.forgotten.append((sid, time))
        self._index_bytes += _ENTRY_BYTES

    def add_redact(self, r: Redaction) -> None:
        """The tombstone of a redaction (docs/FORMAT.md): digests, never values."""
        self.index.redacted.append(r)
        self._index_bytes += _ENTRY_BYTES + 72 * len(r.values)

    def add_session(self, path: bytes, gen: int, fields: dict[str, str]) -> None:
        if fields:
            self.index.sessions[path] = (gen, fields)
            self._index_bytes += len(path) * 2 + len(json.dumps(fields))

    def add_project(self, cwd: str, info: dict[str, Any]) -> None:
        self.index.projects[cwd] = info
        self._index_bytes += len(json.dumps({cwd: info}))

    @property
    def full(self) -> bool:
        """Enough entries, or index bytes, for one index: the writer starts another
        object (readers accept far more)."""
        pending = len(self._batch) + (len(self._running[0]) if self._running else 0)
        return len(self.index.extents) + len(self.index.tombstones) + \
            len(self.index.copies) + len(self.index.forgotten) + len(self.index.redacted) + \
            pending >= MAX_ENTRIES \
            or self._index_bytes + pending * _ENTRY_BYTES >= INDEX_TARGET

    @property
    def empty(self) -> bool:
        return (not self.index.extents and not self.index.tombstones and not self.index.copies
                and not self.index.forgotten and not self.index.redacted
                and not self._batch and self._running is None)

    def finish(self) -> bytes:
        self._drain()
        ix = self.index
        dumps = json.JSONEncoder(separators=(",", ":")).encode
        # One entry at a time into JSON text: a seed's index names every file of the
        # tree, and a list of dicts for it would be several times the text's size.
        pieces: list[str] = []
        for c in ix.copies:
            d: dict[str, Any] = {"op": "copy", **encode_path(c.path), "gen": c.gen, "at": c.at,
                 "start": c.start, "end": c.end, "from_gen": c.src_gen, "mode": c.mode,
                 "mtime_ns": c.mtime_ns}
            if c.src != c.path:
                d.update({"from" + k[4:]: v for k, v in encode_path(c.src).items()})
            if c.reason:
                d["reason"] = c.reason
            pieces.append(dumps(d))
        for e in ix.extents:
            d = {"op": "data", **encode_path(e.path), "gen": e.gen,
                                 "start": e.start, "end": e.end, "off": e.off, "clen": e.clen,
                                 "sha256": e.sha256, "mode": e.mode, "mtime_ns": e.mtime_ns}
            if e.reason:
                d["reason"] = e.reason
            if e.dict_id:
                d["d"] = 1
            pieces.append(dumps(d))
        for t in ix.tombstones:
            pieces.append(dumps({"op": "delete", **encode_path(t.path), "gen": t.gen,
                                 "time": t.time}))
        for sid, at in ix.forgotten:
            pieces.append(dumps({"op": "forget", "session": sid, "time": at}))
        for r in ix.redacted:
            pieces.append(dumps(r.encode()))
        head = {"v": VERSION, "machine": ix.machine, "seq": ix.seq, "time": ix.time}
        rest: dict[str, Any] = {}
        if ix.sessions:
            rest["sessions"] = [{**encode_path(p), "gen": g, "fields": f}
                                for p, (g, f) in ix.sessions.items()]
        if ix.projects:
            rest["projects"] = ix.projects
        if self._dict_used:
            rest["dict"] = self._dict_id
        rest.update(ix.extra)
        text = "".join([dumps(head)[:-1], ',"entries":[', ",".join(pieces), "]",
                        "," + dumps(rest)[1:] if rest else "}"])
        del pieces
        if len(text) > INDEX_MAX:  # readers would refuse it: better no object than that
            raise FormatError(f"an index of {len(text)} bytes, more than the {INDEX_MAX} a "
                              "reader accepts")
        blob = self._index_zstd.compress(text.encode())
        magic = END_MAGIC
        if self.cipher is not None:
            # Padded: the index's size says little about how many paths it names.
            blob = self.cipher.seal(f"index@{self._size}", pad(blob, PAD_BLOCK))
            magic = END_MAGIC_SEALED
        trailer = TRAILER.pack(self._size, len(blob), hashlib.sha256(blob).digest(), magic)
        out = b"".join([*self._parts, blob, trailer])
        # The frames live on in the returned segment only: one copy while it uploads.
        self._parts = []
        return out


def parse_index(tail: bytes, total_size: int, where: str,
                cipher: ObjectCipher | None = None,
                capped: bool = True) -> SegmentIndex | tuple[int, int]:
    """Parse the index from the last bytes of a segment.

    Returns the index, or ``(offset, length)`` of the index when ``tail`` does not
    hold all of it (the caller then fetches that range and calls ``decode_index``).
    ``cipher`` is given for an encrypted store: then only a sealed segment is accepted.
    ``capped``: as ``decode_index``'s.
    """
    if len(tail) < TRAILER.size or total_size < HEADER.size + TRAILER.size:
        raise FormatError(f"{where}: too short to be a segment ({total_size} bytes)")
    off, length, digest, magic = TRAILER.unpack(tail[-TRAILER.size:])
    _check_magic(magic, cipher is not None, where)
    if off + length + TRAILER.size != total_size or off < HEADER.size or \
            any(tail[-TRAILER.size + 12 : -TRAILER.size + 16]):
        raise FormatError(f"{where}: bad segment trailer (truncated or not a segment)")
    have = len(tail) - TRAILER.size
    if length > have:
        return off, length
    return decode_index(tail[have - length : have], digest, where, cipher=cipher, offset=off,
                        capped=capped)


def _check_magic(magic: bytes, sealed: bool, where: str) -> None:
    if magic == (END_MAGIC_SEALED if sealed else END_MAGIC):
        return
    if magic == END_MAGIC_SEALED:
        raise FormatError(f"{where}: segment is encrypted, but no key is loaded (the store "
                          "has no keys/, or it was removed)")
    if magic == END_MAGIC:
        raise FormatError(f"{where}: segment is not encrypted, but the store is: refusing it "
                          "(tampered or foreign object)")
    raise FormatError(f"{where}: bad segment trailer (truncated or not a segment)")


def index_digest(tail: bytes) -> bytes:
    digest: bytes = TRAILER.unpack(tail[-TRAILER.size:])[2]
    return digest


def decode_index(blob: bytes, digest: bytes, where: str, *, cipher: ObjectCipher | None = None,
                 offset: int = 0, capped: bool = True) -> SegmentIndex:
    """The index ``blob`` (checked against ``digest``). ``capped``: held to ENTRIES_MAX,
    as every index but a snapshot manifest's (whose entries are its groups' frames, as
    many as the tree has groups) is."""
    if hashlib.sha256(blob).digest() != digest:
        raise FormatError(f"{where}: segment index checksum mismatch (corrupted object)")
    if cipher is not None:
        try:
            blob = unpad(cipher.open(f"index@{offset}", blob, where), where)
        except CryptoError as e:
            raise FormatError(str(e)) from None
    text = decompress_capped(blob, expansion_limit(len(blob), INDEX_MAX), f"{where}: index")
    entries = 0

    def counted(d: dict[str, Any]) -> dict[str, Any]:
        # Counted while parsed: an index naming more entries than any writer makes is
        # refused at the first one too many, before the rest of it is built.
        nonlocal entries
        if "op" in d:
            entries += 1
            if entries > ENTRIES_MAX:
                raise _too_many(where, "entries")
        return d

    try:
        doc = untrusted.loads(text, counted if capped else None)
        del text
        if not isinstance(doc, dict):
            raise FormatError(f"{where}: unreadable segment index: not an object")
        if doc.get("v") != VERSION:
            raise FormatError(f"{where}: unsupported segment version {doc.get('v')!r}")
        if capped:
            for name, items in (("entries", doc["entries"]), ("sessions", doc.get("sessions", [])),
                                ("projects", doc.get("projects", {}))):
                if isinstance(items, list | dict) and len(items) > ENTRIES_MAX:
                    raise _too_many(where, name, len(items))
        ix = SegmentIndex(str(doc["machine"]), int(doc["seq"]), when(doc["time"]))
        dict_id = doc.get("dict")
        for d in doc["entries"]:
            if d["op"] == "data":
                if d.get("d") and not isinstance(dict_id, str):
                    raise FormatError(f"{where}: a frame uses a dictionary the index "
                                      "does not name")
                ix.extents.append(Extent(
                    decode_path(d), int(d["gen"]), int(d["start"]), int(d["end"]),
                    int(d["off"]), int(d["clen"]), str(d["sha256"]), int(d["mode"]),
                    int(d["mtime_ns"]), d.get("reason"), dict_id if d.get("d") else None))
            elif d["op"] == "delete":
                ix.tombstones.append(Tombstone(decode_path(d), int(d["gen"]), when(d["time"])))
            elif d["op"] == "copy":
                ix.copies.append(_copy(d))
            elif d["op"] == "forget":
                ix.forgotten.append(_forget(d))
            elif d["op"] == "redact":
                ix.redacted.append(redaction(d))
            # Any other op is a later writer's: skipped, as older readers skip "redact".
        for s in doc.get("sessions", []):
            ix.sessions[decode_path(s)] = (int(s["gen"]), {str(k): str(v)
                                                           for k, v in s["fields"].items()})
        ix.projects = {str(k): p for k, v in doc.get("projects", {}).items()
                       if (p := _project(v)) is not None}
        ix.extra = {k: v for k, v in doc.items() if k in _EXTRA}  # the rest: ignored
    except FormatError:
        raise
    except (zstandard.ZstdError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise FormatError(f"{where}: unreadable segment index: {e}") from e
    return ix


# The furthest offset a copy may name: a file of a petabyte.
COPY_OFFSET_MAX = 1 << 50


def _copy(d: dict[str, Any]) -> Copy:
    """A copy entry, with only the values a writer makes (else ``ValueError``)."""
    path = decode_path(d)
    src = decode_path({"path_b64": d["from_b64"]}) if "from_b64" in d else \
        decode_path({"path": d["from"]}) if "from" in d else path
    nums = [d[k] for k in ("gen", "at", "start", "end", "from_gen", "mode", "mtime_ns")]
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in nums):
        raise ValueError(f"copy entry of {path!r} with a value no writer makes")
    gen, at, start, end, src_gen, mode, mtime_ns = nums
    if not start <= end <= COPY_OFFSET_MAX or at + end - start > COPY_OFFSET_MAX or \
            (src, src_gen) == (path, gen):
        raise ValueError(f"copy entry of {path!r} [{start},{end}) out of bounds")
    reason = d.get("reason")
    return Copy(path, gen, at, src, src_gen, start, end, mode, mtime_ns,
                reason if isinstance(reason, str) else None)


def _forget(d: dict[str, Any]) -> tuple[str, float]:
    """A forget entry: a session id (a UUID) and a time, else ``ValueError``."""
    sid = d["session"]
    if not isinstance(sid, str) or not is_session_id(sid):
        raise ValueError(f"forget entry of {str(sid)[:80]!r}, which is no session id")
    return sid, when(d["time"])


def _too_many(where: str, what: str, count: int | None = None) -> FormatError:
    named = f"more {what} than" if count is None else f"{count} {what}, more than"
    return FormatError(f"{where}: index names {named} the {ENTRIES_MAX} a reader accepts (a "
                       f"writer puts at most {MAX_ENTRIES} in one): refusing it")


def _project(v: Any) -> dict[str, Any] | None:
    """What git said of a project, with only the fields and types a writer records."""
    if not isinstance(v, dict):
        return None
    out: dict[str, Any] = {k: v[k] for k in ("toplevel", "remote", "main")
                           if isinstance(v.get(k), str)}
    trees = v.get("worktrees")
    if isinstance(trees, list):
        out["worktrees"] = [{k: t[k] for k in ("path", "branch") if isinstance(t.get(k), str)}
                            for t in trees
                            if isinstance(t, dict) and isinstance(t.get("path"), str)]
    return out


def check_header(head: bytes, where: str, sealed: bool = False) -> None:
    if len(head) < HEADER.size:
        raise FormatError(f"{where}: too short to be a segment")
    magic, version, flags, reserved = HEADER.unpack(head[: HEADER.size])
    if magic != MAGIC:
        raise FormatError(f"{where}: not a syncd segment (bad magic)")
    if version not in (VERSION, SEALED_VERSION):
        raise FormatError(f"{where}: unsupported segment version {version}")
    if (version, flags, reserved) != ((SEALED_VERSION, FLAG_SEALED, 0) if sealed
                                      else (VERSION, 0, 0)):
        if version == SEALED_VERSION and not sealed:
            raise FormatError(f"{where}: segment is encrypted, but no key is loaded")
        if version == VERSION and sealed:
            raise FormatError(f"{where}: segment is not encrypted, but the store is: "
                              "refusing it (tampered or foreign object)")
        raise FormatError(f"{where}: bad segment header (version {version}, flags {flags})")


def check_extent(ext: Extent, where: str) -> None:
    """Refuse an extent no writer makes, before fetching it: its sizes decide memory."""
    if not (0 <= ext.start <= ext.end and ext.end - ext.start <= FRAME_MAX
            and 0 < ext.clen <= FRAME_STORED_MAX and ext.off >= HEADER.size
            and ext.skip >= 0 and ext.skip + ext.end - ext.start <= ext.raw <= FRAME_MAX):
        raise FormatError(f"{where}: extent of {ext.path!r} [{ext.start},{ext.end}) stored "
                          f"as {ext.clen} bytes at {ext.off} is out of bounds (a frame holds "
                          f"at most {FRAME_MAX} bytes)")


def decode_extent(frame: bytes, ext: Extent, where: str,
                  cipher: ObjectCipher | None = None,
                  zdict: zstandard.ZstdCompressionDict | None = None) -> bytes:
    """Open (when sealed) and decompress one frame; check its length and sha256.

    ``zdict``: the dictionary named by ``ext.dict_id``, when it has one.
    """
    check_extent(ext, where)
    if cipher is not None:
        try:
            frame = cipher.open(f"frame@{ext.off}", frame, where)
        except CryptoError as e:
            raise FormatError(str(e)) from None
    if ext.dict_id and zdict is None:
        raise FormatError(f"{where}: frame of {ext.path!r} needs dictionary {ext.dict_id}")
    try:
        dctx = zstandard.ZstdDecompressor(dict_data=zdict) if ext.dict_id else None
    except zstandard.ZstdError as e:
        raise FormatError(f"{where}: dictionary {ext.dict_id} is unusable: {e}") from e
    data = decompress_exact(frame, ext.raw,
                            f"{where}: {ext.path!r} [{ext.start},{ext.end})", dctx)
    if hashlib.sha256(data).hexdigest() != ext.sha256:
        raise FormatError(f"{where}: checksum mismatch for {ext.path!r} [{ext.start},{ext.end})")
    return data[ext.skip : ext.skip + ext.end - ext.start] if ext.frame else data


class LastFrame:
    """The raw bytes of the last frame decoded whole for a part of it (``Extent.frame``):
    the parts of one frame that follow it are cut from them. A store's copies can make a
    file of a million parts of one 4 MiB frame, each of which would decompress and hash
    the whole frame again."""

    def __init__(self) -> None:
        self._ident: tuple[int, int, str, str | None, int] | None = None
        self._data = b""
        self._error: FormatError | None = None  # (a damaged frame fails its parts at once)

    def bytes_of(self, ext: Extent, decode: Callable[[Extent], bytes]) -> bytes:
        """The bytes of ``ext`` (checked by ``check_extent`` already), ``decode`` making
        those of an extent."""
        if not ext.frame:
            return decode(ext)
        ident = (ext.off, ext.clen, ext.sha256, ext.dict_id, ext.frame)
        if ident != self._ident:
            self._ident, self._data, self._error = ident, b"", None
            try:
                self._data = decode(replace(ext, start=0, end=ext.frame, skip=0, frame=0))
            except FormatError as e:
                self._error = e
        if self._error is not None:
            raise self._error
        return self._data[ext.skip : ext.skip + ext.end - ext.start]


def parse_segment(blob: bytes, where: str, cipher: ObjectCipher | None = None) -> SegmentIndex:
    """The index of a segment held whole in memory (``cipher``: its object's, when sealed)."""
    check_header(blob, where, sealed=cipher is not None)
    got = parse_index(blob[-TAIL_READ:] if len(blob) > TAIL_READ else blob, len(blob), where,
                      cipher)
    if isinstance(got, SegmentIndex):
        return got
    off, length = got
    return decode_index(blob[off : off + length], index_digest(blob[-TRAILER.size:]), where,
                        cipher=cipher, offset=off)


def extent_bytes(blob: bytes, base: int, ext: Extent, where: str,
                 cipher: ObjectCipher | None = None,
                 zdict: zstandard.ZstdCompressionDict | None = None) -> bytes:
    """The raw bytes of ``ext`` from ``blob``, which holds the object from offset ``base``."""
    lo = ext.off - base
    if ext.off < HEADER.size or lo < 0 or lo + ext.clen > len(blob):
        raise FormatError(f"{where}: extent of {ext.path!r} lies outside the object")
    return decode_extent(blob[lo : lo + ext.clen], ext, where, cipher, zdict)


# Extents are fetched in windows of at most SPAN bytes: a window is one GET when at least
# WHOLE_OBJECT_SHARE of it is needed (or it holds many frames), else one GET per frame.
SPAN = 16 << 20
WHOLE_OBJECT_SHARE = 0.5


def windows(exts: list[Extent]) -> Iterator[tuple[list[Extent], bool]]:
    """Runs of extents (sorted by offset) within SPAN bytes, and whether to GET each whole."""
    run: list[Extent] = []
    for e in exts:
        if run and e.off + e.clen - run[0].off > SPAN:
            yield run, _whole(run)
            run = []
        run.append(e)
    if run:
        yield run, _whole(run)


def _whole(run: list[Extent]) -> bool:
    span = max(e.off + e.clen for e in run) - run[0].off
    return sum(e.clen for e in run) >= WHOLE_OBJECT_SHARE * span or len(run) > 64

"""Crafting hostile store objects, and running the ``syncd`` command line on them with its
peak RSS measured (tests/test_hostile_store.py, bench/hostile.py).

Objects are made with syncd's own writer primitives (``SegmentWriter``, snapshot
``build``, ``Crypto``, ``wrap``, ``LocalStore``); where a primitive cannot make the bad
thing, with raw bytes: zstd frames are assembled block by block (an RLE block of 128 KiB
is 4 bytes), so a frame that expands to gigabytes costs kilobytes and no CPU to make,
and a "claimed" size is a sparse file in the ``file://`` store.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import struct
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zstandard

from syncd.claude import project_folder
from syncd.format.catalog import Session
from syncd.format.segment import END_MAGIC, HEADER, TRAILER, SegmentWriter
from syncd.format.segment import MAGIC as SEG_MAGIC
from syncd.format.snapshot import Entry, build
from syncd.security.crypto import PAD_BLOCK, Crypto, ObjectCipher, pad, unpad, wrap
from syncd.store import LocalStore, layout

MB = 1_000_000
GB = 1 << 30
PASSPHRASE = "hostile store passphrase 4c1d"
CHEAP = 1 << 12  # scrypt N of the key files the tests make: ~5 ms to unlock
T0 = 1_764_400_000.0
HERE = "here"  # the machine id of the machine that runs the commands
# A peak RSS above this many times the same command on a clean store fails (with a floor:
# an interpreter with click, pydantic and zstandard loaded is ~50 MB already).
RSS_FACTOR = 2.0
RSS_FLOOR = 150 * MB
# Address-space limit of every measured command: a reader that believes a bomb fails
# with MemoryError instead of taking the machine's memory (a shared 2-core box).
AS_LIMIT = 3 * GB

# -- zstd frames, by hand --------------------------------------------------------------

ZSTD_MAGIC = 0xFD2FB528
BLOCK_MAX = 128 << 10


def zstd_frame(prefix: bytes = b"", fill: int = 0x20, count: int = 0, suffix: bytes = b"",
               content_size: int | None = None) -> bytes:
    """A valid zstd frame: ``prefix`` (raw block), ``count`` bytes of ``fill`` (RLE blocks of
    128 KiB, 4 bytes each), ``suffix``. ``content_size``: what the header claims (None: no
    content size in the header, as a streaming compressor writes it)."""
    desc = 0xC0 if content_size is not None else 0x00  # 8-byte content size, or none
    head = struct.pack("<IB", ZSTD_MAGIC, desc) + bytes([10 << 3])  # 1 MiB window
    if content_size is not None:
        head += struct.pack("<Q", content_size)
    # A block is raw bytes, or (an int) that many bytes of ``fill``.
    blocks: list[bytes | int] = [prefix[i : i + BLOCK_MAX]
                                 for i in range(0, len(prefix), BLOCK_MAX)]
    left = count
    while left:
        n = min(left, BLOCK_MAX)
        blocks.append(n)
        left -= n
    blocks += [suffix[i : i + BLOCK_MAX] for i in range(0, len(suffix), BLOCK_MAX)]
    if not blocks:
        blocks.append(b"")
    parts = [head]
    for i, body in enumerate(blocks):
        last = int(i == len(blocks) - 1)
        if isinstance(body, bytes):
            parts.append((last | len(body) << 3).to_bytes(3, "little") + body)
        else:
            parts.append((last | 1 << 1 | body << 3).to_bytes(3, "little") + bytes([fill]))
    return b"".join(parts)


def json_bomb(size: int, content_size: int | None = -1) -> bytes:
    """An index-shaped JSON document of ``size`` bytes (whitespace inside a valid object),
    as one frame; ``content_size`` -1: the header states the true size."""
    head = b'{"v":1,"machine":"bomb","seq":0,"time":1.0,"entries":['
    tail = b"]}"
    return zstd_frame(head, 0x20, size - len(head) - len(tail), tail,
                      size if content_size == -1 else content_size)


def rle_sha256(fill: int, count: int) -> str:
    """sha256 of ``count`` bytes of ``fill``, without holding them."""
    h = hashlib.sha256()
    chunk = bytes([fill]) * min(count, 1 << 20)
    left = count
    while left:
        n = min(left, len(chunk))
        h.update(chunk[:n])
        left -= n
    return h.hexdigest()


# -- transcripts -------------------------------------------------------------------------

def sid(machine: str, n: int) -> str:
    """A session id as Claude makes them (a UUID), stable per machine and number."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"syncd-hostile/{machine}/{n}"))


def stamp(i: int) -> str:
    return f"2026-11-01T10:{i // 60 % 60:02d}:{i % 60:02d}.000Z"


def line(session: str, cwd: str, i: int, text: str = "") -> bytes:
    entry = {"type": "user", "uuid": f"{session[:8]}-{i:06d}", "sessionId": session,
             "cwd": cwd, "timestamp": stamp(i),
             "message": {"role": "user", "content": text or f"prompt {i} of {session}"}}
    return json.dumps(entry, separators=(",", ":")).encode() + b"\n"


def lines(session: str, cwd: str, first: int, n: int) -> bytes:
    return b"".join(line(session, cwd, i) for i in range(first, first + n))


def fields(session: str, cwd: str, i: int = 0) -> dict[str, str]:
    return {"cwd": cwd, "first_prompt": f"prompt 0 of {session}", "last_activity": stamp(i)}


def transcript(cwd: str, session: str) -> str:
    return f"projects/{project_folder(cwd)}/{session}.jsonl"


# -- the store ---------------------------------------------------------------------------

@dataclass
class Piece:
    """Bytes ``[start, start + len(data))`` of generation ``gen`` of ``path``."""

    path: str | bytes
    data: bytes
    start: int = 0
    gen: int = 1
    mtime_ns: int = int(T0 * 1e9)

    @property
    def raw(self) -> bytes:
        return self.path if isinstance(self.path, bytes) else self.path.encode()


@dataclass
class Craft:
    """Writes objects into a ``file://`` store, sealed when ``crypto`` is set."""

    root: Path
    crypto: Crypto | None = None

    def __post_init__(self) -> None:
        self.store = LocalStore(self.root)

    def cipher(self, key: str) -> ObjectCipher | None:
        return None if self.crypto is None else self.crypto.cipher(key)

    def path(self, key: str) -> Path:
        return self.root / key

    def put(self, key: str, blob: bytes) -> str:
        """Create or replace the object ``key``."""
        self.delete(key)
        self.store.put(key, blob)
        return key

    def delete(self, key: str) -> None:
        self.store.delete_many([key])

    # -- machine.json --------------------------------------------------------------------
    def machine_doc(self, machine: str, home: str) -> dict[str, Any]:
        doc: dict[str, Any] = {"machine": machine, "hostname": f"host-{machine}",
                               "os": "Linux 6.1.0", "home": home,
                               "claude_root": f"{home}/.claude", "created": T0, "format": 1}
        if self.crypto is not None:
            doc.update(format=2, key=self.crypto.fingerprint)
        return doc

    def machine_json(self, machine: str, home: str | None = None,
                     raw: bytes | None = None) -> str:
        """``machine.json`` as syncd writes it (``raw``: these bytes, sealed if the store is)."""
        key = layout.machine_key(machine)
        if raw is None:
            raw = json.dumps(self.machine_doc(machine, home or f"/home/{machine}"),
                             indent=1).encode()
        if self.crypto is not None:
            raw = self.crypto.seal_box(key, "machine.json", raw)
        return self.put(key, raw)

    # -- segments ------------------------------------------------------------------------
    def writer(self, machine: str, seq: int, key: str | None = None) -> SegmentWriter:
        key = key or layout.segment_key(machine, seq)
        return SegmentWriter(machine, seq, T0 + seq, cipher=self.cipher(key))

    def segment(self, machine: str, seq: int, pieces: Iterable[Piece] = (),
                sessions: Mapping[str | bytes, dict[str, str]] | None = None,
                projects: dict[str, dict[str, Any]] | None = None,
                tombstones: Iterable[tuple[str, int]] = ()) -> str:
        """A segment made by ``SegmentWriter``; returns its key."""
        key = layout.segment_key(machine, seq)
        w = self.writer(machine, seq, key)
        for p in pieces:
            w.add_data(p.raw, p.gen, p.start, p.data, mode=0o600, mtime_ns=p.mtime_ns)
        for path, f in (sessions or {}).items():
            w.add_session(path if isinstance(path, bytes) else path.encode(), 1, f)
        for path, gen in tombstones:
            w.add_tombstone(path.encode(), gen, T0 + seq)
        if projects:
            w.index.projects = projects
        return self.put(key, w.finish())

    def finish(self, key: str, w: SegmentWriter) -> str:
        return self.put(key, w.finish())

    def with_index(self, blob: bytes, key: str, index: bytes) -> bytes:
        """``blob`` (a finished segment container) with ``index`` (a zstd frame) as its index:
        sealed and padded for an encrypted store, trailer and checksum recomputed."""
        off, _, _, magic = TRAILER.unpack(blob[-TRAILER.size:])
        cipher = self.cipher(key)
        if cipher is not None:
            index = cipher.seal(f"index@{off}", pad(index, PAD_BLOCK))
        trailer = TRAILER.pack(off, len(index), hashlib.sha256(index).digest(), magic)
        return blob[:off] + index + trailer

    def replace_index(self, key: str, index: bytes) -> str:
        """Object ``key`` (a segment, pack or manifest) with another index frame."""
        return self.put(key, self.with_index(self.store.get(key), key, index))

    def index_frame(self, doc: Any) -> bytes:
        """A well-formed index frame holding ``doc`` (any JSON)."""
        return zstandard.ZstdCompressor(write_content_size=True).compress(
            json.dumps(doc, separators=(",", ":")).encode())

    def index_doc(self, key: str) -> tuple[bytes, int, dict[str, Any]]:
        """Object ``key``, its index offset and its index JSON (opened when sealed)."""
        blob = self.store.get(key)
        off, length, _, _ = TRAILER.unpack(blob[-TRAILER.size:])
        raw = blob[off : off + length]
        cipher = self.cipher(key)
        if cipher is not None:
            raw = unpad(cipher.open(f"index@{off}", raw, key), key)
        doc: dict[str, Any] = json.loads(zstandard.ZstdDecompressor().decompress(raw))
        return blob, off, doc

    def rewrite(self, key: str, edit: Callable[[dict[str, Any]], Any] | None = None,
                frames: Iterable[tuple[dict[str, Any], bytes]] = ()) -> str:
        """Object ``key`` with ``frames`` appended (each an index entry without ``off`` and
        ``clen``, and its zstd frame) and its index JSON changed by ``edit`` (which may
        return a replacement document)."""
        blob, off, doc = self.index_doc(key)
        magic = TRAILER.unpack(blob[-TRAILER.size:])[3]
        cipher = self.cipher(key)
        parts, pos = [blob[:off]], off
        for entry, frame in frames:
            if cipher is not None:
                frame = cipher.seal(f"frame@{pos}", frame)
            doc["entries"].append({**entry, "off": pos, "clen": len(frame)})
            parts.append(frame)
            pos += len(frame)
        if edit is not None:
            doc = edit(doc) or doc
        index = self.index_frame(doc)
        if cipher is not None:
            index = cipher.seal(f"index@{pos}", pad(index, PAD_BLOCK))
        parts += [index, TRAILER.pack(pos, len(index), hashlib.sha256(index).digest(), magic)]
        return self.put(key, b"".join(parts))

    # -- manifests and packs -------------------------------------------------------------
    def pack(self, machine: str, lo: int, hi: int, pieces: Iterable[Piece],
             tag: str = "0badc0de") -> tuple[str, list[Entry]]:
        """A pack (``"kind": "pack"``) and the entries that locate its files."""
        key = layout.pack_key(machine, lo, hi, tag)
        w = SegmentWriter(machine, hi, T0 + hi, cipher=self.cipher(key))
        pieces = list(pieces)
        for p in pieces:
            w.add_data(p.raw, p.gen, p.start, p.data, mode=0o600, mtime_ns=p.mtime_ns)
        w.index.extra = {"kind": "pack", "lo": lo, "hi": hi}
        blob = w.finish()
        out = [Entry(p.raw, p.gen, p.start + len(p.data), 0o600, p.mtime_ns,
                     extents=[(key, x) for x in w.index.extents
                              if (x.path, x.gen) == (p.raw, p.gen)]) for p in pieces]
        self.put(key, blob)
        return key, out

    def manifest(self, machine: str, seq: int, entries: list[Entry],
                 sessions: Iterable[tuple[str | bytes, dict[str, str]]] = (), rev: int = 0,
                 projects: dict[str, dict[str, Any]] | None = None) -> str:
        """A snapshot manifest made by ``_snapshot.build``."""
        key = layout.snapshot_key(machine, seq, rev)
        cat = []
        for path, f in sessions:
            raw = path if isinstance(path, bytes) else path.encode()
            name = raw.rsplit(b"/", 1)[1][:-6].decode()
            cat.append(Session(name, machine, raw, 1, last_seq=seq, fields=f))
        blob = build(machine, seq, rev, T0 + seq, T0, entries, cat, projects or {},
                     cipher=self.cipher(key))
        return self.put(key, blob)

    # -- keys ----------------------------------------------------------------------------
    def key_file(self, key_id: str, *, n: int, r: int, p: int,
                 passphrase: str = "a passphrase nobody has") -> str:
        """A planted key file asking for scrypt ``n, r, p``: canonical and well-formed, so a
        reader learns it does not open only after running scrypt with those parameters
        (wrapped cheaply here, then the parameters changed)."""
        assert self.crypto is not None
        key = layout.key_file_key(key_id)
        doc = json.loads(wrap(self.crypto, passphrase, key_id, key, n=CHEAP))
        doc["kdf"].update(n=n, r=r, p=p)
        return self.put(key, json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())

    # -- raw files -----------------------------------------------------------------------
    def sparse(self, key: str, size: int, head: bytes = b"", tail: bytes = b"") -> str:
        """An object of ``size`` bytes that takes no disk: ``head`` at 0, ``tail`` at the end."""
        path = self.path(key)
        self.delete(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            f.write(head)
            f.truncate(size)
            if tail:
                f.seek(size - len(tail))
                f.write(tail)
        return key

    def big(self, key: str, head: bytes, fill: bytes, size: int, tail: bytes) -> str:
        """A real (not sparse) object of ``size`` bytes, written a MiB at a time."""
        path = self.path(key)
        self.delete(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        chunk = fill * ((1 << 20) // len(fill))
        with open(path, "wb") as f:
            f.write(head)
            left = size - len(head) - len(tail)
            while left > 0:
                n = min(left, len(chunk))
                f.write(chunk[:n])
                left -= n
            f.write(tail)
        return key


# -- good machines -----------------------------------------------------------------------

@dataclass
class Machine:
    """A machine whose backup is fine: what a restore of it must give."""

    name: str
    home: str
    cwd: str
    sessions: list[str]
    files: dict[str, bytes] = field(default_factory=dict)


def good_machine(c: Craft, name: str, *, home: str | None = None) -> Machine:
    """machine.json and two segments: two sessions (one spanning both), a todo, history."""
    home = home or f"/home/{name}"
    cwd = f"/srv/{name}/app"  # outside home: restored paths are the backup's paths
    s1, s2 = sid(name, 1), sid(name, 2)
    p1, p2 = transcript(cwd, s1), transcript(cwd, s2)
    a, b, t2 = lines(s1, cwd, 0, 3), lines(s1, cwd, 3, 2), lines(s2, cwd, 0, 2)
    hist = json.dumps({"display": "hi", "project": cwd, "sessionId": s1},
                      separators=(",", ":")).encode() + b"\n"
    todo = f"todos/{s1}-agent-{s1}.json"
    c.machine_json(name, home)
    c.segment(name, 0, [Piece(p1, a), Piece("history.jsonl", hist), Piece(todo, b"[]\n")],
              sessions={p1: fields(s1, cwd, 2)})
    c.segment(name, 1, [Piece(p1, b, start=len(a)), Piece(p2, t2)],
              sessions={p1: {"last_activity": stamp(4)}, p2: fields(s2, cwd, 1)})
    return Machine(name, home, cwd, [s1, s2],
                   {p1: a + b, p2: t2, "history.jsonl": hist, todo: b"[]\n"})


def good_snapshot_machine(c: Craft, name: str, seq: int = 1) -> Machine:
    """A compacted machine: one pack and the manifest at ``seq`` that locates it (no
    segments), holding what ``good_machine`` holds."""
    home = f"/home/{name}"
    cwd = f"/srv/{name}/app"
    s1, s2 = sid(name, 1), sid(name, 2)
    p1, p2 = transcript(cwd, s1), transcript(cwd, s2)
    files = {p1: lines(s1, cwd, 0, 5), p2: lines(s2, cwd, 0, 2),
             f"todos/{s1}-agent-{s1}.json": b"[]\n"}
    c.machine_json(name, home)
    _, entries = c.pack(name, 0, seq, [Piece(p, d) for p, d in files.items()])
    c.manifest(name, seq, entries, [(p1, fields(s1, cwd, 4)), (p2, fields(s2, cwd, 1))])
    return Machine(name, home, cwd, [s1, s2], files)


# -- bombs ---------------------------------------------------------------------------------

BOMB_FILE = "projects/-srv-desk-app/bomb.txt"
MACHINE_JSON_BOMBS = ["real-200MB", "sparse-10GiB", "dev-zero-symlink"]


def index_bomb(c: Craft, machine: str, seq: int, size: int) -> str:
    """Segment ``seq`` of ``machine``: a real segment whose index is ``size`` bytes of JSON
    in one frame (65 kB for 2 GiB, 330 kB for 10 GiB)."""
    key = c.segment(machine, seq, [Piece(f"projects/-srv-{machine}-app/x.txt", b"x\n")])
    return c.replace_index(key, json_bomb(size))


def machine_json_bomb(c: Craft, machine: str, kind: str) -> str:
    """``machine.json`` of 200 MB of real JSON, of 10 GiB claimed (a sparse file), or a
    symlink to /dev/zero (a ``file://`` store in a shared directory)."""
    key = layout.machine_key(machine)
    if kind == "real-200MB":
        c.big(key, b'{"machine":"' + machine.encode() + b'","home":"', b"a", 200 * MB, b'"}')
    elif kind == "sparse-10GiB":
        c.sparse(key, 10 * GB)
    else:
        c.delete(key)
        os.symlink("/dev/zero", c.path(key))
    return key


def trailer_bomb(c: Craft, machine: str, seq: int) -> str:
    """A sparse segment whose trailer says its index is the 4 GiB before it."""
    size = (1 << 32) + HEADER.size + TRAILER.size - 1
    trailer = TRAILER.pack(HEADER.size, size - HEADER.size - TRAILER.size, b"\0" * 32,
                           END_MAGIC)
    return c.sparse(layout.segment_key(machine, seq), size,
                    HEADER.pack(SEG_MAGIC, 1, 0, 0), trailer)


def dictionary_bomb(c: Craft, machine: str, seq: int, path: str = BOMB_FILE) -> str:
    """Segment ``seq`` with a frame that needs a dictionary whose object is 4 GiB (sparse);
    returns the dictionary's id."""
    dict_id = "d1c7" * 16
    c.sparse(layout.dict_key(machine, dict_id), 4 * GB)
    w = c.writer(machine, seq)
    data = b"needs the dictionary\n"
    w.add_frame(path.encode(), 1, 0, len(data), zstandard.ZstdCompressor().compress(data),
                hashlib.sha256(data).hexdigest(), mode=0o600, mtime_ns=0, dict_id=dict_id)
    w.index.extra = {"dict": dict_id}
    c.finish(layout.segment_key(machine, seq), w)
    return dict_id


def every_bomb(c: Craft) -> dict[str, Machine]:
    """Good machines ``alpha`` and ``zulu`` (returned); machines ``b-*`` each behind one
    bomb, and ``b-all``, whose good backup is followed by every segment-level bomb."""
    good = {n: good_machine(c, n) for n in ("alpha", "zulu")}
    good_machine(c, "b-index")
    index_bomb(c, "b-index", 2, 2 * GB)
    good_machine(c, "b-index10")
    index_bomb(c, "b-index10", 2, 10 * GB)
    good_snapshot_machine(c, "b-manifest", seq=1)
    c.replace_index(c.manifest("b-manifest", 2, []), json_bomb(2 * GB))
    good_snapshot_machine(c, "b-group", seq=1)
    c.rewrite(layout.snapshot_key("b-group", 1, 0), frames=[(
        {"op": "data", "path": "g/plans", "gen": 0, "start": 0, "end": 2 * GB,
         "sha256": "0" * 64, "mode": 0, "mtime_ns": 0}, zstd_frame(b"", 0x20, 2 * GB))])
    for kind in MACHINE_JSON_BOMBS:
        name = f"b-mj-{kind.split('-')[0]}"
        good_machine(c, name)
        machine_json_bomb(c, name, kind)
    good_machine(c, "b-noise")
    c.put(layout.segment_key("b-noise", 2), random.Random(11).randbytes(33_000))
    good_machine(c, "b-trailer")
    trailer_bomb(c, "b-trailer", 2)
    good_machine(c, "b-all")
    w = c.writer("b-all", 2)
    w.add_frame(BOMB_FILE.encode(), 1, 0, GB, zstd_frame(b"", 0x20, GB), "0" * 64,
                mode=0o600, mtime_ns=0)
    w.add_frame(b"projects/-srv-b-all-app/fcs.txt", 1, 0, 100,
                zstd_frame(b"", 0x41, 100, b"", 10 * GB), rle_sha256(0x41, 100), mode=0o600,
                mtime_ns=0)
    c.finish(layout.segment_key("b-all", 2), w)
    dictionary_bomb(c, "b-all", 3, "projects/-srv-b-all-app/dict.txt")
    index_bomb(c, "b-all", 4, 2 * GB)
    return good


# -- running syncd -----------------------------------------------------------------------

# Runs the command as its own child and reports its exit code and ru_maxrss. A child of
# the test process itself would inherit the test's peak RSS at exec (the kernel carries
# the old mm's high-water mark over execve; posix_spawn shares the parent's mm until
# then), so the command is started from this small launcher instead.
LAUNCHER = r"""
import os, resource, signal, sys
limit, timeout, report, argv = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4:]
if limit:
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
pid = os.posix_spawn(argv[0], argv, os.environ)
signal.signal(signal.SIGALRM, lambda *_: os.kill(pid, signal.SIGKILL))
signal.setitimer(signal.ITIMER_REAL, timeout)
_, status, ru = os.wait4(pid, 0)
with open(report, "w") as f:
    f.write(f"{os.waitstatus_to_exitcode(status)} {ru.ru_maxrss * 1024}")
"""
# Exit code of a command the launcher killed at its timeout.
KILLED = -9


@dataclass
class Result:
    args: tuple[str, ...]
    rc: int
    out: str
    err: str
    maxrss: int  # bytes

    @property
    def err_lines(self) -> list[str]:
        return [ln for ln in self.err.splitlines() if ln.strip()]

    @property
    def out_lines(self) -> list[str]:
        return [ln for ln in self.out.splitlines() if ln.strip()]

    def describe(self) -> str:
        return (f"syncd {' '.join(self.args)}: exit {self.rc}, peak RSS "
                f"{self.maxrss / MB:.0f} MB\n--- stdout\n{self.out[-3000:]}\n"
                f"--- stderr\n{self.err[-3000:]}")


def run_syncd(args: Iterable[str], env: Mapping[str, str], *, limit: int = AS_LIMIT,
              timeout: float = 120.0, cwd: Path | None = None) -> Result:
    """``python -m syncd ARGS`` with ``env``; exit code, output and peak RSS. A command
    still running after ``timeout`` seconds is killed (exit code ``KILLED``)."""
    args = tuple(args)
    with tempfile.NamedTemporaryFile("r", prefix="syncd-rss-", suffix=".txt") as rep:
        p = subprocess.run([sys.executable, "-I", "-S", "-c", LAUNCHER, str(limit),
                            str(timeout), rep.name, sys.executable, "-m", "syncd", *args],
                           env=dict(env), capture_output=True, text=True,
                           timeout=timeout + 60, stdin=subprocess.DEVNULL, cwd=cwd,
                           check=False)
        words = Path(rep.name).read_text().split()
    if p.returncode != 0 or len(words) != 2:
        raise RuntimeError(f"launcher failed ({p.returncode}): {p.stderr[-2000:]}")
    return Result(args, int(words[0]), p.stdout, p.stderr, int(words[1]))


def syncd_env(home: Path, store: Path, *, machine: str = HERE, source: Path | None = None,
              passphrase: str | None = None,
              extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """An isolated environment: HOME and the XDG directories under ``home``."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8",
           "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
           "XDG_STATE_HOME": str(home / ".local" / "state"),
           "XDG_DATA_HOME": str(home / ".local" / "share"),
           "XDG_CACHE_HOME": str(home / ".cache"),
           "SYNCD_STORE": store.as_uri(), "SYNCD_MACHINE_ID": machine,
           "SYNCD_SOURCE": str(source or home / ".claude"),
           "SYNCD_STORE_RETRY_DEADLINE": "2"}
    if os.environ.get("TMPDIR"):
        env["TMPDIR"] = os.environ["TMPDIR"]
    if passphrase is not None:
        env["SYNCD_PASSPHRASE"] = passphrase
    env.update(extra or {})
    return env


def rss_bound(clean: Result) -> int:
    return max(int(RSS_FACTOR * clean.maxrss), RSS_FLOOR)

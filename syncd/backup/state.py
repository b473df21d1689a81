"""Local state in SQLite (WAL): what has been shipped of each file, and the next seq.

Rows change only in ``commit``, after the store confirmed the segment, in one
transaction: a crash leaves either the old state (the bytes are shipped again, or
adopted from the segment already in the store) or the new one, never a mix.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from syncd.errors import StateError
from syncd.format.catalog import Session, session_of
from syncd.private import FILE_MODE, create_private, private_dir
from syncd.security.keys import KeyHint

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS files (
    path BLOB PRIMARY KEY,   -- relative to the Claude tree, raw bytes of the name
    gen INTEGER NOT NULL,    -- generation: bumped by truncation, rewrite or new inode
    offset INTEGER NOT NULL, -- bytes of this generation confirmed in the store
    dev INTEGER NOT NULL,
    ino INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    mode INTEGER NOT NULL,
    check_hash BLOB,         -- sha256 of the shipped head and tail (rewrite detection)
    deleted_at REAL          -- set when the file left the tree (tombstone shipped)
);
-- A transcript's last shipped line ends and their hashes (``backup.marks``: cuts), for
-- the generation and offset its files row has (a table of its own: a state stays
-- readable and writable by the versions before it).
CREATE TABLE IF NOT EXISTS marks (
    path BLOB PRIMARY KEY,
    gen INTEGER NOT NULL,
    offset INTEGER NOT NULL,
    marks BLOB NOT NULL
);
-- Each session's catalog as its shipped lines named it (Session.fold's rules), for the
-- machine's head.
CREATE TABLE IF NOT EXISTS catalog (
    path BLOB PRIMARY KEY,
    gen INTEGER NOT NULL,
    fields TEXT NOT NULL     -- JSON object
);
-- Files a restore is writing here that hold exactly a generation of this machine's
-- backup (provenance), recorded before each appears: those bytes are in the store
-- already, and are never shipped again.
CREATE TABLE IF NOT EXISTS restored (
    path BLOB PRIMARY KEY,
    gen INTEGER NOT NULL,    -- the generation the file's bytes are
    size INTEGER NOT NULL,   -- bytes [0, size) of it, as written
    check_hash BLOB NOT NULL,
    at REAL NOT NULL
);
-- Files a followed machine's sessions were imported into (follow): the bytes up to
-- ``size`` came from ``source`` (merged: mixed with this machine's own lines), and how
-- much of the source's file they hold (``src_gen``, ``src_size``: up to date or behind).
CREATE TABLE IF NOT EXISTS imported (
    path BLOB PRIMARY KEY,
    source TEXT NOT NULL,
    size INTEGER NOT NULL,
    check_hash BLOB NOT NULL,
    merged INTEGER NOT NULL,
    src_path BLOB NOT NULL,
    src_gen INTEGER NOT NULL,
    src_size INTEGER NOT NULL,
    at REAL NOT NULL
);
-- Sessions a restore or an import brought here from another machine, as they were first
-- written here: where from, and the path rules that restore used (JSON [[old, new], …]).
-- The shipper tells the store (the catalog's "origin"), so that the machine they came
-- from maps them back; that machine's lines enter them here as its own (merge).
CREATE TABLE IF NOT EXISTS origins (
    sid TEXT PRIMARY KEY,
    machine TEXT NOT NULL,
    src_path BLOB NOT NULL,
    rules TEXT NOT NULL,
    at REAL NOT NULL
);
-- Sessions forgotten here (``syncd forget``, or a followed machine's tombstone): never
-- shipped again until lifted; ``announced`` once a segment carried their tombstone.
CREATE TABLE IF NOT EXISTS forgotten (
    sid TEXT PRIMARY KEY,
    at REAL NOT NULL,
    by TEXT NOT NULL,        -- "user", or the machine whose tombstone was honoured
    announced INTEGER NOT NULL DEFAULT 0
);
"""
_COLUMNS = "path, gen, offset, dev, ino, mtime_ns, mode, check_hash, deleted_at"
# A files row with its marks, when they are of its generation and offset.
_SELECT = ("SELECT f.path, f.gen, f.offset, f.dev, f.ino, f.mtime_ns, f.mode, f.check_hash, "
           "f.deleted_at, m.marks FROM files AS f LEFT JOIN marks AS m ON m.path = f.path "
           "AND m.gen = f.gen AND m.offset = f.offset")


@dataclass(frozen=True, slots=True)
class ForgottenSession:
    sid: str
    at: float
    by: str  # "user", or the machine whose tombstone this machine honoured
    announced: int  # 1: a confirmed segment of this machine carried its tombstone


@dataclass(frozen=True, slots=True)
class FileState:
    path: bytes
    gen: int
    offset: int
    dev: int
    ino: int
    mtime_ns: int
    mode: int
    check_hash: bytes | None
    deleted_at: float | None = None
    # Where the last lines shipped end and what they hash to (``backup.marks``).
    marks: bytes | None = None

    def but(self, **kw: object) -> FileState:
        return replace(self, **kw)  # type: ignore[arg-type]


@dataclass(frozen=True)
class RestoredFile:
    """A file a restore wrote: bytes [0, size) of generation ``gen`` of this machine's
    backup, whose head and tail hash to ``check_hash``."""

    path: bytes
    gen: int
    size: int
    check_hash: bytes
    at: float


@dataclass(frozen=True)
class ImportedFile:
    """A file an import from machine ``source`` wrote: its bytes [0, size) hash to
    ``check_hash``; they are the source's ``src_path`` (generation ``src_gen``, its first
    ``src_size`` bytes) remapped, or (``merged``) those merged with this machine's own."""

    path: bytes
    source: str
    size: int
    check_hash: bytes
    merged: bool
    src_path: bytes
    src_gen: int
    src_size: int
    at: float


@dataclass(frozen=True)
class OriginRecord:
    """Session ``sid`` was first written here by a restore (or an import) of machine
    ``machine``'s ``src_path``, through the path rules ``rules`` ((old, new) prefixes)."""

    sid: str
    machine: str
    src_path: bytes
    rules: tuple[tuple[str, str], ...]
    at: float


# A restore's record is used once, within this long (a daemon stopped longer ships the
# files again): a record never outlives the file it was made for by much.
RESTORED_KEEP = 86400.0


class State:
    def __init__(self, path: Path, *, readonly: bool = False, durable: bool = True) -> None:
        self.path = path
        try:
            if readonly:
                self._db = sqlite3.connect(f"file:{path}?mode=ro", uri=True,
                                           check_same_thread=False)
                # A reader can arrive before the daemon created the schema.
                if not self._db.execute("SELECT 1 FROM sqlite_master WHERE name='files'"
                                        ).fetchone():
                    self._db.close()
                    self._db = sqlite3.connect(":memory:", check_same_thread=False)
                    self._db.executescript(SCHEMA)
            else:
                private_dir(path.parent)
                # Created 0600 before SQLite opens it (its -wal and -shm files copy the
                # mode); an older, looser file is tightened. An existing file is never
                # opened here: closing a descriptor drops every POSIX lock this process
                # holds on the file, those of its other connections too (the daemon has
                # several), and another process closing its own connection (a restore)
                # would then delete the WAL the daemon still writes to.
                with contextlib.suppress(FileExistsError):
                    os.close(create_private(path, os.O_EXCL))
                os.chmod(path, FILE_MODE)
                self._db = sqlite3.connect(path, check_same_thread=False)
                self._db.execute("PRAGMA journal_mode=WAL")
                # Not ``durable``: a restore's records, which a crash may lose (the files
                # are then shipped again), written one by one without an fsync each.
                self._db.execute(f"PRAGMA synchronous={'FULL' if durable else 'OFF'}")
                # 512 KiB of pages: rows are read one at a time, from the OS's page cache.
                self._db.execute("PRAGMA cache_size=-512")
                # In one transaction: a reader never meets some of the tables only.
                self._db.executescript(f"BEGIN;\n{SCHEMA}\nCOMMIT;")
            # A reader of a state its writer's older version made has no marks to read.
            self._select = _SELECT if self._db.execute(
                "SELECT 1 FROM sqlite_master WHERE name='marks'").fetchone() else \
                f"SELECT f.{_COLUMNS.replace(', ', ', f.')}, NULL FROM files AS f"
        except (sqlite3.Error, OSError) as e:
            raise StateError.of("state database", path, e) from e

    def close(self) -> None:
        self._db.close()

    # -- meta ---------------------------------------------------------------
    def meta(self, key: str, default: str | None = None) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return default if row is None else str(row[0])

    def set_meta(self, **items: str) -> None:
        self._write([], list(items.items()))

    def update_meta(self, key: str, change: Callable[[str | None], str]) -> None:
        """Replace ``key``'s value by ``change`` of it in one write transaction: another
        process's change between the read and the write is never lost."""
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                row = self._db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
                self._db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                                 (key, change(None if row is None else str(row[0]))))
            except BaseException:
                self._db.rollback()
                raise
            self._db.commit()
        except sqlite3.Error as e:
            raise StateError.of("state database", self.path, e) from e

    @property
    def next_seq(self) -> int:
        return int(self.meta("next_seq", "0") or 0)

    def passed_over(self) -> set[int]:
        """The seqs the shipper passed over (an object that is not this machine's segment
        of that seq held them) since the last compaction folded them."""
        try:
            seqs = json.loads(self.meta("passed_over") or "[]")
        except ValueError:
            return set()
        return {s for s in seqs if type(s) is int} if isinstance(seqs, list) else set()

    # -- files --------------------------------------------------------------
    # Rows are read from SQLite when asked for, not held in memory: a daemon tracking
    # 10 000 files would keep ~4.5 MB of them for the hourly scan that reads each once.
    def get(self, path: bytes) -> FileState | None:
        rows = self._read(f"{self._select} WHERE f.path=?", (path,))
        return FileState(*rows[0]) if rows else None

    def files(self) -> Iterator[FileState]:
        return (FileState(*r) for r in self._read(self._select))

    def same_place(self, rest: bytes) -> list[FileState]:
        """The files at ``projects/<any folder>/<rest>`` (a session's files, wherever it
        was moved)."""
        tail = b"/" + rest
        return [FileState(*r) for r in self._read(
            f"{self._select} WHERE f.path >= CAST('projects/' AS BLOB) AND "
            "f.path < CAST('projects0' AS BLOB) AND substr(f.path, ?) = ?", (-len(tail), tail))]

    def __len__(self) -> int:
        n: int = self._read("SELECT count(*) FROM files")[0][0]
        return n

    def _read(self, sql: str, args: tuple[object, ...] = ()) -> list[Any]:
        try:
            return self._db.execute(sql, args).fetchall()
        except sqlite3.Error as e:
            raise StateError.of("state database", self.path, e) from e

    # -- forgotten sessions -------------------------------------------------
    def forgotten(self) -> dict[str, ForgottenSession]:
        # A reader of a state an older version made has no such table.
        if not self._read("SELECT 1 FROM sqlite_master WHERE name='forgotten'"):
            return {}
        return {r[0]: ForgottenSession(*r) for r in self._read(
            "SELECT sid, at, by, announced FROM forgotten")}

    def forget_sessions(self, sids: Iterable[str], by: str = "user",
                        at: float | None = None) -> None:
        """Exclude ``sids`` from what is shipped from now on (kept when already there)."""
        when = time.time() if at is None else at
        self._exec_many("INSERT OR IGNORE INTO forgotten (sid, at, by, announced) "
                        "VALUES (?, ?, ?, 0)", [(s, when, by) for s in sids])

    def lift_forgotten(self, sids: Iterable[str]) -> None:
        self._exec_many("DELETE FROM forgotten WHERE sid=?", [(s,) for s in sids])

    def announce_forgotten(self, sids: Iterable[str]) -> None:
        """A segment the store confirmed carried these sessions' tombstones."""
        self._exec_many("UPDATE forgotten SET announced=1 WHERE sid=?", [(s,) for s in sids])

    def drop_files(self, paths: Iterable[bytes]) -> None:
        """Forget what was shipped of ``paths`` (their backup was rewritten without them):
        shipped again, as new files, only if their session is lifted."""
        rows = [(p,) for p in paths]
        for table in ("files", "marks", "catalog", "restored", "imported"):
            self._exec_many(f"DELETE FROM {table} WHERE path=?", rows)

    def rewrote(self, path: bytes, check: bytes | None, marks: bytes | None,
                mtime_ns: int) -> None:
        """A file shipped bytes of were masked in place (``redact``): what the shipper
        checks them by, as they are now (the backup holds the same masked bytes)."""
        self._exec_many("UPDATE files SET check_hash=?, mtime_ns=? WHERE path=?",
                        [(check, mtime_ns, path)])
        self._exec_many("UPDATE marks SET marks=? WHERE path=?", [(marks, path)]
                        if marks is not None else [])
        if marks is None:
            self._exec_many("DELETE FROM marks WHERE path=?", [(path,)])

    def rewrite_catalog(self, fields: Callable[[dict[str, str]], dict[str, str]],
                        only: Callable[[bytes], bool] = lambda path: True) -> None:
        """Each session's catalog fields through ``fields`` (``redact``); with ``only``,
        those of the transcripts it takes."""
        rows = [(json.dumps(fields(json.loads(f))), p)
                for p, f in self._read("SELECT path, fields FROM catalog") if only(bytes(p))]
        self._exec_many("UPDATE catalog SET fields=? WHERE path=?", rows)

    def _exec_many(self, sql: str, rows: Sequence[tuple[object, ...]]) -> None:
        try:
            with self._db:
                self._db.executemany(sql, rows)
        except sqlite3.Error as e:
            raise StateError.of("state database", self.path, e) from e

    # -- provenance ---------------------------------------------------------
    def restored(self, path: bytes) -> RestoredFile | None:
        rows = self._read("SELECT path, gen, size, check_hash, at FROM restored "
                          "WHERE path=? AND at >= ?", (path, time.time() - RESTORED_KEEP))
        return RestoredFile(*rows[0]) if rows else None

    def forget_restored(self, path: bytes) -> None:
        try:
            with self._db:
                self._db.execute("DELETE FROM restored WHERE path=?", (path,))
        except sqlite3.Error as e:
            raise StateError.of("state database", self.path, e) from e

    def record_restored(self, files: Iterable[RestoredFile]) -> None:
        """Remember what a restore wrote (a row per path, the newest wins)."""
        try:
            with self._db:
                self._db.executemany(
                    "INSERT OR REPLACE INTO restored VALUES (?, ?, ?, ?, ?)",
                    [(f.path, f.gen, f.size, f.check_hash, f.at) for f in files])
        except sqlite3.Error as e:
            raise StateError.of("state database", self.path, e) from e

    def expire_restored(self) -> None:
        """Drop records older than ``RESTORED_KEEP`` (``restored`` never returns them)."""
        try:
            with self._db:
                self._db.execute("DELETE FROM restored WHERE at < ?",
                                 (time.time() - RESTORED_KEEP,))
        except sqlite3.Error as e:
            raise StateError.of("state database", self.path, e) from e

    def imported(self, path: bytes) -> ImportedFile | None:
        rows = self._read("SELECT path, source, size, check_hash, merged, src_path, src_gen, "
                          "src_size, at FROM imported WHERE path=?", (path,))
        return _imported(rows[0]) if rows else None

    def imports(self, source: str | None = None) -> list[ImportedFile]:
        """What imports wrote (from ``source`` only, when given)."""
        where, args = ("WHERE source=? ", (source,)) if source is not None else ("", ())
        return [_imported(r) for r in self._read(
            "SELECT path, source, size, check_hash, merged, src_path, src_gen, src_size, at "
            f"FROM imported {where}ORDER BY path", args)]

    def known_sessions(self) -> set[str]:
        """The sessions this machine has or had: a transcript it tracks (one deleted here
        since included), or one an import wrote."""
        # Paths are BLOBs: those under projects/ are a range of them ("0" follows "/").
        paths = [bytes(r[0]) for r in self._read(
            "SELECT path FROM files WHERE path >= CAST('projects/' AS BLOB) AND "
            "path < CAST('projects0' AS BLOB) UNION SELECT path FROM imported")]
        return {sid for p in paths if (sid := session_of(p)) is not None}

    def record_imported(self, files: Iterable[ImportedFile]) -> None:
        """Remember what an import wrote (a row per path, the newest wins)."""
        try:
            with self._db:
                self._db.executemany(
                    "INSERT OR REPLACE INTO imported VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [(f.path, f.source, f.size, f.check_hash, int(f.merged), f.src_path,
                      f.src_gen, f.src_size, f.at) for f in files])
        except sqlite3.Error as e:
            raise StateError.of("state database", self.path, e) from e

    def origin(self, sid: str) -> OriginRecord | None:
        rows = self._read("SELECT sid, machine, src_path, rules, at FROM origins WHERE sid=?",
                          (sid,))
        return _origin(rows[0]) if rows else None

    def origin_machines(self) -> dict[str, str]:
        """Each session a restore or an import brought here: the machine it came from."""
        out = {str(sid): str(m) for sid, m in self._read("SELECT sid, machine FROM origins")}
        for path, source in self._read("SELECT path, source FROM imported"):
            sid = session_of(bytes(path))
            if sid is not None:
                out.setdefault(sid, str(source))
        return out

    def record_origins(self, records: Iterable[OriginRecord], replace: bool = False) -> None:
        """Remember where sessions came from; the first record of a session stays (where it
        was first brought from, not where it was last merged from), unless ``replace``
        (a restore moved it: its rules are the ones it has now)."""
        try:
            with self._db:
                self._db.executemany(
                    f"INSERT OR {'REPLACE' if replace else 'IGNORE'} INTO origins "
                    "VALUES (?, ?, ?, ?, ?)",
                    [(r.sid, r.machine, r.src_path, json.dumps([list(x) for x in r.rules]),
                      r.at) for r in records])
        except sqlite3.Error as e:
            raise StateError.of("state database", self.path, e) from e

    def touch(self, updates: Iterable[FileState]) -> None:
        """Record metadata that needs no upload (a file looked at, nothing new in it)."""
        self._write(list(updates), [])

    def commit(self, seq: int, updates: Iterable[FileState],
               catalog: Mapping[bytes, tuple[int, Mapping[str, Any]]] | None = None,
               **meta: str) -> None:
        """Record that segment ``seq`` is durable and what it shipped (the files, and the
        catalog fields its lines named), atomically."""
        self._write(list(updates), [("next_seq", str(seq + 1)), ("last_flush_seq", str(seq)),
                                    ("last_flush_time", repr(time.time())), *meta.items()],
                    catalog or {})

    # -- the catalog --------------------------------------------------------
    def catalog(self) -> dict[bytes, tuple[int, dict[str, str]]]:
        """Each session's catalog fields of its newest generation that named any."""
        return {bytes(p): (g, json.loads(f)) for p, g, f in
                self._read("SELECT path, gen, fields FROM catalog")}

    def catalog_of(self, path: bytes) -> tuple[int, dict[str, str]] | None:
        """One session's catalog fields, as ``catalog`` has them."""
        rows = self._read("SELECT gen, fields FROM catalog WHERE path=?", (path,))
        return (int(rows[0][0]), json.loads(rows[0][1])) if rows else None

    def fill_catalog(self, catalog: Mapping[bytes, tuple[int, Mapping[str, Any]]]) -> None:
        """Replace the catalog by a whole one (a state from before the table)."""
        try:
            with self._db:
                self._db.execute("DELETE FROM catalog")
                self._fold(catalog)
        except sqlite3.Error as e:
            raise StateError.of("state database", self.path, e) from e

    def _fold(self, catalog: Mapping[bytes, tuple[int, Mapping[str, Any]]]) -> bool:
        """Fold a segment's catalog into the table; True when it names a new session."""
        new = False
        for path, (gen, found) in catalog.items():
            sid = session_of(path)
            if sid is None:
                continue
            row = self._db.execute("SELECT gen, fields FROM catalog WHERE path=?",
                                   (path,)).fetchone()
            s = Session(sid, "", path)
            if row is None:
                new = True
            else:
                s.gen, s.fields = int(row[0]), json.loads(row[1])
            s.fold(gen, dict(found))
            self._db.execute("INSERT OR REPLACE INTO catalog VALUES (?, ?, ?)",
                             (path, s.gen, json.dumps(s.fields)))
        return new

    def _membership(self, rows: list[FileState]) -> bool:
        """Whether ``rows`` add, delete or bring back a session transcript."""
        for f in rows:
            if session_of(f.path) is None:
                continue
            old = self._db.execute("SELECT deleted_at FROM files WHERE path=?",
                                   (f.path,)).fetchone()
            if old is None or (old[0] is None) != (f.deleted_at is None):
                return True
        return False

    def _write(self, rows: list[FileState], meta: list[tuple[str, str]],
               catalog: Mapping[bytes, tuple[int, Mapping[str, Any]]] | None = None) -> None:
        try:
            with self._db:
                # The machine's head is rewritten right after a flush that changes which
                # sessions it has (a reader finds a new session there at once).
                if self._membership(rows) | self._fold(catalog or {}):
                    meta = [*meta, ("head_due", "now")]
                self._db.executemany(
                    f"INSERT OR REPLACE INTO files ({_COLUMNS}) VALUES "
                    "(?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [(f.path, f.gen, f.offset, f.dev, f.ino, f.mtime_ns, f.mode, f.check_hash,
                      f.deleted_at) for f in rows])
                self._db.executemany("INSERT OR REPLACE INTO marks VALUES (?, ?, ?, ?)",
                                     [(f.path, f.gen, f.offset, f.marks) for f in rows
                                      if f.marks is not None])
                self._db.executemany("DELETE FROM marks WHERE path=?",
                                     [(f.path,) for f in rows if f.marks is None])
                self._db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", meta)
        except sqlite3.Error as e:
            raise StateError.of("state database", self.path, e) from e


def _imported(row: Any) -> ImportedFile:
    path, source, size, digest, merged, src_path, src_gen, src_size, at = row
    return ImportedFile(bytes(path), str(source), int(size), bytes(digest), bool(merged),
                        bytes(src_path), int(src_gen), int(src_size), float(at))


def _origin(row: Any) -> OriginRecord:
    sid, machine, src_path, rules, at = row
    try:
        pairs = tuple((str(o), str(n)) for o, n in json.loads(rules))
    except (ValueError, TypeError):
        pairs = ()  # written by nothing of ours: no rules
    return OriginRecord(str(sid), str(machine), bytes(src_path), pairs, float(at))


def key_hint(state: State) -> KeyHint:
    """Which key opened this machine's store last (``Engine`` remembers it in the meta)."""
    return KeyHint(state.meta("key_id"), state.meta("key_fingerprint"))


def remembered_key(state_file: Path) -> KeyHint | None:
    """The key hint in this machine's state database, read-only; None without one.

    Only an order: a state that cannot be read gives no hint rather than an error.
    """
    if not state_file.exists():
        return None
    try:
        state = State(state_file, readonly=True)
        try:
            return key_hint(state)
        finally:
            state.close()
    except (StateError, sqlite3.Error):
        return None

"""The findings of the secrets scan: one SQLite file (``secrets.db`` in the state dir,
0600, WAL) over every machine's files scanned here.

Never the value: a finding is where it is (file, line, raw byte range), what it looks
like (kind, a masked value), a sha256 of its raw bytes (to tell they are still those)
and whether it is in a signed string. Per file a cursor says what was scanned
(generation, bytes, lines) and what tells a cut or a rewrite (hashes of the head and of
the last line scanned), as the search index's; per scan, the extent it covered.

A finding's id is 12 hex of a hash of machine, path, offset and its sha256: the same
secret at the same place keeps its id across rescans.

Writes are the caller's to ``commit``; one writer at a time (WAL: readers never wait).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import sqlite3
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from syncd import filemarks
from syncd.errors import StateError
from syncd.format.catalog import session_of_any
from syncd.localdb import LocalDb
from syncd.private import create_private, private_dir
from syncd.secrets.detector import LINE_MAX, RawFinding, scan_bytes

FILE_NAME = "secrets.db"
SCHEMA_VERSION = 1
HEAD = 4 << 10  # the head hashed to tell a rewrite (as the search index's)
ID_LEN = 12
# The session a prompt history line is of.
_SESSION_ID = re.compile(rb'"sessionId":"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-'
                         rb'[0-9a-f]{12})"')

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS files(
    id INTEGER PRIMARY KEY, machine TEXT NOT NULL, path BLOB NOT NULL, session TEXT,
    gen INTEGER NOT NULL, size INTEGER NOT NULL, lines INTEGER NOT NULL DEFAULT 0,
    head_len INTEGER NOT NULL DEFAULT 0, head BLOB, tail_start INTEGER NOT NULL DEFAULT 0,
    tail BLOB, midline INTEGER NOT NULL DEFAULT 0, deleted INTEGER NOT NULL DEFAULT 0,
    UNIQUE(machine, path));
CREATE TABLE IF NOT EXISTS extents(
    file INTEGER NOT NULL, gen INTEGER NOT NULL, start INTEGER NOT NULL,
    end INTEGER NOT NULL, found INTEGER NOT NULL, scans INTEGER NOT NULL DEFAULT 1);
CREATE TABLE IF NOT EXISTS findings(
    id TEXT PRIMARY KEY, file INTEGER NOT NULL, line INTEGER NOT NULL,
    offset INTEGER NOT NULL, length INTEGER NOT NULL, kind TEXT NOT NULL,
    masked TEXT NOT NULL, signed INTEGER NOT NULL, sha256 TEXT NOT NULL,
    session TEXT) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS notes(
    file INTEGER NOT NULL, offset INTEGER NOT NULL, text TEXT NOT NULL,
    PRIMARY KEY(file, offset)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS extents_file ON extents(file);
CREATE INDEX IF NOT EXISTS findings_file ON findings(file);
CREATE INDEX IF NOT EXISTS files_session ON files(session);
"""


@dataclass(frozen=True)
class Finding:
    """One finding as kept: ``path`` relative to the Claude tree, ``[offset, offset +
    length)`` the raw bytes of the file, ``sha256`` theirs."""

    id: str
    machine: str
    path: bytes
    line: int
    offset: int
    length: int
    kind: str
    masked: str
    signed: bool
    sha256: str
    session: str | None


@dataclass(frozen=True, slots=True)
class Cursor:
    """What tells whether a file's scanned bytes are still its first ``size`` bytes."""

    gen: int
    size: int
    lines: int
    head_len: int
    head: bytes | None
    tail_start: int
    tail: bytes | None
    deleted: bool


def finding_id(machine: str, path: bytes, offset: int, sha256: str) -> str:
    h = hashlib.sha256(b"\0".join((machine.encode(), path, str(offset).encode(),
                                   sha256.encode())))
    return h.hexdigest()[:ID_LEN]


def is_scanned(path: bytes) -> bool:
    """What the scan reads: a session's transcripts (subagents too) and tool results,
    and the prompt history."""
    if path == b"history.jsonl":
        return True
    if not path.startswith(b"projects/") or session_of_any(path) is None:
        return False
    return path.endswith(b".jsonl") or b"/tool-results/" in path


def is_text(path: bytes) -> bool:
    """A tool result is the tool's text, not JSON lines."""
    return b"/tool-results/" in path



class Findings(LocalDb):
    """The open findings database. Not thread-safe: one per thread."""

    what = "secrets findings"

    def __init__(self, db: sqlite3.Connection, path: Path, *, empty: bool = False) -> None:
        super().__init__(db, path)
        # Read-only, made by a writer that has not written its tables yet: nothing found.
        self.empty = empty

    @classmethod
    def open(cls, path: Path, *, readonly: bool = False) -> Findings:
        try:
            if not readonly:
                private_dir(path.parent)
                with contextlib.suppress(FileExistsError):
                    os.close(create_private(path, os.O_EXCL))
            uri = f"file:{path}?mode=ro" if readonly else str(path)
            db = sqlite3.connect(uri, uri=readonly, isolation_level=None,
                                 check_same_thread=False, timeout=30)
            made = db.execute("SELECT 1 FROM sqlite_master WHERE name='findings'"
                              ).fetchone() is not None
            if not readonly:
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")
                if not made:
                    db.executescript(f"BEGIN IMMEDIATE;\n{_SCHEMA}\nINSERT OR IGNORE INTO "
                                     f"meta VALUES('version', {SCHEMA_VERSION});\nCOMMIT;")
        except (sqlite3.Error, OSError) as e:
            raise StateError.of("secrets findings", path, e) from e
        return cls(db, path, empty=readonly and not made)

    # -- cursors --------------------------------------------------------------------------

    def cursor(self, machine: str, path: bytes) -> Cursor | None:
        row = self.db.execute(
            "SELECT gen, size, lines, head_len, head, tail_start, tail, deleted FROM files "
            "WHERE machine=? AND path=?", (machine, path)).fetchone()
        return None if row is None else Cursor(row[0], row[1], row[2], row[3], row[4],
                                               row[5], row[6], bool(row[7]))

    def files(self, machine: str) -> dict[bytes, bool]:
        """Each file of ``machine`` known here: whether it is marked deleted."""
        return {bytes(p): bool(d) for p, d in self.db.execute(
            "SELECT path, deleted FROM files WHERE machine=?", (machine,))}

    def mark_deleted(self, machine: str, path: bytes) -> None:
        """The file is gone: its findings go (nothing is left there to redact)."""
        self._begin()
        row = self.db.execute("SELECT id FROM files WHERE machine=? AND path=?",
                              (machine, path)).fetchone()
        if row is not None:
            self._drop(int(row[0]))
            self.db.execute("UPDATE files SET deleted=1 WHERE id=?", (row[0],))

    def drop_file(self, path: bytes) -> None:
        """Every machine's findings and cursor of ``path``: scanned again from 0 (a
        redact masked it in place, at the same size)."""
        self._begin()
        for (fid,) in self.db.execute("SELECT id FROM files WHERE path=?", (path,)).fetchall():
            self._drop(int(fid))
            self.db.execute("DELETE FROM files WHERE id=?", (fid,))

    def drop_session(self, session: str) -> None:
        """Every machine's findings of ``session`` (a forget)."""
        self._begin()
        for (fid,) in self.db.execute("SELECT id FROM files WHERE session=?",
                                      (session,)).fetchall():
            self._drop(int(fid))
            self.db.execute("DELETE FROM files WHERE id=?", (fid,))

    def _drop(self, fid: int) -> None:
        for table in ("findings", "extents", "notes"):
            self.db.execute(f"DELETE FROM {table} WHERE file=?", (fid,))

    # -- scanning -------------------------------------------------------------------------

    def feed(self, machine: str, path: bytes, gen: int, start: int, data: bytes) -> int:
        """Scan the complete lines of ``data`` (bytes ``start``… of generation ``gen``)
        and keep what is found; returns the bytes consumed. A feed not continuing the
        cursor drops the file's findings first, and must then begin at 0. A line over
        ``LINE_MAX`` is consumed unscanned, with a note."""
        db = self.db
        self._begin()
        row = db.execute("SELECT id, gen, size, lines, midline, head_len, head, tail_start, "
                         "tail FROM files WHERE machine=? AND path=?",
                         (machine, path)).fetchone()
        fresh = row is None or row[1] != gen or row[2] != start
        if fresh and start != 0:
            raise ValueError(f"secrets: {machine}:{path!r} fed from {start}, "
                             "not from its cursor nor from 0")
        if row is None:
            cur = db.execute("INSERT INTO files(machine, path, session, gen, size) "
                             "VALUES(?, ?, ?, ?, 0)",
                             (machine, path, session_of_any(path), gen))
            assert cur.lastrowid is not None
            fid, lines, midline = cur.lastrowid, 0, False
            head_len, head, tail_start, tail = 0, None, 0, None
        else:
            fid = int(row[0])
            if fresh:
                self._drop(fid)
                lines, midline, head_len, head, tail_start, tail = 0, False, 0, None, 0, None
            else:
                lines, midline = int(row[3]), bool(row[4])
                head_len, head, tail_start, tail = row[5], row[6], row[7], row[8]
        end = data.rfind(b"\n") + 1
        skip = 0
        if midline:  # the rest of a line too long to scan
            cut = data.find(b"\n")
            if cut < 0:
                end = skip = len(data)
            else:
                skip, midline = cut + 1, False
                lines += 1
        if end == 0 and len(data) > LINE_MAX:
            end = skip = len(data)
            midline = True
            db.execute("INSERT OR IGNORE INTO notes VALUES(?, ?, ?)", (
                fid, start, f"line {lines + 1} at byte {start}: over {LINE_MAX} bytes, "
                "not scanned"))
        if end > skip:
            notes: list[str] = []
            found = scan_bytes(data[skip:end], start + skip, first_line=lines + 1,
                               notes=notes, text=is_text(path))
            self._keep(fid, machine, path, found, data, start)
            db.executemany("INSERT OR IGNORE INTO notes VALUES(?, ?, ?)",
                           [(fid, start + skip, n) for n in notes])
            # A scan that continues the last one grows its extent: one row per file and
            # generation, however many flushes it took.
            grown = db.execute("UPDATE extents SET end=?, found=found+?, scans=scans+1 "
                               "WHERE file=? AND gen=? AND end=?",
                               (start + end, len(found), fid, gen, start + skip)).rowcount
            if not grown:
                db.execute("INSERT INTO extents VALUES(?, ?, ?, ?, ?, 1)",
                           (fid, gen, start + skip, start + end, len(found)))
            lines += data.count(b"\n", skip, end)
            last = data.rfind(b"\n", skip, end - 1) + 1
            if not midline:
                tail_start = start + max(last, skip)
                tail = filemarks.digest(data[max(last, skip):end])
        if start == 0 and end > 0:
            head_len = min(HEAD, end)
            head = filemarks.digest(data[:head_len])
        db.execute("UPDATE files SET gen=?, size=?, lines=?, midline=?, head_len=?, head=?, "
                   "tail_start=?, tail=?, deleted=0, session=? WHERE id=?",
                   (gen, start + end, lines, int(midline), head_len, head, tail_start, tail,
                    session_of_any(path), fid))
        return end

    def _keep(self, fid: int, machine: str, path: bytes, found: list[RawFinding],
              data: bytes, base: int) -> None:
        """``data``: the bytes scanned, from ``base`` (a history line names its session)."""
        def session(f: RawFinding) -> str | None:
            if path != b"history.jsonl":
                return None
            at = f.offset - base
            lo = data.rfind(b"\n", 0, at) + 1
            hi = data.find(b"\n", at)
            m = _SESSION_ID.search(data, lo, len(data) if hi < 0 else hi)
            return m.group(1).decode() if m else None

        self.db.executemany(
            "INSERT OR REPLACE INTO findings VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(finding_id(machine, path, f.offset, f.sha256), fid, f.line, f.offset, f.length,
              f.kind, f.masked, int(f.signed), f.sha256, session(f)) for f in found])

    # -- reading --------------------------------------------------------------------------

    def findings(self, machine: str | None = None, session: str | None = None
                 ) -> list[Finding]:
        """Every finding kept (of ``machine``, of ``session``), by machine, file, offset."""
        if self.empty:
            return []
        sql = ("SELECT f.id, m.machine, m.path, f.line, f.offset, f.length, f.kind, "
               "f.masked, f.signed, f.sha256, coalesce(f.session, m.session) AS sess "
               "FROM findings f JOIN files m ON m.id = f.file WHERE m.deleted = 0")
        args: list[str] = []
        if machine is not None:
            sql += " AND m.machine = ?"
            args.append(machine)
        if session is not None:
            sql += " AND sess = ?"
            args.append(session)
        rows = self.db.execute(sql + " ORDER BY m.machine, m.path, f.offset", args)
        return [_finding(r) for r in rows]

    def notes(self, machine: str | None = None) -> list[tuple[str, bytes, str]]:
        """(machine, path, text) of what was not scanned."""
        if self.empty:
            return []
        sql = ("SELECT m.machine, m.path, n.text FROM notes n JOIN files m ON m.id = n.file "
               "WHERE m.deleted = 0")
        rows = self.db.execute(sql + (" AND m.machine = ?" if machine else "") +
                               " ORDER BY m.machine, m.path, n.offset",
                               (machine,) if machine else ())
        return [(r[0], bytes(r[1]), r[2]) for r in rows]

    def sessions_with_findings(self, machine: str | None = None) -> int:
        if self.empty:
            return 0
        sql = ("SELECT count(DISTINCT coalesce(f.session, m.session, m.path)) FROM findings f "
               "JOIN files m ON m.id = f.file WHERE m.deleted = 0")
        row = self.db.execute(sql + (" AND m.machine = ?" if machine else ""),
                              (machine,) if machine else ()).fetchone()
        return int(row[0])

    def get(self, finding: str) -> Finding | None:
        if self.empty:
            return None
        row = self.db.execute(
            "SELECT f.id, m.machine, m.path, f.line, f.offset, f.length, f.kind, f.masked, "
            "f.signed, f.sha256, coalesce(f.session, m.session) FROM findings f "
            "JOIN files m ON m.id = f.file "
            "WHERE f.id = ? AND m.deleted = 0", (finding.lower(),)).fetchone()
        return None if row is None else _finding(row)


def _finding(r: Any) -> Finding:
    return Finding(id=str(r[0]), machine=str(r[1]), path=bytes(r[2]), line=int(r[3]),
                   offset=int(r[4]), length=int(r[5]), kind=str(r[6]), masked=str(r[7]),
                   signed=bool(r[8]), sha256=str(r[9]),
                   session=None if r[10] is None else str(r[10]))


def lookup(state_dir: Path, finding_id: str) -> Finding | None:
    """The finding of that id kept in ``state_dir``'s findings, else None."""
    path = state_dir / FILE_NAME
    if not path.exists():
        return None
    with Findings.open(path, readonly=True) as f:
        try:
            return f.get(finding_id)
        except sqlite3.Error as e:
            raise StateError.of("secrets findings", path, e) from e


def value_of(root: Path, f: Finding) -> bytes | None:
    """The finding's raw bytes read back from the local file under ``root``; None when
    the file is gone or they no longer hash to ``f.sha256`` (it changed since)."""
    if f.path.startswith(b"/") or b".." in f.path.split(b"/"):
        return None  # not a path under the tree (it came from a store)
    full = os.path.join(os.fsencode(root), f.path)
    try:
        fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode) or f.length > LINE_MAX:
            return None
        data = os.pread(fd, f.length, f.offset)
    except OSError:
        return None
    finally:
        os.close(fd)
    ok = len(data) == f.length and hashlib.sha256(data).hexdigest() == f.sha256
    return data if ok else None

"""The search index: one SQLite FTS5 file (``search.db`` in the state dir) over the
transcripts of every machine indexed here.

One FTS row per transcript line that holds searchable text (``extract.Row``: body,
tools, output), so BM25 ranks lines and a session scores by its best ones. The text
itself is kept once, in ``docs`` (zlib-compressed when long), and FTS5 reads it through
a view (external content) for snippets: the index holds only its inverted lists.
Per file a cursor says what was indexed (generation, bytes) and what tells a cut or a
rewrite (a hash of the head and of the last line indexed), as ``backup/marks`` does.
Per session, its catalog fields; a session's title and prompts are one more row.

Writes are the caller's to ``commit``; one writer at a time (WAL: readers never wait).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import zlib
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from syncd import filemarks
from syncd.errors import StateError
from syncd.format.catalog import FIRST, LATEST, MAX_LINE, TITLE_ORDER, session_of, session_of_any
from syncd.localdb import LocalDb
from syncd.private import create_private, private_dir
from syncd.search import extract

FILE_NAME = "search.db"
SCHEMA_VERSION = 1
# The head hashed to tell a rewrite: as many bytes as the file had when first read.
HEAD = 4 << 10
# Text shorter than this is stored as is (compression would not pay for its header).
PACK_MIN = 160
# Catalog fields a session keeps; anything else given is not ours to store.
FIELDS = ("title", "project", "last_activity", "git_branch", "origin", "first_prompt",
          "last_prompt")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sessions(
    id INTEGER PRIMARY KEY, machine TEXT NOT NULL, session TEXT NOT NULL,
    project TEXT, title TEXT, last_activity REAL, git_branch TEXT, origin TEXT,
    first_prompt TEXT, last_prompt TEXT, catalog TEXT,
    deleted INTEGER NOT NULL DEFAULT 0, catalog_doc INTEGER,
    UNIQUE(machine, session));
CREATE TABLE IF NOT EXISTS files(
    id INTEGER PRIMARY KEY, machine TEXT NOT NULL, path BLOB NOT NULL,
    sess INTEGER NOT NULL, gen INTEGER NOT NULL, size INTEGER NOT NULL,
    head_len INTEGER NOT NULL DEFAULT 0, head BLOB, tail_start INTEGER NOT NULL DEFAULT 0,
    tail BLOB, midline INTEGER NOT NULL DEFAULT 0, deleted INTEGER NOT NULL DEFAULT 0,
    UNIQUE(machine, path));
CREATE TABLE IF NOT EXISTS docs(
    id INTEGER PRIMARY KEY, file INTEGER, sess INTEGER NOT NULL,
    body, tools, output);
CREATE INDEX IF NOT EXISTS docs_file ON docs(file);
CREATE INDEX IF NOT EXISTS files_sess ON files(sess);
CREATE INDEX IF NOT EXISTS sessions_activity ON sessions(last_activity);
CREATE VIEW IF NOT EXISTS docs_text AS
    SELECT id, syncd_unpack(body) AS body, syncd_unpack(tools) AS tools,
           syncd_unpack(output) AS output FROM docs;
CREATE VIRTUAL TABLE IF NOT EXISTS text USING fts5(
    body, tools, output, content='docs_text', content_rowid='id',
    tokenize='unicode61 remove_diacritics 2');
"""


def _pack(text: str) -> str | bytes | None:
    if not text:
        return None
    if len(text) < PACK_MIN:
        return text
    return zlib.compress(text.encode("utf-8", "surrogatepass"), 1)


def _unpack(value: str | bytes | None) -> str | None:
    if isinstance(value, bytes):
        return zlib.decompress(value).decode("utf-8", "surrogatepass")
    return value


def _epoch(stamp: str | None) -> float | None:
    if not stamp:
        return None
    try:
        return datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class FileMarks:
    """What tells whether a file's indexed bytes are still its first ``size`` bytes: a
    hash of ``[0, head_len)`` and of its last indexed line ``[tail_start, size)``."""

    gen: int
    size: int
    head_len: int
    head: bytes | None
    tail_start: int
    tail: bytes | None
    deleted: bool = False  # the file was gone when last looked at


class SearchIndex(LocalDb):
    """The open index. Not thread-safe: one per thread."""

    what = "search index"

    @classmethod
    def open(cls, path: Path) -> SearchIndex:
        try:
            # The transcripts' text: as private as they are.
            private_dir(path.parent)
            with contextlib.suppress(FileExistsError):
                os.close(create_private(path, os.O_EXCL))
            db = sqlite3.connect(path, isolation_level=None, check_same_thread=False,
                                 timeout=30)
            db.create_function("syncd_unpack", 1, _unpack, deterministic=True)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            # Made once: a reader never waits for the lock a writer holds.
            if db.execute("SELECT 1 FROM sqlite_master WHERE name='text'").fetchone() is None:
                db.executescript(f"BEGIN IMMEDIATE;\n{_SCHEMA}\n"
                                 f"INSERT OR IGNORE INTO meta VALUES('version', "
                                 f"{SCHEMA_VERSION});\nCOMMIT;")
        except (sqlite3.Error, OSError) as e:
            raise StateError.of("search index", path, e) from e
        return cls(db, path)

    # -- writing --------------------------------------------------------------------------

    def _session_id(self, machine: str, session: str) -> int:
        row = self.db.execute("SELECT id FROM sessions WHERE machine=? AND session=?",
                              (machine, session)).fetchone()
        if row is not None:
            return int(row[0])
        cur = self.db.execute("INSERT INTO sessions(machine, session) VALUES(?, ?)",
                              (machine, session))
        assert cur.lastrowid is not None
        return cur.lastrowid

    def _drop_docs(self, where: str, arg: int) -> None:
        # External content: FTS5 forgets a row only when told its old values.
        self.db.execute(
            "INSERT INTO text(text, rowid, body, tools, output) "
            f"SELECT 'delete', id, syncd_unpack(body), syncd_unpack(tools), "
            f"syncd_unpack(output) FROM docs WHERE {where}=?", (arg,))
        self.db.execute(f"DELETE FROM docs WHERE {where}=?", (arg,))

    def _insert(self, file: int | None, sess: int, batch: list[extract.Row]) -> int | None:
        """Insert ``batch`` as new rows; returns the last one's id. Ids are taken past the
        largest (this writer holds the lock), so each table gets one executemany."""
        if not batch:
            return None
        top = self.db.execute("SELECT max(id) FROM docs").fetchone()[0] or 0
        ids = range(top + 1, top + 1 + len(batch))
        self.db.executemany(
            "INSERT INTO docs(id, file, sess, body, tools, output) VALUES(?, ?, ?, ?, ?, ?)",
            [(i, file, sess, _pack(r.body), _pack(r.tools), _pack(r.output))
             for i, r in zip(ids, batch, strict=True)])
        self.db.executemany(
            "INSERT INTO text(rowid, body, tools, output) VALUES(?, ?, ?, ?)",
            [(i, r.body or None, r.tools or None, r.output or None)
             for i, r in zip(ids, batch, strict=True)])
        return ids[-1]

    def cursor(self, machine: str, path: bytes) -> tuple[int, int] | None:
        """The generation and bytes indexed of one file (None: never indexed)."""
        row = self.db.execute("SELECT gen, size FROM files WHERE machine=? AND path=?",
                              (machine, path)).fetchone()
        return None if row is None else (int(row[0]), int(row[1]))

    def marks(self, machine: str, path: bytes) -> FileMarks | None:
        row = self.db.execute(
            "SELECT gen, size, head_len, head, tail_start, tail, deleted FROM files "
            "WHERE machine=? AND path=?", (machine, path)).fetchone()
        return None if row is None else FileMarks(row[0], row[1], row[2], row[3], row[4], row[5],
                                               bool(row[6]))

    def feed(self, machine: str, path: bytes, gen: int, start: int, data: bytes) -> int:
        """Index the complete lines of ``data`` (bytes ``start``… of generation ``gen``);
        returns the bytes consumed. A feed not continuing the cursor drops the file's
        rows first, and must then begin at 0. A line longer than ``MAX_LINE`` is
        consumed unread."""
        sid = session_of_any(path)
        if sid is None:  # not a session's: nothing of it is searched, nothing kept
            return data.rfind(b"\n") + 1
        db = self.db
        self._begin()
        row = db.execute("SELECT id, gen, size, midline, head_len, head, tail_start, tail "
                         "FROM files WHERE machine=? AND path=?", (machine, path)).fetchone()
        fresh = row is None or row[1] != gen or row[2] != start
        if fresh and start != 0:
            raise ValueError(f"search index: {machine}:{path!r} fed from {start}, "
                             "not from its cursor nor from 0")
        sess = self._session_id(machine, sid)
        if row is None:
            cur = db.execute("INSERT INTO files(machine, path, sess, gen, size) "
                             "VALUES(?, ?, ?, ?, 0)", (machine, path, sess, gen))
            assert cur.lastrowid is not None
            fid, midline = cur.lastrowid, False
            head_len, head, tail_start, tail = 0, None, 0, None
        else:
            fid = int(row[0])
            if fresh:
                self._drop_docs("file", fid)
                midline, head_len, head, tail_start, tail = False, 0, None, 0, None
            else:
                midline = bool(row[3])
                head_len, head, tail_start, tail = row[4], row[5], row[6], row[7]
        end = data.rfind(b"\n") + 1
        skip = 0
        if midline:  # the rest of a line too long to read
            cut = data.find(b"\n")
            if cut < 0:
                end = len(data)
                skip = end
            else:
                skip, midline = cut + 1, False
        if end == 0 and len(data) > MAX_LINE:
            end, skip, midline = len(data), len(data), True
        if end > skip:
            batch = list(extract.rows(data[skip:end]))
            if batch:
                self._insert(fid, sess, batch)
            last = data.rfind(b"\n", skip, end - 1) + 1
            if not midline:
                tail_start = start + max(last, skip)
                tail = filemarks.digest(data[max(last, skip):end])
        if start == 0 and end > 0:
            head_len = min(HEAD, end)
            head = filemarks.digest(data[:head_len])
        db.execute("UPDATE files SET sess=?, gen=?, size=?, midline=?, head_len=?, head=?, "
                   "tail_start=?, tail=?, deleted=0 WHERE id=?",
                   (sess, gen, start + end, int(midline), head_len, head, tail_start, tail,
                    fid))
        if session_of(path) is not None:
            self._settle(sess)
        return end

    def set_session(self, machine: str, session: str,
                    fields: dict[str, str | float | None]) -> None:
        """Set a session's catalog fields (``FIELDS``; ``cwd`` stands for ``project``;
        ``deleted``: truthy or not).
        Its title and prompts are searched too, as one row of their own."""
        known: dict[str, str | float | None] = {
            ("project" if k == "cwd" else k): v for k, v in fields.items()
            if k in FIELDS or k == "cwd"}
        if "deleted" in fields:  # a catalog's deletion (another machine's session)
            known["deleted"] = 1 if fields["deleted"] else 0
        self._begin()
        sess = self._session_id(machine, session)
        if not known:
            return
        text_sql = "SELECT catalog_doc, title, first_prompt, last_prompt FROM sessions " \
            "WHERE id=?"
        before = self.db.execute(text_sql, (sess,)).fetchone()
        cols = ", ".join(f"{k}=?" for k in known)
        self.db.execute(f"UPDATE sessions SET {cols} WHERE id=?", (*known.values(), sess))
        row = self.db.execute(text_sql, (sess,)).fetchone()
        if row[1:] == before[1:]:  # its searched text is as it was (most flushes)
            return
        texts = [str(t) for t in dict.fromkeys(row[1:]) if t]
        if row[0] is not None:
            self.db.execute("INSERT INTO text(text, rowid, body) SELECT 'delete', id, "
                            "syncd_unpack(body) FROM docs WHERE id=?", (row[0],))
            self.db.execute("DELETE FROM docs WHERE id=?", (row[0],))
        doc = None
        if texts:
            body = extract._clean("\n".join(texts), extract.BODY_MAX)
            doc = self._insert(None, sess, [extract.Row(body, "", "")])
        self.db.execute("UPDATE sessions SET catalog_doc=? WHERE id=?", (doc, sess))

    def fold_catalog(self, machine: str, session: str, found: dict[str, str], *,
                     reset: bool = False) -> None:
        """Fold the raw catalog fields one stretch of a transcript named (``MetaScanner``)
        into the session's, as the catalog does (first ``cwd`` and prompt, newest title),
        and set the searched fields from them. ``reset``: the transcript is read anew."""
        self._begin()
        sess = self._session_id(machine, session)
        row = self.db.execute("SELECT catalog FROM sessions WHERE id=?", (sess,)).fetchone()
        try:
            have = {} if reset or not row[0] else dict(json.loads(row[0]))
        except (ValueError, TypeError):
            have = {}
        for key in FIRST:
            if key in found and key not in have:
                have[key] = found[key]
        for key in LATEST:
            if key in found:
                have[key] = found[key]
        self.db.execute("UPDATE sessions SET catalog=? WHERE id=?",
                        (json.dumps(have, ensure_ascii=False), sess))
        fields: dict[str, str | float | None] = {
            "title": next((have[k] for k in TITLE_ORDER if have.get(k)), None),
            "project": have.get("relocated_cwd") or have.get("cwd"),
            "git_branch": have.get("git_branch"),
            "first_prompt": have.get("first_prompt"),
            "last_prompt": have.get("last_prompt"),
            "last_activity": _epoch(have.get("last_activity"))}
        self.set_session(machine, session, fields)

    def mark_deleted(self, machine: str, path: bytes) -> None:
        """The file is gone: its text stays findable; a session whose transcript is gone
        is marked deleted."""
        self._begin()
        row = self.db.execute("SELECT sess FROM files WHERE machine=? AND path=?",
                              (machine, path)).fetchone()
        if row is None:
            return
        self.db.execute("UPDATE files SET deleted=1 WHERE machine=? AND path=?",
                        (machine, path))
        if session_of(path) is not None:
            self._settle(int(row[0]))

    def _settle(self, sess: int) -> None:
        """A session's transcript moved (``/cd``, a worktree: the same session id in another
        project folder) is not deleted: the copy left behind goes, its text is the live
        one's. With no live transcript left, the session is marked deleted."""
        tops = [(int(i), bool(d)) for i, p, d in self.db.execute(
            "SELECT id, path, deleted FROM files WHERE sess=?", (sess,))
            if session_of(bytes(p)) is not None]
        live = any(not d for _, d in tops)
        if live:
            for fid, deleted in tops:
                if deleted:
                    self._drop_docs("file", fid)
                    self.db.execute("DELETE FROM files WHERE id=?", (fid,))
        self.db.execute("UPDATE sessions SET deleted=? WHERE id=?", (int(not live), sess))

    def drop_session(self, session: str) -> None:
        """Every machine's text of ``session`` goes (``forget``)."""
        self._begin()
        for (sid,) in self.db.execute("SELECT id FROM sessions WHERE session=?",
                                      (session,)).fetchall():
            self._drop_docs("sess", int(sid))
            self.db.execute("DELETE FROM files WHERE sess=?", (sid,))
            self.db.execute("DELETE FROM sessions WHERE id=?", (sid,))

    def drop_file(self, path: bytes) -> None:
        """Every machine's text of ``path`` goes, and its cursor: indexed again from 0
        (``redact`` masked it in place, at the same size)."""
        self._begin()
        for (fid,) in self.db.execute("SELECT id FROM files WHERE path=?", (path,)).fetchall():
            self._drop_docs("file", int(fid))
            self.db.execute("DELETE FROM files WHERE id=?", (fid,))

    def purge(self) -> None:
        """No page of the file keeps what was dropped: the full-text index merged, the
        database vacuumed, the write-ahead log emptied."""
        self.commit()
        try:
            self.db.execute("INSERT INTO text(text) VALUES('optimize')")
            self.db.execute("VACUUM")
            self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error as e:
            raise StateError.of(self.what, self.path, e) from e

    def files(self, machine: str) -> dict[bytes, bool]:
        """The paths of ``machine`` indexed here, each with whether it is marked deleted."""
        return {bytes(p): bool(d) for p, d in self.db.execute(
            "SELECT path, deleted FROM files WHERE machine=?", (machine,))}

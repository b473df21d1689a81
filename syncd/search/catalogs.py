"""Searching the catalogs of machines whose full text is not indexed here.

A machine's head lists its sessions with their titles, prompts and projects: read
(concurrently, as `syncd sessions` reads them) and put in a throwaway FTS5 table, they
answer the same queries as the index, at no download beyond the heads.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Collection
from dataclasses import dataclass

from syncd.format.catalog import TITLE_ORDER, Session
from syncd.repository import Repository
from syncd.restore.listing import machine_sessions
from syncd.search.extract import MARK_END, MARK_START
from syncd.search.index import SearchIndex
from syncd.search.query import QUERY_MAX, SNIPPET_TOKENS, BadQuery, Hit, pieces
from syncd.search.remote import activity_time
from syncd.seen import Seen

_NO_MARKS = {ord(MARK_START): None, ord(MARK_END): None}
# Of each field, what is searched (a head holds 4 KiB of each at most).
FIELD_MAX = 2048
_TABLE = """CREATE VIRTUAL TABLE text USING fts5(body, tools, output,
    tokenize='unicode61 remove_diacritics 2')"""


@dataclass(frozen=True)
class CatalogHit(Hit):
    """A session found in its machine's catalog only (its full text is not indexed)."""

    catalog_only: bool = True


def indexed_machines(index: SearchIndex) -> set[str]:
    """The machines whose full text the index holds: those indexed on request, and those
    followed (their imports are this machine's sessions, of that origin). Their
    catalogs need no searching."""
    return {m for (m,) in index.db.execute(
        "SELECT DISTINCT machine FROM files UNION "
        "SELECT DISTINCT origin FROM sessions WHERE origin IS NOT NULL") if m}


def _text(s: Session) -> str:
    fields = [s.fields.get(k) for k in TITLE_ORDER] + [s.place, s.project]
    return "\n".join(dict.fromkeys(f[:FIELD_MAX].translate(_NO_MARKS) for f in fields if f))


def search_catalogs(repo: Repository, query: str, *, skip: Collection[str] = (),
                    machine: str | None = None, project: str | None = None,
                    since: float | None = None, until: float | None = None,
                    limit: int = 20, offset: int = 0, problems: list[str] | None = None,
                    seen: Seen | None = None) -> list[CatalogHit]:
    """The sessions of the store's machines (``machine``'s alone when given) but those
    of ``skip`` (the machines indexed here) whose catalog entry matches ``query``
    (FTS5's syntax, as ``search``), best first; ``problems`` hears of the heads that
    could not be read."""
    if not query.strip() or len(query) > QUERY_MAX:
        raise BadQuery(f"search: cannot use the query {query[:80]!r}: "
                       f"empty or over {QUERY_MAX} characters")
    names = [m for m in ([machine] if machine else repo.machines()) if m not in skip]
    # An anonymous database: SQLite keeps it in memory while it fits its cache and
    # spills to a temporary file beyond that, however many sessions a store lists.
    db = sqlite3.connect("", isolation_level=None)
    try:
        db.execute(_TABLE)
        db.execute("CREATE TABLE meta(id INTEGER PRIMARY KEY, machine, session, project, "
                   "last_activity, title, deleted)")
        db.execute("BEGIN")
        for name, sessions in machine_sessions(repo, names, project, problems, seen):
            for s in sessions:
                t = activity_time(s.fields.get("last_activity"))
                if (since is not None and (t is None or t < since)) or \
                        (until is not None and (t is None or t > until)):
                    continue
                cur = db.execute("INSERT INTO meta(machine, session, project, last_activity, "
                                 "title, deleted) VALUES(?, ?, ?, ?, ?, ?)",
                                 (name, s.session_id, s.place, t, s.title,
                                  s.deleted_at is not None))
                db.execute("INSERT INTO text(rowid, body, tools, output) VALUES(?, ?, '', '')",
                           (cur.lastrowid, _text(s)))
        db.execute("COMMIT")
        try:
            found = db.execute(
                f"SELECT m.machine, m.session, m.project, m.last_activity, m.title, "
                f"m.deleted, bm25(text), snippet(text, 0, '{MARK_START}', '{MARK_END}', "
                f"'\u2026', {SNIPPET_TOKENS}) FROM text JOIN meta m ON m.id = text.rowid "
                "WHERE text MATCH ? ORDER BY bm25(text), m.id LIMIT ? OFFSET ?",
                (query, max(0, limit), max(0, offset))).fetchall()
        except sqlite3.OperationalError as e:
            raise BadQuery(f"search: cannot parse the query {query[:200]!r} "
                           f"(FTS5 syntax: {e})") from None
        return [CatalogHit(machine=m, session=sid, project=proj, last_activity=t,
                           title=title or "", snippet=pieces(snip or ""),
                           deleted=bool(deleted), score=float(score))
                for m, sid, proj, t, title, deleted, score, snip in found]
    finally:
        with contextlib.suppress(sqlite3.Error):
            db.close()

"""Searching the index: FTS5 MATCH as FTS5 parses it (phrases, prefixes, AND/OR/NOT),
ranked by BM25, one hit per session (its best line; more matching lines raise it a
little), with a snippet as plain pieces (each face escapes them its own way)."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from syncd.errors import BadQuery, StateError
from syncd.search.extract import MARK_END, MARK_START
from syncd.search.index import SearchIndex

__all__ = ["BadQuery", "Hit", "pieces", "search"]

# Column weights: what was said over what a tool was given over what it printed.
_WEIGHTS = (1.0, 0.6, 0.4)
SNIPPET_TOKENS = 24
QUERY_MAX = 1000
_DATABASE_TROUBLE = ("locked", "disk", "malformed", "readonly", "unable to open", "no such "
                     "table", "interrupt", "memory")


@dataclass(frozen=True)
class Hit:
    machine: str
    session: str
    project: str | None
    last_activity: float | None
    title: str
    snippet: list[tuple[str, bool]]
    deleted: bool
    score: float
    origin: str | None = None  # the machine an imported session came from


def pieces(marked: str) -> list[tuple[str, bool]]:
    """``marked`` (matches between the private markers) as (text, is_match) pieces."""
    out: list[tuple[str, bool]] = []
    rest = marked
    while rest:
        a = rest.find(MARK_START)
        if a < 0:
            out.append((rest, False))
            break
        if a:
            out.append((rest[:a], False))
        b = rest.find(MARK_END, a + 1)
        b = len(rest) if b < 0 else b
        if b > a + 1:
            out.append((rest[a + 1:b], True))
        rest = rest[b + 1:]
    return out


def _balanced(query: str) -> bool:
    """Whether no ')' outside a "string" closes more parentheses than were opened."""
    depth, quoted = 0, False
    for c in query:
        if c == '"':
            quoted = not quoted  # FTS5 writes a quote inside a string as "": two flips
        elif not quoted and c in "()":
            depth += 1 if c == "(" else -1
            if depth < 0:
                return False
    return True


def search(index: SearchIndex, query: str, *, machine: str | None = None,
           project: str | None = None, since: float | None = None,
           until: float | None = None, limit: int = 20, offset: int = 0,
           all_text: bool = False) -> list[Hit]:
    """The sessions matching ``query``, best first."""
    if not query.strip() or len(query) > QUERY_MAX:
        raise BadQuery(f"search: cannot use the query {query[:80]!r}: "
                       f"empty or over {QUERY_MAX} characters")
    # Without --all-text only what was said and what tools were given is looked in: the
    # query goes inside a column filter, which a ')' of its own must not close.
    if not all_text and not _balanced(query):
        raise BadQuery(f"search: cannot parse the query {query[:200]!r} (a ')' closes "
                       "more than was opened)")
    match = query if all_text else f"{{body tools}} : ({query})"
    where = []
    args: list[object] = [match]
    if machine is not None:
        where.append("(s.machine = ? OR s.origin = ?)")
        args += [machine, machine]
    if project is not None:
        where.append("(s.project = ? OR s.project LIKE ? ESCAPE '\\')")
        esc = project.rstrip("/").replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        args += [project, esc + "/%"]
    if since is not None:
        where.append("s.last_activity >= ?")
        args.append(since)
    if until is not None:
        where.append("s.last_activity <= ?")
        args.append(until)
    cond = " AND ".join(where) or "1"
    weights = ", ".join(map(str, _WEIGHTS))
    # Materialized: bm25() is only usable in the FTS5 query itself, not in a join.
    sql = f"""
        WITH m AS MATERIALIZED (SELECT rowid AS id, bm25(text, {weights}) AS score
                   FROM text WHERE text MATCH ?)
        SELECT d.sess, min(m.score) AS best, m.id, count(*) AS n
        FROM m JOIN docs d ON d.id = m.id JOIN sessions s ON s.id = d.sess
        WHERE {cond}
        GROUP BY d.sess
        ORDER BY best * (1.0 + 0.05 * min(n, 20)), d.sess
        LIMIT ? OFFSET ?"""
    args += [max(0, limit), max(0, offset)]
    db = index.db
    try:
        found = db.execute(sql, args).fetchall()
        hits = []
        for sess, best, doc, n in found:
            s = db.execute("SELECT machine, session, project, last_activity, title, "
                           "first_prompt, deleted, origin FROM sessions WHERE id=?",
                           (sess,)).fetchone()
            snip = db.execute(
                f"SELECT snippet(text, -1, '{MARK_START}', '{MARK_END}', '\u2026', "
                f"{SNIPPET_TOKENS}) FROM text WHERE text MATCH ? AND rowid = ?",
                (match, doc)).fetchone()
            hits.append(Hit(
                machine=s[0], session=s[1], project=s[2],
                last_activity=None if s[3] is None else float(s[3]),
                title=s[4] or s[5] or "", snippet=pieces(snip[0] if snip else ""),
                deleted=bool(s[6]), score=float(best) * (1.0 + 0.05 * min(n, 20)),
                origin=s[7]))
    except sqlite3.OperationalError as e:
        # What FTS5 says of a query it cannot parse has no code of its own: anything
        # but the database's own trouble is the query's.
        if any(w in str(e) for w in _DATABASE_TROUBLE):
            raise StateError.of("search index", index.path, e) from e
        raise BadQuery(f"search: cannot parse the query {query[:200]!r} "
                       f"(FTS5 syntax: {e})") from None
    return hits

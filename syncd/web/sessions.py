"""The sessions view: every session of every machine, filtered, searched, paged."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from syncd.errors import UsageError
from syncd.web.pages import page
from syncd.web.rows import Loaded, Row, SessionList, row_of
from syncd.web.site import Site, site_of

if TYPE_CHECKING:
    from syncd.format.catalog import Session

PAGE = 100
# A first load of a big store takes a while: the view waits this long for all of it,
# then shows what is read so far (a big store's), waiting up to FIRST_LOAD_WAIT for any.
FIRST_PAGE_WAIT = 1.0
FIRST_LOAD_WAIT = 20.0


def _load(site: Site, names: list[str]) -> Loaded:
    """The rows of machines ``names``, each made in its reading thread."""
    from syncd.restore.listing import here, machine_catalogs
    from syncd.seen import Seen

    repo = site.repository()
    seen = Seen(site.settings.state_dir, repo.url)
    local = here(site.settings.source)

    def rows(machine: str, sessions: list[Session]) -> list[Row]:
        return [row_of(s, local.mark(s)) for s in sessions]

    yield from machine_catalogs(repo, names, rows, seen=seen)
    seen.save()


def _version(site: Site) -> dict[str, object]:
    """Each machine's head etag (the HEADs made concurrently: one after another, 100
    machines 20 ms away are 2 s): a change of one means that machine's rows are read
    again."""
    from syncd.store import layout
    from syncd.worker import each

    repo = site.repository()
    return {m: "" if info is None else info.etag
            for m, info in each(repo.machines(),
                                lambda m: repo.store.head(layout.head_key(m)))}


def session_list(site: Site) -> SessionList:
    def make() -> SessionList:
        rows = SessionList(lambda names: _load(site, names), lambda: _version(site))
        rows.start()
        return rows

    found: SessionList = site.cache("sessions", make)
    return found


def _search(site: Site, query: str, machine: str | None, project: str | None
            ) -> tuple[set[tuple[str, str]], dict[tuple[str, str], Any]]:
    """The (machine, session) pairs the index finds, and their hits (for snippets)."""
    path = site.settings.state_dir / "search.db"
    if not path.exists():  # nothing indexed here (yet)
        return set(), {}
    try:
        index_mod = importlib.import_module("syncd.search.index")
        query_mod = importlib.import_module("syncd.search.query")
    except ImportError:  # not in this version
        return set(), {}
    index = index_mod.SearchIndex.open(path)
    try:
        hits = query_mod.search(index, query, machine=machine, project=project, limit=1000)
    finally:
        index.close()
    found = {(h.machine, h.session): h for h in hits}
    return set(found), found


def _int(value: str | None, default: int) -> int:
    try:
        return max(0, int(value)) if value else default
    except ValueError:
        return default


def sessions(request: Request) -> Response:
    # A plain function: Starlette runs it in its thread pool, where the wait for a
    # first load and the index's query do not hold up the other requests.
    site = site_of(request)
    q = request.query_params
    machine = q.get("machine") or None
    project = q.get("project") or None
    since, until = q.get("since") or None, q.get("until") or None
    text = (q.get("q") or "").strip()
    offset = _int(q.get("offset"), 0)
    rows = session_list(site)
    rows.wanted()
    loading = not rows.wait_first(FIRST_PAGE_WAIT, FIRST_LOAD_WAIT)
    only: set[tuple[str, str]] | None = None
    hits: dict[tuple[str, str], Any] = {}
    bad_query = None
    catalogs: str | None = None
    if text:
        try:
            only, hits = _search(site, text, machine, project)
        except UsageError as e:  # BadQuery: FTS5 could not parse it
            bad_query, only = str(e), set()
        if not hits and bad_query is None:
            # No index (yet): what the heads' catalogs say, titles and projects.
            only, catalogs = None, text
    found = rows.page(machine=machine, project=project, since=since, until=until,
                      only=only, text=catalogs, offset=offset, limit=PAGE,
                      # ranked: the index's order, not the time's
                      rank={key: i for i, key in enumerate(hits)} if hits else None)

    def link(at: int) -> str:
        from urllib.parse import urlencode

        keep = {k: v for k, v in q.items() if k != "offset" and v}
        return "/sessions?" + urlencode({**keep, "offset": str(at)})

    def snippet(r: Row) -> list[tuple[str, bool]]:
        hit = hits.get((r.machine, r.session))
        return list(hit.snippet) if hit is not None else []

    return page(request, "sessions.html", page=found, machines=rows.machines,
                problems=rows.problems, loading=loading, reading=rows.reading,
                bad_query=bad_query,
                filters={"machine": machine or "", "project": project or "",
                         "since": since or "", "until": until or "", "q": text},
                prev_link=link(max(0, offset - PAGE)) if offset else None,
                next_link=link(offset + PAGE) if offset + PAGE < found.total else None,
                snippet=snippet)


routes: list[BaseRoute] = [Route("/sessions", sessions, methods=["GET", "HEAD"])]

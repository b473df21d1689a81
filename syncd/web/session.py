"""One session's pages (rendered transcript, points in time, restore, resume) and the
conflict copies: mounted by the app from ``routes``.

Every state change is a POST (the guard checks its CSRF field); a restore shows its dry
run's plan first and runs only on a second POST, the confirm. The machine and session id
of the address are checked (``SessionDesk.known``) before anything reads a store.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Route

from syncd.errors import LookupFailed, RestoreBusy, SyncdError
from syncd.web.pages import page
from syncd.web.sessionpage import SessionDesk
from syncd.web.site import site_of

if TYPE_CHECKING:
    from syncd.render.transcript import Budget, Transcript
    from syncd.restore.report import RestoreReport
    from syncd.timeline import PointRow

# Points listed on a session's page at most (newest first).
POINTS_SHOWN = 500
# Bytes of the conflict copies that are not transcripts (and of their local files) the
# conflicts page compares in all.
PAGE_DIFF_MAX = 16 << 20
# Characters of transcript text a page (or a part it fetches) renders: a long session's
# first view costs what its first part does, the rest comes on demand.
PART_CHARS = 256 << 10


def desk_of(request: Request) -> SessionDesk:
    site = site_of(request)
    desk: SessionDesk = site.cache("session", lambda: SessionDesk(site.settings,
                                                                   site.repository))
    return desk


class _NotFound(Exception):
    pass


def _named(request: Request) -> tuple[SessionDesk, str, str]:
    desk = desk_of(request)
    machine = request.path_params["machine"]
    sid = request.path_params["sid"]
    if not desk.known(machine, sid):
        raise _NotFound
    return desk, machine, sid


def _seq(value: str | None) -> int | None:
    if value is None or value == "":
        return None
    # ASCII: str.isdigit() takes "²", which int() refuses.
    if not (value.isascii() and value.isdigit()) or len(value) > 18:
        raise _NotFound
    return int(value)


def _at(desk: SessionDesk, machine: str, sid: str, value: str | None
        ) -> PointRow | None:
    seq = _seq(value)
    if seq is None:
        return None
    p = desk.point(machine, sid, seq)
    if p is None:
        raise _NotFound
    return p


def _not_found(request: Request, what: str = "no such machine or session") -> HTMLResponse:
    return page(request, "session_missing.html", status=404, what=what)


def _unreadable(request: Request, e: SyncdError) -> HTMLResponse:
    # The store unreachable, or an object of it damaged (or a hostile machine's): a page
    # that says so, not a 500.
    return page(request, "session_missing.html", status=502, what=str(e),
                heading="Could not be read")


class _Part:
    """Which part of the transcript a request asks for: from a unit on (``from``), every
    unit before one (``upto``: a live reload of what the page shows), or all of it from
    there (``all``)."""

    def __init__(self, request: Request) -> None:
        q = request.query_params
        self.start = _seq(q.get("from")) or 0
        self.stop = _seq(q.get("upto"))
        self.whole = q.get("all") == "1"

    def key(self) -> tuple[object, ...]:
        return ("part", self.start, self.stop, self.whole)


def _more(base: str, point: PointRow | None, total: int) -> Any:
    from urllib.parse import urlencode

    def more(end: int) -> str:
        at = {} if point is None else {"at": point.seq}
        nxt = f"{base}?{urlencode({**at, 'from': end})}"
        rest = f"{base}?{urlencode({**at, 'from': end, 'all': 1})}"
        # Our markup: the address is the checked machine (quoted) and numbers.
        return (f'<p class="more" data-from="{end}">{total - end} more items · '
                f'<a href="{html.escape(nxt)}" class="more-next">show the next part</a> · '
                f'<a href="{html.escape(rest)}" class="more-all">show all the rest</a></p>')

    return more


def _fragment(desk: SessionDesk, machine: str, sid: str, point: PointRow | None,
              part: _Part) -> str:
    from syncd.render.html import html_fragment, units_of
    from syncd.render.transcript import load_transcript

    def load() -> Transcript:
        return load_transcript(desk.settings, sid, machine=machine,
                               at=None if point is None else point.time,
                               repository=lambda: desk.repository(None))

    def render() -> str:
        t = desk.transcript(machine, sid, None if point is None else point.seq, load)
        base = f"/session/{quote(machine, safe='')}/{sid}"
        budget = None if part.whole or part.stop is not None else PART_CHARS
        return html_fragment(t, start=part.start, stop=part.stop, budget=budget,
                             more=_more(base, point, units_of(t)))

    return desk.rendered(machine, sid, None if point is None else point.seq, render,
                         part.key())


def session_view(request: Request) -> Response:
    try:
        desk, machine, sid = _named(request)
        point = _at(desk, machine, sid, request.query_params.get("at"))
        part = _Part(request)
    except _NotFound:
        return _not_found(request)
    points, problems = desk.points(machine, sid)
    try:
        fragment = _fragment(desk, machine, sid, point, part)
        if part.start:  # a part past the first, without the script: in its own article
            fragment = f'<article class="transcript">{fragment}</article>'
    except LookupFailed as e:
        return _not_found(request, str(e))
    except SyncdError as e:
        return _unreadable(request, e)
    live = point is None
    return page(request, "session.html", machine=machine, sid=sid, point=point,
                points=points[:POINTS_SHOWN], more=max(0, len(points) - POINTS_SHOWN),
                problems=problems, fragment=fragment, live=live,
                size=desk.size(machine, sid) if live else None,
                local=desk.is_local(machine), in_tree=desk.local_transcript(sid) is not None)


def fragment_view(request: Request) -> Response:
    try:
        desk, machine, sid = _named(request)
        point = _at(desk, machine, sid, request.query_params.get("at"))
        return HTMLResponse(_fragment(desk, machine, sid, point, _Part(request)))
    except (_NotFound, LookupFailed):
        return Response("not found\n", status_code=404, media_type="text/plain")
    except SyncdError as e:
        return Response(f"{e}\n", status_code=502, media_type="text/plain")


def size_view(request: Request) -> Response:
    try:
        desk, machine, sid = _named(request)
    except _NotFound:
        return JSONResponse({"error": "not found"}, status_code=404)
    return JSONResponse({"size": desk.size(machine, sid)})


def _outcome(report: RestoreReport) -> dict[str, Any]:
    """What the plan and report templates show of a restore."""
    counts: dict[str, int] = {}
    for a in report.actions:
        counts[a.action] = counts.get(a.action, 0) + 1
    return {"report": report, "counts": sorted(counts.items()),
            "waiting": [a.path for a in report.actions if a.action == "wait"]}


async def restore_view(request: Request) -> Response:
    return await _run_in_thread(_restore, request, await _form(request))


def _restore(request: Request, form: dict[str, Any]) -> Response:
    try:
        desk, machine, sid = _named(request)
        at = form.get("at")
        point = _at(desk, machine, sid, at if isinstance(at, str) else None)
    except _NotFound:
        return _not_found(request)
    confirm = form.get("step") == "confirm"
    try:
        report = desk.restore(machine, sid, None if point is None else point.time,
                              dry_run=not confirm)
    except RestoreBusy as e:
        return page(request, "session_restore.html", status=409, machine=machine, sid=sid,
                    point=point, confirm=confirm, error=str(e))
    except SyncdError as e:
        return page(request, "session_restore.html", status=500, machine=machine, sid=sid,
                    point=point, confirm=confirm, error=str(e))
    return page(request, "session_restore.html", machine=machine, sid=sid, point=point,
                confirm=confirm, error=None, **_outcome(report))


async def resume_view(request: Request) -> Response:
    return await _run_in_thread(_resume, request, await _form(request))


def _resume(request: Request, form: dict[str, Any]) -> Response:
    try:
        desk, machine, sid = _named(request)
    except _NotFound:
        return _not_found(request)
    confirm = form.get("step") == "confirm"
    context: dict[str, Any] = {"machine": machine, "sid": sid, "confirm": confirm,
                               "line": None, "error": None, "report": None, "counts": [],
                               "waiting": []}
    report = None
    try:
        if desk.local_transcript(sid) is None or confirm:
            # Not here yet: the plan first, then (confirmed) the restore.
            report = desk.restore(machine, sid, None, dry_run=not confirm)
            context.update(_outcome(report))
            if not confirm:
                return page(request, "session_resume.html", **context)
        context["line"] = desk.resume_line(sid, report)
    except RestoreBusy as e:
        return page(request, "session_resume.html", status=409, **{**context,
                                                                   "error": str(e)})
    except SyncdError as e:
        context["error"] = str(e)
    return page(request, "session_resume.html", **context)


async def _form(request: Request) -> dict[str, Any]:
    """A POST's urlencoded fields (a form of ours is small: read up to ``FORM_MAX``)."""
    from urllib.parse import parse_qsl

    from syncd.web.security import FORM_MAX

    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > FORM_MAX:
            return {}
    return dict(parse_qsl(body.decode("utf-8", "replace")))


async def _run_in_thread(fn: Any, *args: Any) -> Response:
    # A restore reads a store and writes files: off the event loop.
    from starlette.concurrency import run_in_threadpool

    response: Response = await run_in_threadpool(fn, *args)
    return response


def conflicts_view(request: Request) -> Response:
    from syncd.web.conflictcopy import fingerprint, list_copies

    copies = list_copies(site_of(request).settings)
    return _conflicts_page(request, copies, fingerprint(copies), None, None)


def _conflicts_page(request: Request, copies: list[Any], seen: str, done: str | None,
                    error: str | None, status: int = 200) -> Response:
    from syncd.render.transcript import Budget
    from syncd.web.conflictcopy import DIFF_MAX, line_diff, local_path, read_capped

    settings = site_of(request).settings
    rows = []
    # What the page shows of all the copies together is bounded, not what each may hold:
    # the transcripts share one rendering budget, the other files PAGE_DIFF_MAX bytes.
    budget, diff_left = Budget(), PAGE_DIFF_MAX
    for c in copies:
        local = local_path(settings, c)
        row: dict[str, Any] = {"c": c, "local_exists": local.exists(), "diff": None,
                               "left": None, "right": None, "cut": False}
        if c.transcript:
            row["left"] = _render_file(local, budget)
            row["right"] = _render_file(c.path, budget)
        else:
            a, cut_a = read_capped(local, max(0, min(DIFF_MAX, diff_left)))
            b, cut_b = read_capped(c.path, max(0, min(DIFF_MAX, diff_left - len(a))))
            diff_left -= len(a) + len(b)
            row["diff"], row["cut"] = line_diff(a, b), cut_a or cut_b
        rows.append(row)
    return page(request, "conflicts.html", status=status, rows=rows, seen=seen, done=done,
                error=error)


def _render_file(path: Any, budget: Budget) -> str | None:
    """A transcript file rendered as the session page renders one (None: not there),
    within ``budget`` (shared by the page)."""
    from syncd.render.html import html_fragment
    from syncd.render.transcript import lines_of, parse
    from syncd.web.conflictcopy import CHUNK

    try:
        fd = open(path, "rb")  # noqa: SIM115 (read a chunk at a time below)
    except OSError:
        return None
    with fd:
        def chunks() -> Any:
            while chunk := fd.read(CHUNK):
                yield chunk
        return html_fragment(parse(lines_of(chunks()), path.stem, budget=budget))


async def keep_view(request: Request) -> Response:
    return await _run_in_thread(_keep, request, await _form(request))


def _keep(request: Request, form: dict[str, Any]) -> Response:
    from syncd.web.conflictcopy import fingerprint, keep_copy, keep_local, list_copies

    settings = site_of(request).settings
    copies = list_copies(settings)
    seen = fingerprint(copies)
    index, which = form.get("index"), form.get("keep")
    if form.get("seen") != seen or not isinstance(index, str) or not index.isascii() or \
            not index.isdigit() or int(index) >= len(copies) or which not in ("local", "copy"):
        return _conflicts_page(request, copies, seen, None, "the conflict copies changed "
                               "since the page was loaded: nothing done", status=409)
    c = copies[int(index)]
    desk = desk_of(request)
    try:
        # One writer of the tree at a time: the page's restores take this lock too.
        if not desk.restoring.acquire(blocking=False):
            raise RestoreBusy("a restore is running: try again when it is done")
        try:
            if which == "local":
                keep_local(c)
                done = f"kept the local {c.rel}; the copy from {c.machine} is removed"
            else:
                saved = keep_copy(settings, c)
                done = f"{c.rel} is now the copy from {c.machine}" + (
                    f"; the local one was saved as {saved}" if saved else "")
        finally:
            desk.restoring.release()
    except (SyncdError, OSError) as e:
        copies = list_copies(settings)
        return _conflicts_page(request, copies, fingerprint(copies), None, str(e),
                               status=409)
    copies = list_copies(settings)
    return _conflicts_page(request, copies, fingerprint(copies), done, None)


def transcript_css(request: Request) -> Response:
    """The rendered transcripts' stylesheet (as ``show --format html`` inlines it)."""
    from syncd.render.html import stylesheet

    return Response(stylesheet(), media_type="text/css")


routes: list[BaseRoute] = [
    Route("/transcript.css", transcript_css, methods=["GET"]),
    Route("/session/{machine}/{sid}", session_view, methods=["GET"]),
    Route("/session/{machine}/{sid}/fragment", fragment_view, methods=["GET"]),
    Route("/session/{machine}/{sid}/size", size_view, methods=["GET"]),
    Route("/session/{machine}/{sid}/restore", restore_view, methods=["POST"]),
    Route("/session/{machine}/{sid}/resume", resume_view, methods=["POST"]),
    Route("/conflicts", conflicts_view, methods=["GET"]),
    Route("/conflicts/keep", keep_view, methods=["POST"]),
]

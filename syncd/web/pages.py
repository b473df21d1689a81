"""The templates (Jinja2, autoescape on) and ``page()``, which renders one with what
every page needs: the nav, the CSRF token for its forms."""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse

from syncd.web.site import site_of

NAV = (("/", "Dashboard"), ("/sessions", "Sessions"), ("/conflicts", "Conflicts"))


def when(t: float | str | None) -> str:
    """A time for a reader (local time; a store's ISO string shown as given, cut)."""
    if t is None or t == "":
        return "-"
    if isinstance(t, str):
        return t[:19].replace("T", " ")
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def ago(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def size(n: int | float | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1024 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return str(n)


ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("syncd.web", "templates"),
    # Every string a template prints is escaped: titles, paths and transcripts are the
    # store's, and a store is untrusted.
    autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)


def seg(value: str) -> str:
    """One path segment of a link: a store's name never adds a segment of its own."""
    return quote(value, safe="")


ENV.filters.update(when=when, ago=ago, size=size, seg=seg)


def page(request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
    """Template ``name`` rendered for ``request``: ``csrf`` (every POST form's hidden
    field), ``nav`` and ``here`` (the path, for the nav) come with it."""
    site = site_of(request)
    html = ENV.get_template(name).render(
        csrf=site.guard.csrf, nav=NAV, here=request.url.path,
        machine_id=site.settings.machine_id, **context)
    return HTMLResponse(html, status_code=status)

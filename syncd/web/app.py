"""The page's ASGI application: the views' routes, the static assets, behind the guard."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.routing import BaseRoute, Mount
from starlette.staticfiles import StaticFiles

from syncd.config import Settings
from syncd.web import dashboard, session, sessions
from syncd.web.security import Guard, Guarded
from syncd.web.site import Site

if TYPE_CHECKING:
    from syncd.repository import Repository

STATIC = Path(__file__).parent / "static"


def make_app(settings: Settings, *, token: str, host: str,
             repo: Repository | None = None) -> Any:
    """The page for ``settings``, answering only ``host`` (``127.0.0.1:PORT`` as printed,
    or ``localhost``) and only with ``token``; ``repo``: an unlocked repository to use
    (default: opened on first use, without a prompt)."""
    guard = Guard(token, host)
    site = Site(settings, guard, _repo=repo)
    routes: list[BaseRoute] = [
        *dashboard.routes, *sessions.routes, *session.routes,
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    app = Starlette(routes=routes)
    app.state.site = site
    return Guarded(app, guard)

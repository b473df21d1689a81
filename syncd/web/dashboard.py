"""The dashboard: this machine's health as ``syncd status`` has it, the machines it
follows, recent problems, stored bytes per machine over time, and what the store costs."""

from __future__ import annotations

import threading
import time
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from syncd.web.pages import page
from syncd.web.site import Site, site_of

# The store is probed (one HEAD) at most this often, however often the page refreshes.
PROBE_EVERY = 30.0


class _Probe:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.at = 0.0
        self.result: tuple[bool | None, str | None] = (None, None)


def figures(site: Site) -> dict[str, Any]:
    """Everything the dashboard shows, as JSON-able figures."""
    from syncd.errors import StoreError
    from syncd.service.status import check_store, health, status

    s = status(site.settings)
    probe: _Probe = site.cache("probe", _Probe)
    with probe.lock:
        if time.time() - probe.at > PROBE_EVERY:
            try:
                store = site.repository().store
                probe.result = check_store(site.settings, store)
            except StoreError as e:
                probe.result = (False, str(e))
            probe.at = time.time()
        s["store_reachable"], s["store_error"] = probe.result
    now = time.time()
    s["health"] = health(s, now)
    s["now"] = now
    for f in s["following"]:
        f["last_check_ago"] = None if f.get("last_check") is None else now - f["last_check"]
        f["last_import_ago"] = None if f.get("last_import") is None else now - f["last_import"]
    problems = list(s["health"])
    if s.get("last_error"):
        problems.append(f"last error: {s['last_error']}")
    s["problems"] = problems
    return s


async def dashboard(request: Request) -> Response:
    site = site_of(request)
    s = await run_in_threadpool(figures, site)
    return page(request, "dashboard.html", s=s)


async def dashboard_json(request: Request) -> Response:
    s = await run_in_threadpool(figures, site_of(request))
    return JSONResponse(s)


routes: list[BaseRoute] = [
    Route("/", dashboard, methods=["GET", "HEAD"]),
    Route("/api/dashboard", dashboard_json, methods=["GET", "HEAD"]),
]

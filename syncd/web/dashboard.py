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
from syncd.web.plot import MOST_SERIES, Plot, lines
from syncd.web.samples import FILE as SAMPLES_FILE
from syncd.web.samples import OTHERS, Sampler, Samples
from syncd.web.site import Site, site_of

# The store is probed (one HEAD) at most this often, however often the page refreshes.
PROBE_EVERY = 30.0
# A first view waits this long for the first sample of stored bytes (one LIST a machine).
FIRST_SAMPLE_WAIT = 5.0
FRESH = 2.0


class _Probe:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.at = 0.0
        self.result: tuple[bool | None, str | None] = (None, None)


class _Recent:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.at = 0.0
        self.figures: dict[str, Any] | None = None


def figures(site: Site) -> dict[str, Any]:
    """Everything the dashboard shows, as JSON-able figures: computed at most every
    ``FRESH`` seconds, however many pages are open (each scans the tree's stats)."""
    recent: _Recent = site.cache("figures", _Recent)
    with recent.lock:
        if recent.figures is None or time.monotonic() - recent.at > FRESH:
            recent.figures, recent.at = _figures(site), time.monotonic()
        return recent.figures


def _figures(site: Site) -> dict[str, Any]:
    from syncd.errors import SyncdError
    from syncd.service.status import check_store, follow_lag, health, status

    s = status(site.settings)
    probe: _Probe = site.cache("probe", _Probe)
    with probe.lock:
        if time.time() - probe.at > PROBE_EVERY:
            try:
                store = site.repository().store
                probe.result = check_store(site.settings, store)
            except SyncdError as e:  # unreachable, or a key it cannot open
                probe.result = (False, str(e))
            probe.at = time.time()
        s["store_reachable"], s["store_error"] = probe.result
    now = time.time()
    s["health"] = health(s, now)
    s["now"] = now
    for f in s["following"]:
        f["last_check_ago"] = None if f.get("last_check") is None else now - f["last_check"]
        f["last_import_ago"] = None if f.get("last_import") is None else now - f["last_import"]
        f["lag"] = follow_lag(f, now)  # as `syncd status` says it
    problems = list(s["health"])
    if s.get("last_error"):
        problems.append(f"last error: {s['last_error']}")
    s["problems"] = problems
    s["cost"] = _cost(site, _sampler(site).samples.latest())
    return s


def _stored(site: Site) -> dict[str, int]:
    """Each machine's stored bytes: one LIST of every machine's objects (a page per
    1,000), not one per machine: a store's prefixes cost a bucket's writer nothing, and
    would cost this page a request each every sample."""
    from syncd.config import MACHINE_ID
    from syncd.store import layout

    out: dict[str, int] = {}
    for o in site.repository().store.list(layout.MACHINES_PREFIX):
        m = layout.machine_of(o.key)
        if m is not None and MACHINE_ID.fullmatch(m):
            out[m] = out.get(m, 0) + o.size
    return out


def _sampler(site: Site) -> Sampler:
    def make() -> Sampler:
        site.settings.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        return Sampler(Samples(site.settings.state_dir / SAMPLES_FILE), lambda: _stored(site))

    found: Sampler = site.cache("samples", make)
    return found


def _cost(site: Site, stored: dict[str, int]) -> dict[str, Any]:
    """A month at S3 prices: the requests the daemon counted (and this process's not yet
    added), and the bytes stored at the last sample."""
    from syncd.backup.state import State
    from syncd.service.billing import counted, monthly
    from syncd.store.requests import KINDS, REQUESTS

    counts: dict[str, Any] = {"since": None, **dict.fromkeys(KINDS, 0)}
    if site.settings.state_file.exists():
        state = State(site.settings.state_file, readonly=True)
        try:
            counts = counted(state)
        finally:
            state.close()
    unrecorded = REQUESTS.snapshot()
    for k in KINDS:
        counts[k] += unrecorded[k]
    if counts["since"] is None:
        counts["since"] = site.started
    return monthly(counts, sum(stored.values()))


def plot_of(site: Site) -> Plot:
    sampler = _sampler(site)
    sampler.first.wait(FIRST_SAMPLE_WAIT)
    return lines(sampler.samples.series(most=MOST_SERIES), rest=OTHERS)


async def dashboard(request: Request) -> Response:
    site = site_of(request)
    plot = await run_in_threadpool(plot_of, site)
    s = await run_in_threadpool(figures, site)
    return page(request, "dashboard.html", s=s, plot=plot)


async def dashboard_json(request: Request) -> Response:
    s = await run_in_threadpool(figures, site_of(request))
    return JSONResponse(s)


routes: list[BaseRoute] = [
    Route("/", dashboard, methods=["GET", "HEAD"]),
    Route("/api/dashboard", dashboard_json, methods=["GET", "HEAD"]),
]

"""The page's figures: /sessions at 1,000 and 100,000 sessions (server time to first byte
and whole body over http.client; time to first byte and full load in chromium), and the
daemon's idle RSS and CPU with ``web = true`` against without.

    PYTHONPATH=. .venv/bin/python bench/web.py [--runs N] [--idle-seconds S] [--skip-rss]

The sessions are a memory stand-in put in the page's cache (the view keeps its rows in
memory after the first load: what is timed is every view after it; bench/web100k.py
times the first load from real heads). Runs of the two sizes
are interleaved; medians with (min-max). Prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import http.client
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from syncd.config import load_settings  # noqa: E402
from syncd.web.rows import Row, SessionList  # noqa: E402
from syncd.web.server import WebServer, bind, token_of  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def stand_in(n: int) -> SessionList:
    t0 = time.time()
    rows = [Row(str(uuid.UUID(int=i)), f"machine-{i % 20:02d}", f"/home/u/src/project-{i % 500}",
                f"session {i}: fix the parser's handling of nested quotes", time.strftime(
                    "%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(t0 - i * 60)), 40_000 + i, "no",
                False) for i in range(n)]
    sl = SessionList(lambda names: iter(()), dict, rows=rows, loaded_at=time.time(),
                     machines=sorted({r.machine for r in rows}))
    sl._ready.set()
    return sl


def serve(tmp: Path, n: int) -> WebServer:
    d = tmp / str(n)
    (d / "store").mkdir(parents=True)
    s = load_settings(Path(os.devnull), source=d / "src", state_dir=d / "state",
                      store=(d / "store").as_uri(), machine_id="bench")
    srv = WebServer(s, bind(0))
    srv.server.config.app.app.state.site.caches["sessions"] = stand_in(n)
    srv.start()
    return srv


def fetch(srv: WebServer, path: str) -> tuple[float, float, int]:
    """(seconds to the first byte, seconds to the whole body, body bytes)."""
    host = srv.bound.host
    port = host.rpartition(":")[2]
    c = http.client.HTTPConnection("127.0.0.1", int(port), timeout=60)
    t = time.perf_counter()
    c.request("GET", path, headers={"Host": host,
                                    "Cookie": f"syncd_token_{port}={token_of(srv.bound)}"})
    r = c.getresponse()
    first = time.perf_counter() - t
    body = r.read()
    whole = time.perf_counter() - t
    c.close()
    assert r.status == 200, r.status
    return first, whole, len(body)


def med(xs: list[float], scale: float = 1000.0) -> str:
    return (f"{statistics.median(xs) * scale:.1f} ({min(xs) * scale:.1f}-"
            f"{max(xs) * scale:.1f})")


def sessions_bench(runs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        servers = {n: serve(Path(tmp), n) for n in (1000, 100_000)}
        views = {"newest page": "/sessions", "page 50": "/sessions?offset=5000",
                 "project filter": "/sessions?project=project-42",
                 "search, all match": "/sessions?q=nested",
                 "search, 2 % match": "/sessions?q=project-42"}
        got: dict[tuple[int, str], list[tuple[float, float, int]]] = {}
        for _ in range(runs):
            for n, srv in servers.items():
                for name, path in views.items():
                    if n == 1000 and name == "page 50":
                        continue
                    got.setdefault((n, name), []).append(fetch(srv, path))
        print("\n/sessions over http.client (server in-process; ms, median (min-max)):")
        print(f"{'sessions':>9}  {'view':<24} {'first byte':>22} {'whole body':>22}  KB")
        for (n, name), xs in got.items():
            print(f"{n:>9}  {name:<24} {med([x[0] for x in xs]):>22} "
                  f"{med([x[1] for x in xs]):>22}  {xs[0][2] // 1024}")
        browser_bench(servers, runs)
        for srv in servers.values():
            srv.stop()


def browser_bench(servers: dict[int, WebServer], runs: int) -> None:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("(no Playwright: browser figures skipped)")
        return
    if not os.access(CHROMIUM, os.X_OK):
        print(f"(no {CHROMIUM}: browser figures skipped)")
        return
    timing: dict[int, list[tuple[float, float]]] = {}
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        pages: dict[int, Any] = {}
        for n, srv in servers.items():
            p = b.new_context().new_page()
            p.goto(srv.bound.url)  # the token becomes a cookie
            pages[n] = p
        for _ in range(runs):
            for n, srv in servers.items():
                p = pages[n]
                p.goto(f"http://{srv.bound.host}/sessions", wait_until="load")
                nav = p.evaluate("() => { const e = performance.getEntriesByType("
                                 "'navigation')[0]; return [e.responseStart - e.requestStart,"
                                 " e.loadEventEnd - e.startTime]; }")
                timing.setdefault(n, []).append((nav[0] / 1000, nav[1] / 1000))
        b.close()
    print("\n/sessions in chromium (Navigation Timing; ms, median (min-max)):")
    print(f"{'sessions':>9}  {'first byte':>22} {'full load':>22}")
    for n, xs in timing.items():
        print(f"{n:>9}  {med([x[0] for x in xs]):>22} {med([x[1] for x in xs]):>22}")


def _proc(pid: int) -> tuple[int, float]:
    """(VmRSS kB, CPU seconds) of a process."""
    rss = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    tick = os.sysconf("SC_CLK_TCK")
    return rss, (int(fields[11]) + int(fields[12])) / tick


def _flushed(state_dir: Path) -> bool:
    from syncd.backup.state import State

    for f in state_dir.glob("bench@*.sqlite"):
        st = State(f, readonly=True)
        try:
            return bool(st.meta("last_flush_time"))
        finally:
            st.close()
    return False


def daemon_idle(tmp: Path, web: bool, idle: float) -> tuple[int, float, int | None]:
    """(idle RSS kB, idle CPU %, RSS kB after one dashboard view) of ``syncd run``."""
    d = Path(tempfile.mkdtemp(dir=tmp))
    src = d / "src" / "projects" / "-p"
    src.mkdir(parents=True)
    (src / f"{uuid.uuid4()}.jsonl").write_bytes(b'{"type":"user","message":"hi"}\n' * 100)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SYNCD_", "AWS_"))}
    env.update({"HOME": str(d / "home"), "SYNCD_SOURCE": str(d / "src"),
                "SYNCD_STATE_DIR": str(d / "state"), "SYNCD_MACHINE_ID": "bench",
                "SYNCD_STORE": (d / "store").as_uri(), "SYNCD_CONFIG": os.devnull,
                "SYNCD_WEB": "true" if web else "false", "SYNCD_WEB_PORT": "0",
                "SYNCD_CATCHUP_CHILD": "false", "PYTHONPATH": str(ROOT)})
    p = subprocess.Popen([sys.executable, "-m", "syncd", "run"], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        state = d / "state"
        while time.monotonic() < deadline:  # up: its first flush is durable
            if _flushed(state) and (not web or (state / "web-url").exists()):
                break
            time.sleep(0.5)
        time.sleep(5)  # start-up's garbage settles
        _, cpu0 = _proc(p.pid)
        time.sleep(idle)
        rss, cpu1 = _proc(p.pid)
        after = None
        if web:
            url = (state / "web-url").read_text().strip()
            host = url.split("/")[2]
            token = url.rpartition("token=")[2]
            port = host.rpartition(":")[2]
            for path in ("/", "/sessions"):
                c = http.client.HTTPConnection("127.0.0.1", int(port), timeout=60)
                c.request("GET", path, headers={"Host": host,
                                                "Cookie": f"syncd_token_{port}={token}"})
                c.getresponse().read()
                c.close()
            time.sleep(5)
            after = _proc(p.pid)[0]
        return rss, (cpu1 - cpu0) / idle * 100, after
    finally:
        p.terminate()
        p.wait(30)


def rss_bench(runs: int, idle: float) -> None:
    got: dict[bool, list[tuple[int, float, int | None]]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(runs):
            for web in (False, True):
                got[web].append(daemon_idle(Path(tmp), web, idle))
    print(f"\nsyncd run, idle {idle:.0f} s (median (min-max) of {runs}):")
    for web, xs in got.items():
        rss = [x[0] / 1024 for x in xs]
        cpu = [x[1] for x in xs]
        line = (f"  web = {str(web).lower():<5}  RSS {med(rss, 1):>20} MB  CPU "
                f"{med(cpu, 1)} %")
        if web:
            seen = [x[2] / 1024 for x in xs if x[2]]
            line += f"  RSS after a dashboard and a sessions view {med(seen, 1)} MB"
        print(line)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--idle-seconds", type=float, default=30.0)
    ap.add_argument("--rss-runs", type=int, default=3)
    ap.add_argument("--skip-rss", action="store_true")
    a = ap.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f} (2 CPUs shared)")
    sessions_bench(a.runs)
    if not a.skip_rss:
        rss_bench(a.rss_runs, a.idle_seconds)
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

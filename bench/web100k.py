"""The sessions view's first load from real heads: a ``file://`` store of M machines x S
sessions (default 100 x 1,000), each machine a head (format/head.py) and machine.json
written straight into the store's tree; then, in a fresh process per run, a new page
server on it: the first ``/sessions`` view (wall and the process's CPU), the reload after
one head changed (wall and CPU), and the server process's peak RSS; against ``syncd
sessions --json`` on the same store (wall, CPU, peak RSS). Runs interleaved; medians
with (min-max). Prints figures, asserts nothing.

    PYTHONPATH=. .venv/bin/python bench/web100k.py [--machines 100] [--sessions 1000]
        [--runs 5] [--latency-ms MS] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import resource
import shutil
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

from syncd.format import head as headfmt  # noqa: E402
from syncd.store import layout  # noqa: E402

PROMPTS = ("Fix the flaky retry test", "Add pagination to the list endpoint",
           "Why does the build fail on CI", "Rename the config loader", "Speed up the import",
           "Write a migration for the users table", "Review this diff")


def machine_name(i: int) -> str:
    return f"u{i:04d}.host{i:04d}-{hashlib.sha256(str(i).encode()).hexdigest()[:8]}"


def head_of(i: int, sessions: int, t0: float, bump: int = 0) -> headfmt.Head:
    """Machine ``i``'s head: ``sessions`` sessions in 20 projects, one a minute back from
    ``t0``, titled as Claude names them; ``bump``: a later head (one session grown)."""
    name, home = machine_name(i), f"/home/u{i:04d}"
    out = []
    for k in range(sessions):
        sid = str(uuid.UUID(int=(i << 32) | k, version=4))
        cwd = f"{home}/src/project-{k % 20}"
        t = t0 - (k * 100 + i) * 60
        fields = {"cwd": cwd, "first_prompt": PROMPTS[k % len(PROMPTS)],
                  "last_prompt": f"{PROMPTS[(k + i) % len(PROMPTS)]} in module {k}",
                  "ai_title": f"Session {k} of machine {i}: {PROMPTS[(k * 3) % 7].lower()}",
                  "last_activity": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(t)),
                  "git_branch": "main"}
        folder = cwd.replace("/", "-")
        out.append(headfmt.HeadSession(f"projects/{folder}/{sid}.jsonl".encode(), 1,
                                       40_000 + k + (bump if k == 0 else 0), None, fields))
    return headfmt.Head(name, t0, 10 + bump, t0, {"hostname": f"host{i:04d}", "os": "linux",
                                                  "home": home}, {"seg": (11, 1 << 20)}, out)


def build(where: Path, machines: int, sessions: int) -> Path:
    store = where / f"store-{machines}x{sessions}"
    if (store / "built").exists():
        return store
    shutil.rmtree(store, ignore_errors=True)
    store.mkdir(parents=True)
    t0 = 1.79e9
    for i in range(machines):
        name = machine_name(i)
        (store / layout.machine_prefix(name)).mkdir(mode=0o700, parents=True)
        (store / layout.head_key(name)).write_bytes(headfmt.encode(head_of(i, sessions, t0)))
        info = {"machine": name, "hostname": f"host{i:04d}", "os": "linux",
                "home": f"/home/u{i:04d}"}
        (store / layout.machine_key(name)).write_bytes(json.dumps(info).encode())
    (store / "built").write_text("")
    return store


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _hwm() -> int:
    """Peak RSS of this process, kB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def _rss() -> int:
    """RSS of this process now, kB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _get(host: str, token: str, path: str) -> bytes:
    port = host.rpartition(":")[2]
    c = http.client.HTTPConnection("127.0.0.1", int(port), timeout=600)
    c.request("GET", path, headers={"Host": host, "Cookie": f"syncd_token_{port}={token}"})
    r = c.getresponse()
    body = r.read()
    c.close()
    assert r.status == 200, r.status
    return body


def child(store: Path, machines: int, sessions: int, latency: float) -> None:
    """One server's life, in this process: the first view, a head changed, the reload;
    each store request delayed by ``latency`` s (tests/counting.py), as a remote one."""
    from syncd.config import load_settings
    from syncd.repository import Repository
    from syncd.store import open_store
    from syncd.web.server import WebServer, bind, token_of
    from syncd.web.sessions import session_list
    from tests.counting import CountingStore

    tmp = Path(tempfile.mkdtemp(prefix="web100k-"))
    try:
        s = load_settings(Path(os.devnull), source=tmp / "src", state_dir=tmp / "state",
                          store=store.as_uri(), machine_id="bench.reader-00000000")
        srv = WebServer(s, bind(0))
        site = srv.server.config.app.app.state.site
        if latency:
            site._repo = Repository(CountingStore(open_store(s.store), latency=latency),
                                    s.machine_id)
        srv.start()
        host, token = srv.bound.host, token_of(srv.bound)
        rss0 = _hwm()
        c0, w0 = _cpu(), time.perf_counter()
        body = _get(host, token, "/sessions")
        first = (time.perf_counter() - w0, _cpu() - c0)
        assert b"data-session=" in body, body[:400]
        partial = b'id="loading"' in body
        sl = session_list(site)
        assert sl.wait(600)
        whole = (time.perf_counter() - w0, _cpu() - c0)
        assert sl.page().total == machines * sessions, sl.page().total
        # One machine flushed: its head changes, the rows are read again.
        one = store / layout.head_key(machine_name(0))
        was = one.read_bytes()
        try:
            one.write_bytes(headfmt.encode(head_of(0, sessions, 1.79e9, bump=1)))
            c0, w0 = _cpu(), time.perf_counter()
            assert sl.refresh()
            _get(host, token, "/sessions")
            reload = (time.perf_counter() - w0, _cpu() - c0)
        finally:
            one.write_bytes(was)
        c0, w0 = _cpu(), time.perf_counter()
        _get(host, token, "/sessions?offset=5000")
        after = (time.perf_counter() - w0, _cpu() - c0)
        rss = _rss()
        srv.stop()
        print(json.dumps({"first": first, "whole": whole, "partial": partial,
                          "reload": reload, "after": after, "rss_start": rss0,
                          "peak_rss": _hwm(), "rss": rss}))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_child(store: Path, machines: int, sessions: int, latency: float
              ) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--child", str(store), "--machines",
                          str(machines), "--sessions", str(sessions), "--latency-ms",
                          str(latency * 1000)],
                         capture_output=True, text=True, check=False, env=_env())
    if out.returncode:
        raise SystemExit(f"child failed: {out.stderr[-2000:]}")
    doc: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return doc


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SYNCD_", "AWS_"))}
    env["PYTHONPATH"] = str(ROOT)
    return env


def run_sessions(store: Path) -> tuple[float, float, int, int]:
    """``syncd sessions --json``: (wall s, CPU s, peak RSS kB, rows)."""
    with tempfile.TemporaryDirectory(prefix="web100k-cli-") as tmp:
        env = _env()
        env.update({"HOME": tmp, "SYNCD_CONFIG": os.devnull, "SYNCD_STORE": store.as_uri(),
                    "SYNCD_SOURCE": f"{tmp}/.claude", "SYNCD_STATE_DIR": f"{tmp}/state",
                    "SYNCD_MACHINE_ID": "bench.reader-00000000"})
        w0 = time.perf_counter()
        with subprocess.Popen([sys.executable, "-m", "syncd", "sessions", "--json"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) as p:
            assert p.stdout is not None
            data = p.stdout.read()
            _, status, ru = os.wait4(p.pid, 0)
            p.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - w0
        if p.returncode:
            raise SystemExit(f"syncd sessions: exit {p.returncode}")
        return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss, len(json.loads(data))


def med(xs: list[float], scale: float = 1.0, digits: int = 2) -> str:
    return (f"{statistics.median(xs) * scale:.{digits}f} ({min(xs) * scale:.{digits}f}-"
            f"{max(xs) * scale:.{digits}f})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--machines", type=int, default=100)
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--workdir", type=Path,
                    default=Path.home() / ".cache" / "syncd-bench" / "web100k")
    ap.add_argument("--latency-ms", type=float, default=0.0,
                    help="the server's store requests each delayed this long")
    ap.add_argument("--json", action="store_true", help="also the runs' raw figures, one line")
    ap.add_argument("--child", type=Path, default=None)
    a = ap.parse_args()
    if a.child is not None:
        child(a.child, a.machines, a.sessions, a.latency_ms / 1000)
        return
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    store = build(a.workdir, a.machines, a.sessions)
    print(f"store: {a.machines} machines x {a.sessions} sessions, heads only "
          f"({sum(f.stat().st_size for f in store.rglob('*') if f.is_file()) / 1e6:.1f} MB; "
          f"ready in {time.perf_counter() - t0:.1f} s)")
    web: list[dict[str, Any]] = []
    cli: list[tuple[float, float, int, int]] = []
    for _ in range(a.runs):
        web.append(run_child(store, a.machines, a.sessions, a.latency_ms / 1000))
        cli.append(run_sessions(store))
    print(f"median (min-max) of {a.runs} runs, interleaved; s and MB")
    print(f"  first view partial (a first page before every head is read): "
          f"{sum(r.get('partial', False) for r in web)} of {len(web)}")
    for what in [w for w in ("first", "whole", "reload", "after") if w in web[0]]:
        label = {"first": "first /sessions view, new server",
                 "whole": "every head read (from the request)",
                 "reload": "a head changed: reload + view",
                 "after": "a view after (page 50)"}[what]
        print(f"  {label:<36} wall {med([r[what][0] for r in web])}  CPU "
              f"{med([r[what][1] for r in web])}")
    print(f"  {'server peak RSS (at start; at end)':<36} "
          f"{med([r['peak_rss'] / 1024 for r in web], 1, 1)} "
          f"({med([r['rss_start'] / 1024 for r in web], 1, 1)}; "
          f"{med([r['rss'] / 1024 for r in web], 1, 1)})")
    print(f"  {'syncd sessions --json':<36} wall {med([c[0] for c in cli])}  CPU "
          f"{med([c[1] for c in cli])}  peak RSS {med([c[2] / 1024 for c in cli], 1, 1)}"
          f"  rows {cli[0][3]}")
    if a.json:
        print(json.dumps({"web": web, "cli": cli}))
    print(f"load average: {load0:.2f} at start, {os.getloadavg()[0]:.2f} at end (2 CPUs shared)")


if __name__ == "__main__":
    main()

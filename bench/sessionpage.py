#!/usr/bin/env python3
"""The session page's figures: what one view costs the server, in process (no browser).

Prints figures; asserts nothing. See bench/README.md ("Session page").

    .venv/bin/python bench/sessionpage.py            # a 10 MB session in 200 flushes
    .venv/bin/python bench/sessionpage.py --quick    # 1 MB in 20 flushes

A machine "laptop" backs up one session in many flushes (and other sessions between
them) to a file:// store; this machine views it through ``make_app`` (requests sent
straight into the ASGI app, the guard included). The views run interleaved, CPU time
(user+sys of this process, the server's threads included) and wall time per request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from syncd.backup.engine import sync_once  # noqa: E402
from syncd.claude import project_folder  # noqa: E402
from syncd.config import Settings, load_settings  # noqa: E402
from syncd.repository import Repository  # noqa: E402
from syncd.store import LocalStore  # noqa: E402
from syncd.web.app import make_app  # noqa: E402
from syncd.web.security import Guard  # noqa: E402

SID = "0a0eb7b7-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
HOST = "127.0.0.1:8123"
TOKEN = "t" * 43
# Where the first part of the page ends, about (the parts the page fetches from there).
NEXT = 128


def settings_of(tmp: Path, name: str, home: Path) -> Settings:
    return load_settings(config_file=tmp / "none.toml", source=home / ".claude",
                         store=(tmp / "store").as_uri(), state_dir=tmp / name / "state",
                         machine_id=name, follow_quiet=0)


def entry(sid: str, cwd: str, i: int, size: int) -> bytes:
    kind = "user" if i % 2 == 0 else "assistant"
    text = (f"line {i}: " + "lorem ipsum dolor sit amet, **consectetur** `adipiscing` "
            * (size // 60))[:size]
    content: Any = text if kind == "user" else [{"type": "text", "text": text}]
    doc = {"type": kind, "sessionId": sid, "cwd": cwd, "uuid": f"{sid[:8]}-{i}",
           "timestamp": f"2026-12-01T10:{i // 60 % 60:02d}:{i % 60:02d}.000Z",
           "message": {"role": kind, "content": content}}
    return json.dumps(doc, separators=(",", ":")).encode() + b"\n"


def build(tmp: Path, total: int, flushes: int) -> tuple[Settings, Settings]:
    home = tmp / "lhome"
    os.environ["HOME"] = str(home)
    laptop = settings_of(tmp, "laptop", home)
    cwd = str(home / "app")
    folder = laptop.source / "projects" / project_folder(cwd)
    folder.mkdir(parents=True)
    per = total // flushes
    n = 0
    for f in range(flushes):
        with open(folder / f"{SID}.jsonl", "ab") as out:
            written = 0
            while written < per:
                line = entry(SID, cwd, n, 2000)
                out.write(line)
                written += len(line)
                n += 1
        if f % 4 == 3:  # another session's flush between them
            other = f"{f:08x}-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
            (folder / f"{other}.jsonl").write_bytes(entry(other, cwd, 0, 500))
        sync_once(laptop)
    here = tmp / "home"
    os.environ["HOME"] = str(here)
    desk = settings_of(tmp, "desk", here)
    # This machine's own copy of a session as big, for the local view.
    mine = desk.source / "projects" / project_folder(str(here / "app"))
    mine.mkdir(parents=True)
    (mine / f"{SID}.jsonl").write_bytes((folder / f"{SID}.jsonl").read_bytes())
    return laptop, desk


class Client:
    def __init__(self, s: Settings) -> None:
        store = LocalStore(Path(s.store.removeprefix("file://")))
        self.app = make_app(s, token=TOKEN, host=HOST, repo=Repository(store, s.machine_id))
        self.guard = Guard(TOKEN, HOST)

    def __call__(self, method: str, path: str, form: dict[str, str] | None = None
                 ) -> tuple[int, int]:
        headers = [(b"host", HOST.encode()),
                   (b"cookie", f"{self.guard.cookie}={TOKEN}".encode())]
        body = b""
        if form is not None:
            body = urlencode({"csrf": self.guard.csrf, **form}).encode()
            headers.append((b"content-type", b"application/x-www-form-urlencoded"))
        path, _, query = path.partition("?")
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
                 "query_string": query.encode(), "headers": headers,
                 "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8123),
                 "root_path": ""}
        incoming = [{"type": "http.request", "body": body, "more_body": False}]
        status: list[int] = []
        size = [0]

        async def receive() -> dict[str, Any]:
            return incoming.pop(0) if incoming else {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            elif message["type"] == "http.response.body":
                size[0] += len(message.get("body", b""))

        asyncio.run(self.app(scope, receive, send))
        return status[0], size[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int, default=7)
    a = ap.parse_args()
    total, flushes = (1 << 20, 20) if a.quick else (10 << 20, 200)
    with tempfile.TemporaryDirectory(prefix="syncd-bench-sessionpage-") as d:
        tmp = Path(d)
        t0 = time.perf_counter()
        _, desk = build(tmp, total, flushes)
        print(f"note: built a {total >> 20} MiB session in {flushes} flushes "
              f"({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
        warm = Client(desk)
        status, _ = warm("GET", f"/session/laptop/{SID}")
        assert status == 200

        points = warm.app.app.state.site.caches["session"].points("laptop", SID)[0]
        middle = points[len(points) // 2].seq
        views: dict[str, Any] = {
            "other machine, now (a new server: timeline read)":
                lambda: Client(desk)("GET", f"/session/laptop/{SID}"),
            "other machine, now (timeline cached)":
                lambda: warm("GET", f"/session/laptop/{SID}"),
            "other machine, now, the next part (a new server)":
                lambda: Client(desk)("GET", f"/session/laptop/{SID}/fragment?from={NEXT}"),
            "other machine, now, all the rest (a new server)":
                lambda: Client(desk)("GET",
                                     f"/session/laptop/{SID}/fragment?from={NEXT}&all=1"),
            "other machine, a point halfway (first view)":
                lambda: Client(desk)("GET", f"/session/laptop/{SID}?at={middle}"),
            "other machine, a point halfway (seen before)":
                lambda: warm("GET", f"/session/laptop/{SID}?at={middle}"),
            "this machine's tree, now":
                lambda: warm("GET", f"/session/desk/{SID}"),
            "size, this machine (the live poll)":
                lambda: warm("GET", f"/session/desk/{SID}/size"),
            "size, other machine (the live poll)":
                lambda: warm("GET", f"/session/laptop/{SID}/size"),
            "restore plan (dry run)":
                lambda: warm("POST", f"/session/laptop/{SID}/restore",
                             {"step": "plan", "at": ""}),
        }
        cpu: dict[str, list[float]] = {k: [] for k in views}
        wall: dict[str, list[float]] = {k: [] for k in views}
        sizes: dict[str, int] = {}
        load0 = os.getloadavg()[0]
        for _ in range(a.runs):
            for name, view in views.items():  # interleaved
                c0, w0 = time.process_time(), time.perf_counter()
                status, n = view()
                cpu[name].append(time.process_time() - c0)
                wall[name].append(time.perf_counter() - w0)
                assert status == 200, (name, status)
                sizes[name] = n
        print(f"{'view':<52} {'CPU s median (min-max)':<24} {'wall s median':<14} page")
        for name in views:
            c = cpu[name]
            print(f"{name:<52} {statistics.median(c):.4f} ({min(c):.4f}-{max(c):.4f})  "
                  f"{statistics.median(wall[name]):<14.4f} {sizes[name] >> 10} KiB")
        print(f"note: {len(points)} points of the session, {a.runs} runs each, interleaved; "
              f"load average (1 min) {load0:.2f} at start, {os.getloadavg()[0]:.2f} at end")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Restore figures for syncd (issue 3), with restic's restore side by side.

Prints figures; asserts nothing. See bench/README.md for what each figure means.

    .venv/bin/python bench/restore.py                # full run: 1 GB tree, ~5 min
    .venv/bin/python bench/restore.py --quick        # smoke run, about a minute
    .venv/bin/python bench/restore.py --skip-peers   # syncd only
    .venv/bin/python bench/restore.py --remap F.jsonl…  # Remapper.lines alone, on F
    .venv/bin/python bench/restore.py --remap        # … on the generated tree's transcripts
    .venv/bin/python bench/restore.py --remap --against ../old  # … and old's remapper too

Progress goes to stderr, the final table to stdout. Everything (tree, SeaweedFS,
restic repo, restore targets) lives in one temporary directory, removed at the end.
Tree generation, SeaweedFS and process measurement come from bench/core.py.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import importlib.util
import json
import os
import random
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))

from core import (  # core also puts the repo on sys.path, for syncd and tests
    MB,
    PROJECT_NAMES,
    SAMPLES,
    BenchBase,
    Run,
    bench_parser,
    bucket_stats,
    build_main_tree,
    fmt_mb,
    load_samples,
    log,
    render_table,
    run_bench,
    run_measured,
    sanitize,
    stop_process,
    synthetic_corpus,
    wait_ready,
)

from syncd.format.segment import TAIL_READ, TRAILER
from syncd.format.snapshot import Entry
from syncd.repository import Repository
from syncd.store import layout, open_store
from syncd.view import Backup, load_backup

MACHINE = "bench-main"
SYNCD_PREFIX = "bench"
TARGET_RATE = 50.0        # MB/s, full restore
TARGET_ONE = 2.0          # downloaded / session compressed size
TARGET_VS_RESTIC = 1.5    # full restore, syncd MB/s over restic's
MAP_OLD, MAP_NEW = "/home/dev", "/home/elsewhere"  # the remapped restore's --map


def fmt_rss(n: int) -> str:
    return fmt_mb(n) if n >= 0 else "n/a (no GNU time)"


def fmt_kb(n: float) -> str:
    return f"{n / 1000:.1f} kB" if n < MB else fmt_mb(n)


# ---------------------------------------------------------------------------
# A counting HTTP proxy in front of SeaweedFS
# ---------------------------------------------------------------------------

# Not forwarded either way: they describe one connection, not the request.
HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
       "upgrade", "expect", "proxy-authorization", "proxy-authenticate", "content-length"}


@dataclass
class Req:
    method: str
    bucket: str
    key: str       # "" for bucket-level requests (LIST)
    query: str
    range: str     # the Range header, "" if none
    status: int
    body: int      # response body bytes sent to the client


class _Handler(BaseHTTPRequestHandler):
    """Forwards each request as it came (Host header included, so SigV4 stays valid)."""

    protocol_version = "HTTP/1.1"
    proxy: CountingProxy
    up: http.client.HTTPConnection | None = None

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self._forward()

    do_HEAD = do_PUT = do_POST = do_DELETE = do_GET

    def finish(self) -> None:
        with contextlib.suppress(Exception):
            super().finish()
        if self.up is not None:
            self.up.close()

    def _request_body(self) -> bytes | None:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else None

    def _upstream(self, headers: list[tuple[str, str]],
                  body: bytes | None) -> http.client.HTTPResponse:
        for attempt in (0, 1):
            try:
                if self.up is None:
                    self.up = http.client.HTTPConnection(self.proxy.host, self.proxy.port,
                                                         timeout=300)
                self.up.putrequest(self.command, self.path, skip_host=True,
                                   skip_accept_encoding=True)
                for k, v in headers:
                    self.up.putheader(k, v)
                self.up.endheaders(body)
                return self.up.getresponse()
            except (OSError, http.client.HTTPException):
                # A kept-alive upstream connection the server had closed: once more.
                if self.up is not None:
                    self.up.close()
                self.up = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def _forward(self) -> None:
        body = self._request_body()
        headers = [(k, v) for k, v in self.headers.items() if k.lower() not in HOP]
        if body is not None or self.command in ("PUT", "POST"):
            headers.append(("Content-Length", str(len(body or b""))))
        try:
            resp = self._upstream(headers, body)
        except (OSError, http.client.HTTPException) as e:
            self.send_error(502, f"upstream: {e}")
            return
        self.send_response_only(resp.status, resp.reason)
        for k, v in resp.getheaders():
            if k.lower() not in HOP:
                self.send_header(k, v)
        length = resp.getheader("Content-Length")
        sent = 0
        if self.command == "HEAD" or resp.status in (204, 304):
            if length is not None:
                self.send_header("Content-Length", length)
            self.end_headers()
            resp.read()
        elif length is not None:
            self.send_header("Content-Length", length)
            self.end_headers()
            while chunk := resp.read(1 << 20):
                self.wfile.write(chunk)
                sent += len(chunk)
        else:
            data = resp.read()
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            sent = len(data)
        if resp.will_close and self.up is not None:
            self.up.close()
            self.up = None
        u = urlsplit(self.path)
        bucket, _, key = unquote(u.path).lstrip("/").partition("/")
        self.proxy.record(Req(self.command, bucket, key, u.query,
                              self.headers.get("Range", ""), resp.status, sent))


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128


class CountingProxy:
    """A threaded HTTP proxy on 127.0.0.1 in front of one upstream: every request with
    the response body bytes it returned."""

    def __init__(self, upstream: str) -> None:
        u = urlsplit(upstream)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self._lock = threading.Lock()
        self._log: list[Req] = []
        handler = type("Handler", (_Handler,), {"proxy": self})
        self.server = _Server(("127.0.0.1", 0), handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="proxy",
                                        daemon=True)
        self._thread.start()

    def record(self, r: Req) -> None:
        with self._lock:
            self._log.append(r)

    def take(self) -> list[Req]:
        """The requests since the last call."""
        with self._lock:
            out, self._log = self._log, []
        return out

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def is_list(r: Req) -> bool:
    return r.method == "GET" and (not r.key or "list-type" in parse_qs(r.query))


# ---------------------------------------------------------------------------
# Results: one table, core.py's style, columns syncd and restic
# ---------------------------------------------------------------------------

@dataclass
class Results:
    rows: list[tuple[str, str, str, str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, what: str, syncd: str = "", restic: str = "", target: str = "",
            met: bool | None = None) -> None:
        self.rows.append((what, syncd, restic, target,
                          "" if met is None else ("yes" if met else "NO")))

    def table(self) -> str:
        return render_table(("figure", "syncd", "restic", "target", "met"), self.rows,
                            self.notes)


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------

@dataclass
class Pick:
    label: str
    sid: str
    rel: str                       # projects/<folder>/<sid>.jsonl
    files: list[Entry]          # the transcript and everything under <sid>/
    raw: int
    stored: int                    # sum of clen of their extents

    @property
    def segments(self) -> int:
        return len({k for f in self.files for k, _ in f.extents})


def tree_files(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def _same_bytes(x: Path, y: Path) -> bool:
    with open(x, "rb") as fx, open(y, "rb") as fy:
        while True:
            cx = fx.read(1 << 20)
            if cx != fy.read(1 << 20):
                return False
            if not cx:
                return True


def _unfoldered(rel: str) -> str:
    """``projects/<folder>/<rest>`` without its project folder (session ids are unique)."""
    parts = rel.split("/")
    return "/".join(["projects", *parts[2:]]) if parts[0] == "projects" and len(parts) > 2 \
        else rel


def same_tree(a: Path, b: Path) -> tuple[bool, str]:
    """Every file of ``a`` in ``b`` with the same bytes, and nothing else in ``b``. When the
    names differ, says whether they differ only in the project folder."""
    fa, fb = tree_files(a), tree_files(b)
    pairs = {r: r for r in fa}
    moved: list[tuple[str, str]] = []
    if fa.keys() != fb.keys():
        ua = {_unfoldered(r): r for r in fa}
        ub = {_unfoldered(r): r for r in fb}
        if ua.keys() != ub.keys() or len(ua) != len(fa) or len(ub) != len(fb):
            return False, (f"{len(fa.keys() - fb.keys())} files missing, "
                           f"{len(fb.keys() - fa.keys())} extra")
        pairs = {ua[k]: ub[k] for k in ua}
        moved = [(x, y) for x, y in pairs.items() if x != y]
    for x, y in pairs.items():
        if fa[x] != fb[y] or not _same_bytes(a / x, b / y):
            return False, f"{x}: content differs"
    what = f"{len(fa)} files, {fmt_mb(sum(fa.values()))}"
    if not moved:
        return True, what
    folders = sorted({(x.split("/")[1], y.split("/")[1]) for x, y in moved})
    log(f"  {len(moved)} files restored under another project folder: "
        + ", ".join(f"{x} -> {y}" for x, y in folders))
    return False, (f"{len(moved)} files in another project folder (bytes identical; "
                   f"e.g. {folders[0][0]} -> {folders[0][1]})")


def rm(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------------------
# The benchmark
# ---------------------------------------------------------------------------

class Bench(BenchBase):
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        super().__init__(args, work)
        self.res: Results = Results()  # this bench's columns (no rclone)
        self.proxy: CountingProxy | None = None
        self.caches = 0
        self.full_runs: list[Run] = []                       # figure 2, syncd's plain runs
        self.map_check: tuple[int, int, int] = (0, 0, 0)     # and its remapped one's tree

    # -- environments -------------------------------------------------------
    def syncd_env(self, *, proxied: bool, backup: bool = False,
                  code: Path | None = None) -> dict[str, str]:
        """The backing-up machine (``backup``), or a fresh one that restores from it
        (``code``: with that checkout's syncd)."""
        assert self.sw is not None and self.proxy is not None
        name = "main" if backup else "restorer"
        local = self.tree.root if backup else self.work / "restorer-claude"
        local.mkdir(exist_ok=True)
        env = self.base_env()
        # An installed syncd has its modules' bytecode (pip compiles it at install). Where
        # the environment forbids writing it (PYTHONDONTWRITEBYTECODE) and the venv was
        # installed without it, every command would compile botocore, urllib3 and syncd
        # from source first: ~0.5 s of CPU at each start, which restic, one binary, never
        # pays. The bytecode is kept in the work directory, made by the first command.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(self.work / ("pycache" if code is None else
                                                      "pycache-before"))
        if code is not None:
            env["PYTHONPATH"] = str(code)
        return {**env, "SYNCD_SOURCE": str(local),
                "SYNCD_STORE": f"s3://syncd/{SYNCD_PREFIX}",
                "SYNCD_STATE_DIR": str(self.work / f"state-{name}"),
                "SYNCD_MACHINE_ID": MACHINE if backup else "bench-restorer",
                "SYNCD_S3_ENDPOINT_URL": self.proxy.endpoint if proxied else self.sw.endpoint,
                "SYNCD_CONFIG": os.devnull}

    def restic_env(self, *, proxied: bool, fresh_cache: bool = True) -> dict[str, str]:
        """A fresh cache directory by default: a new machine has none."""
        assert self.sw is not None and self.proxy is not None
        endpoint = self.proxy.endpoint if proxied else self.sw.endpoint
        self.caches += 1
        cache = f"restic-cache-{self.caches}" if fresh_cache else "restic-cache"
        return {**self.base_env(), "RESTIC_REPOSITORY": f"s3:{endpoint}/restic",
                "RESTIC_PASSWORD": "bench-password",
                "RESTIC_CACHE_DIR": str(self.work / cache)}

    def run(self, cmd: list[str], env: dict[str, str], name: str) -> Run:
        return run_measured(self.procs, cmd, env, self.logs, name)

    # -- steps --------------------------------------------------------------
    def setup(self) -> None:
        a = self.args
        self.start_tree_and_seaweed(a.size_mb, ("syncd", "restic"))
        assert self.sw is not None
        self.proxy = CountingProxy(self.sw.endpoint)
        log(f"SeaweedFS at {self.sw.endpoint}, counting proxy at {self.proxy.endpoint}")
        self.res.notes.append(f"tree: {self.tree.files} files, {fmt_mb(self.tree.bytes)}, "
                              f"{len(self.tree.sessions)} sessions")

        log("backing up with syncd sync ...")
        r = self.run([self.syncd, "sync"], self.syncd_env(proxied=False, backup=True),
                     "syncd-sync")
        if not a.no_compact:
            # The state a store is in with the daemon's hourly compaction: a snapshot.
            log("compacting with syncd compact ...")
            c = self.run([self.syncd, "compact"], self.syncd_env(proxied=False, backup=True),
                         "syncd-compact")
            self.res.notes.append(f"syncd compact after the sync: {c.wall:.1f} s, peak RSS "
                                  f"{fmt_rss(c.maxrss)}")
        self.seg_objects, self.stored = bucket_stats(self.sw, "syncd", SYNCD_PREFIX + "/")
        log(f"  {r.wall:.1f}s, {self.tree.bytes / MB / r.wall:.1f} MB/s, "
            f"{fmt_mb(self.stored)} in {self.seg_objects} objects")
        store = open_store(f"s3://syncd/{SYNCD_PREFIX}", endpoint_url=self.sw.endpoint)
        self.backup: Backup = load_backup(Repository(store, MACHINE))
        self.index_ranges = self.read_trailers()
        self.res.notes.append(f"syncd backup: {fmt_mb(self.stored)} in {self.seg_objects} "
                              f"objects ({len(self.index_ranges)} with an index), "
                              f"ratio {self.tree.bytes / self.stored:.2f}; syncd sync of the "
                              f"tree: {r.wall:.1f} s, {self.tree.bytes / MB / r.wall:.1f} MB/s")
        if self.peers:
            log("backing up with restic ...")
            env = self.restic_env(proxied=False, fresh_cache=False)
            self.run([self.restic, "init", "--repository-version", "2"], env, "restic-init")
            r = self.run([self.restic, "backup", "--compression", "auto", "--host", "bench",
                          "--json", str(self.tree.root)], env, "restic-backup")
            n, size = bucket_stats(self.sw, "restic")
            log(f"  {r.wall:.1f}s, {self.tree.bytes / MB / r.wall:.1f} MB/s, "
                f"{fmt_mb(size)} in {n} objects")
            self.res.notes.append(f"restic repo (v2, compression auto): {fmt_mb(size)} in "
                                  f"{n} objects; restic backup of the tree: {r.wall:.1f} s, "
                                  f"{self.tree.bytes / MB / r.wall:.1f} MB/s")

    def read_trailers(self) -> dict[str, tuple[int, int]]:
        """Key (in the bucket) of every segment, pack and manifest → (index offset,
        index length), read directly."""
        assert self.sw is not None
        client = self.sw.client()
        out = {}
        pages = client.get_paginator("list_objects_v2").paginate(
            Bucket="syncd", Prefix=f"{SYNCD_PREFIX}/{layout.machine_prefix(MACHINE)}")
        for page in pages:
            for o in page.get("Contents", []):
                if o["Key"].split("/")[-2] not in ("seg", "pack", "snap"):
                    continue
                tail = client.get_object(Bucket="syncd", Key=o["Key"],
                                         Range=f"bytes=-{TRAILER.size}")["Body"].read()
                off, length = TRAILER.unpack(tail)[:2]
                out[o["Key"]] = (off, length)
        return out

    def index_read_bytes(self) -> int:
        """What reading every index takes: one suffix GET of TAIL_READ bytes, plus the
        index by range when it does not fit in the tail."""
        total = 0
        for key, (off, length) in self.index_ranges.items():
            if "/pack/" in key:
                continue  # a restore never reads a pack's index
            size = off + length + TRAILER.size
            total += min(size, TAIL_READ)
            if length > TAIL_READ - TRAILER.size:
                total += length
        return total

    def classify(self, reqs: list[Req]) -> dict[str, list[int]]:
        """[requests, bytes] by kind: list, index, data (segment frames), other."""
        out = {k: [0, 0] for k in ("list", "index", "manifest", "data", "other")}
        for r in reqs:
            if is_list(r):
                kind = "list"
            elif r.method == "GET" and r.key in self.index_ranges:
                off = self.index_ranges[r.key][0]
                rng = r.range.removeprefix("bytes=")
                kind = "index" if rng.startswith("-") or rng.startswith(f"{off}-") else (
                    "manifest" if "/snap/" in r.key else "data")
            else:
                kind = "other"
            out[kind][0] += 1
            out[kind][1] += r.body
        return out

    def pick_sessions(self) -> list[Pick]:
        picks = []
        for path, sid, _ in self.tree.sessions:
            rel = str(path.relative_to(self.tree.root))
            sub = rel.removesuffix(".jsonl").encode() + b"/"
            files = [f for p, f in self.backup.files.items()
                     if p == rel.encode() or p.startswith(sub)]
            picks.append(Pick("", sid, rel, files, sum(f.size for f in files),
                              sum(f.stored for f in files)))
        picks.sort(key=lambda p: p.stored)
        median, large = picks[len(picks) // 2], picks[-1]
        median.label, large.label = "median", "largest"
        return [median, large]

    # -- figure 1 -----------------------------------------------------------
    def fig1_one_session(self) -> None:
        assert self.proxy is not None
        res = self.res
        hist = self.backup.files.get(b"history.jsonl")
        hist_stored = hist.stored if hist else 0
        res.add(f"# 1. restore ONE session out of the {fmt_mb(self.tree.bytes)} backup, "
                "through a counting proxy (a new machine: no state, restic with an empty cache)")
        idx = self.index_read_bytes()
        res.add("1 all indexes of segments and manifests",
                f"{fmt_kb(idx)} ({len(self.index_ranges)} objects)")
        res.add("1 history.jsonl compressed (restored with any session)", fmt_kb(hist_stored))
        for p in self.pick_sessions():
            tag = f"1 [{p.label}]"
            log(f"fig 1 [{p.label}]: session {p.sid}: {len(p.files)} files, {fmt_kb(p.raw)} "
                f"raw, {fmt_kb(p.stored)} compressed in {p.segments} segment(s)")
            target = self.work / f"one-{p.label}"
            self.proxy.take()
            r = self.run([self.syncd, "restore", "--machine", MACHINE, "--session", p.sid,
                          "--to", str(target)], self.syncd_env(proxied=True),
                         f"syncd-restore-{p.label}")
            reqs = self.proxy.take()
            kinds = self.classify(reqs)
            down = sum(x.body for x in reqs)
            gets = sum(1 for x in reqs if x.method == "GET" and not is_list(x))
            got = tree_files(target)
            ok = all(got.get(os.fsdecode(f.path)) == f.size for f in p.files)
            ratio = down / p.stored
            log(f"  syncd: {fmt_kb(down)} downloaded in {len(reqs)} requests, {r.wall:.2f}s, "
                f"{len(got)} files restored ({'sizes match' if ok else 'SIZES DIFFER'}); "
                + ", ".join(f"{k} {v[0]} req {fmt_kb(v[1])}" for k, v in kinds.items()))
            rs = {"down": "", "ratio": "", "gets": "", "wall": "", "files": "", "rss": ""}
            if self.peers:
                rs = self.restic_one(p, target.with_name(target.name + "-restic"))
            res.add(f"{tag} session: files, raw size",
                    f"{len(p.files)} files, {fmt_kb(p.raw)} in {p.segments} object(s)")
            res.add(f"{tag} session compressed size (sum of clen)", fmt_kb(p.stored))
            res.add(f"{tag} bytes downloaded", fmt_kb(down), rs["down"])
            res.add(f"{tag}   of which indexes (manifest, later segments)",
                    f"{fmt_kb(kinds['index'][1])} ({kinds['index'][0]} GETs)")
            res.add(f"{tag}   of which manifest groups",
                    f"{fmt_kb(kinds['manifest'][1])} ({kinds['manifest'][0]} GETs)")
            res.add(f"{tag}   of which frames (session + history)",
                    f"{fmt_kb(kinds['data'][1])} ({kinds['data'][0]} GETs)")
            res.add(f"{tag}   of which LIST + machine.json",
                    f"{fmt_kb(kinds['list'][1] + kinds['other'][1])} "
                    f"({kinds['list'][0]} LIST, {kinds['other'][0]} other)")
            res.add(f"{tag} downloaded / session compressed size", f"{ratio:.2f}",
                    rs["ratio"], f"<= {TARGET_ONE:g}", ratio <= TARGET_ONE)
            res.add(f"{tag} GET requests (objects, ranges)", str(gets), rs["gets"])
            res.add(f"{tag} files restored (incl. history.jsonl)",
                    f"{len(got)}" + ("" if ok else " (SIZES DIFFER)"), rs["files"])
            res.add(f"{tag} wall time, s", f"{r.wall:.2f}", rs["wall"])
            res.add(f"{tag} peak RSS", fmt_rss(r.maxrss), rs["rss"])

    def restic_one(self, p: Pick, target: Path) -> dict[str, str]:
        assert self.proxy is not None
        base = str(self.tree.root / p.rel)
        self.proxy.take()
        r = self.run([self.restic, "restore", "latest", "--target", str(target),
                      "--include", base, "--include", base.removesuffix(".jsonl")],
                     self.restic_env(proxied=True), f"restic-restore-{p.label}")
        reqs = self.proxy.take()
        down = sum(x.body for x in reqs)
        gets = sum(1 for x in reqs if x.method == "GET" and not is_list(x))
        got = tree_files(target)
        log(f"  restic: {fmt_kb(down)} downloaded in {len(reqs)} requests ({gets} GETs), "
            f"{r.wall:.2f}s, {len(got)} files restored")
        return {"down": fmt_kb(down), "ratio": f"{down / p.stored:.2f}", "gets": str(gets),
                "wall": f"{r.wall:.2f}", "files": str(len(got)), "rss": fmt_rss(r.maxrss)}

    # -- figure 2 -----------------------------------------------------------
    def fig2_full(self) -> None:
        res, tree, reps = self.res, self.tree, self.args.repeat
        res.add(f"# 2. full restore of the {fmt_mb(tree.bytes)} backup from SeaweedFS, direct "
                f"(median of {reps} runs, fresh target each; RSS/CPU from the first)")
        tools = {"syncd": self.full_syncd, "syncd-map": self.full_syncd_map}
        if self.args.before:
            tools["before"] = lambda t: self.full_syncd(t, self.args.before)
            tools["before-map"] = lambda t: self.full_syncd_map(t, self.args.before)
        if self.peers:
            tools["restic"] = self.full_restic
        tools["floor"] = self.full_floor
        runs: dict[str, list[Run]] = {t: [] for t in tools}
        checks: dict[str, str] = {}
        for k in range(reps):
            for name, fn in tools.items():   # interleaved, like core.py
                log(f"fig 2: {name} full restore {k + 1}/{reps} ...")
                target = self.work / f"full-{name}"
                r, restored = fn(target)
                runs[name].append(r)
                log(f"  {name}: {r.wall:.2f}s, {tree.bytes / MB / r.wall:.1f} MB/s, "
                    f"peak RSS {fmt_rss(r.maxrss)}, CPU {r.cpu:.1f}s")
                if k == 0 and name == "syncd-map":
                    self.map_check = self.remapped_check(restored)
                elif k == 0 and name in ("syncd", "restic"):
                    ok, what = same_tree(tree.root, restored)
                    log(f"  restored tree identical: {'yes' if ok else 'NO'}: {what}")
                    checks[name] = "yes" if ok else "NO (see note)"
                    if not ok:
                        res.notes.append(f"{name} full restore differs from the tree: {what}")
                rm(target)
        cols: dict[str, dict[str, str]] = {"restic": {}}
        rates: dict[str, float] = {}
        maps = runs.pop("syncd-map")
        self.full_runs = runs["syncd"]
        self.compare(runs, maps)
        runs = {k: v for k, v in runs.items() if k in ("syncd", "restic")}
        for name, rr in runs.items():
            rs = [tree.bytes / MB / r.wall for r in rr]
            rates[name] = statistics.median(rs)
            cols[name] = {
                "rate": f"{rates[name]:.1f}" + (f" ({min(rs):.0f}-{max(rs):.0f})"
                                                if len(rs) > 1 else ""),
                "wall": f"{statistics.median(r.wall for r in rr):.2f}",
                "cpu": f"{rr[0].cpu:.2f}", "rss": fmt_rss(rr[0].maxrss),
                "check": checks[name]}

        def add(key: str, what: str, target: str = "", met: bool | None = None) -> None:
            res.add(what, cols["syncd"][key], cols["restic"].get(key, ""), target, met)

        add("rate", "2 throughput, tree MB / wall s", f">= {TARGET_RATE:g}",
            rates["syncd"] >= TARGET_RATE)
        add("wall", "2 wall time, s")
        add("cpu", "2 CPU (user+sys), s")
        add("rss", "2 peak RSS of the restore process")
        add("check", "2 restored tree identical to the original", "identical",
            checks["syncd"].startswith("yes"))
        self.full_remapped(maps, rates.get("restic"))

    def remapped_check(self, target: Path) -> tuple[int, int, int]:
        """Files restored, project folders, and those moved under the new home."""
        got = tree_files(target)
        folders = {k.split("/")[1] for k in got if k.startswith("projects/")}
        moved = sum(1 for f in folders if f.startswith(sanitize(MAP_NEW)))
        log(f"  {len(got)} files, {moved}/{len(folders)} project folders under "
            f"{sanitize(MAP_NEW)}")
        return len(got), len(folders), moved

    def full_remapped(self, runs: list[Run], restic: float | None) -> None:
        """The restores with the projects' parent mapped elsewhere, as a restore on another
        machine does: every transcript is rewritten on the way."""
        tree, res = self.tree, self.res
        rs = [tree.bytes / MB / r.wall for r in runs]
        rate = statistics.median(rs)
        got, folders, moved = self.map_check
        res.add(f"2 with --map {MAP_OLD}={MAP_NEW} (another machine): MB / s",
                f"{rate:.1f}" + (f" ({min(rs):.0f}-{max(rs):.0f})" if len(rs) > 1 else ""),
                target=f">= {TARGET_RATE:g}", met=rate >= TARGET_RATE)
        r = runs[0]
        res.add("2   wall (median), CPU (user+sys), peak RSS",
                f"{statistics.median(r.wall for r in runs):.2f} s, {r.cpu:.2f} s, "
                f"{fmt_rss(r.maxrss)}")
        res.add("2   files restored, project folders moved",
                f"{got} files, {moved}/{folders} folders",
                target=f"{tree.files}, all", met=got == tree.files and moved == folders)
        if restic:
            full = statistics.median(tree.bytes / MB / r.wall for r in self.full_runs)
            res.add("2 syncd full restore / restic restore (median MB/s)",
                    f"{full / restic:.2f}x", target=f">= {TARGET_VS_RESTIC:g}x",
                    met=full / restic >= TARGET_VS_RESTIC)
            res.add("2 syncd --map restore / restic restore (median MB/s)",
                    f"{rate / restic:.2f}x", target=">= 1x", met=rate >= restic)

    def compare(self, runs: dict[str, list[Run]], maps: list[Run]) -> None:
        """One row per tool of figure 2 (``--before``: the older code's too, interleaved):
        median MB/s (min-max), wall, CPU (user+sys) and its kernel part, and each one's
        ratio to restic's plain restore."""
        tree, res = self.tree, self.res
        every = {**runs, "syncd-map": maps}
        restic = statistics.median(tree.bytes / MB / r.wall for r in every["restic"]) \
            if "restic" in every else None
        res.add(f"# 2c. side by side, {fmt_mb(tree.bytes)}, {len(maps)} interleaved runs each "
                "(MB/s median (min-max); wall, CPU, of which kernel; x restic's plain)")
        for name in ("before", "syncd", "before-map", "syncd-map", "restic", "floor"):
            if name not in every:
                continue
            rr = every[name]
            rs = [tree.bytes / MB / r.wall for r in rr]
            rate = statistics.median(rs)
            res.add(f"2c {name}", f"{rate:.1f} ({min(rs):.0f}-{max(rs):.0f}) MB/s; "
                    f"{statistics.median(r.wall for r in rr):.2f} s, "
                    f"CPU {statistics.median(r.cpu for r in rr):.2f} s, "
                    f"sys {statistics.median(r.sys for r in rr):.2f} s",
                    f"{rate / restic:.2f}x" if restic else "")

    def full_syncd_map(self, target: Path, code: Path | None = None) -> tuple[Run, Path]:
        r = self.run([self.syncd, "restore", "--machine", MACHINE, "--to", str(target),
                      "--map", f"{MAP_OLD}={MAP_NEW}"], self.syncd_env(proxied=False, code=code),
                     "syncd-restore-map")
        return r, target

    def full_syncd(self, target: Path, code: Path | None = None) -> tuple[Run, Path]:
        r = self.run([self.syncd, "restore", "--machine", MACHINE, "--to", str(target)],
                     self.syncd_env(proxied=False, code=code), "syncd-restore-full")
        return r, target

    def full_floor(self, target: Path) -> tuple[Run, Path]:
        """The floor: the tree's bytes copied into the page cache of a fresh directory
        (``cp -r``: read from the cache, written to new files, no fsync), as a restore
        of them would at least cost."""
        for path in self.tree.root.rglob("*"):  # in the page cache first, as a store's are
            if path.is_file():
                path.read_bytes()
        r = self.run(["cp", "-r", str(self.tree.root), str(target)], self.base_env(),
                     "floor-cp")
        return r, target

    def full_restic(self, target: Path) -> tuple[Run, Path]:
        r = self.run([self.restic, "restore", "latest", "--target", str(target)],
                     self.restic_env(proxied=False), "restic-restore-full")
        return r, target / self.tree.root.relative_to("/")

    # -- figure 3 -----------------------------------------------------------
    def fig3_sessions(self) -> None:
        assert self.proxy is not None
        res = self.res
        res.add("# 3. syncd sessions --json on that backup, through the counting proxy "
                "(restic: ls latest, empty cache)")
        self.proxy.take()
        r = self.run([self.syncd, "sessions", "--json"], self.syncd_env(proxied=True),
                     "syncd-sessions")
        reqs = self.proxy.take()
        kinds = self.classify(reqs)
        down = sum(x.body for x in reqs)
        listed = len(json.loads(r.out))
        idx = self.index_read_bytes()
        log(f"fig 3: {listed} sessions listed in {r.wall:.2f}s; {fmt_kb(down)} downloaded in "
            f"{len(reqs)} requests; " + ", ".join(f"{k} {v[0]} req {fmt_kb(v[1])}"
                                                  for k, v in kinds.items()))
        rs = {"wall": "", "down": "", "reqs": ""}
        if self.peers:
            self.proxy.take()
            rr = self.run([self.restic, "ls", "latest", "--json"], self.restic_env(proxied=True),
                          "restic-ls")
            rq = self.proxy.take()
            rdown = sum(x.body for x in rq)
            log(f"  restic ls: {rr.wall:.2f}s, {fmt_kb(rdown)} downloaded in {len(rq)} requests")
            rs = {"wall": f"{rr.wall:.2f}", "down": fmt_kb(rdown), "reqs": str(len(rq))}
        res.add("3 sessions listed", str(listed), target=str(len(self.tree.sessions)),
                met=listed == len(self.tree.sessions))
        res.add("3 wall time, s", f"{r.wall:.2f}", rs["wall"])
        res.add("3 bytes downloaded / stored bytes",
                f"{fmt_kb(down)} / {fmt_mb(self.stored)} ({down / self.stored * 100:.2f} %)",
                rs["down"])
        res.add("3   of which data frames (transcript bytes)", fmt_kb(kinds["data"][1]),
                target="0", met=kinds["data"][1] == 0)
        res.add("3   of which indexes", f"{fmt_kb(kinds['index'][1])}",
                target=f"<= {fmt_kb(idx)} (all indexes)", met=kinds["index"][1] <= idx)
        res.add("3   of which manifest groups (file lists and catalog)",
                fmt_kb(kinds["manifest"][1]))
        res.add("3 requests (GET / LIST / other)",
                f"{kinds['index'][0] + kinds['data'][0] + kinds['manifest'][0]} / "
                f"{kinds['list'][0]} / "
                f"{kinds['other'][0]}", rs["reqs"])
        res.add("3 peak RSS", fmt_rss(r.maxrss))

    # -- figure 4 -----------------------------------------------------------
    def fig4_reship(self) -> None:
        """``rm -rf projects`` under a running daemon, then ``syncd restore``: what the
        daemon ships again (the restored bytes are the store's own)."""
        assert self.sw is not None
        res = self.res
        res.add("# 4. rm -rf projects with syncd run running, then syncd restore (the machine's "
                "own backup, into its tree): what the daemon ships again")
        env = self.syncd_env(proxied=False, backup=True)
        store = open_store(f"s3://syncd/{SYNCD_PREFIX}", endpoint_url=self.sw.endpoint)
        repo = Repository(store, MACHINE)
        projects = self.tree.root / "projects"
        raw = sum(p.stat().st_size for p in projects.rglob("*") if p.is_file())
        err = self.logs / "syncd-run-reship.err"
        notify = self.work / "notify-reship.sock"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(str(notify))
        try:
            d = self.procs.start([self.syncd, "run"], {**env, "NOTIFY_SOCKET": str(notify)},
                                 self.logs / "syncd-run-reship.out", err)
            wait_ready(d, err, sock)
        finally:
            sock.close()
            notify.unlink()
        try:
            def top() -> int:
                """The newest segment's seq (-1: none)."""
                seqs = [layout.segment_seq(k) for k, _ in repo.segments()]
                return max((q for q in seqs if q is not None), default=-1)

            def quiet(after: int) -> int:
                """The newest seq once the daemon has flushed past ``after`` and then
                nothing for 5 s (its flush delay is at most 10 s after a change)."""
                last, since = after, time.monotonic()
                deadline = since + 120
                while time.monotonic() < deadline:
                    newest = top()
                    if newest != last:
                        last, since = newest, time.monotonic()
                    elif last > after and time.monotonic() - since > 5:
                        return last
                    time.sleep(0.5)
                raise RuntimeError("the daemon did not flush")

            shutil.rmtree(projects)
            deleted = quiet(top())
            before = bucket_stats(self.sw, "syncd", SYNCD_PREFIX + "/")[1]
            r = self.run([self.syncd, "restore"], env, "syncd-restore-own")
            revived = quiet(deleted)
            after = bucket_stats(self.sw, "syncd", SYNCD_PREFIX + "/")[1]
        finally:
            stop_process(d)
        shipped = 0
        revivals = 0
        for key, _ in repo.segments(after=deleted):
            for x in repo.read_index(key).extents:
                shipped += x.end - x.start
                revivals += x.reason == "revived: restored as it was shipped"
        log(f"fig 4: restore {r.wall:.1f}s; segments {deleted + 1}..{revived}: {shipped} raw "
            f"bytes shipped, {revivals} revivals; bucket {before} -> {after} bytes")
        res.add("4 restored (projects/), raw bytes", fmt_mb(raw))
        res.add("4 raw bytes the daemon shipped again", f"{shipped} B", target="0",
                met=shipped == 0)
        res.add("4   files revived (deleted generations brought back)", str(revivals))
        res.add("4   bucket growth, bytes (segments of the revival)", f"{after - before} B")
        log_text = err.read_text(errors="replace")
        warnings_ = [ln for ln in log_text.splitlines() if "Warning" in ln or "WARNING" in ln]
        res.add("4   warning lines in the daemon's log", str(len(warnings_)), target="0",
                met=not warnings_)

    def run_all(self) -> None:
        self.setup()
        if not self.args.full_only:
            self.fig1_one_session()
        self.fig2_full()
        if not self.args.full_only:
            self.fig3_sessions()
            self.fig4_reship()
        self.res.notes.append(f"load average (1 min) at the end: {os.getloadavg()[0]:.2f}")
        self.res.notes.append("syncd fsyncs every restored file (and its directory); "
                              "restic 0.14 does not")


def _load_remap(checkout: Path | None) -> Any:
    """``syncd.restore.remap`` of this checkout, or of ``checkout`` (another one, e.g. the
    baseline's) loaded under its own name; either imports the rest of syncd from here."""
    if checkout is None:
        from syncd.restore import remap
        return remap
    name = f"remap_of_{sanitize(str(checkout))}"
    spec = importlib.util.spec_from_file_location(
        name, checkout / "syncd" / "restore" / "remap.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # its dataclasses look themselves up there
    spec.loader.exec_module(mod)
    return mod


def _generated_transcripts(args: argparse.Namespace) -> tuple[
        list[bytes], tuple[list[tuple[str, str]], dict[str, str]]]:
    """The transcripts of the tree figure 2 restores (same generator, seed and size),
    generated in a temporary directory, and the rules and folders its ``--map`` restore
    rewrites them by: the map, the Claude tree's own path, every project's folder."""
    from syncd.claude import project_folder

    corpus = None if args.synthetic else load_samples(SAMPLES)
    if corpus is None:
        corpus = synthetic_corpus(random.Random(args.seed))
    size = (args.size_mb or 233) * MB
    log(f"generating a {fmt_mb(size)} tree ({corpus.origin}) ...")
    with tempfile.TemporaryDirectory(prefix="syncd-bench-remap-", dir=args.workdir) as d:
        tree = build_main_tree(Path(d), corpus, random.Random(args.seed), size)
        data = [p.read_bytes() for p in sorted(tree.root.glob("projects/**/*.jsonl"))]
    old, new = project_folder(MAP_OLD), project_folder(MAP_NEW)
    folders = {f: f.replace(old, new, 1)
               for f in (sanitize(f"{MAP_OLD}/src/{n}") for n in PROJECT_NAMES)}
    return data, ([(MAP_OLD, MAP_NEW), (str(tree.root), "/restored/claude")], folders)


def remap_rate(args: argparse.Namespace) -> None:
    """``Remapper.lines`` alone (``--remap [FILE…]``) on real transcripts, each mapped from
    its first cwd's home to ``MAP_NEW``'s, its folder too, or on the generated tree's
    (no FILE) under the remapped restore's ``--map``; the best and the median of
    ``--repeat`` passes over all of them, in MB of CPU time. ``--against DIR``: DIR's
    remapper too, interleaved pass by pass, its output checked byte for byte."""
    import re

    from syncd.claude import project_folder

    sides = [("this checkout", _load_remap(None))]
    if args.against:
        sides.append((str(args.against), _load_remap(args.against)))
    work: list[list[tuple[bytes, Any]]] = [[] for _ in sides]
    if args.remap:
        for path in args.remap:
            data = path.read_bytes()
            home = re.search(rb'"cwd":"(/(?:home|Users)/[^/"]+)', data)
            old = home[1].decode() if home else MAP_OLD
            folder = path.parent.name
            folders = {folder: folder.replace(project_folder(old), project_folder(MAP_NEW), 1)}
            for w, (_, mod) in zip(work, sides, strict=True):
                w.append((data, mod.Remapper([mod.Rule(old, MAP_NEW)], folders)))
    else:
        generated, (rules, folders) = _generated_transcripts(args)
        for w, (_, mod) in zip(work, sides, strict=True):
            remap = mod.Remapper([mod.Rule(o, n) for o, n in rules], folders)
            w.extend((data, remap) for data in generated)
    total = sum(len(d) for d, _ in work[0])
    if len(sides) > 1:
        same = all(a.lines(d) == b.lines(d)
                   for (d, a), (_, b) in zip(work[0], work[1], strict=True))
        print(f"outputs byte-identical to {sides[1][0]}'s: {'yes' if same else 'NO'}")
    rounds = args.repeat or 30
    runs: list[list[float]] = [[] for _ in sides]
    for _ in range(rounds):
        for w, r in zip(work, runs, strict=True):
            t = time.process_time()  # CPU, not wall: the figure holds on a busy machine
            for data, remap in w:
                remap.lines(data)
            r.append(time.process_time() - t)
    what = f"{len(work[0])} files, {fmt_mb(total)}" + ("" if args.remap else " generated")
    for (name, _), r in zip(sides, runs, strict=True):
        rates = sorted(total / t / MB for t in r)
        print(f"Remapper.lines ({name}), {what}: best {rates[-1]:.0f} MB/s, median "
              f"{statistics.median(rates):.0f} MB/s, quartiles {rates[len(r) // 4]:.0f}-"
              f"{rates[(3 * len(r)) // 4]:.0f} ({rounds} passes, load "
              f"{os.getloadavg()[0]:.1f})")


def main() -> int:
    ap = bench_parser(__doc__, 1024)
    ap.add_argument("--remap", type=Path, nargs="*", metavar="FILE",
                    help="only time Remapper.lines on these transcripts (no store), or "
                         "with no FILE on the generated tree's (--size-mb, default 233)")
    ap.add_argument("--against", type=Path, default=None, metavar="DIR",
                    help="with --remap: time DIR's remapper too (another checkout)")
    ap.add_argument("--no-compact", action="store_true",
                    help="restore from the segments alone (no syncd compact after the sync)")
    ap.add_argument("--repeat", type=int, default=None,
                    help="full restores per tool for figure 2 (default 2, quick 1)")
    ap.add_argument("--full-only", action="store_true",
                    help="figure 2 alone (full and remapped restores, the floor)")
    ap.add_argument("--before", type=Path, default=None, metavar="CHECKOUT",
                    help="also restore with that checkout's syncd, interleaved (figure 2c)")
    args = ap.parse_args()
    if args.remap is not None:
        remap_rate(args)
        return 0
    q = args.quick
    args.size_mb = args.size_mb or (30 if q else 1024)
    args.repeat = max(1, args.repeat or (1 if q else 2))

    return run_bench("restore", args, "syncd-bench-restore-", Bench)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Follow figures for syncd (issue 13): machine B's daemon importing machine A's sessions.

Prints figures; asserts nothing. See bench/README.md for what each figure means.

    .venv/bin/python bench/follow.py                # full run: 50 MB tree, 180 s of load (~15 min)
    .venv/bin/python bench/follow.py --quick        # smoke run: 10 MB, 60 s of load (~6 min)
    .venv/bin/python bench/follow.py --both         # A follows B too (echo check)

Progress goes to stderr, the final table to stdout. Everything (trees, homes, SeaweedFS,
state) lives in one temporary directory, removed at the end. Tree generation, SeaweedFS
and process measurement come from bench/core.py, the counting proxy from bench/restore.py.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import parse_qs

sys.path.insert(0, str(Path(__file__).resolve().parent))

from core import (  # core also puts the repo on sys.path, for syncd and tests
    MB,
    PROJECT_NAMES,
    SAMPLES,
    BenchBase,
    Corpus,
    Tree,
    append_line,
    bench_parser,
    bucket_stats,
    build_main_tree,
    fmt_mb,
    git_describe,
    load_samples,
    log,
    pct,
    proc_cpu,
    proc_mem,
    render_table,
    run_bench,
    sanitize,
    shipped_files,
    stop_process,
    synthetic_corpus,
    wait_ready,
)
from restore import CountingProxy, Req, is_list

from syncd.backup.ship import IMPORTED_FROM, imported_from, merged_from
from syncd.config import Settings
from syncd.repository import Repository
from syncd.store import open_store
from tests.seaweed import start_seaweed

A, B = "A", "B"             # the followed machine and the follower
BUCKET = "syncd"
PREFIX = "bench"
SESSIONS = 10               # sessions appended to on A
RATE = 2.0                  # lines per second per session
WATCH_EVERY = 0.1           # s between two looks at B's copies
TARGET_RSS = 80 * MB
KINDS = ("HEAD", "GET", "LIST", "PUT")
# S3 request prices, $ per 1000 requests (us-east-1 standard).
PRICE = {"PUT": 0.005, "LIST": 0.005, "GET": 0.0004, "HEAD": 0.0004}
DEFAULTS = Settings.model_fields


def fmt_rss(n: int) -> str:
    return f"{n / MB:.1f} MB"


def default(name: str) -> float:
    value = DEFAULTS[name].default
    assert isinstance(value, float)
    return value


# ---------------------------------------------------------------------------
# Requests: whose prefix, what kind, what they cost
# ---------------------------------------------------------------------------

@dataclass
class TimedReq(Req):
    t: float = 0.0  # when the response was sent (time.time())


class TimedProxy(CountingProxy):
    """restore.py's counting proxy, each request stamped with the time it ended."""

    def record(self, r: Req) -> None:
        super().record(TimedReq(**asdict(r), t=time.time()))


def polls(reqs: list[Req], machine: str, gap: float = 1.0) -> list[list[TimedReq]]:
    """B's requests on ``machine``'s prefix in bursts (a quiet gap over ``gap`` s between
    two): one burst per poll, as a poll's requests follow each other."""
    out: list[list[TimedReq]] = []
    for r in sorted((r for r in reqs if isinstance(r, TimedReq) and scope(r) == machine),
                    key=lambda r: r.t):
        if out and r.t - out[-1][-1].t <= gap:
            out[-1].append(r)
        else:
            out.append([r])
    return out

def scope(r: Req) -> str:
    """The machine whose prefix a request touches (A, B), or "other"."""
    path = r.key or parse_qs(r.query).get("prefix", [""])[0]
    for m in (A, B):
        base = f"{PREFIX}/machines/{m}"
        if path == base or path.startswith(base + "/"):
            return m
    return "other"


def kind(r: Req) -> str:
    if is_list(r):
        return "LIST"
    return r.method if r.method in KINDS else r.method + "*"


@dataclass
class Tally:
    """Requests on one prefix over a window of ``seconds``."""

    seconds: float
    counts: Counter[str] = field(default_factory=Counter)
    body: int = 0   # response body bytes

    @classmethod
    def of(cls, reqs: list[Req], machine: str, seconds: float) -> Tally:
        t = cls(seconds)
        for r in reqs:
            if scope(r) == machine:
                t.counts[kind(r)] += 1
                t.body += r.body
        return t

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def per_hour(self, n: float) -> float:
        return n / self.seconds * 3600 if self.seconds > 0 else float("nan")

    def cost_per_hour(self) -> float:
        return sum(self.per_hour(n) * PRICE.get(k, PRICE["PUT"]) / 1000
                   for k, n in self.counts.items())

    def kinds(self) -> str:
        main = " / ".join(f"{self.per_hour(self.counts[k]):.0f}" for k in KINDS)
        extra = [f"{k} {self.per_hour(n):.0f}" for k, n in self.counts.items() if k not in KINDS]
        return main + (f" (+{', '.join(extra)})" if extra else "")


# ---------------------------------------------------------------------------
# B's copies: when each line first shows
# ---------------------------------------------------------------------------

class Watch:
    """B's copy of one session: the lines it holds, and when each line number first
    showed (a file replaced by a rename is counted again from its start)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.ino: int | None = None
        self.off = 0
        self.lines = 0
        self.seen: dict[int, float] = {}

    def look(self, now: float) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        try:
            st = os.fstat(fd)
            if st.st_ino != self.ino or st.st_size < self.off:
                self.ino, self.off, self.lines = st.st_ino, 0, 0
            if st.st_size == self.off:
                return
            data = os.pread(fd, st.st_size - self.off, self.off)
        finally:
            os.close(fd)
        n = data.count(b"\n")
        for k in range(self.lines + 1, self.lines + n + 1):
            self.seen.setdefault(k, now)
        self.lines += n
        self.off += len(data)


def count_lines(path: Path) -> int:
    with open(path, "rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))


def tree_rss(pid: int) -> tuple[int, int]:
    """(VmRSS of ``pid``, VmRSS of its descendants summed), bytes; 0 for what is gone."""
    def rss(p: int) -> int:
        try:
            return proc_mem(p).get("VmRSS", 0)
        except OSError:
            return 0

    def children(p: int) -> list[int]:
        out: list[int] = []
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    out += [int(c) for c in f.read().split()]
        except OSError:
            pass
        return out

    kids, todo = 0, children(pid)
    while todo:
        c = todo.pop()
        kids += rss(c)
        todo += children(c)
    return rss(pid), kids


# ---------------------------------------------------------------------------
# Results: one table, a value and its target
# ---------------------------------------------------------------------------

@dataclass
class Results:
    rows: list[tuple[str, ...]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, what: str, value: str = "", target: str = "",
            met: bool | None = None) -> None:
        self.rows.append((what, value, target,
                          "" if met is None else ("yes" if met else "NO")))

    def table(self) -> str:
        return render_table(("figure", "syncd", "target", "met"), self.rows, self.notes)


@dataclass
class Daemon:
    name: str
    proc: subprocess.Popen[bytes]
    err: Path
    interval: float


@dataclass
class Load:
    """One load phase's figures."""

    interval: float
    lags: list[float]
    appended: int
    missing: int
    waits: int          # "left until quiet" in B's log during the phase
    imports: int        # "imported N sessions" lines in B's log during the phase
    cpu_b: float        # % of one core
    cpu_a: float
    mem: dict[str, int]
    mem_a: dict[str, int]  # A's daemon (not following): the same daemon without follow
    load: Tally         # B's requests on A's prefix during the appends
    own: Tally          # and on its own prefix
    echo: Tally | None  # --both: A's requests on B's prefix
    reading: list[list[TimedReq]]  # B's polls of A that read more than a HEAD
    a_before: tuple[int, int]  # A's segments and their bytes when the appends start
    a_after: tuple[int, int]   # and when they end


class Bench(BenchBase):
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        args.skip_peers = True  # no peer tool does this
        super().__init__(args, work)
        self.res: Results = Results()  # type: ignore[assignment]  # this bench's columns
        self.proxy_a: TimedProxy | None = None
        self.proxy_b: TimedProxy | None = None
        self.a: Daemon | None = None
        self.b: Daemon | None = None
        self.home_a = work / "home-a"
        self.home_b = work / "home-b"
        self.root_b = work / "claude-b"
        self.watches: dict[str, Watch] = {}
        self.loads: list[Load] = []

    def close(self) -> None:
        super().close()
        if self.proxy_a is not None:
            self.proxy_a.close()
        if self.proxy_b is not None:
            self.proxy_b.close()

    # -- machines -----------------------------------------------------------
    def env(self, machine: str, interval: float) -> dict[str, str]:
        assert self.sw is not None and self.proxy_a is not None and self.proxy_b is not None
        is_a = machine == A
        env = {**self.base_env(),
               "HOME": str(self.home_a if is_a else self.home_b),
               "SYNCD_SOURCE": str(self.tree.root if is_a else self.root_b),
               "SYNCD_STORE": f"s3://{BUCKET}/{PREFIX}",
               "SYNCD_STATE_DIR": str(self.work / f"state-{machine}"),
               "SYNCD_MACHINE_ID": machine,
               "SYNCD_S3_ENDPOINT_URL": (self.proxy_a if is_a else self.proxy_b).endpoint,
               "SYNCD_CONFIG": os.devnull}
        follow = [B] if is_a and self.args.both else [] if is_a else [A]
        if follow:
            env["SYNCD_FOLLOW"] = json.dumps(follow)
            env["SYNCD_FOLLOW_INTERVAL"] = f"{interval:g}"
        return env

    def start(self, machine: str, interval: float) -> Daemon:
        name = f"{machine}-{len(self.procs.live)}"
        err = self.logs / f"syncd-run-{name}.err"
        notify = self.work / f"notify-{name}.sock"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(str(notify))
        try:
            p = self.procs.start([self.syncd, "run"],
                                 {**self.env(machine, interval), "NOTIFY_SOCKET": str(notify)},
                                 self.logs / f"syncd-run-{name}.out", err)
            how = wait_ready(p, err, sock)
        finally:
            sock.close()
            notify.unlink()
        log(f"{machine}: syncd run up (pid {p.pid}, {how}"
            + (f", follow_interval {interval:g} s)" if machine == B or self.args.both else ")"))
        return Daemon(name, p, err, interval)

    def take(self, machine: str) -> list[Req]:
        """The requests through ``machine``'s proxy since the last take; also kept in
        logs/requests-<machine>.jsonl."""
        proxy = self.proxy_a if machine == A else self.proxy_b
        assert proxy is not None
        reqs = proxy.take()
        with open(self.logs / f"requests-{machine}.jsonl", "a") as f:
            f.writelines(json.dumps({"taken": round(time.time(), 3), "method": r.method,
                                     "kind": kind(r), "key": r.key, "query": r.query,
                                     "range": r.range, "status": r.status, "body": r.body})
                         + "\n" for r in reqs)
        return reqs

    def segments(self, machine: str) -> tuple[int, int]:
        """(segments, their bytes) under ``machine``'s prefix now."""
        assert self.sw is not None
        return bucket_stats(self.sw, BUCKET, f"{PREFIX}/machines/{machine}/seg/")

    def log_text(self, d: Daemon) -> str:
        return d.err.read_text(errors="replace")

    def b_path(self, rel_a: str, cwd: str) -> Path:
        """Where B's CLI keeps A's session: the folder of the cwd remapped to B's home."""
        cwd_b = str(self.home_b) + cwd.removeprefix(str(self.home_a))
        return self.root_b / "projects" / sanitize(cwd_b) / Path(rel_a).name

    # -- steps --------------------------------------------------------------
    def setup(self) -> None:
        a = self.args
        corpus: Corpus | None = None if a.synthetic else load_samples(SAMPLES)
        if corpus is None:
            corpus = synthetic_corpus(self.rng)
        self.corpus = corpus
        log(f"content: {corpus.origin}")
        for home in (self.home_a, self.home_b):
            for n in PROJECT_NAMES:
                (home / "src" / n).mkdir(parents=True)
        self.root_b.mkdir()
        log(f"generating {a.size_mb} MB tree on A ...")
        self.tree: Tree = build_main_tree(self.work / "claude-a", corpus, self.rng,
                                          a.size_mb * MB, home=str(self.home_a))
        log(f"tree: {self.tree.files} files, {fmt_mb(self.tree.bytes)}, "
            f"{len(self.tree.sessions)} sessions")
        log("starting SeaweedFS ...")
        self.sw = start_seaweed(self.work / "seaweed")
        os.environ.update(self.sw.env())  # for the store this process opens itself
        self.sw.create_bucket(BUCKET)
        self.proxy_a = TimedProxy(self.sw.endpoint)
        self.proxy_b = TimedProxy(self.sw.endpoint)
        log(f"SeaweedFS at {self.sw.endpoint}; proxies: A {self.proxy_a.endpoint}, "
            f"B {self.proxy_b.endpoint}")
        r = self.res
        r.notes.append(f"syncd under test: {git_describe()}")
        r.notes.append(f"load average (1 min) at start: {os.getloadavg()[0]:.2f}; other "
                       "work on the machine skews times")
        r.notes.append(f"content: {corpus.origin}")
        r.notes.append(f"A's tree: {self.tree.files} files, {fmt_mb(self.tree.bytes)}, "
                       f"{len(self.tree.sessions)} sessions, cwds under A's $HOME "
                       f"({self.home_a.name}); B's $HOME is {self.home_b.name}")

    def seed_a(self) -> None:
        self.a = self.start(A, self.args.intervals[0])
        t = time.monotonic()
        state = self.work / f"state-{A}"
        while shipped_files(state) < self.tree.files:
            if time.monotonic() - t > 600:
                raise RuntimeError("A did not ship its tree in 600 s")
            time.sleep(0.5)
        log(f"A: tree shipped ({time.monotonic() - t:.1f} s after ready)")
        self.settle(A)

    def settle(self, machine: str, quiet: float = 12.0, limit: float = 180.0) -> None:
        """Until ``machine`` has written no object for ``quiet`` s (its flushes are done)."""
        assert self.sw is not None
        last, since = bucket_stats(self.sw, BUCKET, f"{PREFIX}/machines/{machine}/"), \
            time.monotonic()
        deadline = since + limit
        while time.monotonic() < deadline:
            time.sleep(1)
            now = bucket_stats(self.sw, BUCKET, f"{PREFIX}/machines/{machine}/")
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since >= quiet:
                return
        log(f"{machine}: still writing after {limit:.0f} s")

    def first_import(self) -> None:
        """B starts following A: every session of A's arrives in B's tree."""
        assert self.proxy_b is not None
        res, interval = self.res, self.args.intervals[0]
        res.add(f"# 0. B starts following A ({len(self.tree.sessions)} sessions, "
                f"{fmt_mb(self.tree.bytes)}): its first import")
        self.take(B)
        peak = [0, 0, 0]   # daemon, children, both

        t0 = time.monotonic()
        self.b = self.start(B, interval)
        pid = self.b.proc.pid
        done = threading.Event()

        def sampler() -> None:
            while not done.is_set():
                own, kids = tree_rss(pid)
                peak[0], peak[1] = max(peak[0], own), max(peak[1], kids)
                peak[2] = max(peak[2], own + kids)
                time.sleep(0.2)

        st = threading.Thread(target=sampler, daemon=True)
        st.start()
        want = {p: (self.b_path(str(p.relative_to(self.tree.root)), cwd), count_lines(p))
                for p, _sid, cwd in self.tree.sessions}
        deadline = t0 + 900
        left = dict(want)
        while left and time.monotonic() < deadline:
            if self.b.proc.poll() is not None:
                raise RuntimeError(f"B exited: {self.log_text(self.b)[-2000:]}")
            for p, (bp, n) in list(left.items()):
                if bp.exists() and count_lines(bp) >= n:
                    del left[p]
            time.sleep(0.5)
        wall = time.monotonic() - t0
        reqs = self.take(B)
        # B ships what it imported (once, as imported): its flush is part of the import.
        self.settle(B)
        done.set()
        st.join()
        hwm = proc_mem(pid)["VmHWM"]
        misplaced = []
        for p in left:
            found = list(self.root_b.rglob(p.name))
            misplaced.append(f"{p.relative_to(self.tree.root)} -> "
                             f"{found[0].relative_to(self.root_b) if found else 'nowhere'}")
        log(f"B: first import {'done' if not left else 'INCOMPLETE'} in {wall:.1f} s; "
            f"peak RSS daemon {fmt_rss(hwm)} (VmHWM), workers {fmt_rss(peak[1])}")
        t = Tally.of(reqs, A, wall)
        res.add("0 first import, wall s (B's start to the last session in place)",
                f"{wall:.1f}")
        res.add("0 sessions in B's tree, in B's folders, whole",
                f"{len(want) - len(left)}/{len(want)}", target="all", met=not left)
        for m in misplaced[:5]:
            res.notes.append(f"first import: not where B's CLI would look: {m}")
        res.add("0 requests on A's prefix (HEAD / GET / LIST / PUT), MB downloaded",
                f"{' / '.join(str(t.counts[k]) for k in KINDS)}, {fmt_mb(t.body)}")
        res.add("0 B's peak RSS, import and its flush: daemon VmHWM / daemon + workers "
                "(sampled every 0.2 s)", f"{fmt_rss(hwm)} / {fmt_rss(peak[2])}",
                target="<= 80 MB", met=hwm <= TARGET_RSS)
        self.watch_paths = {sid: want[p][0] for p, sid, _ in self.tree.sessions}

    def idle(self) -> None:
        assert self.proxy_b is not None and self.b is not None
        secs = self.args.idle_seconds
        log(f"idle: A quiet, B following every {self.b.interval:g} s; counting for {secs:.0f} s")
        self.take(B)
        t0 = time.monotonic()
        time.sleep(secs)
        reqs = self.take(B)
        wall = time.monotonic() - t0
        self.idle_a = Tally.of(reqs, A, wall)
        self.idle_own = Tally.of(reqs, B, wall)
        self.idle_mem = proc_mem(self.b.proc.pid)
        log(f"  {self.idle_a.total} requests on A's prefix ({dict(self.idle_a.counts)}), "
            f"{self.idle_own.total} on B's own")

    def load(self, interval: float) -> Load:
        """10 sessions on A append 2 lines/s each; B follows every ``interval`` s."""
        assert self.a is not None and self.proxy_a is not None and self.proxy_b is not None
        if self.b is None or self.b.interval != interval:
            if self.b is not None:
                stop_process(self.b.proc)
            self.b = self.start(B, interval)
        b = self.b
        a = self.args
        quiet = default("follow_quiet")
        chosen = self.chosen
        watches = {sid: Watch(self.watch_paths[sid]) for _p, sid, _c in chosen}
        base = {sid: count_lines(p) for p, sid, _c in chosen}
        # B has the sessions as they are now before the clock starts.
        deadline = time.monotonic() + 2 * interval + quiet + 60
        while True:
            now = time.time()
            for w in watches.values():
                w.look(now)
            if all(watches[s].lines >= base[s] for s in base) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        behind = [s for s in base if watches[s].lines < base[s]]
        if behind:
            log(f"  B is behind A on {len(behind)} sessions before the load")
        log_from = len(self.log_text(b))
        appended: list[tuple[str, int, float]] = []   # (sid, line number, append time)
        lock = threading.Lock()
        stop = threading.Event()
        per_session = int(a.duration * RATE)
        start_at = time.time() + 0.5

        def writer(path: Path, sid: str, cwd: str, seed: float) -> None:
            wrng = random.Random(seed)
            phase = wrng.uniform(0, 1 / RATE)
            for i in range(per_session):
                delay = start_at + phase + i / RATE - time.time()
                if delay > 0:
                    time.sleep(delay)
                append_line(path, self.corpus.line(wrng, sid, cwd))
                t = time.time()
                with lock:
                    appended.append((sid, base[sid] + i + 1, t))

        def watcher() -> None:
            while not stop.is_set():
                now = time.time()
                for w in watches.values():
                    w.look(now)
                stop.wait(WATCH_EVERY)

        self.take(B)
        self.take(A)
        a_before = self.segments(A)
        cpu_b0, cpu_a0, w0 = proc_cpu(b.proc.pid), proc_cpu(self.a.proc.pid), time.monotonic()
        wt = threading.Thread(target=watcher)
        wt.start()
        threads = [threading.Thread(target=writer, args=(*s, self.rng.random())) for s in chosen]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        w1 = time.monotonic()
        cpu_b1, cpu_a1 = proc_cpu(b.proc.pid), proc_cpu(self.a.proc.pid)
        reqs = self.take(B)
        reqs_a = self.take(A)
        a_after = self.segments(A)
        log(f"load (follow_interval {interval:g} s): {len(appended)} lines appended on A; "
            "waiting for B ...")
        drain = time.monotonic() + 2 * interval + quiet + 60
        while time.monotonic() < drain:
            with lock:
                if all(watches[s].lines >= n for s, n, _ in appended):
                    break
            time.sleep(0.5)
        stop.set()
        wt.join()
        late = self.take(B)  # the drain's, for the polls' durations
        mem, mem_a = proc_mem(b.proc.pid), proc_mem(self.a.proc.pid)
        lags = [watches[s].seen[n] - t for s, n, t in appended if n in watches[s].seen]
        text = self.log_text(b)[log_from:]
        ld = Load(interval, lags, len(appended), len(appended) - len(lags),
                  text.count("left until quiet"), text.count("imported "),
                  (cpu_b1 - cpu_b0) / (w1 - w0) * 100, (cpu_a1 - cpu_a0) / (w1 - w0) * 100,
                  mem, mem_a, Tally.of(reqs, A, w1 - w0), Tally.of(reqs, B, w1 - w0),
                  Tally.of(reqs_a, B, w1 - w0) if a.both else None,
                  [p for p in polls(reqs + late, A) if any(r.method != "HEAD" for r in p)],
                  a_before, a_after)
        log(f"  lag p50 {pct(lags, 0.5):.1f} s, p99 {pct(lags, 0.99):.1f} s, max "
            f"{max(lags, default=float('nan')):.1f} s; {ld.missing} lines not seen; "
            f"{ld.imports} import log lines, {ld.waits} with sessions left until quiet")
        return ld

    def bytes_stored(self) -> None:
        """What each prefix holds for the imported sessions, from the segments' indexes."""
        assert self.sw is not None
        for m in (A, B):
            self.settle(m, quiet=15)
        store = open_store(f"s3://{BUCKET}/{PREFIX}", endpoint_url=self.sw.endpoint)
        per: dict[str, dict[str, list[int]]] = {}
        for m in (A, B):
            repo = Repository(store, m)
            tallies: dict[str, list[int]] = {}
            for key, size in repo.segments():
                for x in repo.read_index(key, size).extents:
                    other = B if m == A else A
                    if x.reason == imported_from(other):
                        k = "imported"
                    elif x.reason == merged_from(other):
                        k = "merged"
                    elif x.reason is not None and x.reason.startswith(IMPORTED_FROM):
                        k = "imported (other)"
                    elif x.path.startswith(b"projects/"):
                        k = "own projects/"
                    else:
                        k = "own other"
                    t = tallies.setdefault(k, [0, 0, 0])
                    t[0] += x.end - x.start
                    t[1] += x.clen
                    t[2] += 1
            per[m] = tallies
        self.per_prefix = per
        self.prefix_stats = {m: bucket_stats(self.sw, BUCKET, f"{PREFIX}/machines/{m}/")
                             for m in (A, B)}
        self.b_tree = sum(p.stat().st_size for p in (self.root_b / "projects").rglob("*")
                          if p.is_file())
        self.a_tree = sum(p.stat().st_size for p in (self.tree.root / "projects").rglob("*")
                          if p.is_file())

    def run_all(self) -> None:
        a = self.args
        self.setup()
        self.seed_a()
        self.chosen = self.rng.sample(self.tree.sessions, min(SESSIONS, len(self.tree.sessions)))
        self.first_import()
        self.idle()
        for interval in a.intervals:
            self.loads.append(self.load(interval))
        self.bytes_stored()
        assert self.b is not None and self.a is not None
        b_log = self.log_text(self.b)
        stop_process(self.b.proc)
        stop_process(self.a.proc)
        self.report(b_log)

    # -- the table ----------------------------------------------------------
    def report(self, b_log: str) -> None:
        res, a = self.res, self.args
        flush = default("flush_max_delay")
        quiet = default("follow_quiet")
        res.add(f"# 1. import lag: {SESSIONS} sessions x {RATE:g} lines/s on A for "
                f"{a.duration:.0f} s, A's syncd run with default flush settings; append on A "
                f"-> line in B's copy (B's files looked at every {WATCH_EVERY:g} s); "
                f"follow_quiet {quiet:g} s")
        for ld in self.loads:
            iv = f"interval {ld.interval:g} s"
            bound = ld.interval + flush
            p50, p99 = pct(ld.lags, 0.5), pct(ld.lags, 0.99)
            mx = max(ld.lags, default=float("nan"))
            res.add(f"1 [{iv}] lag p50 / p99 / max, s", f"{p50:.1f} / {p99:.1f} / {mx:.1f}",
                    target=f"max <= {bound:g} (interval + flush_max_delay)", met=mx <= bound)
            res.add(f"1 [{iv}] lines in B / appended on A",
                    f"{ld.appended - ld.missing}/{ld.appended}", target="all",
                    met=ld.missing == 0)
            res.add(f"1 [{iv}] B's imports / with sessions left until quiet (log lines)",
                    f"{ld.imports} / {ld.waits}")
            res.add(f"1 [{iv}] CPU during the load: B / A", f"{ld.cpu_b:.1f} % / {ld.cpu_a:.1f} %")
            if ld.reading:
                durs = [p[-1].t - p[0].t for p in ld.reading]
                gets = [sum(r.method == "GET" for r in p) for p in ld.reading]
                res.add(f"1 [{iv}] B's polls that read A: n, s each p50 / max, GETs each "
                        "first -> last",
                        f"{len(durs)}, {pct(durs, 0.5):.1f} / {max(durs):.1f}, "
                        f"{gets[0]} -> {gets[-1]}")
            res.add(f"1 [{iv}] A's segments when the appends start -> end",
                    f"{ld.a_before[0]} -> {ld.a_after[0]}")

        res.add(f"# 2. requests per hour by B on A's prefix (machines/{A}/), HEAD / GET / LIST "
                f"/ PUT; $ at PUT/LIST {PRICE['PUT']} and GET/HEAD {PRICE['GET']} per 1000")
        rows = [(f"idle ({self.idle_a.seconds:.0f} s, interval {self.loads[0].interval:g} s)"
                 if self.loads else f"idle ({self.idle_a.seconds:.0f} s)", self.idle_a,
                 self.idle_own)]
        rows += [(f"busy (interval {ld.interval:g} s)", ld.load, ld.own) for ld in self.loads]
        grown = {f"busy (interval {ld.interval:g} s)": ld.a_after[1] - ld.a_before[1]
                 for ld in self.loads}
        for label, t, own in rows:
            res.add(f"2 {label}: requests/h", f"{t.per_hour(t.total):.0f} ({t.kinds()})")
            res.add(f"2 {label}: $/h, $/30 days", f"{t.cost_per_hour():.5f}, "
                    f"{t.cost_per_hour() * 720:.3f}")
            res.add(f"2 {label}: MB/h downloaded from A's prefix",
                    f"{t.per_hour(t.body) / MB:.2f}")
            grew = grown.get(label)
            if grew is not None:
                res.add(f"2 {label}: MB downloaded / MB of segments A wrote meanwhile",
                        f"{t.body / MB:.2f} / {grew / MB:.2f}"
                        + (f" ({t.body / grew:.1f}x)" if grew else ""))
            res.add(f"2 {label}: B's requests/h on its own prefix",
                    f"{own.per_hour(own.total):.0f} ({own.kinds()})")
        for ld in self.loads:
            if ld.echo is not None:
                res.add(f"2 --both, busy (interval {ld.interval:g} s): A's requests/h on B's "
                        "prefix", f"{ld.echo.per_hour(ld.echo.total):.0f} ({ld.echo.kinds()})")

        res.add("# 3. B's daemon memory with follow on (/proc VmHWM, VmRSS)")
        res.add(f"3 after idle ({self.idle_a.seconds:.0f} s): peak / now",
                f"{fmt_rss(self.idle_mem['VmHWM'])} / {fmt_rss(self.idle_mem['VmRSS'])}",
                target="<= 80 MB", met=self.idle_mem["VmHWM"] <= TARGET_RSS)
        for ld in self.loads:
            res.add(f"3 after the load (interval {ld.interval:g} s): peak / now",
                    f"{fmt_rss(ld.mem['VmHWM'])} / {fmt_rss(ld.mem['VmRSS'])}",
                    target="<= 80 MB", met=ld.mem["VmHWM"] <= TARGET_RSS)
            if not a.both:
                res.add("3   beside it, A's daemon (same load, shipping it, not following): "
                        "peak / now",
                        f"{fmt_rss(ld.mem_a['VmHWM'])} / {fmt_rss(ld.mem_a['VmRSS'])}")

        res.add("# 4. bytes: B's prefix for the imported sessions vs A's, and echo")
        pa, pb = self.per_prefix[A], self.per_prefix[B]
        imp = pb.get("imported", [0, 0, 0])
        own_a = pa.get("own projects/", [0, 0, 0])
        res.add("4 A's tree projects/ at the end / B's tree projects/",
                f"{fmt_mb(self.a_tree)} / {fmt_mb(self.b_tree)}")
        res.add("4 A's prefix, projects/ extents: raw / stored (compressed)",
                f"{fmt_mb(own_a[0])} / {fmt_mb(own_a[1])} ({own_a[2]} extents)")
        res.add("4 B's prefix, extents imported from A: raw / stored",
                f"{fmt_mb(imp[0])} / {fmt_mb(imp[1])} ({imp[2]} extents)")
        res.add("4 B's raw imported bytes / B's tree bytes (each byte stored once)",
                f"{imp[0] / self.b_tree:.3f}" if self.b_tree else "-", target="1.00",
                met=self.b_tree > 0 and abs(imp[0] / self.b_tree - 1) < 0.005)
        res.add("4 B's stored / A's stored for the same sessions",
                f"{imp[1] / own_a[1]:.2f}" if own_a[1] else "-")
        for k in sorted(set(pb) - {"imported"}):
            res.add(f"4 B's prefix, other extents: {k}: raw / stored",
                    f"{fmt_mb(pb[k][0])} / {fmt_mb(pb[k][1])} ({pb[k][2]})")
        echo = sum(v[0] for k, v in pa.items() if not k.startswith("own"))
        res.add(f"4 bytes in A's prefix from B (echo{'; A follows B' if a.both else ''})",
                f"{echo} B", target="0", met=echo == 0)
        for m in (A, B):
            n, size = self.prefix_stats[m]
            res.add(f"4 machines/{m}/: objects, MB", f"{n}, {fmt_mb(size)}")
        warns = [ln for ln in b_log.splitlines() if "WARNING" in ln or "Warning" in ln]
        res.add("B's log: warning lines", str(len(warns)), target="0", met=not warns)
        for ln in warns[:3]:
            res.notes.append(f"B warned: {ln[:300]}")
        res.notes.append(f"load average (1 min) at the end: {os.getloadavg()[0]:.2f}")


def main() -> int:
    ap = bench_parser(__doc__, 50)
    ap.add_argument("--duration", type=float, default=None,
                    help="seconds of appends on A per load (default 180, quick 60)")
    ap.add_argument("--idle-seconds", type=float, default=None,
                    help="seconds of idle counting (default 300, quick 60)")
    ap.add_argument("--intervals", default="30,5",
                    help="follow_interval of B for each load, comma-separated (default 30,5)")
    ap.add_argument("--both", action="store_true", help="A follows B too")
    args = ap.parse_args()
    q = args.quick
    args.size_mb = args.size_mb or (10 if q else 50)
    args.duration = args.duration or (60.0 if q else 180.0)
    args.idle_seconds = args.idle_seconds or (60.0 if q else 300.0)
    args.intervals = [float(x) for x in args.intervals.split(",") if x.strip()]
    if not args.intervals:
        ap.error("--intervals needs at least one interval")
    return run_bench("follow", args, "syncd-bench-follow-", Bench)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""What a running syncd daemon costs in S3 requests (issue 26): idle, busy (10 sessions
appending 2 lines/s each, bench/core.py's latency load) and following two machines,
for two versions of syncd side by side (before: ``--old PATH``, after: this checkout).

Prints figures; asserts nothing. See bench/README.md, "Request cost".

    .venv/bin/python bench/cost.py --old /work/old-main            # a 10-minute window
    .venv/bin/python bench/cost.py --old /work/old-main --quick    # a 2-minute window

All six daemons (three roles, two versions) run at once against one SeaweedFS, each
through its own counting proxy (bench/restore.py's), each version in its own prefix;
the follower of a version follows that version's idle and busy machines. After a
warm-up (seeds shipped, the follower's first import done, then one compaction of each
machine that folds them) every request of the window is counted by kind and scaled to
30 days. The hourly jobs (compaction, the reconcile
scan's audit) fall outside a window shorter than an hour: one ``syncd compact`` per
machine after the window is counted (its GETs and HEADs, one per segment, scaled to an
hour's segments for a machine that wrote any) and added 720 times (30 days of hourly
runs), with the audit's two LISTs.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs

sys.path.insert(0, str(Path(__file__).resolve().parent))

from core import (  # core also puts the repo on sys.path, for syncd and tests
    MB,
    PROJECT_NAMES,
    REPO,
    SAMPLES,
    BenchBase,
    Tree,
    append_line,
    bench_parser,
    bucket_stats,
    build_main_tree,
    load_samples,
    log,
    render_table,
    run_bench,
    run_measured,
    synthetic_corpus,
    wait_ready,
)
from restore import CountingProxy, Req, is_list

BUCKET = "syncd"
SESSIONS = 10        # sessions the busy machine appends to
RATE = 2.0           # lines per second per session
MONTH = 30 * 86400.0
HOURLY = 30 * 24     # runs of an hourly job in 30 days
# S3 Standard, $ per 1000 requests (us-east-1); DELETE is free; storage $ per GB-month.
PRICE = {"PUT": 0.005, "LIST": 0.005, "GET": 0.0004, "HEAD": 0.0004, "DELETE": 0.0}
STORAGE = 0.023
ROLES = ("idle", "busy", "follow")


def kind(r: Req) -> str:
    if is_list(r):
        return "LIST"
    if r.method == "DELETE" or (r.method == "POST" and "delete" in parse_qs(
            r.query, keep_blank_values=True)):
        return "DELETE"
    if r.method in ("PUT", "POST"):  # POST: multipart steps, billed as PUTs
        return "PUT"
    return r.method


def dollars(counts: Counter[str], scale: float) -> float:
    return sum(PRICE.get(k, PRICE["PUT"]) * n for k, n in counts.items()) * scale / 1000


@dataclass
class Tally:
    seconds: float
    all: Counter[str] = field(default_factory=Counter)
    lease: Counter[str] = field(default_factory=Counter)

    @classmethod
    def of(cls, reqs: list[Req], seconds: float) -> Tally:
        t = cls(seconds)
        for r in reqs:
            k = kind(r)
            t.all[k] += 1
            if r.key.endswith("/lease.json"):
                t.lease[k] += 1
        return t


@dataclass
class Daemon:
    version: str
    role: str
    machine: str
    proxy: CountingProxy
    tree: Tree | None
    root: Path
    home: Path
    proc: object = None
    window: Tally | None = None
    hourly: Counter[str] = field(default_factory=Counter)


class Bench(BenchBase):
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        args.skip_peers = True
        super().__init__(args, work)
        self.versions = {"before": Path(args.old).resolve(), "after": REPO}
        self.daemons: list[Daemon] = []
        self.rows: list[tuple[str, ...]] = []
        self.notes: list[str] = []
        self.res = self  # type: ignore[assignment]  # run_bench prints res.table()

    def close(self) -> None:
        super().close()
        for d in self.daemons:
            d.proxy.close()

    def env(self, d: Daemon) -> dict[str, str]:
        env = {**self.base_env(), "PYTHONPATH": str(self.versions[d.version]),
               "HOME": str(d.home), "SYNCD_CONFIG": os.devnull,
               "SYNCD_SOURCE": str(d.root), "SYNCD_STORE": f"s3://{BUCKET}/{d.version}",
               "SYNCD_STATE_DIR": str(self.work / f"state-{d.machine}"),
               "SYNCD_MACHINE_ID": d.machine, "SYNCD_S3_ENDPOINT_URL": d.proxy.endpoint}
        if d.role == "follow":
            env["SYNCD_FOLLOW"] = f'["{d.version}-idle", "{d.version}-busy"]'
        return env

    def start(self, d: Daemon) -> None:
        err = self.logs / f"run-{d.machine}.err"
        notify = self.work / f"notify-{d.machine}.sock"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(str(notify))
        try:
            d.proc = self.procs.start([self.syncd, "run"],
                                      {**self.env(d), "NOTIFY_SOCKET": str(notify)},
                                      self.logs / f"run-{d.machine}.out", err)
            how = wait_ready(d.proc, err, sock, timeout=600)  # type: ignore[arg-type]
        finally:
            sock.close()
            notify.unlink()
        log(f"{d.machine}: up ({how})")

    def settle(self, quiet: float = 20.0, limit: float = 600.0) -> None:
        """Until no daemon has sent a PUT but its lease's, and no follower's tree has
        grown, for ``quiet`` s: seeds shipped, the followers' first imports done."""
        since, deadline = time.monotonic(), time.monotonic() + limit
        files: dict[str, int] = {}
        while time.monotonic() < deadline:
            time.sleep(1)
            now = {d.machine: sum(1 for _ in d.root.rglob("*.jsonl"))
                   for d in self.daemons if d.role == "follow"}
            busy = any(kind(r) == "PUT" and not r.key.endswith("/lease.json")
                       for d in self.daemons for r in d.proxy.take())
            if busy or now != files or not all(now.values()):
                files, since = now, time.monotonic()
            elif time.monotonic() - since >= quiet:
                return
        log(f"still busy after {limit:.0f} s; measuring anyway")

    def run_all(self) -> None:
        a = self.args
        corpus = None if a.synthetic else load_samples(SAMPLES)
        corpus = corpus or synthetic_corpus(self.rng)
        from tests.seaweed import start_seaweed
        self.sw = start_seaweed(self.work / "seaweed")
        os.environ.update(self.sw.env())
        self.sw.create_bucket(BUCKET)
        for version in self.versions:
            for role in ROLES:
                home = self.work / f"home-{version}-{role}"
                for n in PROJECT_NAMES:
                    (home / "src" / n).mkdir(parents=True)
                root = self.work / f"claude-{version}-{role}"
                tree = None
                if role == "follow":
                    root.mkdir()
                else:
                    tree = build_main_tree(root, corpus, self.rng, a.size_mb * MB,
                                           home=str(home))
                self.daemons.append(Daemon(version, role, f"{version}-{role}",
                                           CountingProxy(self.sw.endpoint), tree, root, home))
        log(f"trees of {a.size_mb} MB; content: {corpus.origin}")
        for d in self.daemons:  # the followed machines first: their seeds are followed
            if d.role != "follow":
                self.start(d)
        for d in self.daemons:
            if d.role == "follow":
                self.start(d)
        self.settle()
        for d in self.daemons:  # the seeds and first imports folded: not an hour's work
            run_measured(self.procs, [self.syncd, "compact"], self.env(d), self.logs,
                         f"compact-first-{d.machine}")
            d.proxy.take()
        stop = threading.Event()
        appenders = [threading.Thread(target=self.append, args=(d, stop), daemon=True)
                     for d in self.daemons if d.role == "busy"]
        log(f"window: {a.seconds:.0f} s, busy machines appending "
            f"{SESSIONS} x {RATE:g} lines/s")
        t0, load0 = time.monotonic(), os.getloadavg()[0]
        for t in appenders:
            t.start()
        time.sleep(a.seconds)  # the window itself: the figures are per second of it
        seconds = time.monotonic() - t0
        for d in self.daemons:
            reqs = d.proxy.take()
            d.window = Tally.of(reqs, seconds)
            with open(self.logs / f"requests-{d.machine}.txt", "w") as f:
                f.writelines(f"{r.method} {r.key}?{r.query} {r.status}\n" for r in reqs)
            log(f"{d.machine}: {dict(d.window.all)}; lease {dict(d.window.lease)}")
        stop.set()
        for t in appenders:
            t.join()
        self.procs.stop_all()
        for d in self.daemons:
            d.proxy.take()  # the stops' own requests
            self.hourly_jobs(d, seconds)
        self.report(seconds, load0)

    def append(self, d: Daemon, stop: threading.Event) -> None:
        assert d.tree is not None
        sessions = d.tree.sessions[:SESSIONS]
        rng, n = self.rng, 0
        lines = [ln.encode() for ln in self.args.lines]
        start = time.monotonic()
        while not stop.is_set():
            for p, _sid, _cwd in sessions:
                append_line(p, rng.choice(lines))
            n += 1
            stop.wait(max(0.0, start + n / RATE - time.monotonic()))

    def hourly_jobs(self, d: Daemon, seconds: float) -> None:
        """One compaction of the machine, as its hourly job runs it, and the reconcile
        audit's two LISTs. A compaction reads each new segment (a GET or HEAD each): one
        after a window of ``seconds`` that wrote segments has its GETs and HEADs scaled
        to an hour's segments."""
        env = self.env(d)
        run_measured(self.procs, [self.syncd, "compact"], env, self.logs,
                     f"compact-{d.machine}")
        d.hourly = Counter(kind(r) for r in d.proxy.take())
        assert d.window is not None
        if d.window.all["PUT"] > d.window.lease["PUT"]:
            for k in ("GET", "HEAD"):
                d.hourly[k] = round(d.hourly[k] * max(1.0, 3600 / seconds))
        d.hourly["LIST"] += 2
        log(f"{d.machine}: hourly jobs {dict(d.hourly)}")

    def report(self, seconds: float, load0: float) -> None:
        scale = MONTH / seconds
        rows: list[tuple[str, ...]] = []
        for role in ROLES:
            for version in self.versions:
                d = next(x for x in self.daemons if x.role == role and x.version == version)
                w = d.window
                assert w is not None
                per_h = 3600 / seconds
                cost = dollars(w.all, scale) + dollars(d.hourly, HOURLY)
                lease = dollars(w.lease, scale)
                jobs = dollars(d.hourly, HOURLY)
                pl = (w.all["PUT"] + w.all["LIST"]) * per_h + d.hourly["PUT"] + \
                    d.hourly["LIST"]
                gh = (w.all["GET"] + w.all["HEAD"]) * per_h + d.hourly["GET"] + \
                    d.hourly["HEAD"]
                rows.append((role, version, f"{pl:.0f}", f"{gh:.0f}",
                             f"{w.lease['PUT'] * per_h:.0f}", f"{cost:.3f}",
                             f"{100 * lease / cost:.0f} %" if cost else "-", f"${jobs:.3f}"))
        self.rows = rows
        for version in self.versions:
            n, size = bucket_stats(self.sw, BUCKET, f"{version}/")  # type: ignore[arg-type]
            self.notes.append(f"{version}: {n} objects, {size / MB:.1f} MB stored at the end "
                              f"(${size / 1e9 * STORAGE:.4f} per month at ${STORAGE}/GB)")
        self.notes.append(f"window {seconds:.0f} s, scaled to 30 days; load average "
                          f"(1 min) at its start {load0:.2f}; {os.cpu_count()} CPUs")
        self.notes.append("hourly jobs: one `syncd compact` per machine after the window "
                          "(GET/HEAD scaled to an hour of segments) plus the audit's "
                          "2 LISTs, counted 720 times")
        self.notes.append(f"before: {self.versions['before']}; after: {REPO}")

    def table(self) -> str:
        head = ("daemon", "version", "PUT+LIST / h", "GET+HEAD / h", "lease PUT / h",
                "$ / 30 d", "lease share", "hourly jobs $")
        return render_table(head, self.rows, self.notes)


def main() -> int:
    ap = bench_parser(__doc__ or "", 5)
    ap.add_argument("--old", required=True, help="checkout of the syncd to compare against")
    ap.add_argument("--seconds", type=float, default=None,
                    help="the counted window (default 600, quick 120)")
    args = ap.parse_args()
    args.size_mb = args.size_mb or (2 if args.quick else 5)
    args.seconds = args.seconds or (120.0 if args.quick else 600.0)
    args.lines = [f'{{"type":"user","message":{{"role":"user","content":"line {i} '
                  f'{"x" * 400}"}}}}\n' for i in range(50)]

    return run_bench("cost", args, "syncd-cost-", Bench)


if __name__ == "__main__":
    sys.exit(main())

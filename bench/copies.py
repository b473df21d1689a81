#!/usr/bin/env python3
"""Copies: what a rewritten or moved transcript costs the store, today vs a baseline.

Prints figures; asserts nothing. See bench/README.md ("Copies") for what each means.

    .venv/bin/python bench/copies.py                  # full run: 20 MB transcript, 200 MB seed tree
    .venv/bin/python bench/copies.py --quick          # smoke run: 4 MB transcript, 20 MB seed tree
    .venv/bin/python bench/copies.py --skip-peers     # no restic

The baseline is another checkout of syncd (``--baseline``, default ../old-main), run with
the same interpreter and ``PYTHONPATH`` pointing at it. Stores are ``file://``.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from core import (
    MB,
    REPO,
    SAMPLES,
    BenchBase,
    Corpus,
    Run,
    Tree,
    bench_parser,
    build_main_tree,
    git_describe,
    load_samples,
    log,
    proc_cpu,
    proc_mem,
    rand_uuid,
    render_table,
    run_in,
    run_measured,
    sanitize,
    stop_process,
    synthetic_corpus,
    wait_ready,
    workdir,
)

from syncd.store import layout  # core put this checkout first on the path

KB = 1000
MACHINE = "bench-copies"


def store_stats(store: Path) -> tuple[int, int]:
    """(objects, bytes) of a ``file://`` store."""
    n = size = 0
    for f in store.rglob("*"):
        if f.is_file():
            n += 1
            size += f.stat().st_size
    return n, size


def fmt_b(n: float) -> str:
    if abs(n) >= MB:
        return f"{n / MB:.2f} MB"
    if abs(n) >= KB:
        return f"{n / KB:.1f} kB"
    return f"{n:.0f} B"


def line_starts(data: bytes) -> list[int]:
    out = [0]
    at = data.find(b"\n")
    while at != -1 and at + 1 < len(data):
        out.append(at + 1)
        at = data.find(b"\n", at + 1)
    return out


def rewrite_in_place(path: Path, data: bytes, at: int = 0) -> None:
    """Write ``data`` from ``at`` and cut the file after it: the same inode, as Claude
    rewrites a transcript in place."""
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(data[at:] if at else data)
        f.truncate(len(data))


@dataclass
class Big:
    """The big transcript: its path relative to the tree, session id, cwd."""

    rel: str
    sid: str
    cwd: str


@dataclass
class Change:
    """What a case did to the tree: the bytes it wrote anew (``new``) and a description."""

    new: int
    what: str


@dataclass
class Shipped:
    grew: int
    objects: int
    run: Run
    restored_ok: bool | None = None


class Bench(BenchBase):
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        super().__init__(args, work)
        self.py = sys.executable
        self.baseline = args.baseline.resolve()
        self.codes = {"today": REPO, "baseline": self.baseline}
        self.rows: list[tuple[str, ...]] = []
        self.notes: list[str] = []

    # -- running syncd ------------------------------------------------------

    def env(self, code: str, root: Path, name: str) -> dict[str, str]:
        """An isolated run: its own HOME, Claude dir, state dir and store."""
        home = self.work / f"home-{name}"
        home.mkdir(exist_ok=True)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SYNCD_", "RESTIC_", "AWS_", "CLAUDE_"))}
        env.update({
            "PYTHONPATH": str(self.codes[code]),
            # Bytecode out of the checkouts (the baseline is read-only).
            "PYTHONPYCACHEPREFIX": str(self.work / f"pycache-{code}"),
            "HOME": str(home), "CLAUDE_CONFIG_DIR": str(root), "SYNCD_SOURCE": str(root),
            "SYNCD_STATE_DIR": str(self.work / f"state-{name}"),
            "SYNCD_STORE": (self.work / f"store-{name}").as_uri(),
            "SYNCD_MACHINE_ID": MACHINE, "SYNCD_CONFIG": os.devnull})
        return env

    def cli(self, code: str, args: list[str], env: dict[str, str], name: str) -> Run:
        return run_measured(self.procs, [self.py, "-m", "syncd", *args], env, self.logs, name)

    def check_codes(self) -> None:
        for code, path in self.codes.items():
            env = self.env(code, self.work, f"probe-{code}")
            out = subprocess.run([self.py, "-c", "import syncd; print(syncd.__file__)"],
                                 env=env, capture_output=True, text=True, check=True).stdout
            if not out.strip().startswith(str(path)):
                raise SystemExit(f"bench: {code} imports syncd from {out.strip()}, not {path}")
        rev = subprocess.run(["git", "-C", str(self.baseline), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True).stdout.strip() or "unknown"
        self.notes.append(f"today: {git_describe()}; baseline: {self.baseline} "
                          f"(commit {rev})")

    # -- the tree -----------------------------------------------------------

    def build(self) -> None:
        a = self.args
        corpus = None if a.synthetic else load_samples(SAMPLES)
        self.corpus: Corpus = corpus or synthetic_corpus(self.rng)
        self.notes.append(f"content: {self.corpus.origin}")
        root = self.work / "pristine"
        log(f"generating the tree: a {a.big_mb} MB transcript and {a.others_mb} MB of others")
        tree: Tree = build_main_tree(root, self.corpus, self.rng, a.others_mb * MB)
        cwd = "/home/dev/src/big-project"
        sid = rand_uuid(self.rng)
        proj = f"projects/{sanitize(cwd)}"
        rel = f"{proj}/{sid}.jsonl"
        (root / proj / sid / "subagents").mkdir(parents=True)
        (root / rel).write_bytes(self.corpus.session(self.rng, sid, cwd, a.big_mb * MB))
        for k in range(2):
            (root / proj / sid / "subagents" / f"agent-a{k:07x}.jsonl").write_bytes(
                self.corpus.session(self.rng, sid, cwd, 150 * KB))
        self.big = Big(rel, sid, cwd)
        self.big_size = (root / rel).stat().st_size
        files = [f for f in root.rglob("*") if f.is_file()]
        self.notes.append(f"tree: {len(files)} files, {fmt_b(sum(f.stat().st_size for f in files))}"
                          f"; the big transcript {fmt_b(self.big_size)} "
                          f"({len(line_starts((root / rel).read_bytes()))} lines) with 2 "
                          f"subagents of ~150 kB; {len(tree.sessions)} other sessions")
        self.pristine = root

    # -- the cases ----------------------------------------------------------

    def cut_tail(self, root: Path, rng: random.Random) -> Change:
        p = root / self.big.rel
        data = p.read_bytes()
        starts = line_starts(data)
        tail = self.args.tail_kb * KB
        at = min(starts, key=lambda s: abs(len(data) - tail - s))
        # Lines are long (tool results): the cut falls at the line start nearest the
        # tail's size before the end, and new lines of about that size follow it.
        new = fill(self.corpus.session(rng, self.big.sid, self.big.cwd, 20 * tail),
                   tail)
        rewrite_in_place(p, data[:at] + new, at)
        return Change(len(new), f"cut at {at} ({fmt_b(len(data) - at)} before the end), "
                                f"{fmt_b(len(new))} of new lines written from there in place")

    def middle_row(self, root: Path, rng: random.Random) -> Change:
        p = root / self.big.rel
        data = p.read_bytes()
        starts = line_starts(data)
        k = len(starts) // 2
        while data.count(data[starts[k]:starts[k + 1]]) != 1:
            k += 1
        a, b = starts[k], starts[k + 1]
        rewrite_in_place(p, data[:a] + data[b:])
        return Change(0, f"line {k} of {len(starts)} ({fmt_b(b - a)}) removed, the file "
                         f"rewritten in place")

    def headless_gc(self, root: Path, rng: random.Random) -> Change:
        p = root / self.big.rel
        data = p.read_bytes()
        starts = [*line_starts(data), len(data)]
        # The first line stays (the session's head); 10 % of the others go.
        gone = set(rng.sample(range(1, len(starts) - 1), (len(starts) - 1) // 10))
        kept = b"".join(data[starts[i]:starts[i + 1]] for i in range(len(starts) - 1)
                        if i not in gone)
        tmp = p.with_name(p.name + f".compact.tmp.{rng.getrandbits(32):08x}")
        tmp.write_bytes(kept)
        os.rename(tmp, p)
        return Change(0, f"{len(gone)} of {len(starts) - 1} lines dropped "
                         f"({fmt_b(len(data) - len(kept))}), a new file renamed over it")

    def move(self, root: Path, rng: random.Random) -> Change:
        cwd = "/home/dev/src/moved-here"
        dest = root / "projects" / sanitize(cwd)
        dest.mkdir(parents=True, exist_ok=True)
        src = root / self.big.rel
        os.rename(src, dest / src.name)
        os.rename(src.with_suffix(""), dest / self.big.sid)
        line = json.dumps({"type": "relocated", "sessionId": self.big.sid,
                           "relocatedCwd": cwd}, separators=(",", ":")).encode() + b"\n"
        with open(dest / src.name, "ab") as f:
            f.write(line)
        return Change(len(line), f"{self.big.sid}.jsonl and {self.big.sid}/ renamed into "
                                 f"projects/{sanitize(cwd)}/, a relocated line appended")

    def append(self, root: Path, rng: random.Random) -> Change:
        line = self.corpus.line(rng, self.big.sid, self.big.cwd)
        with open(root / self.big.rel, "ab") as f:
            f.write(line)
        return Change(len(line), f"one line of {fmt_b(len(line))} appended")

    # -- measuring ----------------------------------------------------------

    def seeded(self, code: str, name: str, what: str) -> tuple[Path, dict[str, str], Path]:
        """A copy of the pristine tree synced once by ``code``: its root, env and store."""
        root = self.work / f"tree-{name}"
        shutil.copytree(self.pristine, root)
        env = self.env(code, root, name)
        log(f"{what}: seed ...")
        self.cli(code, ["sync"], env, f"{name}-seed")
        return root, env, self.work / f"store-{name}"

    def ship(self, code: str, case: str, change: Callable[[Path, random.Random], Change]
             ) -> tuple[Change, Shipped]:
        name = f"{case}-{code}"
        root, env, store = self.seeded(code, name, f"{case} [{code}]")
        ch = change(root, random.Random(f"{self.args.seed}:{case}"))
        n0, s0 = store_stats(store)
        r = self.cli(code, ["sync"], env, f"{name}-sync")
        n1, s1 = store_stats(store)
        shipped = Shipped(s1 - s0, n1 - n0, r)
        log(f"  +{s1 - s0} bytes, +{n1 - n0} objects, {r.wall:.2f} s")
        if code == "today":
            out = self.work / f"restored-{name}"
            self.cli(code, ["restore", "--machine", MACHINE, "--to", str(out)], env,
                       f"{name}-restore")
            shipped.restored_ok = same_tree(root, out)
            shutil.rmtree(out)
        for d in (root, store, self.work / f"state-{name}"):
            shutil.rmtree(d)
        return ch, shipped

    def ship_daemon(self, case: str, change: Callable[[Path, random.Random], Change]
                    ) -> Shipped:
        """The same change made while ``syncd run`` (today's) is up after the seed: the
        daemon's own flush ships it (time: from the change to its segment in the store)."""
        code, name = "today", f"{case}-daemon"
        root, env, store = self.seeded(code, name, f"{case} [today, daemon]")
        st = json.loads(subprocess.run([self.py, "-m", "syncd", "status", "--json"], env=env,
                                       check=True, capture_output=True, text=True).stdout)
        seg = store / layout.segment_key(MACHINE, int(st["next_seq"]))
        notify = self.work / f"notify-{name}"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(str(notify))
        err = self.logs / f"{name}-run.err"
        d = self.procs.start([self.py, "-m", "syncd", "run"], {**env, "NOTIFY_SOCKET": str(notify)},
                             self.logs / f"{name}-run.out", err)
        try:
            wait_ready(d, err, sock)
            # A daemon that has flushed before: one ~1 kB line to another session first.
            other = next(p for p in sorted((root / "projects").rglob("*.jsonl"))
                         if self.big.sid not in str(p))
            with open(other, "ab") as f:
                f.write(self.corpus.line(random.Random(0), other.stem, self.big.cwd))
            wait_for(seg, d, err, time.monotonic() + 120)
            settle(store, time.monotonic() + 10)
            seg = seg.with_name(f"{int(seg.name, 16) + 1:016x}")
            n0, s0 = store_stats(store)
            cpu0 = proc_cpu(d.pid)
            t = time.monotonic()
            change(root, random.Random(f"{self.args.seed}:{case}"))
            wait_for(seg, d, err, t + 120)
            wall = time.monotonic() - t
            last = settle(store, t + 120)
            cpu = proc_cpu(d.pid) - cpu0
            peak = proc_mem(d.pid)["VmHWM"]
        finally:
            stop_process(d)
            sock.close()
        n1, s1 = last
        shipped = Shipped(s1 - s0, n1 - n0, Run(0, wall, peak, cpu, "", ""))
        log(f"  +{s1 - s0} bytes, +{n1 - n0} objects, {wall:.2f} s")
        out = self.work / f"restored-{name}"
        self.cli(code, ["restore", "--machine", MACHINE, "--to", str(out)], env,
                 f"{name}-restore")
        shipped.restored_ok = same_tree(root, out)
        for x in (out, root, store, self.work / f"state-{name}"):
            shutil.rmtree(x)
        return shipped

    def restic_growth(self, case: str, change: Callable[[Path, random.Random], Change]
                      ) -> tuple[int, float]:
        root = self.work / f"tree-{case}-restic"
        shutil.copytree(self.pristine, root)
        repo = self.work / f"restic-{case}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("RESTIC_")}
        env.update({"RESTIC_REPOSITORY": str(repo), "RESTIC_PASSWORD": "bench-password",
                    "RESTIC_CACHE_DIR": str(self.work / "restic-cache")})
        backup = [self.restic, "backup", "--compression", "auto", "--host", "bench", "--json",
                  str(root)]
        run_measured(self.procs, [self.restic, "init", "--repository-version", "2"], env,
                     self.logs, f"restic-init-{case}")
        run_measured(self.procs, backup, env, self.logs, f"restic-seed-{case}")
        change(root, random.Random(f"{self.args.seed}:{case}"))
        _, s0 = store_stats(repo)
        r = run_measured(self.procs, backup, env, self.logs, f"restic-{case}")
        _, s1 = store_stats(repo)
        shutil.rmtree(root)
        shutil.rmtree(repo)
        return s1 - s0, r.wall

    def cases(self) -> None:
        size = self.big_size
        tail = self.args.tail_kb * KB
        cases: list[tuple[str, str, Callable[[Path, random.Random], Change],
                          Callable[[Shipped, Change], tuple[str, bool]] | None]] = [
            ("cut", f"cut tail (last ~{fmt_b(tail)} rewritten in place)", self.cut_tail,
             lambda s, c: (f"<= {fmt_b(tail + 5 * KB)}", s.grew <= tail + 5 * KB)),
            ("middle", "one row removed in the middle (rewritten in place)", self.middle_row,
             lambda s, c: (f"<= 2 % ({fmt_b(0.02 * size)})", s.grew <= 0.02 * size)),
            ("gc", "headless GC (10 % of rows dropped, renamed over)", self.headless_gc, None),
            ("move", "moved to another project folder + relocated line", self.move, None),
            ("append", "plain append of one ~1 kB line", self.append, None),
        ]
        self.rows.append((f"# store growth and the `syncd sync` that ships the change; "
                          f"big transcript {fmt_b(size)}",))
        for case, title, change, target in cases:
            ch, now = self.ship("today", case, change)
            _, old = self.ship("baseline", case, change)
            dmn = self.ship_daemon(case, change)
            rs: tuple[int, float] = (0, 0.0)
            if self.peers:
                log(f"{case} [restic] ...")
                rs = self.restic_growth(case, change)
            tgt, met = target(now, ch) if target else ("", None)
            if case == "append":
                tgt, met = "= baseline (+-10 %)", abs(now.grew - old.grew) <= 0.1 * old.grew
            self.rows.append((f"# {title}: {ch.what}",))
            self.rows.append(("  store growth", fmt_b(now.grew), fmt_b(old.grew),
                              fmt_b(rs[0]) if self.peers else "", tgt,
                              "" if met is None else ("yes" if met else "NO")))
            self.rows.append(("  growth / file size", f"{100 * now.grew / size:.3f} %",
                              f"{100 * old.grew / size:.3f} %",
                              f"{100 * rs[0] / size:.3f} %" if self.peers else "", "", ""))
            self.rows.append(("  new objects", str(now.objects), str(old.objects), "", "", ""))
            self.rows.append(("  sync wall s (CPU s, peak RSS)",
                              f"{now.run.wall:.2f} ({now.run.cpu:.2f}, "
                              f"{now.run.maxrss / MB:.0f} MB)",
                              f"{old.run.wall:.2f} ({old.run.cpu:.2f}, "
                              f"{old.run.maxrss / MB:.0f} MB)",
                              f"{rs[1]:.2f}" if self.peers else "", "", ""))
            self.rows.append(("  restore (today) = the changed tree",
                              "yes" if now.restored_ok else "NO", "", "", "identical",
                              "yes" if now.restored_ok else "NO"))
            self.rows.append(("  daemon (flushed before): store growth", fmt_b(dmn.grew),
                              "", "", tgt if case != "append" else "",
                              "" if met is None or case == "append" else
                              ("yes" if target and target(dmn, ch)[1] else "NO")))
            self.rows.append(("  daemon: change to segment s (CPU s, VmHWM)",
                              f"{dmn.run.wall:.2f} ({dmn.run.cpu:.2f}, "
                              f"{dmn.run.maxrss / MB:.0f} MB)", "", "", "", ""))
            self.rows.append(("  daemon: restore = the changed tree",
                              "yes" if dmn.restored_ok else "NO", "", "", "identical",
                              "yes" if dmn.restored_ok else "NO"))

    def seed_speed(self) -> None:
        a = self.args
        root = self.work / "seed-tree"
        log(f"generating the {a.size_mb} MB seed tree ...")
        tree = build_main_tree(root, self.corpus, random.Random(a.seed + 1), a.size_mb * MB)
        mb = tree.bytes / MB
        runs: dict[str, list[Run]] = {"today": [], "baseline": []}
        for k in range(a.repeat):
            for code in ("today", "baseline"):
                name = f"seed{k}-{code}"
                log(f"seed speed [{code}] run {k + 1}/{a.repeat} ...")
                r = self.cli(code, ["sync"], self.env(code, root, name), name)
                runs[code].append(r)
                log(f"  {mb / r.wall:.1f} MB/s")
                shutil.rmtree(self.work / f"store-{name}")
                shutil.rmtree(self.work / f"state-{name}")
        shutil.rmtree(root)
        rate = {c: [mb / r.wall for r in rs] for c, rs in runs.items()}
        med = {c: statistics.median(v) for c, v in rate.items()}
        self.rows.append((f"# append-only speed: seed of a {mb:.0f} MB tree ({tree.files} files) "
                          f"into file://, median of {a.repeat} interleaved runs",))
        self.rows.append(("  seed MB/s (min-max)",
                          *(f"{med[c]:.1f} ({min(rate[c]):.1f}-{max(rate[c]):.1f})"
                            for c in ("today", "baseline")), "",
                          ">= 0.9 x baseline", "yes" if med["today"] >= 0.9 * med["baseline"]
                          else "NO"))
        self.rows.append(("  CPU s, median (min-max) / peak RSS, first run",
                          *(f"{statistics.median(r.cpu for r in runs[c]):.2f} "
                            f"({min(r.cpu for r in runs[c]):.2f}-"
                            f"{max(r.cpu for r in runs[c]):.2f}) / "
                            f"{runs[c][0].maxrss / MB:.0f} MB"
                            for c in ("today", "baseline")), "", "", ""))

    def run_all(self) -> None:
        # `python -m` puts the working directory first on the path: none of the checkouts.
        os.chdir(self.work)
        self.check_codes()
        self.notes.append(f"load average (1 min) at start: {os.getloadavg()[0]:.2f}; "
                          "other work on the machine skews times")
        self.build()
        if not self.args.skip_cases:
            self.cases()
        if not self.args.skip_seed:
            self.seed_speed()
        self.notes.append(f"load average (1 min) at the end: {os.getloadavg()[0]:.2f}")

    def table(self) -> str:
        head = ("figure", "today", "baseline", "restic", "target", "met")
        rows = [r if len(r) == len(head) else (r[0], "", "", "", "", "") for r in self.rows]
        return render_table(head, rows, self.notes)


def fill(pool: bytes, size: int) -> bytes:
    """Whole lines of ``pool``, in order, that fit in ``size`` bytes (skipping longer ones)."""
    out: list[bytes] = []
    left = size
    for line in pool.splitlines(keepends=True):
        if len(line) <= left:
            out.append(line)
            left -= len(line)
    return b"".join(out)


def wait_for(seg: Path, d: subprocess.Popen[bytes], err: Path, deadline: float) -> None:
    """Until the daemon's segment ``seg`` is in the store."""
    while not seg.exists():
        if time.monotonic() > deadline or d.poll() is not None:
            raise RuntimeError(f"no segment {seg.name} from the daemon: "
                               f"{err.read_text(errors='replace')[-2000:]}")
        time.sleep(0.05)


def settle(store: Path, deadline: float) -> tuple[int, int]:
    """The store's (objects, bytes) once unchanged for 2 s: whatever follows a segment
    (the head, when a session came or went)."""
    last, still = store_stats(store), time.monotonic()
    while time.monotonic() - still < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
        now = store_stats(store)
        if now != last:
            last, still = now, time.monotonic()
    return last


def same_tree(a: Path, b: Path) -> bool:
    """Every file under ``a`` is under ``b`` with the same bytes, and no other."""
    fa = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    fb = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    return fa == fb and all(filecmp.cmp(a / p, b / p, shallow=False) for p in fa)


def main() -> int:
    ap = bench_parser(__doc__, 200)
    ap.add_argument("--big-mb", type=int, default=None, help="the big transcript (default 20)")
    ap.add_argument("--others-mb", type=int, default=None,
                    help="the other sessions beside it (default 4)")
    ap.add_argument("--tail-kb", type=int, default=30, help="the cut tail's size (30)")
    ap.add_argument("--repeat", type=int, default=None, help="seed runs per code (3)")
    ap.add_argument("--skip-seed", action="store_true", help="no seed-speed figure")
    ap.add_argument("--skip-cases", action="store_true", help="the seed-speed figure only")
    ap.add_argument("--baseline", type=Path, default=REPO.parent / "old-main",
                    help="the baseline checkout (default ../old-main)")
    args = ap.parse_args()
    q = args.quick
    args.size_mb = args.size_mb or (20 if q else 200)
    args.big_mb = args.big_mb or (4 if q else 20)
    args.others_mb = args.others_mb or (2 if q else 4)
    args.repeat = max(1, args.repeat or (1 if q else 3))
    if not args.skip_peers and shutil.which("restic") is None:
        log("restic not on PATH: without it")
        args.skip_peers = True
    work = workdir(args, "syncd-copies-")
    bench = Bench(args, work)
    if run_in(work, args, bench.run_all, bench.close):
        print(f"syncd copies benchmark ({'quick' if q else 'full'} run, {os.cpu_count()} CPUs)")
        print(bench.table())
    return 0


if __name__ == "__main__":
    sys.exit(main())

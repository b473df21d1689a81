#!/usr/bin/env python3
"""Start-up figures (issue 26): what each command costs as a whole process, before and
after, beside restic's own.

    .venv/bin/python bench/startup.py                 # 200 MB tree, 10 runs a command
    .venv/bin/python bench/startup.py --quick         # 20 MB tree, 3 runs
    .venv/bin/python bench/startup.py --old /work/old-main --runs 10

A tree is backed up twice: into a file:// store (status, sessions, machines, snapshots
read it, with the backing-up machine's state) and into SeaweedFS (a one-session restore
from it, by a new machine: no state; restic's restore of the same session with an empty
cache beside it). ``before`` is the syncd at ``--old`` (PYTHONPATH), ``after`` this
checkout's; their runs are interleaved (before, after, before, …) so that the machine's
load weighs on both alike. Each figure: the median wall time of ``--runs`` whole
processes with (min-max), and the median CPU (user+sys). Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from core import (  # core also puts the repo on sys.path, for syncd and tests
    REPO,
    BenchBase,
    bench_parser,
    build_main_tree,
    fmt_mb,
    git_describe,
    load_samples,
    log,
    render_table,
    run_bench,
    synthetic_corpus,
)

from tests.seaweed import start_seaweed

MACHINE = "bench-main"
PREFIX = "startup"
# Targets of issue 26 (wall time, an idle machine).
TARGETS = {"--help": 0.12, "status": 0.2, "sessions": 0.25}
# The one session restored: the one nearest this size (the was 460 kB).
ONE_SESSION = 460_000


@dataclass
class Table:
    rows: list[tuple[str, ...]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def table(self) -> str:
        return render_table(("command (whole process)", "before wall s", "before CPU s",
                             "after wall s", "after CPU s", "target", "met"),
                            self.rows, self.notes)


class Bench(BenchBase):
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        super().__init__(args, work)
        self.res: Table = Table()  # type: ignore[assignment]
        self.rows, self.notes = self.res.rows, self.res.notes
        self.n = 0
        self.last = work  # the last restore's target

    # -- environments -------------------------------------------------------
    def env(self, variant: str, **extra: str) -> dict[str, str]:
        env = self.base_env()
        env["PYTHONPATH"] = str(REPO) if variant == "after" else str(self.args.old)
        # Bytecode kept per variant in the work dir, made by the warm-up run (an installed
        # syncd has its bytecode; a checkout whose .pyc cannot be written would compile).
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(self.work / f"pycache-{variant}")
        return {**env, "SYNCD_CONFIG": os.devnull, **extra}

    def local(self, variant: str) -> dict[str, str]:
        """The backing-up machine, on its file:// store (its state copied per variant)."""
        return self.env(variant, SYNCD_SOURCE=str(self.tree.root),
                        SYNCD_STORE=(self.work / "store").as_uri(),
                        SYNCD_STATE_DIR=str(self.work / f"state-{variant}"),
                        SYNCD_MACHINE_ID=MACHINE)

    def restorer(self, variant: str) -> dict[str, str]:
        """A new machine (fresh state) restoring from SeaweedFS."""
        assert self.sw is not None
        self.n += 1
        return self.env(variant, SYNCD_SOURCE=str(self.work / "restorer-claude"),
                        SYNCD_STORE=f"s3://syncd/{PREFIX}", SYNCD_S3_ENDPOINT_URL=self.sw.endpoint,
                        SYNCD_STATE_DIR=str(self.work / f"state-new-{self.n}"),
                        SYNCD_MACHINE_ID="bench-restorer")

    def restic_env(self, fresh_cache: bool) -> dict[str, str]:
        assert self.sw is not None
        self.n += 1
        cache = f"restic-cache-{self.n}" if fresh_cache else "restic-cache"
        return {**self.base_env(), "RESTIC_REPOSITORY": f"s3:{self.sw.endpoint}/restic",
                "RESTIC_PASSWORD": "bench-password", "RESTIC_CACHE_DIR": str(self.work / cache)}

    # -- one whole process ----------------------------------------------------
    def once(self, cmd: list[str], env: dict[str, str], ok: tuple[int, ...] = (0,)) -> \
            tuple[float, float]:
        """(wall, CPU) seconds of one process, its output thrown away."""
        t = time.monotonic()
        p = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.procs.live.append(p)
        assert p.stderr is not None
        err = p.stderr.read()
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.monotonic() - t
        p.returncode = os.waitstatus_to_exitcode(status)
        if p.returncode not in ok:
            raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}: {err[-2000:]!r}")
        return wall, ru.ru_utime + ru.ru_stime

    def setup(self) -> None:
        a = self.args
        corpus = None if a.synthetic else load_samples(REPO.parent / "shared" / "claude-samples")
        corpus = corpus or synthetic_corpus(self.rng)
        log(f"generating {a.size_mb} MB tree ...")
        self.tree = build_main_tree(self.work / "claude", corpus, self.rng, a.size_mb * 1_000_000)
        self.sw = start_seaweed(self.work / "seaweed")
        for b in ("syncd", "restic"):
            self.sw.create_bucket(b)
        log("backing up: syncd into file:// and SeaweedFS, restic into SeaweedFS ...")
        self.once([self.syncd, "sync"], self.local("after"))
        shutil.copytree(self.work / "state-after", self.work / "state-before")
        self.once([self.syncd, "sync"], {**self.restorer("after"),
                                         "SYNCD_SOURCE": str(self.tree.root),
                                         "SYNCD_MACHINE_ID": MACHINE})
        sizes = sorted((p.stat().st_size, sid, p) for p, sid, _ in self.tree.sessions)
        self.one = min(sizes, key=lambda s: abs(s[0] - ONE_SESSION))
        if self.peers:
            env = self.restic_env(fresh_cache=False)
            self.once([self.restic, "init", "--repository-version", "2"], env)
            self.once([self.restic, "backup", "--compression", "auto", "--host", "bench",
                       str(self.tree.root)], env)
        self.notes += [
            f"syncd after: {git_describe()}; before: {a.old}",
            f"tree: {self.tree.files} files, {fmt_mb(self.tree.bytes)}, "
            f"{len(self.tree.sessions)} sessions, one machine; content: {corpus.origin}",
            f"one session: {self.one[1]}, {self.one[0] / 1000:.0f} kB; syncd restores it "
            "with --machine --session --to into a fresh dir, a new machine each run (no "
            "state); restic restore latest --include its files, an empty cache each run",
            "restic snapshots: a warm cache (its second run on); restic 0.14 on the same "
            "SeaweedFS",
            f"{a.runs} runs each, interleaved; wall: median (min-max); CPU: median user+sys",
        ]

    def figure(self, what: str, make: Callable[[str], tuple[list[str], dict[str, str]]],
               target: float | None = None, ok: tuple[int, ...] = (0,)) -> float:
        variants = ["before", "after"] if self.args.old else ["after"]
        for v in variants:  # warm-up: bytecode, page cache
            self.once(*make(v), ok=ok)
        runs: dict[str, list[tuple[float, float]]] = {v: [] for v in variants}
        for _ in range(self.args.runs):
            for v in variants:
                runs[v].append(self.once(*make(v), ok=ok))
        cells = []
        for v in ("before", "after"):
            if v not in runs:
                cells += ["", ""]
                continue
            walls = [w for w, _ in runs[v]]
            cells += [f"{statistics.median(walls):.3f} ({min(walls):.3f}-{max(walls):.3f})",
                      f"{statistics.median(c for _, c in runs[v]):.3f}"]
        after = statistics.median(w for w, _ in runs["after"])
        met = "" if target is None else ("yes" if after <= target else "NO")
        self.rows.append((what, *cells, "" if target is None else f"<= {target:g}", met))
        log(f"{what}: " + "  ".join(cells))
        return after

    def restic_figure(self, what: str, cmd: list[str], fresh_cache: bool) -> float:
        self.once(cmd, self.restic_env(fresh_cache))
        runs = [self.once(cmd, self.restic_env(fresh_cache)) for _ in range(self.args.runs)]
        walls = [w for w, _ in runs]
        med = statistics.median(walls)
        self.rows.append((what, "", "", f"{med:.3f} ({min(walls):.3f}-{max(walls):.3f})",
                          f"{statistics.median(c for _, c in runs):.3f}", "", ""))
        log(f"{what}: {med:.3f}")
        return med

    def restored(self, who: str, target: Path) -> None:
        """Note what the last restore wrote: the session's files, or it restored nothing."""
        files = [p for p in target.rglob("*") if p.is_file()]
        if not any(p.name == f"{self.one[1]}.jsonl" and p.stat().st_size == self.one[0]
                   for p in files):
            raise RuntimeError(f"{who} did not restore session {self.one[1]} into {target}")
        self.notes.append(f"{who} restored {len(files)} files, "
                          f"{fmt_mb(sum(p.stat().st_size for p in files))}")

    def run_all(self) -> None:
        self.setup()
        self.notes.append(f"load average (1 min) at start: {os.getloadavg()[0]:.2f}")
        S = self.syncd
        for what, args, target, ok in (
                ("syncd --help", ["--help"], TARGETS["--help"], (0,)),
                ("syncd sessions --help", ["sessions", "--help"], None, (0,)),
                ("syncd restore --bogus (usage error)", ["restore", "--bogus"], None, (2,)),
                *((f"syncd {c} (file:// store)", [c], TARGETS.get(c), (0,))
                  for c in ("status", "sessions", "machines", "snapshots"))):
            def make(v: str, a: list[str] = args) -> tuple[list[str], dict[str, str]]:
                return [S, *a], self.local(v)

            self.figure(what, make, target, ok)
        sid = self.one[1]

        def restore(v: str) -> tuple[list[str], dict[str, str]]:
            self.n += 1
            self.last = self.work / f"one-{self.n}"
            return ([S, "restore", "--machine", MACHINE, "--session", sid, "--to",
                     str(self.last)], self.restorer(v))

        ours = self.figure("syncd restore --session (SeaweedFS, a new machine)", restore)
        self.restored("syncd", self.last)
        if self.peers:
            self.restic_figure("restic version", [self.restic, "version"], False)
            self.restic_figure("restic snapshots (SeaweedFS)", [self.restic, "snapshots"],
                               False)
            base = str(self.one[2])

            def restic_restore() -> list[str]:
                self.n += 1
                self.last = self.work / f"restic-one-{self.n}"
                return [self.restic, "restore", "latest", "--target", str(self.last),
                        "--include", base, "--include", base.removesuffix(".jsonl")]

            self.once(restic_restore(), self.restic_env(True))
            runs = [self.once(restic_restore(), self.restic_env(True))
                    for _ in range(self.args.runs)]
            self.restored("restic", self.last)
            walls = [w for w, _ in runs]
            theirs = statistics.median(walls)
            self.rows.append(("restic restore --include (the same session)", "", "",
                              f"{theirs:.3f} ({min(walls):.3f}-{max(walls):.3f})",
                              f"{statistics.median(c for _, c in runs):.3f}", "", ""))
            self.rows.append(("syncd / restic, one-session restore (after)",
                              "", "", f"{ours / theirs:.2f}x", "", "<= 0.5x",
                              "yes" if ours <= theirs / 2 else "NO"))
        self.notes.append(f"load average (1 min) at the end: {os.getloadavg()[0]:.2f}")


def main() -> int:
    ap = bench_parser(__doc__, 200)
    ap.add_argument("--runs", type=int, default=None, help="runs per figure (default 10)")
    ap.add_argument("--old", default="/work/old-main",
                    help="the syncd checkout to compare with (its PYTHONPATH); '' for none")
    args = ap.parse_args()
    args.size_mb = args.size_mb or (20 if args.quick else 200)
    args.runs = args.runs or (3 if args.quick else 10)
    args.old = Path(args.old) if args.old and (Path(args.old) / "syncd").is_dir() else None
    return run_bench("start-up", args, "syncd-startup-", Bench)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Compaction figures for syncd (packs, snapshots, retention), with restic beside it.

Prints figures; asserts nothing about timing. See bench/README.md for what each figure
means.

    .venv/bin/python bench/compact.py               # full run: 200 MB + 1 GB trees
    .venv/bin/python bench/compact.py --quick       # smoke run: 20 MB
    .venv/bin/python bench/compact.py --skip-peers  # syncd only

Progress goes to stderr, the final table to stdout. Everything (trees, SeaweedFS, restic
repo, state, restore targets) lives in one temporary directory, removed at the end. The
tree generator, SeaweedFS and process measurement come from bench/core.py, the counting
proxy and the table from bench/restore.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import zstandard
from core import (  # core also puts the repo on sys.path, for syncd and tests
    GNU_TIME,
    MB,
    BenchBase,
    Corpus,
    Procs,
    Run,
    append_line,
    bench_parser,
    bucket_stats,
    build_main_tree,
    fmt_mb,
    log,
    rand_uuid,
    run_bench,
    sanitize,
)
from restore import CountingProxy, Req, Results, fmt_kb, is_list, tree_files

from syncd.archive.compact import CompactOptions, CompactReport, compact
from syncd.archive.options import compact_options, policy_of
from syncd.archive.prune import PruneReport, prune
from syncd.backup.ship import Shipper
from syncd.backup.state import State
from syncd.claude import Selection
from syncd.config import Settings, load_settings
from syncd.format.segment import HEADER, TRAILER
from syncd.repository import Repository
from syncd.store import Store, layout, open_store

MACHINE = "bench-main"
BIG_MACHINE = "bench-big"
PREFIX = "bench"
BIG_PREFIX = "big"
DAY = 86400.0
HOUR = 3600.0
FLUSH_EVERY = 90.0          # simulated seconds between two flushes
AT_HOUR = 13.5              # figure 4 restores as of this simulated hour
BETWEEN_HOUR = 13 + 40 / 60  # and as of the flush nearest to this one (between compactions)
LATE_HOUR = 23.5            # and as of this one: the longest chain of deltas of the day
TARGET_BIG_WALL = 120.0     # s, figure 2
TARGET_BIG_RSS = 300 * MB   # figure 2 (GNU time reports KiB; compared in bytes)
TARGET_OBJECTS = 50         # figure 3
TARGET_READ_OBJECTS = 30    # figure 4
TARGET_GROWTH = 0.5         # figure 3: stored bytes per appended byte, every object counted
KINDS = ("seg", "pack", "snap", "delta", "other")


def fmt_s(x: float) -> str:
    return f"{x:.2f}"


def fmt_rss(n: int) -> str:
    return fmt_mb(n) if n >= 0 else "n/a (no GNU time)"


def iso_utc(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def hhmm(t: float, day: float) -> str:
    """Simulated time as hours:minutes:seconds since the start of the simulated day."""
    s = round(t - day)
    return f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def kind_of(key: str) -> str:
    """seg / pack / snap / delta / other, for a key under ``machines/<id>/``."""
    part = key.split("/")[2] if key.count("/") >= 3 else ""
    return part if part in KINDS else "other"


def by_kind(counts: dict[str, int]) -> str:
    return " / ".join(str(counts.get(k, 0)) for k in KINDS)


def wrote(rep: CompactReport | None) -> str:
    """What one compaction wrote, in a few words."""
    if rep is None:
        return "not run"
    if rep.snapshot is not None:
        return (f"a manifest ({rep.segments} segments, {len(rep.packs_written)} packs "
                "written)")
    return "a delta" if rep.delta is not None else rep.note or "nothing"


def run_rc(procs: Procs, cmd: list[str], env: dict[str, str], logs: Path, name: str) -> Run:
    """Like core.run_measured, but returns whatever the exit code (peak RSS from GNU time)."""
    out, err = logs / f"{name}.out", logs / f"{name}.err"
    rss_file = logs / f"{name}.maxrss"
    full = [GNU_TIME, "-q", "-o", str(rss_file), "-f", "%M", *cmd] if GNU_TIME else cmd
    t = time.monotonic()
    p = procs.start(full, env, out, err)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.monotonic() - t
    p.returncode = os.waitstatus_to_exitcode(status)
    maxrss = -1
    if GNU_TIME is not None:
        words = rss_file.read_text().split() if rss_file.exists() else []
        maxrss = int(words[-1]) * 1024 if words and words[-1].isdigit() else -1
    return Run(p.returncode, wall, maxrss, ru.ru_utime + ru.ru_stime,
               out.read_text(errors="replace"), err.read_text(errors="replace"))


class Failed(RuntimeError):
    """A command (syncd, restic) or a syncd call failed: the message has it and its error."""


@dataclass
class Flush:
    """One flush of the simulated day (the time of its segments), and the tree then."""

    time: float
    sizes: dict[str, int]   # rel path -> size; the tree is append-only, so a prefix


@dataclass
class AtRestore:
    """One ``syncd restore --at``: the flush expected, the run, what it read."""

    at: float
    flush: Flush
    run: Run
    keys: set[str]              # distinct keys GET
    by_kind: dict[str, int]     # those keys by kind
    reqs: list[Req]
    gets: int
    lists: int
    down: int                   # response body bytes
    ok: bool                    # the tree of ``flush``, byte for byte
    what: str


@dataclass
class Day:
    start: float
    appends: int = 0
    appended: int = 0
    new_sessions: int = 0
    history_lines: int = 0
    flushes: int = 0
    segment_bytes: int = 0
    flush_wall: float = 0.0
    compactions: list[CompactReport] = field(default_factory=list)
    compact_wall: list[float] = field(default_factory=list)
    objects_by_hour: list[int] = field(default_factory=list)
    written: list[tuple[int, str]] = field(default_factory=list)  # (hour, delta or manifest)
    flush_log: list[Flush] = field(default_factory=list)
    restic_runs: list[Run] = field(default_factory=list)
    prune: PruneReport | None = None
    prune_wall: float = 0.0


# ---------------------------------------------------------------------------
# The benchmark
# ---------------------------------------------------------------------------

class Bench(BenchBase):
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        super().__init__(args, work)
        self.res: Results = Results()  # syncd | restic | target columns
        self.proxy: CountingProxy | None = None
        self.day: Day | None = None

    # -- environments -------------------------------------------------------

    def syncd_env(self, source: Path, prefix: str, machine: str, state: str, *,
                  proxied: bool = False) -> dict[str, str]:
        assert self.sw is not None
        endpoint = self.sw.endpoint
        if proxied:
            assert self.proxy is not None
            endpoint = self.proxy.endpoint
        source.mkdir(exist_ok=True)
        return {**self.base_env(), "SYNCD_SOURCE": str(source),
                "SYNCD_STORE": f"s3://syncd/{prefix}",
                "SYNCD_STATE_DIR": str(self.work / f"state-{state}"),
                "SYNCD_MACHINE_ID": machine, "SYNCD_S3_ENDPOINT_URL": endpoint,
                "SYNCD_CONFIG": os.devnull}

    def main_env(self) -> dict[str, str]:
        return self.syncd_env(self.tree.root, PREFIX, MACHINE, "main")

    def restic_env(self) -> dict[str, str]:
        assert self.sw is not None
        return {**self.base_env(), "RESTIC_REPOSITORY": f"s3:{self.sw.endpoint}/restic",
                "RESTIC_PASSWORD": "bench-password",
                "RESTIC_CACHE_DIR": str(self.work / "restic-cache")}

    def run(self, cmd: list[str], env: dict[str, str], name: str) -> Run:
        """Run to completion; a non-zero exit is a failure naming the exact command."""
        r = run_rc(self.procs, cmd, env, self.logs, name)
        if r.rc != 0:
            shown = " ".join(Path(c).name if c == cmd[0] else c for c in cmd)
            raise Failed(f"`{shown}` exited {r.rc}: {r.err.strip()[-2000:]}")
        return r

    def machine_objects(self, prefix: str, machine: str) -> dict[str, list[int]]:
        """kind -> [objects, bytes] under ``<prefix>/machines/<machine>/``."""
        assert self.sw is not None
        out = {k: [0, 0] for k in KINDS}
        client = self.sw.client()  # type: ignore[no-untyped-call]
        pages = client.get_paginator("list_objects_v2").paginate(
            Bucket="syncd", Prefix=f"{prefix}/{layout.machine_prefix(machine)}")
        for page in pages:
            for o in page.get("Contents", []):
                k = kind_of(o["Key"].removeprefix(f"{prefix}/"))
                out[k][0] += 1
                out[k][1] += int(o["Size"])
        return out

    def main_repo(self) -> Repository:
        assert self.sw is not None
        return Repository(open_store(f"s3://syncd/{PREFIX}", endpoint_url=self.sw.endpoint),
                          MACHINE, None)

    def split(self, kind: str) -> tuple[int, int, int, int] | None:
        """(objects, frame bytes, index bytes, header and trailer bytes) of the figure 3
        machine's objects of one kind, from each one's trailer (None: there are none)."""
        repo = self.main_repo()
        keys = [(o.key, o.size) for o in repo.store.list(layout.machine_prefix(MACHINE))
                if layout.kind_of(o.key) == kind]
        if not keys:
            return None
        frames = index = 0
        for key, _ in keys:
            off, length = TRAILER.unpack(repo.read_range(key, -TRAILER.size))[:2]
            frames += off - HEADER.size
            index += length
        return len(keys), frames, index, len(keys) * (HEADER.size + TRAILER.size)

    def delta_index_parts(self) -> dict[str, int]:
        """Where the delta indexes' bytes go: each part of every delta index's JSON (data
        and delete entries; the paths the points name; the points themselves; the
        catalog: sessions, projects and what each point carries after its changes; the
        rest) compressed alone as the writer compresses an index."""
        repo = self.main_repo()
        zc = zstandard.ZstdCompressor(level=3)

        def size(part: Any) -> int:
            return len(zc.compress(json.dumps(part, separators=(",", ":")).encode()))

        out = dict.fromkeys(("entries", "paths", "points", "catalog", "rest"), 0)
        for _, _, key, _ in repo.deltas():
            off, length = TRAILER.unpack(repo.read_range(key, -TRAILER.size))[:2]
            doc = json.loads(zstandard.ZstdDecompressor().decompress(
                repo.read_range(key, off, length)))
            points = doc.pop("points", [])
            out["entries"] += size(doc.pop("entries", []))
            out["paths"] += size(doc.pop("paths", []))
            out["points"] += size([p[:3] for p in points])
            out["catalog"] += size([doc.pop("sessions", []), doc.pop("projects", {}),
                                    [p[3:] for p in points]])
            out["rest"] += size(doc)
        return out if any(out.values()) else {}

    # -- steps --------------------------------------------------------------
    def setup(self) -> None:
        a = self.args
        self.corpus: Corpus = self.start_tree_and_seaweed(a.size_mb, ("syncd", "restic"))
        assert self.sw is not None
        self.proxy = CountingProxy(self.sw.endpoint)
        log(f"SeaweedFS at {self.sw.endpoint}, counting proxy at {self.proxy.endpoint}")
        self.res.notes.append(f"tree (figures 1, 3-5): {self.tree.files} files, "
                              f"{fmt_mb(self.tree.bytes)}, {len(self.tree.sessions)} sessions")
        s = Settings.model_fields
        self.res.notes.append(
            f"syncd defaults: compact_level {s['compact_level'].default}, pack_target_bytes "
            f"{s['pack_target_bytes'].default >> 20} MiB, zstd_level (segments) "
            f"{s['zstd_level'].default}; retention keep_hourly {s['keep_hourly'].default}, "
            f"keep_daily {s['keep_daily'].default}, keep_weekly {s['keep_weekly'].default}, "
            f"keep_monthly {s['keep_monthly'].default}")

    # -- figure 1 -----------------------------------------------------------
    def fig1_stored(self) -> None:
        assert self.sw is not None
        res, tree = self.res, self.tree
        res.add(f"# 1. stored bytes after compaction: syncd sync of the {fmt_mb(tree.bytes)} "
                "tree, then syncd compact (restic: backup --compression auto, repo v2)")
        env = self.main_env()
        log("fig 1: syncd sync ...")
        s = self.run([self.syncd, "sync"], env, "syncd-sync")
        n0, b0 = bucket_stats(self.sw, "syncd", PREFIX + "/")
        log(f"  {s.wall:.1f}s, {fmt_mb(b0)} in {n0} objects")
        log("fig 1: syncd compact ...")
        c = self.run([self.syncd, "compact", "--json"], env, "syncd-compact")
        rep = json.loads(c.out)
        n1, b1 = bucket_stats(self.sw, "syncd", PREFIX + "/")
        self.fig1_after = (n1, b1)
        self.fig1_kinds = self.machine_objects(PREFIX, MACHINE)
        packs = rep["packs_written"]
        log(f"  {c.wall:.1f}s, {fmt_mb(b1)} in {n1} objects; {rep['segments']} segments "
            f"({fmt_mb(rep['segment_bytes'])}) -> {len(packs)} packs, "
            f"peak RSS {fmt_rss(c.maxrss)}")
        rs: dict[str, str] = {}
        restic_bytes = None
        if self.peers:
            log("fig 1: restic backup ...")
            renv = self.restic_env()
            self.run([self.restic, "init", "--repository-version", "2"], renv, "restic-init")
            r = self.run([self.restic, "backup", "--compression", "auto", "--host", "bench",
                          "--json", str(tree.root)], renv, "restic-backup")
            rn, restic_bytes = bucket_stats(self.sw, "restic")
            self.restic_after = (rn, restic_bytes)
            log(f"  {r.wall:.1f}s, {fmt_mb(restic_bytes)} in {rn} objects")
            rs = {"stored": f"{fmt_mb(restic_bytes)} (repo)", "objs": str(rn),
                  "seed": f"{fmt_s(r.wall)}, {fmt_s(r.cpu)}, {fmt_rss(r.maxrss)}",
                  "ratio": f"{tree.bytes / restic_bytes:.2f}"}
        res.add("1 stored bytes after compaction", fmt_mb(b1), rs.get("stored", ""),
                f"<= restic ({fmt_mb(restic_bytes)})" if restic_bytes else "<= restic",
                None if restic_bytes is None else b1 <= restic_bytes)
        res.add("1 stored bytes before compaction (segments)", fmt_mb(b0))
        res.add("1 ratio tree bytes / stored bytes (after)", f"{tree.bytes / b1:.2f}",
                rs.get("ratio", ""))
        res.add("1 objects before / after", f"{n0} / {n1}", rs.get("objs", ""))
        res.add("1 seed: wall s, CPU s, peak RSS (syncd sync; restic backup)",
                f"{fmt_s(s.wall)}, {fmt_s(s.cpu)}, {fmt_rss(s.maxrss)}", rs.get("seed", ""))
        res.add("1 compacted: segments (bytes) -> packs (bytes)",
                f"{rep['segments']} ({fmt_mb(rep['segment_bytes'])}) -> {len(packs)} "
                f"({fmt_mb(sum(p['size'] for p in packs))})")
        res.add("1 compaction wall time, s", fmt_s(c.wall))
        res.add("1 compaction CPU (user+sys), s", fmt_s(c.cpu))
        res.add("1 compaction peak RSS", fmt_rss(c.maxrss))
        res.add("1 compaction throughput, segment MB / wall s (raw MB / s)",
                f"{rep['segment_bytes'] / MB / c.wall:.1f} ({rep['raw_bytes'] / MB / c.wall:.1f})")

    # -- figure 2 -----------------------------------------------------------
    def fig2_big(self) -> None:
        assert self.sw is not None
        a, res = self.args, self.res
        if a.quick and a.compact_gb is None:
            # The figure 1 tree again, as another machine into its own prefix: figure 1's
            # store stays as it is for figure 3.
            tree, label = self.tree, "the figure 1 tree (--quick)"
            prefix, machine, state = "quick2", BIG_MACHINE, "big"
        else:
            size = int((a.compact_gb or 1.0) * 1000 * MB)
            log(f"fig 2: generating a {fmt_mb(size)} tree ...")
            tree = build_main_tree(self.work / "claude-big", self.corpus,
                                   random.Random(a.seed + 1), size)
            label = f"a {fmt_mb(tree.bytes)} tree"
            prefix, machine, state = BIG_PREFIX, BIG_MACHINE, "big"
        self.res.notes.append(f"tree (figure 2): {tree.files} files, {fmt_mb(tree.bytes)}, "
                              f"{len(tree.sessions)} sessions")
        env = self.syncd_env(tree.root, prefix, machine, state)
        log(f"fig 2: syncd sync of {fmt_mb(tree.bytes)} ...")
        s = self.run([self.syncd, "sync"], env, "syncd-sync-big")
        n0, b0 = bucket_stats(self.sw, "syncd", prefix + "/")
        log(f"  {s.wall:.1f}s, {fmt_mb(b0)} in {n0} objects")
        log("fig 2: syncd compact ...")
        c = self.run([self.syncd, "compact", "--json"], env, "syncd-compact-big")
        rep = json.loads(c.out)
        n1, b1 = bucket_stats(self.sw, "syncd", prefix + "/")
        log(f"  {c.wall:.1f}s, CPU {c.cpu:.1f}s, peak RSS {fmt_rss(c.maxrss)}; "
            f"{fmt_mb(b1)} in {n1} objects")
        res.add(f"# 2. compaction of the segments of {label}: syncd compact, fresh process")
        res.add("2 segments compacted: count, stored bytes",
                f"{rep['segments']}, {fmt_mb(rep['segment_bytes'])}")
        res.add("2 raw bytes those segments hold", fmt_mb(rep["raw_bytes"]))
        res.add("2 wall time, s", fmt_s(c.wall), target=f"<= {TARGET_BIG_WALL:g}",
                met=c.wall <= TARGET_BIG_WALL)
        res.add("2 peak RSS", fmt_rss(c.maxrss), target=f"<= {fmt_mb(TARGET_BIG_RSS)}",
                met=None if c.maxrss < 0 else c.maxrss <= TARGET_BIG_RSS)
        res.add("2 CPU (user+sys), s", fmt_s(c.cpu))
        res.add("2 throughput, segment MB / wall s (raw MB / s)",
                f"{rep['segment_bytes'] / MB / c.wall:.1f} ({rep['raw_bytes'] / MB / c.wall:.1f})")
        res.add("2 stored bytes before / after, objects before / after",
                f"{fmt_mb(b0)} / {fmt_mb(b1)}, {n0} / {n1}")
        if tree is not self.tree and not a.keep:
            shutil.rmtree(tree.root, ignore_errors=True)

    # -- figure 3 -----------------------------------------------------------
    def settings(self) -> Settings:
        assert self.sw is not None
        extra = {} if self.args.max_deltas is None else {"max_deltas": self.args.max_deltas}
        return load_settings(self.work / "no-config.toml", source=self.tree.root,
                             store=f"s3://syncd/{PREFIX}", machine_id=MACHINE,
                             state_dir=self.work / "state-main",
                             s3_endpoint_url=self.sw.endpoint, **extra)

    def sizes(self) -> dict[str, int]:
        return tree_files(self.tree.root)

    def append_one(self, sim: float, sessions: list[tuple[Path, str, str]]) -> str:
        """One append of the simulated day; returns the relative path it touched."""
        rng, corpus, root = self.rng, self.corpus, self.tree.root
        day = self.day
        assert day is not None
        x = rng.random()
        if x < 0.10:
            path, sid, cwd = rng.choice(sessions)
            line = (json.dumps({"display": rng.choice(corpus.prompts)[:500],
                                "pastedContents": {}, "timestamp": int(sim * 1000),
                                "project": cwd, "sessionId": sid},
                               separators=(",", ":")) + "\n").encode()
            path = root / "history.jsonl"
            day.history_lines += 1
        elif x < 0.13:
            cwd = rng.choice(sorted({c for _, _, c in sessions}))
            sid = rand_uuid(rng)
            path = root / "projects" / sanitize(cwd) / f"{sid}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
            sessions.append((path, sid, cwd))
            line = corpus.line(rng, sid, cwd)
            day.new_sessions += 1
        else:
            path, sid, cwd = rng.choice(sessions)
            line = corpus.line(rng, sid, cwd)
        append_line(path, line)
        day.appends += 1
        day.appended += len(line)
        return str(path.relative_to(root))

    def fig3_day(self) -> None:
        """In process: Shipper, compact and prune with a simulated clock, on the store that
        figure 1 compacted; restic backs up the same tree at every simulated hour."""
        assert self.sw is not None
        a = self.args
        settings = self.settings()
        store: Store = open_store(settings.store, endpoint_url=settings.s3_endpoint_url)
        state = State(settings.state_file)
        # The simulated day starts at the next UTC midnight: after figure 1's segments.
        start = math.ceil(time.time() / DAY) * DAY
        day = self.day = Day(start)
        clock = [start]
        shipper = Shipper(root=settings.source, repo=Repository(store, settings.machine_id),
                          state=state, selection=Selection(settings.include, settings.exclude),
                          level=settings.zstd_level, segment_max=settings.segment_max_bytes,
                          clock=lambda: clock[0])
        copts = compact_options(settings)
        policy = policy_of(settings)
        sessions = list(self.tree.sessions)
        # The tree as of each flush: every file's size, kept up to date as appends go.
        sizes = self.sizes()
        n_flush = int(DAY / FLUSH_EVERY)
        per_hour = int(HOUR / FLUSH_EVERY)
        gap = DAY / a.appends
        next_append = 0
        dirty: set[str] = set()
        log(f"fig 3: simulated day from {iso_utc(start)}: {a.appends} appends, a flush every "
            f"{FLUSH_EVERY:g} s, compaction every hour, prune at the end")
        try:
            for k in range(1, n_flush + 1):
                clock[0] = start + k * FLUSH_EVERY
                while next_append < a.appends and start + (next_append + 0.5) * gap \
                        <= clock[0]:
                    rel = self.append_one(start + (next_append + 0.5) * gap, sessions)
                    sizes[rel] = (self.tree.root / rel).stat().st_size
                    dirty.add(rel)
                    next_append += 1
                if dirty:
                    t = time.monotonic()
                    fr = shipper.ship(os.fsencode(p) for p in sorted(dirty))
                    day.flush_wall += time.monotonic() - t
                    if fr.problems:
                        raise Failed(f"Shipper.ship: problems {fr.problems}")
                    day.flushes += len(fr.segments)
                    day.segment_bytes += fr.stored_bytes
                    if fr.segments:  # the segments' time is the clock's at the flush
                        day.flush_log.append(Flush(clock[0], dict(sizes)))
                    dirty.clear()
                if k % per_hour == 0:
                    if sizes != self.sizes():
                        raise Failed(f"hour {k // per_hour}: the recorded tree is not the "
                                     "tree on disk")
                    # What the writer acknowledged by now: compaction folds no further.
                    copts.acknowledged = state.next_seq - 1
                    self.hourly(store, settings, copts, k // per_hour, clock[0])
            clock[0] = start + DAY
            copts.acknowledged = state.next_seq - 1
            log("fig 3: prune at the end of the day ...")
            t = time.monotonic()
            day.prune = prune(Repository(store, MACHINE, None), policy,
                              max_share=settings.prune_max_share,
                              opts=dataclasses.replace(copts, now=clock[0]))
            day.prune_wall = time.monotonic() - t
        finally:
            state.close()
        pr = day.prune
        comp = pr.compaction
        log(f"  policy {pr.policy}: {sum(v.keep for v in pr.verdicts)} kept, "
            f"{len(pr.forgotten)} forgotten, {len(pr.deferred)} deferred; "
            + (f"compaction: {comp.note or comp.snapshot}" if comp else "no compaction")
            + (f"; errors: {pr.errors}" if pr.errors else ""))
        self.fig3_rows(settings)

    def hourly(self, store: Store, settings: Settings, copts: CompactOptions, hour: int,
               now: float) -> None:
        day = self.day
        assert day is not None and self.sw is not None
        t = time.monotonic()
        try:
            rep = compact(Repository(store, MACHINE, None), dataclasses.replace(copts, now=now))
        except Exception as e:
            raise Failed(f"compact(Repository(store, {MACHINE!r}), CompactOptions(now="
                         f"{iso_utc(now)})) at simulated hour {hour}: "
                         f"{type(e).__name__}: {e}") from e
        day.compact_wall.append(time.monotonic() - t)
        day.compactions.append(rep)
        if rep.errors:
            log(f"  hour {hour}: compaction errors: {rep.errors}")
        wrote = rep.snapshot or rep.delta
        if wrote is not None:
            day.written.append((hour, wrote))
        objs = sum(1 for _ in store.list(layout.machine_prefix(MACHINE)))
        day.objects_by_hour.append(objs)
        what = ("a delta" if rep.delta else f"a manifest, {len(rep.packs_written)} packs "
                f"(merged {len(rep.packs_merged)})" if rep.snapshot else rep.note)
        msg = (f"  hour {hour:2d}: {rep.segments} segments -> {what}, "
               f"{day.compact_wall[-1]:.2f}s, {objs} objects")
        if self.peers:
            r = self.run([self.restic, "backup", "--compression", "auto", "--host", "bench",
                          "--json", str(self.tree.root)], self.restic_env(),
                         f"restic-hour{hour:02d}")
            day.restic_runs.append(r)
            msg += f"; restic backup {r.wall:.2f}s"
        log(msg)

    def fig3_rows(self, settings: Settings) -> None:
        assert self.sw is not None and self.day is not None
        day, res = self.day, self.res
        pr = day.prune
        assert pr is not None
        kinds = self.machine_objects(PREFIX, MACHINE)
        objs = sum(v[0] for v in kinds.values())
        stored = sum(v[1] for v in kinds.values())
        _, start_bytes = self.fig1_after
        rs: dict[str, str] = {}
        if self.peers:
            rn, rb = bucket_stats(self.sw, "restic")
            rn0, rb0 = self.restic_after
            walls = [r.wall for r in day.restic_runs]
            rs = {"objs": f"{rn} (bucket)", "bytes": f"{fmt_mb(rb)} (+{fmt_kb(rb - rb0)})",
                  "runs": f"{len(walls)} backups, {sum(walls):.1f} s "
                          f"(mean {sum(walls) / len(walls):.2f} s)",
                  "grow": f"+{rn - rn0} objects"}
            log(f"  restic: {rn} objects, {fmt_mb(rb)}")
        snaps_kept = sum(v.keep for v in pr.verdicts)
        res.add(f"# 3. a simulated day on the figure 1 store (in process, simulated clock): "
                f"{day.appends} appends over 24 h, a flush every {FLUSH_EVERY:g} s with "
                f"appends, compaction every hour, prune at the end (policy: {pr.policy}); "
                "restic: a backup every simulated hour")
        res.add("3 appended: lines (bytes); of which history / new sessions",
                f"{day.appends} ({fmt_kb(day.appended)}); {day.history_lines} / "
                f"{day.new_sessions}")
        res.add("3 flushes (segments written), segment bytes",
                f"{day.flushes}, {fmt_kb(day.segment_bytes)}")
        cw = day.compact_wall
        res.add("3 compactions, wall time each (mean / max), s",
                f"{len(cw)}, {sum(cw) / len(cw):.2f} / {max(cw):.2f}" if cw else "0",
                rs.get("runs", ""))
        res.add("3 what each compaction wrote: deltas / manifests",
                f"{sum(layout.kind_of(k) == 'delta' for _, k in day.written)} / "
                f"{sum(layout.kind_of(k) == 'snap' for _, k in day.written)}")
        res.add("3 objects under machines/<id>/ at the end of the day", str(objs),
                rs.get("objs", ""), f"<= {TARGET_OBJECTS}", objs <= TARGET_OBJECTS)
        res.add(f"3   by kind: {' / '.join(KINDS)}", " / ".join(str(kinds[k][0]) for k in KINDS))
        res.add(f"3   bytes: {' / '.join(KINDS)}", " / ".join(fmt_kb(kinds[k][1]) for k in KINDS))
        res.add("3 objects after each hourly compaction (min-max)",
                f"{min(day.objects_by_hour)}-{max(day.objects_by_hour)}"
                if day.objects_by_hour else "")
        res.add("3 stored bytes at the end (growth over the day)",
                f"{fmt_mb(stored)} (+{fmt_kb(stored - start_bytes)})", rs.get("bytes", ""))
        growth = (stored - start_bytes) / day.appended
        res.add("3 stored growth / appended bytes (every object)", f"{growth:.2f}",
                target=f"<= {TARGET_GROWTH:.2f}", met=growth <= TARGET_GROWTH)
        res.add(f"3   growth by kind, bytes: {' / '.join(KINDS)}",
                " / ".join(f"{kinds[k][1] - self.fig1_kinds[k][1]:+d}" for k in KINDS))
        for kind in ("delta", "snap", "pack"):
            parts = self.split(kind)
            if parts is None:
                continue
            n, frames, index, rest = parts
            res.add(f"3   {kind} objects ({n}): frames / index / header+trailer",
                    f"{fmt_kb(frames)} / {fmt_kb(index)} / {fmt_kb(rest)}")
        parts_ix = self.delta_index_parts()
        if parts_ix:
            res.add("3   delta indexes, each part compressed alone: "
                    + " / ".join(parts_ix), " / ".join(fmt_kb(v) for v in parts_ix.values()))
        res.add("3 prune: snapshots kept / forgotten / deferred; deltas dropped; wall s",
                f"{snaps_kept} / {len(pr.forgotten)} / {len(pr.deferred)}; {len(pr.dropped)}; "
                f"{day.prune_wall:.2f}")
        res.add("3   its compactions wrote: the flushes since the last one; reclaiming",
                f"{wrote(pr.folded)}; {wrote(pr.compaction)}")
        if pr.errors:
            res.notes.append(f"prune errors: {pr.errors}")
        errs = [e for c in day.compactions for e in c.errors]
        if errs:
            res.notes.append(f"compaction errors during the day: {errs[:3]}")
        res.add("3 wall time of the flushes (total, in process), s", f"{day.flush_wall:.1f}")

    # -- figure 4 -----------------------------------------------------------
    def fig4_restore_at(self) -> None:
        assert self.day is not None
        day, res = self.day, self.res
        start = day.start
        res.add("# 4. restore --at T after that day, as a new machine, through the counting "
                "proxy, into an empty directory: the tree of the last flush at or before T")
        at = start + AT_HOUR * HOUR
        x = self.restore_at(at, "mid")
        if x is None:
            res.add("4 restore", f"no flush at or before {hhmm(at, start)}")
            return
        # What the last compaction before it folded: a restore before deltas stopped there.
        hours = [h for h, _ in day.written if start + h * HOUR <= at]
        since = ""
        if hours and (c := self.flush_at(start + hours[-1] * HOUR)) is not None:
            grown = sum(x.flush.sizes.values()) - sum(c.sizes.values())
            since = f" (+{fmt_kb(grown)} over the {hhmm(c.time, start)} compaction's tree)"
        n = len(x.keys)
        res.add(f"4 as of {hhmm(at, start)}: the flush restored",
                f"{hhmm(x.flush.time, start)}{since}")
        res.add("4 objects read (distinct keys GET)", str(n),
                target=f"<= {TARGET_READ_OBJECTS}", met=n <= TARGET_READ_OBJECTS)
        res.add(f"4   by kind: {' / '.join(KINDS)}", by_kind(x.by_kind))
        res.add("4 requests (GET / LIST / other)",
                f"{len(x.reqs)} ({x.gets} / {x.lists} / {len(x.reqs) - x.gets - x.lists})")
        res.add("4 bytes downloaded", fmt_kb(x.down))
        res.add("4 wall time, s; peak RSS", f"{x.run.wall:.2f}; {fmt_rss(x.run.maxrss)}")
        res.add("4 restored tree = the tree at that flush", "yes" if x.ok else "NO",
                target="identical", met=x.ok)
        res.add("4   files, bytes", x.what)
        # A flush between two compactions (not on the hour), at its own time and between
        # it and the next flush; the day's first hour (every delta of the day is listed,
        # the first one read) and its last (the longest chain of deltas).
        inner = [f for f in day.flush_log if (f.time - start) % HOUR != 0]
        near = min(inner, key=lambda f: abs(f.time - start - BETWEEN_HOUR * HOUR),
                   default=None)
        points: list[tuple[float, str, str]] = [(start + 1.5 * HOUR, "early", "")]
        if near is not None:
            i = day.flush_log.index(near)
            prev = day.flush_log[i - 1] if i > 0 else None
            grown = sum(near.sizes.values()) - sum(prev.sizes.values()) if prev else 0
            nxt = day.flush_log[i + 1].time if i + 1 < len(day.flush_log) else start + DAY
            points += [(near.time, "flush", f", a flush's own time (+{grown} B over the one "
                        f"before)"),
                       ((near.time + nxt) / 2, "between",
                        f", between the flushes of {hhmm(near.time, start)} and "
                        f"{hhmm(nxt, start)}")]
        points.append((start + LATE_HOUR * HOUR, "late", ", the longest chain of deltas"))
        for t, name, label in points:
            y = self.restore_at(t, name)
            if y is None:
                res.add(f"4 as of {hhmm(t, start)}", "no flush at or before that time")
                continue
            n = len(y.keys)
            res.add(f"4 as of {hhmm(t, start)}{label}: flush restored; objects read "
                    f"({' / '.join(KINDS)})",
                    f"{hhmm(y.flush.time, start)}; {n} ({by_kind(y.by_kind)})",
                    target=f"<= {TARGET_READ_OBJECTS}", met=n <= TARGET_READ_OBJECTS)
            res.add("4   requests (GET / LIST / other), bytes, wall s; tree identical",
                    f"{len(y.reqs)} ({y.gets} / {y.lists} / "
                    f"{len(y.reqs) - y.gets - y.lists}), {fmt_kb(y.down)}, "
                    f"{y.run.wall:.2f}; {'yes' if y.ok else 'NO'}",
                    target="identical", met=y.ok)

    def flush_at(self, at: float) -> Flush | None:
        """The last flush of the simulated day at or before ``at``."""
        assert self.day is not None
        done = [f for f in self.day.flush_log if f.time <= at]
        return done[-1] if done else None

    def restore_at(self, at: float, name: str) -> AtRestore | None:
        """``syncd restore --at`` through the proxy; what it read, and whether the tree is
        the one of the last flush at or before that time."""
        assert self.sw is not None and self.proxy is not None and self.day is not None
        day = self.day
        flush = self.flush_at(at)
        if flush is None:
            return None
        target = self.work / f"restore-at-{name}"
        env = self.syncd_env(self.work / "restorer-claude", PREFIX, "bench-restorer",
                             "restorer", proxied=True)
        log(f"fig 4: syncd restore --at {iso_utc(at)} (expect the flush of "
            f"{hhmm(flush.time, day.start)}) ...")
        self.proxy.take()
        # Whatever its exit code: what it read is measured, and its tree compared.
        r = run_rc(self.procs, [self.syncd, "restore", "--machine", MACHINE, "--at",
                                iso_utc(at), "--to", str(target)], env, self.logs,
                   f"syncd-restore-at-{name}")
        reqs: list[Req] = self.proxy.take()
        gets = [q for q in reqs if q.method == "GET" and not is_list(q) and q.key]
        keys = {q.key for q in gets}
        lists = sum(1 for q in reqs if is_list(q))
        down = sum(q.body for q in reqs)
        ok, what = self.same_as(target, flush.sizes)
        first = ""
        if r.rc != 0:
            problems = [ln for ln in r.err.splitlines()
                        if ln.startswith("syncd: ") and not ln.startswith("syncd: note: ")]
            first = f"; the first problem: {(problems or [r.err.strip()])[0][:400]}"
            ok, what = False, f"exit {r.rc}, {len(problems)} problems (notes); {what}"
        kinds: dict[str, int] = {}
        for k in keys:
            kk = kind_of(k.removeprefix(f"{PREFIX}/"))
            kinds[kk] = kinds.get(kk, 0) + 1
        log(f"  {r.wall:.2f}s; {len(keys)} objects read ({kinds}), {len(reqs)} requests, "
            f"{fmt_kb(down)} downloaded; tree as of {hhmm(flush.time, day.start)}: "
            f"{'identical' if ok else 'DIFFERS'}: {what}")
        if not ok:
            self.res.notes.append(f"restore --at {hhmm(at, day.start)} differs from the tree "
                                  f"of the flush of {hhmm(flush.time, day.start)}: "
                                  f"{what}{first}")
        if not self.args.keep:
            shutil.rmtree(target, ignore_errors=True)
        return AtRestore(at, flush, r, keys, kinds, reqs, len(gets), lists, down, ok, what)

    def same_as(self, restored: Path, sizes: dict[str, int]) -> tuple[bool, str]:
        """The restored tree holds exactly the files of ``sizes``, each the first ``size``
        bytes of today's file (the tree only grows by appends and new files)."""
        got = tree_files(restored)
        if got.keys() != sizes.keys():
            missing, extra = sizes.keys() - got.keys(), got.keys() - sizes.keys()
            return False, (f"{len(missing)} files missing (e.g. {sorted(missing)[:1]}), "
                           f"{len(extra)} extra (e.g. {sorted(extra)[:1]})")
        for rel, n in sizes.items():
            if got[rel] != n:
                return False, f"{rel}: {got[rel]} bytes, expected {n}"
            with open(self.tree.root / rel, "rb") as f:
                want = f.read(n)
            if (restored / rel).read_bytes() != want:
                return False, f"{rel}: content differs"
        return True, f"{len(sizes)} files, {fmt_mb(sum(sizes.values()))}"

    # -- figure 5 -----------------------------------------------------------
    def fig5_verify(self) -> None:
        res = self.res
        res.add("# 5. syncd verify --read-data 10 on the store after that day "
                "(compacted and pruned), direct")
        log("fig 5: syncd verify --read-data 10 ...")
        r = run_rc(self.procs, [self.syncd, "verify", "--read-data", "10", "--json"],
                   self.main_env(), self.logs, "syncd-verify")
        try:
            doc: dict[str, Any] = json.loads(r.out)
        except ValueError:
            why = (r.err.strip() or r.out.strip()).splitlines()[-1:] or ["no output"]
            log(f"  exit {r.rc}, no report: {why[0]}")
            res.add("5 syncd verify", f"not run: exit {r.rc}: {why[0][:80]}")
            res.notes.append(f"syncd verify: exit {r.rc}: {(r.err or r.out).strip()[-500:]}")
            return
        problems = doc.get("problems", [])
        log(f"  {r.wall:.2f}s, exit {r.rc}, {len(problems)} problems: {problems[:3]}")
        res.add("5 wall time, s", fmt_s(r.wall))
        res.add("5 exit code", str(r.rc), target="0", met=r.rc == 0)
        res.add("5 problems", str(len(problems)), target="0", met=not problems)
        res.add("5 checked: snapshots / deltas / packs / segments",
                f"{doc.get('snapshots')} / {doc.get('deltas')} / {doc.get('packs')} / "
                f"{doc.get('segments')}")
        share = float(doc.get("sampled_share", 0.0))
        res.add("5 data read: extents, raw bytes, share of stored frames",
                f"{doc.get('extents_read')}, {fmt_mb(int(doc.get('bytes_read', 0)))}, "
                f"{100 * share:.1f} %")
        res.add("5 CPU (user+sys), s; peak RSS", f"{fmt_s(r.cpu)}; {fmt_rss(r.maxrss)}")
        for p in problems[:5]:
            res.notes.append(f"verify problem: {p}")

    def run_all(self) -> None:
        self.setup()
        steps: list[tuple[str, Callable[[], None]]] = [
            ("1", self.fig1_stored), ("2", self.fig2_big), ("3", self.fig3_day),
            ("4", self.fig4_restore_at), ("5", self.fig5_verify)]
        for name, step in steps:
            try:
                step()
            except Failed as e:
                log(f"figure {name} failed: {e}")
                self.res.add(f"{name} FAILED", str(e).splitlines()[0][:100])
                self.res.notes.append(f"figure {name}: {e}")
                if name in ("1", "3"):   # the later figures build on these
                    break
        self.res.notes.append(f"load average (1 min) at the end: {os.getloadavg()[0]:.2f}")


def main() -> int:
    ap = bench_parser(__doc__, 200)
    ap.add_argument("--compact-gb", type=float, default=None,
                    help="tree size for figure 2, GB (default 1; --quick: the small tree)")
    ap.add_argument("--appends", type=int, default=1000,
                    help="appends over the simulated day (figure 3)")
    ap.add_argument("--max-deltas", type=int, default=None,
                    help="figure 3's max_deltas (default: the setting's, 24; 23 makes the "
                         "day's last compaction the manifest that follows 23 deltas, as on "
                         "every later day)")
    args = ap.parse_args()
    args.size_mb = args.size_mb or (20 if args.quick else 200)
    for k in [k for k in os.environ if k.startswith("SYNCD_")]:
        del os.environ[k]   # the in-process settings of figure 3 come from the arguments

    return run_bench("compaction", args, "syncd-bench-compact-", Bench)


if __name__ == "__main__":
    sys.exit(main())

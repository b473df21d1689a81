#!/usr/bin/env python3
"""`syncd index --machine M` against a real SeaweedFS: MB/s of transcript indexed from
another machine's backup, the requests and bytes it takes, and what the next run reads
after that machine appended a little.

Prints figures; asserts nothing.

    PYTHONPATH=$PWD .venv/bin/python bench/search_remote.py            # 300 MB, 3 runs
    # also: --mb N, --runs N

Machine ``m2``'s tree is ``--mb`` MB of transcripts (60 files), built from the real
transcripts in /work/shared/claude-samples when present (their lines repeated, each file
a session of its own), else from generated lines; shipped once by syncd's own shipper.
Each run indexes it from nothing into a fresh search.db, interleaved with a run into an
index that keeps nothing (what reading the store costs alone). CPU is the process's
(user + system) over the run; SeaweedFS runs in its own processes, not counted.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from syncd.backup.ship import Shipper
from syncd.backup.state import State
from syncd.claude import Selection
from syncd.repository import Repository
from syncd.search.index import SearchIndex
from syncd.search.remote import index_machine
from syncd.store import open_store
from tests.counting import CountingStore
from tests.seaweed import start_seaweed

SAMPLES = Path("/work/shared/claude-samples")
FILES = 60


class Discard:
    """An index that keeps nothing: the cost of reading the store alone."""

    def __init__(self) -> None:
        self.cursors: dict[tuple[str, bytes], tuple[int, int]] = {}

    def cursor(self, machine: str, path: bytes) -> tuple[int, int] | None:
        return None

    def feed(self, machine: str, path: bytes, gen: int, start: int, data: bytes) -> int:
        return data.rfind(b"\n") + 1

    def set_session(self, machine: str, session: str, fields: object) -> None:
        pass

    def mark_deleted(self, machine: str, path: bytes) -> None:
        pass

    def files(self, machine: str) -> dict[bytes, bool]:
        return {}

    def commit(self) -> None:
        pass


def sample_lines() -> list[bytes]:
    lines = [ln + b"\n" for p in sorted(SAMPLES.rglob("*.jsonl"))
             for ln in p.read_bytes().splitlines() if ln.strip()]
    if lines:
        return lines
    rnd = random.Random(7)
    words = [f"w{i}" for i in range(5000)]
    return [json.dumps({"type": "user", "message": {"role": "user", "content": " ".join(
        rnd.choice(words) for _ in range(150))}}).encode() + b"\n" for _ in range(2000)]


def build(root: Path, mb: int) -> list[str]:
    lines = sample_lines()
    per = mb * 1_000_000 // FILES
    paths = []
    for n in range(FILES):
        sid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"bench/{n}"))
        rel = f"projects/-home-u-p{n % 6}/{sid}.jsonl"
        out = root / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        size, i = 0, n * 97
        with open(out, "wb") as f:
            while size < per:
                ln = lines[i % len(lines)]
                f.write(ln)
                size += len(ln)
                i += 1
        paths.append(rel)
    return paths


def run(store: CountingStore, index: object) -> tuple[float, float, int, int, int]:
    store.counts.calls.clear()
    store.counts.bytes_read = 0
    t0, c0 = time.perf_counter(), time.process_time()
    r = index_machine(Repository(store, "here"), "m2", index)  # type: ignore[arg-type]
    if isinstance(index, SearchIndex):
        index.commit()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return wall, cpu, r.indexed_bytes, store.counts.total(), store.counts.bytes_read


def med(xs: list[float]) -> str:
    return f"{statistics.median(xs):.1f} ({min(xs):.1f}-{max(xs):.1f})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=300)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="syncd-bench-remote-") as tmp:
        work = Path(tmp)
        sw = start_seaweed(work / "weed")
        try:
            sw.create_bucket("bench")
            os.environ.update(sw.env())
            inner = open_store("s3://bench/b", endpoint_url=sw.endpoint)
            store = CountingStore(inner)
            paths = build(work / "m2", a.mb)
            raw = sum((work / "m2" / p).stat().st_size for p in paths)
            sh = Shipper(root=work / "m2", repo=Repository(inner, "m2"),
                         state=State(work / "m2.db"), selection=Selection())
            sh.ship([p.encode() for p in paths])
            stored = sum(o.size for o in inner.list("machines/m2/seg/"))
            print(f"m2: {raw / 1e6:.0f} MB of transcript in {FILES} files, "
                  f"{stored / 1e6:.0f} MB stored; load {os.getloadavg()[0]:.2f}")
            full: dict[str, list[float]] = {"wall": [], "cpu": []}
            bare: dict[str, list[float]] = {"wall": [], "cpu": []}
            for i in range(a.runs):
                wall, cpu, took, reqs, got = run(store, Discard())
                bare["wall"].append(raw / 1e6 / wall)
                bare["cpu"].append(raw / 1e6 / cpu)
                db = SearchIndex.open(work / f"search{i}.db")
                wall, cpu, took, reqs, got = run(store, db)
                full["wall"].append(raw / 1e6 / wall)
                full["cpu"].append(raw / 1e6 / cpu)
                if i < a.runs - 1:
                    db.close()
                    (work / f"search{i}.db").unlink()
            print(f"fetch only:  {med(bare['wall'])} MB/s wall, {med(bare['cpu'])} MB/s CPU")
            print(f"fetch+index: {med(full['wall'])} MB/s wall, {med(full['cpu'])} MB/s CPU; "
                  f"{reqs} requests, {got / 1e6:.0f} MB read, {took / 1e6:.0f} MB indexed")
            # The machine appends 1 MB to two sessions: the next run reads only that.
            for p in paths[:2]:
                with open(work / "m2" / p, "ab") as f:
                    f.write(sample_lines()[0] * max(1, 500_000 // len(sample_lines()[0])))
            sh.ship([p.encode() for p in paths[:2]])
            wall, cpu, took, reqs, got = run(store, db)
            print(f"next run after 1 MB appended: {reqs} requests, {got / 1e6:.2f} MB read, "
                  f"{took / 1e6:.2f} MB indexed, {wall:.2f} s")
            wall, cpu, took, reqs, got = run(store, db)
            print(f"and with nothing new: {reqs} requests, {got / 1e3:.1f} kB read, "
                  f"{wall:.2f} s")
            db.close()
            sh.state.close()
        finally:
            sw.stop()


if __name__ == "__main__":
    main()

"""The dashboard's stored-bytes samples (``web.sqlite``): how big the table gets over 90
days of samples every 10 minutes, and the CPU time of one sample of a bucket naming
10,000 machines, against the unbounded table (a row per machine per sample).

    PYTHONPATH=. .venv/bin/python bench/samples.py [--runs N] [--machines N]

Runs of the two tables are interleaved; medians with (min-max). Prints figures, asserts
nothing.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from syncd.web.samples import EVERY, KEEP, Samples  # noqa: E402


class Unbounded(Samples):
    """The table as it was: every machine of every sample, 90 days."""

    def add(self, now: float, sizes: dict[str, int]) -> None:
        with self._lock:
            self._db.execute("BEGIN")
            self._db.executemany("INSERT INTO samples VALUES (?, ?, ?)",
                                 [(now, m, n) for m, n in sizes.items()])
            self._db.execute("DELETE FROM samples WHERE time < ?", (now - KEEP,))
            self._db.execute("COMMIT")


def rows(path: Path) -> int:
    with sqlite3.connect(path) as db:
        n: int = db.execute("SELECT count(*) FROM samples").fetchone()[0]
    return n


def cpu_ms(kind: type[Samples], path: Path, start: float, sizes: dict[str, int]
           ) -> tuple[float, int]:
    """The CPU time of one sample added (ms), and the rows it took."""
    s = kind(path)
    try:
        t = time.process_time()
        s.add(start, sizes)
        return (time.process_time() - t) * 1000, len(s.latest())
    finally:
        s.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--machines", type=int, default=10_000)
    args = ap.parse_args()
    sizes = {f"m{i:05d}": i * 1000 for i in range(args.machines)}
    with tempfile.TemporaryDirectory() as tmp:
        # 90 days of samples (of 200 machines: a bounded sample is 101 rows whatever
        # the count, and the sort of 10,000 would only slow the bench).
        path = Path(tmp) / "days.sqlite"
        s = Samples(path)
        few = dict(list(sizes.items())[:200])
        t = time.process_time()
        n = int(KEEP / EVERY)
        for i in range(n):
            s.add(1e9 + i * EVERY, few)
        spent = time.process_time() - t
        s.close()
        print(f"90 days, {n} samples of 200 machines: {rows(path)} rows, "
              f"{path.stat().st_size / 1e6:.1f} MB, {spent / n * 1000:.2f} ms CPU a sample; "
              f"unbounded: {n * 200} rows ({n * args.machines} at {args.machines} machines)")
        got: dict[str, list[float]] = {"bounded": [], "unbounded": []}
        taken = {}
        for run in range(args.runs):
            for name, kind in (("bounded", Samples), ("unbounded", Unbounded)):
                p = Path(tmp) / f"{name}.sqlite"
                ms, taken[name] = cpu_ms(kind, p, 2e9 + run * EVERY, sizes)
                got[name].append(ms)
        for name, ms in got.items():
            print(f"one sample of {args.machines} machines, {name}: "
                  f"{statistics.median(ms):.1f} ms CPU ({min(ms):.1f}-{max(ms):.1f}); "
                  f"{taken[name]} rows a sample")


if __name__ == "__main__":
    main()

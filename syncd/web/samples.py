"""Stored bytes per machine over time: samples the page takes while it is served (one
LIST of each machine's objects every ``EVERY``), kept in a small table beside the state,
bounded whatever the uptime or the number of machines (older samples thinned, the
machines past the biggest summed).

The store's LIST gives sizes and no times, so history is what the page (or the daemon
with ``web = true``) saw: a daemon that serves it keeps a continuous record.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

from syncd.errors import SyncdError

log = logging.getLogger("syncd.web")

EVERY = 600.0  # seconds between samples
KEEP = 90 * 86400.0  # samples older than this are dropped
# Every sample is kept this long; older ones are thinned to one an hour, and past
# ``HOURLY`` to one a day: at most about 900 samples, whatever the uptime.
RECENT = 86400.0
HOURLY = 30 * 86400.0
# Machines kept per sample, those holding the most: the rest are summed under
# ``OTHERS`` (a bucket may name any number of machines; a sample stays this size).
MOST_MACHINES = 100
OTHERS = "(others)"  # no machine id has parentheses
FILE = "web.sqlite"


class Samples:
    def __init__(self, path: Path) -> None:
        self._lock = threading.Lock()
        self._added: float | None = None  # the time of the last sample added here
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        path.chmod(0o600)
        # A sample lost to a crash is one point of a plot: no fsync at each.
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS samples "
                         "(time REAL NOT NULL, machine TEXT NOT NULL, bytes INTEGER NOT NULL)")
        self._db.execute("CREATE INDEX IF NOT EXISTS samples_time ON samples (time)")
        # Samples taken before the cap, one row a machine, are dropped whole.
        self._db.execute("DELETE FROM samples WHERE time IN (SELECT time FROM samples "
                         "GROUP BY time HAVING count(*) > ?)", (MOST_MACHINES + 1,))

    def last(self) -> float | None:
        with self._lock:
            row = self._db.execute("SELECT max(time) FROM samples").fetchone()
        return None if row[0] is None else float(row[0])

    def add(self, now: float, sizes: dict[str, int]) -> None:
        ranked = sorted(sizes.items(), key=lambda x: (-x[1], x[0]))
        rows = [(now, m, n) for m, n in ranked[:MOST_MACHINES]]
        if len(ranked) > MOST_MACHINES:
            rows.append((now, OTHERS, sum(n for _, n in ranked[MOST_MACHINES:])))
        with self._lock:
            self._db.execute("BEGIN")
            self._db.executemany("INSERT INTO samples VALUES (?, ?, ?)", rows)
            self._db.execute("DELETE FROM samples WHERE time < ?", (now - KEEP,))
            # Past the recent window, the newest sample of each hour stays, and past
            # HOURLY the newest of each day: only the hours and days that samples entered
            # since the last add here are looked at (all of them at the first).
            for size, age in ((3600.0, RECENT), (86400.0, HOURLY)):
                lo = -1.0 if self._added is None else (self._added - age) // size * size
                self._db.execute(
                    "DELETE FROM samples WHERE time >= :lo AND time < :edge AND time NOT IN "
                    "(SELECT max(time) FROM samples WHERE time >= :lo AND time < :edge "
                    "GROUP BY CAST(time / :size AS INTEGER))",
                    {"lo": lo, "edge": now - age, "size": size})
            self._db.execute("COMMIT")
            self._added = now

    def series(self, most: int | None = None) -> dict[str, list[tuple[float, int]]]:
        """Per machine, its (time, bytes) samples, oldest first; ``most``: only the
        machines that held the most at the newest sample, that many, and the rest
        summed under ``OTHERS`` (their samples are not all read)."""
        out: dict[str, list[tuple[float, int]]] = {}
        with self._lock:
            if most is None:
                rows = self._db.execute(
                    "SELECT machine, time, bytes FROM samples ORDER BY time").fetchall()
                rest = []
            else:
                top = [str(m) for (m,) in self._db.execute(
                    "SELECT machine FROM samples WHERE time = (SELECT max(time) FROM "
                    "samples) AND machine != ? ORDER BY bytes DESC, machine LIMIT ?",
                    (OTHERS, most))]
                marks = ",".join("?" * len(top))
                rows = self._db.execute(
                    f"SELECT machine, time, bytes FROM samples WHERE machine IN ({marks}) "
                    "ORDER BY time", top).fetchall()
                rest = self._db.execute(
                    f"SELECT time, sum(bytes) FROM samples WHERE machine NOT IN ({marks}) "
                    "GROUP BY time ORDER BY time", top).fetchall()
        for machine, t, n in rows:
            out.setdefault(str(machine), []).append((float(t), int(n)))
        if rest:
            out[OTHERS] = [(float(t), int(n)) for t, n in rest]
        return out

    def latest(self) -> dict[str, int]:
        """Each machine's bytes at the newest sample (the rest under ``OTHERS``)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT machine, bytes FROM samples WHERE time = "
                "(SELECT max(time) FROM samples)").fetchall()
        return {str(m): int(n) for m, n in rows}

    def close(self) -> None:
        with self._lock:
            self._db.close()


class Sampler:
    """Takes a sample now and every ``EVERY`` after, in a thread of its own."""

    def __init__(self, samples: Samples, measure: Callable[[], dict[str, int]]) -> None:
        self.samples, self.measure = samples, measure
        self.first = threading.Event()
        self._stop = threading.Event()
        threading.Thread(target=self._run, name="syncd-web-samples", daemon=True).start()

    def _run(self) -> None:
        while not self._stop.is_set():
            last = self.samples.last()
            now = time.time()
            if last is None or now - last >= EVERY:
                try:
                    self.samples.add(now, self.measure())
                except (SyncdError, OSError, sqlite3.Error) as e:
                    log.warning("web: stored bytes not sampled: %s", e)
            self.first.set()
            last = self.samples.last() or now
            self._stop.wait(max(1.0, last + EVERY - time.time()))

    def stop(self) -> None:
        self._stop.set()

"""Run one syncd command with every store it opens counted; used by readside.py.

    python bench/readrunner.py REPORT.json LATENCY_S -- machines --json

Every ``open_store`` of syncd is patched first (tests/counting.py: the package's and each
module's imported name; the backend under the retry layer is wrapped, so retries and
pages are counted as the backend serves them), then ``syncd.cli.main.main`` runs with
those arguments, as ``python -m syncd`` would. It ends in ``os._exit``, so the report is
written from a wrapper of ``os._exit``: requests by method, bytes read, the command's
wall time and the peak RSS of this process.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import NoReturn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.counting import Counts, patch_open_store


def peak_rss() -> int:
    """Bytes. VmHWM is this process image's own peak; ru_maxrss would carry over the peak
    of the process that spawned it (the kernel keeps it across exec)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main() -> None:
    report, latency, sep, *args = sys.argv[1:]
    if sep != "--":
        raise SystemExit("usage: readrunner.py REPORT LATENCY -- ARGS...")
    counts = Counts()
    patch_open_store(counts, float(latency))
    from syncd.cli.main import main as syncd_main

    real_exit = os._exit
    t0 = time.perf_counter()

    def exit_with_report(status: int) -> NoReturn:
        wall = time.perf_counter() - t0
        Path(report).write_text(json.dumps({
            "rc": status, "wall": wall, "calls": dict(counts.calls),
            "by_kind": dict(counts.by_kind()), "bytes_read": counts.bytes_read,
            "peak_rss": peak_rss(),
            "ru_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
        real_exit(status)

    os._exit = exit_with_report
    sys.argv = ["syncd", *args]
    syncd_main()


if __name__ == "__main__":
    main()

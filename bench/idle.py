"""The idle daemon before and now, and now without the secrets scan: RSS and CPU of
`syncd run` idle on a small tree (``search.idle_daemon``), runs interleaved.

    .venv/bin/python bench/idle.py --old /work/old-main [--rounds 2] [--seconds 30]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import search

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", type=Path, required=True, help="a checkout of the baseline")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=30.0)
    a = ap.parse_args()
    runs = (("before", a.old, {}), ("now", ROOT, {}),
            ("now, secrets_scan = false", ROOT, {"SYNCD_SECRETS_SCAN": "false"}))
    got: dict[str, list[tuple[float, float]]] = {name: [] for name, _, _ in runs}
    with tempfile.TemporaryDirectory() as d:
        for _ in range(a.rounds):
            for name, tree, env in runs:
                got[name].append(search.idle_daemon(tree, Path(d), a.seconds, env))
    for name, xs in got.items():
        print(f"{name:28} RSS " + ", ".join(f"{r:.1f}" for r, _ in xs) + " MB; CPU "
              + ", ".join(f"{c:.2f}" for _, c in xs) + " %")


if __name__ == "__main__":
    main()

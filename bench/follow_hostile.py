#!/usr/bin/env python3
"""What a hostile followed machine costs a follower: peak RSS of a real ``Follower.poll``
loop following a machine whose segments are made to take memory and disk, and the bytes
it leaves under ``<state_dir>/conflicts/``.

Prints figures; asserts nothing.

    .venv/bin/python bench/follow_hostile.py                  # ~2 min
    # also: --over N, --under N, --claims N, --claim-mb N, --conflict-mb N, --workdir DIR,
    #       --keep

The followed machine ``desk`` is crafted with tests/hostile.py's helpers in a ``file://``
store: a session the follower imports first, then ``--over`` segments of about a million
tombstones each (within the 64 MiB of JSON an index may expand to, ~2 MB stored) and
``--under`` segments of 60 000 tombstones of long names each (just within what a reader
accepts), then, one before each of ``--claims`` polls, a segment of a few kB claiming a
new ``--claim-mb`` generation (zstd frames of a repeated byte) of that session, which
the follower's machine has gone on writing (a diverged copy at every poll).

The follower runs in a child process (a fresh interpreter, so its peak is its own: the
``VmHWM`` of /proc/self/status), one ``Follower`` for every poll, as the daemon keeps it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import zstandard

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.hostile import T0, Craft  # noqa: E402  (this checkout's, as syncd is)

DESK, HERE = "desk", "laptop"
CWD = "/home/desk/app"
FRAME = 4 << 20


def kib_of(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


# -- the follower (the child process) ------------------------------------------------------

def child(work: Path, first: int, claims: int, claim_mb: int, conflict_mb: int | None) -> None:
    """Poll ``desk`` once, go on writing its session here, then poll once per claim (the
    first at seq ``first``)."""
    import logging

    from syncd.backup.state import State
    from syncd.config import load_settings
    from syncd.follow.follower import Follower
    from syncd.repository import Repository
    from syncd.store import LocalStore
    from tests.hostile import line, sid, transcript

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    extra = {} if conflict_mb is None else {"conflict_bytes": conflict_mb << 20}
    settings = load_settings(config_file=work / "none.toml", source=work / "home" / ".claude",
                             store=(work / "store").as_uri(), state_dir=work / "state",
                             machine_id=HERE, follow=[DESK], follow_quiet=0, **extra)
    os.environ["HOME"] = str(work / "home")
    state = State(settings.state_file)
    follower = Follower(settings, Repository(LocalStore(work / "store"), HERE), state,
                        clock=lambda: 2e9)
    s1 = sid(DESK, 1)
    out: dict[str, object] = {}
    t = time.monotonic()
    follower.poll()
    out["first_look_s"] = time.monotonic() - t
    out["after_first_look_rss_kib"] = kib_of("VmRSS")
    mine = next((work / "home" / ".claude" / "projects").glob(f"*/{s1}.jsonl"))
    with open(mine, "ab") as f:  # the session goes on here: every claim diverges from it
        f.write(line(s1, str(work / "home" / "app"), 1, "typed here")
                .replace(b"-000001", b"-here1"))
    t = time.monotonic()
    for i in range(claims):
        claim(work, first + i, transcript(CWD, s1), 2 + i, 0x61 + i % 26, claim_mb << 20)
        follower.poll()
    out["claims_s"] = time.monotonic() - t
    cur = follower.cursors[DESK]
    out.update(seq=cur.seq, problem=cur.problem, conflicts=len(cur.conflicts),
               rss_kib=kib_of("VmRSS"), hwm_kib=kib_of("VmHWM"))
    state.close()
    print(json.dumps(out))


def claim(work: Path, seq: int, path: str, gen: int, fill: int, size: int) -> None:
    """desk's segment ``seq``: generation ``gen`` of ``path`` is ``size`` bytes of ``fill``."""
    from syncd.store import layout
    from tests.hostile import rle_sha256, zstd_frame

    c = Craft(work / "store")
    w = c.writer(DESK, seq)
    digests: dict[int, str] = {}
    for start in range(0, size, FRAME):
        n = min(FRAME, size - start)
        digest = digests.setdefault(n, rle_sha256(fill, n))
        w.add_frame(path.encode(), gen, start, n, zstd_frame(b"", fill, n, content_size=n),
                    digest, mode=0o600, mtime_ns=int(T0 * 1e9))
    c.finish(layout.segment_key(DESK, seq), w)


# -- the bench -----------------------------------------------------------------------------

def tombstones(c: Craft, seq: int, n: int, width: int, rnd: random.Random) -> None:
    """desk's segment ``seq``: an index of ``n`` tombstones, names of ``width`` random hex
    digits (written as JSON directly: the writer would take a minute for a million)."""
    key = c.segment(DESK, seq)
    names = (rnd.getrandbits(4 * width).to_bytes((width + 1) // 2, "big").hex()[:width]
             for _ in range(n))
    text = "".join([f'{{"v":1,"machine":"{DESK}","seq":{seq},"time":{T0 + seq},"entries":[',
                    ",".join(f'{{"op":"delete","path":"p/{name}","gen":1,"time":{T0}}}'
                             for name in names), "]}"])
    c.replace_index(key, zstandard.ZstdCompressor(write_content_size=True).compress(
        text.encode()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--over", type=int, default=6,
                    help="segments naming ~a million tombstones (more than a reader accepts)")
    ap.add_argument("--under", type=int, default=6,
                    help="segments naming 60 000 tombstones of long names")
    ap.add_argument("--claims", type=int, default=10, help="polls, each after a new claim")
    ap.add_argument("--claim-mb", type=int, default=100, help="MiB each claim claims")
    ap.add_argument("--conflict-mb", type=int, default=None,
                    help="conflict_bytes in MiB (default: the config's default)")
    ap.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    if args.child is not None:
        child(args.child, args.first, args.claims, args.claim_mb, args.conflict_mb)
        return 0

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from core import log, render_table, run_in, workdir

    from tests.hostile import Piece, line, sid, transcript

    work = workdir(args, "syncd-bench-follow-hostile-")
    rows: list[tuple[str, ...]] = []
    notes: list[str] = []

    def run() -> None:
        c = Craft(work / "store")
        c.machine_json(DESK, "/home/desk")
        s1 = sid(DESK, 1)
        c.segment(DESK, 0, [Piece(transcript(CWD, s1), line(s1, CWD, 0))])
        rnd = random.Random(7)
        log(f"crafting {args.over} segments of 1 000 000 tombstones, {args.under} of 60 000 ...")
        for seq in range(1, args.over + 1):
            tombstones(c, seq, 1_000_000, 5, rnd)
        for seq in range(args.over + 1, args.over + args.under + 1):
            tombstones(c, seq, 60_000, 200, rnd)
        seg_bytes = sum(p.stat().st_size for p in (work / "store").rglob("*") if p.is_file())
        log(f"following desk: a first look, then {args.claims} polls after a claim each ...")
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(work),
               "--first", str(args.over + args.under + 1), "--claims", str(args.claims),
               "--claim-mb", str(args.claim_mb)]
        if args.conflict_mb is not None:
            cmd += ["--conflict-mb", str(args.conflict_mb)]
        t = time.monotonic()
        p = subprocess.run(cmd, capture_output=True, text=True, check=False)
        wall = time.monotonic() - t
        if p.returncode != 0:
            raise SystemExit(f"the follower failed ({p.returncode}):\n{p.stderr[-3000:]}")
        got = json.loads(p.stdout.strip().splitlines()[-1])
        conflicts = [q for q in (work / "state" / "conflicts").rglob("*") if q.is_file()]
        claim_bytes = sum(q.stat().st_size for q in (work / "store").rglob("*")
                          if q.is_file()) - seg_bytes
        warnings = [ln for ln in p.stderr.splitlines() if ln.startswith("WARNING")]
        mb = 1_000_000
        rows.extend([
            ("desk's index segments in the store", f"{seg_bytes / mb:.1f} MB",
             f"{args.over} over a reader's limit, {args.under} within it"),
            ("desk's claims in the store", f"{claim_bytes / 1000:.0f} kB",
             f"{args.claims} of {args.claim_mb} MiB each"),
            ("follower RSS after the first look",
             f"{got['after_first_look_rss_kib'] / 1000:.0f} MB", f"{got['first_look_s']:.1f} s"),
            ("follower peak RSS (VmHWM)", f"{got['hwm_kib'] / 1000:.0f} MB",
             f"RSS at the end {got['rss_kib'] / 1000:.0f} MB"),
            ("bytes under conflicts/", f"{sum(q.stat().st_size for q in conflicts) / mb:.0f} MB",
             f"{len(conflicts)} copies"),
            ("warnings logged", str(len(warnings)), f"cursor seq {got['seq']}"),
            ("wall", f"{wall:.0f} s", f"{got['claims_s']:.1f} s for the claims"),
        ])
        notes.append(f"the cursor's problem: {str(got['problem'])[:160]}")
        notes.append("conflict_bytes: " + ("the default" if args.conflict_mb is None
                                           else f"{args.conflict_mb} MiB"))
        notes.append(f"load average (1 min) at the end: {os.getloadavg()[0]:.2f}")

    if run_in(work, args, run, lambda: None):
        print(f"syncd follow-hostile benchmark ({os.cpu_count()} CPUs)")
        print(render_table(("figure", "value", "detail"), rows, notes))
    return 0


if __name__ == "__main__":
    sys.exit(main())

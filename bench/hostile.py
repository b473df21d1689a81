#!/usr/bin/env python3
"""Hostile-store figures for syncd: peak RSS of `machines`, `sessions` and `restore`
against a store holding every bomb of tests/hostile.py, next to the same commands on a
clean store; the time and memory it takes to get past the worst key files.

Prints figures; asserts nothing.

    .venv/bin/python bench/hostile.py                     # ~1 min
    .venv/bin/python bench/hostile.py --as-limit-gb 0     # no address-space limit (careful)
    # also: --key-limit-gb N (the key-file runs; default 5), --workdir DIR, --keep

Every command runs as a child of a small launcher that reports its own ru_maxrss (a child
of this process would inherit this process's peak at exec), under an address-space limit
(--as-limit-gb, default 3; 5 for the key files, so that a 4 GiB scrypt runs to its end): a
reader that believes a bomb then fails with MemoryError instead of taking the machine's
memory, and the table says so. A ``file://`` store in a
temporary directory; "claimed" sizes are sparse files, so the bombs take little disk.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from core import (  # core also puts the repo on sys.path, for syncd and tests
    log,
    render_table,
    run_in,
    workdir,
)

from syncd.security.crypto import SCRYPT_N, SCRYPT_P, SCRYPT_R
from syncd.security.keys import init_encryption
from tests.hostile import (
    CHEAP,
    GB,
    MB,
    PASSPHRASE,
    Craft,
    Result,
    every_bomb,
    good_machine,
    run_syncd,
    syncd_env,
)

# The bomb machines a restore is measured on (every_bomb's), and what each holds.
RESTORED = {
    "b-all": "a frame claiming 1 GiB, a frame header claiming 10 GiB, a 4 GiB dictionary, "
             "a 2 GiB index",
    "b-index10": "a segment index of 10 GiB",
    "b-manifest": "a manifest index of 2 GiB",
    "b-group": "a manifest group of 2 GiB",
    "b-mj-real": "a 200 MB machine.json",
    "b-mj-sparse": "a 10 GiB (sparse) machine.json",
    "b-trailer": "a trailer claiming a 4 GiB index",
}
# Planted key files: (what, n, r, p); each sorts before the real key.
KEYS = [("n=2^22 r=8 p=1 (4 GiB scrypt)", 1 << 22, 8, 1),
        ("n=2^22 r=32 p=16 (16 GiB scrypt)", 1 << 22, 32, 16)]


def fmt(n: int) -> str:
    return f"{n / MB:.0f} MB"


def outcome(r: Result) -> str:
    """Exit code, and why when it died of a traceback."""
    if "Traceback" in r.err:
        last = [ln for ln in r.err.splitlines() if ln.strip()][-1]
        return f"{r.rc}, traceback: {last.split(':')[0][:40]}"
    return str(r.rc)


@dataclass
class Results:
    rows: list[tuple[str, ...]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, what: str, clean: str = "", hostile: str = "", ratio: str = "",
            exit_: str = "") -> None:
        self.rows.append((what, clean, hostile, ratio, exit_))

    def table(self) -> str:
        return render_table(("figure", "clean store", "hostile store", "x clean", "exit"),
                            self.rows, self.notes)


class Bench:
    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.limit = int(args.as_limit_gb * GB)
        self.res = Results()

    def close(self) -> None:
        pass

    def env(self, name: str) -> dict[str, str]:
        home = self.work / f"home-{name}"
        home.mkdir(exist_ok=True)
        return syncd_env(home, self.work / f"store-{name}",
                         passphrase=PASSPHRASE if name == "sealed" else None)

    def run(self, name: str, *args: str, limit: int | None = None) -> tuple[Result, float]:
        t = time.monotonic()
        r = run_syncd(args, self.env(name), limit=self.limit if limit is None else limit,
                      timeout=600)
        return r, time.monotonic() - t

    def setup(self) -> None:
        log("crafting the clean store ...")
        clean = Craft(self.work / "store-clean")
        for n in ("alpha", "zulu"):
            good_machine(clean, n)
        log("crafting the hostile store (every bomb) ...")
        every_bomb(Craft(self.work / "store-hostile"))
        self.res.notes.append("address-space limit per command: "
                              + (f"{self.args.as_limit_gb:g} GiB" if self.limit else "none"))
        self.res.notes.append(f"load average (1 min) at start: {os.getloadavg()[0]:.2f}")

    def commands(self) -> None:
        self.res.add("# peak RSS (wall): clean store = machines alpha and zulu; hostile store = "
                     "those and one machine behind each bomb")
        for cmd in ("machines", "sessions"):
            log(f"{cmd} ...")
            c, _ = self.run("clean", cmd)
            h, wall = self.run("hostile", cmd)
            self.res.add(f"{cmd}", fmt(c.maxrss), f"{fmt(h.maxrss)} ({wall:.1f} s)",
                         f"{h.maxrss / c.maxrss:.1f}", outcome(h))
        c, _ = self.run("clean", "restore", "--machine", "alpha", "--to",
                        str(self.work / "t-clean"))
        self.res.add("restore --machine alpha", fmt(c.maxrss), "", "", str(c.rc))
        for name, what in RESTORED.items():
            self.res.notes.append(f"{name}: {what}")
            log(f"restore --machine {name} ...")
            h, wall = self.run("hostile", "restore", "--machine", name, "--to",
                               str(self.work / f"t-{name}"))
            self.res.add(f"restore --machine {name}", fmt(c.maxrss),
                         f"{fmt(h.maxrss)} ({wall:.1f} s)", f"{h.maxrss / c.maxrss:.1f}",
                         outcome(h))

    def keys(self) -> None:
        self.res.add("# key files: `restore --dry-run` of an encrypted store, one planted key "
                     "file listed before the real one")
        self.res.notes.append("address-space limit of the key-file runs: " + (
            f"{self.args.key_limit_gb:g} GiB" if self.args.key_limit_gb else "none"))
        self.res.notes.append(f"key files: syncd writes n=2^{SCRYPT_N.bit_length() - 1} "
                              f"r={SCRYPT_R} p={SCRYPT_P}; the real one here has "
                              f"n=2^{CHEAP.bit_length() - 1}")
        craft = Craft(self.work / "store-sealed")
        craft.crypto = init_encryption(craft.store, PASSPHRASE, n=CHEAP)
        good_machine(craft, "alpha")
        args = ("restore", "--machine", "alpha", "--dry-run")
        c, cwall = self.run("sealed", *args)
        self.res.add("no planted key file", f"{fmt(c.maxrss)} ({cwall:.1f} s)", "", "",
                     str(c.rc))
        for what, n, r, p in KEYS:
            log(f"key file {what} ...")
            craft.key_file("0000000000000000", n=n, r=r, p=p)
            h, wall = self.run("sealed", *args, limit=int(self.args.key_limit_gb * GB))
            self.res.add(f"key file {what}: wall", f"{cwall:.2f} s",
                         f"{wall:.2f} s", f"{wall / cwall:.1f}", outcome(h))
            self.res.add("  peak RSS", fmt(c.maxrss), fmt(h.maxrss),
                         f"{h.maxrss / c.maxrss:.1f}")

    def run_all(self) -> None:
        self.setup()
        self.commands()
        self.keys()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--as-limit-gb", type=float, default=3.0,
                    help="address-space limit of each command, GiB (0: none)")
    ap.add_argument("--key-limit-gb", type=float, default=5.0,
                    help="address-space limit of the key-file runs, GiB (0: none); the "
                         "default lets a 4 GiB scrypt run to its end")
    ap.add_argument("--workdir", type=Path, default=None,
                    help="where to put the stores (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    work = workdir(args, "syncd-bench-hostile-")
    bench = Bench(args, work)
    if run_in(work, args, bench.run_all, bench.close):
        print(f"syncd hostile-store benchmark ({os.cpu_count()} CPUs)")
        print(bench.res.table())
    return 0


if __name__ == "__main__":
    sys.exit(main())

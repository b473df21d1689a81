#!/usr/bin/env python3
"""Key file figures (issue 11): what key files planted in a store cost a command.

Prints figures; asserts nothing.

    .venv/bin/python bench/keyfiles.py

A file:// store in a temporary directory, encrypted by `syncd init --encrypt` (syncd's
own scrypt parameters), with one small session backed up by `syncd sync`. Key files are
then planted under keys/, named to sort before the real one (a reader without a hint
meets them first), and `syncd restore --dry-run` runs against the store twice: as a
fresh machine (no state database: no hint) and as the machine that wrote the backup (its
state remembers the key file that opened the store). `+s` is the wall time over the
same reader's with nothing planted. Peak RSS is GNU time's `%M` when /usr/bin/time
exists, else wait4's ru_maxrss (which starts at this process's own peak).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from syncd.security.crypto import SCRYPT_N, SCRYPT_P, SCRYPT_R, Crypto, new_master, wrap  # noqa: E402
from syncd.security.keys import MAX_WORK  # noqa: E402

PASSPHRASE = "bench passphrase 4d1e"
GNU_TIME = "/usr/bin/time" if os.access("/usr/bin/time", os.X_OK) else None
MB = 1_000_000

# (label, how many, n, r, p)
CASES: list[tuple[str, int, int, int, int]] = [
    ("none planted", 0, 0, 0, 0),
    ("n=2^22 r=8 p=3 (4 GiB)", 1, 1 << 22, 8, 3),
    ("n=2^22 r=32 p=16 (16 GiB)", 1, 1 << 22, 32, 16),
    ("n=2^16 r=8 p=3 (most work accepted)", 1, 1 << 16, 8, 3),
    ("n=2^17 r=8 p=1 (most memory accepted)", 1, 1 << 17, 8, 1),
    ("100 x n=2^16 r=8 p=3", 100, 1 << 16, 8, 3),
]


def planted(key_id: str, n: int, r: int, p: int) -> bytes:
    """A key file of another master key with these scrypt parameters. Wrapped cheaply,
    then the parameters are changed: a reader still derives before the tag fails."""
    raw = wrap(Crypto(new_master()), "not yours", key_id, f"keys/{key_id}", n=1 << 10)
    doc = json.loads(raw)
    doc["kdf"].update(n=n, r=r, p=p)
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def syncd(env: dict[str, str], *args: str, measure: bool = False) -> tuple[int, float, int, str]:
    """rc, wall seconds, peak RSS bytes (-1: not measured), last stderr line."""
    cmd = [sys.executable, "-m", "syncd", *args]
    rss_file = Path(env["SYNCD_CONFIG"]).parent / "maxrss"
    if measure and GNU_TIME:
        cmd = [GNU_TIME, "-q", "-o", str(rss_file), "-f", "%M", *cmd]
    t = time.monotonic()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         stdin=subprocess.DEVNULL, text=True)
    assert p.stderr is not None
    err = p.stderr.read()
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.monotonic() - t
    rc = os.waitstatus_to_exitcode(status)
    rss = -1
    if measure:
        rss = int(rss_file.read_text().split()[-1]) * 1024 if GNU_TIME else ru.ru_maxrss * 1024
    lines = [ln for ln in err.splitlines() if ln.strip()]
    shown = [ln for ln in lines if "refusing key file" in ln or ln.startswith("syncd: ")]
    return rc, wall, rss, shown[0] if shown else (lines[-1] if lines else "")


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="syncd-keyfiles-"))
    try:
        src, store = work / "src", work / "store"
        session = src / "projects" / "-home-u-app" / "0b9c6c1e-3d44-4f0e-9d7e-3d2c1b0a9f88.jsonl"
        session.parent.mkdir(parents=True)
        session.write_text('{"type":"user","cwd":"/home/u/app"}\n' * 200)
        store.mkdir()
        (work / "syncd.toml").write_text("")
        base = {**os.environ, "SYNCD_CONFIG": str(work / "syncd.toml"),
                "SYNCD_SOURCE": str(src), "SYNCD_STORE": store.as_uri(),
                "SYNCD_MACHINE_ID": "bench-keys", "SYNCD_PASSPHRASE": PASSPHRASE,
                "PYTHONDONTWRITEBYTECODE": "1"}
        writer = {**base, "SYNCD_STATE_DIR": str(work / "writer" / "state")}
        fresh = {**base, "SYNCD_STATE_DIR": str(work / "fresh" / "state")}
        for env, args in ((writer, ("init", "--encrypt")), (writer, ("sync",))):
            rc, _, _, err = syncd(env, *args)
            if rc:
                print(f"syncd {' '.join(args)} failed: {err}", file=sys.stderr)
                return 1
        print(f"syncd writes n={SCRYPT_N} r={SCRYPT_R} p={SCRYPT_P}; one unlock spends at most "
              f"{MAX_WORK // (SCRYPT_N * SCRYPT_R * SCRYPT_P)} such derivations' work "
              "besides the remembered key file\n")
        head = (f"{'planted under keys/':40} {'reader':7} {'rc':>3} {'wall s':>7} "
                f"{'+s':>6} {'peak MB':>8}")
        print(head)
        print("-" * len(head))
        clean: dict[str, float] = {}  # wall time with nothing planted, per reader
        for label, count, n, r, p in CASES:
            for old in store.joinpath("keys").glob("0*"):
                old.unlink()
            for i in range(count):
                key_id = f"{i:016x}"
                store.joinpath("keys", key_id).write_bytes(planted(key_id, n, r, p))
            for who, env in (("fresh", fresh), ("writer", writer)):
                target = work / f"target-{who}"
                shutil.rmtree(target, ignore_errors=True)
                rc, wall, rss, err = syncd(env, "restore", "--dry-run", "--to", str(target),
                                           measure=True)
                mb = f"{rss / MB:8.0f}" if rss >= 0 else f"{'n/a':>8}"
                extra = wall - clean.setdefault(who, wall)
                print(f"{label:40} {who:7} {rc:3d} {wall:7.2f} {extra:+6.2f} {mb}", flush=True)
                if err and (rc or (who == "fresh" and count)):
                    print(f"    {err[:160]}")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

"""Is a local file being written? A running Claude appends to its session's transcript;
an import must not write under it. A file written to in the last ``quiet`` seconds, or
held open by any process, is left alone until it is quiet."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from syncd.backup.state import ImportedFile

# lsof (where there is no /proc) gets this long; no answer counts as "not open".
LSOF_TIMEOUT = 5.0
# Bytes of lsof output read at most: its size is the machine's, not ours to follow.
LSOF_MAX = 4 << 20


class Quiet:
    """``leave(rel, st)`` for the restorer: why a local file is not to be written now."""

    def __init__(self, root: Path, quiet: float, clock: Callable[[], float] = time.time,
                 imported: Callable[[bytes], ImportedFile | None] = lambda rel: None,
                 proc: Path = Path("/proc")) -> None:
        self.root = os.fsencode(os.path.realpath(root))
        self.quiet = quiet
        self.clock = clock
        # What the last import left in a file: an import's own write is not a local one.
        self.imported = imported
        self.proc = proc
        # Paths (under root) some process holds open: looked up once per import round.
        self._open: set[bytes] | None = None

    def __call__(self, rel: bytes, st: os.stat_result) -> str | None:
        age = self.clock() - st.st_mtime
        rec = self.imported(rel)
        ours = rec is not None and (rec.size, rec.mtime_ns) == (st.st_size, st.st_mtime_ns)
        if age < self.quiet and not ours:
            return f"written here {max(age, 0):.0f}s ago: left until quiet"
        if os.path.join(self.root, rel) in self._held():
            return "open in a running process: left until it is closed"
        return None

    def _held(self) -> set[bytes]:
        if self._open is None:
            self._open = _from_proc(self.proc, self.root) if self.proc.is_dir() \
                else _from_lsof(self.root)
        return self._open


def _from_proc(proc: Path, root: bytes) -> set[bytes]:
    """Every file under ``root`` that a process we may look at holds open (Linux)."""
    held: set[bytes] = set()
    prefix = root + b"/"
    try:
        pids = [e.name for e in os.scandir(proc) if e.name.isdigit()]
    except OSError:
        return held
    for pid in pids:
        fds = os.path.join(os.fsencode(proc), pid.encode(), b"fd")
        try:
            names = os.listdir(fds)
        except OSError:  # gone, or another user's
            continue
        for fd in names:
            try:
                target = os.readlink(os.path.join(fds, fd))
            except OSError:
                continue
            if target.startswith(prefix):
                held.add(target)
    return held


def _from_lsof(root: bytes) -> set[bytes]:
    """The same through ``lsof`` (macOS): no shell, bounded time and output."""
    lsof = shutil.which("lsof")
    if lsof is None:
        return set()
    try:
        out = subprocess.run([lsof, "-n", "-P", "-F", "n", "+D", os.fsdecode(root)],
                             capture_output=True, timeout=LSOF_TIMEOUT, check=False,
                             stdin=subprocess.DEVNULL).stdout[:LSOF_MAX]
    except (OSError, subprocess.SubprocessError):
        return set()
    prefix = root + b"/"
    return {line[1:] for line in out.splitlines()
            if line.startswith(b"n") and line[1:].startswith(prefix)}


__all__ = ["Quiet"]

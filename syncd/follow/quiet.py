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

from syncd.backup.ship import holds
from syncd.backup.state import ImportedFile, State

# lsof (where there is no /proc) gets this long; no answer counts as "not open".
LSOF_TIMEOUT = 5.0
# Bytes of lsof output read at most: its size is the machine's, not ours to follow.
LSOF_MAX = 4 << 20


def intact(state: State, root: bytes, rel: bytes, size: int | None = None
           ) -> ImportedFile | None:
    """The record of the import (not a merge) that wrote the local file ``rel`` as it is
    now (``size`` long, when known), or None."""
    rec = state.imported(rel)
    if rec is None or rec.merged or (size is not None and rec.size != size):
        return None
    return rec if holds(os.path.join(root, rel), rec.size, rec.check_hash) == rec.size \
        else None


def as_imported(state: State, root: Path) -> Callable[[bytes, os.stat_result], bool]:
    """For ``Quiet``: whether a local file is exactly what an import (not a merge) wrote:
    its recent mtime is the other machine's, or the import's, not a write here."""
    top = os.fsencode(root)
    return lambda rel, st: intact(state, top, rel, st.st_size) is not None


class Quiet:
    """``leave(rel, st)`` for the restorer: why a local file is not to be written now."""

    def __init__(self, root: Path, quiet: float, clock: Callable[[], float] = time.time,
                 proc: Path = Path("/proc"),
                 ours: Callable[[bytes, os.stat_result], bool] | None = None) -> None:
        self.root = os.fsencode(os.path.realpath(root))
        self.quiet = quiet
        self.clock = clock
        self.proc = proc
        # Whether a file is as an import left it: its mtime is not a write here.
        self.ours = ours
        # Paths (under root) some process holds open: looked up once per import round.
        self._open: set[bytes] | None = None

    def __call__(self, rel: bytes, st: os.stat_result) -> str | None:
        age = self.clock() - st.st_mtime
        if age < self.quiet and not (self.ours is not None and self.ours(rel, st)):
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


__all__ = ["Quiet", "as_imported", "intact"]

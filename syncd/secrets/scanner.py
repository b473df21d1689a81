"""Keeping the secrets findings up to date with this machine's Claude tree: its
transcripts (subagents included), tool results and prompt history.

Incremental as the search index is: only bytes past a file's cursor are read, a window
of ``WINDOW`` at a time (a line over ``LINE_MAX`` is passed over with a note, never held
whole); a file whose head or last scanned line changed (a cut, a rewrite), that is
shorter, or that is another inode is scanned again from 0; a file gone loses its
findings. Files are opened read-only and never written: scanning alters nothing.
``Background`` runs it in the daemon on a thread of its own at the lowest CPU priority,
fed the paths each flush shipped.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import stat
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from syncd import background, filemarks
from syncd.errors import SyncdError
from syncd.secrets.detector import LINE_MAX
from syncd.secrets.findings import FILE_NAME, Findings, is_scanned

log = logging.getLogger(__name__)

# Raw bytes read at a time: a whole line of LINE_MAX fits.
WINDOW = LINE_MAX + 1
COMMIT_EVERY = 64


@dataclass
class Pass:
    """What one pass did."""

    files: int = 0      # files read (some of their bytes)
    bytes: int = 0      # bytes scanned
    rescanned: int = 0  # files scanned again from 0 (a cut or a rewrite)
    deleted: int = 0    # files gone


class Scanner:
    """Brings ``findings`` up to date with the tree at ``root`` (machine ``machine``)."""

    def __init__(self, findings: Findings, root: Path, machine: str) -> None:
        self.findings = findings
        self.root = root
        self.machine = machine
        self._stats: dict[bytes, tuple[int, int, int]] = {}  # path: ino, size, mtime

    def forget(self) -> None:
        """What was rolled back is looked at again: no file is taken as unchanged."""
        self._stats.clear()

    def files(self) -> Iterable[bytes]:
        """Every file scanned (relative paths); symlinks not followed."""
        if (self.root / "history.jsonl").is_file():
            yield b"history.jsonl"
        for dirpath, dirs, names in os.walk(self.root / "projects"):
            rel = os.fsencode(os.path.relpath(dirpath, self.root))
            for name in names:
                path = rel + b"/" + os.fsencode(name)
                if is_scanned(path):
                    yield path
            dirs.sort()

    def update_all(self, stop: threading.Event | None = None) -> Pass:
        """One pass over the whole tree: unchanged files cost a stat."""
        done = Pass()
        seen = set()
        for i, path in enumerate(self.files()):
            if stop is not None and stop.is_set():
                break
            seen.add(path)
            self._update(path, done, quick=True)
            if i % COMMIT_EVERY == COMMIT_EVERY - 1:
                self.findings.commit()
        else:
            for path, deleted in self.findings.files(self.machine).items():
                if not deleted and path not in seen:
                    self.findings.mark_deleted(self.machine, path)
                    done.deleted += 1
        self.findings.commit()
        return done

    def update(self, paths: Iterable[bytes], stop: threading.Event | None = None) -> Pass:
        """The given paths (relative to the root): those not scanned are passed over."""
        done = Pass()
        for path in paths:
            if stop is not None and stop.is_set():
                break
            if is_scanned(path):
                self._update(path, done, quick=False)
        self.findings.commit()
        return done

    def _update(self, path: bytes, done: Pass, *, quick: bool) -> None:
        full = os.path.join(os.fsencode(self.root), path)
        try:
            fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            c = self.findings.cursor(self.machine, path)
            if c is not None and not c.deleted:
                self.findings.mark_deleted(self.machine, path)
                done.deleted += 1
            return
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return
            key = (st.st_ino, st.st_size, st.st_mtime_ns)
            if self._stats.get(path) == key:
                return
            c = self.findings.cursor(self.machine, path)
            if quick and c is not None and not c.deleted and c.gen == st.st_ino and \
                    c.size == st.st_size:
                self._stats[path] = key
                return
            start = 0
            if c is not None and c.gen == st.st_ino and not c.deleted and \
                    filemarks.still(fd, st.st_size, c):
                start = c.size
            elif c is not None and c.size > 0:
                done.rescanned += 1
            if start < st.st_size or c is None or c.deleted or (start == 0 and c.size > 0):
                self._read(fd, path, st.st_ino, start, st.st_size, done)
            self._stats[path] = key
        except OSError as e:
            log.warning("secrets: cannot scan %s: %s", os.fsdecode(full), e)
        finally:
            os.close(fd)

    def _read(self, fd: int, path: bytes, gen: int, start: int, size: int,
              done: Pass) -> None:
        done.files += 1
        self.findings.feed(self.machine, path, gen, start, b"")  # a rescan drops the old
        pos = start
        while pos < size:
            data = os.pread(fd, min(WINDOW, size - pos), pos)
            if not data:
                break
            used = self.findings.feed(self.machine, path, gen, pos, data)
            done.bytes += used
            if used == 0:  # a last line still being written
                break
            pos += used


class Background(background.Background[Scanner]):
    """The daemon's scanner (``background.Background``)."""

    name = "secrets"
    # A command's scan in between (the daemon's lock is not one), a disk error: the
    # files are looked at again, from their cursors.
    retried = (SyncdError, OSError, ValueError, sqlite3.Error)

    def __init__(self, state_dir: Path, root: Path, machine: str) -> None:
        self.path = state_dir / FILE_NAME
        self.root = root
        self.machine = machine
        super().__init__()

    def submit(self, paths: Iterable[bytes]) -> None:
        """Scan what of ``paths`` (flushed) is past the cursors."""
        self.hand(paths)

    def open(self) -> Scanner:
        return Scanner(Findings.open(self.path), self.root, self.machine)

    def work(self, job: Scanner, paths: set[bytes], full: bool,
             stop: threading.Event) -> None:
        if full:
            job.update_all(stop)
        job.update(paths, stop)

    def failed(self, job: Scanner) -> None:
        with contextlib.suppress(sqlite3.Error):
            job.findings.db.rollback()
        job.forget()

    def close(self, job: Scanner) -> None:
        job.findings.close()


def update_local(state_dir: Path, root: Path, machine: str) -> Pass:
    """One pass from a command (no daemon running): the findings made current."""
    with Findings.open(state_dir / FILE_NAME) as findings:
        return Scanner(findings, root, machine).update_all()

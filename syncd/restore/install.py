"""Installing restored files: write, fsync, mode 0600, mtime, rename; directories fsynced
once at the end.

Done by worker threads, so waiting for the disk (fsync releases the GIL) overlaps the
next file's fetch and rewrite; at most ``MAX_BYTES`` of content wait in memory. A file
can be prepared (mode, mtime, fsync) before it is known where it goes: installing it is
then a rename.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from syncd.claude import sweep_temps, temp_name
from syncd.errors import RestoreError
from syncd.private import create_private

# Claude Code deletes transcripts older than cleanupPeriodDays (30) at start-up;
# a restored mtime older than this is replaced by the time of the restore.
MTIME_FLOOR_DAYS = 25
WORKERS = 4
MAX_BYTES = 256 << 20


class Installer:
    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="syncd-install")
        self._futures: list[tuple[bytes, Future[None]]] = []
        self._dirs: set[bytes] = set()
        self._prepared: dict[bytes, tuple[int, Future[None]]] = {}
        # Directories made or checked by this restore: see make_parents.
        self.known: set[bytes] = set()
        self._room = threading.BoundedSemaphore(MAX_BYTES >> 20)

    def prepare(self, src: bytes, mtime_ns: int) -> None:
        """Make the finished file ``src`` ready to be renamed into place (mode, mtime, and
        its bytes durable), now, in a worker thread: a later ``rename`` of it with the same
        mtime only renames."""
        self._prepared[src] = (mtime_ns, self._pool.submit(_ready, src, mtime_ns))

    def rename(self, src: bytes, dest: bytes, mtime_ns: int,
               expect: os.stat_result | None = None) -> None:
        """Install the finished file ``src`` (same filesystem) as ``dest`` (``expect``: the
        local file it replaces, as it was looked at; ``Changed`` if it is no longer)."""
        prepared = self._prepared.pop(src, None)
        if prepared is not None and prepared[0] == mtime_ns:
            ready = prepared[1]

            def replace() -> None:
                ready.result()  # submitted before this job: already running or done
                unchanged(dest, expect)
                os.replace(src, dest)

            self._submit(dest, replace, 0)
            return
        if prepared is not None:  # not changing src while this still does; redone below
            with contextlib.suppress(Exception):
                prepared[1].result()
        self._submit(dest, lambda: _finish(src, dest, mtime_ns, expect=expect), 0)

    def write(self, content: bytes, dest: bytes, mtime_ns: int, mode: int = 0o600,
              expect: os.stat_result | None = None) -> None:
        """Install ``content`` as ``dest``, through a temp file beside it."""
        self._submit(dest, lambda: _write(content, dest, mtime_ns, mode, expect),
                     len(content))

    def append(self, content: bytes | Path, dest: bytes, mtime_ns: int,
               expect: os.stat_result, skip: int = 0) -> None:
        """Add ``content`` (bytes, or a file's bytes from ``skip`` on) at the end of the
        local file ``dest``, in place: a process holding it open (a running Claude, an
        appender) keeps writing to the same file, and nothing it wrote is lost. Only while
        ``dest`` is still the file ``expect`` saw (else ``Changed``)."""
        size = len(content) if isinstance(content, bytes) else 0
        self._submit(dest, lambda: _append(content, dest, mtime_ns, expect, skip), size)

    def produce(self, make: Callable[[], bytes], dest: bytes, mtime_ns: int,
                memory: int) -> None:
        """Install the file ``make`` writes (same filesystem; it returns its path) as
        ``dest``: made in a worker thread too, holding about ``memory`` bytes meanwhile."""
        self._submit(dest, lambda: _finish(make(), dest, mtime_ns), memory)

    def _submit(self, dest: bytes, job: Callable[[], None], size: int) -> None:
        units = max(1, min(size >> 20, MAX_BYTES >> 20))
        for _ in range(units):
            self._room.acquire()

        def run() -> None:
            try:
                job()
            finally:
                for _ in range(units):
                    self._room.release()

        self._dirs.add(os.path.dirname(dest))
        self._futures.append((dest, self._pool.submit(run)))

    def finish(self) -> list[tuple[bytes, Exception]]:
        """Wait for every file, then fsync the directories; the files that failed and
        why, in order (one file's failure never stops the others)."""
        errors = []
        for dest, fut in self._futures:
            try:
                fut.result()
            except Exception as e:
                errors.append((dest, e))
        self._futures = []
        for _, fut in self._prepared.values():  # never renamed: staged files, thrown away
            with contextlib.suppress(Exception):
                fut.result()
        self._prepared.clear()
        for d in sorted(self._dirs):
            sweep_temps(d)  # what a killed restore left beside these files
            with contextlib.suppress(OSError):
                fsync_dir(d)
        self._dirs.clear()
        return errors

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class Changed(RestoreError):
    """A local file changed between the look that decided to replace it and its
    replacement (being written here): left as it is."""

    @classmethod
    def at(cls, path: bytes) -> Changed:
        return cls(f"{os.fsdecode(path)}: changed while being restored; left as it is")


def _write(content: bytes, dest: bytes, mtime_ns: int, mode: int = 0o600,
           expect: os.stat_result | None = None) -> None:
    tmp = os.path.join(os.path.dirname(dest), os.fsencode(temp_name()))
    try:
        with os.fdopen(create_private(tmp, os.O_EXCL), "wb") as out:
            out.write(content)
        _finish(tmp, dest, mtime_ns, mode, expect=expect)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _finish(tmp: bytes, dest: bytes, mtime_ns: int, mode: int = 0o600,
            expect: os.stat_result | None = None) -> None:
    """fsync, mode 0600 (or ``mode``: a hook script's 0700), an mtime Claude's cleanup will
    not delete, then rename; over ``expect`` (the local file as it was decided on) only
    while it is still that file: bytes appended meanwhile are never replaced."""
    with open(tmp, "rb+") as fh:
        os.fsync(fh.fileno())
    os.chmod(tmp, mode)
    if mtime_ns < (time.time() - MTIME_FLOOR_DAYS * 86400) * 1e9:
        mtime_ns = time.time_ns()
    os.utime(tmp, ns=(mtime_ns, mtime_ns))
    unchanged(dest, expect)
    os.replace(tmp, dest)


def _append(content: bytes | Path, dest: bytes, mtime_ns: int, expect: os.stat_result,
            skip: int) -> None:
    fd = os.open(dest, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if (st.st_size, st.st_mtime_ns, st.st_ino) != (
                expect.st_size, expect.st_mtime_ns, expect.st_ino):
            raise Changed.at(dest)
        if isinstance(content, bytes):
            _write_all(fd, content)
        else:
            with open(content, "rb") as src:
                src.seek(skip)
                while chunk := src.read(1 << 20):
                    _write_all(fd, chunk)
        os.fsync(fd)
        if mtime_ns < (time.time() - MTIME_FLOOR_DAYS * 86400) * 1e9:
            mtime_ns = time.time_ns()
        os.utime(fd, ns=(mtime_ns, mtime_ns))
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _ready(tmp: bytes, mtime_ns: int) -> None:
    """``_finish`` but the rename, mode and mtime first, so one fsync makes all durable."""
    if mtime_ns < (time.time() - MTIME_FLOOR_DAYS * 86400) * 1e9:
        mtime_ns = time.time_ns()
    fd = os.open(tmp, os.O_RDWR)
    try:
        os.fchmod(fd, 0o600)
        os.utime(fd, ns=(mtime_ns, mtime_ns))
        os.fsync(fd)
    finally:
        os.close(fd)


def check_parents(target: Path, rel: bytes, known: set[bytes] | None = None) -> None:
    """Refuse a path whose existing parents under ``target`` are not plain directories.
    ``known``: directories this restore made or checked already (their parents too)."""
    cur = os.fsencode(target)
    if known is not None and os.path.join(cur, os.path.dirname(rel)) in known:
        return
    for part in rel.split(b"/")[:-1]:
        cur = os.path.join(cur, part)
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(st.st_mode):
            raise RestoreError(f"{os.fsdecode(cur)}: exists and is not a directory "
                               "(symlinks are not followed)")


def make_parents(target: Path, rel: bytes, known: set[bytes] | None = None) -> None:
    """``rel``'s parents under ``target``, made 0700 where missing; never through a
    symlink. ``known``: as for ``check_parents``; the parents are added to it (the files
    of one folder then cost no mkdir and no lstat of each parent again)."""
    top = os.fsencode(target)
    if known is not None and os.path.join(top, os.path.dirname(rel)) in known:
        return
    check_parents(target, rel)
    cur = top
    for part in rel.split(b"/")[:-1]:
        cur = os.path.join(cur, part)
        with contextlib.suppress(FileExistsError):
            os.mkdir(cur, 0o700)
    check_parents(target, rel)
    if known is not None:
        cur = top
        for part in rel.split(b"/")[:-1]:
            cur = os.path.join(cur, part)
            known.add(cur)


def changed(path: bytes, before: os.stat_result) -> bool:
    """Whether ``path`` is no longer the file ``before`` saw (size, mtime or inode)."""
    after = os.lstat(path)
    return (after.st_size, after.st_mtime_ns, after.st_ino) != (
        before.st_size, before.st_mtime_ns, before.st_ino)


def unchanged(path: bytes, before: os.stat_result | None) -> None:
    """``Changed`` when ``path`` is no longer the file ``before`` saw (None: nothing to
    check)."""
    if before is not None and changed(path, before):
        raise Changed.at(path)


def fsync_dir(path: bytes | str | Path) -> None:
    """Make the entries of directory ``path`` durable (a rename, a link, an unlink)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

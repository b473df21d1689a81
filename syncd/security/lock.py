"""One process per state database: an flock held for the daemon's lifetime."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from syncd.errors import Locked, StateError
from syncd.private import private_dir


class ProcessLock:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> None:
        try:
            private_dir(self.path.parent)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as e:
            raise StateError.of("lock file", self.path, e) from None
        try:
            os.fchmod(fd, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pid = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                raise Locked(f"another syncd (pid {pid}) is running on "
                             f"{self.path.parent}") from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)  # ENOSPC on a full disk
        except BaseException as e:
            os.close(fd)  # the flock with it: held on, a retry here would meet itself
            if isinstance(e, OSError):
                raise StateError.of("lock file", self.path, e) from None
            raise
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)
            self._fd = None

    def holder(self) -> int | None:
        """The pid holding the lock, or None when nobody does."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.pread(fd, 32, 0).decode(errors="replace").strip()
            return int(text) if text.isdigit() else -1
        finally:
            os.close(fd)
        return None

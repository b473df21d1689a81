"""Background: a daemon's pass over what each flush shipped, in a thread of its own.

The search index and the secrets scan read the bytes a flush shipped, from the local
tree, without slowing the flush: a thread at the lowest CPU priority that sleeps on an
event until it is handed paths (and makes one pass over everything at its start). A
pass that fails keeps its paths for the next one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Generic, TypeVar

from syncd.errors import SyncdError

log = logging.getLogger("syncd.background")

J = TypeVar("J")


class Background(ABC, Generic[J]):
    name = "background"
    # What a pass may raise and still be tried again with the next flush.
    retried: tuple[type[BaseException], ...] = (SyncdError, OSError)

    def __init__(self) -> None:
        self._pending: set[bytes] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._all = True
        self.passes = 0  # rounds done (tests wait on it)
        self._thread = threading.Thread(target=self._run, name=f"syncd-{self.name}",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=30)

    def hand(self, paths: Iterable[bytes]) -> None:
        """Look at ``paths`` (flushed) at the next pass."""
        with self._lock:
            self._pending.update(paths)
        self._wake.set()

    @abstractmethod
    def open(self) -> J:
        """The job's database and worker (``SyncdError``: the pass stays off)."""

    @abstractmethod
    def work(self, job: J, paths: set[bytes], full: bool, stop: threading.Event) -> None:
        """One pass: everything first when ``full``, then ``paths``."""

    def failed(self, job: J) -> None:
        """A pass raised: what to undo before the next one."""

    @abstractmethod
    def close(self, job: J) -> None: ...

    def _run(self) -> None:
        with contextlib.suppress(OSError, AttributeError):  # Linux: per thread
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        try:
            job = self.open()
        except SyncdError as e:
            log.error("%s: %s (it stays off until a restart)", self.name, e)
            return
        try:
            while not self._stop.is_set():
                self._wake.wait()
                self._wake.clear()
                if self._stop.is_set():
                    break
                with self._lock:
                    paths, self._pending = self._pending, set()
                    full, self._all = self._all, False
                try:
                    self.work(job, paths, full, self._stop)
                except self.retried as e:
                    log.warning("%s: the pass failed (tried again with the next flush): %s",
                                self.name, e)
                    self.failed(job)
                    with self._lock:
                        self._pending |= paths
                        self._all = self._all or full
                self.passes += 1
        finally:
            self.close(job)


__all__ = ["Background"]

"""The watcher: file-system events (through watchdog) become paths in the dirty set.

watchdog's ``Observer`` is the platform's own: inotify on Linux, FSEvents on macOS.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable
from pathlib import Path

from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer

from syncd.claude import Selection

log = logging.getLogger("syncd.watch")
_EVENTS = [FileModifiedEvent, FileCreatedEvent, FileDeletedEvent, FileMovedEvent,
           FileClosedEvent, DirCreatedEvent, DirDeletedEvent, DirMovedEvent]


class _Overflow(logging.Handler):
    """watchdog rebuilds its watches after an inotify queue overflow but only logs it;
    its log record is our one signal that events were lost and a rescan is due.

    Linux only: watchdog's FSEvents emitter passes on no sign of events macOS dropped,
    so there the start-up and hourly reconcile scans are what catch them."""

    def __init__(self, callback: Callable[[], None]) -> None:
        super().__init__(logging.WARNING)
        self.callback = callback

    def emit(self, record: logging.LogRecord) -> None:
        if "overflow" in record.getMessage().lower():
            self.callback()


class Watcher(FileSystemEventHandler):
    def __init__(self, root: Path, selection: Selection, *, on_file: Callable[[bytes], None],
                 on_dir: Callable[[bytes], None], on_overflow: Callable[[], None]) -> None:
        self.root = os.fsencode(root)
        self.selection = selection
        self.on_file = on_file
        self.on_dir = on_dir
        self._overflow = _Overflow(on_overflow)
        self._observer = Observer()

    def start(self) -> None:
        for name in ("watchdog.observers.inotify", "watchdog.observers.inotify_c"):
            logging.getLogger(name).addHandler(self._overflow)
        # A directory deleted and made again within one burst (rm -rf, then a restore) gets
        # a watch watchdog already holds for it; it replaces the callback by the same one
        # and warns, one line of several KB per directory. Nothing is lost: silenced.
        warnings.filterwarnings("ignore", message="Callback with id .* already exists",
                                category=RuntimeWarning, module=r"watchdog\.")
        # Only events that change the tree: reads would otherwise raise "opened"/"closed"
        # events, and our own reads of a large tree overflow the kernel's queue.
        self._observer.schedule(self, os.fsdecode(self.root), recursive=True,
                                event_filter=_EVENTS)
        self._observer.start()

    def stop(self) -> None:
        if self._observer.is_alive():  # a start that failed early never began watching
            self._observer.stop()
            self._observer.join(timeout=5)
        for name in ("watchdog.observers.inotify", "watchdog.observers.inotify_c"):
            logging.getLogger(name).removeHandler(self._overflow)

    def _rel(self, path: str | bytes) -> bytes | None:
        raw = os.fsencode(path)
        if not raw.startswith(self.root + b"/"):
            return None
        return raw[len(self.root) + 1 :]

    def on_any_event(self, event: FileSystemEvent) -> None:
        for path in (event.src_path, getattr(event, "dest_path", "")):
            rel = self._rel(path) if path else None
            if rel is None:
                continue
            if event.is_directory:
                # A directory created, moved or removed as a whole: files in it may have
                # come or gone without an event of their own.
                if event.event_type != "modified" and \
                        self.selection.may_descend(os.fsdecode(rel)):
                    self.on_dir(rel)
            elif self.selection.wants(os.fsdecode(rel)):
                self.on_file(rel)

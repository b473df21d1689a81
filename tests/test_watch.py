from __future__ import annotations

import logging
import threading
import warnings
from pathlib import Path

from watchdog.events import FileSystemEvent

from syncd.backup.watch import Watcher
from syncd.claude import Selection
from tests.helpers import wait_for, write


def _watcher(root: Path) -> tuple[Watcher, list[bytes], list[bytes], threading.Event]:
    files: list[bytes] = []
    dirs: list[bytes] = []
    overflow = threading.Event()
    w = Watcher(root, Selection(), on_file=files.append, on_dir=dirs.append,
                on_overflow=overflow.set)
    return w, files, dirs, overflow


def test_overflow_record_from_watchdog_requests_a_rescan(tmp_path: Path) -> None:
    w, _files, _dirs, overflow = _watcher(tmp_path)
    w.start()
    try:
        logging.getLogger("watchdog.observers.inotify_c").warning(
            "Inotify queue overflowed; filesystem events were lost")
        assert overflow.wait(5)
    finally:
        w.stop()
    overflow.clear()
    logging.getLogger("watchdog.observers.inotify_c").warning("Inotify queue overflowed")
    assert not overflow.is_set()  # detached on stop


def test_events_are_filtered_by_selection(tmp_path: Path) -> None:
    w, files, _dirs, _ = _watcher(tmp_path)
    (tmp_path / "projects").mkdir()
    w.start()
    try:
        write(tmp_path, ".credentials.json", b"secret")
        write(tmp_path, "projects/a.jsonl", b"x\n")
        wait_for(lambda: b"projects/a.jsonl" in files, 10, "event")
    finally:
        w.stop()
    assert b"projects/a.jsonl" in files
    assert b".credentials.json" not in files


def test_reading_files_raises_no_events(tmp_path: Path) -> None:
    """Reads must stay silent: on a large tree they would overflow the kernel queue."""
    write(tmp_path, "projects/a.jsonl", b"x\n")
    kinds: list[str] = []

    class Counting(Watcher):
        def on_any_event(self, event: FileSystemEvent) -> None:
            kinds.append(event.event_type)
            super().on_any_event(event)

    files: list[bytes] = []
    dirs: list[bytes] = []
    overflow = threading.Event()
    w = Counting(tmp_path, Selection(), on_file=files.append, on_dir=dirs.append,
                 on_overflow=overflow.set)
    w.start()
    try:
        for _ in range(50):
            (tmp_path / "projects" / "a.jsonl").read_bytes()
            list((tmp_path / "projects").iterdir())
        write(tmp_path, "projects/b.jsonl", b"y\n")  # events arrive in order
        wait_for(lambda: b"projects/b.jsonl" in files, 10, "event")
    finally:
        w.stop()
    assert b"projects/a.jsonl" not in files and not dirs and not overflow.is_set()
    assert "opened" not in kinds and "closed_no_write" not in kinds, kinds


def test_watchdogs_duplicate_callback_warning_is_silenced(tmp_path: Path) -> None:
    """A directory removed and made again in one burst makes watchdog warn, once per
    directory, about a watch it already holds; nothing is lost, so no line is printed."""
    w, _files, _dirs, _ = _watcher(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # every warning shows, but for what the watcher says
        w.start()
        try:
            for text in ("Callback with id 'x' already exists for watch w. It will be "
                         "Overwritten.", "something else"):
                warnings.warn_explicit(text, RuntimeWarning, "inotify_c.py", 1,
                                       module="watchdog.observers.inotify_c")
        finally:
            w.stop()
    assert [str(c.message) for c in caught] == ["something else"]

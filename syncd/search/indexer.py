"""Keeping the index up to date with this machine's Claude tree: its transcripts
(``projects/**.jsonl``, subagents included, each under its session).

Incremental: only bytes past a file's cursor are read, in chunks of ``CHUNK``; a file
whose head or last indexed line changed (a cut, a rewrite), that is shorter, or that is
another inode (renamed over) is read again from 0; a file gone is marked deleted and
stays findable. Sessions another machine's were brought here from (follow, restore)
record that machine. ``Background`` runs it in the daemon, on a low-priority thread of
its own that sleeps on an event.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from syncd import background, filemarks
from syncd.format.catalog import (
    TITLE_FILE_MAX,
    MetaScanner,
    session_of,
    session_of_any,
    title_file_fields,
    title_file_owner,
)
from syncd.search.index import FILE_NAME, SearchIndex

log = logging.getLogger(__name__)

CHUNK = 4 << 20
# Files committed per transaction: a long first pass leaves room to a command's search.
COMMIT_EVERY = 64


@dataclass
class Pass:
    """What one pass did."""

    files: int = 0      # files read (some of their bytes)
    bytes: int = 0      # bytes read
    reindexed: int = 0  # files read again from 0 (a cut or a rewrite)
    deleted: int = 0    # files marked deleted


class Indexer:
    """Brings ``index`` up to date with the tree at ``root`` (machine ``machine``).
    ``origins``: each session brought here from another machine, that machine."""

    def __init__(self, index: SearchIndex, root: Path, machine: str,
                 origins: Callable[[], dict[str, str]] | None = None) -> None:
        self.index = index
        self.root = root
        self.machine = machine
        self._origins = origins
        self._stats: dict[bytes, tuple[int, int, int]] = {}  # path: ino, size, mtime

    def transcripts(self) -> Iterable[bytes]:
        """Every transcript under ``projects/`` (relative paths); symlinks not followed."""
        top = self.root / "projects"
        for dirpath, dirs, names in os.walk(top):
            rel = os.fsencode(os.path.relpath(dirpath, self.root))
            for name in names:
                if name.endswith(".jsonl") or name == "custom-title.json":
                    path = rel + b"/" + os.fsencode(name)
                    if session_of_any(path) is not None:
                        yield path
            dirs.sort()

    def update_all(self, stop: threading.Event | None = None,
                   origins: dict[str, str] | None = None) -> Pass:
        """One pass over the whole tree: unchanged files cost a stat."""
        done = Pass()
        seen = set()
        if origins is None:
            origins = self._origins() if self._origins is not None else {}
        for i, path in enumerate(self.transcripts()):
            if stop is not None and stop.is_set():
                self.index.commit()
                return done
            if path.endswith(b".json"):
                self._title(path)
                continue
            seen.add(path)
            self._update(path, done, origins, quick=True)
            if i % COMMIT_EVERY == COMMIT_EVERY - 1:
                self.index.commit()
        for path, deleted in self.index.files(self.machine).items():
            if not deleted and path not in seen:
                self.index.mark_deleted(self.machine, path)
                done.deleted += 1
        self.index.commit()
        return done

    def update(self, paths: Iterable[bytes], origins: dict[str, str] | None = None,
               stop: threading.Event | None = None) -> Pass:
        """The given paths (relative to the root): those not transcripts are passed over.
        Stopped, the rest waits for the next start's pass (their sizes tell them)."""
        done = Pass()
        if origins is None:
            origins = self._origins() if self._origins is not None else {}
        for path in paths:
            if stop is not None and stop.is_set():
                break
            if title_file_owner(path) is not None:
                self._title(path)
            elif path.startswith(b"projects/") and path.endswith(b".jsonl") and \
                    session_of_any(path) is not None:
                self._update(path, done, origins, quick=False)
        self.index.commit()
        return done

    def _update(self, path: bytes, done: Pass, origins: dict[str, str], *,
                quick: bool) -> None:
        full = os.path.join(os.fsencode(self.root), path)
        try:
            fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            if self.index.cursor(self.machine, path) is not None:
                self.index.mark_deleted(self.machine, path)
                done.deleted += 1
            return
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return
            key = (st.st_ino, st.st_size, st.st_mtime_ns)
            if self._stats.get(path) == key:
                return
            m = self.index.marks(self.machine, path)
            if quick and m is not None and not m.deleted and m.gen == st.st_ino and \
                    m.size == st.st_size:
                self._stats[path] = key  # unchanged since indexed: a stat is all it costs
                return
            start = 0
            if m is not None and m.gen == st.st_ino and filemarks.still(fd, st.st_size, m):
                start = m.size
            elif m is not None:
                done.reindexed += 1
            if start < st.st_size or m is None or m.deleted or (start == 0 and m.size > 0):
                self._read(fd, path, st.st_ino, start, st.st_size, done, origins)
            self._stats[path] = key
        except OSError as e:
            log.warning("search: cannot index %s: %s", os.fsdecode(full), e)
        finally:
            os.close(fd)

    def _title(self, path: bytes) -> None:
        """A session's ``custom-title.json`` (a /rename): its title, as the catalog takes it."""
        sid = session_of_any(path)
        full = os.path.join(os.fsencode(self.root), path)
        try:
            fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            return
        try:
            st = os.fstat(fd)
            key = (st.st_ino, st.st_size, st.st_mtime_ns)
            if sid is None or not stat.S_ISREG(st.st_mode) or self._stats.get(path) == key:
                return
            self._stats[path] = key
            found = title_file_fields(os.pread(fd, TITLE_FILE_MAX + 1, 0))
        except OSError:
            return
        finally:
            os.close(fd)
        if found:
            self.index.fold_catalog(self.machine, sid, found)

    def _read(self, fd: int, path: bytes, gen: int, start: int, size: int, done: Pass,
              origins: dict[str, str]) -> None:
        sid = session_of(path)  # a top-level transcript: its lines name the catalog
        scan = MetaScanner(at_line_start=True) if sid is not None else None
        pos = start
        done.files += 1
        # Read anew, what was indexed of it goes first (even when it is empty now); back
        # after a deletion, it is no longer marked.
        self.index.feed(self.machine, path, gen, start, b"")
        while pos < size:
            data = os.pread(fd, min(CHUNK, size - pos), pos)
            if not data:
                break
            used = self.index.feed(self.machine, path, gen, pos, data)
            done.bytes += used
            if scan is not None:
                scan.feed(data[:used])
            if used == 0:  # a last line still being written
                break
            pos += used
        if sid is not None and scan is not None:
            found = scan.finish()
            self.index.fold_catalog(self.machine, sid, found, reset=start == 0)
            if sid in origins:
                self.index.set_session(self.machine, sid, {"origin": origins[sid]})


class Background(background.Background[Indexer]):
    """The daemon's indexer (``background.Background``)."""

    name = "search"

    def __init__(self, state_dir: Path, root: Path, machine: str) -> None:
        self.path = state_dir / FILE_NAME
        self.root = root
        self.machine = machine
        # Given by the caller's thread, which owns the state database.
        self._origins: dict[str, str] = {}
        super().__init__()

    def submit(self, paths: Iterable[bytes], origins: dict[str, str]) -> None:
        """Index ``paths`` (flushed); ``origins`` as ``Indexer`` takes them."""
        with self._lock:
            self._origins = origins
        self.hand(paths)

    def open(self) -> Indexer:
        return Indexer(SearchIndex.open(self.path), self.root, self.machine)

    def work(self, job: Indexer, paths: set[bytes], full: bool,
             stop: threading.Event) -> None:
        with self._lock:
            origins = self._origins
        if full:
            job.update_all(stop, origins)
        job.update(paths, origins, stop)

    def close(self, job: Indexer) -> None:
        job.index.close()


def update_local(state_dir: Path, root: Path, machine: str,
                 origins: Callable[[], dict[str, str]] | None = None) -> Pass:
    """One pass from a command (no daemon running): the index made current."""
    with SearchIndex.open(state_dir / FILE_NAME) as index:
        return Indexer(index, root, machine, origins).update_all()

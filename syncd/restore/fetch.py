"""The fetch into staging: every file's extents, window by window (two at a time, each
extent checked against its sha256), written at their offsets into a staging directory
held locked while the restore runs; what was lost is cut at a line end or not restored.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import os
import shutil
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from syncd.claude import STAGING_PREFIX
from syncd.errors import FormatError, RestoreError, StoreError
from syncd.format.segment import Extent, check_extent, windows
from syncd.format.snapshot import Entry
from syncd.progress import Meter
from syncd.repository import Repository
from syncd.restore.report import RestoreReport

STAGING_LOCK = ".held"


# A staging folder without its lock file (made by an older version, or killed between
# the two) is left alone this long: it may be a restore's that is just starting.
STAGING_STALE = 3600


def _sweep_staging(target: Path) -> None:
    """Remove the staging folders that killed restores left in ``target`` (their files
    are copies of the store's bytes: nothing of the user's)."""
    try:
        names = [e.name for e in os.scandir(target)
                 if e.name.startswith(STAGING_PREFIX) and e.is_dir(follow_symlinks=False)]
    except OSError:
        return
    for name in names:
        d = target / name
        try:
            fd = os.open(d / STAGING_LOCK, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            with contextlib.suppress(OSError):
                if time.time() - os.lstat(d).st_mtime > STAGING_STALE:
                    shutil.rmtree(d, ignore_errors=True)
            continue
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: a restore running now
            os.close(fd)
            continue
        try:
            shutil.rmtree(d, ignore_errors=True)
        finally:
            os.close(fd)


class Staging:
    """A staging folder in ``target`` (None: a temporary one, for a dry run), held locked
    until ``close`` removes it: one nobody holds was left by a restore that was killed
    (a later one removes it)."""

    def __init__(self, target: Path | None) -> None:
        self.path = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=target))
        _spread(self.path)
        self._held = os.open(self.path / STAGING_LOCK,
                             os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._held, fcntl.LOCK_EX)

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self._held)


# Linux's FS_IOC_GETFLAGS, FS_IOC_SETFLAGS and FS_TOPDIR_FL (the flag takes an int).
_GETFLAGS, _SETFLAGS, _TOPDIR = 0x80086601, 0x40086602, 0x00020000


def _spread(staging: Path) -> None:
    """Ask ext2/3/4 to spread the staging directory's subdirectories (and so the files
    made in them) over block groups, as it spreads top-level directories. Without it they
    all share the target's group, whose inode search, on a filesystem without a journal,
    steps over every inode deleted there in the last minutes one by one: after an
    ``rm -rf`` of a tree, restoring 1 GB into its place cost 1.5-2.5 s more CPU in the
    kernel. Best effort: another filesystem (or system) just says no."""
    if not sys.platform.startswith("linux"):
        return
    try:
        fd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        flags = struct.unpack("i", fcntl.ioctl(fd, _GETFLAGS, bytes(8))[:4])[0]
        if not flags & _TOPDIR:
            fcntl.ioctl(fd, _SETFLAGS, struct.pack("i", flags | _TOPDIR) + bytes(4))
    except OSError:
        pass
    finally:
        os.close(fd)


def _make_room(target: Path, files: dict[bytes, Entry]) -> None:
    """Make ``target`` (writable, room for ``files``) and sweep the staging folders killed
    restores left there."""
    try:
        target.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as e:
        raise RestoreError(f"{target}: cannot create: {e.strerror}") from e
    if not os.access(target, os.W_OK | os.X_OK):
        raise RestoreError(f"{target}: not writable")
    # Sizes are what the backup claims: a disk that cannot hold them is said at once
    # (a file skipped as the last import left it needs nothing).
    need = sum(min(f.size, sum(x.end - x.start for _, x in f.extents))
               for f in files.values())
    fs = os.statvfs(target)
    if need > fs.f_bavail * fs.f_frsize:
        raise RestoreError(f"{target}: the restore needs {need / 1e6:.1f} MB, the "
                           f"filesystem has {fs.f_bavail * fs.f_frsize / 1e6:.1f} MB free")
    _sweep_staging(target)


# Windows fetched at once. Each holds at most one window (SPAN) and two frames in memory
# (one decoded, one that parts of it are cut from), whatever the store holds; their GETs
# overlap, and zstd and sha256, which let go of the GIL, run on every core.
FETCHERS = 2


@dataclass
class _Fetched:
    """What fetching one window of an object met, replayed in order once all are in."""
    damaged: list[tuple[Extent, FormatError]] = field(default_factory=list)
    failed: FormatError | StoreError | None = None


# Staged files are spread over this many subdirectories of the staging directory: the
# fetching threads make them as their first bytes come, and files made at once in one
# directory contend for its lock.
STAGING_DIRS = 16


def _staged_path(staging: Path, path: bytes) -> Path:
    name = hashlib.sha256(path).hexdigest()
    return staging / name[0] / name


def _stage(repo: Repository, files: dict[bytes, Entry], staging: Path,
           report: RestoreReport, meter: Meter,
           ready: Callable[[bytes], None] | None = None,
           written: Callable[[bytes], None] | None = None,
           tails: dict[bytes, int] | None = None) -> dict[bytes, Path]:
    """Fetch every file into ``staging``; returns those that arrived, whole or as the
    intact prefix of a transcript whose later bytes are lost (cut at a line end).

    ``ready`` is told (from a fetching thread) of each file as soon as all its bytes are
    staged, when nothing of it was lost: it may be placed before the others arrive.
    ``written`` is told of each file as soon as its last byte is written, when nothing of
    it was lost so far (a window of one of its objects may still fail). ``tails``: files
    fetched from a byte on (their local copy holds the bytes before it), staged from there;
    one of them that loses a byte is not restored."""
    tails = tails or {}
    by_key: dict[str, list[tuple[Entry, Extent]]] = {}
    # Per file: the first byte lost (a gap, a damaged frame, an unreadable object) and why.
    lost: dict[bytes, tuple[int, int, str]] = {}

    def lose(f: Entry, start: int, end: int, why: str) -> None:
        if f.path not in lost or start < lost[f.path][0]:
            lost[f.path] = (start, end, why)

    for f in files.values():
        base = tails.get(f.path, 0)
        if not f.sparse:
            gap = _first_gap(f, base)
            if gap is not None:
                lose(f, *gap)
        for key, ext in f.extents:
            # Not past a point-in-time size, nor before a tail.
            if (ext.start < f.size or ext.start == 0) and (not base or ext.end > base):
                by_key.setdefault(key, []).append((f, ext))
    names = {p: _staged_path(staging, p) for p in files}
    owners = {key: {id(x): f for f, x in wanted} for key, wanted in by_key.items()}
    runs: dict[str, list[list[Extent]]] = {}
    for key in sorted(by_key):
        where = repo.where(key)
        good, bad = [], []
        for x in sorted((x for _, x in by_key[key]), key=lambda e: e.off):
            try:
                check_extent(x, where)
                good.append(x)
            except FormatError:
                bad.append(x)
        # The windows read_extents would take, one job each: the same GETs.
        runs[key] = ([bad] if bad else []) + [run for run, _ in windows(good)]
    # A file is ready once every object it has bytes in was read without a fault (one that
    # fails loses all its extents, as when it was read in one go), none of its frames was
    # damaged, and it has no gap.
    lock = threading.Lock()
    jobs_left = {key: len(rs) for key, rs in runs.items()}
    failed_keys: set[str] = set()
    faulty = set(lost)
    keys_left: dict[bytes, int] = {}
    paths_of: dict[str, set[bytes]] = {}
    for key, wanted in by_key.items():
        paths_of[key] = {f.path for f, _ in wanted}
        for path in paths_of[key]:
            keys_left[path] = keys_left.get(path, 0) + 1
    made: set[bytes] = set()
    # Per file: its extents not yet written.
    unwritten: dict[bytes, int] = {}
    for wanted in by_key.values():
        for f, _ in wanted:
            unwritten[f.path] = unwritten.get(f.path, 0) + 1

    def fetch(key: str, run: list[Extent]) -> _Fetched:
        got, owner = _Fetched(), owners[key]
        try:
            for x, data in repo.read_extents(key, run, lambda x, e: got.damaged.append((x, e))):
                f = owner[id(x)]
                # At its offset: a file's extents can come from objects in any order. The
                # file is made by whichever window reaches it first, while the other
                # fetches (made up front, one at a time, they delayed the first GET).
                fd = os.open(names[f.path], os.O_RDWR | os.O_CREAT, 0o600)
                base = tails.get(f.path, 0)
                cut = max(0, base - x.start)
                try:
                    _pwrite_all(fd, memoryview(data)[cut : max(cut, f.size - x.start)],
                                x.start + cut - base)
                finally:
                    os.close(fd)
                with lock:
                    made.add(f.path)
                    meter.advance(len(data))
                    # All written: none of its extents was damaged (those are never
                    # written); a gap would have made it faulty from the start.
                    unwritten[f.path] -= 1
                    whole = unwritten[f.path] == 0 and f.path not in faulty
                if whole and written is not None:
                    written(f.path)
        except (FormatError, StoreError) as e:
            got.failed = e
        with lock:
            faulty.update(owner[id(x)].path for x, _ in got.damaged)
            if got.failed is not None:
                failed_keys.add(key)
            jobs_left[key] -= 1
            if jobs_left[key] == 0 and key not in failed_keys:
                for path in paths_of[key]:
                    keys_left[path] -= 1
                    if keys_left[path] == 0 and path not in faulty and ready is not None:
                        ready(path)
        return got

    pool = ThreadPoolExecutor(FETCHERS, thread_name_prefix="syncd-fetch")
    try:
        for d in range(STAGING_DIRS):
            (staging / f"{d:x}").mkdir(mode=0o700)
        jobs = {key: [pool.submit(fetch, key, run) for run in rs] for key, rs in runs.items()}
        for key, futures in jobs.items():
            wanted = by_key[key]
            # As one reader of the object in offset order would have met them: damaged
            # frames, up to the first window that failed; then all of its extents lost.
            for fut in futures:
                got = fut.result()
                for x, err in got.damaged:
                    lose(owners[key][id(x)], x.start, x.end, str(err))
                if got.failed is not None:
                    report.errors.append(str(got.failed))
                    for f, x in wanted:
                        lose(f, x.start, x.end, f"{key}: unreadable")
                    break
        # Those no window reached: empty files, and those whose every extent was lost.
        for path, name in names.items():
            if path not in made:
                os.close(os.open(name, os.O_WRONLY | os.O_CREAT, 0o600))
    except OSError as e:
        raise RestoreError(f"{staging}: cannot write: {e.strerror}") from e
    finally:
        # Nothing may still write into staging when it is read or goes.
        pool.shutdown(wait=True, cancel_futures=True)
    try:
        for path, (start, end, why) in lost.items():
            f = files[path]
            cut = _intact_prefix(names[path], start) if _by_lines(f) and \
                path not in tails else 0
            report.errors.append(
                f"{why}: bytes {start}..{end} of {os.fsdecode(path)} (generation {f.gen}) are "
                "lost; " + (f"restored its first {cut} bytes (whole lines)" if cut
                            else "not restored"))
            if cut:
                os.truncate(names[path], cut)
                files[path] = dataclasses.replace(f, size=cut)
                report.cut[path] = cut
            else:
                del names[path]
    except OSError as e:
        raise RestoreError(f"{staging}: cannot write: {e.strerror}") from e
    return names


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    # A write into a filling disk is short first; the next one says ENOSPC.
    while data:
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n


def _first_gap(f: Entry, pos: int = 0) -> tuple[int, int, str] | None:
    """The first range of ``f``'s bytes (from ``pos`` on) that no extent holds: (start,
    end, why)."""
    for key, e in sorted(f.extents, key=lambda ke: ke[1].start):
        if e.end <= pos:
            continue
        if e.start > pos:
            return pos, e.start, f"{key}: a gap before this object's extent"
        pos = max(pos, e.end)
        if pos >= f.size:
            return None
    last = f.extents[-1][0] if f.extents else "the backup"
    return (pos, f.size, f"{last}: the backup ends early") if pos < f.size else None


def _by_lines(f: Entry) -> bool:
    """Files whose intact prefix is worth restoring: JSON lines, cut at a line end."""
    return not f.sparse and f.path.endswith(b".jsonl")


def _intact_prefix(staged: Path, end: int) -> int:
    """The length of the staged file's whole lines before byte ``end``."""
    with open(staged, "rb") as fh:
        pos = end
        while pos > 0:
            start = max(0, pos - (1 << 20))
            fh.seek(start)
            cut = fh.read(pos - start).rfind(b"\n")
            if cut >= 0:
                return start + cut + 1
            pos = start
    return 0

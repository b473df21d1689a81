"""Restore: rebuild a machine's backed-up tree from its segments, byte for byte.

Each file is assembled in a staging directory inside the target, checked against
every extent's sha256, fsynced, then renamed into place: a failure halfway
leaves every existing file as it was. An existing file is never replaced by an
older or diverged copy (invariant 5).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import _layout as layout
from ._segment import Extent, FormatError, SegmentIndex
from ._segreader import extent_bytes, read_index
from .store import Store, StoreError

log = logging.getLogger("syncd.restore")

# Claude Code deletes transcripts older than cleanupPeriodDays (30) at start-up;
# a restored mtime older than this is replaced by the time of the restore.
MTIME_FLOOR_DAYS = 25
# Fetch a whole segment when at least this share of it is needed, else ranges.
WHOLE_OBJECT_SHARE = 0.5


class RestoreError(Exception):
    """The restore could not be done; the message says which object or path and why."""


@dataclass
class _FilePlan:
    path: bytes
    gen: int
    extents: list[tuple[str, Extent]] = field(default_factory=list)
    deleted_at: float | None = None
    mode: int = 0o600
    mtime_ns: int = 0

    @property
    def size(self) -> int:
        return self.extents[-1][1].end if self.extents else 0


@dataclass
class RestoreReport:
    written: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)    # identical already
    kept: list[str] = field(default_factory=list)       # local is newer or diverged
    errors: list[str] = field(default_factory=list)
    bytes_written: int = 0


def safe_relpath(path: bytes) -> bytes:
    """Reject store paths that could escape the target (``..``, absolute, NUL)."""
    parts = path.split(b"/")
    if not path or path.startswith(b"/") or b"\0" in path or any(
            p in (b"", b".", b"..") for p in parts):
        raise RestoreError(f"refusing unsafe path {path!r} from the store")
    return path


def segment_keys(store: Store, machine: str) -> list[tuple[str, int]]:
    prefix = layout.machine_prefix(machine) + "seg/"
    out = []
    for info in store.list(prefix):
        seq = layout.segment_seq(info.key)
        if seq is not None:
            out.append((info.key, info.size))
    return out


def plan(store: Store, machine: str) -> tuple[dict[bytes, _FilePlan], list[str]]:
    """Every file's newest generation, as a list of extents in order; plus errors."""
    files: dict[bytes, _FilePlan] = {}
    errors: list[str] = []
    keys = segment_keys(store, machine)
    if not keys:
        known = sorted({o.key.split("/")[1] for o in store.list("machines/")})
        raise RestoreError(f"{store.url}: no backup for machine {machine!r} "
                           f"(machines in this store: {', '.join(known) or 'none'})")
    expected = 0
    for key, size in keys:
        seq = layout.segment_seq(key)
        if seq != expected:
            errors.append(f"{store.url}{key}: segments {expected:016x}..{seq or 0:016x} missing")
        expected = (seq or 0) + 1
        try:
            ix = read_index(store, key, size)
        except (FormatError, StoreError) as e:
            errors.append(str(e))
            continue
        _apply(files, key, ix)
    return files, errors


def _apply(files: dict[bytes, _FilePlan], key: str, ix: SegmentIndex) -> None:
    for e in ix.extents:
        f = files.get(e.path)
        if f is None or e.gen > f.gen or (f.deleted_at is not None and e.gen != f.gen):
            f = files[e.path] = _FilePlan(e.path, e.gen)
        if e.gen < f.gen:
            continue
        f.extents.append((key, e))
        f.mode, f.mtime_ns = e.mode, e.mtime_ns
    for t in ix.tombstones:
        f = files.get(t.path)
        if f is not None and f.gen == t.gen:
            f.deleted_at = t.time


def restore_tree(store: Store, machine: str, target: Path) -> RestoreReport:
    files, errors = plan(store, machine)
    report = RestoreReport(errors=list(errors))
    target.mkdir(parents=True, exist_ok=True)
    if not os.access(target, os.W_OK | os.X_OK):
        raise RestoreError(f"{target}: not writable")
    staging = Path(tempfile.mkdtemp(prefix=".syncd-restore-", dir=target))
    try:
        _restore_into(store, files, target, staging, report)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return report


def _restore_into(store: Store, files: dict[bytes, _FilePlan], target: Path, staging: Path,
                  report: RestoreReport) -> None:
    # Work segment by segment so each object is fetched once (whole or by ranges).
    by_key: dict[str, list[tuple[_FilePlan, Extent]]] = {}
    broken: set[bytes] = set()
    for f in files.values():
        try:
            safe_relpath(f.path)
            _check_contiguous(f)
        except RestoreError as e:
            report.errors.append(str(e))
            broken.add(f.path)
            continue
        for key, ext in f.extents:
            by_key.setdefault(key, []).append((f, ext))
    tmp_names = {p: staging / hashlib.sha256(p).hexdigest() for p in files}
    for p in files:
        if p not in broken:
            tmp_names[p].touch(mode=0o600)
    for key in sorted(by_key):
        wanted = [(f, e) for f, e in by_key[key] if f.path not in broken]
        if not wanted:
            continue
        try:
            owner = {id(e): f for f, e in wanted}
            for f, data in _fetch(store, key, [e for _, e in wanted], owner):
                with open(tmp_names[f.path], "ab") as out:
                    out.write(data)
        except (FormatError, StoreError) as e:
            report.errors.append(str(e))
            broken |= {f.path for f, _ in wanted}
        except OSError as e:
            raise RestoreError(f"{staging}: cannot write: {e.strerror}") from e
    for path, f in sorted(files.items()):
        if path in broken:
            continue
        try:
            _place(tmp_names[path], target, f, report)
        except RestoreError as e:
            report.errors.append(str(e))  # this file only; the others still restore
        except OSError as e:
            raise RestoreError(f"{target / os.fsdecode(path)}: {e.strerror}") from e


def _check_contiguous(f: _FilePlan) -> None:
    pos = 0
    for key, e in f.extents:
        if e.start != pos:
            raise RestoreError(f"{key}: {os.fsdecode(f.path)} generation {f.gen} has a gap "
                               f"at byte {pos} (next extent starts at {e.start})")
        pos = e.end


def _fetch(store: Store, key: str, exts: list[Extent],
           owner: dict[int, _FilePlan]) -> list[tuple[_FilePlan, bytes]]:
    where = f"{store.url}{key}"
    exts = sorted(exts, key=lambda e: e.off)
    lo = exts[0].off
    hi = max(e.off + e.clen for e in exts)
    need = sum(e.clen for e in exts)
    out: list[tuple[_FilePlan, bytes]] = []
    if need >= WHOLE_OBJECT_SHARE * (hi - lo) or len(exts) > 64:
        blob = store.get(key, lo, hi - lo)
        for e in exts:
            out.append((owner[id(e)], extent_bytes(blob, lo, e, where)))
    else:
        for e in exts:
            out.append((owner[id(e)], extent_bytes(store.get(key, e.off, e.clen), e.off, e,
                                                   where)))
    # Sorted by offset is sorted by byte order within each file: frames are written so.
    return out


def _place(tmp: Path, target: Path, f: _FilePlan, report: RestoreReport) -> None:
    rel = os.fsdecode(f.path)
    dest = _safe_dest(target, f.path)
    size = tmp.stat().st_size
    if size != f.size:
        report.errors.append(f"{rel}: assembled {size} bytes, expected {f.size}")
        return
    try:
        st = os.lstat(dest)
    except FileNotFoundError:
        st = None
    if st is not None:
        if not stat.S_ISREG(st.st_mode):
            report.kept.append(f"{rel} (local is not a regular file)")
            return
        verdict = _compare(dest, tmp, st.st_size, size)
        if verdict == "same":
            report.skipped.append(rel)
            return
        if verdict != "backup-longer":
            report.kept.append(f"{rel} (local is {verdict})")
            return
    with open(tmp, "rb+") as fh:
        os.fsync(fh.fileno())
    os.chmod(tmp, 0o600 | (f.mode & 0o100))
    mtime = f.mtime_ns
    if mtime < (time.time() - MTIME_FLOOR_DAYS * 86400) * 1e9:
        mtime = time.time_ns()
    os.utime(tmp, ns=(mtime, mtime))
    os.replace(tmp, dest)
    report.written.append(rel)
    report.bytes_written += size


def _safe_dest(target: Path, rel: bytes) -> bytes:
    """Create the parents of ``rel`` under ``target``, refusing symlinks on the way."""
    cur = os.fsencode(target)
    parts = rel.split(b"/")
    for part in parts[:-1]:
        cur = os.path.join(cur, part)
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            os.mkdir(cur, 0o700)
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise RestoreError(f"{os.fsdecode(cur)}: exists and is not a directory "
                               "(symlinks are not followed)")
    return os.path.join(cur, parts[-1])


def _compare(local: bytes, backup: Path, local_size: int, backup_size: int) -> str:
    """'same', 'backup-longer' (local is a prefix), 'newer' (backup is a prefix), 'diverged'."""
    n = min(local_size, backup_size)
    with open(local, "rb") as a, open(backup, "rb") as b:
        while n > 0:
            k = min(n, 1 << 20)
            if a.read(k) != b.read(k):
                return "diverged"
            n -= k
    if local_size == backup_size:
        return "same"
    return "backup-longer" if backup_size > local_size else "newer"


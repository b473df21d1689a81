"""Conflict copies as the page shows them: each copy a restore saved beside syncd's state
(``<state>/conflicts/<machine>/<second>/<path in the tree>``, restore/conflicts.py), the
local file it diverged from, and keeping one of the two.

What is acted on comes only from this module's own listing of that folder: a request
names a copy by its index in the listing and the listing's fingerprint, never by a path.
Keeping the copy replaces the local file atomically and first saves the local one as a
conflict copy of its own, so no byte is lost; a local file being written (``Quiet``) is
left alone.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import os
import re
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from syncd.claude import Selection, carries_instructions, is_temp, is_user_config, temp_name
from syncd.config import Settings
from syncd.errors import RestoreError
from syncd.private import create_private, private_dir

# A second's folder, as restore/conflicts.py names them.
_SECOND = re.compile(r"\d{8}T\d{6}(?:-\d{1,3})?")
# Copies listed at most, and bytes of each side a line diff reads.
LIST_MAX = 1000
DIFF_MAX = 1 << 20
# Chunks a copy is copied in.
CHUNK = 1 << 20


@dataclass(frozen=True)
class Copy:
    index: int
    machine: str  # whose backup the copy came from
    second: str  # the folder of the second it was saved in
    rel: str  # its path in the tree (where the local file is)
    path: Path  # the copy
    size: int
    mtime: float

    @property
    def local(self) -> str:
        return self.rel

    @property
    def saved(self) -> float | None:
        """When it was saved: its second's folder, named in local time (None: a folder
        named like one that is no time)."""
        try:
            return time.mktime(time.strptime(self.second[:15], "%Y%m%dT%H%M%S"))
        except (ValueError, OverflowError):
            return None

    @property
    def transcript(self) -> bool:
        parts = self.rel.split("/")
        return parts[0] == "projects" and self.rel.endswith(".jsonl")


def conflicts_dir(settings: Settings) -> Path:
    return settings.state_dir / "conflicts"


def list_copies(settings: Settings) -> list[Copy]:
    """Every conflict copy kept, newest first (at most ``LIST_MAX``): regular files only,
    no link followed, syncd's temp files left out."""
    base = conflicts_dir(settings)
    found: list[tuple[str, str, str, Path, os.stat_result]] = []
    for machine in _dirs(base):
        for second in _dirs(base / machine):
            if not _SECOND.fullmatch(second):
                continue
            top = base / machine / second
            for where, dirs, names in os.walk(top, followlinks=False):
                dirs[:] = sorted(d for d in dirs if not os.path.islink(os.path.join(where, d)))
                for name in names:
                    path = Path(where) / name
                    if is_temp(name):
                        continue
                    try:
                        st = os.lstat(path)
                    except OSError:
                        continue
                    if stat.S_ISREG(st.st_mode):
                        rel = path.relative_to(top).as_posix()
                        found.append((second, machine, rel, path, st))
    found.sort(key=lambda f: (f[0], f[1], f[2]), reverse=True)
    return [Copy(i, m, s, rel, p, st.st_size, st.st_mtime)
            for i, (s, m, rel, p, st) in enumerate(found[:LIST_MAX])]


def fingerprint(copies: list[Copy]) -> str:
    """What a form says it saw: a "keep" acts only when the listing is still that one."""
    h = hashlib.sha256()
    for c in copies:
        h.update(f"{c.machine}\0{c.second}\0{c.rel}\0{c.size}\n".encode())
    return h.hexdigest()[:16]


def _dirs(path: Path) -> list[str]:
    try:
        return sorted(e.name for e in os.scandir(path) if e.is_dir(follow_symlinks=False))
    except OSError:
        return []


def local_path(settings: Settings, c: Copy) -> Path:
    """The local file a copy diverged from: its path in this machine's tree (the
    listing's relative path, which never climbs out: no part is ``..``)."""
    return settings.source / c.rel


def read_capped(path: Path, limit: int = DIFF_MAX) -> tuple[bytes, bool]:
    """Up to ``limit`` bytes of a file (not a link), and whether there was more; a file
    that is not there reads as nothing."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return b"", False
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(limit + 1)
    return data[:limit], len(data) > limit


def line_diff(local: bytes, copy: bytes) -> list[tuple[str, str]]:
    """A unified diff of two files, line by line as (kind, text): kind is "+", "-", "@"
    or " "; text the store's, for the template to escape."""
    a = local.decode("utf-8", "replace").splitlines()
    b = copy.decode("utf-8", "replace").splitlines()
    out: list[tuple[str, str]] = []
    for line in difflib.unified_diff(a, b, "local", "conflict copy", lineterm="", n=2):
        if line.startswith(("---", "+++")):
            continue
        out.append((line[:1] if line[:1] in "+-@" else " ", line[1:]))
    return out


def keep_local(c: Copy) -> None:
    """The local file stays: the copy goes (and its now empty folders)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(c.path)
    second = c.path.parents[len(Path(c.rel).parts) - 1]
    d = c.path.parent
    while d == second or second in d.parents:  # its folders up to the second's, if empty
        try:
            os.rmdir(d)
        except OSError:
            return
        d = d.parent


def keep_copy(settings: Settings, c: Copy) -> str | None:
    """The copy becomes the local file, atomically (a rename over it); the local file as
    it was is saved first as a conflict copy of this machine, so no byte is lost. Refused
    (``RestoreError``) while the local file is being written, and for a path outside the
    include set or one Claude follows as instructions (as a restore refuses it). Returns
    where the local file was saved (None: there was none)."""
    from syncd.follow.quiet import Quiet

    if not Selection(settings.include, settings.exclude).wants(c.rel):
        raise RestoreError(f"{c.rel}: outside the include set: not written from the page")
    if carries_instructions(c.rel, foreign=c.machine != settings.machine_id) or \
            is_user_config(c.rel):
        # As a restore: never written from another copy without an explicit opt-in.
        raise RestoreError(f"{c.rel}: Claude follows it as instructions or runs it as "
                           "code: not replaced from the page (compare and copy it by hand)")
    dest = local_path(settings, c)
    rel = c.rel.encode()
    try:
        st = os.lstat(dest)
    except FileNotFoundError:
        st = None
    if st is not None:
        if not stat.S_ISREG(st.st_mode):
            raise RestoreError(f"{c.rel}: the local file is not a regular file: left alone")
        why = Quiet(settings.source, settings.follow_quiet)(rel, st)
        if why is not None:
            raise RestoreError(f"{c.rel}: {why}")
    dest.parent.mkdir(parents=True, exist_ok=True)  # the tree's folder, as Claude makes it
    tmp = dest.parent / temp_name()
    saved: str | None = None
    try:
        _copy_file(c.path, tmp, keep_mode=st)
        if st is not None:
            saved = _save_local(settings, dest, c.rel)
            now = os.lstat(dest)
            if (now.st_ino, now.st_size, now.st_mtime_ns) != (st.st_ino, st.st_size,
                                                              st.st_mtime_ns):
                raise RestoreError(f"{c.rel}: written to meanwhile: left alone")
        os.replace(tmp, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    keep_local(c)  # the copy is the local file now
    return saved


def _copy_file(src: Path, dst: Path, keep_mode: os.stat_result | None) -> None:
    fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as a, os.fdopen(
            create_private(os.fsencode(dst), os.O_EXCL), "wb") as b:
        shutil.copyfileobj(a, b, CHUNK)
        b.flush()
        os.fsync(b.fileno())
    if keep_mode is not None:
        os.chmod(dst, stat.S_IMODE(keep_mode.st_mode))


def _save_local(settings: Settings, dest: Path, rel: str) -> str:
    """The local file copied under ``conflicts/<this machine>/<second>/<rel>``."""
    under = conflicts_dir(settings) / settings.machine_id
    stamp = time.strftime("%Y%m%dT%H%M%S")
    for n in range(1, 101):
        second = stamp if n == 1 else f"{stamp}-{n}"
        path = under / second / rel
        if os.path.lexists(path):
            continue
        private_dir(path.parent)
        try:
            _copy_file(dest, path, keep_mode=None)
        except FileExistsError:
            continue
        return str(path)
    raise RestoreError(f"{rel}: 100 conflict copies of it saved this second already")

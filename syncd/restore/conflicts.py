"""Conflict copies: the backup's copy of a file that is not written over the local one, kept
beside syncd's state under the second it was saved, within ``conflict_copies`` of a file
and ``conflict_bytes`` in all; a copy that says nothing new is not written.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import time
from pathlib import Path

from syncd.claude import sweep_temps, temp_name
from syncd.errors import RestoreError
from syncd.private import create_private, private_dir
from syncd.restore.options import RestoreOptions
from syncd.restore.remap import CHUNK
from syncd.restore.report import Action, RestoreReport, _why
from syncd.view import Backup


def _set_aside(staged: Path, path: bytes, where: tuple[bytes, bytes], backup: Backup,
               opts: RestoreOptions, report: RestoreReport) -> None:
    rel, winner = where
    _keep_aside(Action("conflict", os.fsdecode(rel), os.fsdecode(path),
                       f"{os.fsdecode(winner)} of the backup restores to the same place: "
                       "this copy saved aside"), staged, path, backup, opts, report)


def _keep_aside(act: Action, staged: Path, name: bytes, backup: Backup,
                opts: RestoreOptions, report: RestoreReport) -> None:
    """``act``, a conflict: the staged copy saved as a conflict copy under ``name`` (not in
    a dry run); one that cannot be saved is this file's error."""
    if not opts.dry_run:
        try:
            act.conflict_copy = _save_conflict(staged, name, backup.machine, opts)
        except (OSError, RestoreError) as e:
            act.action, act.reason = "error", _why(e)
            report.errors.append(f"{act.source}: cannot save it aside: {_why(e)}")
    report.actions.append(act)


def _relation(local: bytes, backup: bytes | Path) -> str:
    """How two files compare, read a chunk at a time: "same", "local-prefix" (backup
    extends local), "backup-prefix" or "diverged"."""
    with open(local, "rb") as a, open(backup, "rb") as b:
        while True:
            x, y = a.read(CHUNK), b.read(CHUNK)
            common = min(len(x), len(y))
            if x[:common] != y[:common]:
                return "diverged"
            if len(x) != len(y):
                # One ran out within this chunk: the other goes on beyond it.
                return "local-prefix" if len(x) < len(y) else "backup-prefix"
            if not x:
                return "same"


def _save_conflict(data: bytes | Path, rel: bytes, machine: str, opts: RestoreOptions) -> str:
    """The backup's copy (its bytes, or a file of them) beside syncd's state, under the
    second it was saved (``-2``, ``-3`` … after it for another copy of that second: none
    is written over); its path. A copy that says nothing new (it is, or begins, one kept
    already: that one's path) is not written. Copies stay within ``opts.conflict_copies``
    of one file and ``opts.conflict_bytes`` in all, the oldest going first; one bigger
    than ``conflict_bytes`` alone is refused (``RestoreError``)."""
    base = os.fsencode(opts.conflicts_dir or (opts.target.parent / ".syncd-conflicts"))
    under = os.path.join(base, os.fsencode(machine))
    size = data.stat().st_size if isinstance(data, Path) else len(data)
    if size > opts.conflict_bytes:
        why = (f"{os.fsdecode(rel)}: local file kept, machine {machine}'s copy not saved: "
               f"its {size} bytes are more than conflict_bytes ({opts.conflict_bytes}) "
               "allows for every conflict copy")
        if opts.refused_copy is not None:
            opts.refused_copy(why)
        raise RestoreError(why)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    older = _copies(under, rel)
    if isinstance(data, Path) and (kept := _kept_already(older, data, size)) is not None:
        return kept
    # Written whole first, then linked into place: another restore superseding copies
    # meanwhile never meets this one half written (its bytes so far a prefix of another).
    private_dir(under)
    sweep_temps(under)  # a killed restore's
    tmp = os.path.join(under, os.fsencode(temp_name()))
    try:
        with os.fdopen(create_private(tmp, os.O_EXCL), "wb") as out:
            if isinstance(data, Path):
                with open(data, "rb") as src:
                    shutil.copyfileobj(src, out, CHUNK)
            else:
                out.write(data)
        if not isinstance(data, Path) and (kept := _kept_already(older, tmp, size)) is not None:
            return kept
        for n in range(1, CONFLICTS_PER_SECOND + 1):
            path = os.path.join(under, (stamp if n == 1 else f"{stamp}-{n}").encode(), rel)
            private_dir(os.path.dirname(path))
            try:
                os.link(tmp, path)
            except FileExistsError:
                continue
            _drop_superseded(under, path, size, older, opts.conflict_copies)
            _trim(base, path, opts.conflict_bytes)
            return os.fsdecode(path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    raise RestoreError(f"{os.fsdecode(rel)}: {CONFLICTS_PER_SECOND} conflict copies of it "
                       "saved this second already")


CONFLICTS_PER_SECOND = 100
# The name of a second's folder of conflict copies (``_save_conflict``).
_SECOND = re.compile(rb"(\d{8}T\d{6})(?:-(\d{1,3}))?")


def _age(second: bytes) -> tuple[bytes, int] | None:
    """Where a second's folder sorts among the others, oldest first (None: not one)."""
    m = _SECOND.fullmatch(second)
    return None if m is None else (m[1], int(m[2] or 1))


def _copies(under: bytes, rel: bytes) -> list[tuple[tuple[bytes, int], bytes, int]]:
    """(age, path, size) of the copies of ``rel`` kept under ``under``, oldest first."""
    out = []
    with contextlib.suppress(OSError):
        for second in os.listdir(under):
            age = _age(second)
            path = os.path.join(under, second, rel)
            with contextlib.suppress(OSError):
                st = os.lstat(path)
                if age is not None and stat.S_ISREG(st.st_mode):
                    out.append((age, path, st.st_size))
    return sorted(out)


def _drop_superseded(under: bytes, newest: bytes, size: int,
                     older: list[tuple[tuple[bytes, int], bytes, int]], keep: int) -> None:
    """Remove the ``older`` copies of a file (``under``/<second>/<rel>) whose bytes all
    begin ``newest`` (``size`` bytes): while two machines keep writing one session, each
    import would save another, longer copy of the other's branch; the newest holds every
    byte of those. Of the others, the oldest go while more than ``keep`` copies stay."""
    left = []
    for copy in older:
        _, old, old_size = copy
        if old_size <= size and _has_prefix(newest, old):
            _remove_copy(under, old)
        else:
            left.append(copy)
    for _, old, _ in left[: max(0, len(left) + 1 - keep)]:
        _remove_copy(under, old)


def _kept_already(older: list[tuple[tuple[bytes, int], bytes, int]], new: bytes | Path,
                  size: int) -> str | None:
    """The copy of ``older`` that is, or begins with, the file ``new`` (``size`` bytes):
    that one says all it says."""
    for _, old, old_size in older:
        if old_size >= size and _has_prefix(old, new):
            return os.fsdecode(old)
    return None


def _has_prefix(longer: bytes, shorter: bytes | Path) -> bool:
    """Whether the file ``longer`` begins with every byte of ``shorter`` (or is it),
    compared as streams, a chunk of each at a time; False when either cannot be read."""
    try:
        return _relation(longer, shorter) in ("same", "backup-prefix")
    except OSError:
        return False


def _trim(base: bytes, newest: bytes, budget: int) -> None:
    """The oldest copies under ``base`` (every machine's) go while they hold more than
    ``budget`` bytes (never ``newest``). Only syncd's own (<machine>/<second>/…) count."""
    kept = []
    for machine in _listdir(base):
        under = os.path.join(base, machine)
        for second in _listdir(under):
            age = _age(second)
            if age is None:
                continue
            for top, _, names in os.walk(os.path.join(under, second)):
                for name in names:
                    path = os.path.join(top, name)
                    with contextlib.suppress(OSError):
                        st = os.lstat(path)
                        if stat.S_ISREG(st.st_mode):
                            kept.append((age, path, st.st_size, under))
    total = sum(n for _, _, n, _ in kept)
    for _, path, n, under in sorted(kept):
        if total <= budget:
            break
        if path != newest:
            _remove_copy(under, path)
            total -= n


def _listdir(path: bytes) -> list[bytes]:
    try:
        return [n for n in os.listdir(path) if os.path.isdir(os.path.join(path, n))
                and not os.path.islink(os.path.join(path, n))]
    except OSError:
        return []


def _remove_copy(under: bytes, path: bytes) -> None:
    """Remove a conflict copy and its now empty directories, up to the second's (never
    ``under``)."""
    try:
        os.unlink(path)
    except OSError:
        return
    d = os.path.dirname(path)
    while d != under and d.startswith(under):
        try:
            os.rmdir(d)
        except OSError:
            break
        d = os.path.dirname(d)

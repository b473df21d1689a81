"""One folder per session: a session restored earlier under other rules (``resume``
without ``--map``, then ``restore --map``) is moved to the folder the new rules give,
not left behind as a second copy that ``claude --resume`` would list twice.

Only an earlier copy of the backup's own session moves: its first entry must be the
backup's first entry (same uuid and time), so a store naming a session id that exists
here never moves a session it did not give. The copy may have grown here since (the
session was continued): it is rewritten from its start directory to the new one and
becomes the local copy that the backup's is merged with, so no line written here is
lost. A copy that cannot move (the new folder already holds the session, its start
directory is unknown, a folder on the way is not a plain directory) stays where it is
and the restore says so.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from syncd.claude import folder_match, project_folder, temp_name
from syncd.errors import RestoreError
from syncd.format.catalog import Session
from syncd.private import create_private
from syncd.restore.install import changed, check_parents, fsync_dir, make_parents
from syncd.restore.remap import Remapper, Rule, rewrite_lines
from syncd.sibling import SUFFIXES

# A transcript's first entry (its uuid, time and cwd) is within its first MiB; the
# relocated record that placed it (appended by the move), within its last.
_HEAD = 1 << 20
_TAIL = 1 << 20
# A relocated record is a short line of its own; a longer one is not read as one.
_RECORD_MAX = 64 << 10
_FIELD = {k: re.compile(rb'"' + k.encode() + rb'":"((?:[^"\\]|\\.)*)"')
          for k in ("uuid", "timestamp", "cwd")}


@dataclass(frozen=True)
class Move:
    """The session's copy in folder ``old`` goes to folder ``new``; ``rule`` maps its
    start directory (None: it cannot move, ``why`` says so)."""

    session_id: str
    old: str
    new: str
    rule: Rule | None
    why: str = ""
    also: tuple[Rule, ...] = ()  # more rules for its lines (a moved one's first cwd)


@dataclass
class Moved:
    """What a move did so far: (old, new) relative paths; what it left and why."""

    files: list[tuple[str, str]] = field(default_factory=list)
    left: list[str] = field(default_factory=list)


def strays(target: Path, wanted: dict[str, str]) -> dict[str, list[str]]:
    """Per session id in ``wanted`` (id → the folder it is restored to), the other project
    folders under ``target`` that hold its transcript as a regular file."""
    found: dict[str, list[str]] = {}
    projects = target / "projects"
    try:
        if not stat.S_ISDIR(os.lstat(projects).st_mode):
            return found
        folders = sorted(e.name for e in os.scandir(projects)
                         if e.is_dir(follow_symlinks=False))
    except OSError:
        return found
    names = {f"{sid}.jsonl": sid for sid in wanted}
    for folder in folders:
        # One listing per folder, not a lookup per session: a full restore asks for all.
        try:
            with os.scandir(projects / folder) as entries:
                hits = [names[e.name] for e in entries
                        if e.name in names and e.is_file(follow_symlinks=False)]
        except OSError:
            continue
        for sid in hits:
            if folder != wanted[sid]:
                found.setdefault(sid, []).append(folder)
    return found


def _regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def first_entry(head: bytes) -> dict[str, str]:
    """The uuid, timestamp and cwd of the first line of ``head`` that has a uuid (and the
    first cwd of any line): what identifies a transcript and where it started."""
    out: dict[str, str] = {}
    for line in head.split(b"\n"):
        if "uuid" not in out and (u := _FIELD["uuid"].search(line)):
            t = _FIELD["timestamp"].search(line)
            out["uuid"], out["timestamp"] = _string(u[1]), _string(t[1]) if t else ""
        if "cwd" not in out and (c := _FIELD["cwd"].search(line)):
            out["cwd"] = _string(c[1])
        if "uuid" in out and "cwd" in out:
            break
    return out


def placed_by(s: Session) -> str | None:
    """The directory Claude finds ``s``'s project folder by: its last ``relocatedCwd``
    (``/cd``, entering or leaving a worktree moved the transcript there and said so; the
    catalog's ``relocated_cwd``), else its first cwd. None when neither is known."""
    return s.fields.get("relocated_cwd") or s.project


def last_relocated(tail: bytes) -> str | None:
    """The ``relocatedCwd`` of the last relocated record among ``tail``'s whole lines."""
    for line in reversed(tail.split(b"\n")):
        if b'"type":"relocated"' not in line or len(line) > _RECORD_MAX:
            continue
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if isinstance(entry, dict) and entry.get("type") == "relocated" and \
                    isinstance(cwd := entry.get("relocatedCwd"), str) and cwd:
                return cwd
    return None


def relocated_cwd(path: Path) -> str | None:
    """The last ``relocatedCwd`` in a local transcript's last ``_TAIL`` bytes, or None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        start = max(0, size - _TAIL)
        tail = os.pread(fd, size - start, start)
    except OSError:
        return None
    finally:
        os.close(fd)
    if start:  # the first line read is cut: not a record
        tail = tail[tail.find(b"\n") + 1 :] if b"\n" in tail else b""
    return last_relocated(tail)


def _string(raw: bytes) -> str:
    with contextlib.suppress(ValueError):
        value = json.loads(b'"' + raw + b'"')
        if isinstance(value, str):
            return value
    return ""


def head_of(path: Path) -> bytes:
    with open(path, "rb") as fh:
        return fh.read(_HEAD)


def launch_dir(folder: str, cwd: str) -> tuple[str, str] | None:
    """The directory Claude was started in, ``cwd`` or an ancestor named by ``folder``,
    and how the name matched (``claude.folder_match``); None if none does.

    A transcript's first ``cwd`` can be a subdirectory (the session had ``cd``-ed there
    before the lines we hold). An exact name wins over a variant anywhere on the way up:
    a long name's 200-character prefix matches every subdirectory too.
    """
    ancestors = []
    path = cwd
    while path:
        ancestors.append(path)
        cut = max(path.rstrip("/\\").rfind("/"), path.rstrip("/\\").rfind("\\"))
        if cut <= 0:
            break
        path = path[:cut]
    matches = [(path, folder_match(path, folder)) for path in ancestors]
    for rank in ("exact", "variant", "prefix"):
        for path, how in matches:
            if how == rank:
                return path, rank
    return None


def plan(target: Path, sid: str, old: str, new: str, new_start: str | None,
         backup_head: bytes, taken: Iterable[str] = (),
         new_relocated: str | None = None) -> Move:
    """How the copy of ``sid`` in folder ``old`` would move to folder ``new`` (whose start
    directory is ``new_start``; ``backup_head`` the backup's transcript's first bytes;
    ``taken``: folders already given the session by earlier moves of this restore;
    ``new_relocated``: the backup's last relocatedCwd, mapped, which names ``new``
    instead of the start when the copy here was moved too)."""
    projects = target / "projects"
    theirs = first_entry(backup_head)
    ours = first_entry(head_of(projects / old / f"{sid}.jsonl"))
    if not theirs.get("uuid") or (ours.get("uuid"), ours.get("timestamp")) != (
            theirs.get("uuid"), theirs.get("timestamp")):
        return Move(sid, old, new, None, "it starts otherwise than the backup's copy: "
                                         "not this session's earlier copy, left there")
    rel = f"projects/{new}/{sid}/x".encode()
    try:
        check_parents(target, rel)
    except RestoreError:
        return Move(sid, old, new, None, f"projects/{new} is not a plain directory: "
                                         "left there")
    if new in taken or os.path.lexists(projects / new / f"{sid}.jsonl"):
        return Move(sid, old, new, None, f"projects/{new} holds it too: left in both "
                                         "folders (remove the one you do not use)")
    also: tuple[Rule, ...] = ()
    found: tuple[str, str] | None
    here = relocated_cwd(projects / old / f"{sid}.jsonl") if new_relocated else None
    if here:  # both copies placed by their relocatedCwd; their first cwds map alike
        found = launch_dir(old, here) or (here, "exact")
        if ours.get("cwd") and new_start is not None:
            also = (Rule(ours["cwd"], new_start, "moved session"),)
        new_start = new_relocated
    else:
        found = launch_dir(old, ours["cwd"]) if ours.get("cwd") else None
    if found is None or new_start is None:
        return Move(sid, old, new, None, "its start directory is unknown: left there")
    start = found[0]
    if start == new_start and project_folder(start) == old:
        return Move(sid, old, new, None, "it is in its start directory's own folder: left "
                                         "there")
    return Move(sid, old, new, Rule(start, new_start, "moved session"), also=also)


def _files(target: Path, m: Move) -> list[tuple[str, Remapper | None]]:
    """The session's files in folder ``m.old`` (its transcript, its siblings, then its
    side folder: subagents, tool results), relative to the folder, each with the remapper
    its lines go through (None: copied as they are)."""
    assert m.rule is not None
    remap = Remapper([m.rule, *m.also], {m.old: m.new})
    src_dir = target / "projects" / m.old
    out: list[tuple[str, Remapper | None]] = [(f"{m.session_id}.jsonl", remap)]
    out += [(name, remap) for suffix in SUFFIXES
            if _regular(src_dir / (name := m.session_id + os.fsdecode(suffix)))]
    side = src_dir / m.session_id
    if stat.S_ISDIR(_mode(side)):
        for root, dirs, files in os.walk(side):
            dirs[:] = [d for d in dirs if stat.S_ISDIR(_mode(Path(root) / d))]
            for name in sorted(files):
                p = Path(root) / name
                if _regular(p):
                    rel = str(p.relative_to(src_dir))
                    out.append((rel, remap if rel.endswith((".jsonl", ".json")) or
                                "/tool-results/" in f"/{rel}" else None))
    return out


def preview(target: Path, m: Move, scratch: Path) -> dict[bytes, Path]:
    """What ``move`` would put where, for a dry run: each file's place in the target
    (relative) → its rewritten copy in ``scratch``, which the plan compares with."""
    out: dict[bytes, Path] = {}
    for n, (rel, remap) in enumerate(_files(target, m)):
        dest_rel = f"projects/{m.new}/{rel}"
        if os.path.lexists(target / dest_rel):
            continue
        copy = scratch / f"moved-{m.session_id}-{n}"
        if _copy_rewritten(target / "projects" / m.old / rel, copy, remap):
            out[dest_rel.encode()] = copy
    return out


def move(target: Path, m: Move, moved: Moved) -> None:
    """Move the session's transcript, its siblings and its folder (subagents, tool
    results) from ``m.old`` to ``m.new``, paths rewritten, recording each file in
    ``moved`` as it goes. Each file is written (temp, fsync, rename, directory fsync)
    before its old copy goes; one that changed meanwhile (Claude appending to it) or whose
    new place is taken stays where it is."""
    projects = target / "projects"
    src_dir = projects / m.old
    side = src_dir / m.session_id
    synced: set[Path] = set()
    for rel, rewrite in _files(target, m):
        src, dest = src_dir / rel, projects / m.new / rel
        dest_rel = f"projects/{m.new}/{rel}"
        if os.path.lexists(dest):
            moved.left.append(f"projects/{m.old}/{rel}")
            continue
        make_parents(target, dest_rel.encode())
        before = os.lstat(src)
        if not _copy_rewritten(src, dest, rewrite):
            moved.left.append(f"projects/{m.old}/{rel}")  # its place was taken meanwhile
            continue
        if dest.parent not in synced:
            fsync_dir(dest.parent)
            synced.add(dest.parent)
        if changed(os.fsencode(src), before):
            # Written to while it was copied: the new copy goes, the old one stays whole.
            os.unlink(dest)
            moved.left.append(f"projects/{m.old}/{rel}")
            continue
        os.unlink(src)
        moved.files.append((f"projects/{m.old}/{rel}", dest_rel))
    for root, dirs, _ in os.walk(side, topdown=False):
        for d in dirs:
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(root, d))
    for folder in (side, src_dir):  # the old folder too, once nothing else is in it
        with contextlib.suppress(OSError):
            os.rmdir(folder)


def _mode(path: Path) -> int:
    try:
        return os.lstat(path).st_mode
    except OSError:
        return 0


def _copy_rewritten(src: Path, dest: Path, remap: Remapper | None) -> bool:
    """``src`` into ``dest`` (its lines rewritten by ``remap``), through a temp file;
    False, and nothing written, when ``dest`` appeared meanwhile (never replaced)."""
    tmp = dest.with_name(temp_name())
    try:
        with open(src, "rb") as fh, os.fdopen(create_private(tmp, os.O_EXCL), "wb") as out:
            rewrite_lines(fh, out.write, remap.line if remap else bytes)
            out.flush()
            os.fsync(out.fileno())
        st = src.stat()
        os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
        try:
            os.link(tmp, dest)  # unlike a rename, never over a file made meanwhile
        except FileExistsError:
            return False
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)

"""One folder per session: a session restored earlier under other rules (``resume``
without ``--map``, then ``restore --map``) is moved to the folder the new rules give,
not left behind as a second copy that ``claude --resume`` would list twice.

The earlier copy may have grown here since (the session was continued): it is rewritten
from its start directory to the new one and becomes the local copy that the backup's
is merged with, so no line written here is lost. A copy that cannot be moved (the new
folder already holds the session, or its start directory is unknown) stays where it is
and the restore says so.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from syncd.claude import project_folder
from syncd.private import create_private
from syncd.restore.remap import Remapper, Rule

# The first cwd of a transcript is found within its first lines.
_HEAD = 1 << 20
_CWD = re.compile(rb'"cwd":"((?:[^"\\]|\\.)*)"')
# Rewritten CHUNK bytes at a time, cut at a line end; a line longer than LINE_MAX is
# copied as it is (as restore does), so memory never follows a file's line lengths.
CHUNK = 8 << 20
LINE_MAX = 16 << 20


@dataclass(frozen=True)
class Move:
    """The session's copy in ``old`` (a project folder) goes to ``new``; ``rule`` maps
    its start directory (None: it cannot be moved, ``why`` says so)."""

    session_id: str
    old: str
    new: str
    rule: Rule | None
    why: str


def strays(target: Path, wanted: dict[str, str]) -> dict[str, list[str]]:
    """Per session id in ``wanted`` (id → the folder it is restored to), the other project
    folders under ``target`` that hold its transcript."""
    found: dict[str, list[str]] = {}
    projects = target / "projects"
    names = {f"{sid}.jsonl": sid for sid in wanted}
    try:
        folders = sorted(os.scandir(projects), key=lambda e: e.name)
    except OSError:
        return found
    for folder in folders:
        if not folder.is_dir(follow_symlinks=False):
            continue
        for name, sid in names.items():
            if folder.name != wanted[sid] and os.path.isfile(os.path.join(folder.path, name)) \
                    and not os.path.islink(os.path.join(folder.path, name)):
                found.setdefault(sid, []).append(folder.name)
    return found


def _first_cwd(path: Path) -> str | None:
    with contextlib.suppress(OSError), open(path, "rb") as fh:
        m = _CWD.search(fh.read(_HEAD))
        if m:
            with contextlib.suppress(ValueError):
                value = json.loads(b'"' + m.group(1) + b'"')
                return value if isinstance(value, str) else None
    return None


def launch_dir(folder: str, cwd: str) -> str | None:
    """The directory Claude was started in: ``cwd`` or the ancestor named by ``folder``.

    A transcript's first ``cwd`` can be a subdirectory (the session had ``cd``-ed there
    before the lines we hold); the folder name is the sanitized start directory.
    """
    path = cwd
    while path:
        if project_folder(path) == folder:
            return path
        cut = max(path.rstrip("/\\").rfind("/"), path.rstrip("/\\").rfind("\\"))
        if cut <= 0:
            return None
        path = path[:cut]
    return None


def plan(target: Path, sid: str, old: str, new: str, new_start: str | None) -> Move:
    """How the copy of ``sid`` in folder ``old`` would move to ``new`` (whose start
    directory is ``new_start``)."""
    projects = target / "projects"
    if (projects / new / f"{sid}.jsonl").exists():
        return Move(sid, old, new, None, f"projects/{new} holds it too: left in both "
                                         "folders (remove the one you do not use)")
    cwd = _first_cwd(projects / old / f"{sid}.jsonl")
    start = launch_dir(old, cwd) if cwd else None
    if start is None or new_start is None:
        return Move(sid, old, new, None, "its start directory is unknown: left there")
    return Move(sid, old, new, Rule(start, new_start, "moved session"), "")


def move(target: Path, m: Move) -> list[tuple[str, str]]:
    """Move the session's transcript and its folder (subagents, tool results) from
    ``m.old`` to ``m.new``, paths rewritten; each file written (temp, fsync, rename)
    before its old copy goes. Returns (old, new) relative paths of what moved; a file
    whose new place is taken stays where it is."""
    assert m.rule is not None
    remap = Remapper([m.rule], {m.old: m.new})
    projects = target / "projects"
    src_dir, dest_dir = projects / m.old, projects / m.new
    moved: list[tuple[str, str]] = []
    pairs = [(src_dir / f"{m.session_id}.jsonl", dest_dir / f"{m.session_id}.jsonl")]
    side = src_dir / m.session_id
    if side.is_dir() and not side.is_symlink():
        for root, dirs, files in os.walk(side):
            dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(root, d))]
            for name in sorted(files):
                p = Path(root) / name
                if p.is_file() and not p.is_symlink():
                    pairs.append((p, dest_dir / m.session_id / p.relative_to(side)))
    for src, dest in pairs:
        if dest.exists():
            continue
        dest.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        _copy_rewritten(src, dest, remap if src.suffix in (".jsonl", ".json")
                        or "tool-results" in src.parts else None)
        src.unlink()
        moved.append((str(src.relative_to(target)), str(dest.relative_to(target))))
    for root, dirs, _ in os.walk(side, topdown=False):
        for d in dirs:
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(root, d))
    with contextlib.suppress(OSError):
        os.rmdir(side)
    with contextlib.suppress(OSError):
        os.rmdir(src_dir)  # the old folder, once nothing else is in it
    return moved


def _copy_rewritten(src: Path, dest: Path, remap: Remapper | None) -> None:
    """``src`` into ``dest`` (its lines rewritten by ``remap``), through a temp file."""
    tmp = dest.with_name(f".syncd-{os.urandom(6).hex()}.tmp")
    try:
        with open(src, "rb") as fh, os.fdopen(create_private(tmp, os.O_EXCL), "wb") as out:
            carry = b""
            while chunk := fh.read(CHUNK):
                buf = carry + chunk
                cut = buf.rfind(b"\n") + 1
                if cut == 0 and len(buf) > LINE_MAX:
                    cut, remap = len(buf), None  # an overlong line: the rest is copied
                out.write(remap.line(buf[:cut]) if remap else buf[:cut])
                carry = buf[cut:]
            out.write(remap.line(carry) if remap and carry else carry)
            out.flush()
            os.fsync(out.fileno())
        st = src.stat()
        os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
        os.replace(tmp, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)

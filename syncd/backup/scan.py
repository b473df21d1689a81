"""The reconcile scan: a stat-only walk that finds what the watcher may have missed."""

from __future__ import annotations

import logging
import os
import stat
from dataclasses import dataclass, field

from syncd.backup.state import State
from syncd.claude import Selection, is_temp
from syncd.sessionfiles import session_owning

log = logging.getLogger("syncd.scan")


@dataclass
class ScanResult:
    dirty: set[bytes] = field(default_factory=set)
    pending_bytes: int = 0
    files: int = 0
    problems: dict[bytes, str] = field(default_factory=dict)
    # syncd's own temp files met on the way (never backed up): the daemon removes those
    # a killed restore left (claude.remove_left_behind).
    temps: list[bytes] = field(default_factory=list)


def scan(root: bytes, selection: Selection, state: State, under: bytes = b"") -> ScanResult:
    """Paths below ``under`` whose stat differs from what was shipped, and tracked ones gone.

    Never follows symlinks: a link to a directory outside the tree is not walked. The
    files of forgotten sessions are not looked at (never shipped until lifted).
    """
    out = ScanResult()
    forgotten = set(state.forgotten())
    seen: set[bytes] = set()
    stack = [under]
    while stack:
        rel_dir = stack.pop()
        try:
            entries = list(os.scandir(os.path.join(root, rel_dir) if rel_dir else root))
        except FileNotFoundError:
            continue
        except OSError as e:
            out.problems[rel_dir] = f"{os.fsdecode(rel_dir)}: {e.strerror}"
            continue
        for entry in entries:
            rel = os.path.join(rel_dir, entry.name) if rel_dir else os.fsencode(entry.name)
            text = os.fsdecode(rel)
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue  # gone between listing and stat
            if stat.S_ISDIR(st.st_mode):
                if selection.may_descend(text):
                    stack.append(rel)
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            if not selection.wants(text):
                if is_temp(entry.name):
                    out.temps.append(rel)
                continue
            seen.add(rel)
            if forgotten and session_owning(rel) in forgotten:
                continue
            out.files += 1
            prev = state.get(rel)
            if prev is None or prev.deleted_at is not None or (prev.dev, prev.ino) != (
                    st.st_dev, st.st_ino) or st.st_size < prev.offset:
                out.dirty.add(rel)
                out.pending_bytes += st.st_size
            elif st.st_size != prev.offset or st.st_mtime_ns != prev.mtime_ns:
                out.dirty.add(rel)
                out.pending_bytes += st.st_size - prev.offset
    prefix = under + b"/" if under else b""
    for f in state.files():
        if f.deleted_at is None and f.path not in seen and f.path.startswith(prefix) and \
                not (forgotten and session_owning(f.path) in forgotten):
            out.dirty.add(f.path)  # gone (or no longer a regular file): the shipper decides
    return out

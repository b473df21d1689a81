"""Local files only their owner can read: directories 0700, files 0600.

Every directory syncd creates (state, store, restore staging, conflict copies) goes
through ``private_dir``; every file it writes outside the Claude tree is created 0600
from the start, never chmod-ed after a window at the umask's mode.
"""

from __future__ import annotations

import os
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path | str | bytes) -> None:
    """``mkdir -p`` where every directory created is 0700.

    An existing directory is left as it is, except the leaf when it is ours and open to
    others (a state directory made by an older version, or by hand): that is tightened.
    """
    raw = os.fsencode(path)
    missing: list[bytes] = []
    cur = raw
    while cur and not os.path.isdir(cur):
        missing.append(cur)
        parent = os.path.dirname(cur)
        if parent == cur:
            break
        cur = parent
    for d in reversed(missing):
        try:
            os.mkdir(d, DIR_MODE)
        except FileExistsError:
            if not os.path.isdir(d):
                raise
        else:
            os.chmod(d, DIR_MODE)  # mkdir's mode is filtered by the umask
    if not missing:
        st = os.stat(raw)
        if st.st_uid == os.geteuid() and st.st_mode & 0o077:
            os.chmod(raw, st.st_mode & ~0o077)


def create_private(path: Path | str | bytes, flags: int = 0) -> int:
    """Open (creating it 0600) a file for writing; returns the descriptor."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | flags, FILE_MODE)


def write_private(path: Path | str | bytes, data: bytes) -> None:
    """Write a whole new file, mode 0600 from its creation."""
    fd = create_private(path, os.O_TRUNC)
    try:
        os.fchmod(fd, FILE_MODE)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)

"""The user's config files on restore (``claude.USER_CONFIG``): remapped when they are
text, shown as a diff in a dry run (values of settings' ``env`` block hidden), and the
local file they replace kept beside it."""

from __future__ import annotations

import contextlib
import difflib
import errno
import hashlib
import itertools
import json
import os
import shutil
import stat
import time

from syncd import untrusted
from syncd.claude import temp_name
from syncd.errors import RestoreError
from syncd.format.snapshot import Entry
from syncd.private import create_private
from syncd.restore.install import fsync_dir
from syncd.restore.remap import Remapper

# A dry run's diff of one file stops after this many lines; files bigger than
# DIFF_BYTES are not compared line by line at all.
DIFF_LINES = 400
DIFF_BYTES = 256 << 10


def _text(data: bytes) -> str | None:
    """``data`` as text, or None for a binary file (NUL bytes, not UTF-8)."""
    if b"\0" in data:
        return None
    try:
        return data.decode()
    except UnicodeDecodeError:
        return None


def remapped(data: bytes, remap: Remapper) -> bytes:
    """A config file with this machine's paths: hook commands, ``statusLine``, additional
    directories, plugin install paths, paths in instructions. Text only, at path
    boundaries, as in transcripts; a binary file (a skill's image) is kept as it is."""
    return data if remap.identity or _text(data) is None else remap.line(data)


# A config file is found already here (not fetched) only when at most this big.
HERE_MAX = 1 << 20


def already_here(dest: bytes, f: Entry, remap: Remapper) -> bool:
    """Whether ``dest`` holds what restoring ``f`` with ``--config`` would write: the same
    bytes (the sha256 of each of ``f``'s extents says so: nothing is fetched), none of
    them a path to remap. A plain restore then says it is there, not that it refused it."""
    try:
        st = os.lstat(dest)
    except OSError:
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_size != f.size or f.size > HERE_MAX or \
            f.sparse:
        return False
    try:
        with open(dest, "rb") as fh:
            data = fh.read(HERE_MAX + 1)
    except OSError:
        return False
    pos = 0
    for _, x in f.extents:
        if pos == f.size:
            break
        # Contiguous from 0 and whole frames (a part of one has the frame's sha256).
        if x.start != pos or x.end > f.size or x.skip or x.frame or \
                hashlib.sha256(data[x.start:x.end]).hexdigest() != x.sha256:
            return False
        pos = x.end
    return pos == f.size == len(data) and remapped(data, remap) == data


def restored_mode(mode: int) -> int:
    """0600, or 0700 for what was executable (a hook or status line script); never more."""
    return 0o700 if mode & 0o100 else 0o600


def _masked(text: str) -> tuple[str, dict[str, object]] | None:
    """A JSON config file as it is shown in a diff (parsed, the values of its ``env``
    block replaced by ``<hidden>``, written out again) and that ``env`` block as it was;
    None if it is not JSON."""
    try:
        doc = untrusted.loads(text.encode())
    except ValueError:
        return None
    env = doc.get("env") if isinstance(doc, dict) else None
    if not isinstance(env, dict):
        env = {}
    elif isinstance(doc, dict):
        doc["env"] = {k: _HIDDEN for k in env}
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n", env


# What a hidden value is shown as; the keys whose values differ are named above the diff.
_HIDDEN = "<hidden>"


def config_diff(rel: str, local: bytes | None, backup: bytes) -> str:
    """A unified diff from the local file (None: absent) to the backup's copy.

    A JSON file is shown as parsed, with the values of its ``env`` block (API keys)
    hidden; one that does not parse is not shown. Files bigger than ``DIFF_BYTES`` are
    not shown either: the diff's memory follows the lines it compares."""
    old, new = _text(local or b""), _text(backup)
    if old is None or new is None:
        return f"Binary files local/{rel} and backup/{rel} differ\n"
    if max(len(local or b""), len(backup)) > DIFF_BYTES:
        return (f"(local/{rel} {len(local or b'')} bytes, backup/{rel} {len(backup)} bytes: "
                "too big to show)\n")
    header = ""
    if rel.lower().endswith(".json"):
        shown_old = _masked(old) if local is not None else ("", {})
        shown_new = _masked(new)
        if shown_old is None or shown_new is None:
            return (f"(local/{rel} or backup/{rel} is not valid JSON: not shown, so that no "
                    "value of its env block is)\n")
        (old, env_old), (new, env_new) = shown_old, shown_new
        changed = sorted(k for k in env_old.keys() & env_new.keys()
                         if env_old[k] != env_new[k])
        if changed:
            header = f"# env values that differ (not shown): {', '.join(changed)}\n"
    names = ("/dev/null" if local is None else f"local/{rel}", f"backup/{rel}")
    lines = difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True), *names)
    out = [line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
           for line in itertools.islice(lines, DIFF_LINES)]
    if next(lines, None) is not None:
        out.append(f"... (more lines: the diff stops at {DIFF_LINES})\n")
    if header:  # after the file names; alone when nothing else differs
        if not out:
            out = [f"--- {names[0]}\n", f"+++ {names[1]}\n"]
        out.insert(2, header)
    return "".join(out)


def install_config(dest: bytes, data: bytes, mtime_ns: int, mode: int, *,
                   replacing: bool) -> str | None:
    """Write ``data`` as ``dest`` now (temp file, fsync, mode, mtime, then the directory):
    ``replacing`` the local file, kept beside it first (``keep_beside``), or as a new one
    that never replaces a file made meanwhile. The kept copy's path."""
    tmp = os.path.join(os.path.dirname(dest), os.fsencode(temp_name()))
    try:
        with os.fdopen(create_private(tmp, os.O_EXCL), "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, mode)
        os.utime(tmp, ns=(mtime_ns, mtime_ns))
        kept = None
        if replacing:
            kept = keep_beside(dest)
            os.replace(tmp, dest)
        else:
            try:
                os.link(tmp, dest)  # unlike a rename, never over a file made meanwhile
            except FileExistsError:
                raise RestoreError(f"{os.fsdecode(dest)}: appeared while being restored; "
                                   "left as it is") from None
        fsync_dir(os.path.dirname(dest))
        return kept
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def keep_beside(dest: bytes) -> str:
    """Keep the local file ``dest`` as ``<dest>.before-restore-<time>``, beside it and a
    name Claude loads nothing from: a hard link to the very file, so whatever was written
    to it since it was read is kept too (a copy where the filesystem has no links)."""
    stamp = time.strftime("%Y%m%dT%H%M%S").encode()
    for n in range(1000):
        path = dest + b".before-restore-" + stamp + (b"-%d" % n if n else b"")
        try:
            os.link(dest, path, follow_symlinks=False)
        except FileExistsError:
            continue
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
                raise
            try:
                fd = create_private(path, os.O_EXCL)
            except FileExistsError:
                continue
            with open(dest, "rb") as src, os.fdopen(fd, "wb") as out:
                shutil.copyfileobj(src, out)
                out.flush()
                os.fsync(out.fileno())
        return os.fsdecode(path)
    raise FileExistsError(os.fsdecode(dest) + ".before-restore-*: too many")

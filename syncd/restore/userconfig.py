"""The user's config files on restore (``claude.USER_CONFIG``): remapped when they are
text, shown as a diff in a dry run (values of settings' ``env`` block hidden), and the
local file they replace kept beside it."""

from __future__ import annotations

import difflib
import os
import re
import time

from syncd import untrusted
from syncd.private import create_private
from syncd.restore.remap import Remapper

# A dry run's diff of one file stops after this many lines.
DIFF_LINES = 400


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


def restored_mode(mode: int) -> int:
    """0600, or 0700 for what was executable (a hook or status line script); never more."""
    return 0o700 if mode & 0o100 else 0o600


def _env_keys(text: str | None) -> set[str]:
    """The names in a settings file's ``env`` block (its values may be API keys)."""
    if text is None:
        return set()
    try:
        doc = untrusted.loads(text.encode())
    except ValueError:
        return set()
    env = doc.get("env") if isinstance(doc, dict) else None
    return {k for k in env if isinstance(k, str)} if isinstance(env, dict) else set()


def _hide(lines: list[str], keys: set[str], values: dict[str, int]) -> list[str]:
    """``lines`` with the values of ``keys`` replaced by ``<hidden value N>``: equal values
    get equal numbers (in ``values``), so a changed one still shows in the diff."""
    if not keys:
        return lines
    names = "|".join(re.escape(k) for k in sorted(keys, key=len, reverse=True))
    value = re.compile(rf'("(?:{names})"\s*:\s*)("(?:[^"\\]|\\.)*")')

    def hidden(m: re.Match[str]) -> str:
        n = values.setdefault(m.group(2), len(values) + 1)
        return f'{m.group(1)}"<hidden value {n}>"'

    return [value.sub(hidden, line) for line in lines]


def config_diff(rel: str, local: bytes | None, backup: bytes) -> str:
    """A unified diff from the local file (None: absent) to the backup's copy."""
    old, new = _text(local or b""), _text(backup)
    if old is None or new is None:
        return f"Binary files local/{rel} and backup/{rel} differ\n"
    # Settings may hold secrets in env: their values never reach the terminal.
    keys = _env_keys(old) | _env_keys(new) if rel.endswith(".json") else set()
    values: dict[str, int] = {}
    lines = list(difflib.unified_diff(
        _hide(old.splitlines(keepends=True), keys, values),
        _hide(new.splitlines(keepends=True), keys, values),
        "/dev/null" if local is None else f"local/{rel}", f"backup/{rel}"))
    out = [line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
           for line in lines[:DIFF_LINES]]
    if len(lines) > DIFF_LINES:
        out.append(f"... {len(lines) - DIFF_LINES} more lines\n")
    return "".join(out)


def keep_beside(dest: bytes, content: bytes) -> str:
    """Save ``content`` (the local file about to be replaced) as
    ``<dest>.before-restore-<time>``: beside it, and a name Claude loads nothing from."""
    stamp = time.strftime("%Y%m%dT%H%M%S").encode()
    for n in range(1000):
        path = dest + b".before-restore-" + stamp + (b"-%d" % n if n else b"")
        try:
            fd = create_private(path, os.O_EXCL)
        except FileExistsError:
            continue
        with os.fdopen(fd, "wb") as out:
            out.write(content)
            out.flush()
            os.fsync(out.fileno())
        return os.fsdecode(path)
    raise FileExistsError(os.fsdecode(dest) + ".before-restore-*: too many")

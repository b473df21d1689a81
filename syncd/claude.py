"""What we know about Claude Code's tree: where it lives, what is worth backing up, and
what syncd itself leaves in it."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shlex
import stat
import time
import unicodedata
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

from syncd.errors import RestoreError

# What the user wrote by hand and Claude reads at start: instructions, settings, their own
# commands, agents, skills, rules, hooks and status line scripts, and the plugin lists (not
# the plugins themselves: a marketplace fetches them again). Backed up like the rest;
# restored only with ``--config`` (they carry instructions and code).
USER_CONFIG = (
    "CLAUDE.md",
    "settings.json",
    "keybindings.json",
    "statusline*",
    "agents/**",
    "commands/**",
    "skills/**",
    "rules/**",
    "output-styles/**",
    "hooks/**",
    "plugins/installed_plugins.json",
    "plugins/known_marketplaces.json",
)

# Backed up unless a configured exclude says otherwise. Not ``state/`` (consent given on
# this host: another host must ask again) nor ``shares/``.
DEFAULT_INCLUDE = (
    "projects/**",
    "history.jsonl",
    "plans/**",
    "todos/**",
    "tasks/**",
    "file-history/**",
    "paste-cache/**",
    *USER_CONFIG,
)

# Never uploaded, whatever the configured globs say: credentials, per-process
# state, caches. Directories are top-level names in the Claude tree.
NEVER_DIRS = frozenset({
    "backups", "ide", "sessions", "shell-snapshots", "session-env", "statsig",
    "cache", "debug", "telemetry",
})
# File names, at any depth. Case-insensitive: on macOS ".Credentials.json" is the same
# file. A trailing ".*" takes in a writer's temp and backup copies of the same secret.
NEVER_NAMES = (re.compile(r"\.credentials\.json.*", re.I), re.compile(r"\.claude\.json.*", re.I),
               # a remote session's ingress token; an auth file of Claude's
               re.compile(r"\.session_ingress_token.*", re.I),
               re.compile(r"hfi-auth\.json.*", re.I),
               re.compile(r".*\.lock", re.I),
               # syncd's own temp files (see temp_name), whatever their age or version.
               re.compile(r"\.syncd-.*\.tmp", re.I),
               # Claude Code's: a file written whole goes to <name>.tmp.<hex> (a compacted
               # transcript to <name>.compact.tmp.<hex>) and is renamed over <name> at
               # once. One shipped in between would reach every follower as a file of
               # the session, and stay there (deletions are never propagated).
               re.compile(r".+\.tmp\.[0-9a-f]{6,16}"))
# syncd's restore staging folders, at the top of the tree they restore into.
STAGING_PREFIX = ".syncd-restore-"


def default_root() -> Path:
    """``$CLAUDE_CONFIG_DIR`` when set, as Claude Code itself does, else ``~/.claude``."""
    env = os.environ.get("CLAUDE_CONFIG_DIR")
    return Path(env).expanduser() if env else Path.home() / ".claude"


def is_never(rel: str) -> bool:
    """True for anything on the never-upload list (``rel`` is a relative POSIX path).

    The one place that decides it: the watcher, the scan and the shipper ask
    ``Selection.wants`` (which asks this first), and restore skips these paths too.
    """
    parts = rel.split("/")
    if _never_dir(parts[0]):
        return True
    return any(p.fullmatch(parts[-1]) for p in NEVER_NAMES)


def _never_dir(top: str) -> bool:
    top = top.lower()
    return top in NEVER_DIRS or top.startswith(STAGING_PREFIX)


# Files Claude Code follows as instructions or runs as code: whoever can write them runs
# code on the machine (a SessionStart hook, a command, an agent, a plugin). Restore never
# writes them from a store without an explicit opt-in, whatever the include set says.
INSTRUCTION_DIRS = frozenset({"commands", "agents", "skills", "rules", "plugins", "hooks",
                              "output-styles"})
# At any depth: a project's own files too (a folder under projects/ could become a cwd).
_INSTRUCTION_NAMES = (re.compile(r"settings(\..*)?\.json", re.I),
                      re.compile(r"claude(\.local)?\.md", re.I),
                      re.compile(r"\.mcp\.json", re.I))


def carries_instructions(rel: str, *, foreign: bool) -> bool:
    """True for a file that carries instructions or code (``rel``: a relative POSIX path).

    ``foreign``: it comes from another machine's backup; then a project's auto memory
    (``projects/<folder>/memory/``, loaded into Claude's context) counts too.
    """
    parts = rel.split("/")
    if parts[0].lower() in INSTRUCTION_DIRS:
        return True
    if any(p.fullmatch(parts[-1]) for p in _INSTRUCTION_NAMES):
        return True
    if any(p.lower() == ".claude" for p in parts[:-1]):  # a project's .claude/ directory
        return True
    if in_git_dir(rel):
        return True
    return foreign and len(parts) > 3 and parts[0] == "projects" and \
        parts[2].lower() == "memory"


def in_git_dir(rel: str) -> bool:
    """True for a file of a git repository: its config and hooks run commands on any git
    command there (``core.fsmonitor``), wherever it is, config folders included."""
    return any(p.lower() == ".git" for p in rel.split("/"))


def is_user_config(rel: str) -> bool:
    """True for the user's own config files (``USER_CONFIG``; ``rel`` relative POSIX),
    whatever the case: on macOS ``StatusLine.sh`` is ``statusline.sh``."""
    folded = rel.lower()
    return any(_glob_regex(p.lower()).fullmatch(folded) for p in USER_CONFIG)


@lru_cache(maxsize=256)
def _glob_regex(pattern: str) -> re.Pattern[str]:
    # `**` spans directories, `*` and `?` stay within one name; "dir/" means "dir/**".
    if pattern.endswith("/"):
        pattern += "**"
    out: list[str] = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out), re.DOTALL)


def _literal_prefix(pattern: str) -> str:
    m = re.search(r"[*?\[]", pattern)
    return pattern if m is None else pattern[: m.start()]


class Selection:
    """Decides which relative paths are backed up. The never-list always wins."""

    def __init__(self, include: Iterable[str] = DEFAULT_INCLUDE,
                 exclude: Iterable[str] = ()) -> None:
        self.include = tuple(include)
        self.exclude = tuple(exclude)
        self._inc = [_glob_regex(p) for p in self.include]
        self._exc = [_glob_regex(p) for p in self.exclude]
        self._prefixes = [_literal_prefix(p) for p in self.include]

    def wants(self, rel: str) -> bool:
        if not rel or is_never(rel):
            return False
        if any(r.fullmatch(rel) for r in self._exc):
            return False
        return any(r.fullmatch(rel) for r in self._inc)

    def may_descend(self, rel_dir: str) -> bool:
        """Whether a directory can hold wanted files; lets scans skip whole subtrees."""
        if _never_dir(rel_dir.split("/")[0]):
            return False
        d = rel_dir + "/"
        return any(d.startswith(p) or p.startswith(d) for p in self._prefixes)


# -- syncd's own files in the tree ---------------------------------------------------
# A restore (and so a follow import) writes a file through a temp file beside it, renamed
# over it once complete: ``.syncd-<pid>-<12 hex>.tmp`` (older versions:
# ``.syncd-<12 hex>.tmp``). A process killed meanwhile leaves it: never backed up nor
# restored (the never-list), removed by the daemon's reconcile scan and by a restore that
# writes beside it, once its writer is gone.
_TEMP = re.compile(r"\.syncd-(?:([1-9][0-9]{0,9})-)?[0-9a-f]{12}\.tmp")
# A temp without a pid is removed once unchanged this long: a live one is written,
# fsynced and renamed within seconds, and its ctime moves with every write, chmod and
# utime (its mtime may be set to an old one just before the rename).
OLD_TEMP_AGE = 3600.0


def temp_name() -> str:
    """A new temp file's name: its writer's pid tells a later sweep whether it still runs."""
    return f".syncd-{os.getpid()}-{os.urandom(6).hex()}.tmp"


def is_temp(name: str | bytes) -> bool:
    """Whether ``name`` is one ``temp_name`` (or an older version) makes."""
    return _TEMP.fullmatch(os.fsdecode(name)) is not None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    except OverflowError:  # no such pid on this system
        return False
    return True


def left_behind(path: bytes) -> bool:
    """Whether ``path`` is a temp file whose writer is gone: a regular file named by
    ``temp_name`` whose pid is not alive here, or an older version's unchanged for
    ``OLD_TEMP_AGE``. A pid alive again (reused) keeps it: never one being written."""
    m = _TEMP.fullmatch(os.fsdecode(os.path.basename(path)))
    if m is None:
        return False
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISREG(st.st_mode):
        return False
    if m[1] is None:
        return time.time() - st.st_ctime > OLD_TEMP_AGE
    return not _alive(int(m[1]))


def remove_left_behind(paths: Iterable[bytes]) -> list[bytes]:
    """Remove the temp files of ``paths`` whose writer is gone (``left_behind``); those
    removed. One that cannot be removed (a read-only tree) stays, not backed up."""
    removed = []
    for path in paths:
        if left_behind(path):
            with contextlib.suppress(OSError):
                os.unlink(path)
                removed.append(path)
    return removed


def sweep_temps(directory: bytes) -> list[bytes]:
    """``remove_left_behind`` for the temp files in ``directory`` (not below it)."""
    try:
        with os.scandir(directory) as entries:
            names = [e.name for e in entries if is_temp(e.name)]
    except OSError:
        return []
    return remove_left_behind(os.path.join(directory, os.fsencode(n)) for n in names)


def tree_writable(root: Path) -> str | None:
    """Why sessions cannot be written into the Claude tree ``root`` (None: they can): its
    ``projects/`` folder, or where a restore would make it, is not a writable directory.

    access(2) answers for the mount too: a read-only one (a service's sandbox) is refused
    even to root, whom file modes do not stop.
    """
    projects = root / "projects"
    for where in (projects, root, *root.parents):  # the nearest that exists
        try:
            # projects/ as it is (restore never writes through a symlink); the tree may be one.
            st = os.lstat(where) if where == projects else os.stat(where)
        except FileNotFoundError:
            continue
        except OSError as e:
            return f"{where}: {e.strerror}"
        break
    else:
        return f"{root}: {os.strerror(errno.ENOENT)}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{where}: {os.strerror(errno.ENOTDIR)}" + (
            " (a symlink: restore does not follow it)" if stat.S_ISLNK(st.st_mode) else "")
    if os.access(where, os.W_OK | os.X_OK):
        return None
    try:
        read_only = bool(os.statvfs(where).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    return f"{where}: {os.strerror(errno.EROFS if read_only else errno.EACCES)}"


# -- project folder names ------------------------------------------------------
# Claude Code names a project's folder sanitize(realpath(cwd)): every UTF-16 code
# unit outside [A-Za-z0-9] becomes "-", and a name longer than 200 keeps its first
# 200 characters plus "-" and base36(|java_hash(path)|). Checked against CLI 2.1.332.
MAX_FOLDER = 200
_B36 = "0123456789abcdefghijklmnopqrstuvwxyz"


def java_hash(text: str) -> int:
    """Java's String.hashCode over UTF-16 code units, as a signed 32-bit integer."""
    raw = text.encode("utf-16-le", "surrogatepass")
    h = 0
    for i in range(0, len(raw), 2):
        h = (h * 31 + (raw[i] | raw[i + 1] << 8)) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def _base36(n: int) -> str:
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = _B36[r] + out
        if not n:
            return out


def _sanitized(path: str, *, units: bool = True) -> str:
    """Every character outside [A-Za-z0-9] as "-": one per UTF-16 code unit (``units``,
    Claude Code's rule: an emoji gives "--"), or one per character (a variant)."""
    return "".join(ch if ch.isascii() and ch.isalnum() else
                   "-" * (2 if units and ord(ch) > 0xFFFF else 1) for ch in path)


def project_folder(path: str) -> str:
    """The ``projects/`` folder name Claude Code uses for a working directory."""
    path = unicodedata.normalize("NFC", path)
    name = _sanitized(path)
    if len(name) <= MAX_FOLDER:
        return name
    return f"{name[:MAX_FOLDER]}-{_base36(abs(java_hash(path)))}"


def folder_match(path: str, folder: str) -> str | None:
    """How ``folder`` is the project folder of ``path``: "exact" (this machine's rule),
    "variant" (a character outside the BMP counted as one "-" instead of two), "prefix"
    (a long name with another hash suffix, Bun's where Node uses Java's: compared on the
    first 200 characters, as Claude's own lookup does; every subdirectory of a long path
    matches too, so it does not say which directory it was), or None."""
    if project_folder(path) == folder:
        return "exact"
    path = unicodedata.normalize("NFC", path)
    units, chars = _sanitized(path), _sanitized(path, units=False)
    if len(chars) <= MAX_FOLDER and folder == chars:
        return "variant"
    suffixed = len(folder) > MAX_FOLDER + 1 and folder[MAX_FOLDER] == "-"
    if suffixed and any(len(name) > MAX_FOLDER and folder[:MAX_FOLDER] == name[:MAX_FOLDER]
                        for name in (units, chars)):
        return "prefix"
    return None


# C0 and C1 controls and the bidi overrides that make a line read otherwise than it runs.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def resume_line(cwd: str, session_id: str, claude_root: Path | None = None,
                config_dir: Path | None = None) -> str:
    """``cd <cwd> && claude --resume <id>``, every word quoted: both come from the store,
    and the line is meant to be pasted into a shell. A word with control characters (a
    newline, a terminal escape) is refused rather than printed, and so is a ``cwd``
    inside the Claude tree (``claude_root``), where a store writes: no project is there,
    but a store's files could be (a ``.git/config`` whose commands run on ``git status``)."""
    for word in (cwd, session_id):
        if _CONTROL.search(word):
            raise RestoreError(f"not printing a shell line for {word!r}: it holds control "
                               "characters")
    if claude_root is not None:
        root = os.path.realpath(claude_root)
        if os.path.commonpath([root, os.path.realpath(cwd)]) == root:
            raise RestoreError(f"not printing a shell line for {cwd!r}: it is inside the "
                               f"Claude tree {claude_root}, where no project lives")
    # A tree other than ~/.claude is Claude's only when it is told (CLAUDE_CONFIG_DIR).
    env = "" if config_dir is None else \
        f"CLAUDE_CONFIG_DIR={shlex.quote(os.fspath(config_dir))} "
    return f"cd {shlex.quote(cwd)} && {env}claude --resume {shlex.quote(session_id)}"

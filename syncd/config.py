"""Configuration: ``~/.config/syncd/config.toml`` overlaid by ``SYNCD_*`` variables.

pydantic validates every value; the file and the variables are read here (pydantic-settings
would do the same for ~0.04 s more of start-up, every command, in imports alone)."""

from __future__ import annotations

import difflib
import errno
import hashlib
import json
import os
import re
import tomllib
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Self, get_origin
from urllib.parse import urlparse

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from syncd.claude import DEFAULT_INCLUDE, default_root
from syncd.duration import parse_duration
from syncd.errors import ConfigError
from syncd.host import default_machine_id, legacy_machine_id

MACHINE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# A source's name: a machine id's part, without "--" (what joins it to the machine id)
# nor a dot, so a name is found again at the end of an id.
SOURCE_NAME = re.compile(r"[A-Za-z0-9](?:-?[A-Za-z0-9_])*")
SOURCE_NAME_MAX = 32
# The name of the tree `source` names (machine id `machine_id`), whatever `sources` adds.
DEFAULT_SOURCE = "default"
SOURCE_JOIN = "--"


@dataclass(frozen=True)
class ConfigFile:
    """A config file as read: its path, its keys and its text (for line numbers)."""

    path: Path
    data: dict[str, Any] = field(default_factory=dict)
    text: str = ""

    def where(self, key: str, *within: object) -> str:
        """``<path>, line <n>`` for a top-level key (or table) of the file; with
        ``within``, for its first part's key inside that table (a ``[remap]`` entry)."""
        lines = self.text.splitlines()
        pattern = re.compile(rf"""^\s*(\[\[?\s*)?["']?{re.escape(key)}["']?\s*[=\]]""")
        found = next((n for n, line in enumerate(lines, 1) if pattern.match(line)), None)
        if within and isinstance(within[0], str):
            found = _entry_line(lines, key, within[0]) or found
        return str(self.path) if found is None else f"{self.path}, line {found}"


def _key_forms(key: str) -> str:
    """A TOML key as a file may spell it: bare, "basic" or 'literal'."""
    # A basic string may spell a character beyond ASCII as it is or as \uXXXX.
    forms = [re.escape(f) for f in dict.fromkeys(
        (json.dumps(key, ensure_ascii=False), json.dumps(key), f"'{key}'"))]
    if re.fullmatch(r"[A-Za-z0-9_-]+", key):
        forms.append(re.escape(key))
    return f"(?:{'|'.join(forms)})"


def _entry_line(lines: list[str], table: str, key: str) -> int | None:
    """The line of ``key`` in ``[table]`` (or of ``table.key = ``), None when not found
    (an inline table: its own line says it)."""
    header = re.compile(rf"^\s*\[\s*{_key_forms(table)}\s*\]")
    entry = re.compile(rf"^\s*{_key_forms(key)}\s*=")
    dotted = re.compile(rf"^\s*{_key_forms(table)}\s*\.\s*{_key_forms(key)}\s*=")
    inside = False
    for n, line in enumerate(lines, 1):
        if header.match(line):
            inside = True
        elif line.lstrip().startswith("["):
            inside = False
        elif (inside and entry.match(line)) or (not inside and dotted.match(line)):
            return n
    return None


_config: ContextVar[ConfigFile | None] = ContextVar("syncd_config", default=None)


class NoDecode:
    """Marks a list setting whose ``SYNCD_*`` variable is not JSON (its validator reads it)."""


def _xdg(var: str, fallback: str) -> Path:
    return Path(os.environ.get(var) or Path.home() / fallback)


def default_config_file() -> Path:
    env = os.environ.get("SYNCD_CONFIG")
    return Path(env) if env else _xdg("XDG_CONFIG_HOME", ".config") / "syncd" / "config.toml"


def read_config(path: Path | None = None, *, required: bool = False) -> ConfigFile:
    """The config file, parsed. Missing is fine for the default location only: a file the
    user named (``required``, or ``$SYNCD_CONFIG``) that is not there is a typo, and running
    on defaults would back up somewhere else than they think.
    """
    how = ""
    if path is None:
        env = os.environ.get("SYNCD_CONFIG")
        path, required = default_config_file(), required or bool(env)
        how = " ($SYNCD_CONFIG)" if env else ""
    try:
        raw = path.read_bytes()
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            if required:
                raise ConfigError(f"config file {path}{how} does not exist") from None
            return ConfigFile(path)
        raise ConfigError(f"config file {path}: cannot read: {e.strerror}") from None
    try:
        text = raw.decode()
        data = tomllib.loads(text)
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path}: not UTF-8") from None
    except tomllib.TOMLDecodeError as e:  # its message ends "(at line L, column C)"
        raise ConfigError(f"config file {path}: invalid TOML: {e}") from None
    cfg = ConfigFile(path, data, text)
    for key in data:
        if key not in Settings.model_fields:
            close = difflib.get_close_matches(key, list(Settings.model_fields), n=1)
            hint = f" (did you mean `{close[0]}`?)" if close else ""
            raise ConfigError(f"config file {cfg.where(key)}: unknown key `{key}`{hint}")
    return cfg


def default_store() -> str:
    return (_xdg("XDG_DATA_HOME", ".local/share") / "syncd" / "store").as_uri()


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:  # an unreadable state_dir: as if absent
        return False


def _remap_old(old: str) -> str:
    if not old:
        raise ValueError("an empty path prefix maps nothing")
    return old


def _remap_new(new: str) -> str:
    """A ``[remap]`` target: a path on this machine, where restored sessions are placed."""
    if not os.path.isabs(os.path.expanduser(new)):
        raise ValueError(f"{new!r} is not a path on this machine (absolute, or starting "
                         "with ~)")
    return new


class SourceTree(BaseModel):
    """One more Claude tree the daemon backs up (``[[sources]]``): its own machine id
    (``<machine_id>--<name>`` unless set), lease, state and follow."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    root: Path
    machine_id: str | None = None
    # Machine ids (or "*") this tree follows; default: the top-level follow, each id
    # taken as that machine's source of this name ("<id>--<name>").
    follow: list[str] | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if v == DEFAULT_SOURCE:
            raise ValueError(f"{v!r} is the tree `source` names; give this one another name")
        if len(v) > SOURCE_NAME_MAX or not SOURCE_NAME.fullmatch(v):
            raise ValueError(f"{v!r} is not a source name (1-32 of [A-Za-z0-9_-], starting "
                             "alphanumeric, no \"--\" and no trailing \"-\")")
        return v

    @field_validator("root")
    @classmethod
    def _root(cls, v: Path) -> Path:
        return v.expanduser()

    @field_validator("machine_id")
    @classmethod
    def _machine_id(cls, v: str | None) -> str | None:
        if v is not None and not MACHINE_ID.fullmatch(v):
            raise ValueError("machine id must be 1-64 of [A-Za-z0-9._-], starting alphanumeric")
        return v

    @field_validator("follow")
    @classmethod
    def _follow(cls, v: list[str] | None) -> list[str] | None:
        for m in v or ():
            if m != "*" and not MACHINE_ID.fullmatch(m):
                raise ValueError(f"{m!r} is not a machine id (1-64 of [A-Za-z0-9._-]) "
                                 "nor \"*\"")
        return None if v is None else list(dict.fromkeys(v))


@dataclass(frozen=True)
class Tree:
    """A tree one daemon backs up, as ``Settings.trees`` resolves it."""

    name: str
    root: Path
    machine_id: str
    follow: list[str]


def _same_tree(a: Path, b: Path) -> bool:
    """Whether two roots are one directory (a symlinked root is its target)."""
    return os.path.realpath(a) == os.path.realpath(b)


class Settings(BaseModel):
    # Defaults are validated too (the machine id a host name gives is checked as any).
    model_config = ConfigDict(extra="forbid", validate_default=True)

    source: Path = Field(default_factory=default_root)
    store: str = Field(default_factory=default_store)
    machine_id: str = Field(default_factory=default_machine_id)
    state_dir: Path = Field(
        default_factory=lambda: _xdg("XDG_STATE_HOME", ".local/state") / "syncd")
    s3_endpoint_url: str | None = None
    s3_region: str | None = None
    # Flush once the tree has been quiet this long, and at most this long after
    # the first unshipped change.
    flush_quiet: float = Field(2.0, gt=0)
    flush_max_delay: float = Field(10.0, gt=0)
    # A tree that never goes quiet (several sessions streaming) is flushed this long
    # after its first unshipped change instead of waiting for the max delay; 0 = off.
    flush_busy_interval: float = Field(4.0, ge=0)
    reconcile_interval: float = Field(3600.0, gt=0)
    # The machine's head (what `machines`, `sessions` and `resume` read) is rewritten at
    # most this often while flushes come (seconds), and at once when a session appears.
    head_interval: float = Field(300.0, ge=0)
    # Other machines of the store whose sessions `syncd run` brings here ("*": every
    # other one, 64 at most), checked every follow_interval seconds; a local transcript
    # written to in the last follow_quiet seconds, or held open, is left alone until it
    # is quiet.
    follow: Annotated[list[str], NoDecode] = Field(default_factory=list)
    follow_interval: float = Field(30.0, ge=1)
    follow_quiet: float = Field(60.0, ge=0)
    # Keep the full-text index `syncd search` reads (<state_dir>/search.db) current with
    # every flush, on a low-priority thread of the daemon's.
    search: bool = True
    # Keep the secrets findings `syncd secrets` reads (<state_dir>/secrets.db) current with
    # every flush (the bytes it shipped), on a low-priority thread of the daemon's.
    secrets_scan: bool = True
    # Copies of diverged files another machine's backup held (an import's, a restore's)
    # kept under <state_dir>/conflicts/: at most this many of one file, these bytes in
    # all, the oldest going first; a copy bigger than conflict_bytes alone is refused.
    conflict_copies: int = Field(8, ge=1)
    conflict_bytes: int = Field(1 << 30, ge=1 << 20)
    include: list[str] = Field(default_factory=lambda: list(DEFAULT_INCLUDE))
    exclude: list[str] = Field(default_factory=list)
    # Restore: extra path prefixes to map (old → new), and where local clones live
    # (a backed-up project maps to the local clone with the same git remote).
    remap: dict[Annotated[str, AfterValidator(_remap_old)],
                Annotated[str, AfterValidator(_remap_new)]] = Field(default_factory=dict)
    project_roots: list[str] = Field(default_factory=list)
    # Segments' level. They live until the next compaction (hourly), which packs their
    # bytes at compact_level: level 2 ships a seed ~20 % faster than 3 for ~6 % more bytes.
    zstd_level: int = Field(2, ge=1, le=22)
    # A flush larger than this is split into several segments (bounded memory).
    segment_max_bytes: int = Field(64 << 20, ge=1 << 20)
    store_retry_deadline: float = Field(60.0, gt=0)
    # The daemon ships a big start-up backlog (a first seed) in a child process, whose
    # memory goes back to the OS when it exits; off: it ships it in its own heap.
    catchup_child: bool = True
    log_level: str = "INFO"
    # Prometheus text endpoint on 127.0.0.1:<port>/metrics while the daemon runs; 0 = off.
    metrics_port: int = Field(0, ge=0, le=65535)
    # The local page (syncd web) served by the daemon too, on 127.0.0.1:<web_port>; its
    # URL, with the start's token, is logged and kept in <state_dir>/web-url (0600).
    web: bool = False
    web_port: int = Field(8767, ge=0, le=65535)
    # Encrypted stores: a file holding the passphrase ($SYNCD_PASSPHRASE wins over it).
    # The passphrase itself is never a setting: it would end up in dumps and reloads.
    passphrase_file: Path | None = None
    # One writer per machine id: the lease expires this long after its last renewal
    # (renewed every third of it: 12 PUTs an hour at 900).
    lease_ttl: float = Field(900.0, ge=1.0, le=3600.0)
    # Archives, scheduled inside the daemon. A schedule is an interval ("1h", "30m"), a
    # five-field cron line ("0 3 * * *", local time) or "off".
    compact_schedule: str = "1h"
    prune_schedule: str = "1d"
    verify_schedule: str = "7d"
    # Packs are written at this zstd level, in the scheduler's low-priority thread.
    compact_level: int = Field(9, ge=1, le=22)
    pack_target_bytes: int = Field(32 << 20, ge=1 << 20)
    # A compaction folds the flushes since the last one into a delta; after this many
    # deltas it writes a whole manifest instead (a restore reads each delta: 0 = always).
    max_deltas: int = Field(24, ge=0, le=1000)
    # Retention of snapshots (restic's forget rules; all zero/empty keeps everything).
    # The newest snapshot is never deleted.
    keep_within: str = ""
    keep_last: int = Field(0, ge=0)
    keep_hourly: int = Field(24, ge=0)
    keep_daily: int = Field(30, ge=0)
    keep_weekly: int = Field(8, ge=0)
    keep_monthly: int = Field(12, ge=0)
    # A file deleted from the tree stays in new snapshots this long after its tombstone.
    tombstone_keep: str = "180d"
    # One prune deletes at most this share of the machine's objects (the rest next run).
    prune_max_share: float = Field(0.5, gt=0, le=1)
    # The scheduled verify reads this percentage of the stored data, within this time.
    verify_read_data: float = Field(1.0, ge=0, le=100)
    verify_max_duration: str = "10m"
    # More Claude trees backed up by the same daemon ([[sources]] tables: name, root, and
    # optionally machine_id and follow), each kept apart in the store under its own
    # machine id. `source` stays the tree named "default".
    sources: list[SourceTree] = Field(default_factory=list)
    # Set on the settings of one tree (for_source): which one, and what the daemon's
    # other trees are (their machine ids are never followed by this one).
    _tree: str | None = PrivateAttr(default=None)
    _siblings: tuple[frozenset[str], tuple[str, ...]] | None = PrivateAttr(default=None)

    @field_validator("sources")
    @classmethod
    def _sources(cls, v: list[SourceTree], info: ValidationInfo) -> list[SourceTree]:
        default_root_ = info.data.get("source")
        machine = info.data.get("machine_id")
        seen: dict[str, SourceTree] = {}
        ids = {machine} if machine else set()
        for src in v:
            if src.name in seen:
                raise ValueError(f"two sources are named {src.name!r}")
            for other in seen.values():
                if _same_tree(src.root, other.root):
                    raise ValueError(f"sources {other.name!r} and {src.name!r} are the same "
                                     f"tree ({os.path.realpath(src.root)})")
            if default_root_ is not None and _same_tree(src.root, default_root_):
                raise ValueError(f"source {src.name!r} is the tree `source` names "
                                 f"({os.path.realpath(src.root)})")
            mid = src.machine_id or (f"{machine}{SOURCE_JOIN}{src.name}" if machine else None)
            if mid is not None:
                if not MACHINE_ID.fullmatch(mid):
                    raise ValueError(f"source {src.name!r}: its machine id {mid!r} is not "
                                     "one (at most 64 characters): set its machine_id")
                if mid in ids:
                    raise ValueError(f"source {src.name!r}: machine id {mid!r} is another "
                                     "tree's")
                ids.add(mid)
            seen[src.name] = src
        return v

    @field_validator("machine_id")
    @classmethod
    def _machine_id(cls, v: str) -> str:
        if not MACHINE_ID.fullmatch(v):
            raise ValueError("machine id must be 1-64 of [A-Za-z0-9._-], starting alphanumeric")
        return v

    @field_validator("follow", mode="before")
    @classmethod
    def _follow(cls, v: object) -> object:
        # "*" or one id as a string, a list in TOML or as JSON in $SYNCD_FOLLOW.
        if isinstance(v, str):
            text = v.strip()
            if text.startswith("["):
                try:
                    return json.loads(text)
                except ValueError:
                    raise ValueError("not a JSON list of machine ids") from None
            return [m.strip() for m in text.split(",") if m.strip()]
        return v

    @field_validator("follow")
    @classmethod
    def _followed(cls, v: list[str]) -> list[str]:
        for m in v:
            if m != "*" and not MACHINE_ID.fullmatch(m):
                raise ValueError(f"{m!r} is not a machine id (1-64 of "
                                 "[A-Za-z0-9._-]) nor \"*\"")
        return list(dict.fromkeys(v))

    @field_validator("log_level")
    @classmethod
    def _log_level(cls, v: str) -> str:
        if v.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise ValueError("log level must be DEBUG, INFO, WARNING, ERROR or CRITICAL")
        return v.upper()

    @field_validator("keep_within", "tombstone_keep", "verify_max_duration")
    @classmethod
    def _duration(cls, v: str) -> str:
        if v.strip():
            try:
                parse_duration(v)
            except ConfigError as e:
                raise ValueError(str(e)) from None
        return v

    @field_validator("compact_schedule", "prune_schedule", "verify_schedule")
    @classmethod
    def _schedule(cls, v: str) -> str:
        # A cron line's fields are checked when the daemon schedules it.
        if v.strip().lower() not in ("off", "never", "") and len(v.split()) != 5:
            try:
                parse_duration(v)
            except ConfigError as e:
                raise ValueError(f"{e}, a five-field cron line, or off") from None
        return v

    @field_validator("store")
    @classmethod
    def _store(cls, v: str) -> str:
        # A bare absolute path is a local store.
        if v.startswith(("/", "~")):
            return Path(v).expanduser().as_uri()
        url = urlparse(v)
        if url.scheme == "file" and url.netloc not in ("", "localhost"):
            raise ValueError("file URLs take an absolute path (file:///path)")
        if url.scheme == "s3" and not url.netloc:
            raise ValueError("missing bucket (s3://bucket/prefix)")
        if url.scheme not in ("file", "s3", "memory"):
            raise ValueError(f"unsupported store URL {v!r}: use file:///path, an absolute "
                             "path, or s3://bucket/prefix")
        return v

    @field_validator("source", "state_dir", "passphrase_file")
    @classmethod
    def _expand(cls, v: Path | None) -> Path | None:
        return None if v is None else v.expanduser()

    @model_validator(mode="after")
    def _upgraded_machine(self) -> Self:
        """A default machine id yields to the legacy one when this store's state is kept
        under that and not under the new one: an upgraded host keeps its backup, lease
        and state rather than seeding a second machine. A machine id the user set (file,
        variable or argument) is never replaced."""
        if "machine_id" in self.model_fields_set or _exists(self.state_file):
            return self
        legacy = legacy_machine_id()
        if MACHINE_ID.fullmatch(legacy) and _exists(self._state_file_of(legacy)):
            # Straight into the instance: the id stays a default (not in model_fields_set).
            self.__dict__["machine_id"] = legacy
        return self

    def __init__(self, **values: Any) -> None:
        """``values`` over the ``SYNCD_*`` variables over the config file (tables merged
        key by key, as pydantic-settings merged its sources)."""
        cfg = _config.get() or read_config()
        super().__init__(**_merged(cfg.data, _environment(), values))

    @property
    def state_file(self) -> Path:
        """One database per (machine, store): pointing at another store starts a fresh seed."""
        return self._state_file_of(self.machine_id)

    def _state_file_of(self, machine_id: str) -> Path:
        tag = hashlib.sha256(self.store.encode()).hexdigest()[:12]
        return self.state_dir / f"{machine_id}@{tag}.sqlite"

    # -- several trees ------------------------------------------------------------------

    def trees(self) -> list[Tree]:
        """Every tree of this configuration: the default one (``source``, ``machine_id``,
        ``follow``) first, then ``sources`` in their order."""
        out = [Tree(DEFAULT_SOURCE, self.source, self.machine_id, list(self.follow))]
        for src in self.sources:
            follow = src.follow if src.follow is not None else [
                m if m == "*" else f"{m}{SOURCE_JOIN}{src.name}" for m in self.follow]
            out.append(Tree(src.name, src.root,
                            src.machine_id or f"{self.machine_id}{SOURCE_JOIN}{src.name}",
                            follow))
        for t in out[1:]:  # a legacy id the default tree kept may make one too long
            if not MACHINE_ID.fullmatch(t.machine_id):
                raise ConfigError(f"sources: {t.name!r}: its machine id {t.machine_id!r} is "
                                  "not one (at most 64 characters): set its machine_id")
        return out

    @property
    def tree(self) -> str:
        """The name of the tree these settings back up (``default`` unless for_source)."""
        return self._tree or DEFAULT_SOURCE

    def for_source(self, name: str) -> Self:
        """The settings of one tree: its root as ``source``, its machine id, its follow;
        ``sources`` emptied (one tree), the others remembered for ``follows``."""
        trees = self.trees()
        found = next((t for t in trees if t.name == name), None)
        if found is None:
            names = ", ".join(t.name for t in trees)
            raise ConfigError(f"no source named {name!r} (the configuration has: {names})")
        one = self.model_copy(update={"source": found.root, "machine_id": found.machine_id,
                                      "follow": found.follow, "sources": []})
        one._tree = name
        one._siblings = (frozenset(t.machine_id for t in trees),
                         tuple(t.name for t in trees[1:]))
        return one

    def follows(self, machine: str) -> bool:
        """Whether ``follow = "*"`` may bring ``machine``'s sessions into this tree. With
        several trees: never another tree of this daemon's; a named tree follows the
        machines of its name (``…--<name>``), the default one every other machine but
        those (they are the named trees of other machines)."""
        if self._siblings is None:
            if not self.sources:
                return machine != self.machine_id
            ids, names = (frozenset(t.machine_id for t in self.trees()),
                          tuple(s.name for s in self.sources))
        else:
            ids, names = self._siblings
        if machine in ids:
            return False
        if self.tree != DEFAULT_SOURCE:
            return machine.endswith(SOURCE_JOIN + self.tree)
        return not any(machine.endswith(SOURCE_JOIN + n) for n in names)


# The settings whose variable holds JSON: the lists and tables (but NoDecode's).
_JSON_KEYS = frozenset(name for name, f in Settings.model_fields.items()
                       if get_origin(f.annotation) in (list, dict) and NoDecode not in f.metadata)


def _environment() -> dict[str, Any]:
    """The settings ``SYNCD_<KEY>`` variables give (the name in any case), a list or a
    table decoded from JSON."""
    env = {k.lower(): v for k, v in os.environ.items()}
    out: dict[str, Any] = {}
    for name in Settings.model_fields:
        value = env.get(f"syncd_{name}")
        if value is None:
            continue
        if name in _JSON_KEYS:
            try:
                decoded = json.loads(value)
            except ValueError:
                # A list or table in an environment variable that is not JSON
                # (SYNCD_INCLUDE=x).
                raise ConfigError(f"$SYNCD_{name.upper()}: not valid JSON (a list is written "
                                  'like ["projects/**", "history.jsonl"])') from None
            if decoded is not None:  # JSON null leaves the setting unset, as pydantic-settings did
                out[name] = decoded
        else:
            out[name] = value
    return out


def _merged(*layers: dict[str, Any]) -> dict[str, Any]:
    """``layers`` over each other, the last on top; a table over a table, key by key."""
    out: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            below = out.get(key)
            out[key] = _merged(below, value) if isinstance(below, dict) and \
                isinstance(value, dict) else value
    return out


def _dotted(loc: tuple[int | str, ...]) -> str:
    """A value's place as TOML spells a dotted key: ``remap."/Users/bob"``."""
    parts = [str(p) if isinstance(p, int) or re.fullmatch(r"[A-Za-z0-9_-]+", p) else
             json.dumps(p, ensure_ascii=False) for p in loc if p != "[key]"]
    return ".".join(parts) + (" (the key)" if loc and loc[-1] == "[key]" else "")


def _origin(name: str, cfg: ConfigFile, overrides: dict[str, object],
            within: tuple[object, ...] = ()) -> str:
    """Where a setting's value (or its part ``within``) came from (the variable, or the
    file and line), as a prefix; empty for an argument."""
    if name in overrides:
        return ""
    var = f"SYNCD_{name}".upper()
    value = next((v for k, v in os.environ.items() if k.upper() == var), None)
    if value is not None and not _file_entry(cfg.data.get(name), value, within):
        return f"${var}: "
    return f"config file {cfg.where(name, *within)}: " if name in cfg.data else ""


def _file_entry(table: object, variable: str, within: tuple[object, ...]) -> bool:
    """Whether the entry ``within`` of a table both the file and a variable set (merged
    key by key) is the file's: the file's table has it, the variable's has not."""
    if not within or not isinstance(table, dict) or within[0] not in table:
        return False
    try:
        theirs = json.loads(variable)
    except ValueError:
        return False
    return isinstance(theirs, dict) and within[0] not in theirs


def load_settings(config_file: Path | None = None, *, config_required: bool = False,
                  **overrides: object) -> Settings:
    """Settings from ``config_file`` (default: ``$SYNCD_CONFIG`` or the XDG location)
    overlaid by ``SYNCD_*`` variables and ``overrides``.

    ``ConfigError`` (one line naming the file, line or variable) on any problem. A missing
    ``config_file`` is an empty one unless ``config_required``.
    """
    cfg = read_config(config_file, required=config_required)
    token = _config.set(cfg)
    try:
        return Settings(**overrides)
    except ValidationError as e:
        first = e.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else ""
        key = _dotted(first["loc"]) or "configuration"
        msg = first["msg"].removeprefix("Value error, ")
        more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
        raise ConfigError(f"{_origin(name, cfg, overrides, tuple(first['loc'][1:]))}{key}: "
                          f"{msg}{more}") from None
    finally:
        _config.reset(token)

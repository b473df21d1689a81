"""Configuration: ``~/.config/syncd/config.toml`` overlaid by ``SYNCD_*`` variables."""

from __future__ import annotations

import hashlib
import os
import re
import socket
from contextvars import ContextVar
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from ._claude import DEFAULT_INCLUDE, default_root
from ._retention import PolicyError, parse_duration

_config_file: ContextVar[Path | None] = ContextVar("syncd_config_file", default=None)
MACHINE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def _xdg(var: str, fallback: str) -> Path:
    return Path(os.environ.get(var) or Path.home() / fallback)


def default_config_file() -> Path:
    env = os.environ.get("SYNCD_CONFIG")
    return Path(env) if env else _xdg("XDG_CONFIG_HOME", ".config") / "syncd" / "config.toml"


def default_store() -> str:
    return (_xdg("XDG_DATA_HOME", ".local/share") / "syncd" / "store").as_uri()


def default_machine_id() -> str:
    """``<hostname>-<8 hex of /etc/machine-id>``: stable across restarts, distinct per host."""
    host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname().split(".")[0]) or "host"
    try:
        seed = Path("/etc/machine-id").read_text().strip()
    except OSError:
        seed = socket.getfqdn()
    return f"{host[:48]}-{hashlib.sha256(seed.encode()).hexdigest()[:8]}"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SYNCD_", extra="forbid")

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
    include: list[str] = Field(default_factory=lambda: list(DEFAULT_INCLUDE))
    exclude: list[str] = Field(default_factory=list)
    # Restore: extra path prefixes to map (old → new), and where local clones live
    # (a backed-up project maps to the local clone with the same git remote).
    remap: dict[str, str] = Field(default_factory=dict)
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
    # Encrypted stores: a file holding the passphrase ($SYNCD_PASSPHRASE wins over it).
    # The passphrase itself is never a setting: it would end up in dumps and reloads.
    passphrase_file: Path | None = None
    # One writer per machine id: the lease expires this long after its last renewal
    # (renewed every third of it).
    lease_ttl: float = Field(30.0, ge=1.0)
    # Archives, scheduled inside the daemon. A schedule is an interval ("1h", "30m"), a
    # five-field cron line ("0 3 * * *", local time) or "off".
    compact_schedule: str = "1h"
    prune_schedule: str = "1d"
    verify_schedule: str = "7d"
    # Packs are written at this zstd level, in the scheduler's low-priority thread.
    compact_level: int = Field(9, ge=1, le=22)
    pack_target_bytes: int = Field(32 << 20, ge=1 << 20)
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

    @field_validator("machine_id")
    @classmethod
    def _machine_id(cls, v: str) -> str:
        if not MACHINE_ID.fullmatch(v):
            raise ValueError("machine id must be 1-64 of [A-Za-z0-9._-], starting alphanumeric")
        return v

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
            except PolicyError as e:
                raise ValueError(str(e)) from None
        return v

    @field_validator("compact_schedule", "prune_schedule", "verify_schedule")
    @classmethod
    def _schedule(cls, v: str) -> str:
        # A cron line's fields are checked when the daemon schedules it.
        if v.strip().lower() not in ("off", "never", "") and len(v.split()) != 5:
            try:
                parse_duration(v)
            except PolicyError as e:
                raise ValueError(f"{e}, a five-field cron line, or off") from None
        return v

    @field_validator("store")
    @classmethod
    def _store(cls, v: str) -> str:
        # A bare absolute path is a local store.
        return Path(v).as_uri() if v.startswith("/") else v

    @field_validator("source", "state_dir", "passphrase_file")
    @classmethod
    def _expand(cls, v: Path | None) -> Path | None:
        return None if v is None else v.expanduser()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml = _config_file.get() or default_config_file()
        return init_settings, env_settings, TomlConfigSettingsSource(settings_cls, toml)

    @property
    def state_file(self) -> Path:
        """One database per (machine, store): pointing at another store starts a fresh seed."""
        tag = hashlib.sha256(self.store.encode()).hexdigest()[:12]
        return self.state_dir / f"{self.machine_id}@{tag}.sqlite"


def load_settings(config_file: Path | None = None, **overrides: object) -> Settings:
    token = _config_file.set(config_file)
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    finally:
        _config_file.reset(token)

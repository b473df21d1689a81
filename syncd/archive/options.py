"""Settings → options for compaction, prune and verify (shared by the commands and the
daemon's scheduler)."""

from __future__ import annotations

import base64
import os
import time
from pathlib import Path

from syncd.archive.compact import CompactOptions
from syncd.archive.retention import Policy
from syncd.backup.state import State
from syncd.config import Settings
from syncd.duration import parse_duration
from syncd.errors import ConfigError
from syncd.format.dictionary import train
from syncd.repository import Repository
from syncd.sessionfiles import session_owning

# A dictionary that did not pay is not tried again for this long.
DICT_RETRY = 7 * 86400.0


def _duration(name: str, text: str) -> float:
    try:
        return parse_duration(text) if text.strip() else 0.0
    except ConfigError as e:
        raise ConfigError(f"{name}: {e}") from None


def compact_options(settings: Settings, *, dry_run: bool = False) -> CompactOptions:
    return CompactOptions(
        level=settings.compact_level, pack_target=settings.pack_target_bytes,
        max_chain=settings.max_deltas,
        tombstone_keep=_duration("tombstone_keep", settings.tombstone_keep),
        dry_run=dry_run, spool_dir=settings.state_dir,
        lock=settings.state_dir / f"compact-{settings.machine_id}.lock",
        acknowledged=acknowledged_seq(settings), passed_over=passed_over(settings))


def policy_of(settings: Settings) -> Policy:
    return Policy(keep_within=_duration("keep_within", settings.keep_within),
                  keep_last=settings.keep_last, keep_hourly=settings.keep_hourly,
                  keep_daily=settings.keep_daily, keep_weekly=settings.keep_weekly,
                  keep_monthly=settings.keep_monthly)


def verify_budget(settings: Settings) -> tuple[float, float | None]:
    """Percent of data to read and the time limit of a scheduled verify."""
    limit = _duration("verify_max_duration", settings.verify_max_duration)
    return settings.verify_read_data, limit or None


def ensure_dictionary(settings: Settings, repo: Repository, now: float | None = None) -> str:
    """Train and publish this machine's dictionary once (the shipper picks it up from
    the state); says what happened."""
    if not settings.state_file.exists():
        return "no dictionary yet: nothing backed up from this machine"
    now = time.time() if now is None else now
    state = State(settings.state_file)
    try:
        in_use = state.meta("dict_id")
        if in_use:
            return f"dictionary {in_use[:12]} in use"
        tried = state.meta("dict_tried")
        if tried and now - float(tried) < DICT_RETRY:
            return "no dictionary: the last training did not pay"
        forgotten = set(state.forgotten())
        root = settings.source

        def skip(p: Path) -> bool:  # a forgotten session's transcript teaches nothing
            return session_owning(os.fsencode(p.relative_to(root))) in forgotten

        d, gain = train(root, settings.zstd_level, skip)
        if gain is None:
            return "no dictionary yet: too few transcript lines to learn from"
        state.set_meta(dict_tried=repr(now))
        if d is None:
            return f"no dictionary: {100 * gain:.0f} % smaller small frames is below 10 %"
        repo.publish(d)
        state.set_meta(dict_id=d.id, dict_data=base64.b64encode(d.data).decode())
        return f"dictionary {d.id[:12]} adopted: small frames {100 * gain:.0f} % smaller"
    finally:
        state.close()


def acknowledged_seq(settings: Settings) -> int | None:
    """The newest seq the store confirmed to this machine's writer (-1: none yet; None:
    no state, nothing to hold the store to)."""
    if not settings.state_file.exists():
        return None
    state = State(settings.state_file, readonly=True)
    try:
        # A state a restore made before any writer ran (it records origins) confirmed
        # nothing either: compaction waits for the writer to adopt what the store holds.
        return state.next_seq - 1
    finally:
        state.close()


def passed_over(settings: Settings) -> set[int]:
    """The seqs this machine's writer passed over (``Shipper``): not its segments."""
    if not settings.state_file.exists():
        return set()
    state = State(settings.state_file, readonly=True)
    try:
        return state.passed_over()
    finally:
        state.close()


def record_job(settings: Settings, job: str, now: float | None = None) -> None:
    """Note in the state that ``job`` (compaction, prune, verify) ran; status shows it."""
    if not settings.state_file.exists():
        return
    state = State(settings.state_file)
    try:
        state.set_meta(**{f"last_{job}_time": repr(time.time() if now is None else now)})
    finally:
        state.close()

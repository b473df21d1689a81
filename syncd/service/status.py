"""``syncd status``: what is backed up, what is pending, what went wrong last, and health.

The same figures feed ``status --json`` and the daemon's metrics endpoint.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import asdict
from typing import Any

from syncd.archive import redactions
from syncd.archive.purge import pending as purge_pending
from syncd.backup.errorlog import WINDOW, errors_since
from syncd.backup.scan import scan
from syncd.backup.state import State
from syncd.claude import Selection
from syncd.config import Settings
from syncd.errors import StoreError
from syncd.follow.choice import recorded
from syncd.follow.cursor import Cursor, cursors, lag
from syncd.format.catalog import session_of_any
from syncd.security.lock import ProcessLock
from syncd.store import Store, layout, open_store
from syncd.untrusted import printable

# How long ``status`` waits for the store before calling it unreachable.
STORE_CHECK_TIMEOUT = 3.0


def check_store(settings: Settings, store: Store | None = None) -> tuple[bool, str | None]:
    """(reachable, why not): one HEAD of this machine's ``machine.json`` with a short timeout
    (and a LIST when it is missing)."""
    try:
        if store is None:
            store = open_store(settings.store, endpoint_url=settings.s3_endpoint_url,
                               region=settings.s3_region, retry_deadline=STORE_CHECK_TIMEOUT,
                               timeout=STORE_CHECK_TIMEOUT)
        key = layout.machine_key(settings.machine_id)
        if store.head(key) is None:
            # A HEAD answers a missing bucket as a missing key (a bare 404); a LIST says
            # which (only for a machine not backed up yet, or a typo in the URL).
            next(iter(store.list(key)), None)
    except (StoreError, OSError) as e:
        return False, str(e)
    return True, None


def _lag(root: bytes, dirty: set[bytes], since: float | None = None) -> float:
    """The age of the oldest unshipped change, in seconds (0: nothing pending).

    From the running daemon's word (``since``: when it first saw a change still pending)
    where it has one; a stat alone gives only the newest change of each file.
    """
    if not dirty:
        return 0.0
    oldest = since
    for rel in dirty:
        try:
            mtime = os.lstat(os.path.join(root, rel)).st_mtime
        except OSError:
            continue  # gone: a pending deletion has no time of its own
        oldest = mtime if oldest is None else min(oldest, mtime)
    return 0.0 if oldest is None else max(0.0, round(time.time() - oldest, 3))


def status(settings: Settings, *, probe_store: bool = False,
           store: Store | None = None) -> dict[str, Any]:
    """Every figure of ``syncd status``.

    ``probe_store`` adds the reachability check (one HEAD, through ``store`` if given);
    without it ``store_reachable`` is None and no network is touched.
    """
    pid = ProcessLock(settings.state_file.with_suffix(".lock")).holder()
    out: dict[str, Any] = {
        "machine_id": settings.machine_id,
        "source": str(settings.source),
        "store": settings.store,
        "state": str(settings.state_file),
        "daemon_pid": pid,
        "running": pid is not None,
        "last_flush_time": None,
        "last_flush_seq": None,
        "next_seq": 0,
        "files_tracked": 0,
        "files_deleted": 0,
        "bytes_shipped": 0,
        "bytes_pending": None,
        "files_pending": None,
        "last_error": None,
        "last_error_time": None,
        "lag_seconds": None,
        "errors_last_hour": 0,
        # From this machine's state: whether it writes sealed segments (None: no state yet).
        "encrypted": None,
        "store_reachable": None,
        "store_error": None,
        "last_reconcile_time": None,
        # Archive jobs the daemon schedules (syncd compact/prune/verify run by hand too).
        "last_compaction_time": None,
        "last_prune_time": None,
        "last_verify_time": None,
        # The last time the writer found segments missing from the store, and what it did.
        "store_repair": None,
        "store_repair_time": None,
        # The last object that held this machine's next seq without being its segment
        # (planted, damaged, foreign): that seq was passed over.
        "passed_over": None,
        "passed_over_time": None,
        "next_jobs": {"reconcile": None, "compaction": None, "prune": None, "verify": None},
        # Machines followed (follow): how far, the last import, what waits, conflicts.
        "following": [],
        # follow = "*": the last choice of machines (the cap, those left out, those
        # refused: they do not open this store's key).
        "follow_all": None,
        # Sessions forgotten here (never shipped until lifted), those whose tombstone
        # waits for the next flush, and those waiting for a purge of this machine's
        # backup (forgotten on a followed machine's tombstone).
        "forgotten": 0,
        "forgotten_unshipped": 0,
        "forgotten_purge_pending": 0,
        # Redactions' tombstones waiting for the next flush, and those of followed machines
        # waiting to be masked here (their sessions' files busy, or the job not run yet).
        "redactions_unshipped": 0,
        "redactions_pending": 0,
        # Sessions of this tree with secrets findings (`syncd secrets`; None: never scanned).
        "sessions_with_secrets": secrets_count(settings),
    }
    if probe_store:
        out["store_reachable"], out["store_error"] = check_store(settings, store)
    if not settings.state_file.exists():
        return out
    state = State(settings.state_file, readonly=True)
    try:
        t = state.meta("last_flush_time")
        seq = state.meta("last_flush_seq")
        out["last_flush_time"] = float(t) if t else None
        out["last_flush_seq"] = int(seq) if seq else None
        out["next_seq"] = state.next_seq
        out["encrypted"] = bool(state.meta("key_fingerprint"))
        live = [f for f in state.files() if f.deleted_at is None]
        out["files_tracked"] = len(live)
        out["files_deleted"] = len(state) - len(live)
        out["bytes_shipped"] = sum(f.offset for f in live)
        err = state.meta("last_error")
        if err:
            when, _, msg = err.partition(" ")
            out["last_error_time"], out["last_error"] = float(when), msg
        out["errors_last_hour"] = errors_since(state, time.time() - WINDOW)
        for key in ("last_compaction_time", "last_prune_time", "last_verify_time"):
            value = state.meta(key)
            out[key] = float(value) if value else None
        for key, meta in (("store_repair", "store_repair"), ("passed_over", "passed_over_note")):
            note = state.meta(meta)
            if note:
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    doc = json.loads(note)
                    out[key], out[f"{key}_time"] = str(doc["note"]), float(doc["time"])
        forgotten = state.forgotten()
        out["forgotten"] = len(forgotten)
        out["forgotten_unshipped"] = sum(1 for f in forgotten.values() if not f.announced)
        out["forgotten_purge_pending"] = len(purge_pending(state))
        out["redactions_unshipped"] = len(redactions.unannounced(state))
        out["redactions_pending"] = len(redactions.pending(state))
        if "*" in settings.follow:
            out["follow_all"] = recorded(state)
        followed = cursors(state)
        names = [m for m in settings.follow if m != "*"] + sorted(set(followed) - set(
            settings.follow))
        now = time.time()
        out["following"] = []
        for m in names:
            cur = followed.get(m, Cursor())
            # Lag in time: since the oldest change read there and not here yet (0: all
            # it read is here, as of its last check; None: never read).
            out["following"].append({"machine": m, **asdict(cur), "lag_seconds": lag(cur, now),
                                     "behind_since": min(cur.since.values(), default=None)})
        # Its sessions here now (the cursor's "imported" counts imports: a session the
        # other machine keeps writing is imported again at each look).
        here: dict[str, set[str | None]] = {}
        for rec in state.imports():
            if rec.size:  # a conflict wrote nothing here: none of its sessions is here
                here.setdefault(rec.source, set()).add(session_of_any(rec.src_path))
        for row in out["following"]:
            for key in ("misses", "head_etag", "since", "honoured"):
                del row[key]
            row["sessions"] = len(here.get(row["machine"], set()) - {None})
        last = state.meta("last_reconcile_time")
        out["last_reconcile_time"] = float(last) if last else None
        for job in out["next_jobs"]:
            nxt = state.meta(f"next_{job}_time")
            if nxt and pid is not None:  # scheduled by the running daemon only
                out["next_jobs"][job] = float(nxt)
        if settings.source.is_dir():
            root = os.fsencode(settings.source)
            found = scan(root, Selection(settings.include, settings.exclude), state)
            out["bytes_pending"] = found.pending_bytes
            out["files_pending"] = len(found.dirty)
            since = state.meta("pending_since") if pid is not None else None
            out["lag_seconds"] = _lag(root, found.dirty, float(since) if since else None)
    finally:
        state.close()
    return out


def secrets_count(settings: Settings) -> int | None:
    """Sessions of the tree's machine with findings (the prompt history counts as one),
    as the last scan left them; None when there was none or it does not read."""
    import sqlite3

    from syncd.errors import SyncdError
    from syncd.secrets.findings import FILE_NAME, Findings

    path = settings.state_dir / FILE_NAME
    if not path.exists():
        return None
    try:
        with Findings.open(path, readonly=True) as db:
            return db.sessions_with_findings(settings.machine_id)
    except (SyncdError, sqlite3.Error, OSError):  # a status line must not fail on it
        return None


def clock(t: float, now: float) -> str:
    """``t`` in local time: the time of day when it falls on ``now``'s day, else with
    its date (a job "in 24h" runs tomorrow, a flush of last week was not today)."""
    day = time.localtime(now)[:3]
    return time.strftime("%H:%M:%S" if time.localtime(t)[:3] == day else
                         "%Y-%m-%d %H:%M:%S", time.localtime(t))


def format_status(s: dict[str, Any], now: float | None = None) -> str:
    """``status``'s figures for a reader; times are shown as of ``now`` (default: now)."""
    now = time.time() if now is None else now

    def when(t: float | None) -> str:
        if t is None:
            return "never"
        return f"{clock(t, now)} ({_ago(now - t)} ago)"

    def later(t: float | None) -> str:
        if t is None:
            return "not scheduled"
        return f"{clock(t, now)} (in {_ago(max(0.0, t - now))})"

    pid = s["daemon_pid"]
    reach = s.get("store_reachable")
    store_note = {True: " (reachable)", False: f" (UNREACHABLE: {s.get('store_error')})",
                  None: ""}[reach]
    lag = s.get("lag_seconds")
    jobs = s.get("next_jobs") or {}
    lines = [
        f"machine:      {s['machine_id']}",
        f"source:       {s['source']}",
        f"store:        {s['store']}{' (encrypted)' if s.get('encrypted') else ''}{store_note}",
        f"daemon:       {f'running (pid {pid})' if pid else 'not running'}",
        f"health:       {', '.join(health(s, now)) or 'ok'}",
        f"lag:          {'unknown' if lag is None else _ago(lag)}"
        + ("" if lag is None else " (nothing pending)" if not s.get("files_pending")
           else " since the oldest pending change"),
        f"last flush:   {when(s['last_flush_time'])}"
        + (f", seq {s['last_flush_seq']}" if s["last_flush_seq"] is not None else ""),
        f"files:        {s['files_tracked']} tracked, {s['files_deleted']} deleted locally "
        f"(kept in the store), {s['bytes_shipped']} bytes shipped",
        f"pending:      {s['files_pending']} files, {s['bytes_pending']} bytes"
        if s["bytes_pending"] is not None else "pending:      unknown",
        f"last error:   {s['last_error']} ({when(s['last_error_time'])})"
        if s["last_error"] else "last error:   none",
        f"errors:       {s.get('errors_last_hour', 0)} in the last hour",
        f"store repair: {s['store_repair']} ({when(s.get('store_repair_time'))})"
        if s.get("store_repair") else "store repair: none needed",
        *([f"passed over:  {printable(s['passed_over'])} ({when(s.get('passed_over_time'))})"]
          if s.get("passed_over") else []),
        *([f"forgotten:    {s['forgotten']} sessions, never shipped until lifted ("
           f"{s.get('forgotten_unshipped', 0)} tombstones wait for the next flush, "
           f"{s.get('forgotten_purge_pending', 0)} wait to be purged from the store)"]
          if s.get("forgotten") else []),
        *([f"redactions:   {s.get('redactions_unshipped', 0)} tombstones wait for the next "
           f"flush, {s.get('redactions_pending', 0)} of followed machines wait to be "
           "masked here"]
          if s.get("redactions_unshipped") or s.get("redactions_pending") else []),
        f"compaction:   {when(s.get('last_compaction_time'))}",
        f"prune:        {when(s.get('last_prune_time'))}",
        f"verify:       {when(s.get('last_verify_time'))}",
        "secrets:      " + ("not scanned yet" if s.get("sessions_with_secrets") is None
                             else f"{s['sessions_with_secrets']} sessions with findings "
                             "(syncd secrets)" if s["sessions_with_secrets"] else "none found"),
        f"next jobs:    reconcile scan {later(jobs.get('reconcile'))}; "
        f"compaction {later(jobs.get('compaction'))}; prune {later(jobs.get('prune'))}; "
        f"verify {later(jobs.get('verify'))}",
    ]
    every = s.get("follow_all")
    if every:
        # Candidates are the machines not named in follow; named ones count in the cap.
        lines.append(f"follow *:     {len(every.get('followed') or [])} of "
                     f"{every.get('candidates', 0)} other machines followed, those backed "
                     f"up last (at most {every.get('cap', 0)} with the "
                     f"{every.get('named', 0)} named; chosen {when(every.get('time'))})"
                     + _names("; left out", every.get("left_out"), every.get("left_out_count"))
                     + _names("; refused (do not open this store's key)",
                              every.get("refused"), every.get("refused_count")))
    for f in s.get("following") or []:
        lines.append(f"following:    {f['machine']}: {follow_lag(f, now)}, "
                     f"last import {when(f['last_import'])}"
                     + (f", through seq {f['seq']}" if f["seq"] is not None else
                        ", not looked at yet")
                     + f", {f.get('sessions', 0)} of its sessions here "
                       f"({f['imported']} imports)"
                     + (f"; {len(f['waiting'])} left until quiet" if f["waiting"] else "")
                     + ("" if f.get("missing") is None else
                        f"; {f['missing']} of its head's sessions missing or behind here")
                     + (f"; {len(f['retry'])} that could not be imported, tried again "
                        "later" if f.get("retry") else "")
                     + (f"; PROBLEM: {printable(f['problem'])}" if f["problem"] else ""))
        lines += [f"  not on this machine: session {printable(sid)} (its project path "
                  "does not exist here; kept under its own folder)"
                  for sid in f.get("elsewhere") or []]
        # Paths and errors name what the followed machine's store named: no control
        # character of theirs reaches the terminal.
        lines += [f"  conflict copy: {printable(c)}" for c in f["conflicts"]]
    return "\n".join(lines)


# Lag above this is worth a look: the daemon flushes within seconds of a change.
LAG_WARN = 60.0


def health(s: dict[str, Any], now: float | None = None) -> list[str]:
    """What is wrong, in a few words each (as of ``now``, default now); empty when all
    is well."""
    now = time.time() if now is None else now
    problems = []
    if not s.get("running"):
        problems.append("daemon not running")
    if s.get("store_reachable") is False:
        problems.append("store unreachable")
    lag = s.get("lag_seconds")
    if lag is not None and lag > LAG_WARN:
        problems.append(f"lag {_ago(lag)}")
    if s.get("errors_last_hour"):
        problems.append(f"{s['errors_last_hour']} errors in the last hour")
    repaired = s.get("store_repair_time")
    if repaired is not None and now - repaired < 86400:
        problems.append("the store lost segments (shipped again)")
    passed = s.get("passed_over_time")
    if passed is not None and now - passed < 86400:
        problems.append("an object not ours took a seq (passed over)")
    for f in s.get("following") or []:
        if f.get("problem"):
            problems.append(f"following {f['machine']}: {printable(f['problem'])[:200]}")
        elif f.get("retry"):
            problems.append(f"following {f['machine']}: {len(f['retry'])} sessions could "
                            "not be imported (tried again later)")
    return problems


def follow_lag(f: dict[str, Any], now: float) -> str:
    """A followed machine's lag in words: how long its oldest change read and not here
    yet has waited, or up to date as of the last look."""
    since = f.get("behind_since")
    if since is not None:
        return f"{_ago(max(0.0, now - since))} behind"
    if f.get("lag_seconds") is None:
        return "lag unknown"
    last = f.get("last_check")
    return "up to date" + ("" if last is None else
                           f" as of {clock(last, now)} ({_ago(max(0.0, now - last))} ago)")


def _names(label: str, names: Any, count: Any) -> str:
    """``label``: the first names and how many more (store text made printable)."""
    if not isinstance(names, list) or not names:
        return ""
    more = count - len(names) if isinstance(count, int) and count > len(names) else 0
    return f"{label}: {printable(', '.join(str(n) for n in names[:10]))}" + (
        f" and {more + len(names[10:])} more" if more or len(names) > 10 else "")


def _ago(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"

"""``syncd status``: what is backed up, what is pending, what went wrong last."""

from __future__ import annotations

import os
import time
from typing import Any

from ._claude import Selection
from ._config import Settings
from ._lock import ProcessLock
from ._scan import scan
from ._state import State


def status(settings: Settings) -> dict[str, Any]:
    out: dict[str, Any] = {
        "machine_id": settings.machine_id,
        "source": str(settings.source),
        "store": settings.store,
        "state": str(settings.state_file),
        "daemon_pid": ProcessLock(settings.state_file.with_suffix(".lock")).holder(),
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
    }
    if not settings.state_file.exists():
        return out
    state = State(settings.state_file, readonly=True)
    try:
        t = state.meta("last_flush_time")
        seq = state.meta("last_flush_seq")
        out["last_flush_time"] = float(t) if t else None
        out["last_flush_seq"] = int(seq) if seq else None
        out["next_seq"] = state.next_seq
        live = [f for f in state.files() if f.deleted_at is None]
        out["files_tracked"] = len(live)
        out["files_deleted"] = len(state) - len(live)
        out["bytes_shipped"] = sum(f.offset for f in live)
        err = state.meta("last_error")
        if err:
            when, _, msg = err.partition(" ")
            out["last_error_time"], out["last_error"] = float(when), msg
        if settings.source.is_dir():
            found = scan(os.fsencode(settings.source),
                         Selection(settings.include, settings.exclude), state)
            out["bytes_pending"] = found.pending_bytes
            out["files_pending"] = len(found.dirty)
    finally:
        state.close()
    return out


def format_status(s: dict[str, Any]) -> str:
    def when(t: float | None) -> str:
        if t is None:
            return "never"
        return f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(t))} " \
               f"({_ago(time.time() - t)} ago)"

    pid = s["daemon_pid"]
    lines = [
        f"machine:      {s['machine_id']}",
        f"source:       {s['source']}",
        f"store:        {s['store']}",
        f"daemon:       {f'running (pid {pid})' if pid else 'not running'}",
        f"last flush:   {when(s['last_flush_time'])}"
        + (f", seq {s['last_flush_seq']}" if s["last_flush_seq"] is not None else ""),
        f"files:        {s['files_tracked']} tracked, {s['files_deleted']} deleted locally "
        f"(kept in the store), {s['bytes_shipped']} bytes shipped",
        f"pending:      {s['files_pending']} files, {s['bytes_pending']} bytes"
        if s["bytes_pending"] is not None else "pending:      unknown",
        f"last error:   {s['last_error']} ({when(s['last_error_time'])})"
        if s["last_error"] else "last error:   none",
    ]
    return "\n".join(lines)


def _ago(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"

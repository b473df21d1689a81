"""Every file of a session, wherever Claude Code keeps it: what ``forget`` removes.

A session's transcript ``projects/<folder>/<sid>.jsonl`` and what lies beside it
(``sibling.owner_of``: ``<sid>/**`` with subagents and tool results, the project-level
siblings), ``todos/<sid>-*``, ``file-history/<sid>/**``, ``tasks/<sid>/**``,
``session-env/<sid>/**`` and ``debug/<sid>.txt``; and of the shared ``history.jsonl``,
its lines (each names its ``sessionId``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection

from syncd.format.catalog import is_session_id
from syncd.sibling import owner_of

HISTORY = b"history.jsonl"
# A history line names its session near its end; a cheap look before a JSON parse.
_SESSION_ID = re.compile(rb'"sessionId"\s*:\s*"([0-9a-fA-F-]{36})"')
_BY_FOLDER = (b"file-history", b"tasks", b"session-env")


def session_owning(path: bytes) -> str | None:
    """The session whose file ``path`` (relative to the Claude tree) is, else None."""
    parts = path.split(b"/")
    sid: bytes | None = None
    if parts[0] == b"todos" and len(parts) == 2:
        sid = parts[1][:36] if parts[1][36:37] == b"-" else None
    elif parts[0] in _BY_FOLDER and len(parts) > 2:
        sid = parts[1]
    elif parts[0] == b"debug" and len(parts) == 2 and parts[1].endswith(b".txt"):
        sid = parts[1][:-4]
    else:
        return owner_of(path)
    text = sid.decode("ascii", "replace") if sid is not None else ""
    return text if is_session_id(text) else None


def history_session(line: bytes) -> str | None:
    """The session a ``history.jsonl`` line names (None: none, or not a line we read)."""
    m = _SESSION_ID.search(line)
    if m is None:
        return None
    try:
        doc = json.loads(line)
    except ValueError:
        return m.group(1).decode()
    sid = doc.get("sessionId") if isinstance(doc, dict) else None
    return sid if isinstance(sid, str) and is_session_id(sid) else None


def owned_by(path: bytes, sids: Collection[str]) -> bool:
    return bool(sids) and session_owning(path) in sids


__all__ = ["HISTORY", "history_session", "owned_by", "session_owning"]

"""The purge queue: sessions this machine forgot on a followed machine's word (its
tombstone), whose bytes are still in this machine's own backup (the copies it shipped
as imported). The follower queues them in the state; the daemon's archive job rewrites
the store without them (``archive.rewrite``) and only then takes them off the queue.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

from syncd.archive.compact import CompactOptions
from syncd.archive.rewrite import Rewrite, RewriteReport, rewrite
from syncd.format.catalog import is_session_id

if TYPE_CHECKING:
    from syncd.backup.state import State
    from syncd.repository import Repository

# The state's meta key: a JSON list of session ids.
META = "forget_pending"
# The follower (main thread) and the archive job (its own thread and connection) both
# read and write the list: one at a time, so neither loses the other's change.
_LOCK = threading.Lock()


def pending(state: State) -> list[str]:
    """The sessions queued for a purge of this machine's backup (damaged entries
    dropped: they name no session)."""
    try:
        doc = json.loads(state.meta(META) or "[]")
    except ValueError:
        return []
    return [s for s in doc if isinstance(s, str) and is_session_id(s)] \
        if isinstance(doc, list) else []


def queue(state: State, sids: Iterable[str]) -> None:
    with _LOCK:
        now = pending(state)
        new = [s for s in dict.fromkeys(sids) if s not in now]
        if new:
            state.set_meta(**{META: json.dumps(now + new)})


def done(state: State, sids: Iterable[str]) -> None:
    """``sids`` are gone from this machine's backup: off the queue (what was queued
    meanwhile stays)."""
    gone = set(sids)
    with _LOCK:
        state.set_meta(**{META: json.dumps([s for s in pending(state) if s not in gone])})


def purge(repo: Repository, sids: frozenset[str], opts: CompactOptions) -> RewriteReport:
    """Rewrite this machine's backup without ``sids`` (``CompactError`` when it cannot);
    returns the rewrite's report."""
    return rewrite(repo, Rewrite(forget=sids), opts)


__all__ = ["META", "done", "pending", "purge", "queue"]

"""Which other machines ``follow = "*"`` follows: at most ``cap`` of them (each costs a
HEAD a poll), those backed up last first, as their heads say; in an encrypted store never
one whose objects do not open with this store's key (anyone who can write the bucket can
plant a ``machine.json``). Recorded in the state for ``syncd status``."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from syncd.backup.state import State
    from syncd.repository import Repository

log = logging.getLogger("syncd.follow")

# A last backup later than now by more than this counts as now plus this: a head from
# the future (a clock ahead, or a planted head) does not come first for that.
SKEW = 300.0
# The state's meta key of the last choice; names kept of those left out.
META = "follow_all"
NAMES_KEPT = 50


@dataclass
class Choice:
    """One choice among ``candidates`` machines (named ones not counted): ``followed``,
    then those ``left_out`` beyond the cap (most recent first) and those ``refused``
    (do not open this store's key), each list cut to NAMES_KEPT; their counts."""

    time: float
    cap: int
    candidates: int
    named: int = 0  # machines named in follow, followed whatever the cap
    followed: list[str] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)
    left_out_count: int = 0
    refused: list[str] = field(default_factory=list)
    refused_count: int = 0


def choose(repo: Repository, others: list[str], named: int, cap: int, now: float) -> Choice:
    """Of ``others``, the ``cap - named`` backed up last (one head GET each, 32 at a time;
    a machine without a head that reads ranks last, in name order)."""
    # Imported here: ``syncd status`` reads ``recorded`` without the listing's codecs.
    from syncd.restore.listing import last_backups

    room = max(0, cap - named)
    ranked: list[tuple[bool, float, str]] = []
    refused = []
    for name, last, opens in last_backups(repo, others):
        if not opens:
            refused.append(name)
            continue
        ranked.append((last is None, -min(last, now + SKEW) if last is not None else 0.0,
                       name))
    ranked.sort()
    names = [name for _, _, name in ranked]
    left = names[room:]
    return Choice(now, cap, len(others), named, names[:room], left[:NAMES_KEPT], len(left),
                  refused[:NAMES_KEPT], len(refused))


def record(state: State, c: Choice) -> None:
    """Keep ``c`` for ``syncd status``; say it when what is left out changed."""
    last = recorded(state)
    if last is None or (last.get("left_out_count"), last.get("refused_count")) != (
            c.left_out_count, c.refused_count):
        if c.left_out_count:
            log.warning('following "*": the store holds %d other machines; only %d are '
                        "followed, those backed up last (name them in follow to choose; "
                        "syncd status lists the others)", c.candidates + c.named, c.cap)
        if c.refused_count:
            log.warning('following "*": %d machines of the store do not open with its key '
                        "(planted, or of another key): not followed", c.refused_count)
    state.set_meta(**{META: json.dumps(asdict(c))})


def recorded(state: State) -> dict[str, Any] | None:
    """The last choice as ``record`` kept it (None: none, or not in that shape)."""
    try:
        doc = json.loads(state.meta(META) or "null")
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None

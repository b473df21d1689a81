"""A session as a person names it: its id, or the first 8 characters of it or more (as
`syncd sessions` shows it on a terminal).

The one place that says what such a name matches among the sessions of the machine(s)
in question, so that every command taking one (`restore --session`, `resume`) accepts
and refuses the same: a name that matches no session says so; one that matches several
is one line naming each (id, machine, project) and a usage error (exit 2); a session
several machines hold, when no machine was named, is one line naming them (exit 1, as
before prefixes: the store, not the name, holds two). The sessions come from the
listing (``syncd.restore.listing``): machines' heads, or their backups.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from syncd.errors import AmbiguousSession, OnSeveralMachines
from syncd.format.catalog import Session
from syncd.untrusted import printable

# The shortest prefix taken: 32 bits of a UUID, as `sessions` shows them.
MIN_PREFIX = 8
# Matches named in one error line; the rest are counted.
NAMED_MAX = 5


def names(ref: str, session_id: str) -> bool:
    """Whether ``ref`` names ``session_id``: the whole id or a prefix of at least
    ``MIN_PREFIX`` characters, in either case (Claude writes them in lower case)."""
    ref, sid = ref.lower(), session_id.lower()
    return sid == ref or (len(ref) >= MIN_PREFIX and sid.startswith(ref))


def matching(ref: str, sessions: Iterable[tuple[str, Session]]) -> list[tuple[str, Session]]:
    """The ``(machine, session)`` pairs of ``sessions`` that ``ref`` names."""
    return [(m, s) for m, s in sessions if names(ref, s.session_id)]


# A store's string in an error line (a project path, a last activity: up to 4,096
# characters each) is cut to this many, its two ends kept.
SHOWN_MAX = 80


def _shown(text: str) -> str:
    """``text`` printable and at most ``SHOWN_MAX`` characters (``…`` in its middle)."""
    text = printable(text)
    if len(text) <= SHOWN_MAX:
        return text
    half = (SHOWN_MAX - 1) // 2
    return text[:half] + "…" + text[len(text) - (SHOWN_MAX - 1 - half):]


def _listed(items: Sequence[str]) -> str:
    more = len(items) - NAMED_MAX
    return ", ".join(items[:NAMED_MAX]) + (f" and {more} more" if more > 0 else "")


def one(ref: str, found: list[tuple[str, Session]], machine_named: bool) -> str:
    """The id of the one session ``found`` holds (``found``: what ``ref`` matched, at
    least one); ``AmbiguousSession`` when it holds several, or one session on several
    machines and no machine was named (``machine_named``). A machine holding a session
    in two project folders holds one session: its restore picks the folder. A UUID's case
    is no part of it: ``ABCDEF12-…`` is the session ``abcdef12-…`` (a store may list
    either), and the id returned is spelled as the first machine (by name) lists it."""
    ids = sorted({s.session_id.lower() for _, s in found})
    if len(ids) > 1:
        # Strings from a store: printed as text, never as escapes.
        first: dict[tuple[str, str], Session] = {}
        for m, s in sorted(found, key=lambda f: (f[1].session_id.lower(), f[0])):
            first.setdefault((s.session_id, m), s)
        shown = [f"{sid} ({printable(m)}, {_shown(s.place or '?')})"
                 for (sid, m), s in first.items()]
        raise AmbiguousSession(f"session {ref} matches {len(ids)} sessions: "
                               f"{_listed(shown)}; give more of its id")
    machines = sorted({m for m, _ in found})
    if len(machines) > 1 and not machine_named:
        last = {m: s.fields.get("last_activity", "?") for m, s in found}
        shown = [f"{printable(m)} (last activity {_shown(last[m])})" for m in machines]
        raise OnSeveralMachines(f"session {ref} is in several machines' backups: "
                                f"{_listed(shown)}; pick one with --machine", machines)
    return min(found, key=lambda f: (f[0], f[1].session_id))[1].session_id

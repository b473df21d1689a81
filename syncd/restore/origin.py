"""Where a session lives here, and where it came from: the path rules a restore of another
machine's sessions learns before it maps anything.

- A session that exists here stays where this machine keeps it: the other machine's start
  directory maps to the local copy's, and its folder to the local copy's folder (never the
  other way round: an import never moves a local session to another machine's paths).
- A session that came from here (the other machine's catalog says ``origin`` is this
  machine) goes back through the inverse of the rules its restore there used.
- A session that came from the other machine goes through the rules its first restore
  here used again, so every later import of it lands where the first one did.

Rules learned for one session apply to the whole restore when they agree with the others'
(the same start directory is the same place here for every session of it); a session
whose rules contradict another's is restored in a pass of its own.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from syncd.backup.state import OriginRecord
from syncd.format.catalog import Session, parse_origin
from syncd.restore.relocation import first_entry, launch_dir, placed_by, relocated_cwd, strays
from syncd.restore.remap import Rule

# A local copy's first cwd is in its first lines: read this much of it at most.
HEAD_READ = 1 << 20
_STEP = 64 << 10

# A restore makes at most this many passes (each reads the target's project folders).
PASSES_MAX = 4

KEPT_HERE = "where this machine keeps the session"
BACK_HERE = "back to this machine's paths"
AS_FIRST = "as this session's first restore here mapped it"


@dataclass
class Pass:
    """One restore pass: the learned ``rules`` and ``folders`` (source folder → local
    folder) it maps with; ``sessions``: those it restores (None: all that were asked for
    but ``without``, which later passes restore)."""

    rules: tuple[Rule, ...] = ()
    folders: dict[str, str] = field(default_factory=dict)
    sessions: tuple[str, ...] | None = None
    without: frozenset[str] = frozenset()


@dataclass
class _Learned:
    rules: list[Rule] = field(default_factory=list)
    folders: dict[str, str] = field(default_factory=dict)


def passes(sessions: Iterable[Session], machine: str, *, target: Path,
           local_machine: str | None, mapped: Callable[[str], str] = str,
           asked: Callable[[str], str] = str, relocate: bool = True,
           origin_of: Callable[[str], OriginRecord | None] | None = None) -> list[Pass]:
    """The passes a restore of ``machine``'s ``sessions`` into ``target`` makes (one, in
    all but rare cases). ``mapped``: a path as the restore's own rules map it, ``asked``:
    as the user's own ``--map`` rules do. With ``relocate``, a local session moves to the
    place those rules give (``restore/relocation``) instead of staying when its start
    directory does not exist here, or when ``--map`` names a directory that does."""
    chosen = sorted(sessions, key=lambda s: s.path)
    if machine == local_machine or not chosen:
        return [Pass()]  # this machine's own paths already
    local = strays(target, {s.session_id: "" for s in chosen})
    first, alone = _Learned(), []
    for s in chosen:
        own = _learn(s, machine, target, local.get(s.session_id, []), local_machine, mapped,
                     asked, relocate, origin_of)
        if own is None:
            continue
        if _agrees(first, own):
            _add(first, own)
        else:
            alone.append((s.session_id, own))
    out = [Pass(tuple(first.rules), first.folders,
                without=frozenset(sid for sid, _ in alone))]
    # Those that contradict the first pass: each with its own rules, grouped when they
    # agree among themselves.
    groups: list[tuple[_Learned, list[str]]] = []
    for sid, own in alone:
        for learned, sids in groups:
            if _agrees(learned, own):
                _add(learned, own)
                sids.append(sid)
                break
        else:
            if len(groups) < PASSES_MAX - 1:
                groups.append((own, [sid]))
                continue
            # More contradictions than passes (claims no writer makes by the hundred):
            # this one goes with the first pass, with only what agrees with it.
            out[0] = dataclasses.replace(out[0], without=out[0].without - {sid})
            _add(first, _Learned([r for r in own.rules if _agrees(first, _Learned([r]))],
                                 {k: v for k, v in own.folders.items()
                                  if first.folders.get(k, v) == v}))
    out[0] = dataclasses.replace(out[0], rules=tuple(first.rules), folders=first.folders)
    out += [Pass(tuple(g.rules), g.folders, tuple(sids)) for g, sids in groups]
    return out


def _learn(s: Session, machine: str, target: Path, folders: list[str],
           local_machine: str | None, mapped: Callable[[str], str],
           asked: Callable[[str], str], relocate: bool,
           origin_of: Callable[[str], OriginRecord | None] | None) -> _Learned | None:
    """What one session teaches: None when nothing."""
    out = _Learned()
    origin = parse_origin(s.fields.get("origin"))
    if origin is not None and origin.machine == local_machine:
        out.rules += [Rule(new, old, f"{BACK_HERE} ({machine} mapped {old} to {new})")
                      for old, new in origin.rules]
    rec = origin_of(s.session_id) if origin_of is not None else None
    if rec is not None and rec.machine == machine:
        out.rules += [Rule(old, new, AS_FIRST) for old, new in rec.rules]
    start = _start(s.folder, placed_by(s))
    if folders:
        folder = folders[0]
        local = target / "projects" / folder / f"{s.session_id}.jsonl"
        # Like for like: the local copy's relocatedCwd against the backup's (one the
        # local copy lacks is not here yet: it moves, or stays without a rule).
        cwd = relocated_cwd(local) if s.fields.get("relocated_cwd") else first_cwd(local)
        here = _start(folder, cwd) if cwd else None
        if not (relocate and start is not None and
                _moves(here, mapped(start), asked(start), start)):
            out.folders[s.folder] = folder
            if here is not None and start is not None and here != start:
                # First: of two rules for one directory, the first stays (Remapper).
                out.rules.insert(0, Rule(start, here, KEPT_HERE))
    return out if out.rules or out.folders else None


def _moves(here: str | None, mapped: str, asked: str, start: str) -> bool:
    """Whether a restore (not an import) moves a local copy started in ``here`` to the
    place its rules give (``mapped``; ``asked``: the user's ``--map`` alone) instead of
    keeping it: one whose start is unknown, or was restored to a place that is not this
    machine's (it does not exist here), or that ``--map`` sends to a directory of this
    machine (relocation then moves it, or says why not)."""
    if here is None:
        return True
    if not os.path.isdir(here) and mapped != here:
        return True
    return asked not in (start, here) and os.path.isdir(asked)


def _start(folder: str, cwd: str | None) -> str | None:
    """The directory a session was started in (its folder's), or its first cwd."""
    if not cwd:
        return None
    found = launch_dir(folder, cwd)
    return found[0] if found is not None else cwd


def _agrees(a: _Learned, b: _Learned) -> bool:
    """Whether ``b``'s rules and folders say nothing against ``a``'s."""
    olds = {r.old.rstrip("/\\"): r.new.rstrip("/\\") for r in a.rules}
    return all(olds.get(r.old.rstrip("/\\"), r.new.rstrip("/\\")) == r.new.rstrip("/\\")
               for r in b.rules) and \
        all(a.folders.get(k, v) == v for k, v in b.folders.items())


def _add(a: _Learned, b: _Learned) -> None:
    a.rules += b.rules
    a.folders.update(b.folders)


def first_cwd(path: Path) -> str | None:
    """The first ``cwd`` of a local transcript (read a little at a time, at most
    ``HEAD_READ``), or None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        head = b""
        while len(head) < HEAD_READ:
            chunk = os.pread(fd, _STEP, len(head))
            if not chunk:
                break
            head += chunk
            cut = head.rfind(b"\n")
            if cut >= 0 and (cwd := first_entry(head[:cut]).get("cwd")):
                return cwd
        return first_entry(head).get("cwd") or None
    except OSError:
        return None
    finally:
        os.close(fd)


def origin_record(sid: str, machine: str, src_path: bytes, rules: Iterable[Rule],
                  now: float) -> OriginRecord:
    return OriginRecord(sid, machine, src_path, tuple((r.old, r.new) for r in rules), now)


__all__ = ["Pass", "first_cwd", "origin_record", "passes"]

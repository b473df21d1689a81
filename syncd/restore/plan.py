"""What a restore writes, decided before a byte is fetched: the sessions chosen, their
files, the refusals (include set, never-list, config, instructions, unsafe names, copies
of copies), the stored paths that land on one place, the files of sessions that exist
here, and those whose local copy an earlier import vouches for.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

from syncd.claude import carries_instructions, in_git_dir, is_never, is_user_config
from syncd.errors import RestoreError
from syncd.format.catalog import Session
from syncd.format.snapshot import Entry, has_sid
from syncd.restore.fetch import _first_gap
from syncd.restore.mapping import _kind, _target_rel, _under
from syncd.restore.options import RestoreOptions
from syncd.restore.remap import Remapper, Rule
from syncd.restore.report import Action, RestoreReport
from syncd.restore.userconfig import already_here
from syncd.sibling import is_sibling, owner_of, siblings
from syncd.view import Backup


def _chosen(backup: Backup, opts: RestoreOptions, report: RestoreReport) -> list[Session]:
    """The sessions a restore writes: those asked for, or all of them."""
    if not opts.sessions and not opts.projects:
        return list(backup.sessions.values())
    chosen: list[Session] = []
    for sid in opts.sessions:
        s = backup.find_session(sid)
        if s is None:
            raise RestoreError(f"session {sid} is not in machine {backup.machine!r}'s backup")
        chosen.append(s)
    home_only = Remapper([Rule(str(backup.info.get("home", "")), opts.local_home)]
                         if backup.info.get("home") else [])
    for want in opts.projects:
        found = [s for s in backup.sessions.values() if any(
            _under(p, want) or _under(home_only.path(p), want) for p in s.places)]
        if not found:
            # As for an unknown --session: nothing is planned (history lines included).
            raise RestoreError(f"no project in machine {backup.machine!r}'s backup matches "
                               f"{want} (syncd sessions lists them)")
        chosen.extend(found)
    return chosen


def _session_files(chosen: list[Session]) -> Callable[[bytes], bool]:
    """Whether a stored path is one of ``chosen``'s files (transcript, its siblings, its
    folder, its todos, file history and tasks)."""
    prefixes = []
    for s in chosen:
        folder = s.path.rsplit(b"/", 1)[0]
        raw = s.session_id.encode()
        prefixes += [folder + b"/" + raw + b"/", b"todos/" + raw + b"-",
                     b"file-history/" + raw + b"/", b"tasks/" + raw + b"/"]
    paths = {p for s in chosen for p in (s.path, *siblings(s.path))}
    starts = tuple(prefixes)
    return lambda p: p in paths or p.startswith(starts)


def _select(backup: Backup, opts: RestoreOptions, report: RestoreReport,
            without: frozenset[str] = frozenset()
            ) -> tuple[dict[bytes, Entry], set[str] | None]:
    """The files to restore (but those of the sessions ``without``, which another pass
    restores), and the sessions whose history lines to keep (None: all)."""
    chosen = _chosen(backup, opts, report)
    left = [s for s in chosen if s.session_id in without]
    if not opts.sessions and not opts.projects:
        theirs = _session_files(left)
        return {p: f for p, f in backup.files.items() if not left or not theirs(p)}, None
    chosen = [s for s in chosen if s.session_id not in without]
    sids = {s.session_id for s in chosen}
    ours = _session_files(chosen)
    files = {p: f for p, f in backup.files.items() if ours(p)}
    if b"history.jsonl" in backup.files and opts.history:
        files[b"history.jsonl"] = _history_of(backup.files[b"history.jsonl"], sids)
    return files, sids


def _history_of(h: Entry, sids: set[str]) -> Entry:
    """history.jsonl with only the frames that hold lines of ``sids`` (and those whose
    sessions are not known), as a sparse file. A history with a gap is restored whole
    (its intact prefix), so offsets past the gap never decide a sparse file's size."""
    if not h.sids or _first_gap(h) is not None:
        return h
    keep = [(k, x) for k, x in h.extents
            if (ids := h.sids.get((k, x.off))) is None or any(has_sid(ids, s) for s in sids)]
    return dataclasses.replace(h, extents=keep, sparse=len(keep) < len(h.extents))


# A file whose extents reach more than this many times the raw bytes of the distinct
# frames they are parts of, plus OVERCLAIM_SLACK, is no writer's: a writer's copies name
# each shipped byte about once (a patch of a file of repeated lines a few times), and no
# transcript comes near the slack.
OVERCLAIM_RATIO = 16


OVERCLAIM_SLACK = 64 << 20


def _overclaim(f: Entry) -> str | None:
    """Why ``f``'s bytes are refused unfetched (None: they are not)."""
    reach = sum(x.end - x.start for _, x in f.extents)
    if reach <= OVERCLAIM_SLACK:
        return None
    distinct = sum({(k, x.off): x.raw for k, x in f.extents}.values())
    if reach <= OVERCLAIM_RATIO * distinct + OVERCLAIM_SLACK:
        return None
    return (f"its copies claim {reach} bytes made of {distinct} bytes of frames, named over "
            "and over (no writer makes that)")


UNSAFE = "unsafe path: it could leave the target"


def safe_relpath(path: bytes) -> bytes:
    """Reject store paths that could escape the target (``..``, absolute, NUL)."""
    parts = path.split(b"/")
    if not path or path.startswith(b"/") or b"\0" in path or any(
            p in (b"", b".", b"..") for p in parts):
        raise RestoreError(f"refusing unsafe path {path!r} from the store")
    return path


CONFIG_ONLY = "user config: restored only with --config"


def _refusal(path: bytes, remap: Remapper, backup: Backup, opts: RestoreOptions) -> str | None:
    """Why a stored path is not written here (None: it may be)."""
    rel = os.fsdecode(path)
    target = _target_rel(path, remap)
    try:
        safe_relpath(path)
        safe_relpath(target)
    except RestoreError:
        return UNSAFE
    # Where it would land is checked as well: the folder a path maps to is this machine's.
    if is_never(rel) or is_never(os.fsdecode(target)):
        return "on the never-upload list: not restored"
    if not opts.selection.wants(rel) or not opts.selection.wants(os.fsdecode(target)):
        return "outside the include set: not restored"
    if is_user_config(rel) and not opts.config:
        return CONFIG_ONLY
    if is_user_config(rel) and not in_git_dir(rel):
        return None
    if not opts.instructions and carries_instructions(
            rel, foreign=backup.machine != opts.local_machine):  # unknown here: foreign
        return "carries instructions or code: restored only with --with-instructions"
    return None


def _refuse(files: dict[bytes, Entry], remap: Remapper, backup: Backup,
            opts: RestoreOptions, report: RestoreReport) -> None:
    """Take out of ``files`` those not written here, each listed as refused (and an error
    where only a damaged backup holds such a file)."""
    for path in sorted(files):
        claim = _overclaim(files[path])
        if claim is not None:
            # Copies of copies (a store's doing, never a writer's) name the same frames
            # over and over: that file alone is refused, the rest restores.
            del files[path]
            report.errors.append(f"refusing {path!r} from the store: {claim}")
            report.actions.append(Action("refuse", os.fsdecode(path), os.fsdecode(path),
                                         claim))
            continue
        why = _refusal(path, remap, backup, opts)
        if why is not None:
            # Listed, never written: what lands in the Claude tree is this machine's call.
            f = files.pop(path)
            if why == CONFIG_ONLY and already_here(os.path.join(
                    os.fsencode(opts.target), _target_rel(path, remap)), f, remap):
                # Nothing to refuse: it is here as the backup has it.
                report.actions.append(Action("skip", os.fsdecode(path), os.fsdecode(path),
                                             "identical"))
                continue
            report.actions.append(Action("refuse", os.fsdecode(path), os.fsdecode(path), why))
            if why.startswith(UNSAFE):  # no writer stores such a name: a damaged backup
                report.errors.append(f"refusing unsafe path {path!r} from the store")


def _collisions(files: dict[bytes, Entry],
                remap: Remapper) -> dict[bytes, tuple[bytes, bytes]]:
    """Stored paths that land where another one does (two folders of one start directory,
    named by two runtimes) → (that place, the stored path placed there: one already at its
    place first, else the first in order). They are saved aside, never written over each
    other."""
    places = {path: _target_rel(path, remap) for path in files}
    claimed: dict[bytes, bytes] = {}
    aside: dict[bytes, tuple[bytes, bytes]] = {}
    for path in sorted(files, key=lambda p: (places[p] != p, p)):
        rel = places[path]
        if rel in claimed:
            aside[path] = (rel, claimed[rel])
        else:
            claimed[rel] = path
    return aside


def _sides(backup: Backup, files: dict[bytes, Entry], remap: Remapper,
           opts: RestoreOptions) -> dict[bytes, bytes]:
    """The files of sessions that exist here and did not come from the backup's machine
    (the backup is not this machine's own), and the siblings of those that did (a
    sibling is the session's state at the transcript's end: it goes in only with the
    transcript's lines): file → its session's transcript."""
    if backup.machine == opts.local_machine:
        return {}
    root = os.fsencode(opts.target)
    here: dict[str, Session] = {}
    kin: dict[str, Session] = {}  # came from that machine: only their siblings wait
    for s in backup.sessions.values():
        if s.path not in files or not os.path.lexists(
                os.path.join(root, _target_rel(s.path, remap))):
            continue
        rec = opts.origin_of(s.session_id) if opts.origin_of is not None else None
        (here if rec is None or rec.machine != backup.machine else kin)[s.session_id] = s
    if not here and not kin:
        return {}
    # One pass over the files: each is looked for among the sessions its path names.
    theirs = {sid: _session_files([s]) for sid, s in (here | kin).items()}
    out: dict[bytes, bytes] = {}
    for p in files:
        sid = _session_named(p) or ""
        owner = here.get(sid) or (kin.get(sid) if is_sibling(p) else None)
        if owner is not None and p != owner.path and theirs[owner.session_id](p):
            out[p] = owner.path
    return out


def _session_named(path: bytes) -> str | None:
    """The session a stored path may belong to, by ``_session_files``' rules: under
    projects/, as ``sibling.owner_of`` says; a todo's name (an id and "-"), a folder of
    file-history/ or tasks/ (session ids are UUIDs: 36 characters)."""
    parts = path.split(b"/")
    if parts[0] == b"todos" and len(parts) == 2:
        return parts[1][:36].decode("ascii", "replace")
    if parts[0] in (b"file-history", b"tasks") and len(parts) > 2:
        return parts[1].decode("ascii", "replace")
    return owner_of(path)


def _bases(files: dict[bytes, Entry], remap: Remapper, opts: RestoreOptions,
           base: Callable[[bytes, bytes], tuple[int, int, int] | None],
           aside: dict[bytes, tuple[bytes, bytes]], tails: dict[bytes, tuple[int, int]],
           sinks: dict[bytes, RestoreReport]) -> None:
    """The files whose local copy ``base`` vouches for: skipped, unfetched, when the backup
    holds no more of them (taken out of ``files``, told in ``sinks``); a transcript whose
    copy ends a line is fetched from there on (``tails``)."""
    for path in sorted(files):
        f = files[path]
        if f.sparse or path in aside or is_user_config(os.fsdecode(path)):
            continue
        rel = _target_rel(path, remap)
        known = base(path, rel)
        if known is None or known[0] != f.gen or not 0 < known[1] <= f.size or known[2] <= 0:
            continue
        if known[1] == f.size:
            del files[path]
            # Its size: the bytes vouched for (a line written here since is not).
            sinks[path] = RestoreReport(actions=[Action(
                "skip", os.fsdecode(rel), os.fsdecode(path), "as the last import left it",
                known[2])])
        elif _kind(path) == "transcript" and _ends_line(
                os.path.join(os.fsencode(opts.target), rel), known[2]):
            tails[path] = (known[1], known[2])


def _ends_line(path: bytes, size: int) -> bool:
    """Whether byte ``size`` - 1 of the file ``path`` ends a line (lines after it can then
    be remapped alone)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return os.pread(fd, 1, size - 1) == b"\n"
    except OSError:
        return False
    finally:
        os.close(fd)

"""Purge: ``forget`` and ``redact`` on this machine's tree, its state and search index,
and the backups of the machines named (``archive.rewrite``).

This machine's own backup is rewritten beside its daemon (as ``syncd compact`` is: the
compaction lock, the state's confirmed seq), after the state says what goes, so the
daemon ships none of it again. Another machine's backup is rewritten only while its
lease is free: its writer would otherwise compact and head it meanwhile (it learns of a
forget through this machine's tombstone when it follows this machine).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import signal
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from syncd import mask
from syncd.archive.compact import CompactOptions
from syncd.archive.options import compact_options
from syncd.archive.rewrite import Rewrite, RewriteReport, rewrite
from syncd.backup.marks import marks_of
from syncd.backup.ship import check_hash
from syncd.backup.state import State
from syncd.claude import Selection
from syncd.config import Settings
from syncd.errors import LeaseHeld, PreconditionFailed
from syncd.follow.quiet import Quiet
from syncd.repository import Repository
from syncd.sessionfiles import HISTORY, session_owning

# A file is masked in place only when it has been quiet this long (as follow imports).
QUIET = 10.0


@dataclass
class LocalReport:
    deleted: list[str] = field(default_factory=list)
    masked: dict[str, int] = field(default_factory=dict)  # file: ranges
    left_alone: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"deleted": self.deleted, "masked": self.masked, "left_alone": self.left_alone}


def _files(settings: Settings) -> Iterator[tuple[bytes, Path]]:
    """The files of the tree that are backed up (the include set, never the never-list):
    the only ones a forget or redact changes here."""
    sel = Selection(settings.include, settings.exclude)
    base = os.fsencode(settings.source)
    for dirpath, dirs, names in os.walk(base):
        rel_dir = os.path.relpath(dirpath, base)
        dirs[:] = sorted(d for d in dirs if sel.may_descend(
            os.fsdecode(os.path.normpath(os.path.join(rel_dir, d)))))
        for n in sorted(names):
            full = os.path.join(dirpath, n)
            rel = os.path.relpath(full, base)
            if os.path.islink(full) or not sel.wants(os.fsdecode(rel)):
                continue
            yield rel, Path(os.fsdecode(full))


def local_plan(settings: Settings, spec: Rewrite
               ) -> tuple[list[bytes], dict[bytes, list[mask.Range]], list[str]]:
    """The local files of the forgotten sessions, the ranges to mask in the others, and
    the values found and left alone (a signed block: say so)."""
    drop: list[bytes] = []
    ranges: dict[bytes, list[mask.Range]] = {}
    left: list[str] = []
    for rel, full in _files(settings):
        if spec.drops(rel):
            drop.append(rel)
            continue
        got: list[mask.Range] = []
        try:
            if rel == HISTORY and spec.forget:
                got += mask.history_ranges(_read(full), spec.forget)
            if spec.masking:
                values = spec.values_in(functools.partial(_read, full), rel)
                found_ranges, found = mask.value_places(_read(full), values, spec.patterns)
                got += found_ranges
                left += [f"{os.fsdecode(rel)} line {f.line_no}: {f.why}" for f in found
                         if f.why is not None]
        except OSError:
            continue
        if got:
            ranges[rel] = sorted(got, key=lambda r: r.start)
    return drop, ranges, left


def _read(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            yield chunk


# The state's record of the files a forget or redact masked here: (size, mtime_ns) as it
# left each, so that its own write is not taken for Claude's by the next one.
_OURS = "purge_writes"
_OURS_MAX = 1000


def _ours(settings: Settings) -> dict[str, list[int]]:
    if not settings.state_file.exists():
        return {}
    state = State(settings.state_file, readonly=True)
    try:
        got = json.loads(state.meta(_OURS) or "{}")
    except (sqlite3.Error, ValueError):
        return {}
    finally:
        state.close()
    return got if isinstance(got, dict) else {}


def busy(settings: Settings, rels: list[bytes]) -> list[str]:
    """Why some of ``rels`` may not be changed now (written lately, or held open; a file
    exactly as a forget or redact here left it was not written by anyone since)."""
    ours = _ours(settings)
    quiet = Quiet(settings.source, QUIET, ours=lambda rel, st: ours.get(rel.hex()) ==
                  [st.st_size, st.st_mtime_ns])
    out = []
    base = os.fsencode(settings.source)
    for rel in rels:
        try:
            st = os.stat(os.path.join(base, rel))
        except OSError:
            continue
        why = quiet(rel, st)
        if why is not None:
            out.append(f"{os.fsdecode(rel)}: {why.split(':')[0]}")
    return out


def apply_local(settings: Settings, drop: list[bytes], ranges: dict[bytes, list[mask.Range]],
                delete: bool, rep: LocalReport) -> None:
    """Mask the ranges in place (same length: the shipper's records stay true, updated
    here), and delete the dropped files when told to (``--local``)."""
    base = os.fsencode(settings.source)
    state = State(settings.state_file) if settings.state_file.exists() else None
    wrote: dict[str, list[int]] = {}
    try:
        for rel, rs in sorted(ranges.items()):
            full = os.path.join(base, rel)
            try:
                fd = os.open(full, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError as e:
                rep.left_alone.append(f"{os.fsdecode(rel)}: {e.strerror}")
                continue
            try:
                # What was read is still there (not replaced or rewritten since), every
                # range of it, or the file is left as it is.
                if any(hashlib.sha256(os.pread(fd, r.end - r.start, r.start)).hexdigest()
                       != r.digest for r in rs):
                    rep.left_alone.append(f"{os.fsdecode(rel)}: changed since it was read; "
                                          "run this again")
                    continue
                for r in rs:
                    os.pwrite(fd, r.fill(), r.start)
                os.fsync(fd)
                if state is not None:
                    row = state.get(rel)
                    if row is not None and row.offset <= os.fstat(fd).st_size:
                        state.rewrote(rel, check_hash(fd, row.offset),
                                      marks_of(fd, row.offset) if row.offset else None,
                                      os.fstat(fd).st_mtime_ns)
                    st = os.fstat(fd)
                    wrote[rel.hex()] = [st.st_size, st.st_mtime_ns]
            finally:
                os.close(fd)
            rep.masked[os.fsdecode(rel)] = len(rs)
        if delete:
            for rel in drop:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(base, rel))
                rep.deleted.append(os.fsdecode(rel))
            _prune_dirs(base, drop)
        if state is not None and wrote:
            try:
                known = json.loads(state.meta(_OURS) or "{}")
            except ValueError:
                known = {}
            known = {**(known if isinstance(known, dict) else {}), **wrote}
            state.set_meta(**{_OURS: json.dumps(dict(list(known.items())[-_OURS_MAX:]))})
    finally:
        if state is not None:
            state.close()


def _prune_dirs(base: bytes, rels: list[bytes]) -> None:
    """The session's own folders left empty (``<sid>/``, file-history/<sid>, …)."""
    dirs = sorted({os.path.dirname(r) for r in rels}, key=len, reverse=True)
    for d in dirs:
        while d and session_owning(d + b"/x") is not None:
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(base, d))
            if os.path.basename(d) == b"projects" or d.count(b"/") < 1:
                break
            d = os.path.dirname(d)


def mark_forgotten(settings: Settings, sids: frozenset[str]) -> None:
    """The state says these sessions go: the daemon ships none of their files from now
    on, and their tombstone with its next flush."""
    state = State(settings.state_file)
    try:
        state.forget_sessions(sorted(sids))
    finally:
        state.close()


def wake_daemon(settings: Settings) -> None:
    """Tell this tree's running daemon to look now (SIGHUP: it re-reads its config and
    runs its loop), so a forget's tombstone ships at once, not at its next wake."""
    from syncd.security.lock import ProcessLock
    pid = ProcessLock(settings.state_file.with_suffix(".lock")).holder()
    if pid is not None and pid > 0 and pid != os.getpid():  # (-1: unknown; never a group)
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGHUP)


def drop_state(settings: Settings, spec: Rewrite) -> None:
    """What the state says was shipped of the forgotten files (their backup holds none
    now), and the catalog's masked text."""
    if not settings.state_file.exists():
        return
    state = State(settings.state_file)
    try:
        if spec.forget:
            state.drop_files([f.path for f in state.files() if spec.drops(f.path)])
        if spec.masking:
            state.rewrite_catalog(lambda f: {k: mask.mask_text(v, spec.redact, spec.patterns)
                                             for k, v in f.items()})
    finally:
        state.close()


def purge_search(settings: Settings, spec: Rewrite, masked: list[bytes]) -> None:
    """The search index forgets the sessions and the masked files' text (they are read
    again), then is compacted so no page of the file keeps it; the secrets findings of
    them go too."""
    path = settings.state_dir / "search.db"
    if path.exists():
        from syncd.search.index import SearchIndex
        with SearchIndex.open(path) as ix:
            for sid in sorted(spec.forget):
                ix.drop_session(sid)
            for rel in masked:
                ix.drop_file(rel)
            ix.commit()
            ix.purge()
    found = settings.state_dir / "secrets.db"
    if found.exists():  # its findings of those files go too (scanned again, from 0)
        from syncd.secrets.findings import Findings
        with Findings.open(found) as f:
            for sid in sorted(spec.forget):
                f.drop_session(sid)
            for rel in masked:
                f.drop_file(rel)
            f.commit()


def purge_machine(settings: Settings, repo: Repository, spec: Rewrite, *,
                  dry_run: bool) -> RewriteReport:
    """Rewrite one machine's backup (its head too); another machine's under its lease."""
    own = repo.machine == settings.machine_id
    if own:
        if not dry_run:
            _head_now(settings)
        opts = compact_options(settings, dry_run=dry_run)
        return rewrite(repo, spec, opts, retire_dictionary=lambda d: _retire(settings, d))
    opts = CompactOptions(level=settings.compact_level, pack_target=settings.pack_target_bytes,
                          dry_run=dry_run, spool_dir=settings.state_dir,
                          lock=settings.state_dir / f"compact-{repo.machine}.lock")
    if dry_run:
        return rewrite(repo, spec, opts)
    from syncd.security.lease import Lease
    lease = Lease(repo.store, repo.machine, owner=os.urandom(16).hex(),
                  ttl=settings.lease_ttl)
    try:
        lease.acquire()
        lease.start()
    except LeaseHeld as e:
        # (the lease's own advice, --takeover, is no option of forget or redact)
        who = str(e).split("; stop that syncd", 1)[0]
        raise PreconditionFailed(f"{who}: not rewriting its backup while its daemon runs; "
                                 "stop its daemon and run this again, or run it on that "
                                 "machine") from e
    try:
        return rewrite(repo, spec, opts)
    finally:
        lease.release()


def _head_now(settings: Settings) -> None:
    """This machine's head made current when it lags the state (`syncd sync` writes it
    only every head_interval, a daemon on its schedule): the fold takes no segment past
    the head, so what the last flushes shipped would stay in them. Written here with no
    daemon running, asked of the daemon otherwise."""
    from syncd.backup.engine import Engine
    from syncd.errors import SyncdError
    from syncd.security.lock import ProcessLock

    if not settings.state_file.exists() or not settings.source.is_dir():
        return
    if ProcessLock(settings.state_file.with_suffix(".lock")).holder() is not None:
        _head_from_daemon(settings)
        return
    try:
        engine = Engine(settings)
    except (SyncdError, OSError):
        return  # the rewrite says what it could not fold
    try:
        engine.head.write_if_due(now=True)
    finally:
        engine.close()


def _head_from_daemon(settings: Settings, wait: float = 30.0) -> None:
    """The running daemon asked for its head now (SIGHUP), and waited for (at most
    ``wait`` seconds), as its state records the head it wrote (no request to the store):
    the rewrite then folds every flush it confirmed."""
    def seqs() -> tuple[int, int]:
        state = State(settings.state_file, readonly=True)
        try:
            return (int(state.meta("last_flush_seq", "-1") or -1),
                    int(state.meta("head_seq", "-1") or -1))
        finally:
            state.close()

    want, _ = seqs()
    wake_daemon(settings)
    deadline = time.monotonic() + wait
    while seqs()[1] < want and time.monotonic() < deadline:
        time.sleep(0.1)  # (a local read; bounded by ``wait``)


def _retire(settings: Settings, dict_id: str) -> None:
    """The shipper stops compressing with ``dict_id`` (it learnt from what goes); the next
    compaction trains another, from the files that stay."""
    if not settings.state_file.exists():
        return
    state = State(settings.state_file)
    try:
        if state.meta("dict_id") == dict_id:
            state.set_meta(dict_id="", dict_data="", dict_tried="")
    finally:
        state.close()


def forget_here(settings: Settings, repo: Repository, sids: frozenset[str],
                opts: CompactOptions) -> tuple[RewriteReport, bool]:
    """What the daemon does for sessions a followed machine's tombstone forgot here (the
    follower removed the copies it imported): this tree's history lines of them masked
    (once quiet: else False, to be tried again), the state's rows and search text
    dropped, this machine's backup rewritten without them."""
    from syncd.archive import purge as purges
    spec = Rewrite(forget=sids)
    _, ranges, _ = local_plan(settings, spec)
    whole = not busy(settings, list(ranges))
    if whole:
        apply_local(settings, [], ranges, False, LocalReport())
    drop_state(settings, spec)
    purge_search(settings, spec, list(ranges))
    return purges.purge(repo, sids, opts), whole


def redact_here(settings: Settings, repo: Repository, sid: str,
                digests: frozenset[tuple[str, int]], opts: CompactOptions
                ) -> tuple[RewriteReport | None, bool]:
    """What the daemon does for values a followed machine redacted in session ``sid``
    (known here by sha256 and length only): found in that session's files here, masked
    once they are quiet (else None, False: to be tried again), the state's catalog and
    search text of them masked, and this machine's backup rewritten with them masked.
    A value not found here is nothing to do."""
    spec = Rewrite(digests=digests, within=frozenset({sid}))
    _, ranges, _ = local_plan(settings, spec)
    if busy(settings, list(ranges)):
        return None, False
    # The values themselves, read here (never told): what the catalog's text is masked of.
    values: set[bytes] = set()
    base = os.fsencode(settings.source)
    for rel, rs in ranges.items():
        with contextlib.suppress(OSError), open(os.path.join(base, rel), "rb") as f:
            for r in rs:
                f.seek(r.start)
                values.add(f.read(r.end - r.start))
    rep = LocalReport()
    apply_local(settings, [], ranges, False, rep)
    if rep.left_alone:  # changed since it was read: looked at again later
        return None, False
    if values and settings.state_file.exists():
        # The catalog's text of this session only: another's may hold the same value.
        state = State(settings.state_file)
        try:
            masked = tuple(sorted(values))
            state.rewrite_catalog(lambda f: {k: mask.mask_text(v, masked, ())
                                             for k, v in f.items()},
                                  only=lambda path: session_owning(path) == sid)
        finally:
            state.close()
    purge_search(settings, spec, list(ranges))
    return rewrite(repo, spec, opts, retire_dictionary=lambda d: _retire(settings, d)), True


__all__ = ["LocalReport", "apply_local", "busy", "drop_state", "forget_here", "local_plan",
           "mark_forgotten", "purge_machine", "purge_search", "redact_here", "wake_daemon"]

"""Commands that read the store: machines, sessions, snapshots, restore, resume."""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from syncd.claude import resume_line
from syncd.cli.table import Column, Table, short_ids, wide_option
from syncd.cli.util import (
    chosen_source,
    echo_json,
    echo_json_rows,
    repository_of,
    session_ids,
    session_prefix,
    settings_of,
    source_option,
    time_option,
)
from syncd.errors import OnSeveralMachines, RestoreError, StateError
from syncd.progress import meter
from syncd.redact import redact
from syncd.restore.sessionref import MIN_PREFIX
from syncd.untrusted import printable

if TYPE_CHECKING:
    from syncd.config import Settings
    from syncd.format.catalog import Session
    from syncd.restore.listing import Here
    from syncd.restore.restorer import RestoreReport

# What a command needs is imported inside it (see syncd.cli.main): its --help and bad
# usage load none of it.


def _when(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


def _count(n: int | None) -> str:
    return "-" if n is None else str(n)


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


# `machines` and `sessions` without --json: the first column marks this machine; paths and
# titles come last, so that awk's fields before them are the same in every row. On a
# narrow terminal the counts go first, then the host (a machine id is kept whole before
# them, up to 28 characters: it is what --machine takes); a session's size, then LOCAL.
MACHINE_COLUMNS = (
    Column(""), Column("MACHINE", cut="end", least=28), Column("HOST", cut="end", drop=2),
    Column("LAST BACKUP"), Column("SNAPSHOTS", right=True, drop=3),
    Column("DELTAS", right=True, drop=6), Column("PACKS", right=True, drop=5),
    Column("SEGMENTS", right=True, drop=4), Column("STORED", right=True, drop=1),
    Column("SESSIONS", right=True), Column("HOME", cut="path"))
SESSION_COLUMNS = (
    Column("SESSION", short=MIN_PREFIX), Column("LAST ACTIVITY"), Column("LOCAL", drop=1),
    Column("SIZE", right=True, drop=2), Column("MACHINE", cut="end"),
    Column("PROJECT", cut="path", least=12), Column("TITLE", cut="end", least=16))


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@wide_option
@click.pass_context
def machines(ctx: click.Context, as_json: bool, wide: bool) -> None:
    """The machines that have a backup in the store."""
    from syncd.restore.listing import machine_rows
    from syncd.seen import Seen

    settings = settings_of(ctx)
    repo = repository_of(settings)
    seen = Seen(settings.state_dir, repo.url)
    problems: list[str] = []
    rows = machine_rows(repo, seen, problems)
    mine = {t.machine_id for t in settings.trees()}  # this machine's trees, each marked
    if as_json:
        echo_json_rows(rows)  # row by row, as they come
    else:
        Table(MACHINE_COLUMNS, list(rows), lambda r: (
            "*" if r["machine"] in mine else "", _text(r["machine"]),
            _text(r.get("hostname")), _when(r.get("last_backup")), _count(r.get("snapshots")),
            _count(r.get("deltas")), _count(r.get("packs")), _count(r.get("segments")),
            _size(r["stored_bytes"]) if r.get("stored_bytes") is not None else "-",
            _count(r.get("sessions")), _text(r.get("home")))).echo(wide=wide)
    seen.save()
    _problems(problems)


@click.command()
@click.option("--machine", default=None, help="Only this machine's sessions.")
@click.option("--project", default=None, help="Only sessions of this project path (or below).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@wide_option
@source_option
@click.pass_context
def sessions(ctx: click.Context, machine: str | None, project: str | None,
             as_json: bool, wide: bool) -> None:
    """Every backed-up session: title, project, machine, size, last activity, local or not."""
    from syncd.restore.listing import session_rows
    from syncd.seen import Seen

    settings = settings_of(ctx)
    repo = repository_of(settings)
    seen = Seen(settings.state_dir, repo.url)
    problems: list[str] = []
    stream = session_rows(repo, _here(settings), machine, project, problems, seen)
    if as_json:
        echo_json_rows(stream)  # row by row: memory holds a few machines' catalogs
    else:
        rows = sorted(stream, key=lambda r: r["last_activity"] or "", reverse=True)
        Table(SESSION_COLUMNS, rows, lambda r: (
            _text(r["session_id"]), _text(r["last_activity"])[:16],
            r["here"], _size(r["size"]), _text(r["machine"]),
            _text(r["project"]), _text(r["title"] or ""))).echo(wide=wide)
    seen.save()
    _problems(problems)


POINT_COLUMNS = (
    Column("TIME (UTC)"), Column("KIND"), Column("SEQ", right=True),
    Column("ADDED", right=True, drop=1), Column("KEPT AS", cut="end"),
    Column("SESSIONS", cut="end"))


@click.command()
@click.option("--machine", default=None, help="Another machine's points (default: this one).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@wide_option
@source_option
@click.pass_context
def snapshots(ctx: click.Context, machine: str | None, as_json: bool, wide: bool) -> None:
    """The points in time a restore can reach, newest first: every flush within the
    retention window, then the compacted snapshots the policy keeps. `restore --at`
    takes any time printed here."""
    from syncd.archive.options import policy_of
    from syncd.archive.retention import retention_groups
    from syncd.duration import format_time
    from syncd.timeline import timeline

    settings = settings_of(ctx)
    repo = repository_of(settings, machine)
    points, problems = timeline(repo)
    groups = retention_groups(points, policy_of(settings))
    newest_first = list(reversed(points))
    if as_json:
        echo_json([{"time": p.time, "at": format_time(p.time), "seq": p.seq, "kind": p.kind,
                    "sessions": p.sessions, "bytes_added": p.added, "kept_as": groups[p.seq],
                    "object": p.key} for p in newest_first])
    else:
        # Each id as `restore --session` takes it: longer where two begin alike.
        shown = {s: s for p in newest_first for s in p.sessions} if wide else short_ids(
            [s for p in newest_first for s in p.sessions], MIN_PREFIX)
        Table(POINT_COLUMNS, newest_first, lambda p: (
            format_time(p.time), p.kind, str(p.seq), "-" if p.added is None else _size(p.added),
            groups[p.seq], " ".join(_text(shown[s]) for s in p.sessions[:6])
            + (f" +{len(p.sessions) - 6}" if len(p.sessions) > 6 else ""))).echo(wide=wide)
    _problems(problems)


def _text(value: object) -> str:
    """A store's string for a terminal: no control characters (escape sequences)."""
    return printable(str(value)) if value else "-"


def _text_line(line: str) -> str:
    """One line of a diff for a terminal: its text with no control characters."""
    body = line.rstrip("\n")
    return "".join(c if c.isprintable() or c == "\t" else "?" for c in body) + "\n"


def _meant(settings: Settings, ref: str, machines: list[str]) -> str | None:
    """Of ``machines`` holding the session ``ref`` names, the one a resume here means
    when this machine is one of them: the machine follow imported this machine's copy
    from, else this machine (its own session, which others imported). None: another's."""
    from syncd.backup.state import State
    from syncd.format.catalog import session_of
    from syncd.restore.sessionref import names

    own = [t.machine_id for t in settings.trees() if t.machine_id in machines]
    if not own:
        return None
    came: set[str] = set()
    if settings.state_file.exists():
        try:
            state = State(settings.state_file, readonly=True)
        except StateError:
            return own[0]
        try:
            came = {r.source for r in state.imports() if r.source in machines and
                    (sid := session_of(r.path)) is not None and names(ref, sid)}
        except StateError:
            pass
        finally:
            state.close()
    return came.pop() if len(came) == 1 else own[0]


def _followed_copy(settings: Settings, machine: str, copies: list[Session]) -> str | None:
    """The project path of this machine's copy of ``copies``' one session when follow
    imported it from ``machine`` at least as far as that machine lists it, and it is
    still here; None: restore it."""
    from syncd.backup.state import State
    from syncd.format.catalog import MetaScanner

    if len(copies) != 1 or not ({"*", machine} & set(settings.follow)) or \
            not settings.state_file.exists():
        return None
    s = copies[0]
    try:
        state = State(settings.state_file, readonly=True)
    except StateError:
        return None
    try:
        recs = [r for r in state.imports() if r.source == machine and r.src_path == s.path]
    except StateError:
        return None
    finally:
        state.close()
    if len(recs) != 1 or recs[0].src_gen != s.gen or recs[0].src_size < s.size:
        return None
    local = settings.source / os.fsdecode(recs[0].path)
    try:
        if local.is_symlink() or local.stat().st_size < recs[0].size:
            return None
        with open(local, "rb") as fh:
            scanner = MetaScanner(at_line_start=True)
            scanner.feed(fh.read(READ_FOR_CWD))
    except OSError:
        return None
    return scanner.finish().get("cwd")


# Bytes of a local transcript read for its first ``cwd`` (the first lines carry it).
READ_FOR_CWD = 256 << 10


def imported_copies(settings: Settings) -> dict[tuple[str, bytes], tuple[int, int]]:
    """What follow imported here: (machine, its path) → (generation, size) of its copy."""
    from syncd.backup.state import State

    if not settings.state_file.exists():
        return {}
    try:
        state = State(settings.state_file, readonly=True)
    except StateError:
        return {}
    try:
        return {(r.source, r.src_path): (r.src_gen, r.src_size) for r in state.imports()}
    except StateError:
        return {}
    finally:
        state.close()


def _problems(lines: list[str]) -> None:
    """One stderr line per object that could not be read; exit 1 when there was any."""
    for line in lines:
        click.echo(redact(f"syncd: {_text(line)}"), err=True)
    if lines:
        sys.exit(1)


def _waiting(report: RestoreReport) -> None:
    """Exit 1, saying why, when a local file was left alone (being written here)."""
    left = [a for a in report.actions if a.action == "wait"]
    if left:
        click.echo(f"syncd: {len(left)} local file{'s are' if len(left) > 1 else ' is'} "
                   "being written here (a running Claude?) and left as "
                   f"{'they are' if len(left) > 1 else 'it is'}: run it again once quiet",
                   err=True)
        sys.exit(1)


def _report(report: RestoreReport, as_json: bool, dry_run: bool) -> None:
    if as_json:
        echo_json({"machine": report.machine, "dry_run": dry_run,
                    "actions": [dataclasses.asdict(a) for a in report.actions],
                    "rules": [dataclasses.asdict(r) for r in report.rules],
                    "sessions": report.sessions, "errors": report.errors,
                    "notes": report.notes})
    else:
        for r in report.rules:
            click.echo(f"map  {_text(r.old)} -> {_text(r.new)}  ({_text(r.why)})")
        for a in report.actions:
            if dry_run or a.action not in ("create", "skip"):
                extra = f"  [backup copy: {_text(a.conflict_copy)}]" if a.conflict_copy else ""
                if a.previous_copy:
                    extra += f"  [local kept: {_text(a.previous_copy)}]"
                click.echo(f"{a.action:<12} {_text(a.path)}  ({_text(a.reason)}){extra}")
                if a.diff:
                    click.echo(redact("".join(_text_line(d) for d in
                                              a.diff.splitlines(keepends=True))), nl=False)
        counts: dict[str, int] = {}
        for a in report.actions:
            counts[a.action] = counts.get(a.action, 0) + 1
        verb = "would restore" if dry_run else "restored"
        summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "nothing"
        # The summary and the exit code agree: any problem below means exit 1.
        incomplete = (f"; incomplete: {len(report.errors)} problem"
                      f"{'s' if len(report.errors) > 1 else ''} (below)") if report.errors else ""
        click.echo(f"{verb} from {report.machine}: {summary} "
                   f"({report.bytes_written} bytes written){incomplete}")
    for line in report.notes:
        click.echo(redact(f"syncd: note: {_text(line)}"), err=True)
    for line in report.errors:
        click.echo(redact(f"syncd: {_text(line)}"), err=True)


@click.command("restore")
@click.option("--machine", default=None,
              help="Machine whose backup to restore (default: this one).")
@click.option("--session", "sessions_", multiple=True, callback=session_ids,
              metavar="ID", help="Only this session (repeatable): its id or its first 8 "
                                 "characters or more, as `sessions` shows it.")
@click.option("--project", "projects", multiple=True,
              help="Only this project's sessions (repeatable).")
@click.option("--at", default=None, callback=time_option,
              help="As of this time: ISO 8601 or a duration ago (2h, 3d).")
@click.option("--map", "maps", multiple=True, metavar="OLD=NEW",
              help="Map a path prefix (repeatable; longest first).")
@click.option("--worktrees", type=click.Choice(["map", "fold"]), default="map",
              help="map: worktree sessions go to the equivalent worktree; fold: into the "
                   "main checkout's folder.")
@click.option("--to", "target", type=click.Path(path_type=Path), default=None,
              help="Target directory (default: the local Claude tree).")
@click.option("--config", "config", is_flag=True,
              help="Also restore your config (CLAUDE.md, settings.json, keybindings.json, "
                   "agents/, commands/, skills/, rules/, output-styles/, hooks/, status line "
                   "scripts, plugin lists), paths remapped; a local file that differs is "
                   "kept beside it (.before-restore-<time>). With --dry-run: a diff per file.")
@click.option("--with-instructions", "instructions", is_flag=True,
              help="Also write other files Claude follows as instructions or runs as code "
                   "(another machine's project memory, settings or CLAUDE.md inside a "
                   "project folder, included files under plugins/): only from a store you "
                   "trust.")
@click.option("--dry-run", is_flag=True, help="Print the plan; write nothing.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@source_option
@click.pass_context
def restore_cmd(ctx: click.Context, machine: str | None, sessions_: tuple[str, ...],
                projects: tuple[str, ...], at: float | None, maps: tuple[str, ...],
                worktrees: str, target: Path | None, config: bool, instructions: bool,
                dry_run: bool, as_json: bool) -> None:
    """Restore a machine's backup (or some sessions) into the local Claude tree.

    Paths are remapped to this machine (the source home to this home, plus --map and
    the config's [remap]); existing files are fast-forwarded, merged or kept, never
    replaced by an older or diverged copy (a config file, with --config, is replaced
    and the local one kept beside it).
    """
    from syncd.restore.listing import resolve_sessions
    from syncd.restore.restorer import restore
    from syncd.seen import Seen
    from syncd.service.localrestore import provenance, restore_options

    settings = settings_of(ctx)
    opts = restore_options(settings, target=target, sessions=sessions_, projects=projects, at=at,
                    maps=maps, worktrees=worktrees, dry_run=dry_run)
    opts.config, opts.instructions = config, instructions
    repo = repository_of(settings, machine)
    opts.seen = Seen(settings.state_dir, repo.url)
    notes: list[str] = []
    # A prefix (as `sessions` shows ids) becomes the one id it names, before the restore.
    opts.sessions = resolve_sessions(repo, sessions_, notes, opts.seen, at)
    with meter("restoring") as m, provenance(settings, opts, notes):
        opts.progress = m
        report = restore(repo, opts)
    report.notes += notes
    opts.seen.save()
    _report(report, as_json, dry_run)
    if report.errors:
        sys.exit(1)
    _waiting(report)


@click.command()
@click.argument("session_id", callback=session_prefix)
@click.option("--machine", default=None, help="The machine to take it from, when several have it.")
@click.option("--map", "maps", multiple=True, metavar="OLD=NEW", help="Map a path prefix.")
@click.option("--worktrees", type=click.Choice(["map", "fold"]), default="map",
              help="map: a worktree session goes to the equivalent worktree; fold: into "
                   "the main checkout's folder.")
@source_option
@click.pass_context
def resume(ctx: click.Context, session_id: str, machine: str | None, maps: tuple[str, ...],
           worktrees: str) -> None:
    """Restore one session from any machine's backup and print how to resume it."""
    from syncd.restore.listing import locate_session
    from syncd.restore.restorer import restore
    from syncd.seen import Seen
    from syncd.service.localrestore import provenance, restore_options

    settings = settings_of(ctx)
    repo = repository_of(settings)
    seen = Seen(settings.state_dir, repo.url)
    problems: list[str] = []
    try:
        try:
            where, copies = locate_session(repo, session_id, machine, problems, seen)
        except OnSeveralMachines as e:
            # This machine backs up what follow imported: that copy is the followed
            # machine's session, and this machine's own sessions are its own.
            pick = _meant(settings, session_id, e.machines)
            if pick is None:
                raise
            where, copies = locate_session(repo, session_id, pick, problems, seen)
    finally:
        seen.save()
        for line in problems:  # a machine that cannot be read may hold the session too
            click.echo(redact(f"syncd: skipped: {_text(line)}"), err=True)
    sid = copies[0].session_id
    if chosen_source(ctx) is None and settings.sources:
        # With several trees, a session of one of this machine's trees (or of another
        # machine's tree of that name) goes back into that tree.
        settings = settings.for_source(tree_of(settings, where))
    # Asked to go somewhere (--map): restored there, even when follow keeps it here.
    here_cwd = None if maps else _followed_copy(settings, where, copies)
    if here_cwd is not None:
        # Follow keeps it here, as current as that machine's head: nothing to fetch.
        click.echo(f"syncd: {sid} is here already, imported from {where} by follow",
                   err=True)
        click.echo(resume_line(here_cwd, sid, settings.source, _config_dir(settings)))
        return
    opts = restore_options(settings, target=None, sessions=(sid,), projects=(),
                    at=None, maps=maps, worktrees=worktrees, dry_run=False)
    notes: list[str] = []
    with provenance(settings, opts, notes):
        report = restore(repo.for_machine(where), opts)
    report.notes += notes
    _report(report, False, False)
    if report.errors:
        sys.exit(1)
    _waiting(report)
    cwd = report.sessions.get(sid)
    if cwd is None:
        raise RestoreError(f"session {sid} has no recorded project path")
    line = resume_line(cwd, sid, settings.source, _config_dir(settings))
    if not Path(cwd).is_dir():
        click.echo(f"syncd: note: {cwd} does not exist on this machine; create or clone it "
                   "there, or pass --map OLD=NEW", err=True)
    click.echo(line)


def _here(settings: Settings) -> Here:
    """What this machine has of the store's sessions: in its tree, or in any of its trees
    when there are several (a session is here in whichever holds it)."""
    from syncd.restore.listing import Here, here

    if not settings.sources:
        return here(settings.source, imported_copies(settings))
    ids: set[str] = set()
    imported: dict[tuple[str, bytes], tuple[int, int]] = {}
    for t in settings.trees():
        one = settings.for_source(t.name)
        h = here(one.source, imported_copies(one))
        ids |= h.ids
        imported.update(h.imported)
    return Here(ids, imported)


def tree_of(settings: Settings, machine: str) -> str:
    """The tree a machine's sessions belong in: the one of that machine id, else the one
    whose name ends it (``<id>--<name>``), else the default."""
    from syncd.config import DEFAULT_SOURCE, SOURCE_JOIN

    trees = settings.trees()
    for t in trees:
        if t.machine_id == machine:
            return t.name
    for t in trees[1:]:
        if machine.endswith(SOURCE_JOIN + t.name):
            return t.name
    return DEFAULT_SOURCE


def _config_dir(settings: Settings) -> Path | None:
    """The CLAUDE_CONFIG_DIR Claude must be given to see a tree other than the default."""
    from syncd.config import DEFAULT_SOURCE

    return None if settings.tree == DEFAULT_SOURCE else settings.source


COMMANDS = (machines, sessions, snapshots, restore_cmd, resume)

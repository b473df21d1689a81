"""Commands that take things out of every backup: forget, redact."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import click

from syncd.cli.util import echo_json, repository_of, session_prefix, settings_of, source_option
from syncd.errors import BackupError, RewriteRefused, UsageError

if TYPE_CHECKING:
    from syncd.archive.rewrite import Rewrite, RewriteReport
    from syncd.config import Settings
    from syncd.mask import Range
    from syncd.service.purge import LocalReport

# What a command needs is imported inside it (see syncd.cli.main).
PATTERN_MAX = 1000
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _machines(settings: Settings, named: tuple[str, ...], every: bool) -> list[str]:
    if every:
        return repository_of(settings).machines()
    return list(dict.fromkeys(named or (settings.machine_id,)))


def _summary(r: RewriteReport) -> str:
    if r.note and not r.rewritten:
        return f"{r.machine}: {r.note}"
    verb = "would rewrite" if r.dry_run else "rewrote"
    out = (f"{r.machine}: {verb} {len(r.rewritten)} objects ({len(r.files_dropped)} files "
           f"dropped, {r.ranges_masked} ranges masked)")
    if not r.dry_run:
        out += (f"; wrote {len(r.written)} ({r.bytes_written / 1e6:.2f} MB), deleted "
                f"{len(r.deleted)} ({r.bytes_deleted / 1e6:.2f} MB)")
    return out


def _run(ctx: click.Context, spec: Rewrite, machines: list[str], *, dry_run: bool,
         local: bool, as_json: bool) -> None:
    from syncd.errors import CompactError, PreconditionFailed
    from syncd.service import purge

    settings = settings_of(ctx)
    drop, ranges, left = purge.local_plan(settings, spec)
    if not dry_run:
        busy = purge.busy(settings, [*ranges, *(drop if local else [])])
        if busy:
            raise RewriteRefused("not now, these files are being written: "
                                 + "; ".join(busy[:5])
                                 + " (try again once Claude is done with them)")
    lrep = purge.LocalReport(left_alone=left)
    if not dry_run:
        if spec.forget:
            purge.mark_forgotten(settings, spec.forget)
            purge.wake_daemon(settings)
        purge.apply_local(settings, drop, ranges, local, lrep)
        purge.drop_state(settings, spec)
        purge.purge_search(settings, spec, list(ranges))
    else:
        lrep.masked = {k.decode(errors="replace"): len(v) for k, v in ranges.items()}
        lrep.deleted = [d.decode(errors="replace") for d in drop] if local else []
    reports: list[RewriteReport] = []
    failed: list[str] = []
    for m in machines:
        try:
            reports.append(purge.purge_machine(settings, repository_of(settings, m), spec,
                                               dry_run=dry_run))
        except (CompactError, PreconditionFailed) as e:
            failed.append(f"{m}: {e}")
    if spec.masking and not dry_run:
        _announce(settings, ranges, lrep, [r for r in reports
                                           if r.machine == settings.machine_id])
    if as_json:
        doc: dict[str, Any] = {"local": lrep.as_dict(), "machines":
                               [r.as_dict() for r in reports], "failed": failed}
        echo_json(doc)
    else:
        verb = "would " if dry_run else ""
        from syncd.untrusted import printable
        if lrep.masked:
            click.echo(f"here: {verb}mask {sum(lrep.masked.values())} ranges in "
                       f"{len(lrep.masked)} files")
            if dry_run:  # which, as the --json says
                for rel, n in sorted(lrep.masked.items()):
                    click.echo(f"    {printable(rel)}: {n}")
        if lrep.deleted:
            click.echo(f"here: {verb}delete {len(lrep.deleted)} files")
        for r in reports:
            click.echo(_summary(r))
            if dry_run:
                for rel in r.files_dropped:
                    click.echo(f"    {printable(rel)}: dropped")
            for w in r.errors:
                click.echo(f"warning: {w}", err=True)
        left = sorted(set(lrep.left_alone + [x for r in reports for x in r.left_alone]))
        for line in left:
            click.echo(f"left alone: {line}", err=True)
        signed = sorted({m.group(0) for line in left if "(signed)" in line
                         for m in _UUID.finditer(line)})
        for sid in signed:
            click.echo(f"a signed block of session {sid} holds it: only `syncd forget "
                       f"--session {sid}` removes it", err=True)
        for f in failed:
            click.echo(f"not reached: {f}", err=True)
    if failed or any(r.errors for r in reports):
        ctx.exit(1)


@click.command("forget", short_help="Take a session out of every point of the backups.")
@click.option("--session", "session", required=False, callback=lambda ctx, param, v:
              None if v is None else session_prefix(ctx, param, v),
              help="The session (its id, or its first 8 characters or more).")
@click.option("--machine", "machines", multiple=True, help="Whose backup (default: this one).")
@click.option("--all-machines", is_flag=True, help="Every machine's backup in the store.")
@click.option("--local", is_flag=True, help="Also delete the session's files here.")
@click.option("--lift", is_flag=True, help="Ship the session's local files again.")
@click.option("--dry-run", is_flag=True, help="Say what would go; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@source_option
@click.pass_context
def forget_cmd(ctx: click.Context, session: str | None, machines: tuple[str, ...],
               all_machines: bool, local: bool, lift: bool, dry_run: bool,
               as_json: bool) -> None:
    """Take a session (transcript, subagents, tool results, siblings, todos, file
    history, its history.jsonl lines) out of every point in time of the machines'
    backups, newest included; every other file restores as before.

    Here, the session is marked forgotten: the daemon never ships it again (and tells the
    machines that follow this one) until --lift; --local also deletes its files. Its
    history.jsonl lines become spaces of the same length. Exit 0 done, 1 when a
    machine could not be rewritten (named; the others are done), 2 bad input.
    """
    from syncd.archive.rewrite import Rewrite
    from syncd.backup.state import State
    from syncd.format.catalog import is_session_id

    if session is None:
        raise UsageError("forget: --session ID is required (its id, or its first 8 "
                         "characters or more, as in `syncd sessions`)")
    settings = settings_of(ctx)
    sid = session.lower()
    if lift:
        # A forgotten session is in no backup any more: its id is found among the
        # sessions forgotten here.
        state = State(settings.state_file)
        try:
            forgotten = sorted(state.forgotten())
            hits = [s for s in forgotten if s.startswith(sid)]
            if len(hits) != 1:
                raise BackupError(
                    f"forget --lift: session {sid} is not forgotten here"
                    + (f" (forgotten: {', '.join(s[:8] for s in forgotten)})"
                       if forgotten and not hits else "")
                    + (f" ({len(hits)} forgotten sessions begin so: give more of it)"
                       if hits else ""))
            sid = hits[0]
            state.lift_forgotten([sid])
        finally:
            state.close()
        click.echo(f"{sid}: lifted; its files here are shipped again with the next flush")
        return
    if not is_session_id(sid):
        sid = _resolve(settings, sid, machines[0] if machines else None)
    _run(ctx, Rewrite(forget=frozenset({sid})),
         _machines(settings, machines, all_machines), dry_run=dry_run, local=local,
         as_json=as_json)


@click.command("redact", short_help="Mask a value in the files here and every backup.")
@click.argument("pattern", required=False)
@click.option("--finding", default=None, help="A finding of `syncd secrets` (its id).")
@click.option("--machine", "machines", multiple=True, help="Whose backup (default: this one).")
@click.option("--all-machines", is_flag=True, help="Every machine's backup in the store.")
@click.option("--dry-run", is_flag=True, help="Say what would be masked; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@source_option
@click.pass_context
def redact_cmd(ctx: click.Context, pattern: str | None, finding: str | None,
               machines: tuple[str, ...], all_machines: bool, dry_run: bool,
               as_json: bool) -> None:
    """Replace what PATTERN (a Python regular expression, matched against each line as
    the file holds it, JSON escapes included) or a finding matches by [REDACTED] of the
    same length, in the files here (once quiet) and in every point of the backups, as one
    operation: nothing ships again.

    Never inside thinking, signature or redacted-thinking data (the API would refuse to
    resume the session): such a match is reported; forget that session instead. Exit 0
    done, 1 when a machine could not be rewritten, 2 bad input.
    """
    from syncd.archive.rewrite import Rewrite

    settings = settings_of(ctx)
    if (pattern is None) == (finding is None):
        raise UsageError("give a PATTERN or --finding ID (one of them)")
    values: tuple[bytes, ...] = ()
    patterns: tuple[re.Pattern[bytes], ...] = ()
    if pattern is not None:
        if not pattern or len(pattern) > PATTERN_MAX:
            raise UsageError(f"a PATTERN has 1 to {PATTERN_MAX} characters")
        try:
            compiled = re.compile(pattern.encode())
        except re.error as e:
            raise UsageError(f"PATTERN: {e}") from None
        if compiled.fullmatch(b""):
            raise UsageError("PATTERN matches the empty string (an empty match is "
                             "everywhere): refusing it")
        patterns = (compiled,)
    else:
        values = (_finding_value(settings, finding or ""),)
    spec = Rewrite(redact=values, patterns=patterns)
    _run(ctx, spec, _machines(settings, machines, all_machines), dry_run=dry_run,
         local=False, as_json=as_json)


def _resolve(settings: Settings, ref: str, machine: str | None) -> str:
    """The session a prefix names, in the machine's heads named (else any machine's:
    one session several machines hold is one id all the same)."""
    from syncd.errors import OnSeveralMachines
    from syncd.restore.listing import find_session
    repo = repository_of(settings)
    try:
        return find_session(repo, ref, machine)[1]
    except OnSeveralMachines as e:
        return find_session(repo, ref, e.machines[0])[1]


def _finding_value(settings: Settings, finding: str) -> bytes:
    try:
        from syncd.secrets.findings import lookup, value_of
    except ImportError:  # pragma: no cover - the scanner ships with this command
        raise UsageError("--finding needs the secrets scanner") from None
    f = lookup(settings.state_dir, finding)
    if f is None:
        # A redact drops the findings of the files it masked (they are scanned again):
        # the ids `syncd secrets` listed before it are found again once scanned.
        from syncd.cli.secrets import _scan_local
        _scan_local(settings)
        f = lookup(settings.state_dir, finding)
    if f is None:
        raise UsageError(f"no finding {finding} (syncd secrets lists them)")
    if f.signed:
        raise RewriteRefused(
            f"finding {finding} lies inside a signed block (thinking or signature), which "
            f"cannot be changed: forget the session instead (syncd forget --session "
            f"{f.session or '?'})")
    value = value_of(settings.source, f)
    if value is None:
        raise RewriteRefused(f"finding {finding}: its file changed since it was "
                                   "found; run syncd secrets again")
    return value


def _announce(settings: Settings, ranges: dict[bytes, list[Range]], lrep: LocalReport,
              own: list[RewriteReport]) -> None:
    """Queue the redaction's tombstones for this machine's next flush: per session whose
    files were masked here or in this machine's backup, each value's sha256 and length
    (never the value), for the machines that imported the session."""
    import os
    import time

    from syncd.archive import redactions
    from syncd.backup.state import State
    from syncd.service import purge
    from syncd.sessionfiles import session_owning

    digests: dict[str, set[tuple[str, int]]] = {}
    for rel, rs in ranges.items():
        sid = session_owning(rel)
        if sid is not None and os.fsdecode(rel) in lrep.masked:
            digests.setdefault(sid, set()).update((r.digest, r.end - r.start)
                                                  for r in rs if not r.line and r.digest)
    for r in own:
        for sid, ds in r.digests.items():
            digests.setdefault(sid, set()).update(ds)
    if not digests or not settings.state_file.exists():
        return
    state = State(settings.state_file)
    try:
        redactions.announce(state, digests, time.time())
    finally:
        state.close()
    purge.wake_daemon(settings)


COMMANDS = (forget_cmd, redact_cmd)

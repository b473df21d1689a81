"""``syncd secrets``: which sessions hold what looks like a secret."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

from syncd.cli.util import settings_of, source_option

if TYPE_CHECKING:
    from syncd.config import Settings
    from syncd.secrets.findings import Finding, Findings


def _scan_local(one: Settings) -> None:
    """Without a daemon (just installed, or stopped): the tree's new bytes scanned first."""
    from syncd.secrets.scanner import update_local
    from syncd.security.lock import ProcessLock

    if one.secrets_scan and \
            ProcessLock(one.state_file.with_suffix(".lock")).holder() is not None:
        return  # its daemon keeps the findings current
    if one.source.is_dir():
        update_local(one.state_dir, one.source, one.machine_id)


def _as_json(f: Finding) -> dict[str, object]:
    return {"id": f.id, "path": f.path.decode(errors="replace"), "line": f.line,
            "offset": f.offset, "length": f.length, "kind": f.kind, "masked": f.masked,
            "signed": f.signed}  # (never the value's hash: a weak one is guessed from it)


def _print(groups: dict[tuple[str, str | None], list[Finding]]) -> None:
    from syncd.untrusted import printable

    for (machine, session), found in groups.items():
        what = session if session is not None else "(no session)"
        click.echo(printable(f"{what}  {machine}  {len(found)} finding"
                             f"{'s' if len(found) != 1 else ''}"))
        for f in found:
            flag = "  signed (cannot be redacted: forget the session)" if f.signed else ""
            click.echo("    " + printable(f"{f.path.decode(errors='replace')}:{f.line}  "
                                          f"{f.kind}  {f.masked}  {f.id}{flag}"))


@click.command(short_help="Which sessions hold what looks like a secret.")
@click.option("--machine", default=None, metavar="M", help="Machine M's sessions, scanned "
              "from its backup (this machine's: from its tree, as without it).")
@click.option("--session", default=None, metavar="ID", help="Only this session's files "
              "(its id, or its first 8 characters or more).")
@click.option("--all", "every", is_flag=True, help="This machine's tree and every other "
              "machine of the store, from its backup.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (one JSON "
              "object: sessions, each with its findings; notes; problems).")
@source_option
@click.pass_context
def secrets(ctx: click.Context, machine: str | None, session: str | None, every: bool,
            as_json: bool) -> None:
    """List each finding of detect-secrets' plugins (AWS keys, GitHub and GitLab tokens,
    private keys, Slack, Stripe, JWTs, keyword assignments, high-entropy strings, …) in
    the transcripts, subagents, tool results and prompt history: file, line, kind, a
    masked value, its id (for `syncd redact --finding ID`) and whether it is in a signed
    thinking block (those cannot be redacted).

    This machine's tree is scanned first when no daemon keeps the findings current (only
    what is new since the last scan); --machine M scans M's backup (only what it
    flushed since the last run is downloaded). Nothing is altered by scanning; values
    are never stored nor printed. Exit 0: nothing found; 1: findings (or the work could
    not be completed); 2: bad usage.
    """
    from syncd.cli.util import repository_of
    from syncd.errors import (
        BackupError,
        CryptoError,
        FormatError,
        NoBackup,
        StoreError,
        UsageError,
    )
    from syncd.format.catalog import is_session_id
    from syncd.redact import redact
    from syncd.secrets.findings import FILE_NAME, Findings
    from syncd.secrets.remote import RemoteScan, scan_machine
    from syncd.untrusted import printable

    if every and machine is not None:
        raise UsageError("secrets: --machine M or --all, not both")
    prefix = None
    if session is not None:
        from syncd.cli.util import _uuid_prefix
        from syncd.restore.sessionref import MIN_PREFIX
        session = session.lower()
        if not is_session_id(session):
            if len(session) < MIN_PREFIX or not _uuid_prefix(session):
                raise UsageError(f"secrets: --session: not a session id (a UUID, or at "
                                 f"least its first {MIN_PREFIX} characters, as in `syncd "
                                 f"sessions`): {printable(session)!r}")
            prefix, session = session, None
    settings = settings_of(ctx)
    here = {t.machine_id: t.name for t in settings.trees()} if settings.sources else \
        {settings.machine_id: None}

    def warn(line: str) -> None:
        click.echo(redact(f"syncd: {printable(line)}"), err=True)

    if every:
        local = [settings.for_source(t.name) for t in settings.trees()] if \
            settings.sources else [settings]
    elif machine is None or machine == settings.machine_id:
        local = [settings]
    elif machine in here:
        local = [settings.for_source(str(here[machine]))]
    else:
        local = []
    remote = [machine] if machine is not None and machine not in here else []
    for one in local:
        _scan_local(one)
    reports: list[RemoteScan] = []
    failed = 0
    if every or remote:
        repo = repository_of(settings)
        names = [m for m in repo.machines() if m not in here] if every else remote
        with Findings.open(settings.state_dir / FILE_NAME) as db:
            for name in names:
                try:
                    reports.append(scan_machine(repo, name, db))
                except (BackupError, CryptoError, FormatError, StoreError) as e:
                    if isinstance(e, NoBackup) and not every:
                        raise
                    warn(f"{name}: {e}")
                    failed += 1
        for r in reports:
            for p in r.problems:
                warn(f"{r.machine}: {p}")
    machines = ([one.machine_id for one in local] + remote) if not every else None
    found, notes = _read(settings, machines, session)
    if prefix is not None:  # the sessions that id begins
        found = [f for f in found if f.session is not None and f.session.startswith(prefix)]
    groups: dict[tuple[str, str | None], list[Finding]] = {}
    for f in found:
        groups.setdefault((f.machine, f.session), []).append(f)
    if as_json:
        click.echo(json.dumps({
            "sessions": [{"machine": m, "session": s, "findings": [_as_json(f) for f in fs]}
                         for (m, s), fs in groups.items()],
            "notes": [{"machine": m, "path": p.decode(errors="replace"), "note": n}
                      for m, p, n in notes],
            "problems": [line for r in reports for line in r.problems]},
            ensure_ascii=False, indent=1))
    else:
        for m, path, n in notes:
            warn(f"{m}: {path.decode(errors='replace')}: {n}")
        if groups:
            _print(groups)
        else:
            click.echo("no secrets found", err=True)
    if failed:
        raise BackupError(f"secrets: {failed} machine(s) not read (said above)")
    if groups:
        ctx.exit(1)


def _read(settings: Settings, machines: list[str] | None, session: str | None
          ) -> tuple[list[Finding], list[tuple[str, bytes, str]]]:
    from syncd.secrets.findings import FILE_NAME, Findings

    path = settings.state_dir / FILE_NAME
    if not path.exists():
        return [], []
    db: Findings
    with Findings.open(path, readonly=True) as db:
        if machines is None:
            return db.findings(session=session), db.notes()
        found = [f for m in machines for f in db.findings(m, session)]
        return found, [n for m in machines for n in db.notes(m)]


COMMANDS = [secrets]

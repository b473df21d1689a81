"""``syncd index``: other machines' transcripts indexed for ``syncd search``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from syncd.cli.util import echo_json, settings_of
from syncd.errors import BackupError, UsageError

if TYPE_CHECKING:
    from syncd.search.remote import RemoteIndexReport


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.1f} kB"


def _plan_line(r: RemoteIndexReport) -> str:
    if not r.to_index:
        return f"{r.machine}: {r.files} transcripts, all indexed already: nothing to download"
    return (f"{r.machine}: {r.to_index} of {r.files} transcripts to index: "
            f"{_mb(r.planned_bytes)} to download from {r.planned_objects} objects "
            f"({_mb(r.raw_bytes)} of transcript)")


@click.command("index", short_help="Index other machines' transcripts for `syncd search`.")
@click.option("--machine", "machines", multiple=True, metavar="M",
              help="Index machine M (repeatable).")
@click.option("--all", "every", is_flag=True,
              help="Every machine in the store but this one.")
@click.option("--dry-run", is_flag=True,
              help="Say what would be downloaded, and download none of it.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (for scripts).")
@click.pass_context
def index_cmd(ctx: click.Context, machines: tuple[str, ...], every: bool, dry_run: bool,
              as_json: bool) -> None:
    """Index the full text of other machines' sessions from their backups, so that
    `syncd search` finds what was said there (without this, their titles and prompts
    are searched from their catalogs).

    First it says what it will download; then it reads only the bytes the index does
    not hold yet, so the next run downloads only what those machines flushed since. A
    transcript rewritten there is indexed again; one deleted there stays findable,
    marked deleted. An object that does not read is one line; the rest is indexed.
    This machine's sessions (those of each of its trees) are indexed from its trees.
    """
    from syncd.cli.util import repository_of
    from syncd.errors import CryptoError, FormatError, NoBackup, StoreError
    from syncd.redact import redact
    from syncd.search.index import FILE_NAME, SearchIndex
    from syncd.search.remote import index_machine
    from syncd.untrusted import printable

    if every == bool(machines):
        raise UsageError("index: name the machines (--machine M, repeatable) or --all")
    settings = settings_of(ctx)
    # This host's trees (``sources``: one machine id each) are indexed from the trees.
    here = {t.machine_id for t in settings.trees()}
    mine = [m for m in machines if m in here]
    if mine:
        raise UsageError(f"index: {mine[0]} is this machine's: its sessions are indexed "
                         "from its tree")
    repo = repository_of(settings)
    names = [m for m in repo.machines() if m not in here] if every \
        else list(dict.fromkeys(machines))

    def say(line: str) -> None:
        click.echo(redact(printable(line)), err=as_json)

    def warn(line: str) -> None:
        click.echo(redact(f"syncd: {printable(line)}"), err=True)

    if every:
        # What follow imports is indexed as it lands (no download of its own): --all
        # fetching it again would hold those sessions twice. Named, as asked.
        followed = {m for t in settings.trees() for m in t.follow}
        if "*" in followed and (settings.state_dir / FILE_NAME).exists():
            # Chosen among all: those whose sessions follow brought here so far.
            seen_ix = SearchIndex.open(settings.state_dir / FILE_NAME)
            try:
                followed |= {o for (o,) in seen_ix.db.execute(
                    "SELECT DISTINCT origin FROM sessions WHERE origin IS NOT NULL AND "
                    f"machine IN ({', '.join('?' * len(here))})", sorted(here)) if o}
            finally:
                seen_ix.close()
        for name in [m for m in names if m in followed]:
            warn(f"{name}: followed here: its sessions are indexed as follow imports them")
        names = [m for m in names if m not in followed]

    reports = []
    failed: list[str] = []
    index = SearchIndex.open(settings.state_dir / FILE_NAME)
    try:
        for name in names:
            try:
                r = index_machine(repo, name, index, dry_run=dry_run,
                                  on_plan=lambda r: say(_plan_line(r)))
            except (BackupError, CryptoError, FormatError, StoreError) as e:
                if isinstance(e, NoBackup) and not every:
                    raise
                warn(f"{name}: {e}")
                failed.append(name)
                continue
            for p in r.problems:
                warn(f"{name}: {p}")
            if not dry_run:
                say(f"{name}: indexed {_mb(r.indexed_bytes)} of {r.to_index} transcripts "
                    f"({_mb(r.fetched_bytes)} read), {r.sessions} sessions"
                    + (f", {r.deleted} marked deleted" if r.deleted else ""))
            reports.append(r)
    finally:
        index.close()
    if as_json:
        echo_json([r.as_json() for r in reports])
    problems = sum(len(r.problems) for r in reports)
    if failed or problems:
        what = [f"{len(failed)} machine(s) not read"] if failed else []
        what += [f"{problems} problem(s)"] if problems else []
        raise BackupError(f"index: {' and '.join(what)} (said above); the rest is indexed")


COMMANDS = (index_cmd,)

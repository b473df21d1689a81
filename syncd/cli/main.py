"""The ``syncd`` command line."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from syncd.cli.archive import COMMANDS as ARCHIVE_COMMANDS
from syncd.cli.group import Group
from syncd.cli.index import COMMANDS as INDEX_COMMANDS
from syncd.cli.keys import COMMANDS as KEY_COMMANDS
from syncd.cli.purge import COMMANDS as PURGE_COMMANDS
from syncd.cli.restore import COMMANDS
from syncd.cli.search import COMMANDS as SEARCH_COMMANDS
from syncd.cli.secrets import COMMANDS as SECRETS_COMMANDS
from syncd.cli.show import COMMANDS as SHOW_COMMANDS
from syncd.cli.util import interactive, settings_of, source_option
from syncd.cli.web import COMMANDS as WEB_COMMANDS
from syncd.errors import StoreError, SyncdError, SyncError, SyncStopped, UsageError, exit_code
from syncd.redact import redact
from syncd.service.log import setup as setup_logging
from syncd.version import __version__

if TYPE_CHECKING:
    from syncd.config import Settings
    from syncd.store import Store

# What a command needs is imported inside it: `syncd --help`, a command's help and bad
# usage load click alone, not the config model, the S3 client, the watcher, the
# scheduler or the codecs (a third of a second of start-up).

EPILOG = """\b
Environment:
  SYNCD_STORE       the store URL (as --store; the option wins over it,
                    and it over the config file's `store`)
  SYNCD_CONFIG      the config file (as --config)
  SYNCD_<KEY>       any config key, e.g. SYNCD_MACHINE_ID=desk or
                    SYNCD_KEEP_DAILY=7 (wins over the config file; a list
                    or a table is written as JSON)
  SYNCD_PASSPHRASE  the passphrase of an encrypted store

\b
Exit codes:
  0  success
  1  the work could not be completed (one line on stderr says why),
     or verify found a problem, or secrets found some
  2  bad usage or configuration

\b
Shell completion (add to your shell's rc file):
  bash:  eval "$(_SYNCD_COMPLETE=bash_source syncd)"
  zsh:   eval "$(_SYNCD_COMPLETE=zsh_source syncd)"
  fish:  _SYNCD_COMPLETE=fish_source syncd | source
"""


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]},
             epilog=EPILOG)
@click.version_option(__version__, prog_name="syncd")
@click.option("--config", type=click.Path(path_type=Path), default=None,
              help="Config file (default $SYNCD_CONFIG, else ~/.config/syncd/config.toml); "
                   "one named here or in $SYNCD_CONFIG must exist.")
@click.option("--store", metavar="URL", default=None,
              help="The store: s3://bucket/prefix, file:///path or an absolute path "
                   "(default $SYNCD_STORE, else the config file's `store`, else "
                   "~/.local/share/syncd/store).")
@click.option("-v", "--verbose", is_flag=True,
              help="Log more: every flush and scan (debug detail for run).")
@click.pass_context
def cli(ctx: click.Context, config: Path | None, store: str | None, verbose: bool) -> None:
    """Continuous append-only backup of Claude Code's session store (~/.claude).

    Run `syncd run` as a service (see deploy/ and systemd/), `syncd status` to see
    that it keeps up, and `syncd restore` to get the sessions back.
    """
    ctx.obj = {"config": config, "store": store, "verbose": verbose}
    # One line per event; under systemd with <N> priority prefixes for the journal.
    setup_logging(logging.INFO if verbose else logging.WARNING)
    if ctx.invoked_subcommand != "run":
        from syncd.store.retry import RetryStore

        RetryStore.retry_log_level = logging.INFO


TAKEOVER = click.option(
    "--takeover", is_flag=True,
    help="Take this machine id's lease even if another syncd seems to hold it (for a "
         "machine that died; a live holder stops writing when it notices).")


@cli.command(short_help="The daemon: watch ~/.claude, back up every appended byte.")
@TAKEOVER
@source_option
@click.pass_context
def run(ctx: click.Context, takeover: bool) -> None:
    """Watch the Claude tree and ship every appended byte (foreground daemon).

    Under systemd (Type=notify) it reports READY, STATUS and WATCHDOG; SIGHUP re-reads
    the configuration, SIGTERM finishes the segment in flight and exits 0. It holds the
    machine's lease in the store: a second syncd with the same machine id refuses to
    start, and a daemon whose lease was taken over exits 1. With `sources`, every tree
    is backed up by its own daemon thread (--source: only that one).
    """
    from syncd.service.daemon import Daemon
    from syncd.service.log import set_level
    from syncd.service.trees import Trees

    settings = settings_of(ctx)
    set_level(logging.DEBUG if ctx.obj["verbose"] else settings.log_level)
    # SIGHUP re-reads the config file and the environment; --store still wins.
    if settings.sources:
        Trees(settings, reload=lambda: settings_of(ctx), takeover=takeover, prompt=True).run()
        return
    Daemon(settings, reload=lambda: settings_of(ctx), takeover=takeover, prompt=True).run()


@cli.command(short_help="Back up everything pending once; exit 0 when durable.")
@TAKEOVER
@source_option
@click.pass_context
def sync(ctx: click.Context, takeover: bool) -> None:
    """One pass: scan, ship everything pending, exit 0 once it is durable (holding the
    machine's lease meanwhile). With `sources`, every tree in turn (--source: one); a
    tree that fails does not keep the others from being synced."""
    from syncd.backup.engine import sync_once
    from syncd.progress import meter
    from syncd.service.signals import stop_on_signals

    # Run by hand: an unreachable store fails it within seconds, not the daemon's minute.
    settings = interactive(settings_of(ctx))
    # SIGTERM and Ctrl-C end it at a segment boundary, as they end the daemon's flush.
    stop = stop_on_signals()
    trees = [t.name for t in settings.trees()] if settings.sources else [None]
    failed: list[tuple[str, SyncdError]] = []
    for name in trees:
        one = settings if name is None else settings.for_source(name)
        label = "" if name is None else f" {name}"
        try:
            with meter(f"shipping{label}") as m:
                r = sync_once(one, progress=m, takeover=takeover, prompt=True, stop=stop)
        except SyncdError as e:
            if name is None or isinstance(e, SyncStopped):
                raise
            click.echo(redact(f"syncd: tree {name}: {e}".replace("\n", " ")), err=True)
            failed.append((name, e))
            continue
        click.echo(f"synced{label}: {r.files} files, {r.tombstones} deletions, "
                   f"{r.raw_bytes} bytes in {len(r.segments)} segments "
                   f"({r.stored_bytes} stored)")
    if failed:
        name, first = failed[0]
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        kind = UsageError if isinstance(first, UsageError) else SyncError
        raise kind(f"tree {name} not synced{more}")


@cli.command("status", short_help="Health at a glance (--json for scripts).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (for scripts).")
@source_option
@click.pass_context
def status_cmd(ctx: click.Context, as_json: bool) -> None:
    """Health at a glance: daemon, lag, last flush, pending bytes, errors, store.

    The store check is one HEAD with a 3 s timeout. `--json` prints the same figures
    the daemon's metrics endpoint serves. With `sources`, the default tree's figures
    and then each other tree's (`sources` in the JSON); --source: that tree alone.
    """
    from syncd.service.status import STORE_CHECK_TIMEOUT, format_status, health, status
    from syncd.store import open_store

    settings = settings_of(ctx)
    try:
        # A local store that is not there is reported, not created.
        probe: Store | None = open_store(
            settings.store, endpoint_url=settings.s3_endpoint_url, region=settings.s3_region,
            retry_deadline=STORE_CHECK_TIMEOUT, timeout=STORE_CHECK_TIMEOUT, create=False)
        why = None
    except StoreError as e:
        probe, why = None, str(e)

    def figures(one: Settings) -> dict[str, Any]:
        if probe is None:
            s = status(one)
            s["store_reachable"], s["store_error"] = False, why
        else:
            s = status(one, probe_store=True, store=probe)
        s["health"] = health(s)  # what is wrong, as the text's "health:" line says it
        return s

    s = figures(settings)
    if not settings.sources:
        click.echo(redact(json.dumps(s, indent=2) if as_json else format_status(s)))
        return
    s["tree"] = settings.tree
    others = [{"tree": t.name, **figures(settings.for_source(t.name))}
              for t in settings.trees()[1:]]
    if as_json:
        click.echo(redact(json.dumps({**s, "sources": others}, indent=2)))
        return
    blocks = [format_status(one) for one in (s, *others)]
    click.echo(redact("\n\n".join(f"tree:         {one['tree']}\n{text}"
                                    for one, text in zip((s, *others), blocks, strict=True))))


for _command in (*COMMANDS, *ARCHIVE_COMMANDS, *PURGE_COMMANDS, *KEY_COMMANDS,
                 *SEARCH_COMMANDS, *INDEX_COMMANDS, *SHOW_COMMANDS, *WEB_COMMANDS,
                 *SECRETS_COMMANDS):
    cli.add_command(_command)


def main() -> None:
    # Whatever syncd creates (state, locks, staging, conflict copies, a local store) is
    # its owner's alone; each place also sets its mode explicitly.
    os.umask(0o077)
    try:
        cli(prog_name="syncd")
        code: int = 0
    except SystemExit as e:
        # click ends every command so (bad usage included: 2).
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        if not isinstance(e.code, int) and e.code is not None:
            click.echo(e.code, err=True)
    except SyncdError as e:
        # The one place where errors become exit codes: one line, secrets masked.
        click.echo(redact(f"syncd: {e}".replace("\n", " ")), err=True)
        code = exit_code(e)
    except OSError as e:  # the local filesystem: the work could not be completed
        click.echo(redact(f"syncd: {e.strerror or e}"
                          + (f": {os.fsdecode(e.filename)}" if e.filename else "")),
                   err=True)
        code = 1
    # By now the command has closed all it opened (state, lease, store, worker jobs, temp
    # dirs); the interpreter's teardown of its ~100k objects (boto3's models, pydantic's
    # schemas) would add ~0.2 s to every run, a tenth of a 200 MB seed: flush what is
    # buffered and leave.
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed, or a broken pipe
            stream.flush()
    os._exit(code)

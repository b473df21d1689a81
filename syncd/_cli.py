"""The ``syncd`` command line."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError

from . import __version__
from ._config import Settings, load_settings
from ._daemon import Daemon, SyncError, sync_once
from ._lock import Locked
from ._restore import RestoreError, restore_tree
from ._segment import FormatError
from ._state import StateError
from ._status import format_status, status
from .store import StoreError, open_store

# Exit codes: 0 ok, 1 the work could not be completed (one-line reason on stderr),
# 2 bad usage or configuration.
EXPECTED = (SyncError, StoreError, StateError, RestoreError, FormatError, Locked, OSError)


def _settings(ctx: click.Context, **overrides: Any) -> Settings:
    try:
        return load_settings(ctx.obj["config"], **{k: v for k, v in overrides.items()
                                                   if v is not None})
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "config"
        raise click.UsageError(f"configuration: {where}: {first['msg']}") from None


def _fail(e: Exception) -> None:
    click.echo(f"syncd: {e}", err=True)
    sys.exit(1)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="syncd")
@click.option("--config", type=click.Path(path_type=Path), default=None,
              help="Config file (default ~/.config/syncd/config.toml or $SYNCD_CONFIG).")
@click.option("-v", "--verbose", is_flag=True, help="Log every flush and scan.")
@click.pass_context
def cli(ctx: click.Context, config: Path | None, verbose: bool) -> None:
    """Continuous append-only backup of Claude Code's session store."""
    ctx.obj = {"config": config}
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@cli.command()
@click.pass_context
def run(ctx: click.Context) -> None:
    """Watch the Claude tree and ship every appended byte (foreground)."""
    settings = _settings(ctx)
    logging.getLogger().setLevel(settings.log_level.upper())
    try:
        Daemon(settings).run()
    except EXPECTED as e:
        _fail(e)


@cli.command()
@click.pass_context
def sync(ctx: click.Context) -> None:
    """One pass: scan, ship everything pending, exit 0 once it is durable."""
    settings = _settings(ctx)
    try:
        r = sync_once(settings)
    except EXPECTED as e:
        _fail(e)
    click.echo(f"synced: {r.files} files, {r.tombstones} deletions, {r.raw_bytes} bytes in "
               f"{len(r.segments)} segments ({r.stored_bytes} stored)")


@cli.command("status")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def status_cmd(ctx: click.Context, as_json: bool) -> None:
    """Machine, store, last flush, files tracked, bytes pending, last error."""
    settings = _settings(ctx)
    try:
        s = status(settings)
    except EXPECTED as e:
        _fail(e)
    click.echo(json.dumps(s, indent=2) if as_json else format_status(s))


@cli.command()
@click.option("--to", "target", type=click.Path(path_type=Path), required=True,
              help="Directory to rebuild the backed-up tree into.")
@click.option("--machine", default=None, help="Machine id to restore (default: this one).")
@click.pass_context
def restore(ctx: click.Context, target: Path, machine: str | None) -> None:
    """Rebuild a machine's backed-up tree byte for byte into a directory."""
    settings = _settings(ctx)
    try:
        store = open_store(settings.store, endpoint_url=settings.s3_endpoint_url,
                           region=settings.s3_region,
                           retry_deadline=settings.store_retry_deadline)
        report = restore_tree(store, machine or settings.machine_id, target)
    except EXPECTED as e:
        _fail(e)
    for line in report.kept:
        click.echo(f"kept local: {line}", err=True)
    click.echo(f"restored {len(report.written)} files ({report.bytes_written} bytes), "
               f"{len(report.skipped)} already identical, {len(report.kept)} kept local")
    if report.errors:
        for line in report.errors:
            click.echo(f"syncd: {line}", err=True)
        sys.exit(1)


def main() -> None:
    cli(prog_name="syncd")

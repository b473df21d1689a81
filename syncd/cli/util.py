"""What every command shares: settings from the context, the store and its key, and the
checks of what the user typed."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import click

from syncd.errors import ConfigError, NoSuchStore, UsageError
from syncd.restore.sessionref import MIN_PREFIX

if TYPE_CHECKING:
    from syncd.config import Settings
    from syncd.repository import Repository
    from syncd.store import RetryStore

# The config model, the store and the repository are imported by the functions that use
# them: a command's --help, and bad usage, never load them.

# A command run by hand against a store it cannot reach fails within ~10 s (the daemon
# keeps settings.store_retry_deadline): no retry starts after the deadline, and the last
# attempt may take one connect timeout more (S3's default 10 s for sync, whose store the
# engine opens). A short connect timeout gets an address that drops packets two tries.
INTERACTIVE_DEADLINE = 7.0
INTERACTIVE_CONNECT_TIMEOUT = 3.0


def bad_value(param: click.Parameter, why: str) -> UsageError:
    """What an option or argument callback raises: ``syncd: --opt: why``, exit 2."""
    name = param.opts[0] if isinstance(param, click.Option) else param.human_readable_name
    return UsageError(f"{name}: {why}")


def settings_of(ctx: click.Context, **overrides: Any) -> Settings:
    """The settings every command runs with: the config file, overlaid by ``SYNCD_*``
    variables, overlaid by the global options (``--store``) and ``overrides``."""
    from syncd.config import load_settings

    config, store = ctx.obj["config"], ctx.obj.get("store")
    given = {k: v for k, v in {"store": store, **overrides}.items() if v is not None}
    try:
        settings = load_settings(config, config_required=config is not None, **given)
    except ConfigError as e:
        # An argument's value is named by its option, as bad_value does.
        if store is not None and str(e).startswith("store: "):
            raise ConfigError(f"--store: {str(e).removeprefix('store: ')}") from None
        raise
    name = ctx.obj.get("source")
    if name is None:
        return settings
    try:
        return settings.for_source(name)
    except ConfigError as e:
        raise UsageError(f"--source: {e}") from None


def _chosen_source(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value is not None:
        ctx.obj["source"] = value  # the group's dict: settings_of reads it


# ``--source NAME``: the command works on that tree of `sources` (its root, machine id
# and state) instead of the default one.
source_option = click.option(
    "--source", metavar="NAME", default=None, expose_value=False, callback=_chosen_source,
    help="The tree of `sources` named NAME (its root and machine id; default: the tree "
         "`source` names, called default).")


def chosen_source(ctx: click.Context) -> str | None:
    """The ``--source`` given (None: none)."""
    value = ctx.obj.get("source")
    return value if isinstance(value, str) else None


def interactive(settings: Settings) -> Settings:
    """``settings`` with the store budget of a command run by hand."""
    return settings.model_copy(update={"store_retry_deadline": min(
        settings.store_retry_deadline, INTERACTIVE_DEADLINE)})


def store_of(settings: Settings, *, create: bool = False) -> RetryStore:
    """The store with the interactive budget. A missing local store is created only for
    ``create`` (commands that start a backup); for the others it is bad configuration."""
    from syncd.store import open_store

    try:
        return open_store(settings.store, endpoint_url=settings.s3_endpoint_url,
                          region=settings.s3_region,
                          retry_deadline=interactive(settings).store_retry_deadline,
                          connect_timeout=INTERACTIVE_CONNECT_TIMEOUT, create=create)
    except NoSuchStore as e:
        hint = "" if "store" in settings.model_fields_set else \
            " (nothing is backed up yet: syncd sync, or syncd run)"
        raise NoSuchStore(f"{e}{hint}") from None


def repository_of(settings: Settings, machine: str | None = None) -> Repository:
    """A machine's repository (default this one's), the store unlocked when it is
    encrypted (prompting on a terminal); fails closed."""
    from syncd.backup.state import remembered_key
    from syncd.repository import Repository
    from syncd.security.keys import open_crypto

    store = store_of(settings)
    crypto = open_crypto(store, settings.passphrase_file, prompt=True,
                         hint=remembered_key(settings.state_file))
    return Repository(store, machine or settings.machine_id, crypto)


# -- what the user typed ------------------------------------------------------------------

# Claude's session ids are UUIDs (8-4-4-4-12 hex digits).
_UUID = "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
_HEX = frozenset("0123456789abcdefABCDEF")


def _uuid_prefix(text: str) -> bool:
    return len(text) <= len(_UUID) and all(
        c == "-" if t == "-" else c in _HEX for c, t in zip(text, _UUID, strict=False))


def session_ids(ctx: click.Context, param: click.Parameter,
                value: tuple[str, ...]) -> tuple[str, ...]:
    """``--session``, repeatable: each a session id or its first 8 characters or more
    (resolved against the machine's sessions before the restore: ``sessionref``)."""
    return tuple(session_prefix(ctx, param, sid) for sid in value)


def session_prefix(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A session id or its first 8 characters or more."""
    if len(value) < MIN_PREFIX or not _uuid_prefix(value):
        raise bad_value(param, f"{value!r} is not a session id (a UUID, or at least its "
                               f"first {MIN_PREFIX} characters, as in `syncd sessions`)")
    return value


def _parsed(parse: Callable[[str], float]) -> Callable[
        [click.Context, click.Parameter, str | None], float | None]:
    """An option callback: ``parse`` the value; what it cannot read is bad usage."""
    def callback(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
        try:
            return None if value is None else parse(value)
        except ConfigError as e:
            raise bad_value(param, str(e)) from None
    return callback


def _parse_time(text: str) -> float:
    from syncd.duration import parse_time

    return parse_time(text)


def _parse_duration(text: str) -> float:
    from syncd.duration import parse_duration

    return parse_duration(text)


# ``--at``: a point in time (epoch seconds); ``--max-duration``: seconds.
time_option = _parsed(_parse_time)
duration_option = _parsed(_parse_duration)


# A lone surrogate (a store's string, or a title Claude Code cut inside a UTF-16 pair)
# cannot be written as UTF-8: JSON escapes it instead.
_SURROGATE = re.compile("[\ud800-\udfff]")


def _json(doc: Any) -> str:
    return _SURROGATE.sub(lambda m: f"\\u{ord(m[0]):04x}",
                          json.dumps(doc, indent=2, ensure_ascii=False))


def echo_json(doc: Any) -> None:
    click.echo(_json(doc))


def echo_json_rows(rows: Iterable[Any]) -> None:
    """A JSON list as ``echo_json`` prints it, written row by row as the rows come."""
    first = True
    for row in rows:
        text = _json(row).replace("\n", "\n  ")
        click.echo(("[\n  " if first else ",\n  ") + text, nl=False)
        first = False
    click.echo("[]" if first else "\n]")



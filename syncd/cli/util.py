"""What every command shares: settings from the context, the store and its key,
one-line failures (secrets masked), and the checks of what the user typed."""

from __future__ import annotations

import re
import shlex
import sys
from typing import IO, Any, NoReturn

import click

from syncd.archive.options import ScheduleError
from syncd.backup.state import StateError
from syncd.config import ConfigError, Settings, load_settings
from syncd.format.segment import FormatError
from syncd.redact import redact
from syncd.restore.listing import ListingError, parse_time
from syncd.restore.restorer import RestoreError
from syncd.security.crypto import Crypto, CryptoError
from syncd.security.keys import open_crypto, remembered_key
from syncd.security.lease import LeaseError
from syncd.security.lock import Locked
from syncd.service.daemon import SyncError
from syncd.store import NoSuchStore, RetryStore, StoreError, open_store

# Exit codes: 0 ok, 1 the work could not be completed (one-line reason on stderr),
# 2 bad usage or configuration.
EXPECTED = (SyncError, StoreError, StateError, RestoreError, FormatError, Locked, OSError,
            CryptoError, LeaseError, ScheduleError)

# A command run by hand against a store it cannot reach fails within ~10 s (the daemon
# keeps settings.store_retry_deadline): no retry starts after the deadline, and the last
# attempt may take one connect timeout more (S3's default 10 s for sync, whose store the
# engine opens). A short connect timeout gets an address that drops packets two tries.
INTERACTIVE_DEADLINE = 7.0
INTERACTIVE_CONNECT_TIMEOUT = 3.0


class UsageFail(click.UsageError):
    """Bad usage or configuration: one ``syncd: …`` line, exit 2 (no usage text: the
    line says what is wrong)."""

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(redact(f"syncd: {self.format_message()}"), err=True)


class BadValue(click.BadParameter):
    """A parameter's value is wrong: ``syncd: --opt: why``, exit 2."""

    def show(self, file: IO[Any] | None = None) -> None:
        where = ""
        if isinstance(self.param, click.Option):
            where = f"{self.param.opts[0]}: "
        elif self.param is not None:
            where = f"{self.param.human_readable_name}: "
        click.echo(redact(f"syncd: {where}{self.message}"), err=True)


def settings_of(ctx: click.Context, **overrides: Any) -> Settings:
    config = ctx.obj["config"]
    try:
        return load_settings(config, config_required=config is not None,
                             **{k: v for k, v in overrides.items() if v is not None})
    except ConfigError as e:
        raise UsageFail(str(e)) from None


def interactive(settings: Settings) -> Settings:
    """``settings`` with the store budget of a command run by hand."""
    return settings.model_copy(update={"store_retry_deadline": min(
        settings.store_retry_deadline, INTERACTIVE_DEADLINE)})


def store_of(settings: Settings, *, create: bool = False) -> RetryStore:
    """The store with the interactive budget. A missing local store is created only for
    ``create`` (commands that start a backup); for the others it is bad configuration."""
    try:
        return open_store(settings.store, endpoint_url=settings.s3_endpoint_url,
                          region=settings.s3_region,
                          retry_deadline=interactive(settings).store_retry_deadline,
                          connect_timeout=INTERACTIVE_CONNECT_TIMEOUT, create=create)
    except NoSuchStore as e:
        hint = "" if "store" in settings.model_fields_set else \
            " (nothing is backed up yet: syncd sync, or syncd run)"
        raise UsageFail(f"{e}{hint}") from None


def store_and_key(settings: Settings) -> tuple[RetryStore, Crypto | None]:
    """The store, unlocked when it is encrypted (prompting on a terminal); fails closed."""
    store = store_of(settings)
    return store, open_crypto(store, settings.passphrase_file, prompt=True,
                              hint=remembered_key(settings.state_file))


def fail(e: Exception, code: int = 1) -> NoReturn:
    click.echo(redact(f"syncd: {e}"), err=True)
    sys.exit(code)


# -- what the user typed ------------------------------------------------------------------

# Claude's session ids are UUIDs (8-4-4-4-12 hex digits).
_UUID = "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
_HEX = frozenset("0123456789abcdefABCDEF")
MIN_PREFIX = 8


def _uuid_prefix(text: str) -> bool:
    return len(text) <= len(_UUID) and all(
        c == "-" if t == "-" else c in _HEX for c, t in zip(text, _UUID, strict=False))


def session_ids(ctx: click.Context, param: click.Parameter,
                value: tuple[str, ...]) -> tuple[str, ...]:
    """``--session``: whole session ids."""
    for sid in value:
        if len(sid) != len(_UUID) or not _uuid_prefix(sid):
            raise BadValue(f"{sid!r} is not a session id (a UUID, as in "
                           "`syncd sessions`)")
    return value


def session_prefix(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A session id or its first 8 characters or more."""
    if len(value) < MIN_PREFIX or not _uuid_prefix(value):
        raise BadValue(f"{value!r} is not a session id (a UUID, or at least its first "
                       f"{MIN_PREFIX} characters, as in `syncd sessions`)")
    return value


def time_option(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    """``--at``: a point in time (epoch seconds)."""
    try:
        return None if value is None else parse_time(value)
    except ListingError as e:
        raise BadValue(str(e)) from None


# C0 and C1 controls and the bidi overrides that make a line read otherwise than it runs.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def resume_line(cwd: str, session_id: str) -> str:
    """``cd <cwd> && claude --resume <id>``, every word quoted: both come from the store,
    and the line is meant to be pasted into a shell. A word with control characters (a
    newline, a terminal escape) is refused rather than printed."""
    for word in (cwd, session_id):
        if _CONTROL.search(word):
            raise ValueError(f"not printing a shell line for {word!r}: it holds control "
                             "characters")
    return f"cd {shlex.quote(cwd)} && claude --resume {shlex.quote(session_id)}"

"""What every command shares: settings from the context, the store and its key,
one-line failures (secrets masked)."""

from __future__ import annotations

import sys
from typing import IO, Any, NoReturn

import click

from ._archive import ScheduleError
from ._config import ConfigError, Settings, load_settings
from ._crypto import Crypto, CryptoError
from ._daemon import SyncError
from ._keys import open_crypto
from ._lease import LeaseError
from ._lock import Locked
from ._redact import redact
from ._restore import RestoreError
from ._segment import FormatError
from ._state import StateError
from .store import RetryStore, StoreError, open_store

# Exit codes: 0 ok, 1 the work could not be completed (one-line reason on stderr),
# 2 bad usage or configuration.
EXPECTED = (SyncError, StoreError, StateError, RestoreError, FormatError, Locked, OSError,
            CryptoError, LeaseError, ScheduleError)


class UsageFail(click.UsageError):
    """Bad usage or configuration: one ``syncd: …`` line, exit 2 (no usage text: the
    line says what is wrong)."""

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(redact(f"syncd: {self.format_message()}"), err=True)


def settings_of(ctx: click.Context, **overrides: Any) -> Settings:
    config = ctx.obj["config"]
    try:
        return load_settings(config, config_required=config is not None,
                             **{k: v for k, v in overrides.items() if v is not None})
    except ConfigError as e:
        raise UsageFail(str(e)) from None


def store_of(settings: Settings) -> RetryStore:
    return open_store(settings.store, endpoint_url=settings.s3_endpoint_url,
                      region=settings.s3_region, retry_deadline=settings.store_retry_deadline)


def store_and_key(settings: Settings) -> tuple[RetryStore, Crypto | None]:
    """The store, unlocked when it is encrypted (prompting on a terminal); fails closed."""
    store = store_of(settings)
    return store, open_crypto(store, settings.passphrase_file, prompt=True)


def fail(e: Exception) -> NoReturn:
    click.echo(redact(f"syncd: {e}"), err=True)
    sys.exit(1)

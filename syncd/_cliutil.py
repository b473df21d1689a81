"""What every command shares: settings from the context, the store and its key,
one-line failures (secrets masked)."""

from __future__ import annotations

import sys
from typing import Any, NoReturn

import click
from pydantic import ValidationError

from ._archive import ScheduleError
from ._config import Settings, load_settings
from ._crypto import Crypto, CryptoError
from ._daemon import SyncError
from ._keys import open_crypto, remembered_key
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


def settings_of(ctx: click.Context, **overrides: Any) -> Settings:
    try:
        return load_settings(ctx.obj["config"], **{k: v for k, v in overrides.items()
                                                   if v is not None})
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "config"
        raise click.UsageError(f"configuration: {where}: {first['msg']}") from None


def store_of(settings: Settings) -> RetryStore:
    return open_store(settings.store, endpoint_url=settings.s3_endpoint_url,
                      region=settings.s3_region, retry_deadline=settings.store_retry_deadline)


def store_and_key(settings: Settings) -> tuple[RetryStore, Crypto | None]:
    """The store, unlocked when it is encrypted (prompting on a terminal); fails closed."""
    store = store_of(settings)
    return store, open_crypto(store, settings.passphrase_file, prompt=True,
                              hint=remembered_key(settings.state_file))


def fail(e: Exception) -> NoReturn:
    click.echo(redact(f"syncd: {e}"), err=True)
    sys.exit(1)

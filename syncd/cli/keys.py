"""Commands that prepare or check a store: init (--encrypt), key add/remove/list, check-store."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from syncd.cli.group import Group
from syncd.cli.util import settings_of, store_of
from syncd.errors import CryptoError
from syncd.security.crypto import Crypto, KeyFile
from syncd.security.keys import (
    NEW_PASSPHRASE_ENV,
    get_passphrase,
    init_encryption,
    key_files,
    list_keys,
    open_crypto,
)
from syncd.store import Store, layout
from syncd.store.check import check_store

if TYPE_CHECKING:
    from syncd.config import Settings

# What a command needs is imported inside it (see syncd.cli.main).


def _passphrase(path: Path | None, *, confirm: bool, env: str | None = None,
                what: str = "passphrase") -> str:
    kw = {} if env is None else {"env": env}
    value = get_passphrase(path, prompt=True, confirm=confirm, what=what, **kw)
    if value is None:
        raise CryptoError(f"no {what}: set {env or 'SYNCD_PASSPHRASE'} or a passphrase file, "
                          "or run this on a terminal to be asked")
    return value


PLAIN_STORE_NOTE = (
    "note: a plain store holds what it backs up as it is, readable by whoever can read the "
    "store: transcripts, and config such as settings.json, whose env block may hold API "
    "keys (exclude it with exclude = [\"settings.json\"], or use an encrypted store).")


@click.command(short_help="Prepare the store (--encrypt: make it encrypted).")
@click.option("--encrypt", is_flag=True,
              help="Create the store's master key, wrapped with a passphrase "
                   "($SYNCD_PASSPHRASE, $SYNCD_PASSPHRASE_FILE, passphrase_file, or asked).")
@click.pass_context
def init(ctx: click.Context, encrypt: bool) -> None:
    """Prepare the store. With --encrypt every segment, index and machine.json written
    to it from now on is sealed (AES-256-GCM); any machine with a passphrase restores.

    The store must be empty of backups: an encrypted store never holds plaintext.
    """
    settings = settings_of(ctx)
    store = store_of(settings, create=True)  # prepares the store: may make it
    if not encrypt:
        n = len(key_files(store))
        click.echo(f"{store.url}: " + (f"encrypted ({n} key file(s))" if n else
                                       "not encrypted (syncd init --encrypt to encrypt)"))
        if not n:
            click.echo(PLAIN_STORE_NOTE)
        return
    passphrase = _passphrase(settings.passphrase_file, confirm=True)
    crypto = init_encryption(store, passphrase)
    click.echo(f"{store.url}: encrypted; key file {layout.key_file_key(crypto.key_id)} "
               f"(master key {crypto.fingerprint}). Keep the passphrase safe: without it "
               "the backup cannot be read.")


@click.group(cls=Group, short_help="Passphrases of an encrypted store: add, remove, list.")
def key() -> None:
    """The passphrases that open an encrypted store (each one a key file under keys/,
    wrapping the same master key)."""


def _unlock(store: Store, settings: Settings) -> Crypto:
    """The store's key, opened with the current passphrase; an error if it is plain."""
    from syncd.backup.state import remembered_key

    crypto = open_crypto(store, settings.passphrase_file, prompt=True,
                         hint=remembered_key(settings.state_file))
    if crypto is None:
        raise CryptoError(f"{store.url}: not encrypted (syncd init --encrypt first)")
    return crypto


@key.command("add")
@click.option("--new-passphrase-file", type=click.Path(path_type=Path), default=None,
              help=f"Read the new passphrase from this file (or ${NEW_PASSPHRASE_ENV}; "
                   "asked on a terminal otherwise).")
@click.pass_context
def key_add(ctx: click.Context, new_passphrase_file: Path | None) -> None:
    """Add a passphrase: unlock with the current one, wrap the master key with the new one."""
    from syncd.repository import Repository

    settings = settings_of(ctx)
    store = store_of(settings)
    crypto = _unlock(store, settings)
    new = _passphrase(new_passphrase_file, confirm=True, env=NEW_PASSPHRASE_ENV,
                      what="new passphrase")
    key_id = Repository(store, settings.machine_id, crypto).add_key(new)
    click.echo(f"added key file {layout.key_file_key(key_id)}")


@key.command("remove")
@click.argument("key_id")
@click.pass_context
def key_remove(ctx: click.Context, key_id: str) -> None:
    """Remove a passphrase (never the last one, nor the one used to run this)."""
    from syncd.repository import Repository

    settings = settings_of(ctx)
    store = store_of(settings)
    crypto = _unlock(store, settings)
    key_id = key_id.removeprefix(layout.KEYS_PREFIX)
    Repository(store, settings.machine_id, crypto).remove_key(key_id)
    click.echo(f"removed key file {layout.key_file_key(key_id)}")


@key.command("list")
@click.pass_context
def key_list(ctx: click.Context) -> None:
    """The key files (no passphrase needed)."""
    settings = settings_of(ctx)
    found = list_keys(store_of(settings))
    if not found:
        click.echo("no keys: the store is not encrypted")
    for name, kf in found:
        if isinstance(kf, KeyFile):
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(kf.created))
            click.echo(f"{kf.key_id}  created {when}  master {kf.master}  "
                       f"scrypt n={kf.n} r={kf.r} p={kf.p}")
        else:
            click.echo(f"{name.removeprefix(layout.KEYS_PREFIX)}  UNREADABLE: {kf}")


@click.command("check-store", short_help="Check that the store provider does what syncd needs.")
@click.pass_context
def check_store_cmd(ctx: click.Context) -> None:
    """Check the store before trusting it: conditional create and replace, ranged GET,
    LIST order and start-after, DELETE. One verdict per feature; exit 1 if any required
    feature fails. Works in a scratch prefix that is removed afterwards."""
    settings = settings_of(ctx)
    store = store_of(settings)
    verdicts = check_store(store)
    for v in verdicts:
        click.echo(v.line())
    failed = [v for v in verdicts if v.required and not v.ok]
    if failed:
        click.echo(f"{store.url}: NOT usable by syncd ({len(failed)} required feature(s) "
                   "failed)")
        sys.exit(1)
    click.echo(f"{store.url}: usable by syncd")


COMMANDS = (init, key, check_store_cmd)

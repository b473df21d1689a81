"""The store's keys (``keys/<key-id>``) and where a passphrase comes from.

A store is encrypted when ``keys/`` holds a key file: one LIST when a command or the
daemon starts, never on the hot path. Then nothing is read or written without a
passphrase that opens one of them (fail closed). Each key file wraps the same master
key under another passphrase: ``syncd key add`` and ``syncd key remove`` change who can
open the store, never the master key (a removed passphrase that was used to read the
master key once has it still: rotate by re-encrypting into a new store if that matters).

The passphrase comes from ``$SYNCD_PASSPHRASE``, else the file named by
``$SYNCD_PASSPHRASE_FILE`` or the config's ``passphrase_file``, else a prompt when
stdin is a terminal. It is registered with the redactor the moment it is read.
"""

from __future__ import annotations

import getpass
import logging
import os
import stat
import sys
from pathlib import Path

from . import _layout as layout
from ._crypto import (
    SCRYPT_N,
    BadPassphrase,
    Crypto,
    CryptoError,
    KeyFile,
    describe,
    new_master,
    unwrap,
    wrap,
)
from ._redact import add_secret
from .store import ObjectInfo, Store

log = logging.getLogger("syncd.keys")
PASSPHRASE_ENV = "SYNCD_PASSPHRASE"
NEW_PASSPHRASE_ENV = "SYNCD_NEW_PASSPHRASE"


def key_files(store: Store) -> list[ObjectInfo]:
    """The key files in the store: the one LIST that says whether it is encrypted."""
    return [o for o in store.list(layout.KEYS_PREFIX) if "/" not in o.key[len("keys/"):]]


def _where(store: Store, key: str) -> str:
    return f"{store.url}{key}"


def list_keys(store: Store) -> list[tuple[str, KeyFile | str]]:
    """Every key file: its public fields, or why it cannot be read."""
    out: list[tuple[str, KeyFile | str]] = []
    for info in key_files(store):
        try:
            out.append((info.key, describe(store.get(info.key), _where(store, info.key))))
        except CryptoError as e:
            out.append((info.key, str(e)))
    return out


def init_encryption(store: Store, passphrase: str, *, n: int = SCRYPT_N) -> Crypto:
    """Make the master key and its first key file; the store must hold nothing yet."""
    existing = key_files(store)
    if existing:
        raise CryptoError(f"{store.url}: already encrypted ({len(existing)} key file(s) in "
                          "keys/); `syncd key add` adds a passphrase")
    if next(iter(store.list("machines/")), None) is not None:
        raise CryptoError(f"{store.url}: already holds unencrypted backups; an encrypted "
                          "store starts empty (use another bucket or prefix)")
    crypto = Crypto(new_master())
    crypto.key_id = _write_key_file(store, crypto, passphrase, n)
    # Two `init --encrypt` at once would make two master keys: the first key file (in
    # key order) wins, the other init takes its own back and fails.
    rivals = [(key, kf) for key, kf in list_keys(store)
              if isinstance(kf, KeyFile) and kf.master != crypto.fingerprint]
    mine = layout.key_file_key(crypto.key_id)
    if rivals and min(key for key, _ in rivals) < mine:
        store.delete_many([mine])
        raise CryptoError(f"{store.url}: another `syncd init --encrypt` made a key at the same "
                          f"time ({rivals[0][0]}); use its passphrase")
    return crypto


def _write_key_file(store: Store, crypto: Crypto, passphrase: str, n: int) -> str:
    key_id = os.urandom(8).hex()
    key = layout.key_file_key(key_id)
    store.put(key, wrap(crypto, passphrase, key_id, key, n=n), if_none_match=True)
    return key_id


def unlock(store: Store, passphrase: str, infos: list[ObjectInfo] | None = None) -> Crypto:
    """The master key, from the first key file the passphrase opens."""
    infos = key_files(store) if infos is None else infos
    if not infos:
        raise CryptoError(f"{store.url}: not encrypted (keys/ is empty)")
    problems: list[str] = []
    for info in infos:
        where = _where(store, info.key)
        try:
            crypto = unwrap(store.get(info.key), passphrase, info.key, where)
        except BadPassphrase:
            continue
        except CryptoError as e:
            problems.append(str(e))
            continue
        for problem in problems:
            log.warning("%s", problem)
        return crypto
    names = ", ".join(i.key for i in infos)
    detail = f"; {problems[0]}" if problems else ""
    raise BadPassphrase(f"{store.url}: the passphrase opens none of the store's key files "
                        f"({names}): wrong passphrase, or tampered key files{detail}")


def add_key(store: Store, crypto: Crypto, passphrase: str, *, n: int = SCRYPT_N) -> str:
    """A new key file for another passphrase; returns its key id."""
    return _write_key_file(store, crypto, passphrase, n)


def remove_key(store: Store, crypto: Crypto, key_id: str) -> None:
    """Remove one key file; never the last one, nor the one this passphrase opened."""
    infos = key_files(store)
    key = layout.key_file_key(key_id)
    if key not in {i.key for i in infos}:
        raise CryptoError(f"{store.url}: no key file {key} (the store has: "
                          f"{', '.join(i.key for i in infos) or 'none'})")
    if len(infos) == 1:
        raise CryptoError(f"{store.url}{key}: refusing to remove the last key file (the "
                          "store could never be read again)")
    if key_id == crypto.key_id:
        raise CryptoError(f"{store.url}{key}: refusing to remove the key file your "
                          "passphrase opens; run this with another passphrase of the store")
    store.delete_many([key])


# -- passphrases ------------------------------------------------------------------------

def passphrase_configured(passphrase_file: Path | None) -> bool:
    return bool(os.environ.get(PASSPHRASE_ENV)) or passphrase_file is not None


def read_passphrase_file(path: Path) -> str:
    try:
        st = os.stat(path)
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) else "not UTF-8"
        raise CryptoError(f"passphrase file {path}: cannot read: {why}") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("passphrase file %s is open to other users (mode %o): chmod 600 it",
                    path, st.st_mode & 0o777)
    # One trailing newline is the file's, not the passphrase's.
    text = text[:-1] if text.endswith("\n") else text
    text = text[:-1] if text.endswith("\r") else text
    if not text:
        raise CryptoError(f"passphrase file {path} is empty")
    return text


def get_passphrase(passphrase_file: Path | None, *, prompt: bool, confirm: bool = False,
                   env: str = PASSPHRASE_ENV, what: str = "passphrase") -> str | None:
    """From ``env``, else the file, else a prompt (only when stdin is a terminal)."""
    value = os.environ.get(env)
    if not value and passphrase_file is not None:
        value = read_passphrase_file(passphrase_file)
    if not value and prompt and sys.stdin.isatty():
        value = getpass.getpass(f"syncd {what}: ")
        if confirm and getpass.getpass(f"syncd {what} (again): ") != value:
            raise CryptoError("the two passphrases differ")
        if not value:
            raise CryptoError("the passphrase is empty")
    if value:
        add_secret(value)
    return value or None


def open_crypto(store: Store, passphrase_file: Path | None, *, prompt: bool) -> Crypto | None:
    """The unlocked key of an encrypted store, None for a plain one; fails closed."""
    infos = key_files(store)
    if not infos:
        if passphrase_configured(passphrase_file):
            raise CryptoError(f"{store.url}: a passphrase is set but the store has no keys/ "
                              "(not encrypted, or its keys were removed): refusing to read or "
                              "write it unencrypted; run `syncd init --encrypt` for a new store")
        return None
    passphrase = get_passphrase(passphrase_file, prompt=prompt)
    if passphrase is None:
        raise CryptoError(f"{store.url}: the store is encrypted ({len(infos)} key file(s) in "
                          "keys/) and no passphrase is set: set SYNCD_PASSPHRASE or "
                          "SYNCD_PASSPHRASE_FILE (or passphrase_file in the config)")
    return unlock(store, passphrase, infos)

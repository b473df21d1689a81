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

``keys/`` is as untrusted as the rest of the bucket: anyone who can write there can plant
key files. Each is read size-capped and its scrypt parameters checked before anything is
derived (``security/crypto``); the key file this machine's state remembers is tried first, then
those naming the master key it remembers; and one unlock reads and derives a bounded
number of the others.
"""

from __future__ import annotations

import getpass
import logging
import os
import stat
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from syncd.errors import BadPassphrase, CryptoError, NotFound
from syncd.redact import add_secret
from syncd.security.crypto import (
    KEY_FILE_MAX_BYTES,
    SCRYPT_N,
    SCRYPT_P,
    SCRYPT_R,
    Crypto,
    KeyFile,
    describe,
    new_master,
    unwrap,
    wrap,
)
from syncd.store import ObjectInfo, Store, layout

log = logging.getLogger("syncd.keys")
PASSPHRASE_ENV = "SYNCD_PASSPHRASE"
NEW_PASSPHRASE_ENV = "SYNCD_NEW_PASSPHRASE"
# Per unlock, besides the remembered key file: a real store holds a few key files, a
# planted one any number. The scrypt work spent on them (n·r·p each) is budgeted: as much
# as 16 key files of syncd's own cost (~5 s), however cheap or dear each one is.
MAX_WORK = 16 * SCRYPT_N * SCRYPT_R * SCRYPT_P
MAX_READS = 256  # key files read (one small GET each)
_SHOWN = 5       # key files named in one message


@dataclass(frozen=True)
class KeyHint:
    """Which key opened this store last: tried first, so planted key files cost nothing
    in the usual case."""

    key_id: str | None = None
    master: str | None = None  # the master key's fingerprint


def key_files(store: Store) -> list[ObjectInfo]:
    """The key files in the store: the one LIST that says whether it is encrypted."""
    return [o for o in store.list(layout.KEYS_PREFIX)
            if "/" not in o.key[len(layout.KEYS_PREFIX):]]


def _where(store: Store, key: str) -> str:
    return f"{store.url}{key}"


def _names(infos: list[ObjectInfo]) -> str:
    more = len(infos) - _SHOWN
    return ", ".join(i.key for i in infos[:_SHOWN]) + (f" and {more} more" if more > 0 else "")


def read_key_file(store: Store, info: ObjectInfo) -> bytes:
    """A key file's bytes, never more than a key file holds (plus one, to tell)."""
    where = _where(store, info.key)
    if not layout.is_key_file(info.key):
        raise CryptoError(f"refusing {where}: not a key file name (keys/ and 16 hex digits)")
    too_big = CryptoError(f"refusing key file {where}: more than {KEY_FILE_MAX_BYTES} bytes "
                          "(a key file holds ~400)")
    if info.size > KEY_FILE_MAX_BYTES:
        raise too_big
    if info.size == 0:  # and a ranged GET of an empty object is an error on S3
        raise CryptoError(f"{where}: unreadable key file (empty)")
    try:
        raw = store.get(info.key, 0, KEY_FILE_MAX_BYTES + 1)
    except NotFound:
        raise CryptoError(f"{where}: removed while it was being read") from None
    if len(raw) > KEY_FILE_MAX_BYTES:
        raise too_big
    return raw


def list_keys(store: Store) -> list[tuple[str, KeyFile | str]]:
    """Every key file: its public fields, or why it cannot be read."""
    out: list[tuple[str, KeyFile | str]] = []
    for info in key_files(store):
        try:
            out.append((info.key, describe(read_key_file(store, info),
                                           _where(store, info.key))))
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
    crypto.key_id = write_key_file(
        store, lambda key_id, key: wrap(crypto, passphrase, key_id, key, n=n))
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


def write_key_file(store: Store, wrapped: Callable[[str, str], bytes]) -> str:
    """Write the key file ``wrapped(key_id, object_key)`` under a new id; returns the id."""
    key_id = os.urandom(8).hex()
    key = layout.key_file_key(key_id)
    store.put(key, wrapped(key_id, key), if_none_match=True)
    return key_id


def unlock(store: Store, passphrase: str, infos: list[ObjectInfo] | None = None,
           hint: KeyHint | None = None) -> Crypto:
    """The master key, from the first key file the passphrase opens.

    Tried in this order: the key file ``hint`` names, those naming the master key it
    remembers, then the rest in key order. Besides the hinted one, at most ``MAX_READS``
    are read and ``MAX_WORK`` of scrypt work spent. A key file that is too big, malformed
    or asks for
    scrypt parameters beyond syncd's bounds is refused before anything is derived.
    """
    infos = key_files(store) if infos is None else infos
    if not infos:
        raise CryptoError(f"{store.url}: not encrypted (keys/ is empty)")
    hint = hint or KeyHint()
    remembered = layout.key_file_key(hint.key_id) if hint.key_id else None
    others = [i for i in infos if i.key != remembered]
    problems: list[str] = []

    def readable(group: list[ObjectInfo]) -> Iterator[tuple[ObjectInfo, bytes, KeyFile]]:
        for info in group:
            try:
                raw = read_key_file(store, info)
                public = describe(raw, _where(store, info.key))
            except CryptoError as e:
                problems.append(str(e))
                continue
            yield info, raw, public

    def in_order() -> Iterator[tuple[ObjectInfo, bytes, int]]:
        for info, raw, _ in readable([i for i in infos if i.key == remembered]):
            yield info, raw, 0
        later: list[tuple[ObjectInfo, bytes, int]] = []
        for info, raw, public in readable(others[:MAX_READS]):
            if hint.master and public.master != hint.master:
                later.append((info, raw, public.n * public.r * public.p))
            else:
                yield info, raw, public.n * public.r * public.p
        yield from later

    work = derived = 0
    capped = len(others) > MAX_READS
    for info, raw, cost in in_order():
        if info.key != remembered:
            if work + cost > MAX_WORK:
                capped = True
                break
            work += cost
        derived += 1
        try:
            crypto = unwrap(raw, passphrase, info.key, _where(store, info.key))
        except BadPassphrase:
            continue
        except CryptoError as e:
            problems.append(str(e))
            continue
        for problem in problems[:_SHOWN]:
            log.warning("%s", problem)
        if len(problems) > _SHOWN:
            log.warning("%s: %d more key files refused", store.url, len(problems) - _SHOWN)
        return crypto
    detail = f"; {problems[0]}" if problems else ""
    if capped:
        detail += (f"; gave up after trying {derived} of {len(infos)} key files (one unlock "
                   f"reads at most {MAX_READS} and spends the work of 16, besides the one this "
                   "machine remembers): remove the key files you did not make from keys/")
    raise BadPassphrase(f"{store.url}: the passphrase opens none of the store's key files "
                        f"({_names(infos)}): wrong passphrase, or tampered key files{detail}")


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


def open_crypto(store: Store, passphrase_file: Path | None, *, prompt: bool,
                hint: KeyHint | None = None) -> Crypto | None:
    """The unlocked key of an encrypted store, None for a plain one; fails closed.

    ``hint``: the key this machine's state remembers, tried first (``unlock``).
    """
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
    return unlock(store, passphrase, infos, hint)

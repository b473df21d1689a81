"""The store's key files: init, unlock, add, remove, and failing closed."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from syncd.backup.engine import Engine
from syncd.backup.state import State, remembered_key
from syncd.cli.util import repository_of
from syncd.errors import BadPassphrase, CryptoError
from syncd.repository import Repository
from syncd.security.crypto import (
    KEY_FILE_MAX_BYTES,
    SCRYPT_N,
    SCRYPT_P,
    SCRYPT_R,
    Crypto,
    new_master,
    wrap,
)
from syncd.security.keys import (
    MAX_READS,
    MAX_WORK,
    KeyHint,
    init_encryption,
    key_files,
    list_keys,
    open_crypto,
    read_passphrase_file,
    unlock,
)
from syncd.store import MemoryStore, ObjectInfo, open_store
from tests.faultkit import make_settings
from tests.helpers import Recording

CHEAP = 1 << 10


@pytest.fixture(autouse=True)
def _no_passphrase_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SYNCD_PASSPHRASE", raising=False)



def kf(i: int) -> str:
    """The key file named by ``i`` (sorted before any random key id but a few)."""
    return f"keys/{i:016x}"


K0, K1 = kf(0), kf(1)

def test_init_then_unlock() -> None:
    store = MemoryStore()
    c = init_encryption(store, "pw one", n=CHEAP)
    [info] = key_files(store)
    assert info.key == f"keys/{c.key_id}"
    got = unlock(store, "pw one")
    assert got.master == c.master and got.key_id == c.key_id
    with pytest.raises(BadPassphrase, match=r"memory://: the passphrase opens none .*keys/"):
        unlock(store, "pw two")


def test_init_refuses_an_encrypted_or_used_store() -> None:
    store = MemoryStore()
    init_encryption(store, "pw", n=CHEAP)
    with pytest.raises(CryptoError, match="already encrypted"):
        init_encryption(store, "pw", n=CHEAP)
    used = MemoryStore()
    used.put("machines/m1/seg/0000000000000000", b"plain segment")
    with pytest.raises(CryptoError, match="already holds unencrypted backups"):
        init_encryption(used, "pw", n=CHEAP)


def test_add_and_remove_passphrases() -> None:
    store = MemoryStore()
    first = init_encryption(store, "old", n=CHEAP)
    new_id = Repository(store, "m1", first).add_key("new", n=CHEAP)
    assert len(key_files(store)) == 2
    assert unlock(store, "new").master == first.master  # the master key stays
    with pytest.raises(CryptoError, match="the key file your passphrase opens"):
        Repository(store, "m1", unlock(store, "new")).remove_key(new_id)
    # Rotate: the new one removes the old.
    Repository(store, "m1", unlock(store, "new")).remove_key(first.key_id)
    with pytest.raises(BadPassphrase):
        unlock(store, "old")
    with pytest.raises(CryptoError, match="refusing to remove the last key file"):
        Repository(store, "m1", unlock(store, "new")).remove_key(new_id)
    with pytest.raises(CryptoError, match="no key file keys/nope"):
        Repository(store, "m1", unlock(store, "new")).remove_key("nope")
    [(name, kf)] = list_keys(store)
    assert name == f"keys/{new_id}" and not isinstance(kf, str) and kf.n == CHEAP


def test_a_tampered_key_file_beside_a_good_one_is_named_but_not_fatal() -> None:
    store = MemoryStore()
    c = init_encryption(store, "pw", n=CHEAP)
    junk = K0
    store.put(junk, b"garbage")
    assert unlock(store, "pw").master == c.master
    listed = dict(list_keys(store))
    assert isinstance(why := listed[junk], str) and "unreadable key file" in why
    store.delete_many([f"keys/{c.key_id}"])
    with pytest.raises(BadPassphrase, match=f"{junk}: unreadable key file"):
        unlock(store, "pw")


def test_a_planted_name_that_is_no_key_id_is_named_and_skipped(tmp_path: Path) -> None:
    """A name the store accepts but syncd never writes (sorting before the real key file)
    is one refused file, not a failed unlock."""
    store = open_store(f"file://{tmp_path}")
    c = init_encryption(store, "pw", n=CHEAP)
    (tmp_path / "keys" / "0\\x").write_bytes(b"{}")
    assert unlock(store, "pw").master == c.master
    listed = dict(list_keys(store))
    assert "not a key file name" in str(listed["keys/0\\x"])
    store.delete_many([f"keys/{c.key_id}"])
    with pytest.raises(BadPassphrase, match="not a key file name"):
        unlock(store, "pw")


def test_open_crypto_fails_closed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain, encrypted = MemoryStore(), MemoryStore()
    init_encryption(encrypted, "pw", n=CHEAP)
    assert open_crypto(plain, None, prompt=False) is None
    with pytest.raises(CryptoError, match=r"encrypted .* and no passphrase is set"):
        open_crypto(encrypted, None, prompt=False)
    monkeypatch.setenv("SYNCD_PASSPHRASE", "pw")
    assert open_crypto(encrypted, None, prompt=False) is not None
    with pytest.raises(CryptoError, match="a passphrase is set but the store has no keys/"):
        open_crypto(plain, None, prompt=False)
    monkeypatch.setenv("SYNCD_PASSPHRASE", "wrong")
    with pytest.raises(BadPassphrase):
        open_crypto(encrypted, None, prompt=False)
    monkeypatch.delenv("SYNCD_PASSPHRASE")
    f = tmp_path / "pass"
    f.write_text("pw\n")
    f.chmod(0o600)
    assert open_crypto(encrypted, f, prompt=False) is not None


def test_passphrase_file(tmp_path: Path) -> None:
    f = tmp_path / "p"
    f.write_text("with spaces  \r\n")
    assert read_passphrase_file(f) == "with spaces  "
    f.write_text("")
    with pytest.raises(CryptoError, match="is empty"):
        read_passphrase_file(f)
    with pytest.raises(CryptoError, match="cannot read"):
        read_passphrase_file(tmp_path / "missing")


@pytest.mark.parametrize("rival_first", [True, False])
def test_concurrent_inits_leave_one_master(rival_first: bool) -> None:
    """Two inits at once: the first key file in key order wins, the other init fails."""
    other = MemoryStore()
    init_encryption(other, "theirs", n=CHEAP)
    [(rival_key, rival_raw)] = other.objects.items()
    rival_key = K0 if rival_first else "keys/ffffffffffffffff"

    class Racing(MemoryStore):
        def put(self, key: str, data: bytes, *, if_none_match: bool = True,
                if_match: str | None = None) -> str:
            if key.startswith("keys/") and rival_key not in self.objects:
                super().put(rival_key, rival_raw)  # the other init lands at the same moment
            return super().put(key, data, if_none_match=if_none_match, if_match=if_match)

    store = Racing()
    if rival_first:
        with pytest.raises(CryptoError, match="another `syncd init --encrypt`"):
            init_encryption(store, "mine", n=CHEAP)
        assert [i.key for i in key_files(store)] == [rival_key]
    else:
        mine = init_encryption(store, "mine", n=CHEAP)
        assert unlock(store, "mine").master == mine.master


# -- a store is untrusted input: planted key files ------------------------------------------

def plant(store: MemoryStore, key_id: str, passphrase: str = "theirs", *,
          master: Crypto | None = None, **kdf: int) -> Crypto:
    """A key file under ``keys/<key_id>`` wrapping another master key (or ``master``);
    ``kdf`` overrides its scrypt parameters after the fact (its tag then fails)."""
    crypto = master or Crypto(new_master())
    raw = wrap(crypto, passphrase, key_id, f"keys/{key_id}", n=CHEAP)
    if kdf:
        doc = json.loads(raw)
        doc["kdf"].update(kdf)
        raw = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    store.put(f"keys/{key_id}", raw)
    return crypto


def test_planted_expensive_key_files_are_refused_without_deriving(
        derives: list[tuple[int, int, int]], caplog: pytest.LogCaptureFixture) -> None:
    store = MemoryStore()
    real = init_encryption(store, "pw", n=CHEAP)
    # Sorted before the real key file, so tried first without a hint.
    plant(store, K0[5:], "pw", n=1 << 22, r=8, p=SCRYPT_P)
    plant(store, K1[5:], "pw", n=1 << 22, r=32, p=16)
    derives.clear()
    with caplog.at_level(logging.WARNING, logger="syncd.keys"):
        got = unlock(store, "pw")
    assert got.master == real.master
    assert derives == [(CHEAP, SCRYPT_R, SCRYPT_P)]  # the real key file only
    refused = [r.getMessage() for r in caplog.records]
    assert refused == [
        f"refusing key file memory://{K0}: scrypt parameters beyond syncd's bounds "
        f"(n={1 << 22}, r=8, p={SCRYPT_P}; at most 128 MiB and n*r*p <= 1572864)",
        f"refusing key file memory://{K1}: scrypt parameters beyond syncd's bounds "
        f"(n={1 << 22}, r=32, p=16; at most 128 MiB and n*r*p <= 1572864)"]
    listed = dict(list_keys(store))
    assert isinstance(why := listed[K1], str) and "beyond syncd's bounds" in why
    store.delete_many([f"keys/{real.key_id}"])
    derives.clear()
    with pytest.raises(BadPassphrase, match=rf"opens none .*; refusing key file memory://{K0}"):
        unlock(store, "pw")
    assert derives == []


def test_the_remembered_key_file_is_tried_first(derives: list[tuple[int, int, int]]) -> None:
    store = MemoryStore()
    real = init_encryption(store, "pw", n=CHEAP)
    for i in range(5):  # other masters, other passphrases, all before the real one
        plant(store, f"{i:016x}")
    derives.clear()
    assert unlock(store, "pw").master == real.master
    assert len(derives) == 6  # in key order: every planted one, then the real one
    derives.clear()
    assert unlock(store, "pw", hint=KeyHint(real.key_id, real.fingerprint)).key_id == real.key_id
    assert len(derives) == 1
    # A state that only remembers the master key (written before key ids were kept):
    # key files naming it go first.
    derives.clear()
    assert unlock(store, "pw", hint=KeyHint(None, real.fingerprint)).master == real.master
    assert len(derives) == 1
    # The remembered key file is gone (its passphrase was removed): the rest still open.
    derives.clear()
    got = unlock(store, "pw", hint=KeyHint("gone", real.fingerprint))
    assert got.master == real.master and len(derives) == 1


def test_one_unlock_tries_a_bounded_number_of_key_files(
        derives: list[tuple[int, int, int]]) -> None:
    store = MemoryStore()
    real = init_encryption(store, "pw", n=CHEAP)
    # Planted files of syncd's own cost: the work of 16 is spent, no more.
    tries = MAX_WORK // (SCRYPT_N * SCRYPT_R * SCRYPT_P)
    planted = 3 * tries
    for i in range(planted):
        plant(store, f"{i:016x}", n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P)
    derives.clear()
    with pytest.raises(BadPassphrase, match=(
            rf"{', '.join(kf(i) for i in range(5))} and {planted - 4} more\)"
            rf".*gave up after trying {tries} of {planted + 1} key files")):
        unlock(store, "pw")
    assert len(derives) == tries
    derives.clear()
    assert unlock(store, "pw", hint=KeyHint(real.key_id)).master == real.master
    assert len(derives) == 1  # the remembered one is tried outside the cap


def test_many_cheap_planted_key_files_do_not_hide_the_real_one(
        derives: list[tuple[int, int, int]]) -> None:
    store = MemoryStore()
    real = init_encryption(store, "pw", n=CHEAP)
    for i in range(40):  # all sorted before the real one, each nearly free to refuse
        plant(store, f"{i:016x}")
    derives.clear()
    assert unlock(store, "pw").master == real.master
    assert len(derives) == 41


def test_one_unlock_reads_a_bounded_number_of_key_files(
        derives: list[tuple[int, int, int]]) -> None:
    store = Recording()
    real = init_encryption(store, "pw", n=CHEAP)
    for i in range(2 * MAX_READS):
        store.put(f"keys/{i:016x}", b"garbage")  # refused unread by scrypt, but each is a GET
    store.gets.clear()
    derives.clear()
    with pytest.raises(BadPassphrase, match=r"unreadable key file.*gave up after trying 0 of"):
        unlock(store, "pw")
    assert len(store.gets) == MAX_READS and derives == []
    store.gets.clear()
    assert unlock(store, "pw", hint=KeyHint(real.key_id)).master == real.master
    assert store.gets == [(f"keys/{real.key_id}", 0, KEY_FILE_MAX_BYTES + 1)]


def test_key_files_are_read_size_capped(derives: list[tuple[int, int, int]]) -> None:
    store = Recording()
    real = init_encryption(store, "pw", n=CHEAP)
    store.put(K0, b"{" + b" " * (1 << 20))
    store.put(K1, b"")
    store.gets.clear()
    derives.clear()
    assert unlock(store, "pw").master == real.master
    # The LIST said too big (or empty): never fetched at all.
    assert store.gets == [(f"keys/{real.key_id}", 0, KEY_FILE_MAX_BYTES + 1)]
    assert len(derives) == 1
    listed = dict(list_keys(store))
    assert listed[K0] == (f"refusing key file memory://{K0}: more than "
                                   f"{KEY_FILE_MAX_BYTES} bytes (a key file holds ~400)")
    assert listed[K1] == f"memory://{K1}: unreadable key file (empty)"
    # An object that grew after the LIST: one capped GET tells, nothing more is read.
    store.gets.clear()
    with pytest.raises(BadPassphrase, match=rf"refusing key file memory://{K0}: more than"):
        unlock(store, "pw", [ObjectInfo(K0, 400)])
    assert store.gets == [(K0, 0, KEY_FILE_MAX_BYTES + 1)]
    with pytest.raises(BadPassphrase, match=rf"{kf(255)}: removed while it was being read"):
        unlock(store, "pw", [ObjectInfo(kf(255), 400)])


def test_a_writer_tries_its_key_first_and_never_switches_master(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        derives: list[tuple[int, int, int]]) -> None:
    s = make_settings(tmp_path)
    store = open_store(s.store)
    real = init_encryption(store, "pw", n=CHEAP)
    monkeypatch.setenv("SYNCD_PASSPHRASE", "pw")
    engine = Engine(s)
    engine.close()
    assert remembered_key(s.state_file) == KeyHint(real.key_id, real.fingerprint)
    # Someone who knows the passphrase plants another master key, first in key order.
    rival = Crypto(new_master())
    store.put(K0, wrap(rival, "pw", K0[5:], K0, n=CHEAP))
    derives.clear()
    engine = Engine(s)
    try:
        assert engine.crypto is not None and engine.crypto.fingerprint == real.fingerprint
    finally:
        engine.close()
    assert len(derives) == 1
    # Readers with this machine's state use the same hint.
    derives.clear()
    crypto = repository_of(s).crypto
    assert crypto is not None and crypto.fingerprint == real.fingerprint and len(derives) == 1
    # Only the rival is left: the writer refuses it rather than switching.
    store.delete_many([f"keys/{real.key_id}"])
    with pytest.raises(CryptoError, match=rf"encrypted with key {real.fingerprint}, but the "
                                          rf"store now holds key {rival.fingerprint}"):
        Engine(s)
    state = State(s.state_file, readonly=True)
    try:
        assert state.meta("key_fingerprint") == real.fingerprint
        assert state.meta("key_id") == real.key_id
    finally:
        state.close()


def test_no_state_gives_no_hint(tmp_path: Path) -> None:
    assert remembered_key(tmp_path / "missing.sqlite") is None
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"not a database" * 100)
    assert remembered_key(bad) is None

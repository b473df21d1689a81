"""The store's key files: init, unlock, add, remove, and failing closed."""

from __future__ import annotations

from pathlib import Path

import pytest

from syncd._crypto import BadPassphrase, CryptoError
from syncd._keys import (
    add_key,
    init_encryption,
    key_files,
    list_keys,
    open_crypto,
    read_passphrase_file,
    remove_key,
    unlock,
)
from syncd.store import MemoryStore

CHEAP = 1 << 10


@pytest.fixture(autouse=True)
def _no_passphrase_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SYNCD_PASSPHRASE", raising=False)


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
    new_id = add_key(store, first, "new", n=CHEAP)
    assert len(key_files(store)) == 2
    assert unlock(store, "new").master == first.master  # the master key stays
    with pytest.raises(CryptoError, match="the key file your passphrase opens"):
        remove_key(store, unlock(store, "new"), new_id)
    remove_key(store, unlock(store, "new"), first.key_id)  # rotate: the new one removes the old
    with pytest.raises(BadPassphrase):
        unlock(store, "old")
    with pytest.raises(CryptoError, match="refusing to remove the last key file"):
        remove_key(store, unlock(store, "new"), new_id)
    with pytest.raises(CryptoError, match="no key file keys/nope"):
        remove_key(store, unlock(store, "new"), "nope")
    [(name, kf)] = list_keys(store)
    assert name == f"keys/{new_id}" and not isinstance(kf, str) and kf.n == CHEAP


def test_a_tampered_key_file_beside_a_good_one_is_named_but_not_fatal() -> None:
    store = MemoryStore()
    c = init_encryption(store, "pw", n=CHEAP)
    store.put("keys/0000", b"garbage")
    assert unlock(store, "pw").master == c.master
    listed = dict(list_keys(store))
    assert isinstance(listed["keys/0000"], str) and "unreadable key file" in listed["keys/0000"]
    store.delete_many([f"keys/{c.key_id}"])
    with pytest.raises(BadPassphrase, match="keys/0000: unreadable key file"):
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
    rival_key = "keys/0000000000000000" if rival_first else "keys/ffffffffffffffff"

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
